"""Certificates and keys for the local control plane, made with the openssl command line.

Owns: a throwaway CA, the kube-apiserver serving certificate (SANs 127.0.0.1, localhost, the
in-cluster service names and any extra address the apiserver is bound to), a client certificate
for the admin user (O=system:masters), the ServiceAccount token signing key pair, and
`client_cert` for further clients (kubelets as system:node:<name>, kube-proxy). Everything lives
in one directory that the cluster removes on shutdown. Never used for anything but local test
clusters.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class PkiError(RuntimeError):
    """openssl is missing or one of its commands failed."""


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")


def _client_or_server_cert(
    d: Path, name: str, subject: str, ext: str, days: int = 2
) -> tuple[Path, Path]:
    key, csr, crt, extfile = (d / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    extfile.write_text(ext)
    _openssl("genrsa", "-out", key.name, "2048", cwd=d)
    _openssl("req", "-new", "-key", key.name, "-subj", subject, "-out", csr.name, cwd=d)
    _openssl(
        "x509", "-req", "-in", csr.name, "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", str(days), "-extfile", extfile.name, "-out", crt.name,
        cwd=d,
    )
    csr.unlink()
    extfile.unlink()
    return crt, key


CLIENT_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n")


def client_cert(d: Path, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """Issue a client certificate CN=`cn` (O=`org`) signed by the CA in `d`; return (crt, key)."""
    subject = (f"/O={org}" if org else "") + f"/CN={cn}"
    return _client_or_server_cert(d, name, subject, CLIENT_EXT)


def make_pki(d: Path, server_ips: tuple[str, ...] = ()) -> Pki:
    """Create CA, apiserver serving cert (also valid for `server_ips`), admin client cert and SA
    key pair in `d`."""
    if shutil.which("openssl") is None:
        raise PkiError("openssl not found on PATH (needed for the local cluster's certificates)")
    d.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=elastic-supervisor-local-ca",
        "-days", "2", "-out", "ca.crt", cwd=d,
    )
    server_crt, server_key = _client_or_server_cert(
        d, "apiserver", "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,"
        + "".join(f"IP:{ip}," for ip in server_ips)
        + "DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n",
    )
    admin_crt, admin_key = client_cert(d, "admin", "admin", "system:masters")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(
        ca_cert=d / "ca.crt", ca_key=d / "ca.key",
        server_cert=server_crt, server_key=server_key,
        admin_cert=admin_crt, admin_key=admin_key,
        sa_key=d / "sa.key", sa_pub=d / "sa.pub",
    )
