"""Fleet mode in real Envoys: replicas of one gateway in front of one test upstream, sharing one
etcd (etcdproc), and the closed-loop load the fleet tests put on them.

The fleet's policy: one level of SEATS seats for the whole fleet, `period` PERIOD s, `leaseTtl`
LEASE_TTL s. The clients' users are `<tag>-<port>-<i>`, so the requests of each replica can be
told apart at the upstream."""

from __future__ import annotations

import math
import random
import tempfile
import threading
import time
from pathlib import Path

from . import client
from .apf_policy import E2E_GROUP, single_level_config
from .envoy_template import gateway_config
from .envoyproc import STATS_CONFIG, EnvoyProcess
from .etcdproc import Etcd
from .tcpproxy import PausableProxy
from .upstream import Upstream

SEATS = 20
PERIOD = 1.0
LEASE_TTL = 5.0
PATH = "/api/v1/namespaces/default/pods"


def fleet_config(etcd: Etcd) -> dict:
    cfg = single_level_config(SEATS, queues=16, hand_size=4, queue_length_limit=50)
    cfg["fleet"] = {"etcd": etcd.fleet_etcd("etcd"), "period": "1s", "leaseTtl": "5s"}
    return cfg


def load(ports: list[int], conns: int, seconds: float, tag: str) -> list[client.Result]:
    """`conns` closed-loop clients on each port (one user each), service time 50–150 ms."""
    out: list[client.Result] = []
    lock = threading.Lock()
    rnd = random.Random(7)

    def run(port: int) -> None:
        users = {f"{tag}-{port}-{i}": 1 for i in range(conns)}
        res = client.closed_loop(port, users, seconds, path=PATH,
                                 groups_of={u: (E2E_GROUP,) for u in users},
                                 headers_for=lambda _u, _i: {"x-sleep-ms": str(rnd.randint(50, 150))})
        with lock:
            out.extend(res)

    threads = [threading.Thread(target=run, args=(p,)) for p in ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


class Harness:
    """One etcd, one upstream, and the Envoy replicas a test starts (all stopped at the end)."""

    def __init__(self, wasm: str, envoy_bin: str) -> None:
        self.wasm, self.envoy_bin = wasm, envoy_bin
        # A shared object is the native host (an Envoy dynamic module), not a wasm module.
        self.native = wasm.endswith(".so")
        self.work = Path(tempfile.mkdtemp(prefix="fleet-"))
        self.etcd = Etcd(self.work).start()
        self.up = Upstream().start()
        self.up.set_nodelay()
        self.envoys: list[EnvoyProcess] = []
        self.proxies: list[PausableProxy] = []

    def replica(self, plugin_config: dict | None = None, etcd_cluster: dict | None = None) -> EnvoyProcess:
        """A started, ready replica (Envoy's log written every 500 ms)."""
        cfg = gateway_config(upstream_port=self.up.port, wasm_path=self.wasm,
                             plugin_config=plugin_config or fleet_config(self.etcd),
                             http_filter="native" if self.native else "wasm")
        cfg["static_resources"]["clusters"].append(etcd_cluster or self.etcd.envoy_cluster())
        i = len(self.envoys)
        env = EnvoyProcess(cfg, self.work / f"envoy{i}", envoy_bin=self.envoy_bin, concurrency=2,
                           name=f"envoy{i}", extra_args=["--config-yaml", STATS_CONFIG.read_text(),
                                                         "--file-flush-interval-msec", "500"],
                           env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(Path(self.wasm).parent)}
                           if self.native else None)
        self.envoys.append(env)
        return env.start().wait_ready(timeout=30)

    def close(self) -> None:
        for env in self.envoys:
            env.stop()
        for p in self.proxies:
            p.stop()
        self.up.stop()
        self.etcd.stop()


class InFlight:
    """Samples the upstream's requests in flight every 20 ms, in total and per replica of
    `ports` (the clients' users are `<tag>-<port>-<i>`, see `load`)."""

    def __init__(self, up: Upstream, ports: list[int] = ()) -> None:
        self.up, self.ports = up, ports
        self.samples: list[tuple[float, int, dict[int, int]]] = []
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            snap = self.up.snapshot()
            per = {p: sum(n for u, n in snap["user_in_flight"].items() if f"-{p}-" in u) for p in self.ports}
            self.samples.append((time.monotonic(), snap["in_flight"], per))
            time.sleep(0.02)

    def __enter__(self) -> "InFlight":
        self.t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.t.join()

    def between(self, t0: float = -math.inf, t1: float = math.inf) -> list[int]:
        return [n for t, n, _ in self.samples if t0 <= t <= t1]

    def mean(self, t0: float = -math.inf, t1: float = math.inf) -> float:
        xs = self.between(t0, t1)
        return sum(xs) / max(1, len(xs))

    def first_reaching(self, level: float, since: float = -math.inf, window: float = 0.5) -> float | None:
        """The first time from `since` on from which the mean over `window` s is ≥ `level`."""
        for i, (t, _, _) in enumerate(self.samples):
            if t < since:
                continue
            w = [n for u, n, _ in self.samples[i:] if u <= t + window]
            if self.samples[-1][0] - t >= window and sum(w) / len(w) >= level:
                return t
        return None
