"""Fixtures of the end-to-end tests on real nodes: the training images in every node of the
session's cluster, and the main job in a namespace per test.

A tour is a test class marked `tour`: one job shared by its tests (a class-scoped fixture), each
test one fault with all of its own assertions, run in the order written. Once a fault of a tour
fails, the job it leaves behind proves nothing about the next faults: they are skipped, naming
the fault that failed (which is reported as failed itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster import images
from localcluster.nodes import Cluster
from tests.e2e.fakehosts import HorovodRun, HostSet, horovod_on_fake_hosts
from tests.e2e.jobs import Job, main_job


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if item.get_closest_marker("tour") is None or call.excinfo is None:
        return
    if not call.excinfo.errisinstance(pytest.skip.Exception) and item.parent is not None:
        item.parent.stash.setdefault(TOUR_BROKEN, item.name)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("tour") is None or item.parent is None:
        return
    broken = item.parent.stash.get(TOUR_BROKEN, None)
    if broken is not None:
        pytest.skip(f"the tour's job broke at {broken}")


TOUR_BROKEN = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def main_images(cluster: Cluster) -> dict[str, Path]:
    """The launcher and worker images (image name -> tarball), in every node of the cluster
    since its start."""
    tarballs = images.build(images.Settings())
    assert set(tarballs.values()) <= set(cluster.settings.images), "images rebuilt mid-session"
    return tarballs


@pytest.fixture
def make_job(cluster: Cluster, cluster_api: client.ApiClient, main_images: dict[str, Path],
             tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start the main job (manifests/overlays/local) in a fresh namespace; deleted after."""
    with ExitStack() as stack:
        def make(**kw: Any) -> Job:
            return stack.enter_context(main_job(cluster, cluster_api, tmp_path, **kw))
        yield make


@pytest.fixture
def fake_hosts(tmp_path: Path) -> Iterator[tuple[HostSet, list[HorovodRun]]]:
    """Loopback sshd hosts and the horovodruns a test starts on them (no cluster), stopped at
    the end."""
    with horovod_on_fake_hosts(tmp_path) as made:
        yield made
