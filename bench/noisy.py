"""Noisy neighbours, bench/run.py's variant apf-noisy: one Limited level of `--noisy-seats` seats
in front of the (Python) test upstream, which holds every request `--noisy-service-ms` ±
`--noisy-jitter` (drawn per request by the client from seeded generators, sent as
`x-sleep-ms`). Every request is a GET (one seat); every flow is a user of
`system:authenticated`, which gets the explain headers.

Phases: (1) the closed-loop quiet flow `quiet-cl` alone (`--noisy-quiet-connections`
connections, each sending its next request when the previous answer returns), half of
`--noisy-standalone-seconds`; (2) the noisy run, 2 s warm-up then `--noisy-seconds`: heavy
flows `heavy-a` and `heavy-b` (`--noisy-heavy-connections` closed-loop connections each; a
429 backs off 20 ms), `quiet-cl` as in (1), and the open-loop flow `quiet` at
`--noisy-quiet-rps` (0: none), one request per fresh connection; (3) `quiet-cl` alone again
(the other half: its standalone rate is over (1) and (3), so a drift of the machine's speed
cancels out). Counted per flow: the 200s completed in the window, and the queue waits
(`x-apf-queued-ms`). Reported: req/s per flow, Jain's index (Σx)²/(n·Σx²) over the heavy
flows, `quiet-cl`'s throughput kept (noisy ÷ standalone req/s) and queue-wait percentiles,
the open-loop flow's served share (200s / requests sent) and latency."""

from __future__ import annotations

import http.client
import random
import statistics
import threading
import time
from pathlib import Path

from apfkit import apf_policy
from apfkit.envoy_template import gateway_config
from apfkit.envoyproc import EnvoyProcess
from apfkit.phases import pct
from apfkit.upstream import Upstream

GROUP = "system:authenticated"
PATH = "/api/v1/namespaces/default/pods/demo-pod"
WARMUP = 2.0  # seconds of the noisy run before its window
ALONE_WARMUP = 0.5  # seconds of each standalone half before its window


class Flows:
    """The flows' requests to one gateway port; outcomes recorded under one lock."""

    def __init__(self, port: int, service_ms: float, jitter: float, rnd: int) -> None:
        self.port, self.service_ms, self.jitter, self.rnd = port, service_ms, jitter, rnd
        self.lock = threading.Lock()

    def one(self, c, user: str, rng: random.Random) -> tuple[int | None, int | None, int | None]:
        """(status, x-apf-queued-ms, x-apf-seats) of one request on connection `c`."""
        ms = self.service_ms * (1.0 + rng.uniform(-self.jitter, self.jitter))
        try:
            c.request("GET", PATH, headers={"X-Remote-User": user, "X-Remote-Group": GROUP,
                                            "x-sleep-ms": f"{ms:.3f}"})
            r = c.getresponse()
            r.read()
            q, st = r.getheader("x-apf-queued-ms"), r.getheader("x-apf-seats")
            return r.status, int(q) if q else None, int(st) if st else None
        except Exception:  # noqa: BLE001
            c.close()
            return None, None, None

    def closed_loops(self, conns: dict[str, int], t0: float, t1: float,
                     rngs: dict | None = None) -> dict[str, dict]:
        """Closed loops until t1; per user: 200s and queue waits completed in [t0, t1),
        other outcomes, the largest seat count charged. Connection i of a user draws its
        service times from its own generator, seeded alike in every phase; `rngs` keeps
        them from one call to the next (the sequences continue instead of starting over)."""
        out = {u: {"ok": 0, "rejected": 0, "waits": [], "seats": 0} for u in conns}
        rngs = {} if rngs is None else rngs
        for u, n in conns.items():
            for i in range(n):
                rngs.setdefault((u, i), random.Random(f"noisy/{self.rnd}/{u}/{i}"))
        threads = [threading.Thread(target=self._loop, args=(out[u], u, rngs[(u, i)], t0, t1), daemon=True)
                   for u, n in conns.items() for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=t1 - time.monotonic() + 60)
        return out

    def _loop(self, o: dict, user: str, rng: random.Random, t0: float, t1: float) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while time.monotonic() < t1:
            st, waited, seats = self.one(c, user, rng)
            done = time.monotonic()
            if t0 <= done < t1:
                with self.lock:
                    if st == 200:
                        o["ok"] += 1
                        if waited is not None:
                            o["waits"].append(waited)
                    else:
                        o["rejected"] += 1
                    o["seats"] = max(o["seats"], seats or 0)
            if st != 200:
                time.sleep(0.02)
        c.close()

    def alone(self, conns: int, seconds: float, rngs: dict) -> tuple[int, float]:
        """`quiet-cl` alone: (200s, window seconds)."""
        t = time.monotonic()
        t0, t1 = t + ALONE_WARMUP, t + ALONE_WARMUP + seconds
        return self.closed_loops({"quiet-cl": conns}, t0, t1, rngs)["quiet-cl"]["ok"], t1 - t0

    def open_loop(self, rps: float, t0: float, t1: float, quiet: dict) -> list[threading.Thread]:
        """The open-loop flow `quiet`: from t0 to t1, one request every 1/rps s, each on a fresh
        connection in a thread of its own (returned, still running)."""
        senders: list[threading.Thread] = []
        period, nxt = 1.0 / rps, t0
        while nxt < t1:
            time.sleep(max(0.0, nxt - time.monotonic()))
            q = threading.Thread(target=self._quiet_one, args=(nxt, quiet["sent"], quiet), daemon=True)
            q.start()
            senders.append(q)
            quiet["sent"] += 1
            nxt += period
        return senders

    def _quiet_one(self, sent_at: float, i: int, quiet: dict) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        st, _, _ = self.one(c, "quiet", random.Random(f"noisy/{self.rnd}/quiet/{i}"))
        c.close()
        with self.lock:
            if st == 200:
                quiet["ok"] += 1
                quiet["lat"].append(time.monotonic() - sent_at)
            else:
                quiet["rejected"] += 1


def measure_noisy(args, envoy_bin: str, wasm: Path, workdir: Path, rnd: int = 0) -> dict:
    """One round of the noisy-neighbour run (the module doc) on a fresh upstream and gateway."""
    up = Upstream().start()
    # Without TCP_NODELAY the test upstream's answers on kept-alive connections take ~40 ms more
    # than the service time asked (its head and body leave in two writes: Nagle + delayed ACK).
    up.set_nodelay()
    cfg = apf_policy.single_level_config(args.noisy_seats, group=GROUP, queues=128,
                                         hand_size=6, queue_length_limit=50, explainGroups=[GROUP])
    env = EnvoyProcess(gateway_config(upstream_port=up.port, wasm_path=str(wasm), plugin_config=cfg,
                                      http_filter="wasm"),
                       workdir, envoy_bin=envoy_bin, concurrency=args.workers_noisy,
                       name="gw-noisy", log_level="warning")
    env.start()
    try:
        env.wait_ready(timeout=60)
        return run_phases(args, Flows(env.ports["gateway"], args.noisy_service_ms, args.noisy_jitter, rnd))
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0], "log": env.log_tail(15)}
    finally:
        env.stop()
        up.stop()


def run_phases(args, flows: Flows) -> dict:
    """quiet-cl alone, the noisy run, quiet-cl alone again; the round's summary."""
    qconns = args.noisy_quiet_connections
    # quiet-cl alone: the second half continues the first half's service-time sequences,
    # so alone and in the noisy run it draws about the same values.
    alone_rngs: dict = {}
    half = args.noisy_standalone_seconds / 2
    ok1, w1 = flows.alone(qconns, half, alone_rngs)

    t_start = time.monotonic()
    t0, t1 = t_start + WARMUP, t_start + WARMUP + args.noisy_seconds
    quiet = {"sent": 0, "ok": 0, "rejected": 0, "lat": []}
    loops: dict[str, dict] = {}
    runner = threading.Thread(target=lambda: loops.update(flows.closed_loops(
        {"heavy-a": args.noisy_heavy_connections, "heavy-b": args.noisy_heavy_connections,
         "quiet-cl": qconns}, t0, t1)), daemon=True)
    runner.start()
    senders = flows.open_loop(args.noisy_quiet_rps, t0, t1, quiet) if args.noisy_quiet_rps > 0 else []
    runner.join(timeout=t1 - time.monotonic() + 120)
    for q in senders:
        q.join(timeout=60)

    ok2, w2 = flows.alone(qconns, half, alone_rngs)
    return summary(args, loops, quiet, t1 - t0, (ok1, w1), (ok2, w2))


def summary(args, loops: dict[str, dict], quiet: dict, secs: float, before: tuple[int, float],
            after: tuple[int, float]) -> dict:
    """The round's numbers from the noisy run's flows (`loops`, `quiet`) over its window of
    `secs` and quiet-cl's standalone halves ((200s, seconds) before and after)."""
    (ok1, w1), (ok2, w2) = before, after
    xa, xb = loops["heavy-a"]["ok"] / secs, loops["heavy-b"]["ok"] / secs
    jain = (xa + xb) ** 2 / (2 * (xa * xa + xb * xb)) if xa + xb > 0 else float("nan")
    cl = loops["quiet-cl"]
    alone_rps = (ok1 + ok2) / (w1 + w2)
    cl_rps = cl["ok"] / secs
    waits = sorted(cl["waits"])
    lat = sorted(quiet["lat"])
    sent = quiet["sent"]
    return dict(heavy_a_rps=xa, heavy_b_rps=xb, jain=jain,
                cl_alone_rps=alone_rps, cl_alone_before_rps=ok1 / w1, cl_alone_after_rps=ok2 / w2,
                cl_rps=cl_rps, cl_kept=cl_rps / alone_rps if alone_rps else float("nan"),
                cl_wait_p50_ms=pct(waits, 0.5), cl_wait_p90_ms=pct(waits, 0.9),
                cl_wait_p99_ms=pct(waits, 0.99), cl_wait_max_ms=waits[-1] if waits else float("nan"),
                cl_wait_mean_ms=sum(waits) / len(waits) if waits else float("nan"),
                heavy_wait_p50_ms=pct(sorted(loops["heavy-a"]["waits"] + loops["heavy-b"]["waits"]), 0.5),
                quiet_rps=quiet["ok"] / secs if sent else float("nan"),
                quiet_demand_rps=sent / secs if sent else float("nan"),
                quiet_share=quiet["ok"] / sent if sent else float("nan"),
                quiet_p50_ms=pct(lat, 0.5) * 1e3, quiet_p99_ms=pct(lat, 0.99) * 1e3,
                rejected={u: o["rejected"] for u, o in loops.items() if o["rejected"]}
                | ({"quiet": quiet["rejected"]} if quiet["rejected"] else {}),
                max_seats=max(o["seats"] for o in loops.values()),
                capacity_rps=args.noisy_seats / (args.noisy_service_ms / 1000))


def round_line(r: dict) -> str:
    """One round's result as bench/run.py logs it."""
    if "jain" not in r:
        return f"FAILED {r['error']}"
    return (f"Jain {r['jain']:.4f}, quiet-cl kept {r['cl_kept'] * 100:.1f} % "
            f"({r['cl_rps']:.1f} of {r['cl_alone_rps']:.1f} req/s alone: "
            f"{r['cl_alone_before_rps']:.1f} before, {r['cl_alone_after_rps']:.1f} after), "
            f"wait p50 {r['cl_wait_p50_ms']:.0f} / p90 {r['cl_wait_p90_ms']:.0f} / "
            f"max {r['cl_wait_max_ms']:.0f} ms (mean {r['cl_wait_mean_ms']:.1f}), "
            f"open-loop quiet share {r['quiet_share'] * 100:.1f} %, "
            f"max seats per request {r['max_seats']}")


def noisy_section(args, rs: list[dict]) -> str:
    """The noisy table with the run's shape and targets above it."""
    return (f"apf-noisy ({args.noisy_seats} seats, service {args.noisy_service_ms:.0f} ms "
            f"± {args.noisy_jitter:.0%} ≈ {args.noisy_seats * 1000 / args.noisy_service_ms:.0f} "
            f"req/s capacity, {args.workers_noisy} workers; heavy-a, heavy-b "
            f"{args.noisy_heavy_connections} closed-loop connections each, quiet-cl "
            f"{args.noisy_quiet_connections}, open-loop quiet {args.noisy_quiet_rps:g} req/s; "
            f"{args.noisy_seconds:g} s per round, quiet-cl alone {args.noisy_standalone_seconds:g} s; "
            "targets: Jain ≥ 0.99, quiet-cl kept ≥ 90 % with wait p50 ≤ 2 × service ÷ seats, "
            "open-loop share ≥ 90 %):\n\n" + noisy_table(rs))


def noisy_table(rs: list[dict]) -> str:
    f0 = lambda v: "–" if v != v else f"{v:.0f}"  # noqa: E731
    lines = ["| round | heavy-a req/s | heavy-b req/s | Jain (heavy) | quiet-cl alone req/s | quiet-cl "
             "req/s | **kept** | quiet-cl wait p50 / p90 / p99 / max ms | heavy wait p50 ms | open-loop "
             "quiet req/s (demand) | share | p50 / p99 ms | 429s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rs):
        if "error" in r:
            lines.append(f"| {i + 1} | failed: {r['error']} |" + " |" * 11)
            continue
        lines.append(
            f"| {i + 1} | {r['heavy_a_rps']:.1f} | {r['heavy_b_rps']:.1f} | {r['jain']:.4f} | "
            f"{r['cl_alone_rps']:.1f} | {r['cl_rps']:.1f} | {r['cl_kept'] * 100:.1f} % | "
            f"{f0(r['cl_wait_p50_ms'])} / {f0(r['cl_wait_p90_ms'])} / {f0(r['cl_wait_p99_ms'])} / "
            f"{f0(r['cl_wait_max_ms'])} | {f0(r['heavy_wait_p50_ms'])} | "
            f"{r['quiet_rps']:.1f} ({r['quiet_demand_rps']:.1f}) | {r['quiet_share'] * 100:.1f} % | "
            f"{f0(r['quiet_p50_ms'])} / {f0(r['quiet_p99_ms'])} | {r['rejected'] or 0} |")
    good = [r for r in rs if "error" not in r]
    if len(good) > 1:
        m = lambda k: statistics.median([r[k] for r in good])  # noqa: E731
        lines.append(
            f"| median | {m('heavy_a_rps'):.1f} | {m('heavy_b_rps'):.1f} | {m('jain'):.4f} | "
            f"{m('cl_alone_rps'):.1f} | {m('cl_rps'):.1f} | {m('cl_kept') * 100:.1f} % | "
            f"{f0(m('cl_wait_p50_ms'))} / {f0(m('cl_wait_p90_ms'))} / {f0(m('cl_wait_p99_ms'))} / "
            f"{f0(m('cl_wait_max_ms'))} | {f0(m('heavy_wait_p50_ms'))} | {m('quiet_rps'):.1f} "
            f"({m('quiet_demand_rps'):.1f}) | {m('quiet_share') * 100:.1f} % | | |")
    return "\n".join(lines)
