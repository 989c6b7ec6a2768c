"""A throwaway single-member etcd on loopback (Debian's `etcd-server`), for the fleet tests and
benchmarks, and the Envoy cluster and `fleet.etcd` block that point a gateway at it.

Two modes:
- secure (the default): as deploy/overlays/fleet runs etcd. scripts/fleet-etcd-setup.sh makes
  the certificates (`certs`: CA, a server certificate valid for 127.0.0.1 and localhost, the
  gateway's client certificate without a common name, the JWT key, the passwords) and, once the
  member answers, sets up authentication (`auth`: root, the role and user `apf-gateway` with
  readwrite on /apf-wasm/ only, auth enable) with etcdctl (Debian's `etcd-client`). etcd serves
  TLS with client-certificate authentication, JWT auth tokens, and /health on a separate
  plain-HTTP metrics port. `envoy_cluster()` has the TLS transport socket, `fleet_etcd()` the
  username and password.
- plain (`secure=False`, bench/run.py): HTTP, no authentication.

`stop()`, `start()`, `restart()` and `kill()` keep the data directory (users, roles and the
fleet's records survive); `wipe()` stops, deletes it and starts again, re-running the setup (a
new etcd has no users: in a cluster, `scripts/fleet-etcd-setup.sh auth` must run again)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from .envoyproc import REPO, wait_until

SETUP = REPO / "scripts" / "fleet-etcd-setup.sh"
FLEET_USER = "apf-gateway"
FLEET_PREFIX = b"/apf-wasm/"
# The name the server certificate carries for loopback (SNI and SAN check in Envoy).
SERVER_NAME = "localhost"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def range_end(prefix: bytes) -> bytes:
    """The end of the key range `prefix` opens (its last byte + 1)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class Etcd:
    """`etcd` with its data, certificates and log under `workdir`, on free loopback ports."""

    def __init__(self, workdir: Path, name: str = "e2e", secure: bool = True) -> None:
        self.name, self.dir, self.secure = name, workdir / "etcd", secure
        self.client_port, self.peer_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.log = open(workdir / "etcd.log", "ab")  # noqa: SIM115
        self.pki = workdir / "etcd-pki"
        self._root_token: str | None = None
        if secure:
            self.setup("certs")

    # -- the setup script, as for the cluster ------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.secure else "http"

    @property
    def url(self) -> str:
        """The client URL."""
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def etcdctl(self) -> list[str]:
        """etcdctl against this member; secure: with the server certificate as client
        certificate, as the setup script's default does inside a member."""
        args = ["etcdctl", f"--endpoints={self.url}"]
        if self.secure:
            args += [f"--cacert={self.pki}/ca.crt", f"--cert={self.pki}/server.crt", f"--key={self.pki}/server.key"]
        return args

    def setup(self, step: str) -> str:
        """scripts/fleet-etcd-setup.sh STEP (certs, auth, check) for this member; its stderr."""
        if step != "certs" and shutil.which("etcdctl") is None:
            raise RuntimeError("etcdctl not installed (scripts/prereqs.sh etcd installs Debian's etcd-client)")
        env = {**os.environ, "ETCDCTL": " ".join(self.etcdctl), "FLEET_USER": FLEET_USER,
               "FLEET_PREFIX": FLEET_PREFIX.decode()}
        p = subprocess.run(["bash", str(SETUP), step, str(self.pki)], env=env, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"fleet-etcd-setup.sh {step} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return p.stderr

    def secret(self, name: str) -> str:
        """A file the setup made (e.g. `fleet.password`, `root.password`), stripped."""
        return (self.pki / name).read_text().strip()

    @property
    def password(self) -> str:
        """The fleet user's password (secure mode)."""
        return self.secret("fleet.password")

    # -- the process --------------------------------------------------------------------------

    def args(self) -> list[str]:
        c, p = self.url, f"{self.scheme}://127.0.0.1:{self.peer_port}"
        a = ["etcd", "--name", self.name, "--data-dir", str(self.dir), "--listen-client-urls", c,
             "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
             "--initial-cluster", f"{self.name}={p}",
             "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}"]
        if self.secure:
            k = self.pki
            a += ["--cert-file", f"{k}/server.crt", "--key-file", f"{k}/server.key", "--trusted-ca-file", f"{k}/ca.crt",
                  "--client-cert-auth", "--peer-cert-file", f"{k}/peer.crt", "--peer-key-file", f"{k}/peer.key",
                  "--peer-trusted-ca-file", f"{k}/ca.crt", "--peer-client-cert-auth",
                  "--auth-token", f"jwt,pub-key={k}/jwt.pub,priv-key={k}/jwt.key,sign-method=RS256,ttl=10m"]
        return a

    def start(self) -> "Etcd":
        """Start the member and wait for /health; a new data directory (first start, wipe) gets
        the setup's users and roles, and auth on."""
        fresh = not self.dir.exists()
        self.proc = subprocess.Popen(self.args(), stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self.healthy, timeout=20, what="etcd's /health")
        self._root_token = None
        if self.secure and fresh:
            self.setup("auth")
        wait_until(lambda: self.call("/v3/kv/range", {"key": b64(b"x")}) is not None, timeout=20,
                   what="etcd answering")
        return self

    def healthy(self) -> bool:
        """etcd's /health on the metrics port (the overlay's probes) says true."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """SIGTERM and wait; the data stays."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL (a crash); the data stays."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> "Etcd":
        self.stop()
        return self.start()

    def wipe(self) -> "Etcd":
        """Stop, delete the data directory (records, leases, users, roles), start again and set
        authentication up again with the same certificates and passwords."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.start()

    # -- the JSON API ---------------------------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.secure:
            return None
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "client.crt"), str(self.pki / "client.key"))
        return ctx

    def post(self, path: str, body: dict, token: str | None = None) -> tuple[int, dict] | None:
        """POST a JSON body to the JSON gateway (secure: with the gateway's client certificate,
        `token` in the Authorization header); (status, JSON body), None when nothing answers."""
        headers = {"Authorization": token} if token else {}
        req = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(), method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=2, context=self.tls_context()) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read())
            except ValueError:
                return e.code, {}
        except (OSError, ValueError):
            return None

    def authenticate(self, name: str, password: str) -> str | None:
        """A token for `name` (None: refused or no answer)."""
        r = self.post("/v3/auth/authenticate", {"name": name, "password": password})
        return r[1].get("token") if r and r[0] == 200 else None

    def call(self, path: str, body: dict) -> dict | None:
        """POST as root (secure mode; plain: anonymous); the JSON answer, None when etcd does not
        answer or refuses."""
        if not self.secure:
            r = self.post(path, body)
            return r[1] if r and r[0] == 200 else None
        for _ in range(2):
            if self._root_token is None:
                self._root_token = self.authenticate("root", self.secret("root.password"))
                if self._root_token is None:
                    return None
            r = self.post(path, body, self._root_token)
            if r and r[0] == 200:
                return r[1]
            if r is None or r[0] not in (400, 401):
                return None
            self._root_token = None  # expired or from before a wipe: once more
        return None

    def replicas(self, prefix: bytes = FLEET_PREFIX) -> list[dict]:
        """The fleet's replica records (decoded JSON) under `prefix`."""
        r = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(range_end(prefix))}) or {}
        return [json.loads(base64.b64decode(kv["value"])) for kv in r.get("kvs", [])]

    # -- what a gateway needs -------------------------------------------------------------------

    def envoy_cluster(self, name: str = "etcd") -> dict:
        """A static Envoy cluster for this etcd (the plugin's `fleet.etcd.cluster`); secure: TLS
        with the gateway's client certificate, etcd's certificate checked against the CA and the
        name `localhost` (as the overlay's cluster apf_etcd, there with the Service's name)."""
        c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                 {"endpoint": {"address": {"socket_address": {
                     "address": "127.0.0.1", "port_value": self.client_port}}}}]}]}}
        if self.secure:
            k = self.pki
            c["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": SERVER_NAME,
                "common_tls_context": {
                    "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
                    "tls_certificates": [{"certificate_chain": {"filename": f"{k}/client.crt"},
                                          "private_key": {"filename": f"{k}/client.key"}}],
                    "validation_context": {
                        "trusted_ca": {"filename": f"{k}/ca.crt"},
                        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": SERVER_NAME}}]}}}}
        return c

    def fleet_etcd(self, cluster: str = "etcd") -> dict:
        """The plugin's `fleet.etcd` for `envoy_cluster(cluster)`: secure, with the fleet user's
        name and password."""
        e: dict = {"cluster": cluster}
        if self.secure:
            e |= {"authority": SERVER_NAME, "username": FLEET_USER, "password": self.password}
        return e
