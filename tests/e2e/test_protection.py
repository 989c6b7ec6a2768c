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
