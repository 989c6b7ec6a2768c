"""Chaos: a real Envoy with 2 workers in front of a misbehaving upstream, under
clients that give up at random, while the policy is hot-reloaded through ECDS.

For ~25 s, client threads send a random mix (each request on its own connection with
`Connection: close`, read with a raw socket so that extra bytes after a response are seen):
  ok      a normal request (`?sleep=` 0–0.3 s)                     → 200, or 429
  short   `?timeout=2s` (queue-wait limit 0.5 s)                   → 200, or 429
  err500  the upstream answers 500 (`?chaos=500`)                  → 500, or 429
  reset   the upstream resets the connection (`?chaos=reset`)      → Envoy 502/503, or 429
  stall   the upstream never answers (`?chaos=stall`); the client  → 429, or the client gives up
          gives up after 0.3–2 s (closes the socket)
  abort   the client closes the socket (FIN or RST) 0–1 s after    → (nothing expected)
          sending, while its request is queued or executing
while a reload thread replaces the policy (3, 4 or 5 seats; other queue shapes) every ~2.5 s and
finally restores the original.

Afterwards: every request that did not abort got exactly one well-formed response of an
allowed class; the global state drains (the debug dump shows 0 waiting and 0 executing for
every level, Envoy has no active downstream request, the upstream nothing in flight) within a
bounded wait; and capacity is back to full (SEATS concurrent requests all run at once).
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoyproc import wait_until

pytestmark = [pytest.mark.apf, pytest.mark.core]

SEATS = 4
DURATION = 25.0
CLIENTS = 12
USERS = [f"chaos-{i}" for i in range(16)]
PODS = "/api/v1/namespaces/default/pods"
KINDS = {"ok": 30, "short": 10, "err500": 10, "reset": 10, "stall": 8, "abort": 12}
ALLOWED = {
    "ok": {200, 429},
    "short": {200, 429},
    "err500": {500, 429},
    "reset": {502, 503, 429},
    "stall": {429},
    "abort": set(),
}


def config(seats: int, queues: int = 8, hand_size: int = 2, qll: int = 6) -> dict:
    # requestTimeout 8s → queue-wait limit 2 s (a quarter), so waits stay short.
    return single_level_config(seats, queues=queues, hand_size=hand_size, queue_length_limit=qll,
                               request_timeout="8s")


@dataclass
class Outcome:
    kind: str
    user: str
    status: int | None = None
    responses: int = 0
    aborted: bool = False  # the client closed the connection on purpose
    error: str | None = None
    retry_after: str | None = None
    elapsed: float = 0.0


def _parse(data: bytes) -> tuple[list[tuple[int, dict]], bytes, str | None]:
    """Splits HTTP/1.1 responses off `data`; returns (responses, trailing bytes, error)."""
    out: list[tuple[int, dict]] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            return out, data, "incomplete head"
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            return out, data, f"bad status line {lines[0]!r}"
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(rest) < n:
                return out, data, "short body"
            data = rest[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line, sep, rest = rest.partition(b"\r\n")
                if not sep:
                    return out, data, "incomplete chunk"
                n = int(size_line.split(b";")[0], 16)
                if len(rest) < n + 2:
                    return out, data, "short chunk"
                rest = rest[n + 2:]
                if n == 0:
                    break
            data = rest
        else:
            data = b""  # body until close
        out.append((int(parts[1]), headers))
    return out, b"", None


def one_request(port: int, kind: str, user: str, rng: random.Random) -> Outcome:
    o = Outcome(kind=kind, user=user)
    patience = 12.0
    abort_after = None
    if kind == "ok":
        path = f"{PODS}?sleep={rng.uniform(0.0, 0.3):.3f}"
    elif kind == "short":
        path = f"{PODS}?timeout=2s&sleep=0.1"
    elif kind == "err500":
        path = f"{PODS}?chaos=500&sleep={rng.uniform(0.0, 0.2):.3f}"
    elif kind == "reset":
        path = f"{PODS}?chaos=reset&sleep={rng.uniform(0.0, 0.2):.3f}"
    elif kind == "stall":
        path = f"{PODS}?chaos=stall&sleep=30"
        patience = rng.uniform(0.3, 2.0)
    else:
        path = f"{PODS}?sleep={rng.uniform(0.2, 1.5):.3f}"
        abort_after = rng.uniform(0.0, 1.0)
    req = (f"GET {path} HTTP/1.1\r\nHost: gateway\r\nX-Remote-User: {user}\r\n"
           f"X-Remote-Group: {E2E_GROUP}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as e:
        o.error = f"connect: {e}"
        return o
    try:
        s.sendall(req)
        if abort_after is not None:
            time.sleep(abort_after)
            if rng.random() < 0.5:  # RST instead of FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            o.aborted = True
            return o
        data = b""
        deadline = t0 + patience
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError as e:
                o.error = f"reset by gateway: {e}"
                break
            if not chunk:
                break
            data += chunk
        o.elapsed = time.monotonic() - t0
        if not data and kind == "stall" and time.monotonic() >= deadline:
            o.aborted = True  # gave up: closing the socket is the client's abort
            return o
        responses, trailing, err = _parse(data)
        o.responses = len(responses)
        if responses:
            o.status = responses[0][0]
            o.retry_after = responses[0][1].get("retry-after")
        if err or trailing:
            o.error = (o.error or "") + f" parse: {err} ({len(data)} bytes)"
        if not responses and o.error is None:
            o.error = f"no response ({len(data)} bytes in {o.elapsed:.2f}s)"
        return o
    finally:
        s.close()


def _levels(gw) -> dict[str, tuple[int, int]]:
    """{level: (waiting, executing)} from dump_priority_levels."""
    r = gw.debug_dump("priority_levels")
    assert r.status == 200, gw.fail_msg(f"dump: {r!r}")
    lines = r.body.decode().strip().splitlines()
    cols = [c.strip() for c in lines[0].split(",")]
    iw, ix = cols.index("WaitingRequests"), cols.index("ExecutingRequests")
    out = {}
    for ln in lines[1:]:
        f = [c.strip() for c in ln.split(",")]
        out[f[0]] = (int(f[iw]), int(f[ix]))
    return out


def test_chaos_clients_upstream_and_reloads_leave_nothing_behind(gateway):
    gw = gateway(config(SEATS), ecds=True)
    stop_at = time.monotonic() + DURATION
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    reload_errors: list[str] = []
    reloads = [0]

    def client(i: int) -> None:
        rng = random.Random(1000 + i)
        kinds, weights = list(KINDS), list(KINDS.values())
        while time.monotonic() < stop_at:
            kind = rng.choices(kinds, weights)[0]
            o = one_request(gw.port, kind, rng.choice(USERS), rng)
            with lock:
                outcomes.append(o)

    def reloader() -> None:
        rng = random.Random(7)
        shapes = [config(3), config(5, queues=4, hand_size=1, qll=4), config(4, queues=16, qll=10)]
        prev = -1
        while time.monotonic() < stop_at - 3:
            time.sleep(2.5)
            # An identical resource is not a reload for Envoy: always pick another shape.
            prev = rng.choice([i for i in range(len(shapes)) if i != prev])
            try:
                gw.reload(shapes[prev], timeout=10)
                reloads[0] += 1
            except Exception as e:  # noqa: BLE001 - asserted below
                reload_errors.append(f"{type(e).__name__}: {e}")
        try:
            gw.reload(config(SEATS), timeout=10)
            reloads[0] += 1
        except Exception as e:  # noqa: BLE001
            reload_errors.append(f"final: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=reloader, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, stop_at + 40 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "chaos clients did not finish"
    assert not reload_errors, reload_errors
    assert reloads[0] >= 3, f"only {reloads[0]} reloads happened"

    # 1. Every request that did not abort got exactly one response of an allowed class.
    summary = Counter((o.kind, "aborted" if o.aborted else o.status) for o in outcomes)
    print("\nchaos outcomes:", dict(sorted(summary.items(), key=str)), f"reloads={reloads[0]}")
    print("upstream:", gw.upstream.snapshot()["chaos"])
    bad = [o for o in outcomes if not o.aborted and (
        o.error or o.responses != 1 or o.status not in ALLOWED[o.kind]
        or (o.status == 429 and not o.retry_after))]
    assert not bad, gw.fail_msg(f"{len(bad)} bad outcomes of {len(outcomes)}: {bad[:10]}")
    # The run exercised every path.
    for kind, status in [("ok", 200), ("err500", 500), ("stall", "aborted"), ("abort", "aborted")]:
        assert summary[(kind, status)] > 0, (kind, status, summary)
    assert sum(n for (k, s), n in summary.items() if k == "reset" and s in (502, 503)) > 0, summary
    assert sum(n for (_, s), n in summary.items() if s == 429) > 0, summary

    # 2. Nothing is left behind: the global state drains, Envoy and the upstream go idle.
    active = "http.apf_gateway.downstream_rq_active"
    last: dict = {}

    def drained() -> bool:
        last["levels"] = _levels(gw)
        last["active"] = gw.stats(active).get(active)
        last["upstream"] = gw.upstream.snapshot()["in_flight"]
        # The dump request itself is active while it is answered.
        return (all(v == (0, 0) for v in last["levels"].values()) and last["active"] in (0, 1)
                and last["upstream"] == 0)

    try:
        wait_until(drained, timeout=20, interval=0.25, what="0 waiting / 0 executing everywhere")
    except Exception:  # noqa: BLE001
        pytest.fail(gw.fail_msg(f"not drained: {last}\n{gw.debug_dump('requests').body.decode()[:3000]}"))

    # 3. Capacity is back to full: SEATS concurrent requests all run at once.
    gw.upstream.reset()
    t0 = time.monotonic()
    res = gw.concurrent(SEATS, SEATS, [f"after-{i}" for i in range(SEATS)], path=f"{PODS}?sleep=1",
                        groups=(E2E_GROUP,), timeout=15)
    took = time.monotonic() - t0
    assert [r.status for r in res] == [200] * SEATS, res
    snap = gw.upstream.snapshot()
    assert snap["max_in_flight"] == SEATS, gw.fail_msg(f"capacity not restored: {snap}")
    assert took < 1.9, f"{SEATS} requests of 1 s took {took:.2f}s"
