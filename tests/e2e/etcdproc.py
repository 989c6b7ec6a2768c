"""A throwaway single-member etcd on loopback (Debian's `etcd-server`), for the fleet tests and
benchmarks, and the Envoy cluster that points a gateway at it."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import urllib.request
from pathlib import Path

from envoyproc import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


class Etcd:
    """`etcd` with its data and log under `workdir`, on two free loopback ports."""

    def __init__(self, workdir: Path, name: str = "e2e") -> None:
        self.name, self.dir = name, workdir / "etcd"
        self.client_port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None
        self.log = open(workdir / "etcd.log", "ab")  # noqa: SIM115

    def start(self) -> "Etcd":
        c, p = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            ["etcd", "--name", self.name, "--data-dir", str(self.dir), "--listen-client-urls", c,
             "--advertise-client-urls", c, "--listen-peer-urls", p,
             "--initial-advertise-peer-urls", p, "--initial-cluster", f"{self.name}={p}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: self.call("/v3/kv/range", {"key": b64(b"x")}) is not None, timeout=20,
                   what="etcd answering")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def call(self, path: str, body: dict) -> dict | None:
        """POST a JSON body to etcd's JSON gateway; None when it does not answer."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.client_port}{path}",
                                     data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def replicas(self, prefix: bytes = b"/apf-wasm/") -> list[dict]:
        """The fleet's replica records (decoded JSON) under `prefix`."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        r = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)}) or {}
        return [json.loads(base64.b64decode(kv["value"])) for kv in r.get("kvs", [])]

    def envoy_cluster(self, name: str = "etcd") -> dict:
        """A static Envoy cluster for this etcd (the plugin's `fleet.etcd.cluster`)."""
        return {"name": name, "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {
                        "address": "127.0.0.1", "port_value": self.client_port}}}}]}]}}
