"""An asyncio informer (client-go's reflector, reduced to what loads an apiserver): it syncs a
resource, then watches it, and resyncs whenever its watch ends. Many thousands run in one
process: each holds one HTTP/1.1 connection and reads a few lines a second at most.

Two ways to sync (`staging/src/k8s.io/client-go/tools/cache/reflector.go`):
  watchlist   a WATCH with sendInitialEvents=true&allowWatchBookmarks=true&
              resourceVersionMatch=NotOlderThan (`watchList`); synced when the BOOKMARK annotated
              `k8s.io/initial-events-end` arrives; the same stream goes on as the watch.
  list        a LIST with resourceVersion=0 (served from the watch cache), then a WATCH from the
              list's resourceVersion (`list` then `watch`); synced when that watch is answered 200.
A watch that ends (the connection dropped, the server restarted) is followed by the reflector's
back-off (`NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0)`: 0.8 s doubling to 30 s,
jittered by up to 100 %) and a full resync: after a restart the new apiserver's watch cache does
not hold the old resourceVersion (a watch from it gets 410 Gone). A 429 is retried after its
Retry-After by client-go's REST client (`request.go: checkWait`, up to 10 times) before the
reflector backs off.
"""

from __future__ import annotations

import asyncio
import random
import re
import time

WATCHLIST_QUERY = "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
BACKOFF_INITIAL_S, BACKOFF_MAX_S = 0.8, 30.0
LIST_TIMEOUT_S, HEADERS_TIMEOUT_S = 60.0, 60.0
MAX_429_RETRIES = 10
RV_RE = re.compile(rb'"resourceVersion":"(\d+)"')


class StreamEnded(Exception):
    """The response (or its connection) ended."""


class Response:
    """One HTTP/1.1 request on its own connection; the body is read as chunked JSON lines."""

    def __init__(self, port: int, ident: str) -> None:
        self.port, self.ident = port, ident
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.status, self.headers = 0, ""
        self.buf = b""

    async def open(self, path: str) -> int:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: apiserver\r\n{self.ident}\r\n".encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        self.status, self.headers = int(head.split(" ", 2)[1]), head
        return self.status

    def header(self, name: str) -> str | None:
        for ln in self.headers.split("\r\n"):
            if ln.startswith(name + ":"):
                return ln.split(":", 1)[1].strip()
        return None

    async def body(self) -> bytes:
        """The whole body (Content-Length or chunked)."""
        if "transfer-encoding: chunked" not in self.headers:
            n = int(self.header("content-length") or 0)
            return await self.reader.readexactly(n) if n else b""
        out = []
        while (line := await self.line()) is not None:
            out.append(line)
        return b"\n".join(out)

    async def line(self) -> bytes | None:
        """The next line of a chunked body; None at its end. Raises StreamEnded on a reset."""
        try:
            while b"\n" not in self.buf:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    return None
                self.buf += data[:-2]
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise StreamEnded() from e
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None


class Informer:
    """One reflector. `synced_at`: the times (s since `t0`) it became synced; `events`: every
    request it made as (kind, start s since t0, status) — kind "list", "watchlist", "watch";
    status 0 for a connection failure."""

    def __init__(self, port: int, group: str, user: str, groups: tuple[str, ...], path: str,
                 selector: str, mode: str, rng: random.Random, t0: float) -> None:
        self.port, self.group, self.user, self.path, self.mode = port, group, user, path, mode
        self.selector = f"&fieldSelector={selector}" if selector else ""
        self.ident = f"X-Remote-User: {user}\r\n" + "".join(f"X-Remote-Group: {g}\r\n" for g in groups)
        self.rng, self.t0 = rng, t0
        self.synced = False
        self.synced_at: list[float] = []
        self.unsynced_at: list[float] = []
        self.events: list[tuple[str, float, int]] = []
        self.failures = 0
        self.resp: Response | None = None
        self.stopped = False
        # (start s since t0, seconds): each Retry-After slept by the REST client, each back-off
        # slept by the reflector.
        self.retry_afters: list[tuple[float, int]] = []
        self.backoffs: list[tuple[float, float]] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def request(self, kind: str, query: str) -> Response | None:
        """Opens `path?query`, retrying 429s after their Retry-After; None on failure."""
        for _ in range(MAX_429_RETRIES + 1):
            r = Response(self.port, self.ident)
            t = self.now()
            try:
                status = await asyncio.wait_for(r.open(f"{self.path}?{query}{self.selector}"), HEADERS_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError,
                    asyncio.LimitOverrunError, IndexError):
                status = 0
            self.events.append((kind, t, status))
            if status == 200:
                return r
            retry_after = r.header("retry-after") if status == 429 else None
            r.close()
            if retry_after is None or not retry_after.isdigit():
                return None
            self.retry_afters.append((self.now(), int(retry_after)))
            await asyncio.sleep(int(retry_after))
        return None

    async def backoff(self) -> None:
        d = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** min(self.failures, 6))
        self.failures += 1
        d *= 1 + self.rng.random()
        self.backoffs.append((self.now(), d))
        await asyncio.sleep(d)

    async def run(self, start_rv: int | None) -> None:
        """Runs until cancelled or closed: a watch from `start_rv` first (an informer that is synced
        already), then resyncs whenever the watch ends."""
        rv = start_rv
        while not self.stopped:
            if rv is not None:
                self.resp = await self.request("watch", f"watch=1&allowWatchBookmarks=true&resourceVersion={rv}")
                if self.resp is not None:
                    if start_rv is not None and not self.synced_at:
                        self.mark_synced()
                    start_rv = None
                    await self.follow(initial=False)
            elif self.mode == "watchlist":
                self.resp = await self.request("watchlist", WATCHLIST_QUERY)
                if self.resp is not None:
                    await self.follow(initial=True)
            else:
                await self.list_then_watch()
            rv = None
            if self.synced:
                self.unsynced_at.append(self.now())
            self.synced = False
            if self.resp is not None:
                self.resp.close()
                self.resp = None
            await self.backoff()

    async def list_then_watch(self) -> None:
        r = await self.request("list", "resourceVersion=0")
        if r is None:
            return
        try:
            body = await asyncio.wait_for(r.body(), LIST_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, StreamEnded):
            return
        finally:
            r.close()
        m = RV_RE.search(body)
        if m is None:
            return
        self.resp = await self.request("watch", f"watch=1&allowWatchBookmarks=true&resourceVersion={m.group(1).decode()}")
        if self.resp is not None:
            await self.follow(initial=False, synced_now=True)

    def mark_synced(self) -> None:
        self.synced = True
        self.failures = 0
        self.synced_at.append(self.now())

    async def follow(self, initial: bool, synced_now: bool = False) -> None:
        """Reads the watch until it ends: the initial events up to the end bookmark, then
        events and bookmarks. A 410 Gone ERROR ends it (the caller resyncs)."""
        if synced_now:
            self.mark_synced()
        try:
            while (line := await self.resp.line()) is not None:
                if b'"code":410' in line:
                    return
                if initial and not self.synced and b"k8s.io/initial-events-end" in line:
                    self.mark_synced()
        except StreamEnded:
            return

    def close(self) -> None:
        """Stops the informer: its watch is closed and its loop ends (even where a cancellation
        was lost)."""
        self.stopped = True
        if self.resp is not None:
            self.resp.close()


def summary(informers: list[Informer], since: float) -> dict:
    """Per group: how many informers synced again after `since`, and when (s after `since`)."""
    out: dict = {}
    for inf in informers:
        g = out.setdefault(inf.group, {"informers": 0, "resynced": 0, "times": []})
        g["informers"] += 1
        after = [t for t in inf.synced_at if t >= since]
        if after:
            g["resynced"] += 1
            g["times"].append(after[0] - since)
    for g in out.values():
        ts = sorted(g.pop("times"))
        g["p50_s"] = ts[len(ts) // 2] if ts else float("nan")
        g["max_s"] = ts[-1] if ts else float("nan")
    return out
