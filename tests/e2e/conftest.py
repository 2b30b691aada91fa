"""Fixtures of the end-to-end tests on real nodes: the training images in every node of the
session's cluster, and the main job in a namespace per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from localcluster import images
from localcluster.nodes import Cluster
from tests.e2e.jobs import Job, main_job


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
