"""LIST and WATCH costs from the cluster's own numbers (kubernetes-apf.md §6.3, §6.4, §6.6, §6.7).

The gateway polls the protected apiserver's `/metrics` through the Envoy cluster `apiserver`
(`workEstimator.clusterMetrics`) for object counts and sizes, and charges LISTs and WATCHes the
seats kube-apiserver's work estimator would: a storage LIST ceil(count × avg / 100 000), a LIST
or WATCH from the watch cache ceil(min(count × avg, 1 000 000) / 100 000), 1 seat for a resource
the cluster does not report, the level's max seats when the counts are stale; always clamped to
[1, plMaxSeats], plMaxSeats = max(1, min(ceil(NominalCL × 0.15), NominalCL div handSize)).
A WATCH keeps its seats while its initial state streams: up to the bookmark annotated
`k8s.io/initial-events-end` (sendInitialEvents=true), until the body is quiet (legacy watches),
at most `watchInitialEventsMaxHold`.

Every level here has lendablePercent 0 and borrowingLimitPercent 0 (apf_policy's default), so its
concurrency limit is exactly its NominalCL = ceil(S × NCS / ΣNCS), ΣNCS counting the mandatory
catch-all (5) and exempt (0) levels. The numbers below were checked with
`apf check --config <file>` (the NominalCL and max-seats columns).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import threading
import time

import pytest

from apfkit import client
from apfkit.apf_policy import plugin_config, priority_level, flow_schema
from apfkit.envoyproc import wait_until
from apfkit.observe import parse_prometheus
from apfkit.work_estimate import BYTES_PER_SEAT, list_seats, pl_max_seats

pytestmark = pytest.mark.apf

EXPLAIN = "e2e-explain"
TOKEN = "s3cret"
AUTHORITY = "kubernetes.default.svc"
# What client-go's reflector sends for a WatchList (initial state as events, then a bookmark).
WATCHLIST = "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&watch=true"

def cluster_metrics(period: str, **kw) -> dict:
    return dict({"cluster": "apiserver", "authority": AUTHORITY, "token": TOKEN, "period": period,
                 "timeout": "5s"}, **kw)


def level_config(server_limit: int, levels: list[dict], *, work_estimator: dict,
                 request_timeout: str = "60s") -> dict:
    """suggestedDefaults off: exempt (0 shares), catch-all (5 shares) and `levels`, each
    {name, ncs, queues, hand, qll, users | groups} with a ByUser FlowSchema of the same name."""
    policy: list[dict] = []
    for lv in levels:
        policy.append(priority_level(lv["name"], lv["ncs"], queues=lv["queues"], hand_size=lv["hand"],
                                     queue_length_limit=lv["qll"]))
        policy.append(flow_schema(lv["name"], lv["name"], precedence=500, users=lv.get("users"),
                                  groups=lv.get("groups")))
    return plugin_config(serverConcurrencyLimit=server_limit, requestTimeout=request_timeout,
                         suggestedDefaults=False, policy=policy, workEstimator=work_estimator)


# -- helpers --------------------------------------------------------------------------------------

def seats(r) -> int | None:
    v = r.h("x-apf-seats")
    return int(v) if v is not None and v.strip().isdigit() else None


def probe(gw, path: str, user: str, groups=(EXPLAIN,)) -> client.Result:
    return gw.request(path, user=user, groups=groups, timeout=10)


def steady_seats(gw, path: str, user: str, groups, want: int, timeout: float, what: str) -> None:
    """Wait until `want` seats are charged on several fresh connections in a row (so on both
    workers)."""
    def ok() -> bool:
        for _ in range(6):
            r = probe(gw, path, user, groups)
            if r.status != 200 or seats(r) != want:
                ok.last = r  # type: ignore[attr-defined]
                return False
        return True
    ok.last = None  # type: ignore[attr-defined]
    try:
        wait_until(ok, timeout=timeout, interval=0.05, what=what)
    except TimeoutError as e:
        last = ok.last  # type: ignore[attr-defined]
        raise AssertionError(gw.fail_msg(f"{e}; last probe {last!r} x-apf-seats={last and last.h('x-apf-seats')}"
                                         f" headers={last and last.headers}")) from None


def first_seats(gw, path: str, user: str, groups, want: int, timeout: float) -> tuple[client.Result, list[client.Result]]:
    """Probe every 50 ms until a response charges `want` seats: (that response, the ones before)."""
    before: list[client.Result] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = probe(gw, path, user, groups)
        if r.status == 200 and seats(r) == want:
            return r, before
        before.append(r)
        time.sleep(0.05)
    last = before[-1] if before else None
    raise AssertionError(gw.fail_msg(f"no probe of {path} charged {want} seats within {timeout}s; "
                                     f"last {last!r} x-apf-seats={last and last.h('x-apf-seats')}"))


def counts_dump(gw) -> dict[str, dict[str, str]]:
    """dump_object_counts as {Resource: row} (comment lines skipped)."""
    r = gw.debug_dump("object_counts")
    assert r.status == 200, gw.fail_msg(f"dump_object_counts: {r!r} {r.body[:200]!r}")
    lines = [ln for ln in r.body.decode(errors="replace").splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines, gw.fail_msg(f"empty dump_object_counts: {r.body!r}")
    cols = [c.strip() for c in lines[0].split(",")]
    assert cols == ["Resource", "ObjectCount", "AverageObjectSizeBytes", "Source", "AgeSeconds", "Stale"], cols
    rows = [dict(zip(cols, (c.strip() for c in ln.split(",")))) for ln in lines[1:]]
    return {row["Resource"]: row for row in rows}


def cluster_row(gw, resource: str, count: int, avg: int) -> dict[str, str] | None:
    """The dump's row for `resource` if it shows (count, avg) from the cluster, else None."""
    row = counts_dump(gw).get(resource)
    if row and row["Source"] == "cluster" and int(row["ObjectCount"]) == count \
            and int(row["AverageObjectSizeBytes"]) == avg:
        return row
    return None


def wait_counts(gw, resource: str, count: int, avg: int, timeout: float = 20.0) -> dict[str, str]:
    try:
        return wait_until(lambda: cluster_row(gw, resource, count, avg), timeout=timeout, interval=0.1,
                          what=f"dump_object_counts shows {resource} = {count} × {avg} B from the cluster")
    except TimeoutError as e:
        raise AssertionError(gw.fail_msg(f"{e}\n{gw.debug_dump('object_counts').body.decode(errors='replace')}")) from None


def own_metric(gw, name: str) -> float:
    """The filter's own counter or gauge `name` in /stats/prometheus (summed over series; the
    Envoy prefix, if any, ignored)."""
    return sum(v for n, _, v in parse_prometheus(gw.stats_prometheus()) if n == name or n.endswith("_" + name))


def is_stale(row: dict[str, str]) -> bool:
    return row["Stale"].strip().lower() == "true"


# -- 1. a LIST storm is charged its size ---------------------------------------------------------

# S = 30; shares: lister 14, quiet 11, catch-all 5 (exempt 0) → ΣNCS = 30.
# NominalCL(lister) = ceil(30·14/30) = 14, NominalCL(quiet) = ceil(30·11/30) = 11.
# plMaxSeats(lister) = max(1, min(ceil(14·0.15) = ceil(2.1) = 3, 14 div 4 = 3)) = 3.
# /metrics: 50 000 pods of 4 000 B → a storage LIST (no resourceVersion) would cost
# ceil(50 000·4 000 / 100 000) = 2 000 seats → clamped to 3; at most ⌊14 / 3⌋ = 4 LISTs at once.
STORM_S = 30
LISTER_CL, LISTER_HAND = 14, 4
LISTER_SEATS = 3
LISTER_CONCURRENCY = 4  # ⌊14 / 3⌋
STORM_PODS = (50_000, 4_000)
STORM_LISTS, STORM_HOLD_MS = 40, 300


def test_list_storm_is_charged_the_levels_max_seats(gateway):
    assert pl_max_seats(LISTER_CL, LISTER_HAND) == LISTER_SEATS
    assert list_seats(*STORM_PODS, LISTER_SEATS, from_cache=False) == LISTER_SEATS
    assert LISTER_CL // LISTER_SEATS == LISTER_CONCURRENCY
    gw = gateway(level_config(STORM_S, [
        dict(name="lister", ncs=14, queues=8, hand=LISTER_HAND, qll=50, users=["lister"]),
        dict(name="quiet", ncs=11, queues=8, hand=2, qll=50, users=["quiet"]),
    ], work_estimator={"clusterMetrics": cluster_metrics("1s")}))
    gw.upstream.set_object_counts({"pods": STORM_PODS})
    steady_seats(gw, "/api/v1/pods", "lister", (EXPLAIN,), LISTER_SEATS, timeout=20,
                 what=f"a cluster-wide LIST charged {LISTER_SEATS} seats")

    gw.upstream.set_pods(1000, 4000)  # each LIST answer is ~4 MB
    gw.upstream.reset()
    plans = [[client.Req(path="/api/v1/pods?limit=500", user="lister", groups=(EXPLAIN,),
                         headers={"x-sleep-ms": str(STORM_HOLD_MS)})] for _ in range(STORM_LISTS)]
    storm: list[client.Result] = []
    done = threading.Event()

    def run_storm() -> None:
        try:
            storm.extend(gw.run_connections(plans, timeout=30))
        finally:
            done.set()

    t0 = time.monotonic()
    threading.Thread(target=run_storm, daemon=True).start()
    quiet: list[client.Result] = []
    while not done.is_set() and time.monotonic() - t0 < 60:
        quiet.append(gw.request("/api/v1/namespaces/default/pods/quiet-pod", user="quiet", timeout=10))
        time.sleep(0.02)
    assert done.wait(60), "the LIST storm did not finish"
    storm_s = time.monotonic() - t0

    assert len(storm) == STORM_LISTS and all(r.status == 200 for r in storm), \
        gw.fail_msg(f"LISTs: {client.status_counts(storm)} {[r for r in storm if r.status != 200][:3]}")
    assert all(seats(r) == LISTER_SEATS and r.h("x-apf-prioritylevel") == "lister" for r in storm), \
        [(r.h("x-apf-seats"), r.h("x-apf-prioritylevel")) for r in storm][:5]
    assert all(len(r.body) > 3_000_000 for r in storm), sorted({len(r.body) for r in storm})
    snap = gw.upstream.snapshot()
    lister_max = snap["per_user_max_in_flight"].get("lister", 0)
    assert lister_max <= LISTER_CONCURRENCY, gw.fail_msg(f"{lister_max} LISTs at once > {LISTER_CONCURRENCY}: {snap}")
    assert lister_max == LISTER_CONCURRENCY, gw.fail_msg(f"seats left unused: at most {lister_max} LISTs at once")
    # 40 LISTs, 4 at a time, each held 300 ms upstream: at least 10 rounds.
    assert storm_s >= (STORM_LISTS / LISTER_CONCURRENCY) * STORM_HOLD_MS / 1000 * 0.9, storm_s

    assert len(quiet) >= 5, f"only {len(quiet)} quiet GETs during a {storm_s:.1f}s storm"
    assert all(r.status == 200 for r in quiet), client.status_counts(quiet)
    slow = [r for r in quiet if r.elapsed >= 1.0]
    assert not slow, gw.fail_msg(f"quiet GETs slowed by the storm: {slow[:5]}")
    med = statistics.median(r.elapsed for r in quiet)
    print(f"list storm: {STORM_LISTS} LISTs in {storm_s:.2f}s, at most {lister_max} at once; {len(quiet)} quiet "
          f"GETs, median {med * 1000:.0f} ms, max {max(r.elapsed for r in quiet) * 1000:.0f} ms")
    assert med < STORM_HOLD_MS / 1000 / 2, f"quiet median {med:.3f}s over {len(quiet)} GETs"


# -- 2. the costs follow the cluster's counts ------------------------------------------------------

# S = 105; shares: counter 100, catch-all 5 → NominalCL(counter) = ceil(105·100/105) = 100.
# plMaxSeats = max(1, min(ceil(100·0.15) = 15, 100 div 4 = 25)) = 15.
#   pods 100 × 1 000 B            → storage LIST ceil(100 000 / 100 000)   =  1
#   pods 500 × 2 000 B            → storage LIST ceil(1 000 000 / 100 000) = 10
#   apps/deployments 200 × 6 000 B → storage LIST ceil(1 200 000 / 100 000) = 12,
#                                   from cache (rv=0) ceil(min(1 200 000, 1 000 000) / 100 000) = 10
#   example.com/widgets (not in /metrics)                                  →  1
#   stale (no fresh scrape for staleAfter): 10⁹ × 1.5 MB → clamped to plMaxSeats = 15
COUNTER_CL, COUNTER_HAND = 100, 4
COUNTER_MAX = 15
PERIOD_S, STALE_AFTER_S = 2.0, 4.0
RETRY_CAP_S = 10.0  # a failed poll is retried after at most 10 s
SMALL, BIG, DEPLOY = (100, 1_000), (500, 2_000), (200, 6_000)


def test_costs_follow_the_cluster_counts_and_go_stale(gateway):
    assert pl_max_seats(COUNTER_CL, COUNTER_HAND) == COUNTER_MAX
    assert list_seats(*SMALL, COUNTER_MAX, from_cache=False) == 1
    assert list_seats(*BIG, COUNTER_MAX, from_cache=False) == 10
    assert list_seats(*DEPLOY, COUNTER_MAX, from_cache=False) == 12
    assert list_seats(*DEPLOY, COUNTER_MAX, from_cache=True) == 10
    assert list_seats(10**9, 1_500_000, COUNTER_MAX, from_cache=False) == COUNTER_MAX
    gw = gateway(level_config(105, [dict(name="counter", ncs=100, queues=16, hand=COUNTER_HAND, qll=50,
                                         groups=["counters"])],
                              work_estimator={"clusterMetrics": cluster_metrics(
                                  "2s", staleAfter="4s", timeout="1s")}))
    who = ("cara", ("counters", EXPLAIN))
    pods = "/api/v1/pods"
    up = gw.upstream
    up.set_object_counts({"pods": SMALL})
    wait_counts(gw, "pods", *SMALL)
    steady_seats(gw, pods, *who, 1, timeout=10, what="100 pods × 1 kB: a LIST costs 1 seat")

    # New counts are charged within one period (plus a second).
    t_change = time.monotonic()
    up.set_object_counts({"pods": BIG, "apps/deployments": DEPLOY})
    first, before = first_seats(gw, pods, *who, 10, timeout=PERIOD_S + 5)
    took = first.started + first.elapsed - t_change
    assert took <= PERIOD_S + 1.0, gw.fail_msg(f"new counts charged after {took:.2f}s (period {PERIOD_S}s)")
    assert all(seats(r) == 1 for r in before), [r.h("x-apf-seats") for r in before]
    steady_seats(gw, pods, *who, 10, timeout=5, what="500 pods × 2 kB: a LIST costs 10 seats")
    steady_seats(gw, "/apis/apps/v1/deployments", *who, 12, timeout=5, what="storage LIST of deployments: 12")
    steady_seats(gw, "/apis/apps/v1/deployments?resourceVersion=0", *who, 10, timeout=5,
                 what="LIST of deployments from the cache: 10")
    steady_seats(gw, "/apis/example.com/v1/widgets", *who, 1, timeout=5,
                 what="a resource /metrics does not report: 1 seat")
    rows = counts_dump(gw)
    assert not is_stale(rows["pods"]) and rows["apps/deployments"]["Source"] == "cluster", rows

    # /metrics fails: after staleAfter without a good scrape, LISTs cost the level's max seats.
    failures0 = own_metric(gw, "apf_wasm_object_counts_refresh_failures_total")
    t_fail = time.monotonic()
    up.set_metrics_failure(500)
    stale, before = first_seats(gw, pods, *who, COUNTER_MAX, timeout=STALE_AFTER_S + PERIOD_S + 5)
    last_good = max(t for t, status in up.scrapes() if status == 200)
    stale_end = stale.started + stale.elapsed
    # The gateway stamps counts when it has read them, after the scrape reached the upstream:
    # 0.1 s of tolerance only for stamping at the poll's start instead.
    assert stale_end >= last_good + STALE_AFTER_S - 0.1, \
        gw.fail_msg(f"stale after {stale_end - last_good:.2f}s since the last good scrape (< {STALE_AFTER_S}s)")
    assert stale.started - t_fail <= STALE_AFTER_S + PERIOD_S + 1.0, \
        gw.fail_msg(f"stale only {stale.started - t_fail:.2f}s after /metrics failed")
    assert all(seats(r) == 10 for r in before), [r.h("x-apf-seats") for r in before]
    assert any(status == 500 for t, status in up.scrapes() if t > t_fail), up.scrapes()[-5:]
    wait_until(lambda: own_metric(gw, "apf_wasm_object_counts_refresh_failures_total") > failures0,
               timeout=10, what="apf_wasm_object_counts_refresh_failures_total increases")
    wait_until(lambda: is_stale(counts_dump(gw)["pods"]), timeout=5, what="dump_object_counts: pods Stale true")
    wait_until(lambda: own_metric(gw, "apf_wasm_object_counts_stale_resources") == 2, timeout=5,
               what="apf_wasm_object_counts_stale_resources == 2 (pods, apps/deployments)")

    # /metrics answers again: the formula's value is back.
    refreshes0 = own_metric(gw, "apf_wasm_object_counts_refreshes_total")
    t_back = time.monotonic()
    up.set_metrics_failure(None)
    back, _ = first_seats(gw, pods, *who, 10, timeout=RETRY_CAP_S + PERIOD_S + 3)
    assert back.started - t_back <= RETRY_CAP_S + PERIOD_S + 1.0, back.started - t_back
    print(f"counts: new counts charged after {took:.2f}s; stale {stale_end - last_good:.2f}s after the last "
          f"good scrape ({stale.started - t_fail:.2f}s after /metrics failed); fresh again after "
          f"{back.started - t_back:.2f}s")
    steady_seats(gw, pods, *who, 10, timeout=5, what="fresh counts again: 10 seats")
    wait_until(lambda: not is_stale(counts_dump(gw)["pods"]), timeout=5, what="dump: pods fresh again")
    wait_until(lambda: own_metric(gw, "apf_wasm_object_counts_refreshes_total") > refreshes0, timeout=5,
               what="apf_wasm_object_counts_refreshes_total increases")

    scrapes = up.received("/metrics")
    assert scrapes, "no /metrics request seen"
    assert all(h.get("authorization") == [f"Bearer {TOKEN}"] for _, h in scrapes), scrapes[:2]
    assert all(h.get("host") == [AUTHORITY] for _, h in scrapes), [h.get("host") for _, h in scrapes[:3]]


# -- 3. a watch storm: initial-events watches hold their seats until their bookmark ----------------

# S = 52; shares: watchers 47, catch-all 5 → NominalCL(watchers) = ceil(52·47/52) = 47.
# plMaxSeats = max(1, min(ceil(47·0.15) = ceil(7.05) = 8, 47 div 4 = 11)) = 8.
# /metrics: 799 pods × 1 000 B → a watch (served from the cache) costs
# ceil(min(799 000, 1 000 000) / 100 000) = ceil(7.99) = 8 seats → ⌊47 / 8⌋ = 5 in their initial
# phase at once. 200 watches × 150 ms of initial events, 5 at a time: ≥ 40 rounds ≈ 6 s.
# Queues: 64 × 50 places, hand 4 (distinct users spread); queue wait limit requestTimeout/4 = 30 s.
WATCH_CL, WATCH_HAND = 47, 4
WATCH_COUNTS = (799, 1_000)
WATCH_SEATS = 8
WATCH_CONCURRENCY = 5  # ⌊47 / 8⌋
N_WATCHES, INIT_MS = 200, 150
WATCH_BOUND_S = 45.0


def test_watch_storm_holds_seats_until_the_initial_events_end(gateway):
    assert pl_max_seats(WATCH_CL, WATCH_HAND) == 8
    assert list_seats(*WATCH_COUNTS, 8, from_cache=True) == WATCH_SEATS
    assert WATCH_CL // WATCH_SEATS == WATCH_CONCURRENCY
    gw = gateway(level_config(52, [dict(name="watchers", ncs=47, queues=64, hand=WATCH_HAND, qll=50,
                                        groups=["watchers"])],
                              work_estimator={"clusterMetrics": cluster_metrics("1s")},
                              request_timeout="120s"))
    up = gw.upstream
    up.set_object_counts({"pods": WATCH_COUNTS})
    up.set_pods(10, 1000)
    up.set_watch(init_ms=INIT_MS, bookmark=True)
    path = f"/api/v1/pods?{WATCHLIST}"
    groups = ("watchers", EXPLAIN)

    def probe_watch() -> bool:
        with client.WatchStream(gw.port, path, user="watch-probe", groups=groups) as w:
            if w.read_headers(10) != 200:
                return False
            w.until_initial_events_end(10)
            probe_watch.seen = w.h("x-apf-seats")  # type: ignore[attr-defined]
            return seats(w) == WATCH_SEATS
    probe_watch.seen = None  # type: ignore[attr-defined]
    try:
        wait_until(lambda: all(probe_watch() for _ in range(4)), timeout=20, interval=0.1,
                   what=f"an initial-events watch charged {WATCH_SEATS} seats")
    except TimeoutError as e:
        raise AssertionError(gw.fail_msg(f"{e}; last x-apf-seats={probe_watch.seen}")) from None  # type: ignore[attr-defined]
    wait_until(lambda: up.snapshot()["watches_open"] == 0, timeout=5, what="probe watches closed")
    up.reset()

    results: list[dict] = []
    lock = threading.Lock()
    gate = threading.Barrier(N_WATCHES)

    def watcher(i: int) -> None:
        out: dict = {"i": i, "status": None, "error": None, "bookmark": None, "seats": None}
        try:
            gate.wait(timeout=20)
        except threading.BrokenBarrierError:
            pass
        out["start"] = time.monotonic()
        try:
            with client.WatchStream(gw.port, path, user=f"watcher-{i:03d}", groups=groups) as w:
                out["status"] = w.read_headers(WATCH_BOUND_S)
                out["seats"] = seats(w)
                if out["status"] == 200:
                    out["bookmark"] = w.until_initial_events_end(max(0.1, out["start"] + WATCH_BOUND_S - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - reported below
            out["error"] = f"{type(e).__name__}: {e}"
        with lock:
            results.append(out)

    threads = [threading.Thread(target=watcher, args=(i,), daemon=True) for i in range(N_WATCHES)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WATCH_BOUND_S + 25
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "watch clients still running"

    bad = [r for r in results if r["status"] != 200 or r["bookmark"] is None]
    assert not bad, gw.fail_msg(f"{len(bad)} watches without their bookmark, e.g. {bad[:5]}")
    assert len(results) == N_WATCHES
    assert all(r["seats"] == WATCH_SEATS for r in results), sorted({r["seats"] for r in results}, key=str)
    assert max(r["bookmark"] - r["start"] for r in results) <= WATCH_BOUND_S
    snap = up.snapshot()
    assert snap["watches_total"] == N_WATCHES, snap
    assert snap["watch_init_max"] <= WATCH_CONCURRENCY, \
        gw.fail_msg(f"{snap['watch_init_max']} watches in their initial phase at once > {WATCH_CONCURRENCY}")
    assert snap["watch_init_max"] >= 2, gw.fail_msg(f"watches never overlapped: {snap}")
    span = max(r["bookmark"] for r in results) - min(r["start"] for r in results)
    floor = N_WATCHES / WATCH_CONCURRENCY * INIT_MS / 1000 * 0.5
    assert span >= floor, gw.fail_msg(f"{N_WATCHES} watches done in {span:.2f}s < {floor:.2f}s: not serialised")
    print(f"watch storm: {N_WATCHES} watches in {span:.2f}s, at most {snap['watch_init_max']} initial at once")


# -- 4 & 5. one watch holding all of a level's seats -----------------------------------------------

# S = 6; shares: holders 1, catch-all 5 → NominalCL(holders) = ceil(6·1/6) = 1, hand 1 →
# plMaxSeats = max(1, min(ceil(0.15) = 1, 1 div 1 = 1)) = 1: any request takes the level's only
# seat (a watch of 799 × 1 000 B would cost 8, clamped to 1). A second request waits until the
# watch lets its seat go.
HOLD_COUNTS = (799, 1_000)


def holder_config(**estimator) -> dict:
    return level_config(6, [dict(name="holders", ncs=1, queues=4, hand=1, qll=10, groups=["holders"])],
                        work_estimator=dict({"clusterMetrics": cluster_metrics("1s")}, **estimator))


def hold_and_measure(gw, watch_path: str, read_for: float) -> tuple[client.WatchStream, client.Result]:
    """Open `watch_path` as holder-a, then a LIST as holder-b in the same level; read the watch's
    events for `read_for` seconds after its response head. Returns (the open watch, the LIST)."""
    groups = ("holders", EXPLAIN)
    w = client.WatchStream(gw.port, watch_path, user="holder-a", groups=groups)
    assert w.read_headers(10) == 200, gw.fail_msg(f"watch: {w.status} {w.headers}")
    assert seats(w) == 1, w.headers
    out: list[client.Result] = []
    t = threading.Thread(target=lambda: out.append(gw.request("/api/v1/namespaces/default/pods", user="holder-b",
                                                              groups=groups, timeout=15)), daemon=True)
    t.start()
    assert w.headers_at is not None
    end = w.headers_at + read_for
    while time.monotonic() < end:
        try:
            if w.next_event(max(0.01, end - time.monotonic())) is None:
                break
        except TimeoutError:
            break
    t.join(timeout=20)
    assert out, "the LIST did not finish"
    return w, out[0]


def test_watch_without_bookmark_is_released_after_max_hold(gateway):
    gw = gateway(holder_config(watchInitialEventsMaxHold="2s"))
    up = gw.upstream
    up.set_object_counts({"pods": HOLD_COUNTS})
    up.set_pods(10, 1000)
    up.set_watch(init_ms=100, bookmark=False, bookmark_every=0.5)
    wait_counts(gw, "pods", *HOLD_COUNTS)
    holds0 = own_metric(gw, "apf_wasm_watch_initial_hold_timeouts_total")
    w, lst = hold_and_measure(gw, f"/api/v1/namespaces/default/pods?{WATCHLIST}", read_for=4.0)
    try:
        assert lst.status == 200, gw.fail_msg(repr(lst))
        queued = int(lst.h("x-apf-queued-ms") or -1)
        assert 1500 <= queued <= 5000, gw.fail_msg(f"LIST queued {queued} ms behind a watch held at most 2 s")
        assert 1.5 <= lst.elapsed <= 5.0, lst
        lst_end = lst.started + lst.elapsed
        print(f"max hold: LIST queued {queued} ms, served in {lst.elapsed:.2f}s")
        assert not w.eof, gw.fail_msg("the held watch's stream was cut")
        assert not any(client.is_initial_events_end(e) for _, e in w.events)
        assert sum(e["type"] == "ADDED" for _, e in w.events) == 10, [e["type"] for _, e in w.events]
        later = [t for t, e in w.events if t > lst_end]
        assert later, gw.fail_msg(f"no event after the hold ended (events at "
                                  f"{[round(t - w.headers_at, 2) for t, _ in w.events]})")
        assert [r for r in up.watches() if r["user"] == "holder-a"][0]["end"] is None
        wait_until(lambda: own_metric(gw, "apf_wasm_watch_initial_hold_timeouts_total") > holds0, timeout=5,
                   what="apf_wasm_watch_initial_hold_timeouts_total increases")
    finally:
        w.close()


def test_legacy_watch_is_released_when_its_initial_events_went_quiet(gateway):
    init_ms = 600  # 10 ADDED events, 67 ms apart (< the 250 ms quiet rule), then nothing
    gw = gateway(holder_config())
    up = gw.upstream
    up.set_object_counts({"pods": HOLD_COUNTS})
    up.set_pods(10, 1000)
    up.set_watch(init_ms=init_ms)
    wait_counts(gw, "pods", *HOLD_COUNTS)
    w, lst = hold_and_measure(gw, "/api/v1/namespaces/default/pods?resourceVersion=0&watch=true", read_for=2.0)
    try:
        assert lst.status == 200, gw.fail_msg(repr(lst))
        added = [t for t, e in w.events if e["type"] == "ADDED"]
        assert len(added) == 10 and added[-1] - w.headers_at >= init_ms / 1000 * 0.9, \
            [round(t - w.headers_at, 3) for t in added]
        lst_end = lst.started + lst.elapsed
        assert lst_end - w.headers_at >= init_ms / 1000, \
            gw.fail_msg(f"LIST served {lst_end - w.headers_at:.3f}s after the watch started, before its initial events")
        assert lst.elapsed < 1.5, gw.fail_msg(f"LIST waited {lst.elapsed:.3f}s: legacy watch not released when quiet")
        queued = int(lst.h("x-apf-queued-ms") or -1)
        print(f"legacy watch: LIST queued {queued} ms, served {lst_end - w.headers_at:.3f}s after the watch's head")
        assert 0 < queued < 1500, lst.headers
        assert not w.eof
    finally:
        w.close()


# -- 6. kubectl through the gateway with cluster metrics on ----------------------------------------

KUBECTL = shutil.which("kubectl")


def test_kubectl_get_and_watch_pods_with_cluster_metrics(gateway, tmp_path):
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (apt-get install kubectl); CI installs it")
    gw = gateway(plugin_config(workEstimator={"clusterMetrics": cluster_metrics("1s")}))
    up = gw.upstream
    up.set_pods(4, 600, namespaces=("default", "kube-system"))
    up.set_object_counts({"pods": (4, 600)})
    wait_counts(gw, "pods", 4, 600)
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "no-kubeconfig"), HOME=str(tmp_path))
    base = [KUBECTL, "--server", f"http://127.0.0.1:{gw.port}", "--request-timeout=20s"]

    p = subprocess.run(base + ["get", "pods", "-A"], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, gw.fail_msg(f"kubectl get pods -A: {p.stderr}")
    for name, ns in (("pod-00000", "default"), ("pod-00001", "kube-system"), ("pod-00002", "default"),
                     ("pod-00003", "kube-system")):
        assert any(ln.split()[:2] == [ns, name] for ln in p.stdout.splitlines()), p.stdout
    assert p.stderr.strip() == "", p.stderr

    up.reset()
    proc = subprocess.Popen(base + ["get", "pods", "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    try:
        def watching() -> bool:
            names = "".join(out)
            return ("pod-00000" in names and "pod-00002" in names
                    and any(r["path"].startswith("/api/v1/namespaces/default/pods") for r in up.watches()))
        wait_until(watching, timeout=20, interval=0.1, what="kubectl get pods -w lists the pods and watches")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for t in readers:
            t.join(timeout=5)
    assert "pod-00001" not in "".join(out), out  # another namespace
    assert not any("error" in ln.lower() for ln in err), err
    assert gw.upstream.snapshot()["watches_total"] >= 1


# -- learned costs (our extension) ----------------------------------------------------------------
# No /metrics count for pods; workEstimator.learnFromResponses: the first complete LIST response
# (all namespaces, no selector, no continue) teaches n items of bytes ÷ n. 300 pods × 2 000 B of
# compact JSON ≈ 600 kB (plus the list envelope) → a storage LIST ceil(≈ 600 kB / 100 kB) = 7
# seats (plMaxSeats 15 here); a namespaced LIST teaches nothing.
LEARN_PODS = (300, 2_000)


def test_learned_costs_from_complete_list_responses(gateway):
    gw = gateway(level_config(105, [dict(name="learner", ncs=100, queues=16, hand=4, qll=50,
                                         groups=["learners"])],
                              work_estimator={"learnFromResponses": True}),
                 stats_config=True)
    who = ("lea", ("learners", EXPLAIN))
    up = gw.upstream
    up.set_pods(*LEARN_PODS, namespaces=("a", "b"))
    # A namespaced LIST and a paginated first page teach nothing: still 1 seat.
    assert seats(probe(gw, "/api/v1/namespaces/a/pods", *who)) == 1
    assert seats(probe(gw, "/api/v1/pods?labelSelector=app%3Dx", *who)) == 1
    r = probe(gw, "/api/v1/pods", *who)
    assert r.status == 200 and seats(r) == 1, r
    body_len = len(r.body)
    want = list_seats(LEARN_PODS[0], body_len // LEARN_PODS[0], COUNTER_MAX, from_cache=False)
    assert want == math.ceil(body_len / BYTES_PER_SEAT) == 7, (body_len, want)
    steady_seats(gw, "/api/v1/pods", *who, want, timeout=10, what="the learned cost on every worker")
    # A watch of the resource is costed from the learned count too (from cache, capped at 1 MB).
    assert seats(probe(gw, "/api/v1/pods?resourceVersion=0", *who)) == want
    dump = gw.debug_dump("object_counts")
    rows = [[c.strip() for c in ln.split(",")] for ln in dump.body.decode().splitlines()
            if ln and not ln.startswith("#")]
    learned = [row for row in rows if row[0] == "pods"]
    assert learned and learned[0][1] == str(LEARN_PODS[0]) and learned[0][3] == "learned", dump.body.decode()
    # work_estimated_seats (upstream's buckets) saw the 1-seat and the learned LISTs.
    def histogram() -> dict[str, float]:
        return {lab.get("le", ""): v for name, lab, v in parse_prometheus(gw.stats_prometheus())
                if name == "apiserver_flowcontrol_work_estimated_seats_bucket" and lab.get("priority_level") == "learner"}
    wait_until(lambda: histogram().get("8", 0) > histogram().get("4", 0) >= 3, timeout=10,
               what="work_estimated_seats buckets: ≥ 3 requests ≤ 4 seats and more ≤ 8")
    assert sorted(float(k) for k in histogram() if k != "+Inf") == [1, 2, 4, 8, 16, 32, 64, 100]
