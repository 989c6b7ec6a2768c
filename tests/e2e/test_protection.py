"""What the filter is for, end to end: a storm of cluster-wide LISTs against an apiserver with
finite CPU and memory (bench/apiserver_model.py) must not take it down behind apf-wasm with the
default policy, while node heartbeats and controllers keep being served.

A short run of bench/protection.py's storm scenario (one runaway service account listing all
100k pods from 50 connections, 300 nodes renewing leases, 20 controllers, 10 users): apf-wasm
with Kubernetes' default policy and LIST costs from the stand-in's /metrics, then the same storm
with no filter, which must kill the stand-in (else the storm proves nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import protection

pytestmark = pytest.mark.apf


def run(gateway: str, seconds: float, wasm: str | None, envoy_bin: str, tmp_path: Path) -> dict:
    args = protection.parse_args(["--scenario", "storm", "--seconds", str(seconds), "--calm", "5",
                                  "--nodes", "300", "--no-plot", "--out", str(tmp_path)])
    r = protection.run_gateway(gateway, "storm", args, envoy_bin, wasm, tmp_path / gateway)
    sys.stderr.write(protection.table([r]) + "\n")
    return r["summary"]


def test_storm_behind_apf_keeps_the_apiserver_up(wasm_module, envoy_bin, tmp_path):
    s = run("apf-wasm", 25, wasm_module, envoy_bin, tmp_path)
    assert s["deaths"] == 0, f"the stand-in died behind apf-wasm: {s}"
    assert s["node"]["requests"] >= 600, s["node"]
    assert s["node"]["ok_pct"] >= 99.0, f"heartbeats: {s['node']}"
    assert s["controller"]["ok_pct"] >= 99.0, f"controllers: {s['controller']}"
    assert s["relist"]["ok"] == s["relist"]["requests"], f"controller relists: {s['relist']}"
    assert s["storm"]["ok"] > 0, f"the storm was starved to zero: {s['storm']}"
    assert s["storm"]["status_429"] > 0, f"the storm was never limited: {s['storm']}"


def test_the_same_storm_kills_an_unprotected_apiserver(envoy_bin, tmp_path):
    s = run("none", 10, None, envoy_bin, tmp_path)
    assert s["deaths"] >= 1, f"the storm did not take the unprotected stand-in down: {s}"
    assert s["node"]["ok_pct"] < 99.0, s["node"]


# -- watches: bench/protection.py's reconnect and watch-leak scenarios, scaled down (the stand-in
# and the cluster by nodes ÷ 1,000: 60 nodes is 1.9 cores, 6,000 pods, 3.6 GB).
WATCH_NODES = 60


def run_watches(scenario: str, gateway: str, seconds: float, wasm: str | None, envoy_bin: str,
                tmp_path: Path, *extra: str) -> dict:
    args = protection.parse_args(["--scenario", scenario, "--seconds", str(seconds), "--calm", "5",
                                  "--nodes", str(WATCH_NODES), "--no-plot", "--out", str(tmp_path), *extra])
    r = protection.run_gateway(gateway, scenario, args, envoy_bin, wasm, tmp_path / gateway)
    sys.stderr.write(protection.watch_table([r], scenario) + "\n")
    return r["summary"]


@pytest.mark.parametrize("scenario", ["reconnect-watchlist", "reconnect-list"])
def test_reconnect_behind_apf_every_informer_resyncs(wasm_module, envoy_bin, tmp_path, scenario):
    s = run_watches(scenario, "apf-wasm", 40, wasm_module, envoy_bin, tmp_path)
    w = s["watches"]
    assert s["deaths"] == 0, f"the stand-in died behind apf-wasm: {s}"
    assert s["node"]["requests"] >= 20, s["node"]
    assert s["node"]["ok_pct"] >= 99.9, f"heartbeats: {s['node']}"
    assert w["never_resynced"] == 0, f"informers left unsynced: {w}"
    assert w["watch_limit_429"] == 0, f"a reconnecting informer hit watchLimits.perFlow: {w}"


def test_a_watch_leak_grows_without_a_cap_and_holds_at_the_cap(wasm_module, envoy_bin, tmp_path):
    cap = 100
    free = run_watches("watch-leak", "none", 15, None, envoy_bin, tmp_path / "none")["watches"]
    # 100 watches a second for 15 s: without a cap every one stays open at the stand-in.
    assert free["leak_peak_open"] >= 10 * cap, f"the leak did not grow: {free}"
    assert free["open_watches_growth_per_min"] > 0, free
    s = run_watches("watch-leak", "apf-wasm", 15, wasm_module, envoy_bin, tmp_path / "apf",
                    "--watch-per-flow", str(cap))
    w = s["watches"]
    assert s["deaths"] == 0, f"the stand-in died behind apf-wasm: {s}"
    assert w["leak_peak_open"] <= cap, f"the leaker held more than its cap: {w}"
    assert w["leak_opened"] >= cap and w["leak_429"] > 0, w
    for cls in ("node", "controller", "user"):
        assert s[cls]["ok_pct"] >= 99.9, f"{cls}: {s[cls]}"
    assert w["informers_synced_at_end"] == w["informers"], f"kubelet informers: {w}"


def test_apf_at_n_seats_sizes_the_server_limit():
    """`apf-wasm@N` is apf-wasm with serverConcurrencyLimit N (no Envoy needed); plain apf-wasm
    gets the seats kube-up gives its cluster's apiserver in the watch scenarios, upstream's 600
    in the storm scenarios (the key is left out at 600)."""
    assert protection.apf_seats("apf-wasm@2000") == 2000
    assert protection.apf_seats("apf-wasm") == 600
    assert protection.apf_seats("apf-wasm", 2000) == 2000
    assert protection.apf_seats("apf-wasm@800", 2000) == 800
    assert [protection.kube_up_seats(n) for n in (200, 500, 501, 1000, 3000, 3001)] == \
        [600, 600, 2000, 2000, 2000, 4000]
    assert protection.scenario_seats("reconnect-watchlist", 1000) == 2000
    assert protection.scenario_seats("reconnect-list", 200) == 600
    assert protection.scenario_seats("storm", 1000) == 600
    assert protection.apf_seats("none") is None
    assert protection.apf_config(None, 2000)["serverConcurrencyLimit"] == 2000
    assert "serverConcurrencyLimit" not in protection.apf_config(None)
    args = protection.parse_args(["--scenario", "reconnect-watchlist", "--gateways", "none,apf-wasm@2000"])
    assert args.gateway_list == ["none", "apf-wasm@2000"]


def standin_list_memory(tmp_path: Path, version: str, query: str) -> int:
    """Bytes one LIST of all pods held at a fresh 60-node stand-in modelling `version`."""
    standin = protection.StandIn(tmp_path / version, f"model-{version}", nodes=WATCH_NODES, version=version)
    try:
        before = standin.get("/__model/stats")["peak_memory_bytes"]
        status, _ = protection.urllib_get(standin.port, "/api/v1/pods" + query, {"X-Remote-User": "alice"})
        assert status == 200
        stats = standin.get("/__model/stats")
        assert stats["in_flight"] == 0 and stats["memory_bytes"] == before, stats
        return stats["peak_memory_bytes"] - before
    finally:
        standin.stop()


@pytest.mark.parametrize("query", ["", "?resourceVersion=0"])
def test_a_list_streamed_from_the_cache_holds_its_items_not_the_response(tmp_path, query):
    """kube-apiserver 1.34 serves a consistent LIST from the watch cache (KEP-2340) and streams
    every LIST's response (KEP-5116): it holds its items' structs and the encoder's buffers;
    1.30 read a consistent LIST from etcd and built every response whole."""
    m = protection.Model().scaled(WATCH_NODES)
    new = standin_list_memory(tmp_path, "1.34", query)
    old = standin_list_memory(tmp_path, "1.30", query)
    assert new == m.pods * m.list_item_struct_bytes + m.list_stream_buffer_bytes
    whole = m.list_memory_multiplier if query == "" else m.cache_list_memory_multiplier
    assert old == int(m.pods * m.pod_size_bytes * whole)
    assert old > 5 * new
