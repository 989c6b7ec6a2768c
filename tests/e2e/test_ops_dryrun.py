"""Operations — dry run (`"enforce": false`, or the level in `dryRunPriorityLevels`): nothing
is queued or rejected, every request reaches the upstream at once, but the state and the metrics
account the would-be queueing and rejections."""

from __future__ import annotations

import threading

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoyproc import wait_until
from apfkit.observe import level_rows, parse_prometheus, prom_series, prom_sum

pytestmark = pytest.mark.apf

PODS = "/api/v1/namespaces/default/pods"
LEVEL, SCHEMA = "e2e-level", "e2e-users"
REJECTED = "apiserver_flowcontrol_rejected_requests_total"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"
INQUEUE = "apiserver_flowcontrol_current_inqueue_requests"
EXECUTING = "apiserver_flowcontrol_current_executing_requests"


@pytest.mark.parametrize("how", ["enforce-false", "dryRunPriorityLevels"])
def test_ops_dry_run_lets_everything_through_but_accounts(gateway, how):
    seats, n = 2, 8
    extra = {"enforce": False} if how == "enforce-false" else {"dryRunPriorityLevels": [LEVEL]}
    gw = gateway(single_level_config(seats, queues=1, hand_size=1, queue_length_limit=2, **extra),
                 stats_config=True)
    out: list = []
    t = threading.Thread(target=lambda: out.extend(gw.concurrent(
        n, n, [f"d{i}" for i in range(n)], path=f"{PODS}?sleep=0.8",
        groups=(E2E_GROUP, "e2e-explain"), timeout=15)), daemon=True)
    t.start()
    try:
        # All n are at the upstream at once (the level has 2 seats): nothing was held back...
        wait_until(lambda: gw.upstream.snapshot()["in_flight"] == n, timeout=5,
                   what=f"all {n} requests at the upstream")
        # ...while the level's state shows the would-be queue (2 executing, 2 waiting).
        row = level_rows(gw)[LEVEL]
        assert row["ExecutingRequests"] == str(seats) and row["WaitingRequests"] == "2", row
    finally:
        t.join(timeout=20)
    assert client.status_counts(out) == {200: n}, gw.fail_msg(str(client.status_counts(out)))
    assert all(r.h("x-apf-reject-reason") is None for r in out)
    assert gw.upstream.snapshot()["max_in_flight"] == n

    def accounted():
        s = parse_prometheus(gw.stats_prometheus())
        rej = prom_sum(s, REJECTED, priority_level=LEVEL, flow_schema=SCHEMA)
        disp = prom_sum(s, DISPATCHED, priority_level=LEVEL, flow_schema=SCHEMA)
        idle = (prom_sum(s, INQUEUE, priority_level=LEVEL) == 0
                and prom_sum(s, EXECUTING, priority_level=LEVEL) == 0)
        accounted.last = (rej, disp, idle, prom_series(s, REJECTED))
        return idle and rej + disp == n

    accounted.last = None
    try:
        wait_until(accounted, timeout=6, interval=0.25,
                   what="every request counted once, gauges back to 0")
    except TimeoutError:
        raise AssertionError(gw.fail_msg(f"(rejected, dispatched, idle, series) = {accounted.last}"))
    rej, disp, _, series = accounted.last
    # Would-be rejections: 2 run, 2 wait, the other 4 find the only queue full.
    queue_full = sum(v for ls, v in series if ls.get("reason") == "queue-full")
    assert queue_full == n - 2 * seats, (rej, disp, series)
    row = level_rows(gw)[LEVEL]
    assert int(row["RejectedRequests"]) >= n - 2 * seats, row
    assert row["WaitingRequests"] == "0" and row["ExecutingRequests"] == "0", row
