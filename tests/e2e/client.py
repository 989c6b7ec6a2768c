"""HTTP clients for the e2e tests: one request, N requests over M connections, closed loops.

Stdlib only (http.client + threading). Every request has a bounded timeout; nothing hangs.
Identity travels as front-proxy headers: `X-Remote-User` and one `X-Remote-Group` header per
group (repeated headers, as kube-apiserver's request-header authenticator reads them).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass, field


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
                timeout: float = 15.0) -> list[Result]:
    """Each user keeps `n` connections busy: send, wait for the answer, send again, until
    `duration` seconds have passed (requests in flight at the deadline complete)."""
    groups_of = groups_of or {}
    results: list[Result] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration

    def worker(i: int, user: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            while time.monotonic() < stop_at:
                r = send(conn, Req(path=path, user=user, groups=groups_of.get(user, ())))
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


def status_counts(results: list[Result]) -> dict:
    out: dict = {}
    for r in results:
        key = r.status if r.status is not None else "error"
        out[key] = out.get(key, 0) + 1
    return out
