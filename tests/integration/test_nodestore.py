"""The nodes' image store: imported once by a real containerd, hard-linked into each node's root,
and each copy is a containerd root that serves the image on its own."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from localcluster import nodestore
from localcluster.tarimage import TOOLBOX_IMAGE, toolbox_image


def blobs(root: Path) -> list[Path]:
    return sorted((root / "io.containerd.content.v1.content/blobs/sha256").iterdir())


def test_a_seed_is_made_once_linked_per_node_and_each_copy_serves_the_image(
        tmp_path: Path) -> None:
    cache, lines = tmp_path / "cache", []
    tarball = toolbox_image()[1]
    seed = nodestore.seed([tarball], cache, lines.append)
    assert nodestore.seed([tarball], cache, lines.append) == seed
    assert lines[0].startswith("node image store made") and "cached" in lines[1], lines

    copies = [tmp_path / f"node-{i}" / "root" for i in (1, 2)]
    for root in copies:
        nodestore.populate(seed, root)
    for root in copies:
        assert [b.stat().st_ino for b in blobs(root)] == [b.stat().st_ino for b in blobs(seed)]
        for db in nodestore.DATABASES:
            assert (root / db).stat().st_ino != (seed / db).stat().st_ino, db
        with nodestore._containerd(root) as socket:
            out = nodestore._ctr(socket, "images", "ls", "-q", timeout=30).stdout
            assert TOOLBOX_IMAGE in out.split(), out
            check = nodestore._ctr(socket, "images", "check", timeout=30).stdout
            assert "complete" in check and "incomplete" not in check, check
    # Each node wrote its own database: the seed's is untouched and still serves the image.
    with nodestore._containerd(seed) as socket:
        assert TOOLBOX_IMAGE in nodestore._ctr(socket, "images", "ls", "-q", timeout=30).stdout


def test_a_root_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    seed = nodestore.seed([toolbox_image()[1]], tmp_path / "cache", lambda _: None)
    root = tmp_path / "root"
    root.mkdir()
    (root / "x").write_text("")
    with pytest.raises(nodestore.StoreError, match="is not empty"):
        nodestore.populate(seed, root)


def test_a_seed_whose_tarballs_are_gone_is_pruned(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    gone = tmp_path / "old.tar"
    gone.write_bytes(toolbox_image()[1].read_bytes())
    old = nodestore.seed([gone], cache, lambda _: None)
    gone.unlink()
    nodestore.seed([toolbox_image()[1]], cache, lambda _: None)
    assert not old.exists()


def test_a_seed_is_never_pruned_while_a_node_copies_it(tmp_path: Path) -> None:
    """Another checkout's images replace the seed (its tarballs are gone): the prune waits
    for a copy under way, and a copy that starts after the prune says why it cannot."""
    cache = tmp_path / "cache"
    gone = tmp_path / "old.tar"
    gone.write_bytes(toolbox_image()[1].read_bytes())
    old = nodestore.seed([gone], cache, lambda _: None)
    gone.unlink()
    with open(cache / "nodestore" / ".lock", "a") as copying:  # what populate holds
        fcntl.flock(copying, fcntl.LOCK_SH)
        other = threading.Thread(target=nodestore.seed, args=([toolbox_image()[1]], cache,
                                                             lambda _: None))
        other.start()
        other.join(1.0)
        assert other.is_alive() and old.exists(), "pruned under a copy"
    other.join(120)
    assert not old.exists()
    with pytest.raises(nodestore.StoreError, match="was replaced by another checkout"):
        nodestore.populate(old, tmp_path / "late" / "root")
