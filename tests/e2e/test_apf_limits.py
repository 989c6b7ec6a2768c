"""(a) Never over the limit: a level with N seats never has more than N requests at the upstream,
across both Envoy workers; excess requests queue (or are rejected with 429), none fails or hangs."""

from __future__ import annotations

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, fs_uid, pl_uid, single_level_config
from apfkit.contract import assert_all_200_or_429, assert_classified

pytestmark = [pytest.mark.apf, pytest.mark.core]

SEATS = 4
LATENCY = 0.2


def test_level_never_exceeds_its_seats(gateway):
    gw = gateway(single_level_config(SEATS, queues=16, hand_size=4, queue_length_limit=50))
    res = gw.concurrent(60, 20, ["alice", "bob", "carol"],
                        path=f"/api/v1/namespaces/default/pods?sleep={LATENCY}",
                        groups=(E2E_GROUP,), timeout=20)
    assert len(res) == 60
    errors = [r for r in res if r.status is None]
    assert not errors, gw.fail_msg(f"transport errors/timeouts: {errors[:5]}")
    assert_all_200_or_429(res)
    for r in res:
        assert_classified(r, fs_uid("e2e-users"), pl_uid("e2e-level"))
    snap = gw.upstream.snapshot()
    assert snap["max_in_flight"] <= SEATS, gw.fail_msg(f"over the limit: {snap}")
    assert snap["max_in_flight"] >= SEATS - 1, gw.fail_msg(f"seats left unused: {snap}")
    served = [r for r in res if r.status == 200]
    assert snap["total"] == len(served), snap
    assert len(served) >= 30, client.status_counts(res)
    queued = [r for r in served if r.elapsed > LATENCY + 0.05]
    assert len(queued) >= 10, f"expected queueing, elapsed={sorted(round(r.elapsed, 2) for r in res)}"
    workers = gw.worker_connections()
    assert all(v > 0 for v in workers.values()) and len(workers) == 2, workers


def test_single_seat_serialises_requests(gateway):
    gw = gateway(single_level_config(1, queues=4, hand_size=2, queue_length_limit=20))
    res = gw.concurrent(8, 8, ["u1", "u2"], path="/api/v1/namespaces/default/pods?sleep=0.1",
                        groups=(E2E_GROUP,), timeout=15)
    assert client.status_counts(res) == {200: 8}, gw.fail_msg(str(client.status_counts(res)))
    assert gw.upstream.snapshot()["max_in_flight"] == 1
