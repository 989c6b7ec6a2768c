"""A test upstream that answers like a (tiny) kube-apiserver and records concurrency.

Stdlib only. Used by the e2e tests (in-process, `Upstream()`), by ./run-gateway.sh as the demo
upstream (`python3 tests/e2e/upstream.py --port 0 --port-file F`) and by nobody else.

Recorded: requests in flight now and at most, total count, per-user counts (from the
`X-Remote-User` header as forwarded by Envoy), per-user max in flight, a bounded event log, and
the headers of the last requests (`Upstream.received()`).
Per-request delay: query `?sleep=SECONDS` or header `x-sleep-ms`.
Misbehaviour (chaos tests): query `?chaos=` (after the delay, if any)
  reset  close the connection without answering (TCP RST)
  500    answer 500 with a Status body
  stall  hold the request `sleep` seconds (default 30) or until the peer (Envoy) closes the
         connection, then close without answering (a stalled backend; the client gives up first)

Control endpoints (called directly, not through Envoy):
  GET  /__stats  -> JSON {max_in_flight, in_flight, total, per_user, per_user_max_in_flight, ...}
  POST /__reset  (or GET) -> zero the counters (in_flight is kept: it is live state)
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

POD_LIST = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "1"},
    "items": [
        {
            "metadata": {
                "name": "demo-pod",
                "namespace": "default",
                "uid": "6a1f2b0e-0000-4000-8000-000000000001",
                "resourceVersion": "1",
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]},
            "status": {"phase": "Running"},
        }
    ],
}

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-apf-e2e",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

API_VERSIONS = {
    "kind": "APIVersions",
    "versions": ["v1"],
    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
}

API_GROUP_LIST = {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}

CORE_V1_RESOURCES = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "v1",
    "resources": [
        {
            "name": "pods",
            "singularName": "pod",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": ["po"],
        },
        {
            "name": "namespaces",
            "singularName": "namespace",
            "namespaced": False,
            "kind": "Namespace",
            "verbs": ["get", "list"],
            "shortNames": ["ns"],
        },
    ],
}


class Stats:
    """Thread-safe counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.user_in_flight: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.max_in_flight = self.in_flight
            self.total = 0
            self.per_user: dict[str, int] = {}
            self.per_user_max_in_flight: dict[str, int] = dict(self.user_in_flight)
            self.events: list[tuple[float, float, str, str]] = []  # (start, end, user, path)
            self.chaos: dict[str, int] = {}  # ?chaos= misbehaviours performed, by kind
            self.received: list[tuple[str, list[tuple[str, str]]]] = []  # (path, headers)
            # The flowcontrol objects served like an apiserver (items without kind/apiVersion,
            # as real list responses); set with Upstream.set_flowcontrol. Not reset.
            if not hasattr(self, "flowcontrol"):
                self.flowcontrol: dict[str, list[dict]] = {"flowschemas": [], "prioritylevelconfigurations": []}

    def count_chaos(self, kind: str) -> None:
        with self.lock:
            self.chaos[kind] = self.chaos.get(kind, 0) + 1

    def record_headers(self, path: str, headers: list[tuple[str, str]]) -> None:
        with self.lock:
            if len(self.received) < 10_000:
                self.received.append((path, headers))

    def begin(self, user: str) -> float:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.total += 1
            self.per_user[user] = self.per_user.get(user, 0) + 1
            n = self.user_in_flight.get(user, 0) + 1
            self.user_in_flight[user] = n
            self.per_user_max_in_flight[user] = max(self.per_user_max_in_flight.get(user, 0), n)
        return time.monotonic()

    def end(self, user: str, start: float, path: str) -> None:
        with self.lock:
            self.in_flight -= 1
            self.user_in_flight[user] = self.user_in_flight.get(user, 1) - 1
            if len(self.events) < 100_000:
                self.events.append((start, time.monotonic(), user, path))

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "max_in_flight": self.max_in_flight,
                "in_flight": self.in_flight,
                "total": self.total,
                "per_user": dict(self.per_user),
                "per_user_max_in_flight": dict(self.per_user_max_in_flight),
                "user_in_flight": {u: n for u, n in self.user_in_flight.items() if n},
                "chaos": dict(self.chaos),
            }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "apf-e2e-upstream"

    def log_message(self, fmt: str, *args) -> None:  # quiet
        if getattr(self.server, "verbose", False):
            sys.stderr.write("upstream: " + (fmt % args) + "\n")

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode())

    def _drain_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _handle(self) -> None:
        self._drain_body()
        url = urlsplit(self.path)
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        if url.path == "/__stats":
            return self._json(200, stats.snapshot())
        if url.path == "/__reset":
            stats.reset()
            return self._json(200, {"reset": True})
        if url.path == "/__events":
            with stats.lock:
                ev = list(stats.events)
            return self._json(200, ev)

        stats.record_headers(self.path, list(self.headers.items()))
        user = self.headers.get("X-Remote-User") or ""
        qs = parse_qs(url.query)
        delay = 0.0
        try:
            if "sleep" in qs:
                delay = float(qs["sleep"][0])
            elif self.headers.get("x-sleep-ms"):
                delay = float(self.headers["x-sleep-ms"]) / 1000.0
        except ValueError:
            delay = 0.0
        delay = max(0.0, min(delay, 60.0))
        chaos = qs.get("chaos", [""])[0]
        start = stats.begin(user)
        try:
            if chaos == "stall":
                self._stall(delay or 30.0)
            elif delay:
                time.sleep(delay)
        finally:
            # In flight = received and not yet answered: count the end before the response
            # leaves, or the gateway's next dispatch can race this thread's bookkeeping.
            stats.end(user, start, url.path)
        if chaos in ("reset", "stall"):
            stats.count_chaos(chaos)
            return self._reset()
        if chaos == "500":
            stats.count_chaos(chaos)
            return self._json(500, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "chaos", "code": 500})
        self._answer(url.path)

    def _stall(self, limit: float) -> None:
        """Wait up to `limit` seconds, returning early once the peer closed the connection."""
        deadline = time.monotonic() + limit
        sock = self.connection
        while time.monotonic() < deadline:
            r, _, _ = select.select([sock], [], [], 0.05)
            if r:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        return
                except OSError:
                    return
                time.sleep(0.05)  # pipelined bytes, not a close: keep stalling

    def _reset(self) -> None:
        """Abort the connection with a TCP RST and no response."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass

    def _answer(self, path: str) -> None:
        p = path.rstrip("/") or "/"
        if p in ("/healthz", "/readyz", "/livez") or p.startswith(("/healthz/", "/readyz/", "/livez/")):
            return self._send(200, b"ok", "text/plain; charset=utf-8")
        if p == "/version":
            return self._json(200, VERSION)
        if p == "/api":
            return self._json(200, API_VERSIONS)
        if p == "/apis":
            return self._json(200, API_GROUP_LIST)
        if p == "/api/v1":
            return self._json(200, CORE_V1_RESOURCES)
        fc = "/apis/flowcontrol.apiserver.k8s.io/v1/"
        if p in (fc + "flowschemas", fc + "prioritylevelconfigurations"):
            res = p[len(fc):]
            stats: Stats = self.server.stats  # type: ignore[attr-defined]
            with stats.lock:
                items = json.loads(json.dumps(stats.flowcontrol.get(res, [])))
            kind = "FlowSchemaList" if res == "flowschemas" else "PriorityLevelConfigurationList"
            return self._json(200, {"kind": kind, "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                                    "metadata": {"resourceVersion": "1"}, "items": items})
        if p.startswith("/api/v1/namespaces/") and p.endswith("/pods"):
            ns = p.split("/")[4]
            body = json.loads(json.dumps(POD_LIST))
            for item in body["items"]:
                item["metadata"]["namespace"] = ns
            return self._json(200, body)
        return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                                "path": path, "method": self.command})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # Peers (Envoy) closing connections mid-answer is normal in these tests: stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Upstream:
    """An upstream on 127.0.0.1 with an OS-chosen free port, served from a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, verbose: bool = False) -> None:
        self.stats = Stats()
        self.server = _Server((host, port), _Handler)
        self.server.stats = self.stats  # type: ignore[attr-defined]
        self.server.verbose = verbose  # type: ignore[attr-defined]
        self.host = host
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "Upstream":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # In-process access (tests); the HTTP control endpoints say the same.
    def snapshot(self) -> dict:
        return self.stats.snapshot()

    def reset(self) -> None:
        self.stats.reset()

    def set_flowcontrol(self, flowschemas: list[dict], prioritylevelconfigurations: list[dict]) -> None:
        """Objects served at /apis/flowcontrol.apiserver.k8s.io/v1/{flowschemas,
        prioritylevelconfigurations} (as an apiserver lists them: items without kind)."""
        strip = lambda objs: [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objs]
        with self.stats.lock:
            self.stats.flowcontrol = {"flowschemas": strip(flowschemas),
                                      "prioritylevelconfigurations": strip(prioritylevelconfigurations)}

    def received(self, path_prefix: str = "") -> list[tuple[str, dict[str, list[str]]]]:
        """(path with query, {lower-cased header name: [values]}) of the requests received since
        the last reset whose path starts with `path_prefix` (at most 10 000 kept)."""
        with self.stats.lock:
            got = list(self.stats.received)
        out = []
        for path, headers in got:
            if path.startswith(path_prefix):
                h: dict[str, list[str]] = {}
                for k, v in headers:
                    h.setdefault(k.lower(), []).append(v)
                out.append((path, h))
        return out

    def __enter__(self) -> "Upstream":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    ap.add_argument("--port-file", help="write the bound port to this file once listening")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    up = Upstream(args.host, args.port, args.verbose)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(up.port))
        import os
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"upstream: listening on http://{up.host}:{up.port}", file=sys.stderr, flush=True)
    try:
        up.server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        up.server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
