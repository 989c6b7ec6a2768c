#!/usr/bin/env python3
"""A kube-apiserver stand-in with a cost model: finite CPU, finite memory, and an OOM kill.

Used by bench/protection.py (as a subprocess, one fresh instance per gateway) and runnable alone:
    python3 bench/apiserver_model.py --port 0 --port-file F

What it models (every parameter is in `Model` below, with where its value comes from):
  CPU        processor sharing over `cores` virtual cores. Each request needs CPU work from its
             kind (a LIST: proportional to the objects it returns; GETs, lease renewals and other
             writes: a millisecond or two). With n requests in their CPU phase every one progresses
             at min(1, cores / n) core-seconds per second. Progress is computed in virtual time
             (the attained service of every job grows at that rate; a job ends when its own work is
             reached), not by burning the host's CPU, so results do not depend on the host's load.
             Writes then wait for etcd (`write_commit_s`, no CPU), GETs for a round trip.
  Memory     each LIST holds objects × average object size × `list_memory_multiplier` bytes while
             it runs (on top of `baseline_memory_bytes`). If a LIST would take the total over
             `memory_limit_bytes`, the stand-in dies as an OOM-killed kube-apiserver: every request
             in flight fails (its connection is reset), the listening socket closes (new
             connections are refused) and it comes back `restart_s` later with nothing in flight.
  /metrics   kube-apiserver 1.34's format (apfkit/upstream.py's `metrics_text`):
             `apiserver_resource_objects`, `apiserver_resource_size_estimate_bytes` and
             `apiserver_storage_objects` for the cluster's resources, amid other families, so a
             gateway's `workEstimator.clusterMetrics` charges LISTs from them. Free (not in flight).
It does not model kube-apiserver's own flow control (APF, max-inflight): what reaches it runs. The
question it answers is what a gateway in front lets through.

Requests (kube-apiserver paths; the caller's identity from `X-Remote-User`, as a front proxy sends):
  GET  /api/v1/pods, /api/v1/namespaces/NS/pods     LIST (all pods / one namespace's share)
  PUT  /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/NAME   lease renewal
  GET  any other path                               a GET of one object
  POST/PUT/PATCH/DELETE any other path              a write
Responses are small JSON documents: the cost of a LIST is modelled, its bytes are not sent.

Control endpoints (direct, not through the gateway):
  GET /__model/stats    JSON: alive, in_flight, memory_bytes, peak_memory_bytes, peak_in_flight,
                        deaths, death_times, scrapes, served / failed / latency sums per class
  GET /__model/series   JSON: the samples taken every `sample_s` [t, in_flight, memory_bytes,
                        alive] (t in seconds since start) and the model's parameters
Classes (by `X-Remote-User`): node (system:node:*), controller (system:serviceaccount:kube-system:*),
storm (system:serviceaccount:telemetry:*), user (anyone else).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: apfkit/

from apfkit.upstream import metrics_text  # noqa: E402

GIB = 1 << 30


@dataclass
class Model:
    """The stand-in's parameters. Sources: the Kubernetes documentation's control-plane sizing,
    upstream's work estimator (../shared/reference/kubernetes-apf.md §6) and the LIST-size figure
    of the runaway-client outage this benchmark replays (a LIST of 100k pods ≈ 2 GB in the
    apiserver). Values marked "assumption" have no public measurement behind them; they are
    chosen once, for every gateway alike."""

    # Kubernetes docs, "Considerations for large clusters": control-plane VM for clusters of more
    # than 500 nodes on GCE is n1-standard-32 (32 vCPUs, 120 GB).
    cores: float = 32.0
    # Half of that VM's 120 GB for kube-apiserver (etcd, scheduler and controller-manager share
    # the rest). Assumption.
    memory_limit_bytes: int = 60 * 10**9
    # kube-apiserver's resting memory: its watch cache of every object (100k pods ≈ 2 GB decoded)
    # plus the other resources, caches and buffers. Assumption.
    baseline_memory_bytes: int = 8 * 10**9
    # The cluster: 100k pods (the outage's figure), spread over `namespaces`.
    pods: int = 100_000
    namespaces: int = 1000
    # Serialized size of a pod as kube-apiserver 1.34 reports it
    # (apiserver_resource_size_estimate_bytes ÷ apiserver_resource_objects). Assumption: a
    # typical pod with a few containers, probes and status is 3-6 KB of JSON.
    pod_size_bytes: int = 4_000
    # Memory a LIST holds per byte of serialized objects: the objects decoded from etcd (or
    # copied from the watch cache), converted and encoded into the response (several copies of
    # each object at once). Chosen so that a LIST of 100k pods holds 2 GB: the outage's figure
    # (100k × 4 KB × 5 = 2.0 GB).
    list_memory_multiplier: float = 5.0
    # CPU per object returned by a LIST (decode, convert, filter, encode of a 4 KB pod).
    # Assumption: 50 µs, so a LIST of 100k pods is 5 core-seconds (upstream's scalability SLO
    # allows 30 s for a cluster-wide LIST at the 99th percentile).
    list_cpu_per_object_s: float = 50e-6
    # Fixed CPU of any request (authentication, authorization, admission, routing).
    request_cpu_s: float = 0.0005
    # Extra CPU of a write (validation, admission, encoding for etcd). Assumption.
    write_cpu_s: float = 0.0015
    # A write waits for etcd to commit (fsync, raft round): no CPU. etcd's guidance: commit
    # latency of a few ms on SSDs (disk wal_fsync p99 under 10 ms).
    write_commit_s: float = 0.005
    # A GET reads from etcd (consistent read): a round trip, no CPU. Assumption.
    read_wait_s: float = 0.001
    # An OOM-killed kube-apiserver restarts and must refill its watch cache before it serves:
    # tens of seconds to minutes in a large cluster. Shortened so the benchmark shows several
    # rounds; a real restart is longer, which only makes a death worse.
    restart_s: float = 5.0
    # Other resources published on /metrics (count, average serialized size). Leases: one per
    # node of the benchmark's cluster.
    extra_objects: dict = field(default_factory=lambda: {
        "coordination.k8s.io/leases": (1000, 400), "nodes": (1000, 12_000),
        "apps/deployments": (5_000, 3_000), "configmaps": (10_000, 2_000)})
    # Seconds between samples of the time series.
    sample_s: float = 0.2

    def list_memory(self, objects: int) -> int:
        return int(objects * self.pod_size_bytes * self.list_memory_multiplier)

    def list_cpu(self, objects: int) -> float:
        return self.request_cpu_s + objects * self.list_cpu_per_object_s


def classify_user(user: str) -> str:
    if user.startswith("system:node:"):
        return "node"
    if user.startswith("system:serviceaccount:kube-system:"):
        return "controller"
    if user.startswith("system:serviceaccount:telemetry:"):
        return "storm"
    return "user"


class Job:
    __slots__ = ("finish_v", "seq", "future", "writer", "memory")

    def __init__(self, finish_v: float, seq: int, future: asyncio.Future, writer, memory: int):
        self.finish_v, self.seq, self.future, self.writer, self.memory = finish_v, seq, future, writer, memory

    def __lt__(self, other: "Job") -> bool:
        return (self.finish_v, self.seq) < (other.finish_v, other.seq)


class Died(Exception):
    """The stand-in was OOM-killed while this request was in flight."""


class ApiServer:
    def __init__(self, model: Model) -> None:
        self.m = model
        self.t0 = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None
        # Processor sharing in virtual time: `v` is the service every job in the CPU phase has
        # received since start; it grows at min(1, cores / n) per second.
        self.v = 0.0
        self.v_at = self.t0
        self.heap: list[Job] = []
        self.seq = 0
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight: dict[int, Job] = {}  # every request in flight (CPU phase or waiting)
        self.memory = 0  # held by LISTs in flight
        self.peak_memory = model.baseline_memory_bytes
        self.peak_in_flight = 0
        self.alive = True
        self.deaths: list[float] = []
        self.scrapes = 0
        self.per_class: dict[str, dict[str, float]] = {}
        self.series: list[list[float]] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.writers: set = set()
        counts = {"pods": (model.pods, model.pod_size_bytes), **model.extra_objects}
        self.metrics_body = metrics_text(counts)

    # -- processor sharing --------------------------------------------------------------------
    def rate(self) -> float:
        n = len(self.heap)
        return min(1.0, self.m.cores / n) if n else 1.0

    def advance(self) -> None:
        now = time.monotonic()
        if self.heap:
            self.v += (now - self.v_at) * self.rate()
        self.v_at = now

    def reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.heap:
            delay = max(0.0, (self.heap[0].finish_v - self.v) / self.rate())
            self.timer = self.loop.call_later(delay, self.on_timer)

    def on_timer(self) -> None:
        self.timer = None
        self.advance()
        while self.heap and self.heap[0].finish_v <= self.v + 1e-9:
            job = heapq.heappop(self.heap)
            if not job.future.done():
                job.future.set_result(None)
        self.reschedule()

    async def compute(self, work_s: float, writer, memory: int) -> int:
        """Runs `work_s` core-seconds of CPU under processor sharing, holding `memory` bytes
        from now until `release` of the returned id (the request stays in flight until then).
        Raises Died."""
        self.advance()
        self.seq += 1
        fut = self.loop.create_future()
        job = Job(self.v + work_s, self.seq, fut, writer, memory)
        self.in_flight[job.seq] = job
        self.peak_in_flight = max(self.peak_in_flight, len(self.in_flight))
        if memory:
            self.memory += memory
            total = self.m.baseline_memory_bytes + self.memory
            self.peak_memory = max(self.peak_memory, total)
            if total > self.m.memory_limit_bytes:
                self.die()
                raise Died()
        heapq.heappush(self.heap, job)
        self.reschedule()
        await fut
        return job.seq

    def release(self, seq: int) -> bool:
        """Ends request `seq`; False if it is no longer in flight (the stand-in died)."""
        job = self.in_flight.pop(seq, None)
        if job is None:
            return False
        self.memory -= job.memory
        return True

    # -- death and restart --------------------------------------------------------------------
    def die(self) -> None:
        self.alive = False
        self.deaths.append(time.monotonic() - self.t0)
        for job in list(self.in_flight.values()):
            if not job.future.done():
                job.future.set_exception(Died())
        self.in_flight.clear()
        self.heap.clear()
        self.memory = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for w in list(self.writers):
            w.transport.abort()  # connection reset, as when the process is killed
        self.writers.clear()
        if self.server is not None:
            self.server.close()
            self.server = None
        self.loop.call_later(self.m.restart_s, lambda: asyncio.ensure_future(self.restart()))

    async def restart(self) -> None:
        await self.listen()
        self.advance()
        self.alive = True

    async def listen(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port,
                                                 reuse_address=True, backlog=1024)
        self.port = self.server.sockets[0].getsockname()[1]

    # -- HTTP -----------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                if n:
                    await reader.readexactly(n)
                status, body, ctype = await self.serve(method, target, headers, writer)
                writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                             % (status, b"OK" if status == 200 else b"Error", ctype.encode(), len(body))
                             + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, Died, ValueError, asyncio.LimitOverrunError):
            pass
        finally:
            self.writers.discard(writer)
            writer.transport.abort()

    def count(self, cls: str, key: str, value: float = 1.0) -> None:
        c = self.per_class.setdefault(cls, {"served": 0, "failed": 0, "latency_s": 0.0})
        c[key] += value

    async def serve(self, method: str, target: str, headers: dict, writer) -> tuple[int, bytes, str]:
        path, _, query = target.partition("?")
        if path == "/metrics":
            self.scrapes += 1
            return 200, self.metrics_body, "text/plain; version=0.0.4; charset=utf-8"
        if path.startswith("/__model/"):
            return 200, json.dumps(self.stats() if path == "/__model/stats" else
                                   {"series": self.series, "model": asdict(self.m),
                                    "deaths": self.deaths}).encode(), "application/json"
        cls = classify_user(headers.get("x-remote-user", ""))
        t = time.monotonic()
        m = self.m
        memory, wait = 0, 0.0
        parts = path.rstrip("/").split("/")
        if method == "GET" and "watch=" not in query and (
                parts == ["", "api", "v1", "pods"]
                or (len(parts) == 6 and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5] == "pods")):
            objects = m.pods if len(parts) == 4 else max(1, m.pods // m.namespaces)
            work, memory = m.list_cpu(objects), m.list_memory(objects)
            body = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}'
        elif method == "GET":
            work, wait = m.request_cpu_s, m.read_wait_s
            body = b'{"kind":"Status","status":"Success"}'
        else:
            work, wait = m.request_cpu_s + m.write_cpu_s, m.write_commit_s
            body = b'{"kind":"Status","status":"Success"}'
        try:
            seq = await self.compute(work, writer, memory)
            if wait:
                await asyncio.sleep(wait)  # still in flight, holding no CPU, while etcd answers
            if not self.release(seq):
                raise Died()
        except Died:
            self.count(cls, "failed")
            raise
        self.count(cls, "served")
        self.count(cls, "latency_s", time.monotonic() - t)
        return 200, body, "application/json"

    def stats(self) -> dict:
        return {"alive": self.alive, "in_flight": len(self.in_flight),
                "memory_bytes": self.m.baseline_memory_bytes + self.memory,
                "peak_memory_bytes": self.peak_memory, "peak_in_flight": self.peak_in_flight,
                "deaths": len(self.deaths), "death_times": self.deaths, "scrapes": self.scrapes,
                "per_class": self.per_class, "t": time.monotonic() - self.t0}

    async def sampler(self) -> None:
        while True:
            self.series.append([round(time.monotonic() - self.t0, 3), len(self.in_flight),
                                self.m.baseline_memory_bytes + self.memory, int(self.alive)])
            await asyncio.sleep(self.m.sample_s)

    async def run(self, port: int, port_file: str | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.port = port
        await self.listen()
        if port_file:
            tmp = f"{port_file}.tmp"
            Path(tmp).write_text(str(self.port))
            os.replace(tmp, port_file)
        print(f"apiserver_model listening on 127.0.0.1:{self.port}", file=sys.stderr, flush=True)
        await self.sampler()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="listen port (0: the kernel picks one)")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a Model parameter (numbers only), e.g. --set cores=16")
    args = ap.parse_args()
    model = Model()
    for kv in args.set:
        k, _, v = kv.partition("=")
        if not hasattr(model, k) or isinstance(getattr(model, k), dict):
            ap.error(f"unknown numeric parameter {k}")
        setattr(model, k, type(getattr(model, k))(float(v)))
    try:
        asyncio.run(ApiServer(model).run(args.port, args.port_file))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
