"""Harness self-tests: they pass with ANY proxy-wasm module that forwards requests (the floor
module, a pass-through module, or apf-wasm with a roomy default policy). Run them alone with

    APF_WASM=/path/to/floor.wasm APF_E2E_HARNESS_ONLY=1 .venv/bin/python -m pytest -q tests/e2e -k harness
"""

from __future__ import annotations

import socket
import time

import pytest

from apfkit import client
from apfkit.apf_policy import plugin_config
from apfkit.envoyproc import wait_until

pytestmark = pytest.mark.harness

# Roomy: default (suggested) policy, 600 seats; `global-default` has ceil(600*20/245) = 49 seats.
ROOMY = plugin_config()


def test_harness_two_workers_traffic_and_in_flight(gateway):
    gw = gateway(ROOMY, concurrency=2)
    users = ["harness-a", "harness-b", "harness-c"]
    t0 = time.monotonic()
    res = gw.concurrent(40, 20, users, path="/api/v1/namespaces/default/pods?sleep=0.3",
                        groups=("system:authenticated",), timeout=10)
    took = time.monotonic() - t0
    assert len(res) == 40
    assert client.status_counts(res) == {200: 40}, gw.fail_msg(f"{client.status_counts(res)} {res[:3]}")
    snap = gw.upstream.snapshot()
    assert snap["total"] == 40
    assert snap["in_flight"] == 0
    # 20 connections, 0.3 s each: many in flight at once, and far faster than serial (12 s).
    assert snap["max_in_flight"] >= 10, snap
    assert took < 6, took
    assert sorted(snap["per_user"]) == users
    assert sum(snap["per_user"].values()) == 40
    workers = gw.worker_connections()
    assert len(workers) == 2 and all(v > 0 for v in workers.values()), \
        gw.fail_msg(f"both workers must accept connections: {workers}")


def test_harness_responses_carry_pf_headers(gateway):
    gw = gateway(ROOMY)
    r = gw.request(user="harness-a", groups=("system:authenticated",))
    assert r.status == 200, gw.fail_msg(repr(r))
    assert r.h("x-kubernetes-pf-flowschema-uid") is not None, r.headers
    assert r.h("x-kubernetes-pf-prioritylevel-uid") is not None, r.headers
    assert b'"PodList"' in r.body


def test_harness_upstream_counts_and_reset(gateway):
    gw = gateway(ROOMY)
    for u in ("x", "y", "y"):
        assert gw.request("/healthz", user=u, groups=("system:authenticated",)).status == 200
    snap = gw.upstream.snapshot()
    assert snap["per_user"] == {"x": 1, "y": 2}
    gw.upstream.reset()
    assert gw.upstream.snapshot()["total"] == 0


def test_harness_in_flight_is_observable_while_requests_run(gateway):
    gw = gateway(ROOMY)
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(
        gw.request("/api/v1/namespaces/default/pods?sleep=1", user="slow",
                   groups=("system:authenticated",), timeout=10)))
    t.start()
    wait_until(lambda: gw.upstream.snapshot()["in_flight"] == 1, timeout=5, what="1 in flight")
    t.join(timeout=10)
    assert out and out[0].status == 200
    assert gw.upstream.snapshot()["in_flight"] == 0


def test_harness_no_filter_variant(gateway):
    gw = gateway(None, http_filter="none")
    r = gw.request("/version")
    assert r.status == 200 and b"gitVersion" in r.body
    assert r.h("x-kubernetes-pf-flowschema-uid") is None


def test_harness_teardown_is_clean(gateway):
    gw = gateway(ROOMY)
    port, env = gw.port, gw.envoy
    assert env.alive()
    code = env.stop()
    assert code is not None and not env.alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_harness_wait_until_is_bounded():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        wait_until(lambda: False, timeout=0.3, interval=0.05, what="never")
    assert time.monotonic() - t0 < 1.5
    assert wait_until(lambda: 7, timeout=1) == 7


def test_harness_admin_and_prometheus(gateway):
    gw = gateway(ROOMY)
    st, body = gw.admin_get("/ready")
    assert st == 200 and body.strip() == b"LIVE"
    prom = gw.stats_prometheus()
    assert "envoy_http_downstream_rq_total" in prom


def test_harness_ecds_reload_under_load_keeps_serving(gateway):
    """Hot reload through ECDS while requests are in flight: nothing fails, in-flight requests
    complete, new requests use the new configuration."""
    import threading

    gw = gateway(ROOMY, ecds=True)
    assert gw.request("/healthz", user="a", groups=("system:authenticated",)).status == 200
    out: list = []
    t = threading.Thread(target=lambda: out.extend(gw.concurrent(
        24, 8, ["r1", "r2"], path="/api/v1/namespaces/default/pods?sleep=0.3",
        groups=("system:authenticated",), timeout=15)), daemon=True)
    t.start()
    wait_until(lambda: gw.upstream.snapshot()["in_flight"] >= 1, timeout=5, what="load running")
    gw.reload(plugin_config(serverConcurrencyLimit=601))
    gw.reload(plugin_config(serverConcurrencyLimit=602))
    t.join(timeout=30)
    assert not t.is_alive()
    assert client.status_counts(out) == {200: 24}, gw.fail_msg(str(client.status_counts(out)))
    assert gw.request("/healthz", user="a", groups=("system:authenticated",)).status == 200


def test_harness_seat_arithmetic():
    from apfkit.apf_policy import nominal_cl, shares_for_seats, single_level_config

    # kubernetes-apf.md §8.1: share sum 245; global-default (20) at 600 seats → 49.
    assert nominal_cl(600, 20, 245) == 49
    assert nominal_cl(600, 5, 245) == 13  # catch-all
    for seats in (1, 2, 4, 7):
        s = 2 * seats
        ncs = shares_for_seats(s, seats)
        assert nominal_cl(s, ncs, ncs + 5) == seats
    with pytest.raises(ValueError):
        shares_for_seats(100, 4)  # NCS ≥ 1 already gives 17 seats
    cfg = single_level_config(3)
    pl = cfg["policy"][0]["spec"]["limited"]
    assert cfg["suggestedDefaults"] is False
    assert pl["lendablePercent"] == 0 and pl["borrowingLimitPercent"] == 0
    assert nominal_cl(cfg["serverConcurrencyLimit"], pl["nominalConcurrencyShares"],
                      pl["nominalConcurrencyShares"] + 5) == 3
