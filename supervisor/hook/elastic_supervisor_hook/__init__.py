"""elastic-supervisor's hook: Horovod patched in place, right after each module is first imported.

`install()` (called by the hook's sitecustomize when ELASTIC_SUPERVISOR_HOOK_KEY is set) puts a
finder first on sys.meta_path; it wraps the loader of a few Horovod modules so that a patch runs
right after the module's own code, before any other module can `from ... import` the patched
names. Nothing else is touched, so a process that never imports them is unchanged.

- horovodrun's process (the driver): `horovod.runner.common.util.network` gets timed sockets,
  `horovod.runner.elastic.driver` skips notifying a coordinator the supervisor declared dead,
  reports its worlds and its workers' failures, and gates a rendezvous that starts new workers
  until they are in it, assigning the world again when one is lost before (driver.py; the
  join timeout is ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S, seconds > 0, default 120), and with
  ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS (a known_hosts file) `horovod.runner.util.remote`'s ssh
  commands check the workers' host key strictly against it. Once the
  driver module is patched, Horovod must be 0.28.x with every patch in place and the settings
  valid, or the driver refuses to run: one line on stderr and exit REFUSED (a driver that can
  hang must not run silently). Otherwise it says hello to the supervisor every few seconds.
- a training process (HOROVOD_HOSTNAME, HOROVOD_LOCAL_RANK and HOROVOD_GLOO_RENDEZVOUS_ADDR set
  by horovodrun): `horovod.torch.mpi_ops` gets its `synchronize` and `init` wrapped, and the
  first init starts the heartbeat thread (worker.py); a collective that raises
  HorovodInternalError cuts the failed world's connections as the process leaves it
  (`WorkerHook.leave_world`); `horovod.common.elastic.State.check_host_updates` saves the
  state before it raises HostsUpdatedInterrupt, and the sync after it is never skipped (a
  worker added meanwhile may be in the next world: worker.saved_on_host_change). A missing
  target or another Horovod version is reported on stderr and in the heartbeats, never fatal
  to training.
- a training process of horovod.tensorflow (which horovod.keras and horovod.tensorflow.keras
  import too): `horovod.tensorflow.mpi_ops` gets its `init` wrapped as torch's is, and its
  collectives timed, eagerly in Python and inside a `tf.function` by two signals the graph runs
  (tfwait.py); `horovod.tensorflow`'s `allreduce_grads` is one wait and one training step; a
  world whose collective failed is left (`horovod.common.elastic.run_fn` sees its
  HorovodInternalError).
- a training process that imports a Horovod framework the hook does not fence yet
  (horovod.mxnet: UNFENCED) says so, once on stderr and in its heartbeats from then on (a problem,
  `unfenced_problem`, which the supervisor posts as a HookFrameworkUnfenced Event), and cuts
  nothing: no fence, no hang detection there. horovodrun's driver is hardened all the same.
  ELASTIC_SUPERVISOR_HOOK_WORKER=0 (SUPERVISOR_WORKER_HOOK=false) leaves training processes
  alone; a multiprocessing child (e.g. a DataLoader worker started by spawn) is left alone.
- a training process first claims its worker for its supervisor's term (owner.py): one of a
  supervisor that lost the job exits at once, and one of the new owner kills those of the old
  one before it goes on. Never two horovodruns' training on one worker.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from . import driver, owner, tfwait, wire, worker

KEY_ENV = "ELASTIC_SUPERVISOR_HOOK_KEY"  # hex; one per supervisor process
# Or a file with the key in hex (the job's Secret, mounted on the launcher and every worker):
# then the key itself is in no environment, so never on an ssh command line.
KEY_FILE_ENV = "ELASTIC_SUPERVISOR_HOOK_KEY_FILE"
PORT_ENV = "ELASTIC_SUPERVISOR_HOOK_PORT"  # the supervisor's UDP port
RUN_ENV = "ELASTIC_SUPERVISOR_HOOK_RUN"  # which run of horovodrun (restarts count up)
WORKER_ENV = "ELASTIC_SUPERVISOR_HOOK_WORKER"  # "0": training processes are left alone
DEAD_ENV = "ELASTIC_SUPERVISOR_HOOK_DEAD_FILE"  # the dead hosts, for the driver
JOIN_TIMEOUT_ENV = "ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S"  # the driver's join gate, seconds
# The workers' pinned ssh host key (a known_hosts file): the driver's ssh checks it strictly.
KNOWN_HOSTS_ENV = "ELASTIC_SUPERVISOR_HOOK_KNOWN_HOSTS"
REFUSED = 8  # the driver's exit code when it cannot be hardened (supervisor ExitCode too)
SUPPORTED = "0.28."
DRIVER_HELLO_S = 5.0

NETWORK = "horovod.runner.common.util.network"
REMOTE = "horovod.runner.util.remote"
DRIVER = "horovod.runner.elastic.driver"
MPI_OPS = "horovod.torch.mpi_ops"
TF_OPS = "horovod.tensorflow.mpi_ops"
TF = "horovod.tensorflow"
OPTIMIZER = "horovod.torch.optimizer"
ELASTIC = "horovod.common.elastic"
# Horovod's other frameworks, each known by a module only it imports (its first): the hook does
# not fence them (docs/hook.md, "MXNet").
UNFENCED = {"horovod.mxnet.mpi_ops": "horovod.mxnet"}
Patch = Callable[[Any], None]


def unfenced_problem(framework: str) -> str:
    """The problem a training process that imported `framework` (a value of UNFENCED) reports
    in its heartbeats."""
    return f"{framework} is not fenced by the hook (horovod.torch and horovod.tensorflow are)"


def unfenced_framework(problem: str) -> str | None:
    """The framework an `unfenced_problem` names; None for any other problem."""
    return next((f for f in UNFENCED.values() if problem == unfenced_problem(f)), None)


class _PatchingLoader:
    """Runs the real loader, then the patch (its failure is recorded, never raised)."""

    def __init__(self, loader: Any, name: str, patch: Patch, done: Callable[[str, str], None]):
        self._loader, self._name, self._patch, self._done = loader, name, patch, done

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as e:
            self._done(self._name, f"{type(e).__name__}: {e}")
        else:
            self._done(self._name, "")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    """A meta path finder for the modules in `patches` (each patched once)."""

    def __init__(self, patches: dict[str, Patch], done: Callable[[str, str], None]) -> None:
        self.patches, self.done = dict(patches), done

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, name, self.patches.pop(name), self.done)
        return spec


def _env_int(env: dict[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def key_of(env: dict[str, str]) -> bytes:
    """The channel's key: from the file KEY_FILE_ENV names, else KEY_ENV's hex; raise
    ValueError saying what is wrong."""
    path = env.get(KEY_FILE_ENV)
    if path:
        return wire.read_key(path, f"{KEY_FILE_ENV}={path}")
    return wire.parse_key(env.get(KEY_ENV, ""), KEY_ENV)


def role(env: dict[str, str], argv: list[str]) -> str | None:
    """"driver", "worker", or None (leave this process alone)."""
    if not (env.get(KEY_ENV) or env.get(KEY_FILE_ENV)) or _env_int(env, PORT_ENV) is None:
        return None
    if "--multiprocessing-fork" in argv:
        return None
    if all(env.get(v) for v in ("HOROVOD_HOSTNAME", "HOROVOD_LOCAL_RANK",
                                "HOROVOD_GLOO_RENDEZVOUS_ADDR")):
        return None if env.get(WORKER_ENV) == "0" else "worker"
    return "driver"


def install(env: dict[str, str] | None = None) -> str | None:
    """Install the patches for this process's role; return the role (None: nothing done)."""
    env = dict(os.environ if env is None else env)
    which = role(env, sys.argv)
    if which is None:
        return None
    if which == "worker":
        owner.claim_or_exit(env)  # before anything of the user's runs (owner.py)
    try:
        key = key_of(env)
    except ValueError as e:
        # Said once, loudly: the supervisor sees no hello from this process and says so too.
        print(f"elastic-supervisor hook: {e}: not installed in this {which} process",
              file=sys.stderr, flush=True)
        return None
    port = int(env[PORT_ENV])
    run = env.get(RUN_ENV, "0")
    if which == "driver":
        hook: Any = DriverHook(key, port, run, env.get(DEAD_ENV), env.get(JOIN_TIMEOUT_ENV),
                               known_hosts=env.get(KNOWN_HOSTS_ENV) or None)
    else:
        hook = WorkerHook(key, port, run, env)
    sys.meta_path.insert(0, _Finder(hook.patches(), hook.patched))
    return which


def _horovod_version() -> str:
    try:
        import horovod
        return str(getattr(horovod, "__version__", "unknown"))
    except Exception as e:
        return f"unknown ({e})"


def join_timeout(value: str | None) -> tuple[float, str]:
    """The join gate's timeout from ELASTIC_SUPERVISOR_HOOK_JOIN_TIMEOUT_S, and a problem ("" if
    none; the default is used then)."""
    if value is None or not value.strip():
        return driver.JOIN_TIMEOUT_S, ""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        return driver.JOIN_TIMEOUT_S, f"{JOIN_TIMEOUT_ENV}={value!r} is not a number of seconds > 0"
    return seconds, ""


class DriverHook:
    """horovodrun's process: timed sockets, dead coordinators skipped, the join gate, refuse if
    impossible."""

    def __init__(self, key: bytes, port: int, run: str, dead_file: str | None,
                 join_timeout_s: str | None = None, *, known_hosts: str | None = None) -> None:
        self.key, self.port, self.run, self.dead_file = key, port, run, dead_file
        self.known_hosts = known_hosts
        self.join_timeout_s, self.setting_problem = join_timeout(join_timeout_s)
        self.results: dict[str, str] = {}
        self.sender, self.seq = wire.new_sender_id(), 0
        self.current_world: tuple[int, list[str]] = (0, [])
        self.exited: dict[str, int] = {}  # host -> exit code of a worker recorded as failed
        self.short: dict[str, Any] | None = None  # what the driver waits for (report_waits)

    def patches(self) -> dict[str, Patch]:
        patches: dict[str, Patch] = {NETWORK: driver.timed_sockets, DRIVER: self.patch_driver}
        if self.known_hosts:
            known_hosts = self.known_hosts
            patches[REMOTE] = lambda remote: driver.pin_host_keys(remote, known_hosts)
        return patches

    def patch_driver(self, module: Any) -> None:
        driver.skip_dead(module, lambda: driver.read_dead(self.dead_file))
        driver.refuse_dead(module, lambda: driver.read_dead(self.dead_file))
        driver.report_worlds(module, self.world)
        # Inside report_exits (an exit the gate keeps from Horovod is still reported), around
        # refuse_dead (a refused request is not held).
        driver.join_gate(module, lambda: driver.read_dead(self.dead_file), self.join_timeout_s,
                         report=self.world)
        driver.report_exits(module, self.exit)
        driver.report_waits(module, self.waiting)
        driver.discover_unlocked(module)  # last: it touches none of the above

    def world(self, hosts: list[str]) -> None:
        """The driver assigned hosts for the next rendezvous: tell the supervisor now."""
        self.current_world = (self.current_world[0] + 1, hosts)
        self.say("driver", self.hello())

    def waiting(self, short: dict[str, Any] | None) -> None:
        """The driver began (a dict: what it needs and has) or ended (None) a wait for hosts:
        tell the supervisor now."""
        self.short = short
        self.say("driver", self.hello())

    def exit(self, host: str, local_rank: int, code: int) -> None:
        """The driver recorded a worker's failure: tell the supervisor now (and in every hello
        after: a datagram may be lost)."""
        self.exited[host] = code
        self.say("driver", self.hello())

    def hello(self) -> dict[str, Any]:
        seq, hosts = self.current_world
        return {"ok": True, "version": _horovod_version(), "connect_s": driver.CONNECT_S,
                "read_s": driver.READ_S, "world": hosts, "wseq": seq,
                "exited": dict(self.exited), "short": self.short}

    def patched(self, name: str, problem: str) -> None:
        self.results[name] = problem
        if name == DRIVER:
            self.armed()

    def problems(self) -> list[str]:
        found = []
        version = _horovod_version()
        if not version.startswith(SUPPORTED):
            found.append(f"Horovod {version} is not {SUPPORTED}x")
        for name in (NETWORK, DRIVER, *((REMOTE,) if self.known_hosts else ())):
            if name not in self.results:
                found.append(f"{name} was not imported before {DRIVER}")
            elif self.results[name]:
                found.append(f"{name}: {self.results[name]}")
        if self.setting_problem:
            found.append(self.setting_problem)
        return found

    def armed(self) -> None:
        """Refuse (exit REFUSED) unless every patch is in place; else start saying hello."""
        found = self.problems()
        if found:
            print("elastic-supervisor hook: refusing to run horovodrun's elastic driver "
                  "unhardened (it could hang for good on a frozen or partitioned worker): "
                  + "; ".join(found) + "; use Horovod 0.28.1", file=sys.stderr, flush=True)
            self.say("driver", {"ok": False, "problems": found})
            raise SystemExit(REFUSED)
        threading.Thread(target=self._hello, name="elastic-supervisor-hook", daemon=True).start()

    def say(self, kind: str, fields: dict[str, Any]) -> None:
        self.seq += 1
        body = {"t": kind, "s": self.sender, "n": self.seq, "run": self.run,
                "pid": os.getpid(), **fields}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
            s.sendto(wire.encode(self.key, body), ("127.0.0.1", self.port))

    def _hello(self) -> None:
        while True:
            self.say("driver", self.hello())
            time.sleep(DRIVER_HELLO_S)


class WorkerHook:
    """A training process: progress, heartbeats and the fence (worker.py)."""

    def __init__(self, key: bytes, port: int, run: str, env: dict[str, str]) -> None:
        self.key, self.port, self.run, self.env = key, port, run, env
        self.progress = worker.Progress()
        self.beater: worker.Beater | None = None
        self.problems: list[str] = []
        self.module: Any = None
        self.joining: dict[worker.Link, int] | None = None  # connections as an init began
        self.world: frozenset[worker.Link] = frozenset()  # those the last init opened
        self.unreadable = False  # the connections could not be read (said once)
        self.connections = worker.TcpConnections()
        self.fence = True  # False once an unfenced framework was imported: nothing is cut
        self.signals: tfwait.Signals | None = None  # horovod.tensorflow's collectives

    def patches(self) -> dict[str, Patch]:
        patches: dict[str, Patch] = {MPI_OPS: self.patch, ELASTIC: self.patch_elastic,
                                     OPTIMIZER: self.patch_optimizer, TF_OPS: self.patch_tf,
                                     TF: self.patch_tf_gradients}
        for module, framework in UNFENCED.items():
            patches[module] = functools.partial(self.unfenced, framework)
        return patches

    def unfenced(self, framework: str, module: Any) -> None:
        """The process imported a framework the hook does not fence: it says so (heartbeats
        start, carrying the problem) and cuts nothing from now on."""
        self.fence = False
        if self.beater is not None:
            self.beater.fence = False
        self.problem(unfenced_problem(framework), "no fence and no hang detection for this "
                     "process; horovodrun's driver is hardened all the same")

    def patch_elastic(self, elastic: Any) -> None:
        """A host change commits the state first and always syncs after it
        (worker.saved_on_host_change): with no step counted twice and no rank left out of the
        new world's sync, a worker joins, or one announced to go leaves. Commits are counted."""
        state = getattr(elastic, "State", None)
        check = getattr(state, "check_host_updates", None)
        commit = getattr(state, "commit", None)
        if not (callable(check) and callable(commit)
                and callable(getattr(state, "save", None))):
            raise RuntimeError(f"{ELASTIC}: State.check_host_updates, commit or save not "
                               "found: not patched")
        progress = self.progress
        state.check_host_updates = worker.saved_on_host_change(  # type: ignore[union-attr]
            check, progress.saved)
        run_fn = getattr(elastic, "run_fn", None)
        if callable(run_fn):
            elastic.run_fn = self.leaving_failed_worlds(run_fn)

        @functools.wraps(commit)
        def saving_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
            progress.saved()  # `commit` saves first, then checks the hosts
            return commit(self, *args, **kwargs)

        state.commit = saving_commit  # type: ignore[union-attr]
        # Scripts save without commit too (a save and check_host_updates of their own): the
        # save of ObjectState (torch's and Keras's states call it) is the point a failed
        # world rolls back to, and each one is counted.
        objects = getattr(elastic, "ObjectState", None)
        save = getattr(objects, "save", None)
        if callable(save):
            @functools.wraps(save)
            def counted_save(self: Any, *args: Any, **kwargs: Any) -> Any:
                result = save(self, *args, **kwargs)
                progress.saved(commit=True)
                return result

            objects.save = counted_save  # type: ignore[union-attr]

    def leaving_failed_worlds(self, run_fn: Callable[..., Any]) -> Callable[..., Any]:
        """Horovod's `run_fn(func, reset)` (under every framework's `hvd.elastic.run`), with
        `func` leaving a failed world as its HorovodInternalError passes: horovod.tensorflow's
        collectives fail inside TensorFlow's executor, and the first Python sees of it is
        this error (horovod.torch's `synchronize` has left already: a second leave is a no-op)."""
        hook = self

        @functools.wraps(run_fn)
        def leaving_run_fn(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            @functools.wraps(func)
            def leaving(*a: Any, **k: Any) -> Any:
                failed: list[BaseException] = []
                try:
                    return func(*a, **k)
                except Exception as e:
                    if type(e).__name__ != "HorovodInternalError":
                        raise
                    hook.failed_world()
                    failed.append(e)
                raise hook.released(failed)  # outside the handler: no context to the frames

            return run_fn(leaving, *args, **kwargs)

        return leaving_run_fn

    def released(self, failed: list[BaseException]) -> BaseException:
        """The failed step's HorovodInternalError (the only item of `failed`) as the elastic
        loop gets it: a copy without its traceback, while the original, with the frames of
        the failed step, is dropped on a thread of its own.

        Those frames hold what the step was using, and freeing them can take long: Keras's
        `model.fit` holds its tf.data iterator, whose destructor waits for the pipeline's
        autotuning thread to end its current period (gdb on real nodes: the survivor's main
        thread in `~RootDataset::Iterator`, the model thread in `Model::OptimizeLoop`'s timed
        wait, well past the deadlock test's bound), and the main thread would do that at the end of
        Horovod's `except` before it resets. TensorFlow lets go of the GIL while a tensor
        handle is deleted, so the reset goes on meanwhile."""
        error = failed[0]
        try:
            copy = type(error)(str(error))
        except Exception:  # not Horovod's class after all: the error as it came
            return error
        del error  # the list's must be the last reference
        host = self.env.get("HOROVOD_HOSTNAME", "")

        def drop() -> None:
            began = time.monotonic()
            failed.clear()  # the last reference: the failed step's frames are freed here
            took = time.monotonic() - began
            print(f'{{"event": "failed_step.released", "host": "{host}", '
                  f'"seconds": {took:.2f}, "time": {time.time():.3f}}}',
                  file=sys.stderr, flush=True)

        threading.Thread(target=drop, daemon=True,
                         name="elastic-supervisor-failed-step").start()
        return copy

    def failed_world(self) -> None:
        """A collective of this process's world failed: its state rolls back, the graphs' waits
        never complete, and what is left of its connections is cut."""
        self.progress.rolled_back()
        if self.signals is not None:
            self.signals.forget()
        self.leave_world()

    def patch_optimizer(self, optimizer: Any) -> None:
        """Count the training steps: horovod.torch's DistributedOptimizer copies the methods of
        `_DistributedOptimizer` (and the Adasum one) into the class it makes for the script's
        optimizer when the script calls it, so the wrapped `step` is the one that runs."""
        found = [c for c in (getattr(optimizer, "_DistributedOptimizer", None),
                             getattr(optimizer, "_DistributedAdasumOptimizer", None))
                 if c is not None and callable(getattr(c, "step", None))]
        if not found:
            raise RuntimeError(f"{OPTIMIZER}: _DistributedOptimizer.step not found: steps "
                               "are not counted (commits are)")
        for cls in found:
            cls.step = self.progress.counted(cls.step)

    def _check(self, name: str, mpi_ops: Any, needed: tuple[str, ...]) -> None:
        version = _horovod_version()
        if not version.startswith(SUPPORTED):
            raise RuntimeError(f"Horovod {version} is not {SUPPORTED}x: not patched")
        missing = [n for n in needed if not callable(getattr(mpi_ops, n, None))]
        if missing:
            raise RuntimeError(f"{name}: {', '.join(missing)} not found: not patched")
        self.module = mpi_ops

    def patch(self, mpi_ops: Any) -> None:
        self._check(MPI_OPS, mpi_ops, ("synchronize", "init", "rank", "size"))
        timed_synchronize = self.progress.wrap(mpi_ops.synchronize, "c")

        @functools.wraps(timed_synchronize)
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            try:
                return timed_synchronize(*args, **kwargs)
            except Exception as e:
                if type(e).__name__ == "HorovodInternalError":
                    self.failed_world()
                raise

        mpi_ops.synchronize, mpi_ops.init = synchronize, self.watched_init(mpi_ops.init)

    def patch_tf(self, mpi_ops: Any) -> None:
        """horovod.tensorflow: its init as torch's, its collectives timed (tfwait.py)."""
        self._check(TF_OPS, mpi_ops, ("init", "rank", "size"))
        tf = sys.modules.get("tensorflow")
        if tf is None:
            raise RuntimeError(f"{TF_OPS} was imported without tensorflow: not patched")
        self.signals = tfwait.Signals(self.progress, tf)
        tfwait.patch_ops(mpi_ops, self.signals)
        mpi_ops.init = self.watched_init(mpi_ops.init)

    def patch_tf_gradients(self, package: Any) -> None:
        if self.signals is None:
            raise RuntimeError(f"{TF_OPS} was not patched: the gradients are not timed")
        tfwait.patch_gradients(package, self.signals)

    def watched_init(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """A framework's `init`: heartbeats start as the first one begins, it is timed as a
        wait, and the connections it opens are the world's."""
        timed_init = self.progress.wrap(init, "i", after=self.initialised)

        @functools.wraps(timed_init)
        def watched(*args: Any, **kwargs: Any) -> Any:
            # Heartbeats from the first init on, not after it: a process waiting in the first
            # rendezvous of a run (a member lost there never comes) is seen waiting there.
            self.start()
            if self.signals is not None:  # a new world: the old one's graphs are gone
                self.signals.forget()
            self.joining = self.links()
            return timed_init(*args, **kwargs)

        return watched

    def patched(self, name: str, problem: str) -> None:
        if not problem:
            return
        lost = {OPTIMIZER: "steps are not counted for the goodput",
                TF: "steps are not counted for the goodput",
                ELASTIC: "no save at a host change; saves are not counted"}.get(name)
        if lost is not None:
            # Said on stderr only: a problem in the heartbeats takes the process out of the
            # hang rules, and these cost neither the fence nor what the rules read.
            print(f"elastic-supervisor hook: {problem} ({lost})", file=sys.stderr, flush=True)
            return
        self.problem(problem, "no fence, no hang detection for this process")

    def problem(self, text: str, lost: str) -> None:
        """Say a problem once on stderr (with what is `lost`) and in every heartbeat from now
        on: heartbeats start, so the supervisor can say so."""
        if text in self.problems:
            return
        self.problems.append(text)
        print(f"elastic-supervisor hook: {text} ({lost})", file=sys.stderr, flush=True)
        if self.beater is not None and text not in self.beater.problems:
            self.beater.problems.append(text)
        self.start()

    def initialised(self) -> None:
        p, m = self.progress, self.module
        p.inits += 1
        try:
            p.rank, p.size = int(m.rank()), int(m.size())
        except Exception:
            p.rank = p.size = None
        after = self.links()
        if self.joining is not None and after is not None:
            self.world = worker.world_links(self.joining, after, self.keep())
        self.joining = None
        self.start()

    def links(self) -> dict[worker.Link, int] | None:
        """This process's established connections (None, said once, if they cannot be read:
        /proc unreadable; the process then cuts nothing on leaving)."""
        try:
            return worker.links(self.connections())
        except Exception as e:
            if not self.unreadable:
                self.unreadable = True
                print(f"elastic-supervisor hook: cannot read this process's connections: "
                      f"{e!r} (a failed world's connections are not cut on leaving it)",
                      file=sys.stderr, flush=True)
            return None

    def leave_world(self) -> None:
        """This process's world failed (a collective raised HorovodInternalError): cut the
        reading side of what is left of the connections its init opened. Its own Horovod
        thread may wait in that world for a peer that waits for it in turn (each in another
        collective: the peer to receive from this one, this one in the negotiation of the next
        step), and only the Gloo timeout would end that; cut, this process's Horovod fails at
        once and closes its connections, so the peer fails at once too."""
        world, self.world = self.world, frozenset()
        now = self.links() if world and self.fence else None
        if not now:
            return
        n = worker.sever(fd for link, fd in now.items() if link in world)
        print(f'{{"event": "fence.left_world", "host": "{self.env.get("HOROVOD_HOSTNAME", "")}", '
              f'"connections": {n}, "time": {time.time():.3f}}}', file=sys.stderr, flush=True)

    def keep(self) -> list[worker.Endpoint]:
        """The endpoints no cut touches: the supervisor's and the rendezvous server's."""
        env = self.env
        addr = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        keep = [(addr, self.port)]
        if _env_int(env, "HOROVOD_GLOO_RENDEZVOUS_PORT") is not None:
            keep.append((addr, int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])))
        return keep

    def start(self) -> None:
        if self.beater is not None:
            return
        env = self.env
        addr = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        self.beater = worker.Beater(
            self.progress, key=self.key, supervisor=(addr, self.port), run=self.run,
            host=env["HOROVOD_HOSTNAME"], local_rank=int(env["HOROVOD_LOCAL_RANK"]),
            keep=self.keep(), problems=self.problems, connections=self.connections,
            fence=self.fence).start(watch_env=dict(os.environ))
