"""The queries of the Grafana dashboard (observability/grafana-apf.json) and fleet mode's own
series (docs/observability.md), for the tests that check them against a gateway's exports."""

from __future__ import annotations

import json

from .envoyproc import REPO

DASHBOARD = REPO / "observability" / "grafana-apf.json"
FLEET_ROW = "Fleet (apf-wasm fleet mode)"
# Fleet mode's own series (docs/observability.md).
FLEET_SERIES = {"apf_wasm_fleet_allocated_seats", "apf_wasm_fleet_replicas", "apf_wasm_fleet_sync_age_seconds",
                "apf_wasm_fleet_sync_failures_total", "apf_wasm_fleet_ignored_records_total",
                "apf_wasm_fleet_data_losses_total"}


def dashboard_targets(fleet: bool = False) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows included: outside the fleet row
    (upstream's names, for kube-apiserver and every gateway), or, with `fleet`, inside it (fleet
    mode's own series; tests/e2e/test_fleet.py checks that the replicas export them)."""
    d = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels, in_fleet: bool):
        for p in panels:
            inside = in_fleet or p.get("title") == FLEET_ROW
            walk(p.get("panels", []), inside)
            if inside == fleet:
                out.extend((p["title"], t["expr"]) for t in p.get("targets", []))

    walk(d["panels"], False)
    return out
