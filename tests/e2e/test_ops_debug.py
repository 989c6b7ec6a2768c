"""Operations — debug dumps while a level is saturated: a system:masters caller gets the
filter's dump_requests with the queued requests; anyone else's request to the same path is not
answered by the filter but reaches the upstream like any other request."""

from __future__ import annotations

import threading

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoyproc import wait_until
from apfkit.observe import level_rows, parse_dump

pytestmark = pytest.mark.apf

PODS = "/api/v1/namespaces/default/pods"
DUMP = "/debug/api_priority_and_fairness/dump_requests"
LEVEL = "e2e-level"


def test_ops_dump_requests_shows_queue_only_to_masters(gateway):
    seats, n = 2, 6
    gw = gateway(single_level_config(seats, queues=4, hand_size=2, queue_length_limit=10))
    out: list = []
    t = threading.Thread(target=lambda: out.extend(gw.concurrent(
        n, n, [f"q{i}" for i in range(n)], path=f"{PODS}?sleep=1.0", groups=(E2E_GROUP,),
        timeout=20)), daemon=True)
    t.start()
    try:
        wait_until(lambda: gw.upstream.snapshot()["in_flight"] == seats
                   and level_rows(gw)[LEVEL]["WaitingRequests"] == str(n - seats),
                   timeout=5, what=f"{seats} executing and {n - seats} waiting on {LEVEL}")
        r = gw.request(DUMP, user="admin", groups=("system:masters",))
        assert r.status == 200, gw.fail_msg(repr(r))
        rows = [row for row in parse_dump(r.body) if row.get("PriorityLevelName") == LEVEL]
        queued = [row for row in rows if int(row["RequestIndexInQueue"]) >= 0]
        executing = [row for row in rows if int(row["RequestIndexInQueue"]) < 0]
        assert len(queued) == n - seats and len(executing) == seats, r.body.decode()
        assert all(row["FlowSchemaName"] == "e2e-users" for row in queued), r.body.decode()
        # Executing requests are kept by their owning worker, not in shared state: one row each,
        # attributed to the worker (docs/deviations.md).
        assert all(row["FlowDistingsher"].startswith("worker:") for row in executing), r.body.decode()
        assert all(int(row["QueueIndex"]) >= 0 for row in queued), r.body.decode()
        # Per queue, the indexes in queue are 0..k-1.
        per_q: dict = {}
        for row in queued:
            per_q.setdefault(row["QueueIndex"], []).append(int(row["RequestIndexInQueue"]))
        assert all(sorted(v) == list(range(len(v))) for v in per_q.values()), per_q
        assert not gw.upstream.received("/debug/"), "the masters dump must not reach the upstream"

        # An ordinary user (not in debugGroups) asking for the same dump goes to the upstream.
        for who, groups in (("mallory", ("system:authenticated",)),
                            ("explainer", ("system:authenticated", "e2e-explain"))):
            r2 = gw.request(DUMP, user=who, groups=groups)
            assert r2.status == 200, gw.fail_msg(repr(r2))
            assert b'"kind": "Status"' in r2.body and b"dump_requests" in r2.body, r2.body[:300]
            assert b"RequestIndexInQueue" not in r2.body
            got = gw.upstream.received(DUMP)
            assert [h.get("x-remote-user") for _, h in got][-1:] == [[who]], got
        assert gw.upstream.snapshot()["per_user"].get("mallory") == 1
    finally:
        t.join(timeout=30)
    assert client.status_counts(out) == {200: n}, gw.fail_msg(str(client.status_counts(out)))
    # After the run the level is empty again.
    wait_until(lambda: (lambda row: row["WaitingRequests"] == "0" and row["ExecutingRequests"] == "0")(
        level_rows(gw)[LEVEL]), timeout=5, what=f"{LEVEL} idle")
