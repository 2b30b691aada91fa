# Entry points for humans and CI. Heavy artefacts are cached in ~/.cache/elastic-supervisor.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo setup test test-fast test-unit test-integration test-e2e test-e2e-loopback \
	lane-control-plane lane-loopback \
	test-e2e-nodes lint cluster-up images bench docs clean help \
	kind-up kind-load kind-deploy kind-chaos kind-down

help:
	@echo "make demo         set up what is missing, then run the main job locally with faults"
	@echo "make setup        install everything (idempotent; first run ~15 min, warm ~40 s)"
	@echo "make test         the whole suite: lint, unit, integration, end-to-end (36-52 min on 2 cores)"
	@echo "make test-fast    lint, unit and integration only (the inner loop, ~10 min)"
	@echo "make test-unit    only the fast pure tests"
	@echo "make test-e2e     only the end-to-end tests (loopback horovodrun, then real nodes)"
	@echo "make cluster-up   run the local control plane until Ctrl-C, print its kubeconfig"
	@echo "make images       build the images for real nodes (cached), print name -> tarball"
	@echo "make bench        benchmarks -> bench/results.json, bench/out/scale.png (~27 min)"
	@echo "make docs         write docs/env-vars.md from supervisor/config/ (a unit test checks it)"
	@echo "make kind-up      kind cluster: one control plane, three workers (needs docker, kind)"
	@echo "make kind-load    build both images and load them into the kind nodes"
	@echo "make kind-deploy  ssh key + kubectl apply -k manifests/overlays/kind"
	@echo "make kind-chaos   kill a worker process, force-delete a worker pod, stop a worker's node"
	@echo "make kind-down    delete the kind cluster"

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m localcluster demo

$(PY):
	@echo "no virtualenv at $(VENV): run 'make setup' first" >&2; exit 1

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(PY) scripts/layers.py

# The end-to-end tests that run real horovodrun over ssh to loopback hosts (no cluster).
E2E_LOOPBACK := tests/e2e/test_driver_hardening.py tests/e2e/test_join_gate.py \
	tests/e2e/test_train_script.py tests/e2e/test_horovod_build.py tests/e2e/test_tensorflow.py

# Integration tests that need no control plane (the hook in real interpreters, Debian's 3.9 and
# 3.13 among them, the images in a scratch containerd): in `make test` they run in the loopback lane, which evens the lanes.
NO_CONTROL_PLANE := tests/integration/test_hook_loading.py tests/integration/test_images.py \
	tests/integration/test_sever_gloo.py tests/integration/test_hook_pythons.py \
	tests/integration/test_sidecar_wrapper.py tests/integration/test_hook_owner.py

# The whole suite in phases, cheapest first, each its own pytest run that stops early: a broken
# unit test is reported in seconds, not after the end-to-end tours. The integration tests (a
# control plane that mostly waits) and the loopback end-to-end tests (horovodrun, no cluster)
# run side by side, each with its output in one piece (-O); the three-node cluster of the last
# phase never shares the two cores with either.
test: lint test-unit
	$(MAKE) --no-print-directory -O -j2 lane-control-plane lane-loopback
	$(MAKE) --no-print-directory test-e2e-nodes

lane-control-plane: $(PY)
	$(VENV)/bin/pytest tests/integration --maxfail=3 $(addprefix --ignore=,$(NO_CONTROL_PLANE)) \
		$(PYTEST_ARGS)

lane-loopback: $(PY)
	$(VENV)/bin/pytest $(E2E_LOOPBACK) $(NO_CONTROL_PLANE) --maxfail=3 -p no:cacheprovider \
		--basetemp=/tmp/elastic-supervisor-e2e-loopback $(PYTEST_ARGS)

test-fast: lint test-unit test-integration

test-unit: $(PY)
	$(VENV)/bin/pytest tests/unit -x $(PYTEST_ARGS)

test-integration: $(PY)
	$(VENV)/bin/pytest tests/integration --maxfail=3 $(PYTEST_ARGS)

test-e2e: test-e2e-loopback test-e2e-nodes

# Its own basetemp and no cache: it may run beside another pytest.
test-e2e-loopback: $(PY)
	$(VENV)/bin/pytest $(E2E_LOOPBACK) --maxfail=3 -p no:cacheprovider \
		--basetemp=/tmp/elastic-supervisor-e2e-loopback $(PYTEST_ARGS)

# The tests on real nodes can run as two pytest runs side by side, on two pools of three nodes of
# one cluster (tests/conftest.py): NODES_BESIDE names the files of the run beside this one, e.g.
# `make test-e2e-nodes NODES_BESIDE="tests/e2e/test_sidecar.py tests/e2e/test_sidecar_tf.py"`.
# Off in `make test`: on two cores both runs then share a saturated machine and the tours' resume
# bounds fail (docs/local-cluster.md).
NODES_BESIDE ?=

test-e2e-nodes: $(PY)
	ES_NODES_SIDE="$(if $(strip $(NODES_BESIDE)),$(NODES_BESIDE) --maxfail=5 $(PYTEST_ARGS))" \
		$(VENV)/bin/pytest tests/e2e --maxfail=5 \
		$(addprefix --ignore=,$(E2E_LOOPBACK) $(NODES_BESIDE)) $(PYTEST_ARGS)

cluster-up: $(PY)
	$(PY) -m localcluster up

images: $(PY)
	$(PY) -m localcluster images

bench: $(PY)
	$(PY) -m bench $(BENCH_ARGS)

# The environment-variable reference is the code's (tests/unit/test_readme.py fails when it drifts).
docs: $(PY)
	$(PY) -m supervisor.config >docs/env-vars.md.tmp
	mv docs/env-vars.md.tmp docs/env-vars.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

# ---- kind: try it in containers (docs/real-clusters.md "Try it on kind"; needs docker, kind and kubectl) ----
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGES := elastic-supervisor-launcher:$(VERSION) elastic-supervisor-worker:$(VERSION)
KIND ?= kind
KIND_CLUSTER ?= elastic-supervisor
KUBECTL ?= kubectl --context kind-$(KIND_CLUSTER)
KUBECTL_NS := $(KUBECTL) -n elastic-supervisor
# A Running worker pod, looked up when the recipe line runs.
WORKER = $$($(KUBECTL_NS) get pods -l elastic-supervisor/role=worker \
	--field-selector=status.phase=Running -o name | head -1)

kind-up:
	$(KIND) create cluster --name $(KIND_CLUSTER) --config manifests/kind/cluster.yaml

# The training stage first, under its name: the worker image starts FROM it.
kind-load:
	docker build -f launcher_image/Dockerfile --target training \
		-t elastic-supervisor-training:$(VERSION) .
	docker build -f launcher_image/Dockerfile -t elastic-supervisor-launcher:$(VERSION) .
	docker build -f worker_image/Dockerfile -t elastic-supervisor-worker:$(VERSION) \
		--build-arg TRAINING_IMAGE=elastic-supervisor-training:$(VERSION) .
	$(KIND) load docker-image --name $(KIND_CLUSTER) $(IMAGES)

kind-deploy:
	manifests/ssh-keygen.sh
	$(KUBECTL) apply -k manifests/overlays/kind
	@echo "follow the supervisor: $(KUBECTL_NS) logs -f job/elastic-train"

# One failure of each kind, a minute apart, for the supervisor to handle.
kind-chaos:
	@echo "1/3 kill a worker's training process"
	$(KUBECTL_NS) exec $(WORKER) -- pkill -KILL -f train.py
	sleep 60
	@echo "2/3 force-delete a worker pod"
	$(KUBECTL_NS) delete $(WORKER) --force --grace-period=0
	sleep 60
	@echo "3/3 stop the kind node of a worker (NotReady after ~50 s)"
	docker stop $$($(KUBECTL_NS) get $(WORKER) -o jsonpath='{.spec.nodeName}')

kind-down:
	$(KIND) delete cluster --name $(KIND_CLUSTER)
