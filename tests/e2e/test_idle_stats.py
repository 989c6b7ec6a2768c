"""A burst's stats reach Envoy without later traffic: every worker's last requests are counted
within a few timer periods, though no request follows (on the native host the main thread's timer
takes every worker's pending deltas and adds them; a Wasm VM's timer runs regardless)."""

from __future__ import annotations

import pytest

from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoyproc import wait_until
from apfkit.observe import parse_prometheus, prom_sum

pytestmark = [pytest.mark.apf, pytest.mark.core]

LEVEL = "e2e-level"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"


def test_a_bursts_last_requests_are_counted_without_more_traffic(gateway):
    gw = gateway(single_level_config(4, queues=8, hand_size=2, queue_length_limit=50), stats_config=True)
    dispatched = lambda: prom_sum(parse_prometheus(gw.stats_prometheus()), DISPATCHED,  # noqa: E731
                                  priority_level=LEVEL)
    served = 0
    for burst in range(6):
        # Back-to-back requests on one connection (one worker): its last ones end well within
        # 100 ms of its previous flush, then nothing follows.
        res = gw.concurrent(4, 1, [f"user{burst}"], groups=(E2E_GROUP,), timeout=20)
        assert all(r.status == 200 for r in res), [r.status for r in res]
        served += len(res)
        wait_until(lambda: dispatched() == served, timeout=3,
                   what=f"burst {burst}: {served} dispatched requests counted with no traffic after it")
