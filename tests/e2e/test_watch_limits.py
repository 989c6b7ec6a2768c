"""Open-watch limits (`watchLimits`, beyond upstream) with a real Envoy (2 workers): a WATCH
beyond its flow's or its level's limit gets 429 with a Retry-After, counted with
`reason="watch-limit"`; another flow's watches are unaffected; a watch's place is freed at once
however it ends (client close, upstream end, stream reset), well before any lease expiry."""

from __future__ import annotations

import socket
import struct

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, pl_uid, single_level_config
from apfkit.envoyproc import wait_until

pytestmark = pytest.mark.apf

LEVEL, SCHEMA = "e2e-level", "e2e-users"
WATCH = "/api/v1/namespaces/default/pods?watch=true"
EXPLAIN = (E2E_GROUP, "e2e-explain")
REJECTED = (f"apiserver_flowcontrol_rejected_requests_total.priority_level.{LEVEL}"
            f".flow_schema.{SCHEMA}.reason.watch-limit")
OPEN = f"apf_wasm_open_watches.priority_level.{LEVEL}"
# A freed place is usable well within this; a lease expiry (what would free a leaked place)
# takes more than 5 s.
FREED_WITHIN = 2.0


def stat(gw, name: str) -> int | None:
    """The value of the stat whose flat name ends with `name` (None: not defined)."""
    found = [v for k, v in gw.stats(name.split(".")[0]).items() if k.endswith(name)]
    return found[0] if found else None


def open_watch(gw, user: str, path: str = WATCH) -> client.WatchStream:
    w = client.WatchStream(gw.port, path, user=user, groups=EXPLAIN)
    w.read_headers(10)
    return w


def assert_refused(gw, w: client.WatchStream, why: str) -> None:
    assert w.status == 429, gw.fail_msg(f"{why}: {w.status} {w.headers}")
    ra = w.h("retry-after")
    assert ra is not None and 1 <= int(ra) <= 32, w.headers
    assert w.h("x-apf-reject-reason") == "watch-limit", w.headers
    assert w.h("x-kubernetes-pf-prioritylevel-uid") == pl_uid(LEVEL), w.headers
    assert w.read_rest(5) == b"Too many requests, please try again later.\n"


def test_over_limit_watches_get_429_and_other_flows_are_unaffected(gateway):
    gw = gateway(single_level_config(8, watchLimits={"perFlow": 3, "perLevel": {LEVEL: 6}}))
    opened: list[client.WatchStream] = []
    try:
        for user in ["alice"] * 3:
            opened.append(open_watch(gw, user))
            assert opened[-1].status == 200, gw.fail_msg(f"{user}: {opened[-1].status}")
        w = open_watch(gw, "alice")
        assert_refused(gw, w, "alice's fourth watch (perFlow 3)")
        w.close()
        # Another flow: its watches pass while alice's flow is at its limit.
        for _ in range(3):
            opened.append(open_watch(gw, "bob"))
            assert opened[-1].status == 200, gw.fail_msg(f"bob: {opened[-1].status}")
        # The level is at its limit of 6 now: a third flow is refused too.
        w = open_watch(gw, "carol")
        assert_refused(gw, w, "carol's watch (perLevel 6)")
        w.close()
        # A non-watch request of a flow at its limit is not affected.
        assert gw.request(user="alice", groups=EXPLAIN).status == 200
        assert gw.upstream.snapshot()["watches_open"] == 6
        wait_until(lambda: stat(gw, REJECTED) == 2, timeout=5, what="2 watch-limit rejections counted")
        wait_until(lambda: stat(gw, OPEN) == 6, timeout=5, what="6 open watches in the gauge")
        dump = gw.debug_dump("watches")
        assert dump.status == 200, dump
        rows = [[c.strip() for c in ln.split(",")] for ln in dump.body.decode().splitlines()]
        assert [LEVEL, "6", "6"] in rows, dump.body.decode()
        flows = [r for r in rows if len(r) == 5 and r[0] == LEVEL]
        assert [r[3] for r in flows] == ["3", "3"], dump.body.decode()
    finally:
        for w in opened:
            w.close()
    wait_until(lambda: stat(gw, OPEN) == 0, timeout=5, what="every place freed")
    workers = gw.worker_connections()
    assert len(workers) == 2, workers


def reopen(gw, user: str) -> client.WatchStream:
    """A new watch of `user`'s flow, retried until it is let through (bounded by FREED_WITHIN)."""
    got: list[client.WatchStream] = []

    def attempt() -> bool:
        w = open_watch(gw, user)
        if w.status == 200:
            got.append(w)
            return True
        w.close()
        return False

    wait_until(attempt, timeout=FREED_WITHIN, interval=0.05, what=f"{user}'s place freed")
    return got[0]


def reset(w: client.WatchStream) -> None:
    """The client resets the stream (TCP RST)."""
    w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.close()


def end_by_upstream(w: client.WatchStream) -> None:
    while w.next_event(10) is not None:
        pass
    assert w.eof


@pytest.mark.parametrize("how", ["client-close", "upstream-end", "stream-reset"])
def test_a_closed_watch_frees_its_place_at_once(gateway, how):
    gw = gateway(single_level_config(8, watchLimits={"perFlow": 1}))
    path = f"{WATCH}&timeoutSeconds=1" if how == "upstream-end" else WATCH
    first = open_watch(gw, "alice", path)
    assert first.status == 200, gw.fail_msg(f"first watch: {first.status}")
    w = open_watch(gw, "alice")
    assert_refused(gw, w, "a second watch of the flow")
    w.close()
    if how == "client-close":
        first.close()
    elif how == "upstream-end":
        end_by_upstream(first)
    else:
        reset(first)
    nxt = reopen(gw, "alice")
    try:
        refused = open_watch(gw, "alice")
        assert_refused(gw, refused, "the freed place is taken again")
        refused.close()
    finally:
        nxt.close()
        first.close()
    wait_until(lambda: stat(gw, OPEN) == 0, timeout=5, what="every place freed")
