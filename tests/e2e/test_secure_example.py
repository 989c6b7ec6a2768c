"""The shipped envoy/kube-apiserver.yaml, run as is in a real Envoy: it authenticates every caller
and nobody can be someone else — to apf-wasm or to the apiserver behind it.

What the test rewrites in a copy of the file (nothing else; comment lines are left alone and
every rewrite must match exactly as often as stated, so a changed example fails loudly):
  - the admin and listener addresses → 127.0.0.1, port 0 (a free port);
  - the kube-apiserver endpoint `kubernetes.default.svc:443` → 127.0.0.1:<stand-in port>;
  - the file paths: the module (`/etc/envoy/apf_wasm.wasm`), `/etc/envoy/tls/` and
    `/etc/kubernetes/pki/` → test files;
  - the plugin configuration gains two keys the shipped one lacks (asserted): `explainGroups`
    (so the test can read the classification from the `x-apf-*` headers) and `policy` (one level
    and one FlowSchema for group `dev`'s pods in namespace `default`, to compare what apf-wasm
    classifies with the path the apiserver receives). Every shipped key is kept as is.
Envoy runs with `APF_WASM_TOKEN` in its environment (the shipped file reads the token of its
`/metrics` poll from there, `host_env_keys`).
The upstream cluster keeps its TLS transport socket: the stand-in apiserver is the test upstream
(apfkit/upstream.py, which records the headers it receives) behind a TLS listener that serves
a certificate for `kubernetes.default.svc` from the cluster CA and REQUIRES a client certificate
from the front-proxy CA, so the example's upstream TLS (SNI, SAN check, front-proxy client
certificate) is exercised too. Its `/metrics` reports POD_COUNT pods of POD_SIZE bytes and answers
401 without `Authorization: Bearer <METRICS_TOKEN>`; it echoes upgraded (101) connections.

Test PKI (openssl): cluster CA (signs client certificates — the listener's client CA — and the
apiserver's serving certificate), front-proxy CA (signs `front-proxy-client`), the gateway's
serving certificate, clients alice (O=dev, O=qa) and admin (O=system:masters), a client of the
cluster CA in `system:masters` without a CN, and two rogue `admin`s in `system:masters`:
self-signed, and signed by an unknown CA."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from apfkit.apf_policy import flow_schema, priority_level
from apfkit.envoy_template import wasm_to_native
from apfkit.envoyproc import REPO, EnvoyProcess, validate_config, wait_until
from apfkit.observe import parse_dump
from apfkit.pki import have_openssl, issue, make_ca, self_signed, subject
from apfkit.upstream import Upstream
from apfkit.work_estimate import list_seats, pl_max_seats

pytestmark = [pytest.mark.apf, pytest.mark.core]

SHIPPED = REPO / "envoy" / "kube-apiserver.yaml"
LISTENER = "apiserver_gateway"
PODS = "/api/v1/namespaces/default/pods"
DUMP = "/debug/api_priority_and_fairness/dump_priority_levels"
SPOOF = [("X-Remote-User", "system:admin"), ("X-Remote-Group", "system:masters"),
         ("x-remote-group", "system:authenticated"), ("X-Remote-Extra-Scopes", "everything"),
         ("X-Remote-Uid", "0"), ("Impersonate-User", "system:admin"),
         ("Impersonate-Group", "system:masters")]

# The cluster token (Envoy's APF_WASM_TOKEN; the stand-in's /metrics requires it) and the pods
# its /metrics reports.
METRICS_TOKEN = "e2e-metrics-token"
POD_COUNT, POD_SIZE = 500, 1_000
# Suggested defaults at 600 seats plus the test's dev-level (10 shares): ΣNCS = 245 + 10 = 255;
# alice's cluster-wide LIST is in global-default (20 shares, handSize 6): NominalCL =
# ceil(600·20/255) = 48, plMaxSeats = max(1, min(ceil(48·0.15) = 8, 48 div 6 = 8)) = 8 (checked
# with `apf check`). A LIST without resourceVersion reads storage: ceil(500·1000 / 100 000) = 5.
GLOBAL_DEFAULT_CL, GLOBAL_DEFAULT_HAND = 48, 6
EXEC = "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true&stdout=true"

# Test-only additions to the plugin configuration.
DEV_FS = "dev-default-pods"
DEV_PL = "dev-level"
TEST_KEYS = {
    "explainGroups": ["system:authenticated"],
    "policy": [
        priority_level(DEV_PL, 10),
        flow_schema(DEV_FS, DEV_PL, precedence=500, groups=["dev"], non_resource_rules=[],
                    resource_rules=[{"verbs": ["*"], "apiGroups": [""], "resources": ["pods"],
                                     "namespaces": ["default"]}]),
    ],
}


# -- the rewrite ------------------------------------------------------------------------------

def _sub_code(text: str, old: str, new: str, count: int, what: str) -> str:
    """Replace `old` by `new` on non-comment lines; exactly `count` occurrences must exist."""
    lines = text.split("\n")
    seen = 0
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("#"):
            continue
        n = ln.count(old)
        if n:
            seen += n
            lines[i] = ln.replace(old, new)
    assert seen == count, f"rewrite {what!r}: {old!r} found {seen}× in {SHIPPED.name}, expected {count}"
    return "\n".join(lines)


def _plugin_config(text: str, add: dict) -> tuple[str, dict]:
    """The JSON plugin configuration (the `value: |` block of the wasm filter) with `add`'s keys
    added; returns the new text and the shipped configuration."""
    m = re.search(r"^(?P<ind> +)value: \|\n(?P<body>(?:(?P=ind) +.*\n)+)", text, re.M)
    assert m, "no plugin configuration block (value: |) in the example"
    shipped = json.loads(m.group("body"))
    clash = set(add) & set(shipped)
    assert not clash, f"the shipped plugin configuration already sets {clash}: adapt the test"
    body_ind = re.match(r" *", m.group("body")).group(0)
    new = {**shipped, **add}
    block = f"{m.group('ind')}value: |\n{body_ind}{json.dumps(new)}\n"
    return text[:m.start()] + block + text[m.end():], shipped


def localize(text: str, *, module: str, kube_pki: Path, envoy_tls: Path, apiserver_port: int) -> tuple[str, dict]:
    text = _sub_code(text, "socket_address: { address: 127.0.0.1, port_value: 9901 }",
                     "socket_address: { address: 127.0.0.1, port_value: 0 }", 1, "admin address")
    text = _sub_code(text, "socket_address: { address: 0.0.0.0, port_value: 16443 }",
                     "socket_address: { address: 127.0.0.1, port_value: 0 }", 1, "listener address")
    text = _sub_code(text, "socket_address: { address: kubernetes.default.svc, port_value: 443 }",
                     f"socket_address: {{ address: 127.0.0.1, port_value: {apiserver_port} }}", 1,
                     "kube-apiserver endpoint")
    text = _sub_code(text, "/etc/envoy/apf_wasm.wasm", module, 1, "module path")
    text = _sub_code(text, "/etc/envoy/tls/", f"{envoy_tls}/", 2, "gateway certificate")
    text = _sub_code(text, "/etc/kubernetes/pki/", f"{kube_pki}/", 4, "cluster PKI")
    return _plugin_config(text, TEST_KEYS)


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    if not have_openssl():
        pytest.skip("openssl is not installed (.ci/run installs it)")
    d = tmp_path_factory.mktemp("secure-pki")
    kube, tls = d / "kubernetes-pki", d / "envoy-tls"
    kube.mkdir()
    tls.mkdir()
    make_ca(d, "ca", "kubernetes")
    make_ca(d, "front-proxy-ca", "front-proxy-ca")
    make_ca(d, "rogue-ca", "kubernetes")  # same name, other key
    issue(d, "apiserver", "ca", "/CN=kube-apiserver", usage="serverAuth",
          sans="DNS:kubernetes.default.svc,DNS:kubernetes")
    issue(d, "gateway", "ca", "/CN=apf-gateway", usage="serverAuth", sans="IP:127.0.0.1,DNS:localhost")
    issue(d, "front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client")
    issue(d, "alice", "ca", subject("alice", ("dev", "qa")))
    issue(d, "admin", "ca", subject("admin", ("system:masters",)))
    issue(d, "rogue-admin", "rogue-ca", subject("admin", ("system:masters",)))
    issue(d, "no-cn", "ca", subject("", ("system:masters",)))  # openssl skips the empty CN
    self_signed(d, "selfsigned-admin", subject("admin", ("system:masters",)))
    for src, dst in [("ca.crt", kube / "ca.crt"),
                     ("front-proxy-client.crt", kube / "front-proxy-client.crt"),
                     ("front-proxy-client.key", kube / "front-proxy-client.key"),
                     ("gateway.crt", tls / "gateway.crt"), ("gateway.key", tls / "gateway.key")]:
        dst.write_bytes((d / src).read_bytes())
    return d


class TlsApiserver:
    """The test upstream behind TLS as kube-apiserver with request-header authentication:
    serves `apiserver.crt`, requires a client certificate from the front-proxy CA and records
    the subject of every client certificate presented."""

    def __init__(self, pki: Path) -> None:
        self.up = Upstream()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(str(pki / "front-proxy-ca.crt"))
        self.peers: list[dict] = []
        srv = self.up.server
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        accept = srv.get_request

        def get_request():
            sock, addr = accept()  # the TLS handshake happens here
            self.peers.append(dict(x[0] for x in sock.getpeercert().get("subject", ())))
            return sock, addr
        srv.get_request = get_request  # type: ignore[method-assign]
        self.port = self.up.port

    def start(self) -> "TlsApiserver":
        self.up.start()
        return self

    def stop(self) -> None:
        self.up.stop()


@dataclass
class Resp:
    status: int | None
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None

    def h(self, name: str) -> str | None:
        v = self.headers.get(name.lower())
        return v[0] if v else None


def call(port: int, pki: Path, path: str, *, cert: str | None = None,
         headers: list[tuple[str, str]] | None = None) -> Resp:
    """One GET over TLS (the gateway verified with the cluster CA), presenting client
    certificate `cert` (a stem in the PKI directory) if given. Never raises."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        c.putrequest("GET", path, skip_accept_encoding=True)
        for k, v in headers or []:
            c.putheader(k, v)
        c.endheaders()
        r = c.getresponse()
        body = r.read()
        hs: dict[str, list[str]] = {}
        for k, v in r.getheaders():
            hs.setdefault(k.lower(), []).append(v)
        return Resp(r.status, hs, body)
    except (OSError, http.client.HTTPException) as e:
        return Resp(None, error=f"{type(e).__name__}: {e}")
    finally:
        c.close()


@dataclass
class Secure:
    envoy: EnvoyProcess
    apiserver: TlsApiserver
    pki: Path
    shipped_plugin_config: dict
    # The headers of the gateway's first /metrics poll (made at start).
    first_poll: dict[str, list[str]] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.envoy.ports[LISTENER]

    @property
    def upstream(self) -> Upstream:
        return self.apiserver.up

    def get(self, path: str, cert: str | None = None, headers=None) -> Resp:
        return call(self.port, self.pki, path, cert=cert, headers=headers)


@pytest.fixture(scope="module")
def secure(pki, wasm_module, envoy_bin, tmp_path_factory):
    api = TlsApiserver(pki)
    api.up.set_object_counts({"pods": (POD_COUNT, POD_SIZE)})
    api.up.set_metrics_token(METRICS_TOKEN)
    api.start()
    work = tmp_path_factory.mktemp("secure-example")
    text, shipped = localize(SHIPPED.read_text(), module=wasm_module, kube_pki=pki / "kubernetes-pki",
                             envoy_tls=pki / "envoy-tls", apiserver_port=api.port)
    token_env = {"APF_WASM_TOKEN": METRICS_TOKEN}
    if wasm_module.endswith(".so"):
        # The native host: the same example with the dynamic-module filter in the wasm filter's
        # place (same plugin configuration).
        text = yaml.safe_dump(wasm_to_native(yaml.safe_load(text)))
        token_env["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(Path(wasm_module).parent)
    (work / "kube-apiserver.yaml").write_text(text)
    v = validate_config(envoy_bin, str(work / "kube-apiserver.yaml"), env=token_env)
    assert v.returncode == 0, f"rewritten example invalid:\n{v.stdout[-3000:]}\n{v.stderr[-3000:]}"
    env = EnvoyProcess(text, work / "run", envoy_bin=envoy_bin, name="secure", env=token_env)
    s = Secure(env, api, pki, shipped)
    try:
        env.start().wait_ready(timeout=40)
        wait_until(lambda: s.get("/healthz", cert="alice").status == 200, timeout=30,
                   what="a request through the example gateway")
        # The first poll of /metrics happens at start (a failed one is retried within 10 s).
        wait_until(lambda: any(st == 200 for _, st in api.up.scrapes()), timeout=30,
                   what=f"a successful /metrics poll (so far: {api.up.scrapes()})")
        s.first_poll = api.up.received("/metrics")[0][1]
        yield s
    except Exception:
        print(env.log_tail(80))
        raise
    finally:
        env.stop()
        api.stop()


def received_identity(hdrs: dict[str, list[str]]) -> dict[str, list[str]]:
    """The X-Remote-* headers the apiserver received (group order is the certificate's subject as
    Envoy prints it, RFC 2253 = reversed; kube-apiserver does not care)."""
    return {k: sorted(v) for k, v in hdrs.items() if k.startswith("x-remote-")}


# -- tests ------------------------------------------------------------------------------------

def test_the_example_is_secure_as_shipped(secure):
    """The properties the test relies on are in the shipped file (not added by the rewrite)."""
    cfg = secure.shipped_plugin_config
    assert cfg["identity"] == {"sources": [{"type": "clientCertificate"}], "setFrontProxyHeaders": True}
    assert cfg.get("debugGroups", ["system:masters"]) == ["system:masters"]
    # Costs from the cluster, through the example's upstream cluster, the token not in the file.
    assert cfg["workEstimator"]["clusterMetrics"] == {
        "cluster": "kube_apiserver", "authority": "kubernetes.default.svc", "tokenEnv": "APF_WASM_TOKEN"}
    text = SHIPPED.read_text()
    for needle in ("require_client_certificate: true", "failure_policy: FAIL_CLOSED",
                   "normalize_path: true", "merge_slashes: true",
                   "path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT",
                   "host_env_keys: [APF_WASM_TOKEN]", "upgrade_type: websocket",
                   "upgrade_type: spdy/3.1", "max_concurrent_streams: 1000"):
        assert needle in text, needle
    # Every stream ends: a finite idle timeout (the route timeout stays 0s, see the file).
    idle = re.findall(r"^\s*stream_idle_timeout: (\d+)s", text, re.M)
    assert idle and all(int(v) > 0 for v in idle), idle


@pytest.mark.parametrize("cert", [None, "selfsigned-admin", "rogue-admin"])
def test_unverified_client_cannot_get_in(secure, cert):
    """No certificate, a self-signed one, one from an unknown CA (all claiming admin in
    system:masters, with spoofed identity headers): the TLS handshake fails; nothing reaches the
    apiserver, not the request, not the headers, not a debug dump."""
    secure.upstream.reset()
    for path in (PODS, DUMP):
        r = secure.get(path, cert=cert, headers=SPOOF)
        assert r.status is None, f"{cert}: {path} answered {r.status} {r.headers} {r.body[:200]!r}"
        assert "SSL" in (r.error or "") or "reset" in (r.error or "").lower() \
            or "Broken pipe" in (r.error or "") or "closed" in (r.error or "").lower(), r.error
    assert secure.upstream.received() == []


def test_plain_http_is_refused(secure):
    c = http.client.HTTPConnection("127.0.0.1", secure.port, timeout=5)
    secure.upstream.reset()
    try:
        c.request("GET", PODS, headers=dict(SPOOF[:2]))
        status = c.getresponse().status
    except (OSError, http.client.HTTPException):
        status = None
    finally:
        c.close()
    assert status is None or status >= 400
    assert secure.upstream.received() == []


def test_verified_client_is_who_its_certificate_says(secure):
    """alice (O=dev, O=qa) spoofing system:admin / system:masters in every identity header:
    classified as alice (her FlowSchema and level, not exempt); the apiserver sees exactly the
    verified X-Remote-User / X-Remote-Group, one header per group, and no other X-Remote-*."""
    secure.upstream.reset()
    r = secure.get(PODS, cert="alice", headers=SPOOF)
    assert r.status == 200, r
    assert r.h("x-apf-flowschema") == DEV_FS, r.headers
    assert r.h("x-apf-prioritylevel") == DEV_PL, r.headers
    got = secure.upstream.received(PODS)
    assert len(got) == 1, got
    hdrs = got[0][1]
    assert received_identity(hdrs) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}, hdrs
    # Impersonate-* travels on: kube-apiserver authorizes impersonation for the verified user
    # (alice may not impersonate system:admin there); apf-wasm did not read it (alice's level).
    assert hdrs.get("impersonate-user") == ["system:admin"], hdrs
    # The gateway connected to the apiserver with the front-proxy client certificate.
    assert secure.apiserver.peers and all(p.get("commonName") == "front-proxy-client"
                                          for p in secure.apiserver.peers), secure.apiserver.peers

    # Without spoofing, the same.
    secure.upstream.reset()
    r = secure.get(PODS, cert="alice")
    assert r.status == 200 and r.h("x-apf-flowschema") == DEV_FS, r.headers
    assert received_identity(secure.upstream.received(PODS)[0][1]) == {
        "x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}


def test_exempt_and_debug_dumps_only_for_verified_masters(secure):
    # admin in system:masters (verified): exempt, and gets the dumps from apf-wasm itself.
    secure.upstream.reset()
    a = secure.get(PODS, cert="admin")
    assert a.status == 200, a
    assert a.h("x-apf-prioritylevel") == "exempt" and a.h("x-apf-flowschema") == "exempt", a.headers
    assert received_identity(secure.upstream.received(PODS)[0][1]) == {
        "x-remote-user": ["admin"], "x-remote-group": ["system:masters"]}
    d = secure.get(DUMP, cert="admin")
    assert d.status == 200 and b"PriorityLevelName" in d.body, (d, d.body[:300])
    assert secure.upstream.received("/debug/") == []

    # alice claiming system:masters: not exempt (level UID differs from admin's), no dump from
    # apf-wasm; the dump request goes to the apiserver as alice.
    r = secure.get(PODS, cert="alice", headers=SPOOF)
    assert r.h("x-kubernetes-pf-prioritylevel-uid") and a.h("x-kubernetes-pf-prioritylevel-uid")
    assert r.h("x-kubernetes-pf-prioritylevel-uid") != a.h("x-kubernetes-pf-prioritylevel-uid"), r.headers
    assert r.h("x-apf-prioritylevel") != "exempt", r.headers
    secure.upstream.reset()
    d = secure.get(DUMP, cert="alice", headers=SPOOF)
    assert d.status == 200 and b"PriorityLevelName" not in d.body, d.body[:300]
    assert b'"kind": "Status"' in d.body, d.body[:300]
    got = secure.upstream.received("/debug/")
    assert [p for p, _ in got] == [DUMP], got
    assert received_identity(got[0][1]) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}


@pytest.mark.parametrize("path", [
    "//api//v1/namespaces/default/pods",
    "/api/v1/namespaces/x/../default/pods",
    "/api/v1/namespaces/default/./pods",
    "/api/v1//namespaces/default/pods/",
    "/api/v1/namespaces/x/%2e%2e/default/pods",   # encoded dot segment
    "/api/v1/namespaces/default/%70ods",           # encoded unreserved character
])
def test_classified_path_is_the_served_path(secure, path):
    """Envoy normalizes before apf-wasm: the FlowSchema that matches only pods in `default`
    applies exactly when the apiserver receives a path for pods in `default`."""
    secure.upstream.reset()
    r = secure.get(path, cert="alice")
    assert r.status == 200, r
    got = secure.upstream.received()
    assert len(got) == 1, got
    served = got[0][0]
    assert served.rstrip("/") == PODS, (path, served)
    assert r.h("x-apf-flowschema") == DEV_FS, (path, served, r.headers)


@pytest.mark.parametrize("path", ["/api/v1/namespaces/default%2Fpods",
                                  "/api/v1/namespaces/default%2fpods",
                                  "/api/v1/namespaces/default%5Cpods",
                                  "/api/v1/namespaces/kube-system%2F..%2Fdefault/pods"])
def test_escaped_slash_is_redirected_to_the_served_path(secure, path):
    """`%2F` / `%5C` in the path: Envoy answers 307 to the unescaped, normalized path (nothing
    reaches the apiserver or apf-wasm); the client following it is classified as the path the
    apiserver receives."""
    secure.upstream.reset()
    r = secure.get(path, cert="alice")
    assert r.status in (301, 302, 307, 308), r
    loc = r.h("location") or ""
    assert loc.endswith(PODS), r.headers
    assert r.h("x-apf-flowschema") is None, r.headers
    assert secure.upstream.received() == []
    follow = loc[loc.index("/api/"):]
    r = secure.get(follow, cert="alice")
    assert r.status == 200 and r.h("x-apf-flowschema") == DEV_FS, r.headers
    assert [p for p, _ in secure.upstream.received()] == [PODS]


def test_other_namespace_is_not_the_dev_schema(secure):
    """Control: the FlowSchema really is specific (another namespace, a dot-segment that ends
    elsewhere)."""
    for path, served in [("/api/v1/namespaces/other/pods", "/api/v1/namespaces/other/pods"),
                         ("/api/v1/namespaces/default/../other/pods", "/api/v1/namespaces/other/pods")]:
        secure.upstream.reset()
        r = secure.get(path, cert="alice")
        assert r.status == 200, r
        assert [p for p, _ in secure.upstream.received()] == [served]
        assert r.h("x-apf-flowschema") not in (None, DEV_FS), r.headers


@pytest.mark.parametrize("path", [
    "/api/v1/namespaces/default/pods/p/exec?command=ls",            # long-running: not queued
    "/api/v1/namespaces/default/pods/p/log?follow=true",            # long-running: not queued
    "/api/v1/namespaces/default/pods?watch=true&resourceVersion=1&timeoutSeconds=1",  # a watch
    "/version",                                                      # non-resource
])
def test_every_request_carries_only_the_verified_identity(secure, path):
    """Requests apf-wasm does not queue (long-running) or holds differently (watches) get the
    same treatment: the apiserver sees the verified identity and nothing the client claimed."""
    secure.upstream.reset()
    r = secure.get(path, cert="alice", headers=SPOOF)
    assert r.status == 200, r
    got = secure.upstream.received(path.split("?")[0])
    assert len(got) == 1, got
    assert received_identity(got[0][1]) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}, got


# -- costs from the cluster ---------------------------------------------------------------------

def test_list_costs_what_the_clusters_counts_imply(secure):
    """The shipped file polls /metrics through the kube_apiserver cluster with the token from
    Envoy's environment (no X-Remote-User, so kube-apiserver authenticates the token): a
    cluster-wide LIST is charged the seats upstream's formula gives for the reported count and
    size, not the 1 seat of an unknown count."""
    want = list_seats(POD_COUNT, POD_SIZE, pl_max_seats(GLOBAL_DEFAULT_CL, GLOBAL_DEFAULT_HAND),
                      from_cache=False)
    assert want == 5
    # The stand-in refuses /metrics without the token (so a charge of 5 proves the poll had it).
    c = http.client.HTTPSConnection("127.0.0.1", secure.apiserver.port, timeout=10,
                                    context=_apiserver_client_ctx(secure.pki))
    try:
        c.request("GET", "/metrics")
        assert c.getresponse().status == 401
    finally:
        c.close()
    poll = secure.first_poll
    assert poll.get("authorization") == [f"Bearer {METRICS_TOKEN}"], poll
    assert not any(k.startswith("x-remote-") for k in poll), poll
    r = secure.get("/api/v1/pods", cert="alice")
    assert r.status == 200, r
    assert r.h("x-apf-prioritylevel") == "global-default", r.headers
    assert r.h("x-apf-seats") == str(want), (r.headers, secure.get(
        "/debug/api_priority_and_fairness/dump_object_counts", cert="admin").body[:600])
    # The counts, as the dump shows them.
    d = secure.get("/debug/api_priority_and_fairness/dump_object_counts", cert="admin")
    rows = {row["Resource"]: row for row in parse_dump(b"\n".join(
        ln for ln in d.body.splitlines() if not ln.startswith(b"#")))}
    assert rows["pods"]["Source"] == "cluster", rows.get("pods")
    assert (int(rows["pods"]["ObjectCount"]), int(rows["pods"]["AverageObjectSizeBytes"])) == (POD_COUNT, POD_SIZE)


def _apiserver_client_ctx(pki: Path) -> ssl.SSLContext:
    """A client of the stand-in apiserver directly (as the gateway: front-proxy certificate)."""
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.check_hostname = False
    ctx.load_cert_chain(str(pki / "front-proxy-client.crt"), str(pki / "front-proxy-client.key"))
    return ctx


# -- raw HTTP/1.1 exchanges (upgrades, trailers) ------------------------------------------------

def _tls(secure, cert: str) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(secure.pki / "ca.crt"))
    ctx.load_cert_chain(str(secure.pki / f"{cert}.crt"), str(secure.pki / f"{cert}.key"))
    raw = socket.create_connection(("127.0.0.1", secure.port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _read_head(sock: ssl.SSLSocket) -> tuple[int, dict[str, list[str]], bytes]:
    """(status, headers, bytes after the head) of the response on `sock`."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(4096)
        assert data, f"connection closed before the response head: {buf!r}"
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    hs: dict[str, list[str]] = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hs.setdefault(k.strip().lower(), []).append(v.strip())
    return int(lines[0].split()[1]), hs, rest


def _echo(sock: ssl.SSLSocket, payload: bytes, already: bytes = b"") -> bytes:
    """Send `payload` and read until it has come back (10 s at most)."""
    sock.sendall(payload)
    got = already
    deadline = time.monotonic() + 10
    while payload not in got and time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        got += data
    return got


def _executing(secure) -> tuple[dict[str, int], int]:
    """({level: ExecutingRequests}, the sum of SeatsInUse over all queues) from the dumps."""
    levels = secure.get(DUMP, cert="admin")
    queues = secure.get("/debug/api_priority_and_fairness/dump_queues", cert="admin")
    assert levels.status == 200 and queues.status == 200, (levels, queues)
    execs = {r["PriorityLevelName"]: int(r["ExecutingRequests"]) for r in parse_dump(levels.body)}
    seats = sum(int(r["SeatsInUse"]) for r in parse_dump(queues.body))
    return execs, seats


UPGRADES = {
    "websocket": [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"),
                  ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                  ("Sec-WebSocket-Protocol", "v5.channel.k8s.io")],
    "spdy": [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
             ("X-Stream-Protocol-Version", "v4.channel.k8s.io")],
}


@pytest.mark.parametrize("kind", sorted(UPGRADES))
def test_exec_upgrade_streams_both_ways_outside_apf(secure, kind):
    """kubectl exec's upgrade (WebSocket, kubectl 1.30+; SPDY/3.1 before) goes through the shipped
    file to the apiserver with the verified identity, bytes stream both ways, and the open stream
    holds no seats (exec is long-running: outside APF, as in kube-apiserver)."""
    secure.upstream.reset()
    sock = _tls(secure, "alice")
    try:
        req = [f"GET {EXEC} HTTP/1.1", "Host: kubernetes.default.svc"]
        req += [f"{k}: {v}" for k, v in UPGRADES[kind] + SPOOF[:2]]
        sock.sendall(("\r\n".join(req) + "\r\n\r\n").encode())
        status, hs, rest = _read_head(sock)
        assert status == 101, (status, hs, rest)
        assert hs.get("upgrade", [""])[0].lower() == UPGRADES[kind][1][1].lower(), hs
        if kind == "websocket":
            assert hs.get("sec-websocket-protocol") == ["v5.channel.k8s.io"], hs
        for payload in (b"\x00ls -l\n", bytes(range(256)) * 64):
            got = _echo(sock, payload, rest)
            assert got == rest + payload, (len(got), got[:80])
            rest = b""
        got = secure.upstream.received(EXEC.split("?")[0])
        assert len(got) == 1, got
        assert received_identity(got[0][1]) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}, got
        assert secure.upstream.snapshot()["upgrades_open"] == 1
        # While it is open: nothing executing, no seat in use, at any level.
        execs, seats = _executing(secure)
        assert seats == 0 and not any(execs.values()), (execs, seats)
        if kind == "websocket":
            # Control: the dumps do show a request that holds seats (a slow GET beside it).
            t = threading.Thread(target=secure.get, args=(PODS, "alice", [("x-sleep-ms", "1500")]))
            t.start()
            try:
                wait_until(lambda: _executing(secure)[0].get(DEV_PL) == 1, timeout=10,
                           what="the slow GET executing in dev-level")
            finally:
                t.join(timeout=15)
        # Still streaming after that.
        assert _echo(sock, b"exit\n") == b"exit\n"
    finally:
        sock.close()
    wait_until(lambda: secure.upstream.snapshot()["upgrades_open"] == 0, timeout=10,
               what="the stand-in's upgraded connection to close with the client's")


# -- identities that cannot be forwarded ---------------------------------------------------------

def test_certificate_without_a_common_name_is_refused(secure):
    """A verified certificate (cluster CA, O=system:masters) with an empty CN names no user the
    gateway can forward; with a bearer token beside it, kube-apiserver would authenticate the
    token, which the gateway did not classify. The gateway answers 403 and forwards nothing."""
    secure.upstream.reset()
    for path in (PODS, "/version", EXEC, DUMP):
        r = secure.get(path, cert="no-cn", headers=[("Authorization", "Bearer some-service-account-token")])
        assert r.status == 403, (path, r)
        body = json.loads(r.body)
        assert body["kind"] == "Status" and body["code"] == 403 and body["reason"] == "Forbidden", body
        assert body["message"] == "client certificate identity cannot be forwarded: empty or invalid common name", body
        assert r.h("x-kubernetes-pf-flowschema-uid") is None, r.headers
    assert secure.upstream.received() == []


# -- probes that must keep failing ---------------------------------------------------------------

def test_odd_case_and_repeated_identity_headers_do_not_reach_the_apiserver(secure):
    """X-Remote-* in any case, repeated, with odd values: the apiserver sees alice only."""
    secure.upstream.reset()
    odd = [("X-REMOTE-USER", "system:admin"), ("x-remote-user", "root"), ("x-ReMoTe-GrOuP", "system:masters"),
           ("X-Remote-Group", "system:masters, system:nodes"), ("X-REMOTE-EXTRA-scopes", "all"),
           ("x-remote-uid", "0"), ("X-Remote-User", " system:admin ")]
    r = secure.get(PODS, cert="alice", headers=odd)
    assert r.status == 200 and r.h("x-apf-flowschema") == DEV_FS, r
    got = secure.upstream.received(PODS)
    assert len(got) == 1, got
    assert received_identity(got[0][1]) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}, got


def test_identity_in_trailers_does_not_reach_the_apiserver(secure):
    """X-Remote-* sent as HTTP/1.1 request trailers: neither trailers nor headers at the apiserver
    carry anything but alice's verified identity."""
    secure.upstream.reset()
    sock = _tls(secure, "alice")
    try:
        body = b'{"kind":"Pod"}'
        req = (f"POST {PODS} HTTP/1.1\r\nHost: kubernetes.default.svc\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\nTrailer: X-Remote-User, X-Remote-Group\r\n\r\n").encode()
        req += b"%x\r\n%s\r\n0\r\nX-Remote-User: system:admin\r\nX-Remote-Group: system:masters\r\n\r\n" % (len(body), body)
        sock.sendall(req)
        status, hs, _ = _read_head(sock)
    finally:
        sock.close()
    assert status == 200, (status, hs)
    got = secure.upstream.received(PODS)
    assert len(got) == 1, got
    assert received_identity(got[0][1]) == {"x-remote-user": ["alice"], "x-remote-group": ["dev", "qa"]}, got
    assert secure.upstream.trailers() == [], secure.upstream.trailers()


@pytest.mark.parametrize("path,served", [
    ("/api/v1/namespaces/default/pods;x", "/api/v1/namespaces/default/pods;x"),
    ("/api/v1/namespaces/default;x/pods", "/api/v1/namespaces/default;x/pods"),
    ("/api/v1/namespaces/default/pods%3Bx", "/api/v1/namespaces/default/pods%3Bx"),
])
def test_semicolons_classify_as_served(secure, path, served):
    """`;` is no path-parameter separator for kube-apiserver (resource `pods;x`, namespace
    `default;x`): the gateway forwards the path as is and does not classify it as pods in
    `default`."""
    secure.upstream.reset()
    r = secure.get(path, cert="alice")
    assert r.status == 200, r
    assert [p for p, _ in secure.upstream.received()] == [served]
    assert r.h("x-apf-flowschema") not in (None, DEV_FS), r.headers
