"""Small container images written without a registry or a Docker daemon.

`write_image` packs files into a one-layer image tarball in the `docker save` layout
(manifest.json, config JSON, layer tar) that `ctr images import` accepts. The toolbox image is
made this way (Debian's static busybox: sh, sleep, nc, wget, ping, ip, ...), cached under
~/.cache/elastic-supervisor/images by the hash of its inputs: tests of the nodes themselves use
it, so that they do not wait for the multi-gigabyte training images. (The pause image is
localcluster.images': a static C program.)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

TOOLBOX_IMAGE = "localhost/elastic-supervisor-toolbox:1"
BUSYBOX = Path("/bin/busybox")
TOOLBOX_APPLETS = ("sh", "sleep", "nc", "wget", "ping", "ip", "cat", "ls", "echo", "kill", "ps",
                   "id", "env", "grep", "dd", "true", "false", "hostname", "date", "mkdir",
                   "touch", "rm", "head", "tail", "seq", "awk", "sed", "wc", "timeout", "test")

def cache_dir() -> Path:
    return Path(os.environ.get("ES_CACHE", Path.home() / ".cache" / "elastic-supervisor"),
                "images")


def write_image(out: Path, name: str, files: Mapping[str, bytes | Path | None],
                links: Mapping[str, str] = {}, config: Mapping[str, object] | None = None
                ) -> Path:
    """Write image `name` to `out`: `files` maps paths in the image to content (bytes, a host
    file copied with its mode, or None for a directory); `links` maps paths to symlink
    targets; `config` is the image's runtime config (Entrypoint, Cmd, Env, User)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as t:
        for path, content in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mtime = 0
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if path == "tmp" else 0o755
                t.addfile(info)
            elif isinstance(content, Path):
                data = content.read_bytes()
                info.size, info.mode = len(data), content.stat().st_mode & 0o7777
                t.addfile(info, io.BytesIO(data))
            else:
                info.size, info.mode = len(content), 0o644
                t.addfile(info, io.BytesIO(content))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
            t.addfile(info)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": dict(config or {}),
                      "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
                      "history": [{"created_by": "localcluster.tarimage"}]},
                     sort_keys=True).encode()
    cfg_id = hashlib.sha256(cfg).hexdigest()
    manifest = json.dumps([{"Config": f"{cfg_id}.json", "RepoTags": [name],
                            "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w") as t:
        for member, data in ((f"{cfg_id}.json", cfg), (f"{diff_id}/layer.tar", layer_bytes),
                             ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


def _cached(key_parts: Sequence[bytes], stem: str) -> tuple[Path, bool]:
    key = hashlib.sha256(b"\0".join(key_parts)).hexdigest()[:16]
    path = cache_dir() / f"{stem}-{key}.tar"
    return path, path.exists()


def toolbox_image() -> tuple[str, Path]:
    """The toolbox image's name and tarball: Debian's static busybox and its applets."""
    if not BUSYBOX.exists():
        raise RuntimeError(f"{BUSYBOX} not found: install Debian's busybox-static (make setup)")
    data = BUSYBOX.read_bytes()
    out, done = _cached([data, TOOLBOX_IMAGE.encode(), " ".join(TOOLBOX_APPLETS).encode()],
                        "toolbox")
    if not done:
        write_image(out, TOOLBOX_IMAGE,
                    {"bin": None, "tmp": None, "etc": None, "bin/busybox": BUSYBOX},
                    links={f"bin/{a}": "busybox" for a in TOOLBOX_APPLETS},
                    config={"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})
    return TOOLBOX_IMAGE, out
