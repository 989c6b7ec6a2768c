"""HTTP clients for the e2e tests and the benchmarks: one request, N requests over M connections,
closed loops.

Stdlib only (http.client + threading). Every request has a bounded timeout; nothing hangs.
Identity travels as front-proxy headers: `X-Remote-User` and one `X-Remote-Group` header per
group (repeated headers, as kube-apiserver's request-header authenticator reads them).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Req:
    path: str = "/api/v1/namespaces/default/pods"
    user: str | None = None
    groups: tuple[str, ...] | list[str] = ()
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None


@dataclass
class Result:
    req: Req
    status: int | None = None  # None = transport error / timeout
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    body: bytes = b""
    elapsed: float = 0.0
    started: float = 0.0  # time.monotonic() at send
    error: str | None = None
    conn: int = -1

    @property
    def user(self) -> str | None:
        return self.req.user

    def h(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def __repr__(self) -> str:  # short, for assertion messages
        return (f"Result({self.req.method} {self.req.path} user={self.req.user} -> {self.status}"
                f" in {self.elapsed:.3f}s{' err=' + self.error if self.error else ''})")


def send(conn: http.client.HTTPConnection, req: Req) -> Result:
    """Send one request on an (auto-opening) connection; never raises."""
    res = Result(req=req, started=time.monotonic())
    try:
        conn.putrequest(req.method, req.path, skip_accept_encoding=True)
        if req.user is not None:
            conn.putheader("X-Remote-User", req.user)
        for g in req.groups:
            conn.putheader("X-Remote-Group", g)
        for k, v in req.headers.items():
            conn.putheader(k, v)
        body = req.body
        if body is not None or req.method in ("POST", "PUT", "PATCH"):
            body = body or b""
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if body else None)
        r = conn.getresponse()
        res.body = r.read()
        res.status = r.status
        res.headers = {k.lower(): v for k, v in r.getheaders()}
    except Exception as e:  # noqa: BLE001 - recorded, asserted on by the tests
        res.error = f"{type(e).__name__}: {e}"
        conn.close()
    res.elapsed = time.monotonic() - res.started
    return res


def request(port: int, req: Req | None = None, timeout: float = 15.0, **kw) -> Result:
    """One request on a fresh connection."""
    req = req or Req(**kw)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        return send(conn, req)
    finally:
        conn.close()


def run_connections(port: int, plans: list[list[Req]], timeout: float = 15.0,
                    join_timeout: float | None = None) -> list[Result]:
    """Each plan is sent sequentially (keep-alive) on its own connection; all plans concurrently.

    Returns results in completion order. Threads are joined with a bounded timeout.
    """
    results: list[Result] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(len(plans)) if plans else None

    def worker(i: int, plan: list[Req]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.connect()
        except Exception:  # noqa: BLE001 - send() reports the error on first use
            pass
        try:
            if start_gate is not None:
                start_gate.wait(timeout=10)
        except threading.BrokenBarrierError:
            pass
        try:
            for req in plan:
                r = send(conn, req)
                r.conn = i
                with lock:
                    results.append(r)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i, p), daemon=True) for i, p in enumerate(plans)]
    for t in threads:
        t.start()
    budget = join_timeout if join_timeout is not None else timeout * (max((len(p) for p in plans), default=0) + 1) + 10
    deadline = time.monotonic() + budget
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = sum(t.is_alive() for t in threads)
    if alive:
        raise TimeoutError(f"{alive} client connections still running after {budget:.0f}s")
    return results


def concurrent(port: int, n_requests: int, connections: int, users: list[str],
               path: str = "/api/v1/namespaces/default/pods", groups: tuple[str, ...] = (),
               method: str = "GET", timeout: float = 15.0) -> list[Result]:
    """`n_requests` spread round-robin over `connections` connections; connection i belongs to
    user `users[i % len(users)]`."""
    plans: list[list[Req]] = [[] for _ in range(connections)]
    for k in range(n_requests):
        ci = k % connections
        plans[ci].append(Req(path=path, user=users[ci % len(users)], groups=groups, method=method))
    return run_connections(port, [p for p in plans if p], timeout=timeout)


def closed_loop(port: int, conns_per_user: dict[str, int], duration: float,
                path: str = "/api/v1/namespaces/default/pods",
                groups_of: dict[str, tuple[str, ...]] | None = None,
                timeout: float = 15.0,
                headers_for: Callable[[str, int], dict[str, str]] | None = None) -> list[Result]:
    """Each user keeps `n` connections busy: send, wait for the answer, send again, until
    `duration` seconds have passed (requests in flight at the deadline complete).

    `headers_for(user, conn)`, if given, is called before every request (on that connection's
    own thread) and returns extra headers for it, e.g. a per-request `x-sleep-ms`. Connections
    are numbered 0, 1, … in the order of `conns_per_user`."""
    groups_of = groups_of or {}
    results: list[Result] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration

    def worker(i: int, user: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            while time.monotonic() < stop_at:
                extra = headers_for(user, i) if headers_for is not None else {}
                r = send(conn, Req(path=path, user=user, groups=groups_of.get(user, ()), headers=extra))
                r.conn = i
                with lock:
                    results.append(r)
                if r.status is None:
                    time.sleep(0.05)  # transport error: do not spin
        finally:
            conn.close()

    threads = []
    i = 0
    for user, n in conns_per_user.items():
        for _ in range(n):
            threads.append(threading.Thread(target=worker, args=(i, user), daemon=True))
            i += 1
    for t in threads:
        t.start()
    deadline = stop_at + timeout + 10
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise TimeoutError("closed-loop clients did not finish")
    return results


def open_and_abandon(port: int, req: Req) -> socket.socket:
    """Send a request's headers on a raw socket and return the socket without reading.
    Closing it later simulates a client that gives up while queued."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    lines = [f"{req.method} {req.path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if req.user is not None:
        lines.append(f"X-Remote-User: {req.user}")
    lines += [f"X-Remote-Group: {g}" for g in req.groups]
    lines += [f"{k}: {v}" for k, v in req.headers.items()]
    if req.method in ("POST", "PUT", "PATCH"):
        lines.append("Content-Length: 0")
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return s


class WatchStream:
    """A long-lived GET (a watch) on its own raw HTTP/1.1 connection, read as it streams.

    `read_headers()` waits for the response head (`status`, `headers` with lower-cased names,
    `headers_at`); `next_event()` returns the next newline-terminated JSON object of the
    (chunked or length-delimited) body, None once the body or connection ended (`eof`); every
    event is kept with its arrival time in `events`. Every wait is bounded: a wait that runs out
    raises TimeoutError. Not thread-safe: one reader per stream.
    """

    def __init__(self, port: int, path: str, *, user: str | None = None, groups=(),
                 headers: dict[str, str] | None = None, connect_timeout: float = 5.0) -> None:
        self.path = path
        self.user = user
        self.started = time.monotonic()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.headers_at: float | None = None
        self.events: list[tuple[float, dict]] = []
        self.eof = False
        self._buf = b""       # raw bytes not yet decoded
        self._body = b""      # decoded body bytes not yet split into lines
        self._chunked = False
        self._left: int | None = None  # Content-Length bytes still to come (not chunked)
        self._chunk_left = 0  # bytes of the current chunk still to come (chunked)
        self._chunk_crlf = False  # the CRLF after a chunk's data is due
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=connect_timeout)
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Accept: application/json"]
        if user is not None:
            lines.append(f"X-Remote-User: {user}")
        lines += [f"X-Remote-Group: {g}" for g in groups]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def _recv(self, deadline: float) -> bool:
        """Read more bytes into the buffer; False at EOF."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"watch {self.path} (user {self.user}): nothing within the time limit")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError(f"watch {self.path} (user {self.user}): nothing within the time limit") from None
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return False
        self._buf += data
        return True

    def read_headers(self, timeout: float = 30.0) -> int:
        """Wait for the status line and headers; returns the status."""
        if self.status is not None:
            return self.status
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self._buf:
            if not self._recv(deadline):
                raise ConnectionError(f"watch {self.path}: connection closed before the response head")
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        self.headers_at = time.monotonic()
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        for ln in header_lines:
            k, _, v = ln.partition(":")
            k, v = k.strip().lower(), v.strip()
            self.headers[k] = f"{self.headers[k]},{v}" if k in self.headers else v
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.headers:
            self._left = int(self.headers["content-length"])
        return self.status

    def h(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def _decode(self) -> None:
        """Move the decoded body bytes available in the buffer to _body."""
        if not self._chunked:
            take = self._buf if self._left is None else self._buf[:self._left]
            self._body += take
            self._buf = self._buf[len(take):]
            if self._left is not None:
                self._left -= len(take)
                if self._left == 0:
                    self.eof = True
            return
        while self._buf:
            if self._chunk_crlf:
                if len(self._buf) < 2:
                    return
                self._buf, self._chunk_crlf = self._buf[2:], False
            elif self._chunk_left > 0:
                take = self._buf[:self._chunk_left]
                self._body += take
                self._buf = self._buf[len(take):]
                self._chunk_left -= len(take)
                if self._chunk_left == 0:
                    self._chunk_crlf = True
            else:
                if b"\r\n" not in self._buf:
                    return
                size_line, self._buf = self._buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.eof = True  # last chunk (trailers ignored)
                    self._buf = b""
                    return
                self._chunk_left = size

    def next_event(self, timeout: float = 10.0) -> dict | None:
        """The next event (one JSON object per line), None once the stream ended."""
        if self.status is None:
            self.read_headers(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._decode()
            if b"\n" in self._body:
                line, self._body = self._body.split(b"\n", 1)
                if not line.strip():
                    continue
                ev = json.loads(line)
                self.events.append((time.monotonic(), ev))
                return ev
            if self.eof or not self._recv(deadline):
                self._decode()
                if b"\n" in self._body:
                    continue
                return None

    def read_rest(self, timeout: float = 10.0) -> bytes:
        """The rest of the body as bytes (for a response that is not a stream of events, e.g. a
        429), until its end."""
        if self.status is None:
            self.read_headers(timeout)
        deadline = time.monotonic() + timeout
        while not self.eof:
            self._decode()
            if self.eof or not self._recv(deadline):
                break
        self._decode()
        out, self._body = self._body, b""
        return out

    def until_initial_events_end(self, timeout: float = 30.0) -> float:
        """Read events until the BOOKMARK annotated `k8s.io/initial-events-end`; returns when it
        arrived (time.monotonic()). Raises TimeoutError, or EOFError if the stream ended first."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.001, deadline - time.monotonic()))
            if ev is None:
                raise EOFError(f"watch {self.path} (user {self.user}) ended before its initial-events-end bookmark")
            if is_initial_events_end(ev):
                return self.events[-1][0]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "WatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_initial_events_end(ev: dict) -> bool:
    """The BOOKMARK event that ends a watch's initial events (sendInitialEvents=true)."""
    ann = ((ev.get("object") or {}).get("metadata") or {}).get("annotations") or {}
    return ev.get("type") == "BOOKMARK" and ann.get("k8s.io/initial-events-end") == "true"


def status_counts(results: list[Result]) -> dict:
    out: dict = {}
    for r in results:
        key = r.status if r.status is not None else "error"
        out[key] = out.get(key, 0) + 1
    return out
