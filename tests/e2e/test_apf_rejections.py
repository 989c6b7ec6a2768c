"""(d) Rejections: queue full, queue-wait timeout derived from `?timeout=`, and clients that give
up while queued (no seat may leak). Also the debug dumps."""

from __future__ import annotations

import threading
import time

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, fs_uid, pl_uid, single_level_config
from apfkit.contract import assert_classified, assert_rejection
from apfkit.envoyproc import wait_until

pytestmark = [pytest.mark.apf, pytest.mark.core]

EXPLAIN = (E2E_GROUP, "e2e-explain")
PODS = "/api/v1/namespaces/default/pods"


def _occupy(gw, n: int, seconds: float, user: str = "occupant") -> tuple[threading.Thread, list]:
    """Start n requests that hold a seat for `seconds` each; return once all are at the upstream."""
    out: list = []

    def run():
        out.extend(gw.concurrent(n, n, [user], path=f"{PODS}?sleep={seconds}", groups=(E2E_GROUP,),
                                 timeout=seconds + 20))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: gw.upstream.snapshot()["user_in_flight"].get(user, 0) == n, timeout=5,
               what=f"{n} occupant(s) at the upstream")
    return t, out


def test_queue_full_rejects_with_429(gateway):
    gw = gateway(single_level_config(1, queues=1, hand_size=1, queue_length_limit=1))
    t, occ = _occupy(gw, 1, 1.5)
    res = gw.concurrent(4, 4, ["u1", "u2", "u3", "u4"], path=PODS, groups=EXPLAIN, timeout=10)
    t.join(timeout=20)
    assert [r.status for r in occ] == [200]
    counts = client.status_counts(res)
    assert counts.get(429, 0) >= 2 and set(counts) <= {200, 429}, gw.fail_msg(str(counts))
    for r in res:
        if r.status == 429:
            assert_rejection(r, fs_uid("e2e-users"), pl_uid("e2e-level"), reason="queue-full")
            assert r.elapsed < 1.0, r
            assert r.h("x-apf-flowschema") == "e2e-users"
            assert r.h("x-apf-prioritylevel") == "e2e-level"
        else:
            assert_classified(r, fs_uid("e2e-users"), pl_uid("e2e-level"))
            assert r.h("x-apf-queued-ms") is not None and int(r.h("x-apf-queued-ms")) >= 200, r.headers
    # Rejected requests never reached the upstream.
    assert gw.upstream.snapshot()["total"] == 1 + counts.get(200, 0)


def test_timeout_parameter_bounds_queue_wait(gateway):
    gw = gateway(single_level_config(1, queues=1, hand_size=1, queue_length_limit=10))
    t, occ = _occupy(gw, 1, 2.5)
    # ?timeout=2s → request deadline 2 s → queue-wait limit 2s/4 = 0.5 s (kubernetes-apf.md §1.6).
    r = gw.request(f"{PODS}?timeout=2s", user="waiter", groups=EXPLAIN, timeout=10)
    t.join(timeout=20)
    assert_rejection(r, fs_uid("e2e-users"), pl_uid("e2e-level"), reason="time-out")
    assert 0.3 <= r.elapsed <= 1.5, f"waited {r.elapsed:.3f}s, want ≈0.5s"
    assert [o.status for o in occ] == [200]
    assert "waiter" not in gw.upstream.snapshot()["per_user"]


def test_client_abort_while_queued_leaves_no_seat_behind(gateway):
    seats = 2
    gw = gateway(single_level_config(seats, queues=4, hand_size=2, queue_length_limit=10))
    t, occ = _occupy(gw, seats, 1.2)
    active = "http.apf_gateway.downstream_rq_active"
    socks = [client.open_and_abandon(gw.port, client.Req(path=PODS, user=f"aborter{i}",
                                                         groups=(E2E_GROUP,)))
             for i in range(3)]
    try:
        wait_until(lambda: gw.stats(active).get(active) == seats + 3, timeout=5,
                   what="3 queued requests at Envoy")
        assert gw.upstream.snapshot()["in_flight"] == seats  # they are queued, not forwarded
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: gw.stats(active).get(active) == seats, timeout=5,
               what="aborted streams destroyed")
    t.join(timeout=20)
    assert [o.status for o in occ] == [200] * seats
    snap = gw.upstream.snapshot()
    assert not [u for u in snap["per_user"] if u.startswith("aborter")], snap
    # Capacity is back: `seats` new requests all run at once.
    gw.upstream.reset()
    t0 = time.monotonic()
    res = gw.concurrent(seats, seats, ["after1", "after2"], path=f"{PODS}?sleep=0.5",
                        groups=(E2E_GROUP,), timeout=10)
    assert client.status_counts(res) == {200: seats}, res
    assert gw.upstream.snapshot()["max_in_flight"] == seats
    assert time.monotonic() - t0 < 0.95, [r.elapsed for r in res]


def test_debug_dumps_answered_by_filter_for_masters(gateway):
    gw = gateway(single_level_config(2))
    for what in ("priority_levels", "queues", "requests"):
        r = gw.debug_dump(what)
        assert r.status == 200, gw.fail_msg(f"dump_{what}: {r!r} {r.body[:200]!r}")
        if what != "requests":
            assert b"e2e-level" in r.body, r.body[:500]
    assert gw.upstream.snapshot()["total"] == 0, "debug dumps must not reach the upstream"
