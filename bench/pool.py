#!/usr/bin/env python3
"""Pool per-round ratios over several runs of bench/run.py.

Reads the window lines `[bench] window i/N <variant>|<workers>: X us/req` that run.py prints
(stderr; save them with `python3 bench/run.py ... 2> run.log` or `> run.log 2>&1`), forms the
ratio of two variants in every round where both ran, pools the rounds of all the logs and
prints the median, mean, quartiles and a bootstrap 95 % interval of the median.

Usage: python3 bench/pool.py LOG [LOG ...] [--ratio A/B ...] [--metric M]
  A and B are `<variant>|<workers>` as in the window lines. `A/B//C/D` is a ratio of ratios,
  (A ÷ B) ÷ (C ÷ D) in every round. Default ratios: the saturated shape's (apf 2 ÷ 1 workers,
  control ÷ apf 1 worker, apf ÷ control, localqueue 2 ÷ 1, and apf's 2 ÷ 1 over localqueue's:
  what a second worker costs apf-wasm beyond what it costs the trivial localqueue reference in
  the same round; with lq-global, what global seats cost a trivial module, and apf's sharing
  cost over that) and the uncontended apf ÷ floor, each where the logs have all variants.
  --metric pools another per-window figure instead of the CPU per request: `user` or `sys`
  (the Envoy process's user / kernel CPU per request), `workers` (its worker threads' CPU),
  `sleeps` or `preempted` (its workers' voluntary / involuntary context switches per request);
  logs written before the CPU split (2026-11-24) have only the CPU per request.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics

WINDOW = re.compile(r"\[bench\] window (\d+)/\d+ (\S+): ([\d.]+) us/req(.*)")
FIELD = re.compile(r"(\w+)=([\d.]+)")
# --metric: "cpu" is the figure before `us/req`; the others are `name=value` fields after it.
METRICS = ("cpu", "user", "sys", "workers", "sleeps", "preempted")
DEFAULT = [
    "apf-saturated|2/apf-saturated|1",
    "isolated-saturated|2/apf-saturated|1",
    "apf-saturated|2/isolated-saturated|2",
    "localqueue-saturated|2/localqueue-saturated|1",
    "apf-saturated|2/apf-saturated|1//localqueue-saturated|2/localqueue-saturated|1",
    "lq-global|2/localqueue-saturated|2",
    "apf-saturated|2/isolated-saturated|2//lq-global|2/localqueue-saturated|2",
    "apf|1/floor|1",
]


def rounds(path: str, metric: str = "cpu") -> list[dict[str, float]]:
    by_round: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = WINDOW.search(line)
            if not m:
                continue
            v = m[3] if metric == "cpu" else dict(FIELD.findall(m[4])).get(metric)
            if v is not None:
                by_round.setdefault(int(m[1]), {})[m[2]] = float(v)
    return [by_round[k] for k in sorted(by_round)]


def bootstrap_median(xs: list[float], n: int = 4000) -> tuple[float, float]:
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(n * 0.025)], meds[int(n * 0.975) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--ratio", action="append", help="A/B, e.g. 'apf-saturated|2/apf-saturated|1'")
    ap.add_argument("--metric", choices=METRICS, default="cpu",
                    help="the per-window figure to pool (default: CPU per request)")
    args = ap.parse_args()
    all_rounds = [r for path in args.logs for r in rounds(path, args.metric)]
    for spec in args.ratio or DEFAULT:
        parts = [p.split("/", 1) for p in spec.split("//")]
        names = [n for p in parts for n in p]
        xs = []
        for r in all_rounds:
            if all(r.get(n, 0) > 0 for n in names):
                x = r[parts[0][0]] / r[parts[0][1]]
                for c, d in parts[1:]:
                    x /= r[c] / r[d]
                xs.append(x)
        label = " ÷ ".join(f"({a} ÷ {b})" if len(parts) > 1 else f"{a} ÷ {b}" for a, b in parts)
        if len(xs) < 2:
            if args.ratio:
                print(f"{label}: fewer than 2 rounds with all of them")
            continue
        q1, _, q3 = statistics.quantiles(xs, n=4)
        lo, hi = bootstrap_median(xs)
        print(f"{label}: {len(xs)} rounds, median {statistics.median(xs):.3f} "
              f"(95 % interval {lo:.3f}–{hi:.3f}), mean {statistics.mean(xs):.3f}, "
              f"quartiles {q1:.2f}–{q3:.2f}")


if __name__ == "__main__":
    main()
