#!/usr/bin/env python3
"""CPU cost per request of apf-wasm in Envoy, against baselines measured in the same run.

Variants (interleaved, repeated for --rounds; medians reported):
  none             Envoy, router only
  passthrough      a proxy-wasm module that does nothing (bench/passthrough)
  floor            the floor module (../shared/bench/floor-module): the host calls APF cannot avoid
  local_ratelimit  Envoy's native local rate limit (bucket too big to ever limit)
  apf              apf-wasm, default policy, uncontended
  apf-saturated    apf-wasm, an 8-seat level (--saturated-seats) with 64 connections
                   (--saturated-connections): requests queue, 56 waiting at any time;
                   run with 1 and with 2 workers; with it, in the same shape, the reference
                   bench/localqueue (the floor's host calls + a per-worker seat limit and FIFO
                   with pause/resume: no shared state, no cross-worker wake-ups; all the seats
                   with 1 worker, half per worker with 2), so that apf ÷ localqueue at each worker
                   count isolates the cost of APF's logic and global state from what splitting
                   a paused-and-resumed pipeline over two Envoy workers costs by itself; and,
                   with 2 workers, the no-sharing control isolated-saturated: the same filter
                   built as bench/isolated (each worker keys its levels apart: same code,
                   nothing shared, half the seats each), so that apf ÷ it is
                   what sharing the level across workers costs; with --localqueue-global also
                   lq-global, localqueue with global seats (one seat count and FIFO in a shared
                   value, cross-worker hand-offs), whose ratio to localqueue with 2 workers is
                   what a global seat pool costs on this host by itself. By default the upstream answers
                   at once and the gateway is CPU-bound; with --upstream-delay-ms D it holds
                   each response D ms, as an apiserver does, so the level (8 seats / D) limits
                   the rate and every variant serves the same req/s with CPU to spare
  native-floor     the floor module's host calls as an Envoy dynamic module (bench/native-floor):
                   the same reads, CAS and headers in process memory; ÷ floor is what the wasm
                   host costs
  apf-native       apf-wasm's native host (a dynamic module: --apf-native, $APF_NATIVE or
                   ./native-build.sh; skipped when none is there), default policy, uncontended
  apf-native-saturated  the native host in apf-saturated's shape, 1 and 2 workers, and its
                   no-sharing control isolated-native-saturated (each worker on a level of its
                   own, half the seats: the feature native-isolated-levels, or
                   --apf-native-isolated)
  apf-fleet        apf-wasm, default policy, uncontended, in fleet mode (one replica, a local
                   etcd from Debian's etcd-server): ÷ apf is what the fleet's driver costs
  apf-flows        apf-wasm, default policy, uncontended, each request from one of K users
                   (K = 10, 1000, 100000; --flow-counts): cost per request vs flows seen
  apf-noisy        not a CPU measurement: a saturated 18-seat level (Python upstream, 50 ms ± 20 %
                   per request), 2 equal heavy flows (closed loops, 20 connections each), a quiet
                   closed-loop flow (4 connections, also measured alone in the same round) and an
                   open-loop quiet flow (10 req/s); reports throughput per flow, Jain's fairness
                   index over the heavy flows, the closed-loop quiet flow's throughput kept and
                   queue waits, and the open-loop flow's served share (second table)
Measure: Envoy's CPU time (utime+stime of the process, /proc/PID/stat) over a fixed number of
requests after a warm-up, divided by the requests Envoy counted (downstream_rq_total delta).
The upstream is a second Envoy answering with a direct_response (fast, not measured).
The load generator and the upstream run under SCHED_IDLE (chrt; --load-priority normal to
turn off) so that on a small machine they do not preempt the measured Envoy's workers (whose
CPU time would then include the cost of being switched out).
Load generator: wrk (installed from Debian if missing and we are root), else a Python client.

Usage: python3 bench/run.py [--requests N] [--rounds R] [--variants a,b] [--workers W] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the shared harness, apfkit/

from apfkit import apf_policy  # noqa: E402
from apfkit.envoy_template import direct_response_config, gateway_config  # noqa: E402
from apfkit.envoyproc import EnvoyProcess, find_envoy  # noqa: E402
from apfkit.etcdproc import Etcd  # noqa: E402
from bench.native import (build_native_floor, build_native_isolated,  # noqa: E402
                          dynamic_module_filter, find_apf_native, module_env)
from bench.noisy import measure_noisy, noisy_section, round_line  # noqa: E402

HEADERS = {"X-Remote-User": "bench-user", "X-Remote-Group": "system:authenticated"}
# Variants whose windows also read the filter's global-state contention counters.
COUNTED = ("apf-saturated", "apf-saturated-b", "isolated-saturated", "apf-native-saturated",
           "isolated-native-saturated")
# Set by main(): run the load generator / upstream under SCHED_IDLE.
IDLE_LOAD = [False]


def idle_cmd(cmd: list[str]) -> list[str]:
    return ["chrt", "-i", "0"] + cmd if IDLE_LOAD[0] else cmd


def make_idle(pid: int) -> None:
    if not IDLE_LOAD[0]:
        return
    for t in os.listdir(f"/proc/{pid}/task"):
        subprocess.run(["chrt", "-i", "-p", "0", t], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
PATH = "/api/v1/namespaces/default/pods"
RQ_TOTAL = "http.apf_gateway.downstream_rq_total"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Modules
def target_dir() -> Path:
    t = os.environ.get("CARGO_TARGET_DIR")
    return Path(t) if t else REPO / "target"


def cargo_wasm(manifest: Path, tdir: Path, name: str) -> Path:
    env = dict(os.environ, CARGO_TARGET_DIR=str(tdir))
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip1", "--manifest-path",
                    str(manifest)], check=True, env=env, stdout=sys.stderr)
    return tdir / "wasm32-wasip1" / "release" / f"{name}.wasm"


def floor_dir(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [REPO.parent / "shared/bench/floor-module",
                                     Path("/work/shared/bench/floor-module")]
    for c in cands:
        if (c / "Cargo.toml").exists():
            return c
    raise SystemExit(f"floor module not found in {cands} (use --floor-dir)")


def wasm_build(tdir: Path | None, features: str | None) -> Path:
    """./wasm-build.sh (into `tdir` if given, with cargo `features` if given): the module."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(tdir)) if tdir else None
    cmd = [str(REPO / "wasm-build.sh")] + (["--features", features] if features else [])
    out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, cwd=REPO, env=env).stdout
    return Path(out.strip().splitlines()[-1])


def build_modules(args) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    want = set(args.variants)
    if "floor" in want or args.ratio_base == "floor":
        # The floor module's own folder is read-only: build into our target dir.
        mods["floor"] = cargo_wasm(floor_dir(args.floor_dir) / "Cargo.toml",
                                   target_dir() / "bench-floor", "floor")
    if "apf-saturated" in want:
        mods["localqueue"] = cargo_wasm(REPO / "bench/localqueue/Cargo.toml",
                                        target_dir() / "bench-localqueue", "localqueue")
        # The no-sharing control: the same filter over a store that keys each worker's levels
        # apart (bench/isolated).
        mods["apf-isolated"] = cargo_wasm(REPO / "bench/isolated/Cargo.toml",
                                          target_dir() / "bench-isolated", "apf_isolated")
    if "passthrough" in want:
        mods["passthrough"] = cargo_wasm(REPO / "bench/passthrough/Cargo.toml",
                                         target_dir() / "bench-passthrough", "passthrough")
    mods.update(native_modules(args, want))
    if want & {"apf", "apf-saturated", "apf-flows", "apf-noisy"}:
        if args.apf_wasm:
            mods["apf"] = Path(args.apf_wasm)
        else:
            mods["apf"] = wasm_build(None, None)
    return mods


def native_modules(args, want: set[str]) -> dict[str, Path]:
    """The dynamic modules the native variants load. Without an apf-native module its variants
    are dropped from args.variants (find_apf_native says why)."""
    mods: dict[str, Path] = {}
    if "native-floor" in want:
        mods["native-floor"] = build_native_floor(target_dir() / "bench-native-floor")
    if want & {"apf-native", "apf-native-saturated"}:
        so = find_apf_native(args.apf_native)
        if so is None:
            args.variants = [v for v in args.variants if not v.startswith("apf-native")]
        else:
            mods["apf-native"] = so
    if "apf-native-saturated" in want and "apf-native" in mods:
        iso = args.apf_native_isolated or os.environ.get("APF_NATIVE_ISOLATED")
        mods["apf-native-isolated"] = (Path(iso) if iso else
                                       build_native_isolated(target_dir() / "bench-native-isolated"))
    return mods


# ---------------------------------------------------------------------------------------------
# Load generators
def ensure_wrk(allow_install: bool) -> str | None:
    w = shutil.which("wrk")
    if w or not allow_install or os.geteuid() != 0:
        return w
    log("installing wrk (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return shutil.which("wrk")


WRK_LUA = r"""
-- Each wrk thread stops after LIMIT responses (a fixed request count instead of a duration)
-- and drops a marker file so that the driver can end wrk without polling Envoy.
local limit = LIMIT
local count = 0
local marker = "MARKER"
local nthreads = 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end
USERS_FN
function response(status, headers, body)
  count = count + 1
  if count == limit then
    local f = io.open(marker .. tostring(wrk.thread:get("tid")), "w")
    if f then f:close() end
    wrk.thread:stop()
  end
end
"""

# With K users: every request carries `X-Remote-User: flow-<i>`, i cycling through K values
# (each thread starts at a different offset), so the level sees K distinct flows.
WRK_USERS = r"""
local users = USERS
local i = 0
function init(args)
  i = (wrk.thread:get("tid") or 0) * 7919
end
function request()
  i = i + 1
  return wrk.format(nil, nil, {["X-Remote-User"] = "flow-" .. tostring(i % users),
                               ["X-Remote-Group"] = "system:authenticated"})
end
"""


def _unit(v: str, u: str) -> float:
    """wrk latency value → milliseconds."""
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}.get(u, 1.0)


def run_wrk(wrk: str, port: int, n: int, conns: int, threads: int, workdir: Path,
            counter, users: int | None = None) -> dict:
    """wrk until `n` requests are done. wrk only ends at its duration or on SIGINT (a Lua
    thread:stop() does not end the run), so: each thread stops after n/threads responses, and we
    SIGINT wrk once Envoy has counted n more requests (`counter()`)."""
    import signal

    per_thread = max(1, n // threads)
    script = workdir / "limit.lua"
    marks = workdir / "wrk-done"
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir()
    users_fn = WRK_USERS.replace("USERS", str(users)) if users else ""
    script.write_text(WRK_LUA.replace("LIMIT", str(per_thread)).replace("MARKER", f"{marks}/t")
                      .replace("USERS_FN", users_fn))
    cmd = idle_cmd([wrk, "-t", str(threads), "-c", str(conns), "-d", "600s", "--latency",
                    "--timeout", "30s", "-s", str(script)])
    for k, v in HEADERS.items():
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(f"http://127.0.0.1:{port}{PATH}")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    # Wait for every thread's marker (filesystem polling costs Envoy nothing); as a safety net,
    # check Envoy's counter for stalls every few seconds.
    last, last_check = counter(), time.monotonic()
    while p.poll() is None and time.monotonic() < deadline:
        if len(list(marks.iterdir())) >= threads:
            break
        if time.monotonic() - last_check > 5:
            now = counter()
            if now == last:
                break  # stalled
            last, last_check = now, time.monotonic()
        time.sleep(0.02)
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    res: dict = {}
    m = re.search(r"50%\s+([\d.]+)(us|ms|s|m)\b", out)
    if m:
        res["p50_ms"] = _unit(*m.groups())
    m = re.search(r"99%\s+([\d.]+)(us|ms|s|m)\b", out)
    if m:
        res["p99_ms"] = _unit(*m.groups())
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    res["non2xx"] = int(m.group(1)) if m else 0
    return res


def run_python(port: int, n: int, conns: int, users: int | None = None) -> dict:
    import http.client

    lat: list[float] = []
    non2xx = [0]
    lock = threading.Lock()
    per = max(1, n // conns)

    def worker(w: int):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine, bad = [], 0
        for k in range(per):
            t = time.perf_counter()
            hdrs = HEADERS if not users else dict(HEADERS, **{
                "X-Remote-User": f"flow-{(w * 7919 + k) % users}"})
            try:
                c.request("GET", PATH, headers=hdrs)
                r = c.getresponse()
                r.read()
                if r.status >= 300:
                    bad += 1
            except Exception:  # noqa: BLE001
                bad += 1
                c.close()
            mine.append(time.perf_counter() - t)
        c.close()
        with lock:
            lat.extend(mine)
            non2xx[0] += bad

    ts = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    lat.sort()
    res: dict = {"non2xx": non2xx[0]}
    if lat:
        res["p50_ms"] = lat[len(lat) // 2] * 1e3
        res["p99_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
    return res


# ---------------------------------------------------------------------------------------------
# Variants
def variant_specs(args, mods) -> list[dict]:
    roomy = apf_policy.plugin_config()
    specs = []
    w = args.workers
    for v in args.variants:
        if v == "none":
            specs.append(dict(name="none", workers=w, http_filter="none", conns=args.connections))
        elif v == "passthrough":
            specs.append(dict(name="passthrough", workers=w, http_filter="wasm",
                              wasm=mods["passthrough"], cfg={}, conns=args.connections))
        elif v == "floor":
            specs.append(dict(name="floor", workers=w, http_filter="wasm", wasm=mods["floor"],
                              cfg={}, conns=args.connections))
        elif v == "local_ratelimit":
            specs.append(dict(name="local_ratelimit", workers=w, http_filter="local_ratelimit",
                              conns=args.connections))
        elif v == "apf":
            specs.append(dict(name="apf", workers=w, http_filter="wasm", wasm=mods["apf"],
                              cfg=roomy, conns=args.connections))
            if args.apf_wasm_b:
                specs.append(dict(name="apf-b", workers=w, http_filter="wasm", wasm=args.apf_wasm_b,
                                  cfg=roomy, conns=args.connections))
        elif v == "native-floor":
            specs.append(dict(name="native-floor", workers=w, http_filter="native",
                              native=mods["native-floor"], cfg={}, conns=args.connections))
        elif v == "apf-native":
            specs.append(dict(name="apf-native", workers=w, http_filter="native",
                              native=mods["apf-native"], cfg=roomy, conns=args.connections))
            if args.apf_native_b:
                specs.append(dict(name="apf-native-b", workers=w, http_filter="native",
                                  native=Path(args.apf_native_b), cfg=roomy, conns=args.connections))
            for name, so in also_modules(args.apf_native_also):
                specs.append(dict(name=f"apf-native-{name}", workers=w, http_filter="native",
                                  native=Path(so), cfg=roomy, conns=args.connections))
        elif v == "apf-native-saturated":
            specs.extend(native_saturated_specs(args, mods))
        elif v == "apf-fleet":
            # Fleet mode with the same policy (one replica, so all its seats are this one's):
            # what the fleet's driver costs beside the request path. ÷ the apf variant.
            fleet = dict(roomy, fleet={"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "5s"})
            specs.append(dict(name="apf-fleet", workers=w, http_filter="wasm", wasm=mods["apf"],
                              cfg=fleet, conns=args.connections, etcd=True))
        elif v == "apf-flows":
            for k in args.flow_counts:
                specs.append(dict(name=f"apf-flows K={k}", workers=w, http_filter="wasm",
                                  wasm=mods["apf"], cfg=roomy, conns=args.connections, users=k))
        elif v == "apf-noisy":
            continue  # measured separately (measure_noisy)
        elif v == "apf-saturated":
            specs.extend(saturated_specs(args, mods))
        else:
            raise SystemExit(f"unknown variant {v}")
    return specs


def saturated_specs(args, mods) -> list[dict]:
    """apf-saturated with 1 and 2 workers and its references: localqueue, the no-sharing
    control, and on request the second module, the shared-value and global-seat variants."""
    saturated = apf_policy.single_level_config(args.saturated_seats, group="system:authenticated", queues=16,
                                               hand_size=4, queue_length_limit=100)
    specs = []
    for sw in (1, 2):
        specs.append(dict(name="apf-saturated", workers=sw, http_filter="wasm",
                          wasm=mods["apf"], cfg=saturated, conns=args.saturated_connections))
        if args.apf_wasm_b:
            specs.append(dict(name="apf-saturated-b", workers=sw, http_filter="wasm",
                              wasm=args.apf_wasm_b, cfg=saturated,
                              conns=args.saturated_connections))
    # No-sharing control, 2 workers: the same code with each worker on a level of its
    # own holding half the seats (as localqueue), so apf ÷ it is what sharing costs.
    specs.append(dict(name="isolated-saturated", workers=2, http_filter="wasm",
                      wasm=mods["apf-isolated"], conns=args.saturated_connections,
                      cfg=apf_policy.single_level_config(
                          max(1, args.saturated_seats // 2), group="system:authenticated",
                          queues=16, hand_size=4, queue_length_limit=100)))
    for sw in (1, 2):
        specs.append(dict(name="localqueue-saturated", workers=sw, http_filter="wasm",
                          wasm=mods["localqueue"], cfg=str(max(1, args.saturated_seats // sw)),
                          conns=args.saturated_connections))
    if args.localqueue_value_bytes:
        # The host's part of sharing: localqueue bumping a value of apf's size on one
        # key (both workers) and on a key per worker (see bench/localqueue).
        per = max(1, args.saturated_seats // 2)
        for name, how in (("lq-shared-value", ""), ("lq-private-value", ",private")):
            specs.append(dict(name=name, workers=2, http_filter="wasm", wasm=mods["localqueue"],
                              cfg=f"{per},{args.localqueue_value_bytes}{how}",
                              conns=args.saturated_connections))
    if args.localqueue_global:
        # What a global seat pool costs on this host by itself: localqueue with one seat
        # count and FIFO for both workers (CAS) and cross-worker hand-offs (see
        # bench/localqueue); ÷ localqueue-saturated|2 it is the reference for apf ÷
        # the no-sharing control.
        specs.append(dict(name="lq-global", workers=2, http_filter="wasm", wasm=mods["localqueue"],
                          cfg=f"{args.saturated_seats},{args.localqueue_value_bytes or 1100},global",
                          conns=args.saturated_connections))
    return specs


def native_saturated_specs(args, mods) -> list[dict]:
    """apf-saturated's shape on the native host, 1 and 2 workers, and with a native isolated
    build its no-sharing control (2 workers, half the seats each), as isolated-saturated."""
    saturated = apf_policy.single_level_config(args.saturated_seats, group="system:authenticated",
                                               queues=16, hand_size=4, queue_length_limit=100)
    specs = [dict(name="apf-native-saturated", workers=sw, http_filter="native",
                  native=mods["apf-native"], cfg=saturated, conns=args.saturated_connections)
             for sw in (1, 2)]
    if "apf-native-isolated" in mods:
        specs.append(dict(name="isolated-native-saturated", workers=2, http_filter="native",
                          native=mods["apf-native-isolated"], conns=args.saturated_connections,
                          cfg=apf_policy.single_level_config(
                              max(1, args.saturated_seats // 2), group="system:authenticated",
                              queues=16, hand_size=4, queue_length_limit=100)))
    return specs


def with_stats(cfg: dict, stats: str) -> dict:
    """--envoy-stats minimal: Envoy creates only the stats matched here (the request counter the
    driver divides by, the modules' own metrics); the rest are null stats, never incremented.
    Envoy's counters are process-wide atomics that every worker increments per request, so
    fewer of them is less work per request and less cache-line traffic between workers."""
    if stats == "minimal":
        cfg["stats_config"] = {"stats_matcher": {"inclusion_list": {"patterns": [
            {"exact": RQ_TOTAL}, {"contains": "apf_wasm_"}, {"contains": "apiserver_flowcontrol_"},
            {"prefix": "wasmcustom."}, {"prefix": "dynamicmodulescustom."},
            {"prefix": "server."}]}}}
    return cfg


def load_generator(spec: dict, env: EnvoyProcess, wrk: str | None, workdir: Path):
    """gen(n): send n requests of `spec`'s shape to `env`'s gateway (wrk, else Python)."""
    port = env.ports["gateway"]
    counter = lambda: env.stats(RQ_TOTAL).get(RQ_TOTAL, 0)  # noqa: E731
    users = spec.get("users")
    if wrk:
        return lambda n: run_wrk(wrk, port, n, spec["conns"], min(2, spec["conns"]), workdir,
                                 counter, users)
    return lambda n: run_python(port, n, spec["conns"], users)


CONTENTION = ("writes", "conflicts", "decodes", "reuses", "wakeups")


def summed_counters(env: EnvoyProcess, prefix: str, suffixes: dict[str, str]) -> dict[str, int]:
    """Envoy stats under `prefix`, summed per key over the series ending in its suffix."""
    st = env.stats(prefix)
    return {k: sum(v for n, v in st.items() if n.endswith(suffix)) for k, suffix in suffixes.items()}


def contention_counts(env: EnvoyProcess) -> dict[str, int]:
    """apf-wasm's global-state contention counters (apf_wasm_*_total), summed over workers."""
    return summed_counters(env, "apf_wasm_", {
        "writes": "shared_state_writes_total", "conflicts": "shared_state_conflicts_total",
        "decodes": "level_state_decodes_total", "reuses": "level_state_reuses_total",
        "wakeups": "cross_worker_wakeups_total"})


def cpu_window(env: EnvoyProcess, gen, n: int, contention: bool = False) -> dict:
    """Runs gen(n) and returns the load generator's result plus `env`'s CPU µs per request
    counted by Envoy over that window, and the throughput. With `contention`, also the
    filter's contention counters per request over the window (workers flush them once a
    second, so they are read 1.2 s after the window, and the caller lets 1.2 s pass before it;
    the CPU figure is taken before that wait)."""
    c0 = contention_counts(env) if contention else None
    rq0, s0 = env.stats(RQ_TOTAL).get(RQ_TOTAL, 0), env.cpu_split()
    t0 = time.monotonic()
    res = gen(n)
    wall = time.monotonic() - t0
    rq1, s1 = env.stats(RQ_TOTAL).get(RQ_TOTAL, 0), env.cpu_split()
    done = max(1, rq1 - rq0)
    res.update(requests=done, cpu_us=(s1["cpu_s"] - s0["cpu_s"]) / done * 1e6, rps=done / wall)
    # Per request: user / kernel CPU µs (clock ticks), the workers' share of the CPU time
    # (µs), and how often a worker blocked for lack of work or was preempted.
    res["split"] = {k: (s1[k] - s0[k]) / done * (1e6 if k.endswith("_s") else 1) for k in s0 if k != "cpu_s"}
    if c0 is not None:
        time.sleep(1.2)
        c1 = contention_counts(env)
        res["contention"] = {k: (c1[k] - c0[k]) / done for k in CONTENTION}
    res.pop("raw", None)
    return res


ETCD: list[Etcd] = []  # the local etcd, when a fleet variant runs


def variant_config(spec: dict, args, upstream_port: int) -> dict:
    """The Envoy configuration of a variant (fleet variants: with an `etcd` cluster)."""
    if spec["http_filter"] == "native":
        cfg = gateway_config(upstream_port=upstream_port, http_filter="none", extra_filters=[
            dynamic_module_filter(spec["native"], spec.get("cfg"))])
    else:
        cfg = gateway_config(upstream_port=upstream_port, wasm_path=str(spec.get("wasm") or ""),
                             plugin_config=spec.get("cfg"), http_filter=spec["http_filter"])
    if spec.get("etcd") and ETCD:
        cfg["static_resources"]["clusters"].append(ETCD[0].envoy_cluster())
    with_stats(cfg, args.envoy_stats)
    return cfg


def start_etcd(workdir: Path) -> Etcd:
    """A throwaway etcd on loopback for the fleet variants (Debian's etcd-server)."""
    etcd = Etcd(workdir, name="bench", secure=False).start()
    ETCD.append(etcd)
    return etcd


def measure(spec: dict, args, envoy_bin: str, upstream_port: int, wrk: str | None,
            workdir: Path) -> dict:
    cfg = variant_config(spec, args, upstream_port)
    env = EnvoyProcess(cfg, workdir, envoy_bin=envoy_bin, concurrency=spec["workers"],
                       name=f"gw-{spec['name']}-{spec['workers']}", log_level="warning",
                       env=module_env(spec.get("native")))
    env.start()
    try:
        env.wait_ready(timeout=60)
        gen = load_generator(spec, env, wrk, workdir)
        gen(args.warmup)
        # Let background (JIT tier-up) work of the warm-up finish; apf-saturated: and the
        # warm-up's contention counters be flushed.
        counted = spec["name"] in COUNTED
        time.sleep(1.2 if counted else 0.2)
        return cpu_window(env, gen, args.requests, contention=counted)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0], "log": env.log_tail(15)}
    finally:
        env.stop()


def measure_paired(specs: list[dict], args, envoy_bin: str, upstream_port: int, wrk: str | None,
                   workdir: Path) -> dict[str, list[dict]]:
    """--paired: every variant's Envoy runs for the whole measurement (started and warmed up
    once); the load alternates between them in short windows (`--requests` each, ABBA order),
    so that adjacent windows see the same machine conditions. Each window's CPU per request is
    that Envoy's CPU time over the window (the idle ones use next to nothing) divided by the
    requests it counted. Results are per window, `round` = window pair index."""
    envs = []
    out: dict[str, list[dict]] = {}
    try:
        for spec in specs:
            cfg = variant_config(spec, args, upstream_port)
            env = EnvoyProcess(cfg, workdir, envoy_bin=envoy_bin, concurrency=spec["workers"],
                               name=f"gwp-{spec['name']}-{spec['workers']}", log_level="warning",
                               env=module_env(spec.get("native")))
            env.start()
            envs.append((spec, env))
        gens = []
        for spec, env in envs:
            env.wait_ready(timeout=60)
            gen = load_generator(spec, env, wrk, workdir)
            gen(args.warmup)
            gens.append((spec, env, gen))
        time.sleep(0.2)
        for rnd in range(args.rounds):
            order = gens if rnd % 2 == 0 else list(reversed(gens))
            for spec, env, gen in order:
                counted = spec["name"] in COUNTED
                if counted:
                    time.sleep(1.2)
                res = cpu_window(env, gen, args.requests, contention=counted)
                res["round"] = rnd
                key = f"{spec['name']}|{spec['workers']}"
                out.setdefault(key, []).append(res)
                sp = res.get("split", {})
                log(f"window {rnd + 1}/{args.rounds} {key}: {res['cpu_us']:.1f} us/req"
                    + (f"; user={sp['user_s']:.1f} sys={sp['sys_s']:.1f} workers={sp['workers_s']:.1f}"
                       f" sleeps={sp['sleeps']:.3f} preempted={sp['preempted']:.3f}" if sp else ""))
    finally:
        for _, env in envs:
            env.stop()
    return out


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """The load, the variants and their shapes."""
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="Envoy workers for all but apf-saturated")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--saturated-connections", type=int, default=64)
    ap.add_argument("--localqueue-value-bytes", type=int, default=0,
                    help="with apf-saturated: also lq-shared-value and lq-private-value (2 workers), "
                    "localqueue bumping a value of this size (apf's level value: ≈ 1100) on one "
                    "shared key and on a key per worker; their ratio is the host's part of the "
                    "sharing cost")
    ap.add_argument("--localqueue-global", action="store_true",
                    help="with apf-saturated: also lq-global (2 workers), localqueue with the level's "
                    "seats global (one seat count and FIFO in a shared value, CAS, cross-worker "
                    "hand-offs); ÷ localqueue-saturated|2 it is what a global seat pool costs by "
                    "itself, the reference for apf ÷ the no-sharing control")
    ap.add_argument("--saturated-seats", type=int, default=8,
                    help="apf-saturated: the level's seats (the references: all with 1 worker, half each "
                    "with 2); the shape before 2026-11-22 was 2 seats and 16 connections")
    ap.add_argument("--variants", default="none,passthrough,floor,local_ratelimit,apf,apf-saturated")
    ap.add_argument("--flow-counts", default="10,1000,100000",
                    help="apf-flows: numbers of distinct users (flows) to cycle through")


def add_noisy_args(ap: argparse.ArgumentParser) -> None:
    """The shape of apf-noisy (bench/noisy.py)."""
    ap.add_argument("--noisy-seconds", type=float, default=20.0,
                    help="apf-noisy: the noisy run's length (after a 2 s warm-up)")
    ap.add_argument("--noisy-standalone-seconds", type=float, default=6.0,
                    help="apf-noisy: the closed-loop quiet flow alone, half before and half after "
                         "the noisy run (each after a 0.5 s warm-up)")
    ap.add_argument("--noisy-seats", type=int, default=18, help="apf-noisy: the level's seats")
    ap.add_argument("--noisy-service-ms", type=float, default=50.0,
                    help="apf-noisy: the upstream's mean service time")
    ap.add_argument("--noisy-jitter", type=float, default=0.2,
                    help="apf-noisy: service times uniform in mean × (1 ± this), drawn per request")
    ap.add_argument("--noisy-heavy-connections", type=int, default=20,
                    help="apf-noisy: closed-loop connections of each heavy flow")
    ap.add_argument("--noisy-quiet-connections", type=int, default=4,
                    help="apf-noisy: closed-loop connections of the quiet flow quiet-cl")
    ap.add_argument("--noisy-quiet-rps", type=float, default=10.0,
                    help="apf-noisy: the open-loop quiet flow's request rate (0: none)")
    ap.add_argument("--workers-noisy", type=int, default=2, help="Envoy workers for apf-noisy")


def add_setup_args(ap: argparse.ArgumentParser) -> None:
    """Modules, load generator, Envoy's setup, measurement mode and output."""
    ap.add_argument("--floor-dir")
    ap.add_argument("--apf-wasm", help="use this apf-wasm module instead of ./wasm-build.sh")
    ap.add_argument("--apf-wasm-b", help="A/B: also run apf-saturated with this second module "
                    "(variant apf-saturated-b, 1 and 2 workers) and print b ÷ apf per worker count; "
                    "with the apf variant, also the uncontended apf-b")
    ap.add_argument("--apf-native", help="apf-native*: this native module (libapf_wasm.so) instead "
                    "of $APF_NATIVE or ./native-build.sh")
    ap.add_argument("--apf-native-b", help="A/B: with apf-native, also the uncontended apf-native-b "
                    "loading this second native module (a libapf_wasm.so in another directory)")
    ap.add_argument("--apf-native-also", default="",
                    help="with apf-native, also these native builds, uncontended: NAME=SO[,NAME=SO...] "
                    "(variants apf-native-NAME; each printed ÷ local_ratelimit and ÷ apf-native)")
    ap.add_argument("--apf-native-isolated", help="apf-native-saturated: its no-sharing control, this "
                    "native build whose workers key their levels apart (or $APF_NATIVE_ISOLATED; "
                    "default: ./native-build.sh --features native-isolated-levels)")
    ap.add_argument("--ratio-base", default="floor")
    ap.add_argument("--python-client", action="store_true", help="do not use wrk")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install wrk")
    ap.add_argument("--envoy-stats", choices=["all", "minimal"], default="all",
                    help="minimal: the measured Envoys keep only the stats the driver reads and the "
                         "modules' own metrics (a stats_matcher inclusion list, as Istio's proxies "
                         "have by default); all: Envoy's default, every stat")
    ap.add_argument("--upstream-delay-ms", type=float, default=0.0,
                    help="the upstream holds every response this long (Envoy's fault filter) before "
                         "answering, as an apiserver takes milliseconds: with apf-saturated, the "
                         "level is then saturated (at most seats / delay requests per second) while "
                         "the gateway's CPU is not, so both worker counts serve the same rate; "
                         "0 (default): answer at once, the gateway is CPU-bound")
    ap.add_argument("--load-priority", choices=["idle", "normal"], default="idle",
                    help="scheduling of the load generator and the upstream (idle: SCHED_IDLE)")
    ap.add_argument("--paired", action="store_true",
                    help="keep every variant's Envoy up and alternate short load windows between "
                         "them (--requests per window, --rounds window pairs): adjacent windows "
                         "share the machine's conditions, for tighter ratios")
    ap.add_argument("--out", help="also write the Markdown table here")
    ap.add_argument("--json", help="write raw per-round results here")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_load_args(ap)
    add_noisy_args(ap)
    add_setup_args(ap)
    args = ap.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.flow_counts = [int(k) for k in args.flow_counts.split(",") if k.strip()]
    return args


def run_rounds(specs: list[dict], args, mods: dict[str, Path], envoy_bin: str, upstream_port: int,
               wrk: str | None, work: Path) -> tuple[dict[str, list[dict]], list[dict]]:
    """Every round of every variant (CPU results per `name|workers`) and of apf-noisy."""
    results: dict[str, list[dict]] = {}
    noisy: list[dict] = []
    if args.paired and specs:
        results = measure_paired(specs, args, envoy_bin, upstream_port, wrk, work)
        specs_rounds = 0
    else:
        specs_rounds = args.rounds
    for rnd in range(specs_rounds if specs else args.rounds):
        if "apf-noisy" in args.variants:
            r = measure_noisy(args, envoy_bin, mods["apf"], work, rnd)
            noisy.append(r)
            log(f"round {rnd + 1}/{args.rounds} apf-noisy: " + round_line(r))
        if not specs:
            continue
        # Interleave; rotate the order every round so no variant always runs first.
        k = rnd % len(specs)
        for spec in specs[k:] + specs[:k]:
            key = f"{spec['name']}|{spec['workers']}"
            r = measure(spec, args, envoy_bin, upstream_port, wrk, work)
            r["round"] = rnd
            results.setdefault(key, []).append(r)
            log(f"round {rnd + 1}/{args.rounds} {key}: " + (
                f"{r['cpu_us']:.1f} us/req, {r['rps']:.0f} rps" if "cpu_us" in r
                else f"FAILED {r['error']}"))
    return results, noisy


def cpu_table(specs: list[dict], results: dict[str, list[dict]], ratio_base: str) -> str:
    """One row per variant: CPU µs per request (median, range, × the ratio base), rate, latency."""
    base_key = next((k for k in results if k.split("|")[0] == ratio_base), None)
    lines = ["| variant | workers | conns | CPU µs/req (median) | min–max | × " + ratio_base
             + " | req/s | p50 ms | p99 ms | non-2xx |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        key = f"{spec['name']}|{spec['workers']}"
        rs = [r for r in results.get(key, []) if "cpu_us" in r]
        if not rs:
            err = next((r.get("error") for r in results.get(key, [])), "no result")
            lines.append(f"| {spec['name']} | {spec['workers']} | {spec['conns']} | failed: {err} |"
                         " | | | | | |")
            continue
        cpu = [r["cpu_us"] for r in rs]
        ratios = []
        if base_key:
            base_by_round = {r["round"]: r["cpu_us"] for r in results[base_key] if "cpu_us" in r}
            ratios = [r["cpu_us"] / base_by_round[r["round"]] for r in rs if r["round"] in base_by_round]
        fmt = lambda v: f"{v:.2f}" if v == v else "–"  # noqa: E731
        lines.append(
            f"| {spec['name']} | {spec['workers']} | {spec['conns']} | {median(cpu):.1f} | "
            f"{min(cpu):.1f}–{max(cpu):.1f} | {fmt(median(ratios))} | "
            f"{median([r['rps'] for r in rs]):.0f} | {fmt(median([r.get('p50_ms', float('nan')) for r in rs]))} | "
            f"{fmt(median([r.get('p99_ms', float('nan')) for r in rs]))} | "
            f"{sum(r.get('non2xx', 0) for r in rs)} |")
    return "\n".join(lines) if specs else ""  # no CPU variants: only the noisy table below


def per_round(results: dict[str, list[dict]], a: str, b: str, m: str = "cpu") -> float:
    """Median over rounds of variant `a` ÷ variant `b` (CPU per request, or a `split` part)."""
    def metric(r: dict) -> float | None:
        v = r.get("cpu_us") if m == "cpu" else r.get("split", {}).get(m)
        return v if v else None

    ra = {r["round"]: v for r in results.get(a, []) if (v := metric(r))}
    rb = {r["round"]: v for r in results.get(b, []) if (v := metric(r))}
    return median([ra[k] / rb[k] for k in ra if k in rb])


def ratio_notes(results: dict[str, list[dict]], workers: int) -> str:
    """The ratios between variants that the run has both sides of."""
    pr = lambda a, b: per_round(results, a, b)  # noqa: E731
    out = ""
    if "apf-saturated|2" in results and "localqueue-saturated|2" in results:
        out += ("\n\nSaturated shape, medians of per-round ratios: apf 2 workers ÷ 1 worker "
                f"{pr('apf-saturated|2', 'apf-saturated|1'):.2f}; localqueue reference "
                f"2 ÷ 1 {pr('localqueue-saturated|2', 'localqueue-saturated|1'):.2f}; "
                f"apf ÷ localqueue with 1 worker {pr('apf-saturated|1', 'localqueue-saturated|1'):.2f}, "
                f"with 2 workers {pr('apf-saturated|2', 'localqueue-saturated|2'):.2f}.")
    if f"apf-native-b|{workers}" in results and f"apf-native|{workers}" in results:
        out += ("\nA/B, uncontended apf-native-b ÷ apf-native (medians of per-round ratios): "
                f"{pr(f'apf-native-b|{workers}', f'apf-native|{workers}'):.2f}.")
    if f"apf-b|{workers}" in results and f"apf|{workers}" in results:
        out += ("\nA/B, uncontended apf-b ÷ apf (medians of per-round ratios): "
                f"{pr(f'apf-b|{workers}', f'apf|{workers}'):.2f}.")
    if f"apf-fleet|{workers}" in results and f"apf|{workers}" in results:
        out += ("\nFleet mode (one replica, etcd on loopback), apf-fleet ÷ apf (medians of per-round "
                f"ratios), {workers} worker(s): {pr(f'apf-fleet|{workers}', f'apf|{workers}'):.2f}.")
    if "apf-saturated-b|1" in results:
        out += ("\nA/B, apf-saturated-b ÷ apf-saturated (medians of per-round ratios): "
                f"1 worker {pr('apf-saturated-b|1', 'apf-saturated|1'):.2f}, "
                f"2 workers {pr('apf-saturated-b|2', 'apf-saturated|2'):.2f}; "
                f"b 2 ÷ 1 {pr('apf-saturated-b|2', 'apf-saturated-b|1'):.2f}.")
    if "apf-saturated|2" in results and "isolated-saturated|2" in results:
        out += ("\nNo-sharing control (the same module, each worker on a level of its own with "
                f"half the seats), 2 workers ÷ apf 1 worker {pr('isolated-saturated|2', 'apf-saturated|1'):.2f}; "
                f"apf ÷ control with 2 workers (what sharing the level costs) "
                f"{pr('apf-saturated|2', 'isolated-saturated|2'):.2f}.")
    out += native_notes(results, workers)
    if "lq-global|2" in results and "localqueue-saturated|2" in results:
        out += ("\nGlobal seats in a trivial module (lq-global ÷ localqueue, 2 workers): "
                f"{pr('lq-global|2', 'localqueue-saturated|2'):.2f}, what a global seat pool "
                "costs on this host by itself (pool.py gives apf's sharing cost over it).")
    return out


def also_modules(spec: str) -> list[tuple[str, str]]:
    """--apf-native-also: [(NAME, SO)]."""
    out = []
    for part in filter(None, spec.split(",")):
        name, sep, so = part.partition("=")
        if not sep or not name or not so:
            raise SystemExit(f"--apf-native-also: expected NAME=SO, got {part!r}")
        out.append((name, so))
    return out


def native_notes(results: dict[str, list[dict]], workers: int) -> str:
    """The two hosts side by side: each ÷ Envoy's local_ratelimit and ÷ its own floor, and the
    native saturated shape's 2 ÷ 1 and sharing cost (medians of per-round ratios)."""
    pr = lambda a, b: per_round(results, f"{a}|{workers}", f"{b}|{workers}")  # noqa: E731
    have = lambda *ks: all(f"{k}|{workers}" in results for k in ks)  # noqa: E731
    pairs = [("apf-native", "local_ratelimit"), ("apf-native", "native-floor"),
             ("apf-native-b", "local_ratelimit"),
             ("apf", "local_ratelimit"), ("apf", "floor"), ("native-floor", "local_ratelimit"),
             ("floor", "local_ratelimit"), ("floor", "native-floor"), ("native-floor", "none")]
    also = sorted(k.split("|")[0] for k in results if k.startswith("apf-native-") and k.endswith(f"|{workers}")
                  and k.split("|")[0] not in ("apf-native-b", "apf-native-saturated"))
    pairs += [(a, b) for a in also for b in ("local_ratelimit", "apf-native")]
    parts = [f"{a} ÷ {b} {pr(a, b):.2f}" for a, b in pairs if have(a, b)]
    out = ("\n\nHosts, uncontended (medians of per-round ratios): " + "; ".join(parts) + "."
           if parts else "")
    if "apf-native-saturated|2" in results and "apf-native-saturated|1" in results:
        out += ("\nNative saturated shape: 2 workers ÷ 1 worker "
                f"{per_round(results, 'apf-native-saturated|2', 'apf-native-saturated|1'):.2f}")
        if "isolated-native-saturated|2" in results:
            out += ("; apf-native ÷ its no-sharing control with 2 workers (what sharing the level "
                    "costs) "
                    f"{per_round(results, 'apf-native-saturated|2', 'isolated-native-saturated|2'):.2f}")
        out += "."
    return out


def split_notes(results: dict[str, list[dict]]) -> str:
    """Where the saturated variants' CPU goes: user, kernel, worker sleeps."""
    sat = [k for k in ("apf-saturated|1", "apf-saturated|2", "isolated-saturated|2",
                       "localqueue-saturated|1", "localqueue-saturated|2") if k in results]
    if not any("split" in r for k in sat for r in results[k]):
        return ""

    def split_median(k: str, m: str) -> float:
        return median([r["split"][m] for r in results[k] if "split" in r])

    def pr(a: str, b: str, m: str) -> float:
        return per_round(results, a, b, m)

    out = "\nWhere the CPU goes (medians per request; user and kernel µs at clock-tick resolution): " + "; ".join(
        f"{k} user {split_median(k, 'user_s'):.1f}, kernel {split_median(k, 'sys_s'):.1f}, "
        f"worker sleeps {split_median(k, 'sleeps'):.2f}" for k in sat) + "."
    if "apf-saturated|2" in results and "apf-saturated|1" in results:
        out += ("\nUser CPU only, medians of per-round ratios: apf 2 ÷ 1 "
                f"{pr('apf-saturated|2', 'apf-saturated|1', 'user_s'):.2f}"
                + (f"; localqueue 2 ÷ 1 {pr('localqueue-saturated|2', 'localqueue-saturated|1', 'user_s'):.2f}"
                   if "localqueue-saturated|2" in results else "")
                + (f"; apf ÷ control {pr('apf-saturated|2', 'isolated-saturated|2', 'user_s'):.2f}"
                   if "isolated-saturated|2" in results else "") + ". Kernel CPU only: apf 2 ÷ 1 "
                f"{pr('apf-saturated|2', 'apf-saturated|1', 'sys_s'):.2f}.")
    return out


def contention_notes(results: dict[str, list[dict]]) -> str:
    """The global-state contention counters of the variants that read them."""
    out = ""
    for name, w in [(n, w) for n in COUNTED for w in (1, 2)]:
        cs = [r["contention"] for r in results.get(f"{name}|{w}", []) if "contention" in r]
        if cs:
            m_ = {k: median([c[k] for c in cs]) for k in CONTENTION}
            updates = max(1e-9, m_["writes"] + m_["conflicts"])
            out += (f"\n{name}, {w} worker{'s' if w > 1 else ''}, global-state contention "
                    f"(medians per request): {m_['writes']:.2f} shared writes, CAS conflicts "
                    f"{m_['conflicts'] / updates:.1%} of updates, level states decoded "
                    f"{m_['decodes']:.2f} / reused {m_['reuses']:.2f}, cross-worker wake-ups "
                    f"{m_['wakeups']:.3f}.")
    return out


def run_header(args, envoy_bin: str, wrk: str | None) -> str:
    """The run's setting: Envoy's version, the load, the machine."""
    ver = subprocess.run([envoy_bin, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"/(\d+\.\d+\.\d+)/", ver)
    return (f"Envoy {m.group(1) if m else '?'}, "
            f"{args.requests} requests/round after {args.warmup} warm-up, {args.rounds} rounds, "
            f"load generator {'wrk' if wrk else 'python'}, {os.cpu_count()} CPUs"
            + (", Envoy stats: minimal inclusion list" if args.envoy_stats == "minimal" else "") + ".\n")


def report(args, specs: list[dict], results: dict[str, list[dict]], noisy: list[dict], envoy_bin: str,
           wrk: str | None) -> None:
    """Prints the tables and writes --out and --json (`results` gains the noisy rounds)."""
    table = cpu_table(specs, results, args.ratio_base)
    table += ratio_notes(results, args.workers) + split_notes(results) + contention_notes(results)
    header = run_header(args, envoy_bin, wrk)
    if noisy:
        table += ("\n\n" if table else "") + noisy_section(args, noisy)
        results["apf-noisy"] = noisy
    print(header)
    print(table)
    if args.out:
        Path(args.out).write_text(header + "\n" + table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


def main() -> int:
    args = parse_args()
    IDLE_LOAD[0] = args.load_priority == "idle" and shutil.which("chrt") is not None

    envoy_bin = find_envoy()
    mods = build_modules(args)
    specs = variant_specs(args, mods)
    wrk = None if args.python_client else ensure_wrk(not args.no_install)
    log(f"envoy {envoy_bin}; load generator {'wrk' if wrk else 'python'}; "
        f"{args.requests} requests x {args.rounds} rounds x {len(specs)} variants"
        + (f"; upstream delay {args.upstream_delay_ms} ms" if args.upstream_delay_ms else ""))

    work = Path(tempfile.mkdtemp(prefix="apf-bench-"))
    etcd = start_etcd(work) if any(s.get("etcd") for s in specs) else None
    up = EnvoyProcess(direct_response_config(delay_ms=args.upstream_delay_ms), work,
                      envoy_bin=envoy_bin, concurrency=1,
                      name="upstream", log_level="warning")
    up.start().wait_ready()
    make_idle(up.pid)
    try:
        results, noisy = run_rounds(specs, args, mods, envoy_bin, up.ports["direct"], wrk, work)
    finally:
        up.stop()
        if etcd is not None:
            etcd.stop()
    report(args, specs, results, noisy, envoy_bin, wrk)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
