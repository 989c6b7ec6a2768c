#!/usr/bin/env python3
"""Instructions per request of Envoy variants, counted by valgrind's callgrind: deterministic
where CPU time on a shared machine is not (no hardware counters needed).

Each variant's Envoy (`--concurrency 1`, the configuration bench/run.py gives it) runs under
`valgrind --tool=callgrind --separate-threads=yes`; after a warm-up, `callgrind_control --dump`
cuts the counts around a run of N1 and one of N2 requests (one connection, the Python client),
and the figure is (I(N2) − I(N1)) ÷ (N2 − N1) over every thread of the process. Fixed costs
cancel; what runs on a timer does not: under callgrind a request takes ~50× longer, so timer
work (the gateway's tick and stats flush, scheduled events) is ~50× too heavy per request. It
is reported apart (`timed`: the inclusive counts of those entry points) and left out of the
`request path` figure. `allocations` counts the calls into a Rust module's allocator
(`__rust_alloc`, `__rust_alloc_zeroed`, `__rust_realloc`) per request, timer work included.
Profiles stay in the work directory for `callgrind_annotate`.

Usage: python3 bench/instructions.py [--variants none,local_ratelimit,native-floor,apf-native]
                                      [--apf-native SO] [--n1 500] [--n2 2500] [--keep DIR]
"""

from __future__ import annotations

import argparse
import glob
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from apfkit import apf_policy  # noqa: E402
from apfkit.envoy_template import direct_response_config  # noqa: E402
from apfkit.envoyproc import EnvoyProcess, find_envoy  # noqa: E402
from bench import run as R  # noqa: E402
from bench.native import build_native_floor, find_apf_native, module_env  # noqa: E402

# Entry points run by timers, not by requests (their inclusive counts, per dump).
TIMED = ("apf_wasm::gateway::stats::Stats::flush [", "apf_wasm::gateway::root::Root::on_tick [",
         "apf_wasm::native::glue::scheduled [", "apf_wasm::native::glue::config_scheduled [",
         "envoy_dynamic_module_on_http_filter_scheduled [",
         "envoy_dynamic_module_on_http_filter_config_scheduled [")


def spec_of(variant: str, mods: dict[str, Path]) -> dict:
    if variant == "none":
        return dict(name="none", http_filter="none")
    if variant == "local_ratelimit":
        return dict(name="local_ratelimit", http_filter="local_ratelimit")
    cfg = apf_policy.plugin_config() if variant == "apf-native" else {}
    return dict(name=variant, http_filter="native", native=mods[variant], cfg=cfg)


def callgrind_wrapper(work: Path, envoy: str) -> Path:
    w = work / "envoy-callgrind.sh"
    w.write_text("#!/bin/sh\nexec valgrind --tool=callgrind --separate-threads=yes "
                 f"--callgrind-out-file={work}/callgrind.out.%p {envoy} \"$@\"\n")
    w.chmod(0o755)
    return w


def dumps(work: Path, spec: dict, upstream: int, envoy: str, n1: int, n2: int) -> None:
    """Runs the variant under callgrind: dumps 1 (warm-up), 2 (n1 requests), 3 (n2)."""
    cfg = R.variant_config(spec, R.parse_args([]), upstream)
    env = EnvoyProcess(cfg, work, envoy_bin=str(callgrind_wrapper(work, envoy)), concurrency=1,
                       name="gw", log_level="warning", env=module_env(spec.get("native")))
    env.start()
    try:
        env.wait_ready(timeout=600)
        port = env.ports["gateway"]
        R.run_python(port, 300, 1)
        time.sleep(1)
        for label, n in (("warm", 0), ("n1", n1), ("n2", n2)):
            if n:
                R.run_python(port, n, 1)
            subprocess.run(["callgrind_control", "-d", label, str(env.pid)], check=True,
                           capture_output=True)
    finally:
        env.stop(timeout=60)


def counts(work: Path, part: int) -> tuple[int, int]:
    """(all instructions, those under TIMED entry points) of one dump, over all threads; an
    entry point called from another one (the tick's stats flush) is counted once."""
    total = timed = 0
    for f in glob.glob(f"{work}/callgrind.out.*.{part}-*"):
        out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=caller",
                              "--threshold=100", f], capture_output=True, text=True,
                             check=True).stdout
        total += sum(int(m[1].replace(",", "")) for m in
                     re.finditer(r"^\s*([\d,]+) \S*\s*PROGRAM TOTALS", out, re.M))
        for block in out.split("\n\n"):
            lines = [x for x in block.splitlines() if re.match(r"\s*[\d,]+ ", x)]
            head = [x for x in lines if "*  " in x]
            if not head or not any(t in head[0] for t in TIMED):
                continue
            own = int(head[0].split()[0].replace(",", ""))
            callers = [x for x in lines if "*  " not in x and " < " in x]
            nested = sum(int(x.split()[0].replace(",", "")) for x in callers
                         if any(t.removesuffix(" [") + " (" in x for t in TIMED))
            timed += own - nested
    return total, timed


ALLOCATORS = ("__rustc::__rust_alloc", "__rustc::__rust_alloc_zeroed", "__rustc::__rust_realloc")


def allocations(work: Path, part: int) -> int:
    """Calls into a Rust module's allocator in one dump, over all threads (callgrind's raw
    `cfn=`/`calls=` lines; names are compressed to `(id)` after their first use)."""
    n = 0
    for f in glob.glob(f"{work}/callgrind.out.*.{part}-*"):
        names: dict[str, str] = {}
        callee = None
        for line in open(f, errors="replace"):
            if line.startswith(("cfn=", "fn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m[2]:
                    names[m[1]] = m[2]
                callee = names.get(m[1]) if m and line.startswith("cfn=") else None
            elif line.startswith("calls=") and callee in ALLOCATORS:
                n += int(line[6:].split()[0])
                callee = None
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="none,local_ratelimit,native-floor,apf-native")
    ap.add_argument("--apf-native", help="the native module (default: $APF_NATIVE or ./native-build.sh)")
    ap.add_argument("--n1", type=int, default=500)
    ap.add_argument("--n2", type=int, default=2500)
    ap.add_argument("--keep", help="write the profiles here (default: a temporary directory)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    mods: dict[str, Path] = {}
    if "native-floor" in variants:
        mods["native-floor"] = build_native_floor(R.target_dir() / "bench-native-floor")
    if "apf-native" in variants:
        so = find_apf_native(args.apf_native)
        if so is None:
            raise SystemExit("apf-native: no module")
        mods["apf-native"] = so
    base = Path(args.keep or tempfile.mkdtemp(prefix="apf-instr-"))
    envoy = find_envoy()
    up = EnvoyProcess(direct_response_config(), base, envoy_bin=envoy, concurrency=1,
                      name="upstream", log_level="warning")
    up.start().wait_ready()
    print("| variant | instructions/request | timed | request path | allocations |\n|---|---|---|---|---|")
    try:
        for v in variants:
            work = base / v
            work.mkdir(parents=True, exist_ok=True)
            dumps(work, spec_of(v, mods), up.ports["direct"], envoy, args.n1, args.n2)
            (a, ta), (b, tb) = counts(work, 2), counts(work, 3)
            n = args.n2 - args.n1
            per, timed = (b - a) / n, (tb - ta) / n
            allocs = (allocations(work, 3) - allocations(work, 2)) / n
            print(f"| {v} | {per:,.0f} | {timed:,.0f} | {per - timed:,.0f} | {allocs:.1f} |", flush=True)
    finally:
        up.stop()
    print(f"profiles: {base}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
