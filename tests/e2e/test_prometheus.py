"""A real Prometheus scrapes a saturated gateway's /stats/prometheus (envoy/stats_config.yaml
merged in) and loads observability/apf-wasm-rules.yaml and apf-alerts.yaml: upstream's metric
names, units and buckets answer upstream's queries, and the answers match what the clients saw.

- every query of every panel of observability/grafana-apf.json returns data;
- the p99 queue wait from `histogram_quantile` (over the whole run and over `rate`) falls in the
  bucket of the p99 the clients measured (`x-apf-queued-ms`), or the next one; every bucket count
  matches the clients' waits;
- `_sum` in seconds (recorded from the exact microsecond sums) matches the clients' total wait;
- the rejection count equals the clients' 429s, per reason too;
- the alerting and recording rules evaluate without errors, and the rejection and at-limit
  alert conditions hold during the saturated run;
- `promtool check rules` and `promtool test rules observability/apf-alerts.test.yaml` pass.

Needs `prometheus` and `promtool` (Debian package `prometheus`); skipped when they are missing.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from apfkit import client
from apfkit.apf_policy import E2E_GROUP, single_level_config
from apfkit.dashboard import DASHBOARD, FLEET_SERIES, dashboard_targets
from apfkit.envoyproc import REPO, wait_until

pytestmark = pytest.mark.apf

OBS = REPO / "observability"
ALERTS = OBS / "apf-alerts.yaml"
SUM_RULES = OBS / "apf-wasm-rules.yaml"
ALERT_TESTS = OBS / "apf-alerts.test.yaml"
METRICS_RS = REPO / "src" / "observe" / "metrics.rs"

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NEED_PROMETHEUS = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary on PATH (Debian: apt-get install prometheus)")
NEED_PROMTOOL = pytest.mark.skipif(
    PROMTOOL is None, reason="no `promtool` binary on PATH (Debian: apt-get install prometheus)")

PODS = "/api/v1/namespaces/default/pods"
LEVEL, SCHEMA = "e2e-level", "e2e-users"
JOB = "apf-wasm"
SEL = f'job="{JOB}", priority_level="{LEVEL}"'
WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
# Upstream's bounds of request_wait_duration_seconds (pkg/util/flowcontrol/metrics/metrics.go).
WAIT_BOUNDS = [0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30]
# Dashboard queries on metrics the gateway does not record yet: they must return nothing (so
# this list is noticed and emptied once they do).
NOT_RECORDED: dict[str, str] = {}


# --- the metric names of upstream (from the table in src/observe/metrics.rs) --------------------

def upstream_series_names() -> set[str]:
    """Every series name upstream exports: counters and gauges as named, histograms as
    `_bucket`, `_sum`, `_count`."""
    out = set()
    for name, kind in re.findall(r'\bm\(\s*"([a-z_]+)",\s*(Counter|Gauge|Histogram)\b',
                                 METRICS_RS.read_text()):
        base = "apiserver_flowcontrol_" + name
        out |= {base + s for s in ("_bucket", "_sum", "_count")} if kind == "Histogram" else {base}
    assert len(out) > 40, "the METRICS table in src/observe/metrics.rs was not found"
    return out


def metric_names_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(apiserver_flowcontrol_[a-z_]+)\b", expr))


def grafana_expand(expr: str, rate_window: str) -> str:
    """What Grafana sends for the dashboard's variables: every label variable as "All" (`.*`,
    the dashboard's allValue), `$__rate_interval` as `rate_window`."""
    expr = expr.replace("$__rate_interval", rate_window)
    return re.sub(r"\$\{?(job|priority_level)\}?", ".*", expr)


# --- files: rules, rule tests, dashboard ---------------------------------------------------------

@NEED_PROMTOOL
def test_promtool_checks_and_tests_the_rules():
    p = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS), str(SUM_RULES)],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([PROMTOOL, "test", "rules", ALERT_TESTS.name], cwd=OBS,
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_dashboard_and_alerts_use_upstream_names_only():
    """The same dashboard and alerts work for kube-apiserver: only upstream's series names, no
    apf-wasm-only series (the microsecond sums are behind the recording rules)."""
    upstream = upstream_series_names()
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["templating"]["list"]
    targets = dashboard_targets()
    assert len(targets) >= 10
    for title, expr in targets:
        names = metric_names_in(expr)
        assert names and names <= upstream, (title, names - upstream)
        # Label variables are regex matchers, so "All" (.*) and multi-value selections work.
        for var in re.findall(r'(\S*)"\$\{?(?:job|priority_level)\}?"', expr):
            assert var.endswith("=~"), (title, expr)
    # The fleet row: upstream's names and fleet mode's own series only.
    fleet = dashboard_targets(fleet=True)
    assert len(fleet) >= 4
    for title, expr in fleet:
        own = set(re.findall(r"\b(apf_wasm_fleet_[a-z_]+)\b", expr))
        assert own or metric_names_in(expr), (title, expr)
        assert metric_names_in(expr) <= upstream, title
        assert own <= FLEET_SERIES, (title, own - FLEET_SERIES)
    alerts = ALERTS.read_text()
    names = metric_names_in(alerts)
    assert names and names <= upstream, names - upstream
    for r in re.findall(r"record: (\S+)", SUM_RULES.read_text()):
        assert r in upstream, r


# --- a real Prometheus ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """One Prometheus on loopback: 1 s scrapes of `target`'s /stats/prometheus, 1 s rule
    evaluation, the repo's rule files, TSDB in `workdir`."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(SUM_RULES), str(ALERTS)],
            "scrape_configs": [{"job_name": JOB, "metrics_path": "/stats/prometheus",
                                "static_configs": [{"targets": [target]}]}],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(cfg))  # JSON is YAML
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 20.0) -> "Prometheus":
        for _ in range(3):  # a port taken between choosing and binding: choose again
            self.port = _free_port()
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={self.config}",
                     f"--storage.tsdb.path={self.workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

            def ready():
                if self.proc.poll() is not None:
                    return "exited"
                try:
                    with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                        return "ready" if r.status == 200 else None
                except OSError:
                    return None

            state = wait_until(ready, timeout=timeout, interval=0.1, what="Prometheus /-/ready")
            if state == "ready":
                return self
            if "address already in use" not in self.log_tail():
                break
        raise RuntimeError(f"Prometheus did not start:\n{self.log_tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, q: str, at: float | None = None) -> list[dict]:
        params = {"query": q}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def scalar(self, q: str, at: float | None = None) -> float | None:
        """The value of a one-sample query, None when it has no data."""
        r = self.query(q, at)
        assert len(r) <= 1, (q, r)
        return float(r[0]["value"][1]) if r else None


def bucket_index(seconds: float) -> int:
    """Index of the bucket (upstream's bounds, then +Inf) a value falls in."""
    return bisect.bisect_left(WAIT_BOUNDS, seconds)


@NEED_PROMETHEUS
def test_prometheus_scrapes_upstream_metrics_that_match_the_clients(gateway, tmp_path):
    seats = 2
    gw = gateway(single_level_config(seats, queues=1, hand_size=1, queue_length_limit=4),
                 stats_config=True)
    prom = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{gw.admin_port}").start()
    try:
        # Scraped: the level's limit is there before any request.
        wait_until(lambda: prom.scalar(f"apiserver_flowcontrol_nominal_limit_seats{{{SEL}}}") == seats,
                   timeout=15, interval=0.25, what="the first scrape of the gateway")

        def plans(connections: int, each: int):
            return [[client.Req(path=f"{PODS}?sleep=0.2", user=f"p{i}", groups=(E2E_GROUP, "e2e-explain"))
                     for _ in range(each)] for i in range(connections)]

        # Warm-up: one request on each of 8 connections (2 execute, 4 queue, 2 rejected) creates
        # the series. A counter that first shows up at N > 0 hides those N from rate() (as for
        # any Prometheus target): the main run's increases must come after the first samples.
        out = gw.run_connections(plans(8, 1), timeout=20)
        warm = client.status_counts(out)
        wait_until(lambda: prom.scalar(f"sum(apiserver_flowcontrol_rejected_requests_total{{{SEL}}})")
                   == warm.get(429, 0) and prom.scalar(f"sum({WAIT}_count{{{SEL}}})") == len(out),
                   timeout=15, interval=0.25, what=f"Prometheus to see the warm-up {warm}")
        t0 = time.time()

        # 12 connections x 8 requests of 0.2 s against 2 seats and one queue of 4: about half
        # wait (up to ~1.5 s), the rest are rejected at once (queue-full).
        out += gw.run_connections(plans(12, 8), timeout=20)
        counts = client.status_counts(out)
        assert set(counts) <= {200, 429} and counts.get(200, 0) >= 10 and counts.get(429, 0) >= 10, \
            gw.fail_msg(str(counts))
        n200, n429 = counts[200], counts[429]
        reasons: dict[str, int] = {}
        for r in out:
            if r.status == 429:
                reasons[r.h("x-apf-reject-reason")] = reasons.get(r.h("x-apf-reject-reason"), 0) + 1
        assert set(reasons) <= {"queue-full"}, reasons  # rejected at arrival: waited 0
        # What the clients saw of the wait, in whole ms (the filter truncates): 0 for the 429s.
        waited_ms = sorted([int(r.h("x-apf-queued-ms")) for r in out if r.status == 200] + [0] * n429)

        # Everything flushed (every second) and scraped (every second), rules evaluated.
        want = {
            f"sum(apiserver_flowcontrol_rejected_requests_total{{{SEL}}})": n429,
            f"sum(apiserver_flowcontrol_dispatched_requests_total{{{SEL}}})": n200,
            f"sum({WAIT}_count{{{SEL}}})": n200 + n429,
            f"sum(apiserver_flowcontrol_request_execution_seconds_count{{{SEL}}})": n200,
            f"count({WAIT}_sum{{{SEL}}})": 2,  # recorded, execute="true" and "false"
            f"sum(apiserver_flowcontrol_current_executing_requests{{{SEL}}})": 0,
        }
        last: dict = {}

        def settled():
            last.clear()
            last.update({q: prom.scalar(q) for q in want})
            return last == want

        # ... and the recording rules evaluated on the last scrape (they run every second, on
        # the newest samples).
        def recorded():
            for h in ("request_wait_duration", "request_execution"):
                micros = prom.scalar(f"sum(apiserver_flowcontrol_{h}_microseconds_sum{{{SEL}}})")
                secs = prom.scalar(f"sum(apiserver_flowcontrol_{h}_seconds_sum{{{SEL}}})")
                last[h] = (micros, secs)
                if micros is None or secs is None or abs(secs * 1e6 - micros) > 0.5:
                    return False
            return True

        try:
            wait_until(settled, timeout=15, interval=0.25, what="Prometheus to see the whole run")
            wait_until(recorded, timeout=10, interval=0.25, what="the recorded _sum series")
        except TimeoutError:
            raise AssertionError(gw.fail_msg(f"want {want}\ngot  {last}\n{prom.log_tail()}")) from None
        t_end = time.time()
        window = f"{math.ceil(t_end - t0) + 10}s"  # the whole run, and some before it

        # Rejections: Prometheus' count equals the clients' 429s, per reason too.
        for reason, n in reasons.items():
            assert prom.scalar(f'sum(apiserver_flowcontrol_rejected_requests_total{{{SEL}, reason="{reason}"}})',
                               t_end) == n

        # Buckets: upstream's bounds as `le`, each count within what the clients' truncated
        # milliseconds allow (a wait of w ms shows as floor(w)).
        got = {float(s["metric"]["le"]): float(s["value"][1])
               for s in prom.query(f"sum by (le) ({WAIT}_bucket{{{SEL}}})", t_end)}
        assert sorted(got) == WAIT_BOUNDS + [math.inf], sorted(got)
        for le, v in got.items():
            lo = sum(1 for w in waited_ms if w < le * 1000)
            hi = sum(1 for w in waited_ms if w <= le * 1000)
            assert lo <= v <= hi, (le, v, lo, hi, waited_ms)

        # p99: the clients' (nearest rank, as histogram_quantile ranks) against Prometheus'
        # estimate over the whole run (the counters started with this Envoy) and over rate().
        rank = math.ceil(0.99 * len(waited_ms))
        client_p99 = waited_ms[rank - 1] / 1000
        whole = prom.scalar(f"histogram_quantile(0.99, sum by (le) ({WAIT}_bucket{{{SEL}}}))", t_end)
        rated = prom.scalar(f"histogram_quantile(0.99, sum by (le) (rate({WAIT}_bucket{{{SEL}}}[{window}])))",
                            t_end)
        report = f"p99 queue wait: clients {client_p99:.3f}s, Prometheus whole run {whole:.3f}s, rate[{window}] {rated:.3f}s"
        print(report)
        for est in (whole, rated):
            assert abs(bucket_index(est) - bucket_index(client_p99)) <= 1, report

        # `_sum` in seconds (recorded from the exact microsecond sum): the clients' total wait,
        # each of their values short by less than 1 ms.
        total = prom.scalar(f"sum({WAIT}_sum{{{SEL}}})", t_end)
        exact_ms = sum(waited_ms)
        assert exact_ms / 1000 - 1e-5 <= total <= (exact_ms + n200) / 1000, (total, exact_ms, n200)
        micros = prom.scalar(f"sum(apiserver_flowcontrol_request_wait_duration_microseconds_sum{{{SEL}}})", t_end)
        assert micros == pytest.approx(total * 1e6, abs=0.5), (micros, total)
        mean = prom.scalar(f"sum(rate({WAIT}_sum{{{SEL}}}[{window}])) / sum(rate({WAIT}_count{{{SEL}}}[{window}]))",
                           t_end)
        assert mean is not None and 0 < mean < 2, mean
        # Execution: 200 ms of upstream sleep each, and less than what the clients waited in all.
        exec_sum = prom.scalar(f"sum(apiserver_flowcontrol_request_execution_seconds_sum{{{SEL}}})", t_end)
        exec_buckets = {s["metric"]["le"]: s["value"][1] for s in prom.query(
            f"sum by (le) (apiserver_flowcontrol_request_execution_seconds_bucket{{{SEL}}})", t_end)}
        assert 0.2 * n200 <= exec_sum <= sum(r.elapsed for r in out if r.status == 200), (exec_sum, exec_buckets)
        print(f"execution: n={n200} sum={exec_sum:.3f}s buckets={exec_buckets}")
        print(f"rejections: clients {n429}, Prometheus {prom.scalar(list(want)[0], t_end):.0f}; "
              f"wait sum: clients {exact_ms / 1000:.3f}s (+< {n200} ms), Prometheus {total:.6f}s")

        # Only upstream's names (and the documented microsecond sums) come from the gateway; no
        # milliseconds histograms any more.
        upstream = upstream_series_names()
        scraped = {s["metric"]["__name__"] for s in prom.query(
            f'group by (__name__) ({{__name__=~"apiserver_flowcontrol_.*", job="{JOB}"}})', t_end)}
        extra = scraped - upstream
        assert extra == {"apiserver_flowcontrol_request_wait_duration_microseconds_sum",
                         "apiserver_flowcontrol_request_execution_microseconds_sum"}, extra
        # Upstream's `_sum` of a seconds histogram comes from the recording rule only, never
        # from Envoy in another unit.
        assert f"{WAIT}_sum" not in gw.stats_prometheus()

        # Every dashboard query has data (upstream's names, as for kube-apiserver).
        empty = []
        for title, expr in dashboard_targets():
            q = grafana_expand(expr, window)
            has = bool(prom.query(q, t_end))
            pending = metric_names_in(expr) & set(NOT_RECORDED)
            if pending:
                assert not has, f"{title}: {sorted(pending)} now recorded: drop it from NOT_RECORDED"
            elif not has:
                empty.append((title, q))
        assert not empty, empty

        # The rules evaluate cleanly on the real series, and the rejection and at-limit alert
        # conditions held during the run (the alerts' `for` is minutes: not fired here).
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == 5 and all(r["health"] == "ok" for r in rules), rules
        alert_exprs = {r["name"]: r["query"] for r in rules if r["type"] == "alerting"}
        for name in ("APFRequestsRejected", "APFPriorityLevelAtLimit"):
            res = prom.api("query_range", query=alert_exprs[name], start=f"{t0:.3f}", end=f"{t_end:.3f}",
                           step="1")["result"]
            assert any(s["metric"].get("priority_level") == LEVEL for s in res), (name, res)
    finally:
        prom.stop()
