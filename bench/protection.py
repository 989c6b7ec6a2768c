#!/usr/bin/env python3
"""What the filter protects: a storm against an apiserver with finite CPU and memory, behind each
gateway in turn, side by side with Envoy's own filters.

Each gateway is one Envoy (2 workers) in front of a fresh apiserver stand-in
(bench/apiserver_model.py: processor sharing over 32 virtual cores, a 60 GB memory limit that an
OOM kill enforces, /metrics in kube-apiserver 1.34's format). The same traffic runs through every
gateway, one after another:

  nodes        --nodes kubelets (system:node:node-N in system:nodes), each renewing its lease
               (PUT .../namespaces/kube-node-lease/leases/node-N) every 10 s, timeout 10 s
  controllers  --controllers service accounts of kube-system, each a closed loop of GET then
               PUT of a pod, 0.2 s apart, timeout 10 s, and a relist (a cluster-wide LIST of
               pods, timeout 60 s) every --relist-period seconds
  users        --users ordinary users (system:authenticated), each a closed loop of a LIST of
               one namespace's pods or a GET, 1 s apart, timeout 30 s
  storm        from --calm seconds on, for --seconds: cluster-wide LISTs of pods
               (/api/v1/pods, a consistent read), a 1 s back-off after a failure, timeout 60 s
    scenario storm      one runaway service account (system:serviceaccount:telemetry:collector)
                        on --storm-connections connections, closed loop
    scenario daemonset  one identity per node (system:serviceaccount:telemetry:agent-node-N),
                        each listing every --daemonset-period seconds (the DaemonSet case)
    scenario reconnect-watchlist, reconnect-list   (--scenario reconnect: both) the informers
                        of --nodes nodes (kubelet: its pods, its Node; kube-proxy: Services,
                        EndpointSlices; a DaemonSet agent: all pods) and of the controllers
                        (all pods, all Nodes), synced and watching, lose every watch at --calm
                        (POST /__model/drop-watches: kube-apiserver restarted behind its load
                        balancer) and resync at once (apfkit/informer.py): WatchList
                        (sendInitialEvents=true) or LIST + WATCH (RV=0 LIST, then a watch from
                        its RV). The run ends 3 s after every informer has synced again, at the
                        latest after --seconds. No controller relist loop (the informers are it).
    scenario watch-leak one service account (system:serviceaccount:telemetry:leaky-controller)
                        opens --leak-rate watches a second from --calm on and never closes them,
                        beside the heartbeats, the kubelets' informers, controllers and users.
  The stand-in models kube-apiserver 1.30 in the storm scenarios and 1.34 in the watch scenarios
  (--apiserver-version: how a LIST is served and what it holds, bench/apiserver_model.py).
  The watch scenarios scale the stand-in and the cluster by --nodes ÷ 1,000 together (pods,
  Services, EndpointSlices, cores, memory: Model.scaled), turn Envoy's route timeout off (watches
  are long-lived) and give apf-wasm watchLimits.perFlow (--watch-per-flow; default
  watch_per_flow()).
Identity travels as trusted front-proxy headers (X-Remote-User, X-Remote-Group).

Gateways (--gateways, comma-separated):
  none                  router only
  ratelimit             local_ratelimit, one token bucket at the stand-in's capacity for the
                        ordinary mix (cores ÷ that mix's mean CPU per request), per second
  ratelimit-per-user    the same plus a bucket per X-Remote-User (dynamic descriptors) at
                        20 req/s, burst 30: kube-controller-manager's own client QPS and burst,
                        the busiest client a cluster runs by default
  ratelimit-lists       the global bucket plus one for cluster-wide LISTs of pods only (GET
                        /api/v1/pods) at the rate the stand-in's memory holds with a 2× margin:
                        what an operator who knows which request is expensive, and what it costs
                        in this cluster, would write (--list-rate)
  adaptive-concurrency  adaptive_concurrency, gradient controller with Envoy's defaults
  admission-control     admission_control, 5xx as failures, Envoy's defaults (30 s window,
                        95 % success threshold, at most 80 % rejected)
  apf-wasm              apf-wasm with Kubernetes' default policy (no policy configured: the
                        suggested FlowSchemas and levels), front-proxy identity, and
                        workEstimator.clusterMetrics reading the stand-in's /metrics; at 600
                        seats in the storm scenarios, and in the watch scenarios at the seats
                        kube-up gives the apiserver of --nodes nodes (kube_up_seats: 600 up to
                        500 nodes, 2,000 up to 3,000, then 4,000)
  apf-wasm@N            the same with serverConcurrencyLimit N

Reported per gateway (over the storm window): heartbeat success and p50/p99 latency, controller
and user success, storm LISTs served and rejected (429), the stand-in's peak memory, peak
requests in flight and deaths, total goodput. Written to --out: protection-SCENARIO.md (tables),
protection-SCENARIO.json (summaries and time series) and protection-SCENARIO.png (time on x;
heartbeat latency, stand-in memory, requests in flight at the stand-in; one line per gateway).
Behind apf-wasm the JSON also keeps `gateway_samples` (--sample-gateway, every 2 s): the APF
families of Envoy's /stats/prometheus (rejections by level and reason, queued requests, seats in
use, waits), dump_priority_levels and Envoy's CPU; the watch scenarios add every Retry-After and
back-off the informers slept (`retry_after`, `reflector_backoffs`).

Envoy: ENVOY_BIN, else scripts/envoy-env.sh (the repo's .venv). The module: --apf-wasm, APF_WASM,
else ./wasm-build.sh. The benchmark re-runs itself with the repo's .venv Python and installs
matplotlib there when missing (--no-plot: neither). Every process runs at normal priority: the
clients measure latency and the stand-in's timers are its clock.

Reported for the watch scenarios: time until every informer has synced again after the drop (and
how many never did), per informer group, the informers' 429s, the leaker's watches opened,
refused and open at the stand-in, the stand-in's open watches and memory growth; written as
protection-SCENARIO.{md,json,png} like the others.

Usage: python3 bench/protection.py [--scenario NAME] [--seconds S] [--gateways LIST] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the shared harness apfkit/, and bench/ as a package

from apfkit import apf_policy  # noqa: E402
from apfkit import informer as inf  # noqa: E402
from apfkit.envoy_template import gateway_config  # noqa: E402
from apfkit.envoyproc import EnvoyProcess, find_envoy, wait_until  # noqa: E402
from bench.apiserver_model import Model  # noqa: E402

GATEWAYS = ["none", "ratelimit", "ratelimit-per-user", "ratelimit-lists", "adaptive-concurrency",
            "admission-control", "apf-wasm"]
SCENARIOS = ["storm", "daemonset", "reconnect-watchlist", "reconnect-list", "watch-leak"]
# Scenarios with watches: the stand-in and the cluster scaled by --nodes ÷ 1,000, no route timeout.
WATCH_SCENARIOS = ("reconnect-watchlist", "reconnect-list", "watch-leak")
ALIASES = {"reconnect": ["reconnect-watchlist", "reconnect-list"]}
COLORS = {"none": "#7f7f7f", "ratelimit": "#ff7f0e", "ratelimit-per-user": "#d62728", "ratelimit-lists": "#1f77b4",
          "adaptive-concurrency": "#9467bd", "admission-control": "#8c564b", "apf-wasm": "#2ca02c"}
CLASSES = ("node", "controller", "relist", "user", "storm")
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/"
# Client behaviour per class: (period or think time s, timeout s).
HEARTBEAT_PERIOD, HEARTBEAT_TIMEOUT = 10.0, 10.0
CONTROLLER_THINK, CONTROLLER_TIMEOUT = 0.2, 10.0
USER_THINK, USER_TIMEOUT = 1.0, 30.0
STORM_BACKOFF, STORM_TIMEOUT = 1.0, 60.0
# ratelimit-per-user: kube-controller-manager's --kube-api-qps / --kube-api-burst defaults.
PER_USER_QPS, PER_USER_BURST = 20, 30


def log(msg: str) -> None:
    print(f"[protection] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Gateways
PCT100 = {"numerator": 100, "denominator": "HUNDRED"}
LRL_TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"


def ordinary_capacity_rps(m: Model, nodes: int, controllers: int, users: int) -> float:
    """Requests per second of the ordinary mix (heartbeats, controllers, users in their
    proportions) at which the stand-in's cores are busy: cores ÷ the mix's mean CPU."""
    write = m.request_cpu_s + m.write_cpu_s
    ns_list = m.list_cpu(max(1, m.pods // m.namespaces))
    mix = [(nodes / HEARTBEAT_PERIOD, write),
           (controllers / CONTROLLER_THINK / 2, m.request_cpu_s),
           (controllers / CONTROLLER_THINK / 2, write),
           (users / USER_THINK / 2, ns_list), (users / USER_THINK / 2, m.request_cpu_s)]
    rate = sum(r for r, _ in mix)
    return m.cores / (sum(r * c for r, c in mix) / rate)


def list_rate(m: Model) -> float:
    """Cluster-wide pod LISTs per second that the stand-in holds with a 2× margin: the LISTs
    that fit in its memory headroom at once, ÷ a LIST's duration on one core, ÷ 2."""
    at_once = (m.memory_limit_bytes - m.baseline_memory_bytes) // m.list_memory(m.pods)
    return at_once / m.list_cpu(m.pods) / 2


def local_ratelimit(capacity_rps: float, per_user: bool, list_rps: float | None = None) -> dict:
    tokens = max(1, int(capacity_rps))
    cfg: dict = {
        "@type": LRL_TYPE,
        "stat_prefix": "protection_rl",
        "token_bucket": {"max_tokens": tokens, "tokens_per_fill": tokens, "fill_interval": "1s"},
        "filter_enabled": {"runtime_key": "rl_enabled", "default_value": PCT100},
        "filter_enforced": {"runtime_key": "rl_enforced", "default_value": PCT100},
    }
    if per_user:
        # One bucket per distinct X-Remote-User value (an empty descriptor value is a wildcard
        # with max_dynamic_descriptors).
        cfg["max_dynamic_descriptors"] = 100_000
        cfg["rate_limits"] = [{"actions": [{"request_headers": {
            "header_name": "x-remote-user", "descriptor_key": "user"}}]}]
        cfg["descriptors"] = [{"entries": [{"key": "user", "value": ""}], "token_bucket": {
            "max_tokens": PER_USER_BURST, "tokens_per_fill": PER_USER_QPS, "fill_interval": "1s"}}]
    if list_rps:
        # Cluster-wide LISTs of pods get a bucket of their own (every client together).
        n = max(1, round(list_rps))
        cfg["rate_limits"] = [{"actions": [{"header_value_match": {
            "descriptor_key": "request", "descriptor_value": "cluster-pod-list", "headers": [
                {"name": ":method", "string_match": {"exact": "GET"}},
                {"name": ":path", "string_match": {"safe_regex": {"regex": r"^/api/v1/pods(\?.*)?$"}}}]}}]}]
        cfg["descriptors"] = [{"entries": [{"key": "request", "value": "cluster-pod-list"}],
                               "token_bucket": {"max_tokens": n, "tokens_per_fill": n,
                                                "fill_interval": "1s"}}]
    return {"name": "envoy.filters.http.local_ratelimit", "typed_config": cfg}


def adaptive_concurrency() -> dict:
    return {"name": "envoy.filters.http.adaptive_concurrency", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency",
        "gradient_controller_config": {
            "sample_aggregate_percentile": {"value": 50},
            "concurrency_limit_params": {"concurrency_update_interval": "0.1s"},
            "min_rtt_calc_params": {"interval": "60s", "request_count": 50}}}}


def admission_control() -> dict:
    return {"name": "envoy.filters.http.admission_control", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.admission_control.v3.AdmissionControl",
        "enabled": {"default_value": True, "runtime_key": "ac_enabled"},
        "sampling_window": "30s",
        "sr_threshold": {"default_value": {"value": 95.0}, "runtime_key": "ac_sr"},
        "aggression": {"default_value": 1.0, "runtime_key": "ac_aggression"},
        "rps_threshold": {"default_value": 0, "runtime_key": "ac_rps"},
        "max_rejection_probability": {"default_value": {"value": 80.0}, "runtime_key": "ac_max"},
        "success_criteria": {"http_criteria": {"http_success_status": [{"start": 100, "end": 500}]}}}}


def kube_up_seats(nodes: int) -> int:
    """The seats kube-up gives the apiserver of a cluster of `nodes` nodes:
    `--max-requests-inflight` + `--max-mutating-requests-inflight`, 3,000 + 1,000 above 3,000
    nodes, 1,500 + 500 above 500, else kube-apiserver's defaults 400 + 200
    (`cluster/gce/gci/configure-kubeapiserver.sh: start-kube-apiserver`)."""
    if nodes > 3000:
        return 4000
    return 2000 if nodes > 500 else 600


def apf_seats(gateway: str, default: int = 600) -> int | None:
    """`apf-wasm@N`: apf-wasm with `serverConcurrencyLimit` N; plain `apf-wasm`: `default` (the
    watch scenarios pass the seats of their cluster's apiserver, `kube_up_seats`; the storm
    scenarios upstream's 600). None for other gateways."""
    base, _, n = gateway.partition("@")
    if base != "apf-wasm":
        return None
    return int(n) if n else default


def scenario_seats(scenario: str, nodes: int) -> int:
    """Plain apf-wasm's seats in `scenario`: the watch scenarios size the gateway like the
    apiserver behind it (`kube_up_seats` of --nodes); the storm scenarios keep 600."""
    return kube_up_seats(nodes) if scenario in WATCH_SCENARIOS else 600


def scenario_version(scenario: str, arg: str) -> str:
    """The kube-apiserver version the stand-in models in `scenario` (--apiserver-version, else
    1.34 for the watch scenarios and 1.30 for the storm scenarios, which replay an outage on an
    apiserver that read consistent LISTs from etcd and built them whole)."""
    return arg or ("1.34" if scenario in WATCH_SCENARIOS else "1.30")


def is_apf(gateway: str) -> bool:
    return apf_seats(gateway) is not None


def apf_config(watch_limits: dict | None = None, seats: int = 600) -> dict:
    """Kubernetes' default policy (no `policy`: the suggested objects at 600 seats), identity
    from the front-proxy headers, LIST costs from the stand-in's /metrics (the Envoy cluster of
    the route, `apiserver`); `watchLimits` when given."""
    cfg = {"identity": apf_policy.FRONT_PROXY, "debugGroups": ["system:masters"],
           "workEstimator": {"clusterMetrics": {"cluster": "apiserver"}}}
    if watch_limits:
        cfg["watchLimits"] = watch_limits
    if seats != 600:
        cfg["serverConcurrencyLimit"] = seats
    return cfg


def watch_per_flow(nodes: int, controllers: int) -> int:
    """`watchLimits.perFlow` for the watch scenarios: the largest flow of the reconnect
    scenario's informers, with 20 % headroom. That flow is kube-system's cluster-wide requests
    (the suggested FlowSchema `kube-system-service-accounts` distinguishes flows by the request's
    namespace, and a cluster-wide watch has none): kube-proxy's two informers on every node plus
    the controllers' two each. A DaemonSet's agents share one
    service account, so one flow (`service-accounts`, by user): one informer per node."""
    return int(1.2 * max(2 * nodes + 2 * controllers, nodes))


def envoy_config(gateway: str, upstream_port: int, wasm: str | None, capacity_rps: float,
                 model: Model | None = None, watch_limits: dict | None = None,
                 route_timeout: str = "60s", seats: int = 600) -> dict:
    model = model or Model()
    if is_apf(gateway):
        return gateway_config(upstream_port=upstream_port, wasm_path=wasm, route_timeout=route_timeout,
                              plugin_config=apf_config(watch_limits, apf_seats(gateway, seats) or seats),
                              http_filter="wasm")
    extra = {"none": [], "ratelimit": [local_ratelimit(capacity_rps, False)],
             "ratelimit-per-user": [local_ratelimit(capacity_rps, True)],
             "ratelimit-lists": [local_ratelimit(capacity_rps, False, list_rate(model))],
             "adaptive-concurrency": [adaptive_concurrency()],
             "admission-control": [admission_control()]}[gateway]
    return gateway_config(upstream_port=upstream_port, http_filter="none", extra_filters=extra,
                          route_timeout=route_timeout)


# ---------------------------------------------------------------------------------------------
# The stand-in
class StandIn:
    def __init__(self, workdir: Path, name: str, nodes: int | None = None, version: str = "") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = workdir / f"{name}.port"
        self.log = open(workdir / f"{name}.log", "wb")
        scale = ["--nodes", str(nodes)] if nodes else []
        scale += ["--apiserver-version", version] if version else []
        self.proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "apiserver_model.py"),
                                      "--port-file", str(self.port_file), *scale],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        self.port = int(wait_until(lambda: self.port_file.exists() and self.port_file.read_text(),
                                   timeout=30, what="the stand-in's port"))

    def get(self, path: str) -> dict:
        """A control endpoint; while the stand-in restarts after a death (it refuses
        connections), waits for it to come back."""
        def once():
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return json.loads(r.read())
        return wait_until(once, timeout=Model().restart_s + 20, interval=0.1,
                          what=f"the stand-in's {path}")

    def post(self, path: str) -> dict:
        """A control POST; while the stand-in restarts after a death, waits for it to come back."""
        def once():
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        return wait_until(once, timeout=Model().restart_s + 20, interval=0.1,
                          what=f"the stand-in's {path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


# ---------------------------------------------------------------------------------------------
# Clients: asyncio, one HTTP/1.1 keep-alive connection per client
class Client:
    def __init__(self, port: int, user: str, groups: tuple[str, ...]) -> None:
        self.port = port
        self.ident = f"X-Remote-User: {user}\r\n" + "".join(f"X-Remote-Group: {g}\r\n" for g in groups)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None

    async def _once(self, method: str, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write((f"{method} {path} HTTP/1.1\r\nHost: apiserver\r\n{self.ident}"
                           f"Content-Length: {len(body)}\r\n"
                           + ("Content-Type: application/json\r\n" if body else "") + "\r\n").encode()
                          + body)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        if "transfer-encoding: chunked" in head:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            n = 0
            for ln in head.split("\r\n"):
                if ln.startswith("content-length:"):
                    n = int(ln.split(":", 1)[1])
            if n:
                await self.reader.readexactly(n)
        if "connection: close" in head:
            self.close()
        return status

    async def request(self, method: str, path: str, timeout: float, body: bytes = b"") -> int:
        """The response's status, 0 for a connection failure or a time-out."""
        try:
            return await asyncio.wait_for(self._once(method, path, body), timeout)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError,
                asyncio.LimitOverrunError, IndexError):
            self.close()
            return 0


class Traffic:
    """Runs the scenario's clients against `port` for `total` seconds; records every request as
    (class, start s since t0, latency s, status)."""

    def __init__(self, port: int, args, scenario: str) -> None:
        self.port, self.args, self.scenario = port, args, scenario
        self.records: list[tuple[str, float, float, int]] = []
        self.rng = random.Random(1)
        self.t0 = 0.0
        self.end = 0.0
        # Watch scenarios: the informers replace the controllers' periodic relists.
        self.relist_period = 0.0 if scenario in WATCH_SCENARIOS else args.relist_period
        self.standin: StandIn | None = None  # set by run_gateway (watch scenarios)
        self.start_rv = 0
        self.informers: list[inf.Informer] = []
        self.leaked: list[inf.Response] = []
        self.drop_at = float("nan")

    async def call(self, cls: str, client: Client, method: str, path: str, timeout: float,
                   body: bytes = b"") -> int:
        t = time.monotonic()
        status = await client.request(method, path, timeout, body)
        self.records.append((cls, t - self.t0, time.monotonic() - t, status))
        return status

    async def sleep_until(self, t: float) -> bool:
        """Sleeps until monotonic `t` (or the end); False when the run is over."""
        d = min(t, self.end) - time.monotonic()
        if d > 0:
            await asyncio.sleep(d)
        return time.monotonic() < self.end

    async def node(self, i: int) -> None:
        c = Client(self.port, f"system:node:node-{i}", ("system:nodes", "system:authenticated"))
        body = json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": f"node-{i}", "namespace": "kube-node-lease"},
                           "spec": {"holderIdentity": f"node-{i}", "leaseDurationSeconds": 40}}).encode()
        nxt = self.t0 + self.rng.uniform(0, HEARTBEAT_PERIOD)
        while await self.sleep_until(nxt):
            await self.call("node", c, "PUT", LEASE_PATH + f"node-{i}", HEARTBEAT_TIMEOUT, body)
            nxt = max(nxt + HEARTBEAT_PERIOD, time.monotonic())
        c.close()

    async def controller(self, i: int) -> None:
        c = Client(self.port, f"system:serviceaccount:kube-system:controller-{i}",
                   ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"))
        body = b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}'
        k = 0
        period = self.relist_period
        relist = self.t0 + self.rng.uniform(0, period) if period > 0 else float("inf")
        if not await self.sleep_until(self.t0 + self.rng.uniform(0, CONTROLLER_THINK)):
            return
        while time.monotonic() < self.end:
            if time.monotonic() >= relist:
                # An informer's relist: a cluster-wide LIST of pods.
                await self.call("relist", c, "GET", "/api/v1/pods", STORM_TIMEOUT)
                relist += period
                continue
            k += 1
            path = f"/api/v1/namespaces/ns-{(i * 31 + k) % 1000}/pods/pod-{k % 100}"
            if k % 2:
                await self.call("controller", c, "GET", path, CONTROLLER_TIMEOUT)
            else:
                await self.call("controller", c, "PUT", path, CONTROLLER_TIMEOUT, body)
            await self.sleep_until(time.monotonic() + CONTROLLER_THINK)
        c.close()

    async def user(self, i: int) -> None:
        c = Client(self.port, f"user-{i}", ("system:authenticated",))
        k = 0
        if not await self.sleep_until(self.t0 + self.rng.uniform(0, USER_THINK)):
            return
        while time.monotonic() < self.end:
            k += 1
            ns = f"ns-{(i * 7 + k) % 1000}"
            path = f"/api/v1/namespaces/{ns}/pods" if k % 2 else f"/api/v1/namespaces/{ns}/pods/pod-1"
            await self.call("user", c, "GET", path, USER_TIMEOUT)
            await self.sleep_until(time.monotonic() + USER_THINK)
        c.close()

    async def storm_conn(self, user: str, start: float, period: float) -> None:
        """Cluster-wide LISTs from `start`: back to back (period 0) or one per `period` s."""
        c = Client(self.port, user, ("system:serviceaccounts", "system:serviceaccounts:telemetry",
                                     "system:authenticated"))
        nxt = start
        while await self.sleep_until(nxt):
            status = await self.call("storm", c, "GET", "/api/v1/pods", STORM_TIMEOUT)
            now = time.monotonic()
            nxt = now + STORM_BACKOFF if status != 200 else max(nxt + period, now)
        c.close()

    # -- watch scenarios ---------------------------------------------------------------------
    def informer_set(self, mode: str) -> list[inf.Informer]:
        """Every node's kubelet (its pods, its Node); in reconnect also kube-proxy (Services,
        EndpointSlices) and a DaemonSet agent (all pods) on every node, and each controller's
        informers (all pods, all Nodes)."""
        a = self.args

        def mk(group: str, user: str, groups: tuple[str, ...], path: str, sel: str = "") -> inf.Informer:
            return inf.Informer(self.port, group, user, groups, path, sel, mode, self.rng, self.t0)

        sa = ("system:serviceaccounts", "system:authenticated")
        out = []
        for i in range(a.nodes):
            node, ng = f"node-{i}", ("system:nodes", "system:authenticated")
            out += [mk("kubelet", f"system:node:{node}", ng, "/api/v1/pods", f"spec.nodeName%3D{node}"),
                    mk("kubelet", f"system:node:{node}", ng, "/api/v1/nodes", f"metadata.name%3D{node}")]
            if self.scenario == "watch-leak":
                continue
            kp = ("system:serviceaccount:kube-system:kube-proxy", ("system:serviceaccounts:kube-system", *sa))
            out += [mk("kube-proxy", *kp, "/api/v1/services"),
                    mk("kube-proxy", *kp, "/apis/discovery.k8s.io/v1/endpointslices"),
                    mk("daemonset-agent", "system:serviceaccount:monitoring:node-agent",
                       ("system:serviceaccounts:monitoring", *sa), "/api/v1/pods")]
        if self.scenario != "watch-leak":
            for c in range(a.controllers):
                user, cg = f"system:serviceaccount:kube-system:controller-{c}", ("system:serviceaccounts:kube-system", *sa)
                out += [mk("controller", user, cg, "/api/v1/pods"), mk("controller", user, cg, "/api/v1/nodes")]
        return out

    async def start_informer(self, x: inf.Informer) -> None:
        """Informers synced already: each starts watching from the current resourceVersion
        within the first 2 s."""
        await asyncio.sleep(self.rng.uniform(0, 2.0))
        await x.run(self.start_rv)

    async def dropper(self) -> None:
        """At --calm the stand-in drops every watch (restarted behind its load balancer); the run
        ends 3 s after every informer has synced again (or at the end)."""
        if not await self.sleep_until(self.t0 + self.args.calm):
            return
        self.drop_at = time.monotonic() - self.t0
        dropped = (await asyncio.get_running_loop().run_in_executor(None, self.standin.post,
                                                                    "/__model/drop-watches"))["dropped"]
        log(f"dropped {dropped} watches at {self.drop_at:.1f} s")
        while time.monotonic() < self.end:
            await asyncio.sleep(0.25)
            if all(x.synced_at and x.synced_at[-1] >= self.drop_at for x in self.informers):
                self.end = min(self.end, time.monotonic() + 3.0)
                return

    async def leaker(self) -> None:
        """From --calm: one service account opens --leak-rate watches a second (one namespace's
        pods each, from the current resourceVersion) and never closes nor reads them."""
        ident = ("X-Remote-User: system:serviceaccount:telemetry:leaky-controller\r\n"
                 "X-Remote-Group: system:serviceaccounts\r\nX-Remote-Group: system:serviceaccounts:telemetry\r\n"
                 "X-Remote-Group: system:authenticated\r\n")
        k = 0
        nxt = self.t0 + self.args.calm
        pending: set = set()
        while await self.sleep_until(nxt):
            k += 1
            path = (f"/api/v1/namespaces/ns-{k % 1000}/pods?watch=1&allowWatchBookmarks=true"
                    f"&resourceVersion={self.start_rv}")
            t = asyncio.ensure_future(self.leak_one(inf.Response(self.port, ident), path))
            pending.add(t)
            t.add_done_callback(pending.discard)
            nxt += 1.0 / self.args.leak_rate
        for t in list(pending):
            t.cancel()

    async def leak_one(self, r: inf.Response, path: str) -> None:
        t = time.monotonic()
        try:
            status = await asyncio.wait_for(r.open(path), STORM_TIMEOUT)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError,
                asyncio.LimitOverrunError, IndexError):
            status = 0
        self.records.append(("storm", t - self.t0, time.monotonic() - t, status))
        if status == 200:
            self.leaked.append(r)
        else:
            r.close()

    async def lag_probe(self) -> None:
        """How late the clients' event loop wakes up (is the harness itself the bottleneck?)."""
        self.lags: list[float] = []
        while time.monotonic() < self.end:
            t = time.monotonic()
            await asyncio.sleep(0.1)
            self.lags.append(time.monotonic() - t - 0.1)

    async def run_watches(self, total: float) -> None:
        a = self.args
        self.t0 = time.monotonic()
        self.end = self.t0 + total
        mode = "list" if self.scenario == "reconnect-list" else "watchlist"
        self.informers = self.informer_set(mode)
        infs = [asyncio.ensure_future(self.start_informer(x)) for x in self.informers]
        tasks = [self.node(i) for i in range(a.nodes)]
        tasks += [self.controller(i) for i in range(a.controllers)]
        tasks += [self.user(i) for i in range(a.users)]
        tasks.append(self.leaker() if self.scenario == "watch-leak" else self.dropper())
        tasks.append(self.lag_probe())
        await asyncio.gather(*tasks)
        # Closed first, then cancelled, and waited for with a bound: Python 3.11's
        # asyncio.wait_for can lose a cancellation that races its inner task's completion (the
        # informer would then read a silent watch forever); a closed informer's loop ends.
        for x in self.informers:
            x.close()
        for t in infs:
            t.cancel()
        if infs:
            await asyncio.wait(infs, timeout=10)
        for r in self.leaked:
            r.close()

    async def run(self, total: float) -> None:
        if self.scenario in WATCH_SCENARIOS:
            await self.run_watches(total)
            return
        a = self.args
        self.t0 = time.monotonic()
        self.end = self.t0 + total
        storm_at = self.t0 + a.calm
        tasks = [self.node(i) for i in range(a.nodes)]
        tasks += [self.controller(i) for i in range(a.controllers)]
        tasks += [self.user(i) for i in range(a.users)]
        if self.scenario == "storm":
            tasks += [self.storm_conn("system:serviceaccount:telemetry:collector",
                                      storm_at + k * 0.01, 0.0) for k in range(a.storm_connections)]
        else:
            tasks += [self.storm_conn(f"system:serviceaccount:telemetry:agent-node-{i}",
                                      storm_at + self.rng.uniform(0, a.daemonset_period),
                                      a.daemonset_period) for i in range(a.nodes)]
        await asyncio.gather(*tasks)


# ---------------------------------------------------------------------------------------------
# One gateway
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def summarize(records, model_stats: dict, t_from: float, t_to: float) -> dict:
    """Headline numbers over requests started in [t_from, t_to)."""
    win = [r for r in records if t_from <= r[1] < t_to]
    out: dict = {}
    for cls in CLASSES:
        rs = [r for r in win if r[0] == cls]
        ok = [r for r in rs if r[3] == 200]
        # Latency percentiles over every request, a failed one counting as never served
        # (infinite): "p99 ≤ 1 s" means 99 % of them succeeded within 1 s.
        lat = [r[2] if r[3] == 200 else float("inf") for r in rs]
        out[cls] = {"requests": len(rs), "ok": len(ok), "ok_pct": 100.0 * len(ok) / len(rs) if rs else float("nan"),
                    "p50_s": pct(lat, 0.50), "p99_s": pct(lat, 0.99),
                    "max_s": max(lat, default=float("nan")),
                    "status_429": sum(1 for r in rs if r[3] == 429),
                    "other_failures": sum(1 for r in rs if r[3] not in (200, 429))}
    dur = max(1e-9, t_to - t_from)
    out["goodput_rps"] = sum(1 for r in win if r[3] == 200) / dur
    out["storm_served_per_s"] = out["storm"]["ok"] / dur
    out["peak_memory_gb"] = model_stats["peak_memory_bytes"] / 1e9
    out["peak_in_flight"] = model_stats["peak_in_flight"]
    out["deaths"] = model_stats["deaths"]
    out["death_times"] = model_stats["death_times"]
    return out


def time_series(records, offset: float, seconds: int) -> dict:
    """Per-second buckets (by request start, on the stand-in's clock: + offset): heartbeat
    p50 / p99 / max latency and failures, served requests per class."""
    b: dict = {"t": list(range(seconds)), "hb_p50": [], "hb_p99": [], "hb_max": [], "hb_fail": [],
               **{f"ok_{c}": [] for c in CLASSES}}
    buckets: list[list] = [[] for _ in range(seconds)]
    for r in records:
        k = int(r[1] + offset)
        if 0 <= k < seconds:
            buckets[k].append(r)
    for rs in buckets:
        hb = [r for r in rs if r[0] == "node"]
        lat = [r[2] for r in hb if r[3] == 200]
        b["hb_p50"].append(pct(lat, 0.5))
        b["hb_p99"].append(pct(lat, 0.99))
        b["hb_max"].append(max(lat, default=float("nan")))
        b["hb_fail"].append(sum(1 for r in hb if r[3] != 200))
        for c in CLASSES:
            b[f"ok_{c}"].append(sum(1 for r in rs if r[0] == c and r[3] == 200))
    return b


SAMPLED_FAMILIES = re.compile(
    r"^(apiserver_flowcontrol_(rejected_requests_total|current_inqueue_requests|current_executing_seats|"
    r"current_executing_requests|request_wait_duration_seconds_(sum|count)|dispatched_requests_total|"
    r"nominal_limit_seats|current_limit_seats|demand_seats_smoothed|demand_seats_high_watermark)|"
    r"apf_wasm_watch_initial_hold_timeouts_total|apf_wasm_open_watches)")
DUMP_LEVELS = "/debug/api_priority_and_fairness/dump_priority_levels"


class GatewaySampler:
    """apf-wasm's own view during a run, every `period` s: the APF families of Envoy's
    /stats/prometheus (rejections by level and reason, queued requests, seats in use, waits)
    and the priority-level dump, each sample on the traffic's clock."""

    def __init__(self, env: EnvoyProcess, period: float = 2.0) -> None:
        import threading
        self.env, self.period, self.samples = env, period, []
        self.t0 = time.monotonic()
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self, t0: float) -> "GatewaySampler":
        self.t0 = t0
        self.thread.start()
        return self

    def once(self) -> dict:
        out: dict = {"t": round(time.monotonic() - self.t0, 2), "metrics": {}}
        try:
            split = self.env.cpu_split()
            out["envoy_cpu_s"], out["envoy_workers_s"] = split.get("cpu_s"), split.get("workers_s")
            for ln in self.env.stats_prometheus().splitlines():
                if SAMPLED_FAMILIES.match(ln):
                    k, _, v = ln.rpartition(" ")
                    if float(v) != 0:
                        out["metrics"][k] = float(v)
            gw = self.env.ports["gateway"]
            hdr = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
            st, body = urllib_get(gw, DUMP_LEVELS, hdr)
            out["dump_priority_levels"] = body.decode(errors="replace") if st == 200 else f"status {st}"
        except (OSError, ValueError) as e:
            out["error"] = str(e)
        return out

    def loop(self) -> None:
        while not self.stop_ev.wait(self.period):
            self.samples.append(self.once())

    def stop(self) -> list[dict]:
        self.stop_ev.set()
        self.thread.join(timeout=10)
        return self.samples


def urllib_get(port: int, path: str, headers: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def run_gateway(gateway: str, scenario: str, args, envoy_bin: str, wasm: str | None,
                workdir: Path) -> dict:
    """One gateway against a fresh stand-in: the calm, then the storm. Summary + series."""
    watches = scenario in WATCH_SCENARIOS
    version = scenario_version(scenario, args.apiserver_version)
    model = replace(Model(), apiserver_version=version)
    model = model.scaled(args.nodes) if watches else model
    capacity = ordinary_capacity_rps(model, args.nodes, args.controllers, args.users)
    standin = StandIn(workdir, f"model-{scenario}-{gateway}", nodes=args.nodes if watches else None,
                      version=version)
    seats = apf_seats(gateway, scenario_seats(scenario, args.nodes))
    limits = ({"perFlow": args.watch_per_flow or watch_per_flow(args.nodes, args.controllers)}
              if watches and is_apf(gateway) and args.watch_per_flow >= 0 else None)
    env = None
    try:
        env = EnvoyProcess(envoy_config(gateway, standin.port, wasm, capacity, model, limits,
                                        "0s" if watches else "60s", seats or 600), workdir,
                           envoy_bin=envoy_bin, concurrency=2, name=f"gw-{scenario}-{gateway}",
                           log_level="warning")
        env.start().wait_ready(timeout=60)
        if is_apf(gateway):
            # The first poll of /metrics happens when the configuration is applied; until it
            # succeeds every LIST would cost 1 seat.
            wait_until(lambda: standin.get("/__model/stats")["scrapes"] >= 1, timeout=30,
                       what="apf-wasm's first read of the stand-in's /metrics")
            time.sleep(0.5)  # the scrape's body is parsed after it is served
        start_stats = standin.get("/__model/stats")
        start = start_stats["t"]
        traffic = Traffic(env.ports["gateway"], args, scenario)
        traffic.standin, traffic.start_rv = standin, start_stats["resource_version"]
        traffic.standin_model = model
        sampler = GatewaySampler(env).start(time.monotonic()) \
            if is_apf(gateway) and args.sample_gateway > 0 else None
        if sampler is not None:
            sampler.period = args.sample_gateway
        asyncio.run(traffic.run(args.calm + args.seconds))
        gateway_samples = sampler.stop() if sampler is not None else []
        stats = standin.get("/__model/stats")
        series = standin.get("/__model/series")["series"]
        fatal = env.fatal_log_lines()
        watch_limit_429 = sum(v for k, v in env.stats("rejected").items() if "watch-limit" in k) \
            if limits else 0
    finally:
        if env is not None:
            env.stop()
        standin.stop()
    if fatal:
        raise RuntimeError(f"{gateway}: Envoy reports a fatal filter error:\n" + "\n".join(fatal[-5:]))
    total = min(args.calm + args.seconds, traffic.end - traffic.t0)
    summary = summarize(traffic.records, stats, args.calm, total)
    summary["calm"] = summarize(traffic.records, stats, 0, args.calm)
    if watches:
        summary["watches"] = watch_summary(traffic, stats, series, start, limits, watch_limit_429)
    # The stand-in's samples, on the traffic's clock.
    model_series = [[round(s[0] - start, 2), *s[1:]] for s in series
                    if 0 <= s[0] - start <= total + 1]
    out = {"gateway": gateway, "scenario": scenario, "summary": summary,
           "series": time_series(traffic.records, 0.0, int(total) + 1), "model_series": model_series,
           "capacity_rps": capacity, "model_t0": start, "seats": seats,
           "model": {"cores": model.cores, "memory_limit_bytes": model.memory_limit_bytes,
                     "pods": model.pods, "nodes": model.nodes, "apiserver_version": version}}
    if traffic.informers:
        out["synced_series"] = synced_series(traffic.informers, int(total) + 1)
    if gateway_samples:
        out["gateway_samples"] = gateway_samples
    return out


def watch_summary(traffic: Traffic, stats: dict, series: list, start: float, limits: dict | None,
                  watch_limit_429: int) -> dict:
    """The watch scenarios' numbers: resync after the drop (reconnect), the leaker's watches
    and the stand-in's growth (watch-leak), open watches and the largest flows."""
    drop = traffic.drop_at
    out: dict = {"per_flow_limit": (limits or {}).get("perFlow"), "watch_limit_429": watch_limit_429,
                 "peak_open_watches": stats["peak_open_watches"],
                 "peak_open_watches_by_user": stats["peak_open_watches_by_user"],
                 "initial_events_sent": stats["initial_events_sent"], "gone": stats["gone"],
                 "informers": len(traffic.informers),
                 "client_loop_lag_p99_s": pct(getattr(traffic, "lags", []), 0.99),
                 "client_loop_lag_max_s": max(getattr(traffic, "lags", []), default=float("nan"))}
    if drop == drop:  # reconnect
        firsts = [next((t for t in x.synced_at if t >= drop), None) for x in traffic.informers]
        done = [t - drop for t in firsts if t is not None]
        out["resynced"] = len(done)
        out["never_resynced"] = len(firsts) - len(done)
        out["full_resync_s"] = max(done) if len(done) == len(firsts) and done else float("inf")
        out["groups"] = inf.summary(traffic.informers, drop)
        reqs = [e for x in traffic.informers for e in x.events if e[1] >= drop]
        out["informer_requests"] = len(reqs)
        out["informer_429"] = sum(1 for e in reqs if e[2] == 429)
        out["informer_failed"] = sum(1 for e in reqs if e[2] not in (200, 429))
        ras = sorted(ra for x in traffic.informers for t, ra in x.retry_afters if t >= drop)
        bos = [b for x in traffic.informers for t, b in x.backoffs if t >= drop]
        out["retry_after"] = {"count": len(ras), "p50_s": pct(ras, 0.5), "max_s": max(ras, default=0),
                              "slept_s": sum(ras), "histogram": {str(v): ras.count(v) for v in sorted(set(ras))}}
        out["reflector_backoffs"] = {"count": len(bos), "slept_s": sum(bos), "max_s": max(bos, default=0.0)}
    leak = [r for r in traffic.records if r[0] == "storm"]
    if leak:
        out["leak_opened"] = sum(1 for r in leak if r[3] == 200)
        out["leak_429"] = sum(1 for r in leak if r[3] == 429)
        out["leak_peak_open"] = stats["peak_open_watches_by_user"].get(
            "system:serviceaccount:telemetry:leaky-controller", 0)
        # Growth over the leak's second half (past the ramp to any cap).
        half = traffic.args.calm + (traffic.end - traffic.t0 - traffic.args.calm) / 2
        calm = [s for s in series if s[0] - start <= half]
        window = [s for s in series if s[0] - start <= traffic.end - traffic.t0]
        last = window[-1] if window else series[-1]
        out["to_oom_min"] = float("nan")
        if calm and len(last) > 4:
            dt = max(1e-9, last[0] - calm[-1][0])
            out["memory_growth_gb_per_min"] = (last[2] - calm[-1][2]) / 1e9 / dt * 60
            out["open_watches_growth_per_min"] = (last[4] - calm[-1][4]) / dt * 60
            m = traffic.standin_model
            if out["memory_growth_gb_per_min"] > 0:
                out["to_oom_min"] = (m.memory_limit_bytes - last[2]) / 1e9 / out["memory_growth_gb_per_min"]
        out["informers_synced_at_end"] = sum(1 for x in traffic.informers if x.synced)
        out["informer_resyncs"] = sum(max(0, len(x.synced_at) - 1) for x in traffic.informers)
    return out


def synced_series(informers: list, seconds: int) -> list[int]:
    """Informers synced at each whole second (a dropped watch unsyncs its informer)."""
    out = [0] * seconds
    for x in informers:
        marks = sorted([(t, 1) for t in x.synced_at] + [(t, 0) for t in x.unsynced_at])
        for k in range(seconds):
            state = 0
            for t, v in marks:
                if t > k:
                    break
                state = v
            out[k] += state
    return out


# ---------------------------------------------------------------------------------------------
# Report
def fmt_pct(v: float) -> str:
    if v != v:
        return "–"
    return "100 %" if v == 100 else f"{v:.2f} %" if v >= 99 else f"{v:.1f} %"


def fmt_s(v: float) -> str:
    if v == float("inf"):
        return "failed"
    return "–" if v != v else f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s"


def table(results: list[dict]) -> str:
    lines = ["| gateway | heartbeats ok | heartbeat p50 / p99 | controllers ok | controller relists ok | "
             "users ok | storm LISTs served/s | storm 429s | stand-in peak memory | deaths | goodput req/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["summary"]
        lines.append(
            f"| {r['gateway']} | {fmt_pct(s['node']['ok_pct'])} | {fmt_s(s['node']['p50_s'])} / "
            f"{fmt_s(s['node']['p99_s'])} | {fmt_pct(s['controller']['ok_pct'])} | "
            f"{s['relist']['ok']} of {s['relist']['requests']} | "
            f"{fmt_pct(s['user']['ok_pct'])} | {s['storm_served_per_s']:.2f} | "
            f"{s['storm']['status_429']} | {s['peak_memory_gb']:.0f} GB | {s['deaths']} | "
            f"{s['goodput_rps']:.0f} |")
    return "\n".join(lines)


def watch_table(results: list[dict], scenario: str) -> str:
    if scenario == "watch-leak":
        lines = ["| gateway | leaker's watches opened / refused (429) | leaker's watches open at the stand-in, peak | "
                 "open watches growth / min | stand-in memory growth / min | peak memory | deaths | "
                 "heartbeats ok | controllers ok | users ok | kubelet informers synced at the end |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in results:
            s, w = r["summary"], r["summary"]["watches"]
            lines.append(
                f"| {r['gateway']} | {w.get('leak_opened', 0)} / {w.get('leak_429', 0)} | {w.get('leak_peak_open', 0)}"
                + (f" (cap {w['per_flow_limit']})" if w["per_flow_limit"] else "")
                + f" | {w.get('open_watches_growth_per_min', float('nan')):.0f} | "
                f"{w.get('memory_growth_gb_per_min', float('nan')):.2f} GB"
                + (f" (limit in {w['to_oom_min']:.0f} min)" if w.get("to_oom_min", float("nan")) == w.get("to_oom_min") else "")
                + f" | {s['peak_memory_gb']:.1f} GB | "
                f"{s['deaths']} | {fmt_pct(s['node']['ok_pct'])} | {fmt_pct(s['controller']['ok_pct'])} | "
                f"{fmt_pct(s['user']['ok_pct'])} | {w.get('informers_synced_at_end', 0)} of {w['informers']} |")
        return "\n".join(lines)
    lines = ["| gateway | time to full resync | informers resynced | kubelet p50 / max | kube-proxy p50 / max | "
             "DaemonSet agent p50 / max | controller informers p50 / max | informer 429s | informer failures | "
             "heartbeats ok | controllers ok | peak memory | deaths | peak open watches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s, w = r["summary"], r["summary"]["watches"]
        g = w.get("groups", {})

        def pm(name: str) -> str:
            x = g.get(name)
            return "–" if not x else f"{fmt_s(x['p50_s'])} / {fmt_s(x['max_s'])}"
        full = w.get("full_resync_s", float("inf"))
        lines.append(
            f"| {r['gateway']} | {'never (' + str(w.get('never_resynced')) + ' left)' if full == float('inf') else fmt_s(full)} | "
            f"{w.get('resynced', 0)} of {w['informers']} | {pm('kubelet')} | {pm('kube-proxy')} | "
            f"{pm('daemonset-agent')} | {pm('controller')} | {w.get('informer_429', 0)} | {w.get('informer_failed', 0)} | "
            f"{fmt_pct(s['node']['ok_pct'])} | {fmt_pct(s['controller']['ok_pct'])} | {s['peak_memory_gb']:.1f} GB | "
            f"{s['deaths']} | {w['peak_open_watches']} |")
    return "\n".join(lines)


def write_watch_results(results: list[dict], scenario: str, args, envoy_version: str, out: Path) -> None:
    m = results[0]["model"]
    what = ("one service account opens watches at "
            f"{args.leak_rate:g}/s from {args.calm:g} s for {args.seconds:g} s and never closes them; "
            f"{args.nodes} nodes' heartbeats and kubelet informers, {args.controllers} controllers, "
            f"{args.users} users" if scenario == "watch-leak" else
            f"every watch dropped at {args.calm:g} s (the stand-in restarted behind its load balancer); "
            f"{args.nodes} nodes (kubelet: pods on its node, its Node; kube-proxy: Services, EndpointSlices; "
            f"a DaemonSet agent: all pods), {args.controllers} controllers (all pods, all Nodes), "
            + ("WatchList clients (sendInitialEvents=true)" if scenario == "reconnect-watchlist"
               else "LIST + WATCH clients (RV=0 LIST, then a watch from its RV)")
            + f"; up to {args.seconds:g} s to resync")
    per_flow = next((r["summary"]["watches"]["per_flow_limit"] for r in results
                     if r["summary"]["watches"]["per_flow_limit"]), None)
    seats = scenario_seats(scenario, args.nodes)
    header = (f"Scenario {scenario}: Envoy {envoy_version} (2 workers), each gateway against a fresh stand-in "
              f"scaled to {args.nodes} nodes ({m['cores']:g} cores, {m['memory_limit_bytes'] / 1e9:g} GB, "
              f"{m['pods']} pods; kube-apiserver {m.get('apiserver_version', '1.30')}'s LISTs); {what}."
              + f" apf-wasm: the default policy at {seats} seats (kube-up's for {args.nodes} nodes)"
              + (f" with watchLimits.perFlow {per_flow}." if per_flow else ".")
              + "".join(f" {g}: the same with serverConcurrencyLimit {apf_seats(g)}." for g in
                        dict.fromkeys(r["gateway"] for r in results) if "@" in g and is_apf(g))
              + " Heartbeats and controllers over the window from "
              + ("the leak's start" if scenario == "watch-leak" else "the drop") + " to the end.\n")
    write_results(out, scenario, header, watch_table(results, scenario), results, args,
                  lambda png: plot_watches(results, scenario, png, args, plot_title(results, scenario, args)))


def plot_title(results: list[dict], scenario: str, args) -> str:
    m = results[0]["model"]
    scale = (f"stand-in and cluster scaled to {args.nodes} nodes: {m['cores']:g} cores, "
             f"{m['memory_limit_bytes'] / 1e9:g} GB, {m['pods']} pods")
    if scenario == "watch-leak":
        return (f"From {args.calm:g} s (dotted): one service account opens {args.leak_rate:g} watches/s, "
                f"never closes them\n{scale}")
    how = "WatchList (sendInitialEvents=true)" if scenario == "reconnect-watchlist" else "LIST (RV=0) + WATCH"
    return (f"At {args.calm:g} s (dotted) every watch is dropped; {len(results) and results[0]['summary']['watches']['informers']} "
            f"informers resync by {how}\n{scale}")


def plot_watches(results: list[dict], scenario: str, path: Path, args, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    leak = scenario == "watch-leak"
    # Open watches at the stand-in: the fifth column of its samples (absent in older results).
    has_open = any(len(s) > 4 for r in results for s in r["model_series"])
    fig, axes = plt.subplots(4 if has_open else 3, 1, figsize=(10, 11 if has_open else 8.5), sharex=True)
    if not has_open:
        axes = [axes[0], axes[1], None, axes[2]]
    for r in results:
        g, color = r["gateway"], COLORS.get(r["gateway"], "#17becf" if is_apf(r["gateway"]) else None)
        t = [x + 0.5 for x in r["series"]["t"]]
        ms = r["model_series"]
        axes[0].plot(t, r["series"]["hb_p99"], color=color, label=g, lw=1.4)
        axes[1].plot([s[0] for s in ms], [s[2] / 1e9 for s in ms], color=color, label=g, lw=1.4)
        if has_open:
            axes[2].plot([s[0] for s in ms], [s[4] if len(s) > 4 else 0 for s in ms], color=color, label=g, lw=1.4)
        if leak:
            axes[3].plot(t, r["series"]["ok_storm"], color=color, label=g, lw=1.2)
        elif "synced_series" in r:
            n = max(1, r["summary"]["watches"]["informers"])
            axes[3].plot(range(len(r["synced_series"])), [100 * v / n for v in r["synced_series"]],
                         color=color, label=g, lw=1.4)
        deaths = [d - r["model_t0"] for d in r["summary"]["death_times"]]
        axes[1].plot(deaths, [r["model"]["memory_limit_bytes"] / 1e9] * len(deaths), "x", color=color, ms=7)
    lim = results[0]["model"]["memory_limit_bytes"] / 1e9
    axes[0].set_yscale("log")
    axes[0].set_ylabel("heartbeat latency, s\n(p99 of those served,\nper second)")
    axes[1].axhline(lim, color="black", ls="--", lw=0.8)
    axes[1].set_ylabel("stand-in memory, GB\n(OOM kill: x)")
    if has_open:
        axes[2].set_ylabel("open watches\nat the stand-in")
    axes[3].set_ylabel("leaker's watches\nopened per second" if leak else "informers synced, %")
    axes[3].set_xlabel("seconds")
    axes = [ax for ax in axes if ax is not None]
    for ax in axes:
        ax.axvline(args.calm, color="black", ls=":", lw=0.8)
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title, fontsize=9)
    axes[0].legend(loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot(results: list[dict], scenario: str, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = Model()
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1.6, 3, 3]})
    for r in results:
        g, color = r["gateway"], COLORS.get(r["gateway"], "#17becf" if is_apf(r["gateway"]) else None)
        t = [x + 0.5 for x in r["series"]["t"]]
        axes[0].plot(t, r["series"]["hb_p99"], color=color, label=g, lw=1.4)
        axes[1].plot(t, r["series"]["hb_fail"], color=color, label=g, lw=1.2)
        ms = r["model_series"]
        axes[2].plot([s[0] for s in ms], [s[2] / 1e9 for s in ms], color=color, label=g, lw=1.4)
        axes[3].plot([s[0] for s in ms], [s[1] for s in ms], color=color, label=g, lw=1.2)
        deaths = [d - r["model_t0"] for d in r["summary"]["death_times"]]
        axes[2].plot(deaths, [m.memory_limit_bytes / 1e9] * len(deaths), "x", color=color, ms=7)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("heartbeat latency, s\n(p99 of those served,\nper second)")
    axes[0].axhline(1.0, color="black", ls=":", lw=0.8)
    axes[1].set_ylabel("heartbeats\nfailed per second")
    axes[2].axhline(m.memory_limit_bytes / 1e9, color="black", ls="--", lw=0.8)
    axes[2].text(0.5, m.memory_limit_bytes / 1e9, " memory limit (OOM kill: x)", va="bottom", fontsize=8)
    axes[2].set_ylabel("stand-in memory, GB")
    axes[3].set_ylabel("requests in flight\nat the stand-in")
    axes[3].set_xlabel("seconds")
    for ax in axes:
        ax.axvspan(args.calm, args.calm + args.seconds, color="#f2d0d0", alpha=0.25, lw=0)
        ax.grid(True, alpha=0.3)
    what = ("one service account LISTing all pods from "
            f"{args.storm_connections} connections" if scenario == "storm" else
            f"{args.nodes} identities (a DaemonSet) each LISTing all pods every {args.daemonset_period:g} s")
    axes[0].set_title(f"Storm from {args.calm:g} s (shaded): {what}\n{args.nodes} nodes' heartbeats, "
                      f"{args.controllers} controllers"
                      + (f" (a relist every {args.relist_period:g} s)" if args.relist_period > 0 else "")
                      + f", {args.users} users; stand-in "
                      f"{m.cores:g} cores, {m.memory_limit_bytes / 1e9:g} GB, {m.pods // 1000}k pods",
                      fontsize=10)
    axes[0].legend(loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Setup
def write_results(out: Path, scenario: str, header: str, tab: str, results: list[dict], args,
                  draw) -> None:
    """Prints a scenario's table and writes protection-SCENARIO.{md,json} and, unless --no-plot,
    the picture `draw(png_path)` makes."""
    print(header)
    print(tab)
    print()
    (out / f"protection-{scenario}.md").write_text(header + "\n" + tab + "\n")
    (out / f"protection-{scenario}.json").write_text(json.dumps(
        {"args": dict(vars(args)), "results": results}, default=str))
    if not args.no_plot:
        draw(out / f"protection-{scenario}.png")
        log(f"wrote {out / f'protection-{scenario}.png'}")


def in_repo_venv() -> bool:
    return Path(sys.prefix).resolve() == (REPO / ".venv").resolve()


def ensure_venv_and_reexec() -> None:
    """Re-run under the repo's .venv Python (scripts/envoy-env.sh creates it) so that matplotlib
    can be installed there without touching the system Python."""
    if in_repo_venv():
        return
    py = REPO / ".venv" / "bin" / "python"
    if not py.exists():
        subprocess.run([str(REPO / "scripts" / "envoy-env.sh")], check=True, stdout=subprocess.DEVNULL)
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]])


def ensure_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("installing matplotlib into the .venv (pip)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "matplotlib"], check=True, stdout=sys.stderr)


def envoy_binary() -> str:
    if os.environ.get("ENVOY_BIN"):
        return os.environ["ENVOY_BIN"]
    out = subprocess.run([str(REPO / "scripts" / "envoy-env.sh")], check=True, text=True,
                         stdout=subprocess.PIPE).stdout
    return out.strip().splitlines()[-1] if out.strip() else find_envoy()


def apf_module(arg: str | None) -> str:
    if arg or os.environ.get("APF_WASM"):
        return arg or os.environ["APF_WASM"]
    out = subprocess.run(["nice", "-n", "10", str(REPO / "wasm-build.sh")], check=True, text=True,
                         stdout=subprocess.PIPE, cwd=REPO).stdout
    return out.strip().splitlines()[-1]


def parse_args(argv: list[str] | None = None):
    class Fmt(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Fmt)
    ap.add_argument("--scenario", default="storm,daemonset",
                    help=f"comma-separated scenarios: {', '.join(SCENARIOS)}; reconnect = both "
                         "reconnect variants")
    ap.add_argument("--gateways", default=",".join(GATEWAYS),
                    help="comma-separated gateways, run in this order")
    ap.add_argument("--seconds", type=float, default=60.0, help="the storm's length per gateway")
    ap.add_argument("--calm", type=float, default=10.0, help="seconds of ordinary traffic before the storm")
    ap.add_argument("--nodes", type=int, default=1000, help="kubelets renewing a lease every 10 s")
    ap.add_argument("--controllers", type=int, default=20, help="kube-system service accounts")
    ap.add_argument("--relist-period", type=float, default=60.0,
                    help="seconds between a controller's relists (cluster-wide LISTs of pods; "
                         "0: none)")
    ap.add_argument("--users", type=int, default=10, help="ordinary users")
    ap.add_argument("--storm-connections", type=int, default=50,
                    help="scenario storm: the runaway service account's connections")
    ap.add_argument("--daemonset-period", type=float, default=30.0,
                    help="scenario daemonset: seconds between one agent's LISTs")
    ap.add_argument("--leak-rate", type=float, default=100.0,
                    help="scenario watch-leak: watches the leaking service account opens per second")
    ap.add_argument("--watch-per-flow", type=int, default=0,
                    help="watch scenarios: apf-wasm's watchLimits.perFlow (0: 1.2 × the largest "
                         "informer flow of reconnect, 2 × nodes + 2 × controllers; -1: no watchLimits)")
    ap.add_argument("--apiserver-version", default="",
                    help="the kube-apiserver version the stand-in models (bench/apiserver_model.py: "
                         "Model.apiserver_version); empty: 1.34 for the watch scenarios, 1.30 for "
                         "storm and daemonset")
    ap.add_argument("--sample-gateway", type=float, default=2.0,
                    help="apf-wasm: seconds between samples of its APF metrics and priority-level "
                         "dump, kept in the JSON (0: none)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="output directory")
    ap.add_argument("--apf-wasm", help="the apf-wasm module (default: APF_WASM, else ./wasm-build.sh)")
    ap.add_argument("--no-plot", action="store_true", help="no PNG (and no matplotlib install)")
    ap.add_argument("--replot", action="store_true",
                    help="watch scenarios: redraw the PNG from --out's protection-SCENARIO.json, no run")
    args = ap.parse_args(argv)
    args.scenarios = [x for s in args.scenario.split(",") if s.strip()
                      for x in ALIASES.get(s.strip(), [s.strip()])]
    args.gateway_list = [g.strip() for g in args.gateways.split(",") if g.strip()]
    for s in args.scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s}")
    for g in args.gateway_list:
        if g not in GATEWAYS and not (g.startswith("apf-wasm@") and g.partition("@")[2].isdigit()):
            ap.error(f"unknown gateway {g}")
    return args


def main() -> int:
    args = parse_args()
    if args.replot:
        ensure_venv_and_reexec()
        for scenario in args.scenarios:
            d = json.loads((Path(args.out) / f"protection-{scenario}.json").read_text())
            a = argparse.Namespace(**{**vars(args), **{k: d["args"][k] for k in
                                                       ("calm", "nodes", "leak_rate", "seconds")}})
            plot_watches(d["results"], scenario, Path(args.out) / f"protection-{scenario}.png", a,
                         plot_title(d["results"], scenario, a))
        return 0
    if not args.no_plot:
        ensure_venv_and_reexec()
        ensure_matplotlib()
    envoy_bin = envoy_binary()
    wasm = apf_module(args.apf_wasm) if any(is_apf(g) for g in args.gateway_list) else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="apf-protection-"))
    ver = subprocess.run([envoy_bin, "--version"], capture_output=True, text=True).stdout
    mv = re.search(r"/(\d+\.\d+\.\d+)/", ver)
    envoy_version = mv.group(1) if mv else "?"
    for scenario in args.scenarios:
        results = []
        for gw in args.gateway_list:
            log(f"{scenario} / {gw}: {args.calm:g} s calm + {args.seconds:g} s storm")
            r = run_gateway(gw, scenario, args, envoy_bin, wasm, work)
            s = r["summary"]
            if "watches" in s:
                log(f"{scenario} / {gw}: {json.dumps(s['watches'], default=str)[:600]}")
            log(f"{scenario} / {gw}: heartbeats ok {fmt_pct(s['node']['ok_pct'])} p99 "
                f"{fmt_s(s['node']['p99_s'])}, controllers ok {fmt_pct(s['controller']['ok_pct'])}, "
                f"storm served {s['storm']['ok']} (429: {s['storm']['status_429']}), peak memory "
                f"{s['peak_memory_gb']:.0f} GB, deaths {s['deaths']}")
            results.append(r)
        if scenario in WATCH_SCENARIOS:
            write_watch_results(results, scenario, args, envoy_version, out)
            continue
        m = Model()
        header = (f"Scenario {scenario}: Envoy {envoy_version} (2 workers), {args.calm:g} s calm then "
                  f"{args.seconds:g} s storm per gateway, each against a fresh stand-in ({m.cores:g} "
                  f"cores, {m.memory_limit_bytes / 1e9:g} GB, {m.pods} pods); {args.nodes} nodes, "
                  f"{args.controllers} controllers ("
                  + (f"a relist every {args.relist_period:g} s each), " if args.relist_period > 0
                     else "no relists), ")
                  + f"{args.users} users; "
                  + (f"storm: one service account, {args.storm_connections} connections"
                     if scenario == "storm" else
                     f"storm: {args.nodes} identities, one LIST each every {args.daemonset_period:g} s")
                  + f". ratelimit bucket {results[0]['capacity_rps']:.0f} req/s. Figures over the storm window.\n")
        write_results(out, scenario, header, table(results), results, args,
                      lambda png: plot(results, scenario, png, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
