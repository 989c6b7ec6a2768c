#!/usr/bin/env python3
"""Training run for the native host's profile-guided build (./native-build.sh): loads an
instrumented libapf_wasm.so into a real Envoy (2 workers) and sends it the traffic the module is
built for, so that LLVM lays out and inlines the request path by how it really runs.

Two phases, each in its own Envoy, both writing to the profile directory the module was built
with (`-C profile-generate=DIR`; Envoy writes it as it exits):
  1. the default policy (upstream's suggested FlowSchemas and levels), uncontended: GETs and
     LISTs of namespaced and cluster-scoped resources, non-resource paths and a few writes,
     from many users — what a gateway in front of an apiserver mostly does;
  2. one 2-seat level under 16 connections: requests queue, are dispatched across workers and
     some are rejected (429).

Usage: scripts/pgo-train.py --module SO [--envoy BIN]
Exit status 0 only when Envoy ran both phases and exited; the caller then merges the profile.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apfkit import client  # noqa: E402
from apfkit.apf_policy import E2E_GROUP, plugin_config, single_level_config  # noqa: E402
from apfkit.envoy_template import gateway_config  # noqa: E402
from apfkit.envoyproc import EnvoyProcess  # noqa: E402
from apfkit.upstream import Upstream  # noqa: E402
from bench.native import dynamic_module_filter, module_env  # noqa: E402

USERS = [f"user-{i}" for i in range(40)]
# (path, method): the shapes of an apiserver's everyday traffic.
UNCONTENDED = [
    ("/api/v1/namespaces/default/pods", "GET"),
    ("/api/v1/namespaces/default/pods/demo-pod", "GET"),
    ("/apis/apps/v1/namespaces/kube-system/deployments?limit=500", "GET"),
    ("/api/v1/nodes/node-1", "GET"),
    ("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", "PUT"),
    ("/api/v1/namespaces/default/configmaps", "POST"),
    ("/healthz", "GET"),
    ("/api/v1/pods?labelSelector=app%3Dweb", "GET"),
]


def run_phase(envoy: str | None, module: Path, up: Upstream, work: Path, name: str,
              cfg: dict, load) -> None:
    gw_cfg = gateway_config(upstream_port=up.port, http_filter="none",
                            extra_filters=[dynamic_module_filter(module, cfg)])
    env = EnvoyProcess(gw_cfg, work, envoy_bin=envoy, concurrency=2, name=name,
                       log_level="warning", env=module_env(module))
    env.start()
    try:
        env.wait_ready(timeout=60)
        load(env.ports["gateway"])
    finally:
        code = env.stop(timeout=30)
    if code not in (0, None):
        raise SystemExit(f"pgo-train: {name}: Envoy exited with {code}\n{env.log_tail(20)}")


def uncontended(port: int) -> None:
    for path, method in UNCONTENDED:
        res = client.concurrent(port, 600, 6, USERS, path=path, method=method,
                                groups=("system:authenticated",), timeout=30)
        failed = [r for r in res if r.status is None]
        if failed:
            raise SystemExit(f"pgo-train: {method} {path}: {len(failed)} requests failed")


def queued(port: int) -> None:
    res = client.concurrent(port, 800, 16, USERS[:8], path="/api/v1/namespaces/default/pods?sleep=0.002",
                            groups=(E2E_GROUP,), timeout=30)
    if not any(r.status == 200 for r in res):
        raise SystemExit("pgo-train: the saturated phase served nothing")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", required=True, type=Path, help="the instrumented libapf_wasm.so")
    ap.add_argument("--envoy", help="the Envoy binary (default: apfkit's lookup: $ENVOY_BIN, .venv)")
    args = ap.parse_args()
    up = Upstream().start()
    up.set_nodelay()
    try:
        with tempfile.TemporaryDirectory(prefix="apf-pgo-") as tmp:
            work = Path(tmp)
            run_phase(args.envoy, args.module, up, work, "uncontended", plugin_config(), uncontended)
            saturated = single_level_config(2, queues=8, hand_size=2, queue_length_limit=20)
            run_phase(args.envoy, args.module, up, work, "saturated", saturated, queued)
    finally:
        up.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
