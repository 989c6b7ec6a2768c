"""Identity from verified client certificates (the `clientCertificate` source) end to end: Envoy's
TLS listener verifies the client's certificate against a CA; the filter reads the verified
subject (CN = user, O = groups) from the connection and classifies by it. A client without a
certificate is anonymous, and identity headers it sends are not believed."""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from apfkit.apf_policy import group_policy
from apfkit.envoyproc import wait_until

pytestmark = pytest.mark.apf

POLICY = group_policy("cert-level", "cert-team", level_uid="pl-cert", schema_uid="fs-cert")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate CN=cert-alice,
    O=cert-team, O=cert-extra (two groups)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (.ci/run installs it)")
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=apf-e2e-ca", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
            "-subj", "/O=cert-team/O=cert-extra/CN=cert-alice", cwd=d)
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "client.crt", "-days", "2", cwd=d)
    return d


def tls_get(port: int, pki: Path, *, client_cert: bool, headers: dict | None = None):
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        c.request("GET", "/api/v1/namespaces/default/pods", headers=headers or {})
        r = c.getresponse()
        r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}
    finally:
        c.close()


def test_verified_client_certificate_identifies_the_caller(gateway, pki):
    gw = gateway({"identity": {"sources": [{"type": "clientCertificate"}]},
                  "explainGroups": ["cert-team", "system:unauthenticated"], "policy": POLICY},
                 probe=False,
                 downstream_tls={"cert": str(pki / "server.crt"), "key": str(pki / "server.key"),
                                 "ca": str(pki / "ca.crt")})

    def up():
        try:
            return tls_get(gw.port, pki, client_cert=True)[0] == 200
        except OSError:
            return False
    wait_until(up, timeout=30, what="a TLS request through the gateway")

    st, h = tls_get(gw.port, pki, client_cert=True)
    assert st == 200
    assert h.get("x-kubernetes-pf-flowschema-uid") == "fs-cert", h
    assert h.get("x-kubernetes-pf-prioritylevel-uid") == "pl-cert", h
    assert h.get("x-apf-flowschema") == "cert-team", h

    # No certificate: anonymous (system:unauthenticated), whatever identity headers it sends.
    st, h = tls_get(gw.port, pki, client_cert=False,
                    headers={"X-Remote-User": "cert-alice", "X-Remote-Group": "cert-team"})
    assert st == 200
    assert h.get("x-kubernetes-pf-flowschema-uid") != "fs-cert", h
    assert h.get("x-apf-flowschema") in ("global-default", "catch-all"), h
