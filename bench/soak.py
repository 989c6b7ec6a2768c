#!/usr/bin/env python3
"""Soak test of apf-wasm in Envoy: memory and CPU per request over a long, steady load.

Not run in CI. A steady load for --minutes with flows churning through many distinct users;
memory, CPU per request, throughput and errors are reported per window.

Setup (the harness of bench/run.py): the module from ./wasm-build.sh (or --apf-wasm), copied
aside so later rebuilds cannot touch it; an upstream Envoy answering at once with a
direct_response (1 worker); the gateway Envoy (apfkit/envoy_template.py gateway_config,
--workers workers) with apf-wasm, identity frontProxy, the default policy (suggested defaults:
requests of group system:authenticated land in level global-default, 49 seats, ByUser flows).

Load: wrk, one run per window (--window seconds, back to back), --connections keep-alive
connections over --threads threads, each request from `X-Remote-User: user-<n>` (group
system:authenticated), n cycling through --users distinct users without repeats until all have
been seen (continued across windows), so the level sees a new flow on almost every request.
Plain wrk is closed-loop; to keep the gateway busy but not saturated, each connection waits
--think-ms after every response before its next request (wrk's Lua delay()), so the rate is
at most connections / (think + latency), set by the think time and not by how much CPU the
gateway gets. The load generator and the upstream run under SCHED_IDLE (chrt), as in run.py.
With --seats N (and --upstream-delay-ms D), the policy is instead one level of N seats that
every user is classified into: with more connections than seats, requests queue (the level
limits the rate to about N / D per second) and the users' flows pass through the shared queues.
With --filter none, the same Envoy and load without any filter (router only): a control for
what Envoy itself does over time.
With --interleave localqueue|none, a second gateway Envoy runs beside apf-wasm's for the whole
run with a control (bench/localqueue: the same pause-and-resume shape with a per-worker seat
limit of seats ÷ workers and no shared state; or no filter), and windows alternate between the
two (odd windows apf-wasm, even the control; same upstream, same load). A drift of the machine
(CPU frequency, steal, caches) then shows in both; the summary reports each gateway and the
ratio apf-wasm ÷ control of the CPU per request over adjacent window pairs, with its slope.

Per window (one line each; all in --out JSON):
  req/s        requests Envoy counted (http.apf_gateway.downstream_rq_total delta, minus this
               script's own debug-dump probes) / window wall time
  CPU µs/req   Envoy process CPU (utime+stime of /proc/PID/stat, all threads) over the window /
               the requests Envoy counted in it
  RSS          VmRSS of the Envoy process at the end of the window (/proc/PID/status), MiB
  heap         Envoy admin /memory (tcmalloc): `allocated` (live bytes in Envoy's malloc heap:
               Envoy's own C++ objects, including proxy-wasm shared data, which Envoy keeps as
               strings in a process-wide map) and `heap_size`, MiB; the JSON and the summary
               also have the thread caches and the page heap's free bytes (freed memory the
               allocator keeps)
  wasm mem     the Wasm linear memories of all the module's VMs (V8 maps each one as a read-write
               region just below its guard reservation; found in /proc/PID/smaps): their size
               (what the modules have grown to) and resident part, MiB
  stats        number of Envoy stats (a per-user stat would show up here)
  level state  what the module keeps in shared data, read from its debug dumps (dump_queues,
               dump_priority_levels, as a system:masters caller) every --sample seconds during
               the window: maxima over the samples of requests waiting, executing, and stored
               (non-idle) queues over all levels, and the longest queue. Envoy does not expose
               the byte size of shared data. Each level's value (apf/v3/pl/<level>) is a
               bounded part (counters, integrator, a retry-after history of at most 33 entries)
               plus an entry per stored queue, per (worker, queue) executing aggregate and per
               waiting request (≈ 10 bytes each); a flow appears only as the hash in its waiting
               requests, nothing is kept per user. These counts are what can grow; the other
               keys (workers, borrowing, watches, generation, object counts) do not depend on
               the load's users
  codes        status codes counted by wrk (Lua response()), non-2xx, 429, socket errors
               (connect / read / write / timeout), p50 / p99 latency

Summary: warm-up = the first --warmup-minutes (windows that start before it are left out).
First and last post-warm-up windows, their difference, and the least-squares slope per 10
minutes over the post-warm-up windows of RSS, heap, wasm memory and CPU per request (and the
medians of the first and last 5 windows, since single windows of CPU are noisy); totals of
requests and errors.

Usage: python3 bench/soak.py [--minutes 30] [--window 30] [--workers 2] [--out soak.json]
                             [--md summary.md]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the shared harness apfkit/, and bench/run.py as bench.run

from apfkit import apf_policy  # noqa: E402
from apfkit.envoy_template import direct_response_config, gateway_config  # noqa: E402
from apfkit.envoyproc import EnvoyProcess, find_envoy, http_get  # noqa: E402
from bench import run as harness  # noqa: E402
RQ_TOTAL = harness.RQ_TOTAL
PATH = harness.PATH
GROUP = "system:authenticated"
PROBE = {"X-Remote-User": "soak-probe", "X-Remote-Group": "system:masters"}
DUMP = "/debug/api_priority_and_fairness/"
MiB = 1024 * 1024


def log(msg: str) -> None:
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Load
WRK_LUA = r"""
-- Requests from user-<n>, n stepping through USERS distinct users (thread t of T takes
-- n = START + t - 1, + T, + 2T, ...: no repeats until all users have been seen).
local users = USERS
local start = START
local nthreads_total = NTHREADS
local think = THINK
local threads = {}
local nthreads = 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end
local n = 0
function init(args)
  n = start + (wrk.thread:get("tid") or 1) - 1
  codes = {}
end
function request()
  local u = n % users
  n = n + nthreads_total
  return wrk.format("GET", nil, {["X-Remote-User"] = "user-" .. tostring(u),
                                 ["X-Remote-Group"] = "GROUP"})
end
DELAY_FN
function response(status, headers, body)
  local k = tostring(status)
  codes[k] = (codes[k] or 0) + 1
end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    local c = t:get("codes")
    if c then
      for k, v in pairs(c) do all[k] = (all[k] or 0) + v end
    end
  end
  local parts = {}
  for k, v in pairs(all) do table.insert(parts, k .. "=" .. tostring(v)) end
  io.write("SOAK_CODES " .. table.concat(parts, " ") .. "\n")
  io.write(string.format("SOAK_SUM requests=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout))
  io.write(string.format("SOAK_LAT p50_us=%d p99_us=%d max_us=%d\n", latency:percentile(50),
    latency:percentile(99), latency.max))
end
"""


def wrk_script(path: Path, users: int, start: int, threads: int, think_ms: int) -> None:
    delay_fn = f"function delay()\n  return {think_ms}\nend" if think_ms > 0 else ""
    path.write_text(WRK_LUA.replace("USERS", str(users)).replace("START", str(start))
                    .replace("NTHREADS", str(threads)).replace("THINK", str(think_ms))
                    .replace("DELAY_FN", delay_fn).replace("GROUP", GROUP))


def parse_wrk(out: str) -> dict:
    res: dict = {"codes": {}, "wrk_requests": 0, "socket_errors": {}, "p50_ms": None, "p99_ms": None}
    m = re.search(r"^SOAK_CODES(.*)$", out, re.M)
    if m:
        for kv in m.group(1).split():
            k, v = kv.split("=")
            res["codes"][k] = int(v)
    m = re.search(r"^SOAK_SUM requests=(\d+) connect=(\d+) read=(\d+) write=(\d+) status=(\d+) "
                  r"timeout=(\d+)", out, re.M)
    if m:
        res["wrk_requests"] = int(m.group(1))
        res["socket_errors"] = dict(zip(("connect", "read", "write"), map(int, m.group(2, 3, 4))))
        res["socket_errors"]["timeout"] = int(m.group(6))
        res["non2xx"] = int(m.group(5))
    m = re.search(r"^SOAK_LAT p50_us=(\d+) p99_us=(\d+) max_us=(\d+)", out, re.M)
    if m:
        res["p50_ms"], res["p99_ms"], res["max_ms"] = (int(x) / 1e3 for x in m.groups())
    if not res["codes"] and "SOAK_SUM" not in out:
        res["wrk_failed"] = out.strip().splitlines()[-5:]
    return res


# ---------------------------------------------------------------------------------------------
# Envoy process measurements
def proc_cpu_s(pid: int) -> float:
    """utime+stime of the whole process (all threads, live and exited), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])  # kB (Threads: a count)
    return out


def wasm_memory(pid: int) -> dict:
    """The Wasm linear memories: V8 reserves each one with a large PROT_NONE guard region and
    makes its current size read-write at the start of it, so the memory is the rw-p anonymous
    mapping immediately followed by a ≥ 4 GiB ---p mapping. Sizes in kB."""
    maps: list[dict] = []
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)", line)
            if m:
                cur = dict(s=int(m.group(1), 16), e=int(m.group(2), 16), perm=m.group(3),
                           anon=m.group(4) == "0", rss=0)
                maps.append(cur)
            elif line.startswith("Rss:") and cur is not None:
                cur["rss"] = int(line.split()[1])
    vms = [a for a, b in zip(maps, maps[1:])
           if a["perm"] == "rw-p" and a["anon"] and b["perm"] == "---p" and b["s"] == a["e"]
           and b["e"] - b["s"] >= 4 << 30]
    return {"vms": len(vms), "size_kb": sum((a["e"] - a["s"]) >> 10 for a in vms),
            "rss_kb": sum(a["rss"] for a in vms)}


def admin_memory(env: EnvoyProcess) -> dict:
    try:
        _, body = env.admin_get("/memory")
        return {k: int(v) for k, v in json.loads(body).items() if str(v).isdigit()}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def counters(env: EnvoyProcess) -> dict:
    st = env.stats()
    pre = "http.apf_gateway."
    out = {k: st.get(pre + k, 0) for k in ("downstream_rq_total", "downstream_rq_2xx",
                                            "downstream_rq_4xx", "downstream_rq_5xx",
                                            "downstream_rq_rx_reset", "downstream_cx_total",
                                            "downstream_cx_protocol_error")}
    out["apf_rejected"] = sum(v for k, v in st.items()
                              if "apiserver_flowcontrol_rejected_requests_total" in k)
    out["apf_dispatched"] = sum(v for k, v in st.items()
                                if "apiserver_flowcontrol_dispatched_requests_total" in k)
    out["stats_count"] = len(st)
    return out


def parse_dump(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in ln.split(",")] for ln in text.strip().splitlines()]
    return rows[1:] if rows else []


def level_sample(port: int) -> dict:
    """Counts of what the level states in shared data hold, from the module's debug dumps."""
    st, body = http_get(port, DUMP + "dump_priority_levels", headers=PROBE, timeout=10)
    if st != 200:
        raise RuntimeError(f"dump_priority_levels: HTTP {st}")
    waiting = executing = 0
    for r in parse_dump(body.decode()):
        waiting += int(r[4])
        executing += int(r[5])
    st, body = http_get(port, DUMP + "dump_queues", headers=PROBE, timeout=10)
    if st != 200:
        raise RuntimeError(f"dump_queues: HTTP {st}")
    stored = longest = 0
    for r in parse_dump(body.decode()):
        pending, execu, seats = int(r[2]), int(r[3]), int(r[4])
        if pending or execu or seats:
            stored += 1
        longest = max(longest, pending)
    return {"waiting": waiting, "executing": executing, "stored_queues": stored,
            "longest_queue": longest}


# ---------------------------------------------------------------------------------------------
def lsq_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (nan with fewer than 2 points)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y == y]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else float("nan")


def fmt(v, spec: str = ".1f") -> str:
    return "–" if v is None or v != v else format(v, spec)


HEADER = ("| win | t (min) | req/s | CPU µs/req | RSS MiB | heap alloc / size MiB | wasm mem MiB (rss) "
          "| stats | waiting / executing / stored queues (max) | 2xx | 429 | other non-2xx | sock err "
          "| p50 / p99 ms |")
SEP = "|" + "---|" * 14


def row(w: dict) -> str:
    codes = w["codes"]
    ok = sum(v for k, v in codes.items() if k.startswith("2"))
    other = sum(v for k, v in codes.items() if not k.startswith("2") and k != "429")
    lv = w.get("level") or {}
    return (f"| {w['index']}{' ' + w['target'] if w.get('target') not in (None, 'gateway') else ''} | {w['t_end_min']:.1f} | {w['rps']:.0f} | {w['cpu_us_per_req']:.1f} | "
            f"{w['rss_mib']:.1f} | {fmt(w.get('heap_allocated_mib'))} / {fmt(w.get('heap_size_mib'))} | "
            f"{w['wasm_size_mib']:.2f} ({w['wasm_rss_mib']:.2f}) | {w['stats_count']} | "
            f"{lv.get('waiting', '–')} / {lv.get('executing', '–')} / {lv.get('stored_queues', '–')} | "
            f"{ok} | {codes.get('429', 0)} | {other} | {sum(w['socket_errors'].values())} | "
            f"{fmt(w.get('p50_ms'), '.2f')} / {fmt(w.get('p99_ms'), '.2f')} |")


def derive(w: dict) -> dict:
    """Per-window figures computed from the raw readings (also for JSON files of older runs)."""
    mem = w.get("memory") or {}
    if "total_thread_cache" in mem:
        w.setdefault("heap_thread_cache_mib", mem["total_thread_cache"] / MiB)
    if "pageheap_free" in mem:
        w.setdefault("heap_free_mib", mem["pageheap_free"] / MiB)
    return w


def totals(windows: list[dict]) -> dict:
    """Requests and failures over all windows."""
    return {"requests_envoy": sum(w["requests"] for w in windows),
            "requests_wrk": sum(w["wrk_requests"] for w in windows),
            "non2xx": sum(sum(v for k, v in w["codes"].items() if not k.startswith("2")) for w in windows),
            "429": sum(w["codes"].get("429", 0) for w in windows),
            "5xx": sum(sum(v for k, v in w["codes"].items() if k.startswith("5")) for w in windows),
            "socket_errors": sum(sum(w["socket_errors"].values()) for w in windows),
            "envoy_4xx": sum(w["envoy"]["downstream_rq_4xx"] for w in windows),
            "envoy_5xx": sum(w["envoy"]["downstream_rq_5xx"] for w in windows),
            "apf_rejected": sum(w["envoy"]["apf_rejected"] for w in windows)}


def trend_table(post: list[dict], args, s: dict) -> list[str]:
    """Markdown lines: each measure's first, last, slope and medians over the windows after the
    warm-up (also stored in `s` under the measure's key)."""
    lines: list[str] = []
    xs = [(w["t_start_min"] + w["t_end_min"]) / 2 for w in post]
    metrics = [("RSS", "rss_mib", "MiB", ".1f"), ("RSS anonymous", "rss_anon_mib", "MiB", ".1f"),
               ("RSS file-backed", "rss_file_mib", "MiB", ".1f"),
               ("Envoy heap allocated (live bytes)", "heap_allocated_mib", "MiB", ".2f"),
               ("Envoy heap size", "heap_size_mib", "MiB", ".1f"),
               ("Envoy heap: thread caches", "heap_thread_cache_mib", "MiB", ".2f"),
               ("Envoy heap: page heap free", "heap_free_mib", "MiB", ".2f"),
               ("wasm linear memory (all VMs)", "wasm_size_mib", "MiB", ".2f"),
               ("wasm linear memory resident", "wasm_rss_mib", "MiB", ".2f"),
               ("Envoy stats", "stats_count", "", ".0f"),
               ("CPU per request", "cpu_us_per_req", "µs", ".1f"), ("req/s", "rps", "", ".0f")]
    lines.append(f"Post-warm-up: {len(post)} windows from minute {post[0]['t_start_min']:.1f} to "
                 f"{post[-1]['t_end_min']:.1f} (warm-up: the first {args.warmup_minutes:g} min).")
    lines.append("")
    lines.append("| measure | first window | last window | last − first | slope per 10 min (least squares) "
                 "| median first 5 | median last 5 |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, key, unit, sp in metrics:
        ys = [w.get(key) for w in post]
        good = [y for y in ys if y is not None]
        if not good:
            continue
        slope = lsq_slope(xs, ys) * 10
        first5 = statistics.median([y for y in ys[:5] if y is not None] or [float("nan")])
        last5 = statistics.median([y for y in ys[-5:] if y is not None] or [float("nan")])
        s[key] = dict(first=ys[0], last=ys[-1], slope_per_10min=slope, median_first5=first5,
                      median_last5=last5, mean=statistics.mean(good))
        u = f" {unit}" if unit else ""
        lines.append(f"| {name} | {fmt(ys[0], sp)}{u} | {fmt(ys[-1], sp)}{u} | "
                     f"{fmt(ys[-1] - ys[0] if ys[0] is not None and ys[-1] is not None else None, '+' + sp)}{u} | "
                     f"{fmt(slope, '+.3f')}{u} ({fmt(slope / statistics.mean(good) * 100 if statistics.mean(good) else None, '+.2f')} % of mean) | "
                     f"{fmt(first5, sp)}{u} | {fmt(last5, sp)}{u} |")
    return lines


def summarize(windows: list[dict], args, meta: dict) -> tuple[str, dict]:
    for w in windows:
        derive(w)
    post = [w for w in windows if w["t_start_min"] >= args.warmup_minutes - 1e-9]
    s: dict = {"windows": len(windows), "post_warmup_windows": len(post),
               "warmup_minutes": args.warmup_minutes}
    tot = totals(windows)
    s["totals"] = tot
    lines = []
    if not post:
        lines.append("No window after the warm-up: nothing to summarize.")
        return "\n".join(lines), s
    lines += trend_table(post, args, s)
    lv = [w.get("level") for w in windows if w.get("level")]
    if lv:
        s["level_max"] = {k: max(x[k] for x in lv) for k in lv[0]}
    lines.append("")
    lines.append(f"Totals over all {len(windows)} windows: {tot['requests_envoy']:,} requests (Envoy), "
                 f"{tot['requests_wrk']:,} answered to wrk; non-2xx {tot['non2xx']} (429: {tot['429']}, "
                 f"5xx: {tot['5xx']}); socket errors {tot['socket_errors']}; Envoy 4xx {tot['envoy_4xx']}, "
                 f"5xx {tot['envoy_5xx']}; APF rejections {tot['apf_rejected']}.")
    if lv:
        m = s["level_max"]
        lines.append(f"Shared level state, maxima over all samples: {m['waiting']} waiting, "
                     f"{m['executing']} executing, {m['stored_queues']} stored queues, longest queue "
                     f"{m['longest_queue']}.")
    rss = s.get("rss_mib", {})
    if rss:
        lines.append(f"Envoy peak RSS (VmHWM) at the end: {windows[-1]['hwm_mib']:.1f} MiB.")
    return "\n".join(lines), s


# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--minutes", type=float, default=30.0, help="total run time (default 30)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per window (default 30)")
    ap.add_argument("--warmup-minutes", type=float, default=2.0,
                    help="windows starting before this are left out of the summary (default 2)")
    ap.add_argument("--workers", type=int, default=2, help="gateway Envoy workers (default 2)")
    ap.add_argument("--users", type=int, default=100_000, help="distinct users (flows) to cycle through")
    ap.add_argument("--connections", type=int, default=8, help="wrk connections (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    ap.add_argument("--think-ms", type=int, default=2,
                    help="each connection waits this long after a response before its next "
                    "request (wrk Lua delay(); 0: closed loop, as fast as possible); default 2")
    ap.add_argument("--sample", type=float, default=5.0,
                    help="seconds between debug-dump samples of the level state within a window")
    ap.add_argument("--seats", type=int, default=0,
                    help="0 (default): the default policy; N: instead, one level of N seats (128 "
                    "queues, hand size 6, queue length limit 50, suggestedDefaults false) for group "
                    "system:authenticated, so that with more connections than seats requests queue "
                    "and the users' flows pass through the shared queues")
    ap.add_argument("--upstream-delay-ms", type=float, default=0.0,
                    help="the upstream holds every response this long (Envoy's fault filter, a "
                    "timer): with --seats, the level then limits the rate (seats / delay)")
    ap.add_argument("--filter", choices=["apf", "none"], default="apf",
                    help="none: a control run of the same Envoy with the router only (no Wasm "
                    "filter), to tell Envoy's own memory and CPU drift from the module's")
    ap.add_argument("--interleave", choices=["localqueue", "none"],
                    help="run a control gateway (localqueue module or no filter) beside apf-wasm's "
                    "and alternate windows between them (see above)")
    ap.add_argument("--apf-wasm", help="use this module instead of building with ./wasm-build.sh")
    ap.add_argument("--module-label", help="with --apf-wasm: where the module comes from (e.g. the "
                    "commit it was built from), printed instead of this checkout's commit")
    ap.add_argument("--out", help="write windows and summary as JSON here (rewritten after every window)")
    ap.add_argument("--md", help="also write the window table and summary as Markdown here")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install wrk")
    ap.add_argument("--load-priority", choices=["idle", "normal"], default="idle",
                    help="scheduling of wrk and the upstream (idle: SCHED_IDLE, as bench/run.py)")
    ap.add_argument("--from-json", metavar="FILE",
                    help="run nothing: summarize the windows of an earlier run's --out file (with "
                    "this --warmup-minutes; --md to write the Markdown)")
    return ap.parse_args(argv)


def summarize_file(args) -> int:
    """--from-json: the windows and summary of an earlier run."""
    data = json.loads(Path(args.from_json).read_text())
    print(HEADER)
    print(SEP)
    for w in data["windows"]:
        print(row(w))
    report(data["windows"], data["meta"], args)
    return 0


def prepare_module(args, work: Path, control: bool) -> tuple[Path, str, Path]:
    """(where the module comes from, its sha256, the copy the gateway loads); for the control
    run an empty file."""
    wasm = work / "apf_wasm.wasm"
    if control:
        src, sha = Path("-"), "-"
        wasm.write_bytes(b"")
    else:
        src = Path(args.apf_wasm) if args.apf_wasm else harness.wasm_build(None, None)
        shutil.copyfile(src, wasm)
        sha = hashlib.sha256(wasm.read_bytes()).hexdigest()
    return src, sha, wasm


def run_meta(args, envoy_bin: str, src: Path, sha: str, wasm: Path, control: bool) -> dict:
    """What the run measured: Envoy, module, commit, machine, load and policy."""
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "Cargo.toml"],
                                capture_output=True, text=True).stdout.strip())
    ver = subprocess.run([envoy_bin, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"/(\d+\.\d+\.\d+)/", ver)
    meta = dict(date=datetime.date.today().isoformat(), envoy=m.group(1) if m else "?",
                module=str(src), module_sha256=sha[:16], module_bytes=wasm.stat().st_size,
                git="none (control: router only)" if control
                else (args.module_label or "given with --apf-wasm") if args.apf_wasm
                else git + ("+dirty src" if dirty else ""), cpus=os.cpu_count(),
                workers=args.workers, users=args.users, connections=args.connections,
                threads=args.threads, think_ms=args.think_ms, window_s=args.window,
                minutes=args.minutes, load_priority=args.load_priority,
                upstream_delay_ms=args.upstream_delay_ms,
                policy="none (no filter)" if control else (f"one level of {args.seats} seats (128 queues, hand 6, queue limit 50)"
                        if args.seats else "default (suggested defaults)") + ", identity frontProxy")
    meta["filter"] = args.filter
    return meta


def start_gateway(name: str, kind: str, args, upstream_port: int, wasm: Path, work: Path,
                  envoy_bin: str) -> tuple[str, EnvoyProcess, bool]:
    """A started gateway Envoy: apf-wasm, the localqueue module or no filter; (target label, Envoy,
    whether it has apf-wasm's debug dumps)."""
    if kind == "apf":
        cfg = gateway_config(upstream_port=upstream_port, wasm_path=str(wasm),
                             plugin_config=(apf_policy.single_level_config(
                                 args.seats, group=GROUP, queues=128, hand_size=6, queue_length_limit=50)
                                 if args.seats else apf_policy.plugin_config()))
    elif kind == "localqueue":
        lq = harness.cargo_wasm(REPO / "bench/localqueue/Cargo.toml",
                                harness.target_dir() / "bench-localqueue", "localqueue")
        shutil.copyfile(lq, work / "localqueue.wasm")
        per_worker = max(1, args.seats // args.workers) if args.seats else 1_000_000
        cfg = gateway_config(upstream_port=upstream_port, wasm_path=str(work / "localqueue.wasm"),
                             plugin_config=str(per_worker))
    else:
        cfg = gateway_config(upstream_port=upstream_port, http_filter="none")
    env = EnvoyProcess(cfg, work, envoy_bin=envoy_bin, concurrency=args.workers, name=name,
                       log_level="warning")
    env.start()
    return name, env, kind == "apf"


def write_out(args, meta: dict, windows: list[dict], summary: dict | None = None) -> None:
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "windows": windows, "summary": summary},
                                             indent=1, default=str))


def print_intro(meta: dict, args, n_windows: int) -> None:
    print(f"Envoy {meta['envoy']}, {args.workers} workers, {os.cpu_count()} CPUs; module git "
          f"{meta['git']} sha256 {meta['module_sha256']}…; policy: {meta['policy']}"
          + (f"; upstream delay {args.upstream_delay_ms:g} ms" if args.upstream_delay_ms else "")
          + f"; wrk {args.connections} connections, think "
          f"{args.think_ms} ms; {args.users:,} users; {n_windows} × {args.window:g} s windows"
          + (f", alternating apf-wasm / control ({args.interleave})" if args.interleave else "")
          + ".\n", flush=True)
    print(HEADER)
    print(SEP, flush=True)


def run_windows(gateways: list[tuple[str, EnvoyProcess, bool]], args, wrk: str, work: Path, meta: dict,
                windows: list[dict], stop: list[bool]) -> None:
    """Waits for the gateways, then the windows (alternating between the gateways), each
    appended to `windows`, printed and written out as it ends; stops early when `stop[0]`."""
    for name, env, _ in gateways:
        env.wait_ready(timeout=60)
        bad = env.fatal_log_lines()
        if bad:
            raise RuntimeError(f"{name} module failed: " + bad[0])
    n_windows = max(1, int(round(args.minutes * 60 / args.window)))
    log(f"{n_windows} windows of {args.window:g} s; {args.connections} connections, think "
        f"{args.think_ms} ms, {args.users:,} users, {args.workers} workers"
        + (f"; alternating with the control ({args.interleave})" if args.interleave else ""))
    print_intro(meta, args, n_windows)
    script = work / "soak.lua"
    next_user = 0
    t0 = time.monotonic()
    for i in range(n_windows):
        if stop[0]:
            break
        win = measure_window(i, gateways, args, wrk, script, next_user, t0)
        next_user += win["wrk_requests"]
        windows.append(win)
        print(row(win), flush=True)
        write_out(args, meta, windows)


def run_wrk_sampling(cmd: list[str], gateway: tuple[str, EnvoyProcess, bool],
                     gateways: list[tuple[str, EnvoyProcess, bool]], args, w0: float) -> tuple[str, list[dict], int, int]:
    """wrk's output, with the level samples (debug dumps), the probe requests they took and the
    largest RSS (kB) seen while it ran; raises when a gateway exits."""
    _, env, dumps = gateway
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    samples: list[dict] = []
    probes = 0
    rss_max = 0
    next_sample = time.monotonic() + min(args.sample, args.window / 2)
    while p.poll() is None:
        if not all(g.alive() for _, g, _ in gateways):
            p.kill()
            dead = next((n, g) for n, g, _ in gateways if not g.alive())
            raise RuntimeError(f"{dead[0]} Envoy exited\n" + dead[1].log_tail(20))
        if time.monotonic() >= next_sample and time.monotonic() < w0 + args.window - 1:
            if dumps:
                try:
                    samples.append(level_sample(env.ports["gateway"]))
                except Exception as e:  # noqa: BLE001
                    log(f"dump sample failed: {e}")
                probes += 2
            rss_max = max(rss_max, proc_status(env.pid)["VmRSS"])
            next_sample += args.sample
        time.sleep(0.1)
    out, _ = p.communicate()
    return out, samples, probes, rss_max


def measure_window(i: int, gateways: list[tuple[str, EnvoyProcess, bool]], args, wrk: str, script: Path,
                   next_user: int, t0: float) -> dict:
    """Window i (on gateway i mod their number): wrk for --window seconds from user `next_user`
    on, and the gateway's CPU, memory and counters before and after."""
    target, env, _ = gateways[i % len(gateways)]
    port = env.ports["gateway"]
    wrk_script(script, args.users, next_user, args.threads, args.think_ms)
    c0, cpu0, w0 = counters(env), proc_cpu_s(env.pid), time.monotonic()
    sched0 = env.cpu_split()["cpu_s"]
    cmd = harness.idle_cmd([wrk, "-t", str(args.threads), "-c", str(args.connections),
                            "-d", f"{args.window:g}s", "--timeout", "10s", "-s", str(script),
                            f"http://127.0.0.1:{port}{PATH}"])
    out, samples, probes, rss_max = run_wrk_sampling(cmd, gateways[i % len(gateways)], gateways, args, w0)
    w1 = time.monotonic()
    cpu1, c1 = proc_cpu_s(env.pid), counters(env)
    sched1 = env.cpu_split()["cpu_s"]
    res = parse_wrk(out)
    if "wrk_failed" in res:
        log("wrk output: " + " / ".join(res["wrk_failed"]))
    next_user += res["wrk_requests"]
    stt = proc_status(env.pid)
    mem = admin_memory(env)
    wm = wasm_memory(env.pid)
    d = {k: c1[k] - c0[k] for k in c1 if k != "stats_count"}
    served = max(1, d["downstream_rq_total"] - probes)
    return dict(index=i + 1, target=target, t_start_min=(w0 - t0) / 60, t_end_min=(w1 - t0) / 60,
                wall_s=w1 - w0, requests=served, probes=probes, rps=served / (w1 - w0),
                cpu_s=cpu1 - cpu0, cpu_us_per_req=(cpu1 - cpu0) / served * 1e6,
                cpu_us_per_req_schedstat=(sched1 - sched0) / served * 1e6,
                rss_mib=stt["VmRSS"] / 1024, rss_max_mib=max(rss_max, stt["VmRSS"]) / 1024,
                rss_anon_mib=stt["RssAnon"] / 1024, rss_file_mib=stt["RssFile"] / 1024,
                hwm_mib=stt["VmHWM"] / 1024, threads=stt.get("Threads"),
                heap_allocated_mib=mem["allocated"] / MiB if "allocated" in mem else None,
                heap_size_mib=mem["heap_size"] / MiB if "heap_size" in mem else None,
                memory=mem, wasm_vms=wm["vms"], wasm_size_mib=wm["size_kb"] / 1024,
                wasm_rss_mib=wm["rss_kb"] / 1024, stats_count=c1["stats_count"], envoy=d,
                level=({k: max(s[k] for s in samples) for k in samples[0]} if samples else None),
                level_samples=len(samples), next_user=next_user % args.users, **res)


def main() -> int:
    args = parse_args()
    if args.from_json:
        return summarize_file(args)
    if args.threads > args.connections:
        args.threads = args.connections
    harness.IDLE_LOAD[0] = args.load_priority == "idle" and shutil.which("chrt") is not None

    envoy_bin = find_envoy()
    wrk = harness.ensure_wrk(not args.no_install)
    if not wrk:
        raise SystemExit("wrk not found (apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="apf-soak-"))
    control = args.filter == "none"
    src, sha, wasm = prepare_module(args, work, control)
    meta = run_meta(args, envoy_bin, src, sha, wasm, control)
    log(f"envoy {meta['envoy']} {envoy_bin}; module {src} ({meta['module_bytes']} bytes, sha256 "
        f"{meta['module_sha256']}…, git {meta['git']}); work dir {work}")

    up = EnvoyProcess(direct_response_config(delay_ms=args.upstream_delay_ms), work, envoy_bin=envoy_bin, concurrency=1,
                      name="upstream", log_level="warning")
    up.start().wait_ready()
    harness.make_idle(up.pid)
    gateways = [start_gateway("gateway", "none" if control else "apf", args, up.ports["direct"], wasm, work,
                              envoy_bin)]
    if args.interleave:
        gateways.append(start_gateway("control", args.interleave, args, up.ports["direct"], wasm, work, envoy_bin))
        meta["interleave"] = args.interleave
    windows: list[dict] = []
    stop = [False]

    def on_term(*_):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        run_windows(gateways, args, wrk, work, meta, windows, stop)
    except KeyboardInterrupt:
        log("interrupted: summarizing the windows done")
    except Exception as e:  # noqa: BLE001 - e.g. the gateway was killed: keep what was measured
        log(f"aborted after {len(windows)} windows: {type(e).__name__}: {e}")
        meta["aborted"] = f"{type(e).__name__}: {e}".splitlines()[0]
        for name, env, _ in gateways:
            if env.proc is not None and env.proc.poll() is not None:
                log(f"{name}: " + env.log_tail(10))
    finally:
        for _, env, _ in gateways:
            env.stop()
        up.stop()
    summary = report(windows, meta, args)
    write_out(args, meta, windows, summary)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def pair_ratios(windows: list[dict], args) -> tuple[str, dict]:
    """apf-wasm ÷ control of the CPU per request over adjacent window pairs (window 2k−1 on
    apf-wasm, 2k on the control) after the warm-up, with its least-squares slope: flat if the
    module's cost does not rise relative to what the machine does."""
    pairs = [(a, b) for a, b in zip(windows[::2], windows[1::2])
             if a["t_start_min"] >= args.warmup_minutes - 1e-9]
    if len(pairs) < 2:
        return "Too few window pairs after the warm-up for a ratio.", {}
    xs = [(a["t_start_min"] + b["t_end_min"]) / 2 for a, b in pairs]
    rs = [a["cpu_us_per_req"] / b["cpu_us_per_req"] for a, b in pairs]
    out = dict(pairs=len(pairs), median_first5=statistics.median(rs[:5]),
               median_last5=statistics.median(rs[-5:]), slope_per_10min=lsq_slope(xs, rs) * 10,
               mean=statistics.mean(rs))
    text = (f"### apf-wasm ÷ control, CPU per request over {len(pairs)} window pairs\n\n"
            f"median of the first 5 pairs {out['median_first5']:.3f}, of the last 5 "
            f"{out['median_last5']:.3f}; mean {out['mean']:.3f}; least-squares slope "
            f"{out['slope_per_10min']:+.4f} per 10 min ({out['slope_per_10min'] / out['mean'] * 100:+.2f} % of the mean).")
    return text, out


def report(windows: list[dict], meta: dict, args) -> dict:
    """Prints the summary (and writes --md: setup line, window table, summary). With windows of
    two gateways (--interleave), a summary of each and of apf-wasm ÷ control per window pair."""
    targets = list(dict.fromkeys(w.get("target", "gateway") for w in windows))
    if len(targets) < 2:
        summary_text, summary = summarize(windows, args, meta)
    else:
        parts, summary = [], {}
        for t in targets:
            text, summary[t] = summarize([w for w in windows if w.get("target", "gateway") == t], args, meta)
            parts.append(f"### {t}\n\n{text}")
        text, summary["ratio"] = pair_ratios(windows, args)
        summary_text = "\n\n".join(parts + [text])
    summary["meta"] = meta
    print()
    print(summary_text, flush=True)
    if args.md:
        head = (f"Envoy {meta['envoy']}, {meta['workers']} workers, {meta['cpus']} CPUs; module "
                f"{meta['git']} (sha256 {meta['module_sha256']}…); policy: {meta['policy']}"
                + (f"; upstream delay {meta['upstream_delay_ms']:g} ms" if meta.get("upstream_delay_ms") else "")
                + f"; wrk {meta['connections']} connections, think time {meta['think_ms']} ms, "
                f"{meta['users']:,} users cycling; {len(windows)} windows of {meta['window_s']:g} s.\n\n")
        table = "\n".join([HEADER, SEP] + [row(w) for w in windows])
        Path(args.md).write_text(head + table + "\n\n" + summary_text + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
