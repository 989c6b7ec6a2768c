"""Metrics: the generated `stats_config` (envoy/stats_config.yaml) turns the filter's flat stat
names into Prometheus labels, and after a saturating run the counters on /stats/prometheus match
what the clients saw while the gauges return to 0; histograms carry upstream's names, units
(seconds) and bounds (tests/e2e/test_prometheus.py runs a real Prometheus on them)."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.envoy_template import gateway_config
from apfkit.envoyproc import STATS_CONFIG, wait_until
from apfkit.observe import parse_prometheus, prom_series, prom_sum

pytestmark = pytest.mark.apf

PODS = "/api/v1/namespaces/default/pods"
LEVEL, SCHEMA = "e2e-level", "e2e-users"
REJECTED = "apiserver_flowcontrol_rejected_requests_total"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"
INQUEUE = "apiserver_flowcontrol_current_inqueue_requests"
EXECUTING = "apiserver_flowcontrol_current_executing_requests"
NOMINAL = "apiserver_flowcontrol_nominal_limit_seats"
WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
EXECUTION = "apiserver_flowcontrol_request_execution_seconds"
# Upstream's bounds of both (pkg/util/flowcontrol/metrics/metrics.go), as `le` prints them.
DURATION_LE = ["0", "0.005", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "15", "30",
               "+Inf"]


def test_ops_stats_config_validates_with_envoy(envoy_bin, wasm_module, tmp_path):
    """The committed stats_config merges into a bootstrap that Envoy accepts (--mode validate)."""
    boot = tmp_path / "boot.json"
    boot.write_text(json.dumps(gateway_config(upstream_port=1, wasm_path=wasm_module,
                                              plugin_config={})))
    p = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(boot), "--config-yaml",
                        STATS_CONFIG.read_text(), "-l", "warning", "--disable-hot-restart"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def test_ops_metrics_match_client_view(gateway):
    seats = 2
    gw = gateway(single_level_config(seats, queues=1, hand_size=1, queue_length_limit=2),
                 stats_config=True)
    # Labelled series exist from the start (the level gauges are set on every flush).
    wait_until(lambda: prom_sum(parse_prometheus(gw.stats_prometheus()), NOMINAL,
                                priority_level=LEVEL) == seats,
               timeout=5, what=f"{NOMINAL}{{priority_level={LEVEL}}} == {seats}")

    # 6 connections x 8 slow requests against 2 seats + a queue of 2: some queue, some 429.
    plans = [[client.Req(path=f"{PODS}?sleep=0.25", user=f"m{i}", groups=(E2E_GROUP, "e2e-explain"))
              for _ in range(8)] for i in range(6)]
    out: list = []
    seen = {"exec": 0.0, "inq": 0.0}
    done = threading.Event()

    def load():
        try:
            out.extend(gw.run_connections(plans, timeout=20))
        finally:
            done.set()

    t = threading.Thread(target=load, daemon=True)
    t.start()
    # While saturated, the gauges show executing and queued requests (flushed every second).
    while not done.wait(0.2):
        s = parse_prometheus(gw.stats_prometheus())
        seen["exec"] = max(seen["exec"], prom_sum(s, EXECUTING, priority_level=LEVEL, flow_schema=SCHEMA))
        seen["inq"] = max(seen["inq"], prom_sum(s, INQUEUE, priority_level=LEVEL, flow_schema=SCHEMA))
    t.join(timeout=30)
    assert len(out) == 48
    counts = client.status_counts(out)
    assert set(counts) <= {200, 429} and counts.get(429, 0) > 0 and counts.get(200, 0) > 0, \
        gw.fail_msg(str(counts))
    reasons: dict = {}
    for r in out:
        if r.status == 429:
            reasons[r.h("x-apf-reject-reason")] = reasons.get(r.h("x-apf-reject-reason"), 0) + 1
    # (Not `<= seats`: each worker flushes its own deltas once a second, so a sample can see one
    # worker's +1 for a dispatch before the other worker's -1 for the completion that freed it.)
    assert seen["exec"] >= 1 and seen["inq"] >= 1, seen

    def settled():
        s = parse_prometheus(gw.stats_prometheus())
        got = {
            "rejected": prom_sum(s, REJECTED, priority_level=LEVEL, flow_schema=SCHEMA),
            "dispatched": prom_sum(s, DISPATCHED, priority_level=LEVEL, flow_schema=SCHEMA),
            "inqueue": prom_sum(s, INQUEUE, priority_level=LEVEL),
            "executing": prom_sum(s, EXECUTING, priority_level=LEVEL),
            "waits": prom_sum(s, f"{WAIT}_count", priority_level=LEVEL, flow_schema=SCHEMA),
            "executions": prom_sum(s, f"{EXECUTION}_count", priority_level=LEVEL, flow_schema=SCHEMA),
        }
        settled.last = (got, s)
        return got == {"rejected": counts[429], "dispatched": counts[200], "inqueue": 0,
                       "executing": 0, "waits": len(out), "executions": counts[200]}

    settled.last = None
    try:
        wait_until(settled, timeout=6, interval=0.25, what="metrics to match the clients")
    except TimeoutError:
        got, _ = settled.last or ({}, None)
        raise AssertionError(gw.fail_msg(f"clients saw {counts}, metrics say {got}"))
    s = settled.last[1]
    # Per reason, the labelled counter matches the explained reject reasons.
    for reason, n in reasons.items():
        assert prom_sum(s, REJECTED, priority_level=LEVEL, flow_schema=SCHEMA, reason=reason) == n, \
            (reason, prom_series(s, REJECTED))
    # Nothing else was rejected, and the exempt probe did not land on this level.
    assert prom_sum(s, REJECTED) == counts[429], prom_series(s, REJECTED)
    # Gauges of every series are back to 0.
    for name in (INQUEUE, EXECUTING, "apiserver_flowcontrol_current_inqueue_seats",
                 "apiserver_flowcontrol_current_executing_seats"):
        assert all(v == 0 for _, v in prom_series(s, name)), (name, prom_series(s, name))
    # Histograms in seconds with upstream's bounds: every `le` of a series is there, cumulative,
    # `+Inf` = `_count`. Waits: the 429s (rejected at arrival) waited 0 (execute="false"); the
    # executed ones at most what the clients measured (x-apf-queued-ms, whole ms).
    for name, extra in ((WAIT, "execute"), (EXECUTION, "type")):
        series = prom_series(s, f"{name}_bucket", priority_level=LEVEL, flow_schema=SCHEMA)
        for value in {ls[extra] for ls, _ in series}:
            b = {ls["le"]: v for ls, v in series if ls[extra] == value}
            assert sorted(b, key=float) == DURATION_LE, (name, value, sorted(b))
            cum = [b[le] for le in DURATION_LE]
            assert cum == sorted(cum) and cum[-1] == prom_sum(
                s, f"{name}_count", priority_level=LEVEL, flow_schema=SCHEMA, **{extra: value}), (name, b)
    assert prom_sum(s, f"{WAIT}_bucket", priority_level=LEVEL, execute="false", le="0") == counts[429]
    queued_ms = sorted(int(r.h("x-apf-queued-ms")) for r in out if r.status == 200)
    for le in DURATION_LE[:-1]:
        got = prom_sum(s, f"{WAIT}_bucket", priority_level=LEVEL, execute="true", le=le)
        lo = sum(1 for w in queued_ms if w < float(le) * 1000)
        hi = sum(1 for w in queued_ms if w <= float(le) * 1000)
        assert lo <= got <= hi, (le, got, lo, hi, queued_ms)
    # Every executed request slept 0.25 s upstream.
    assert prom_sum(s, f"{EXECUTION}_bucket", priority_level=LEVEL, le="0.2") == 0
    # Sums: Envoy stats are integers, so a seconds histogram's sum is exported in microseconds
    # under its own name (observability/apf-wasm-rules.yaml records upstream's `_sum`).
    assert not prom_series(s, f"{WAIT}_sum") and not prom_series(s, f"{EXECUTION}_sum")
    wait_us = prom_sum(s, "apiserver_flowcontrol_request_wait_duration_microseconds_sum",
                       priority_level=LEVEL)
    assert sum(queued_ms) * 1000 - 2 <= wait_us < (sum(queued_ms) + len(queued_ms)) * 1000, (wait_us, queued_ms)
    exec_us = prom_sum(s, "apiserver_flowcontrol_request_execution_microseconds_sum",
                       priority_level=LEVEL)
    assert exec_us >= counts[200] * 250_000, exec_us
    assert not [n for n, _, _ in s if n.startswith("apiserver_flowcontrol_") and "milli" in n]
    # The global state's contention counters (not upstream's): every request wrote its level
    # at least once (admission) and every update read its level state (decoded or reused).
    writes = prom_sum(s, "apf_wasm_shared_state_writes_total")
    assert writes >= 48, prom_series(s, "apf_wasm_shared_state_writes_total")
    assert prom_sum(s, "apf_wasm_level_state_decodes_total") + \
        prom_sum(s, "apf_wasm_level_state_reuses_total") >= 48
    for name in ("apf_wasm_shared_state_conflicts_total", "apf_wasm_cross_worker_wakeups_total"):
        assert prom_series(s, name), f"{name} missing"
