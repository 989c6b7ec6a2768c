"""Test certificates made with the openssl CLI (as tests/e2e/test_client_cert_identity.py does):
CAs, server certificates with SANs, client certificates whose subject carries a Kubernetes
identity (CN = user, O = groups). Stdlib only; everything valid for two days, RSA 2048."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def subject(cn: str, orgs: tuple[str, ...] = ()) -> str:
    """An openssl -subj string: one O per group, then the CN."""
    return "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"


def make_ca(d: Path, stem: str, cn: str) -> None:
    """A self-signed CA: `stem`.crt / `stem`.key in `d`."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key",
            "-out", f"{stem}.crt", "-days", "2", "-subj", f"/CN={cn}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def issue(d: Path, stem: str, ca: str, subj: str, *, sans: str | None = None,
          usage: str = "clientAuth") -> None:
    """`stem`.crt / `stem`.key signed by CA `ca` (stem in `d`), with extended key usage `usage`
    (clientAuth, serverAuth) and, for servers, subjectAltName `sans`."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key", "-out", f"{stem}.csr",
            "-subj", subj, cwd=d)
    ext = [f"extendedKeyUsage={usage}", "basicConstraints=CA:FALSE"]
    if sans:
        ext.append(f"subjectAltName={sans}")
    (d / f"{stem}.ext").write_text("\n".join(ext) + "\n")
    openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{stem}.crt", "-days", "2", "-extfile", f"{stem}.ext", cwd=d)


def self_signed(d: Path, stem: str, subj: str) -> None:
    """A self-signed leaf certificate (no CA anyone trusts)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key",
            "-out", f"{stem}.crt", "-days", "2", "-subj", subj, cwd=d)
