"""A machine restarted under a test run keeps the nodes' work directory in /tmp (gigabytes of
image stores) but loses the record in /run: the next run frees the stores, keeps the logs."""

from __future__ import annotations

from pathlib import Path

from localcluster.nodes import prune_orphans


def test_orphaned_image_stores_are_freed_and_logs_kept(tmp_path: Path) -> None:
    orphan = tmp_path / "es-nodes-abc"
    store = orphan / "es-node-1" / "containerd" / "root" / "io.containerd.content.v1.content"
    store.mkdir(parents=True)
    (store / "blob").write_bytes(b"x" * 4096)
    (orphan / "es-node-1" / "kubelet.log").write_text("the post-mortem\n")
    kept = tmp_path / "es-nodes-def" / "es-node-1"  # a failed run's kept logs, already freed
    kept.mkdir(parents=True)
    (kept / "kubelet.log").write_text("older\n")
    other = tmp_path / "not-ours" / "es-node-1" / "containerd" / "root"
    other.mkdir(parents=True)

    done = prune_orphans(tmp_path)

    assert done == [f"freed the image stores of {orphan} (no live cluster owns it)"]
    assert not (orphan / "es-node-1" / "containerd" / "root").exists()
    assert (orphan / "es-node-1" / "kubelet.log").read_text() == "the post-mortem\n"
    assert (kept / "kubelet.log").exists() and other.exists()
    assert prune_orphans(tmp_path) == []
