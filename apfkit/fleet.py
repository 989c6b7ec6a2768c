"""Fleet mode in real Envoys: replicas of one gateway in front of one test upstream, sharing one
etcd (etcdproc), and the closed-loop load the fleet tests put on them.

The fleet's policy: one level of SEATS seats for the whole fleet, `period` PERIOD s, `leaseTtl`
LEASE_TTL s. The clients' users are `<tag>-<port>-<i>`, so the requests of each replica can be
told apart at the upstream."""

from __future__ import annotations

import random
import tempfile
import threading
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
        self.work = Path(tempfile.mkdtemp(prefix="fleet-"))
        self.etcd = Etcd(self.work).start()
        self.up = Upstream().start()
        self.up.set_nodelay()
        self.envoys: list[EnvoyProcess] = []
        self.proxies: list[PausableProxy] = []

    def replica(self, plugin_config: dict | None = None, etcd_cluster: dict | None = None) -> EnvoyProcess:
        """A started, ready replica (Envoy's log written every 500 ms)."""
        cfg = gateway_config(upstream_port=self.up.port, wasm_path=self.wasm,
                             plugin_config=plugin_config or fleet_config(self.etcd))
        cfg["static_resources"]["clusters"].append(etcd_cluster or self.etcd.envoy_cluster())
        i = len(self.envoys)
        env = EnvoyProcess(cfg, self.work / f"envoy{i}", envoy_bin=self.envoy_bin, concurrency=2,
                           name=f"envoy{i}", extra_args=["--config-yaml", STATS_CONFIG.read_text(),
                                                         "--file-flush-interval-msec", "500"])
        self.envoys.append(env)
        return env.start().wait_ready(timeout=30)

    def close(self) -> None:
        for env in self.envoys:
            env.stop()
        for p in self.proxies:
            p.stop()
        self.up.stop()
        self.etcd.stop()
