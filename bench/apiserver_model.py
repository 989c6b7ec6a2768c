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
  Memory     each LIST holds memory while it runs (on top of `baseline_memory_bytes`), by the
             modelled version (`apiserver_version`, default 1.34): from 1.31 a consistent LIST is
             served from the watch cache (KEP-2340), and from 1.33 a LIST's response is streamed
             one item at a time (KEP-5116), so a LIST from the cache holds its items' structs
             (shared with the cache) and the encoder's buffers; before, a consistent LIST read
             from etcd holds objects × average size × `list_memory_multiplier` and one from the
             cache × `cache_list_memory_multiplier`, built whole. If a LIST would take the total over
             `memory_limit_bytes`, the stand-in dies as an OOM-killed kube-apiserver: every request
             in flight fails (its connection is reset), the listening socket closes (new
             connections are refused) and it comes back `restart_s` later with nothing in flight.
  Watches    a watch cache (`cache_*`): RV=0 LISTs are served from it (cheaper than consistent
             LISTs: no etcd read, no decoding), and so are watches. Every open watch holds
             `watch_memory_bytes`. Initial events (`sendInitialEvents=true`, or a legacy watch with
             resourceVersion unset or "0") stream from the cache in batches of
             `watch_initial_batch` objects, each batch a CPU job of its objects (so they share the
             cores with everything else) holding only that batch's memory; a
             `sendInitialEvents=true` watch then gets the BOOKMARK annotated
             `k8s.io/initial-events-end`. Every write is an event: its fan-out costs
             `watch_event_cpu_s` per interested watcher (one CPU job per write, after the write
             returns, as the cacher dispatches asynchronously). A watch from a resourceVersion older
             than the cache's start gets an ERROR event with code 410 (Gone) and ends, as
             kube-apiserver's cacher answers; the client then resyncs. A watch is a streamed
             HTTP/1.1 response (chunked JSON lines) held open until the client closes it, the
             stand-in dies, or /__model/drop-watches.
  /metrics   kube-apiserver 1.34's format (apfkit/upstream.py's `metrics_text`):
             `apiserver_resource_objects`, `apiserver_resource_size_estimate_bytes` and
             `apiserver_storage_objects` for the cluster's resources, amid other families, so a
             gateway's `workEstimator.clusterMetrics` charges LISTs from them. Free (not in flight).
It does not model kube-apiserver's own flow control (APF, max-inflight): what reaches it runs. The
question it answers is what a gateway in front lets through.

Requests (kube-apiserver paths; the caller's identity from `X-Remote-User`, as a front proxy sends):
  GET  /api/v1/pods, /api/v1/namespaces/NS/pods     LIST (all pods / one namespace's share)
  PUT  /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/NAME   lease renewal
  GET  /api/v1/nodes, /api/v1/services, /apis/discovery.k8s.io/v1/endpointslices,
       /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases   LISTs of those
       (fieldSelector spec.nodeName=N on pods and metadata.name=N are indexed in the cache)
  GET  any of those LIST paths with watch=1|true    a WATCH (resourceVersion, sendInitialEvents,
                                                    allowWatchBookmarks as kube-apiserver reads them)
  GET  any other path                               a GET of one object
  POST/PUT/PATCH/DELETE any other path              a write
Responses are small JSON documents: the cost of a LIST is modelled, its bytes are not sent.

Control endpoints (direct, not through the gateway):
  GET /__model/stats    JSON: alive, in_flight, memory_bytes, peak_memory_bytes, peak_in_flight,
                        deaths, death_times, scrapes, served / failed / latency sums per class
  GET /__model/series   JSON: the samples taken every `sample_s` [t, in_flight, memory_bytes,
                        alive, open_watches] (t in seconds since start) and the model's parameters
  POST /__model/drop-watches   resets every open watch's connection and restarts the watch cache
                        at the current resourceVersion: what informers see when kube-apiserver is
                        restarted or rolled behind a load balancer (the new one is up at once)
Classes (by `X-Remote-User`): node (system:node:*), controller (system:serviceaccount:kube-system:*),
storm (system:serviceaccount:telemetry:*), user (anyone else).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import re
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote_plus

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

    # -- Watches and the watch cache ---------------------------------------------------------
    # The cluster's nodes: one Node and one Lease each, and `pods` ÷ `nodes` pods on each
    # (Kubernetes' default --max-pods is 110; 100 k pods on 1,000 nodes is 100 each).
    nodes: int = 1000
    # Services and EndpointSlices (kube-proxy's informers). Assumption: one Service per 20 pods,
    # and a little more than one EndpointSlice per Service (a slice holds up to 100 endpoints).
    services: int = 5_000
    service_size_bytes: int = 1_500
    endpointslices: int = 6_000
    endpointslice_size_bytes: int = 3_000
    # CPU per object of a LIST served from the watch cache (resourceVersion "0", or
    # resourceVersionMatch=NotOlderThan): no etcd read and no decoding, only filtering, conversion
    # and encoding. Assumption: half of a consistent LIST's `list_cpu_per_object_s`.
    cache_list_cpu_per_object_s: float = 25e-6
    # Memory per serialized byte of such a LIST before streaming encoding (below 1.33): the
    # objects are shared with the cache (not decoded copies); the response is built whole.
    # Assumption: 3 (5 for consistent LISTs). Also the memory of a watch's batch of initial events.
    cache_list_memory_multiplier: float = 3.0
    # CPU per initial event of a watch (the same work per object as a LIST from the cache:
    # `cacher.go: Watch` replays the cache's snapshot through the same conversion and encoding).
    watch_initial_cpu_per_object_s: float = 25e-6
    # Initial events are sent in batches of this many objects; a watch holds one batch's memory
    # (× `cache_list_memory_multiplier`) while it streams: the cacher's watcher channel holds at
    # most 1,000 events (`cacher.go`'s dynamic watcher channel size: 10 to 1,000).
    watch_initial_batch: int = 1_000
    # Memory an open watch holds for its whole life: two goroutines' stacks, the cacheWatcher's
    # input and result channels (up to 1,000 event pointers), the HTTP/2 stream's and the
    # encoder's buffers. Assumption: 256 KB.
    watch_memory_bytes: int = 256 * 1024
    # CPU per event per interested watcher: filtering and writing an event whose serialization
    # is cached once for all watchers (`cachingObject`). Assumption: 10 µs.
    watch_event_cpu_s: float = 10e-6
    # Bookmarks to watchers that asked for them (allowWatchBookmarks=true): the cacher's
    # `defaultBookmarkFrequency` is a minute.
    bookmark_period_s: float = 60.0
    # The events a watcher is charged for are written to it coalesced, one line per
    # `event_flush_s`: the benchmark's own economy (its clients need not parse every event; the
    # bytes of a watch are not modelled, as a LIST's are not).
    event_flush_s: float = 10.0

    # -- The apiserver's version: how it serves a LIST -----------------------------------------
    # kube-apiserver's minor version ("1.34", "1.30"). Two feature gates decide what a LIST costs
    # (staging/src/k8s.io/apiserver/pkg/features/kube_features.go):
    #   ConsistentListFromCache (KEP-2340): beta and on by default in 1.31, GA (locked on) in
    #     1.34. A LIST without resourceVersion is served from the watch cache once the cache has
    #     caught up with etcd's current revision (`cacher.go: GetList`; one etcd round trip for
    #     that revision, `read_wait_s`), not read and decoded from etcd.
    #   StreamingCollectionEncodingToJSON / ToProtobuf (KEP-5116): beta and on by default in 1.33,
    #     GA in 1.34. The response is encoded and written one item at a time
    #     (`apimachinery/pkg/runtime/serializer/json/collections.go`, protobuf likewise), so the
    #     encoded response is no longer held whole.
    # Default 1.34: the stand-in serves 1.34's /metrics, and WatchList clients (client-go 1.35's
    # default) imply a 1.34+ server. bench/protection.py's storm scenarios use "1.30" (see there).
    apiserver_version: str = "1.34"
    # A streamed LIST from the cache still holds its list object: one struct per item, a shallow
    # copy whose fields share memory with the cache (`cacher.go: GetList` appends
    # `reflect.ValueOf(elem.Object).Elem()` to the typed list's Items). Assumption: 1.2 KB (a
    # v1.Pod struct: TypeMeta, ObjectMeta, PodSpec and PodStatus are ≈ 150 field headers of
    # 8-24 bytes); the same for every resource.
    list_item_struct_bytes: int = 1_200
    # ... and its encoder's and writer's buffers: one item's encoding at a time, the response
    # writer's chunk (gzip's when compressed) and the HTTP/2 stream's send window. Assumption.
    list_stream_buffer_bytes: int = 512 * 1024

    def version(self) -> tuple[int, int]:
        major, _, minor = self.apiserver_version.partition(".")
        return int(major), int(minor or 0)

    def consistent_list_from_cache(self) -> bool:
        """KEP-2340: on by default from 1.31 (GA in 1.34)."""
        return self.version() >= (1, 31)

    def streaming_list_encoding(self) -> bool:
        """KEP-5116: on by default from 1.33 (GA in 1.34)."""
        return self.version() >= (1, 33)

    def resources(self) -> dict:
        """Every resource the stand-in serves and publishes: name -> (count, average size)."""
        return {"pods": (self.pods, self.pod_size_bytes), **self.extra_objects,
                "coordination.k8s.io/leases": (self.nodes, 400), "nodes": (self.nodes, 12_000),
                "services": (self.services, self.service_size_bytes),
                "discovery.k8s.io/endpointslices": (self.endpointslices, self.endpointslice_size_bytes)}

    def cache_list_memory(self, objects: int, size: int) -> int:
        """Memory a LIST served from the watch cache holds while it runs: streamed (1.33+), its
        items' structs and the encoder's buffers; before, the response built whole."""
        if self.streaming_list_encoding():
            return objects * self.list_item_struct_bytes + self.list_stream_buffer_bytes
        return int(objects * size * self.cache_list_memory_multiplier)

    def etcd_list_memory(self, objects: int, size: int) -> int:
        """Memory a LIST read from etcd holds: etcd's response and the decoded objects remain
        (`etcd3/store.go: GetList` decodes every item into the list); streaming (1.33+) drops
        only the whole encoded response, one of the multiplier's copies (assumption)."""
        copies = self.list_memory_multiplier - (1.0 if self.streaming_list_encoding() else 0.0)
        return int(objects * size * copies)

    def initial_batch_memory(self, objects: int, size: int) -> int:
        """A watch's batch of initial events (not a LIST: unchanged by streaming encoding)."""
        return int(objects * size * self.cache_list_memory_multiplier)

    def scaled(self, nodes: int) -> "Model":
        """The cluster and the stand-in scaled by nodes ÷ 1,000 together: pods, Services,
        EndpointSlices, cores, the baseline memory and the memory limit. Per-object and
        per-request costs are unchanged."""
        f = nodes / 1000
        return replace(self, nodes=nodes, pods=int(self.pods * f), namespaces=max(1, int(self.namespaces * f)),
                       services=max(1, int(self.services * f)), endpointslices=max(1, int(self.endpointslices * f)),
                       cores=self.cores * f, baseline_memory_bytes=int(self.baseline_memory_bytes * f),
                       memory_limit_bytes=int(self.memory_limit_bytes * f))

    def list_memory(self, objects: int) -> int:
        """A consistent LIST of `objects` pods: from the cache from 1.31, else from etcd."""
        if self.consistent_list_from_cache():
            return self.cache_list_memory(objects, self.pod_size_bytes)
        return self.etcd_list_memory(objects, self.pod_size_bytes)

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


LIST_PATHS = {"/api/v1/pods": "pods", "/api/v1/nodes": "nodes", "/api/v1/services": "services",
              "/apis/discovery.k8s.io/v1/endpointslices": "discovery.k8s.io/endpointslices",
              "/apis/coordination.k8s.io/v1/leases": "coordination.k8s.io/leases"}
# Field selectors the watch cache indexes (`registry/core/pod/storage`: the pod's spec.nodeName
# trigger; metadata.name for every resource).
INDEXED = {"spec.nodeName": "node", "metadata.name": "name"}


def parse_query(query: str) -> dict:
    out = {}
    for kv in query.split("&"):
        k, _, v = kv.partition("=")
        if k:
            out[k] = unquote_plus(v)
    return out


def resource_of(path: str) -> tuple[str, str, str] | None:
    """(resource, namespace, name) of a kube-apiserver path ("" when absent); None for others.
    The resource is named as on /metrics: "pods", "discovery.k8s.io/endpointslices"."""
    parts = path.rstrip("/").split("/")
    if parts[1:3] == ["api", "v1"]:
        group, rest = "", parts[3:]
    elif parts[1:2] == ["apis"] and len(parts) >= 4:
        group, rest = parts[2], parts[4:]
    else:
        return None
    ns = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        ns, rest = rest[1], rest[2:]
    if not rest or len(rest) > 2:
        return None
    return (f"{group}/{rest[0]}" if group else rest[0]), ns, (rest[1] if len(rest) == 2 else "")


class Scope:
    """What a LIST or WATCH selects: a resource, optionally one namespace, one indexed field."""
    __slots__ = ("resource", "namespace", "field", "value")

    def __init__(self, resource: str, namespace: str, q: dict) -> None:
        self.resource, self.namespace, self.field, self.value = resource, namespace, "", ""
        sel = q.get("fieldSelector", "")
        k, _, v = sel.partition("=")
        if k in INDEXED and v and "," not in sel:
            self.field, self.value = INDEXED[k], v.lstrip("=")

    def key(self) -> tuple[str, str, str]:
        if self.field:
            return self.resource, self.field, self.value
        return (self.resource, "ns", self.namespace) if self.namespace else (self.resource, "all", "")

    def objects(self, m: "Model", indexed: bool) -> tuple[int, int]:
        """(objects, average size) the request reads: with `indexed` (the watch cache), only
        those its index selects; from etcd, the whole range (etcd has no field index)."""
        count, size = m.resources().get(self.resource, (1, 1_000))
        if self.namespace:
            count = max(1, count // m.namespaces)
        if indexed and self.field == "name":
            count = 1
        elif indexed and self.field == "node":
            count = max(1, count // m.nodes)
        return count, size


def event_keys(resource: str, ns: str, name: str, nodes: int) -> list[tuple[str, str, str]]:
    """The watch keys a write of this object notifies (a pod also its node's watchers: pods are
    spread over nodes by a hash of their name)."""
    keys = [(resource, "all", ""), (resource, "name", name)]
    if ns:
        keys.append((resource, "ns", ns))
    if resource == "pods":
        keys.append((resource, "node", f"node-{zlib.crc32(f'{ns}/{name}'.encode()) % nodes}"))
    return keys


class Watcher:
    __slots__ = ("writer", "key", "user", "cls", "pending", "synced", "bookmarks", "last_bookmark")

    def __init__(self, writer, key: tuple, user: str, cls: str, bookmarks: bool, now: float) -> None:
        self.writer, self.key, self.user, self.cls = writer, key, user, cls
        self.pending, self.synced, self.bookmarks, self.last_bookmark = 0, False, bookmarks, now


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class WatchCache:
    """The open watches, by the key their events come by; resourceVersions; the cache's start
    (watches from before it get 410 Gone)."""

    def __init__(self, api: "ApiServer") -> None:
        self.api, self.m = api, api.m
        self.rv = self.start_rv = 1000
        self.by_key: dict[tuple, set[Watcher]] = {}
        self.watchers: set[Watcher] = set()
        self.open_by_user: dict[str, int] = {}
        self.peak_by_user: dict[str, int] = {}
        self.peak_open = 0
        self.counters = {"opened": 0, "initial_events_sent": 0, "initial_phases_done": 0, "gone": 0,
                         "events": 0, "deliveries": 0, "drops": 0}

    def add(self, w: Watcher) -> None:
        """Registers an open watch and charges its memory (Died if that is the last straw)."""
        self.watchers.add(w)
        self.by_key.setdefault(w.key, set()).add(w)
        n = self.open_by_user.get(w.user, 0) + 1
        self.open_by_user[w.user] = n
        self.peak_by_user[w.user] = max(self.peak_by_user.get(w.user, 0), n)
        self.peak_open = max(self.peak_open, len(self.watchers))
        self.counters["opened"] += 1
        self.api.hold(self.m.watch_memory_bytes)

    def remove(self, w: Watcher) -> None:
        if w not in self.watchers:
            return  # already gone with a death
        self.watchers.discard(w)
        self.by_key.get(w.key, set()).discard(w)
        self.open_by_user[w.user] -= 1
        self.api.memory -= self.m.watch_memory_bytes

    def clear(self) -> None:
        """A death: every watch is gone (its memory with the process)."""
        self.watchers.clear()
        self.by_key.clear()
        self.open_by_user.clear()
        self.start_rv = self.rv

    def drop(self) -> int:
        """Resets every watch's connection and restarts the cache at the current RV."""
        n = len(self.watchers)
        for w in list(self.watchers):
            w.writer.transport.abort()
        self.start_rv = self.rv
        self.counters["drops"] += 1
        return n

    def event(self, keys: list[tuple]) -> None:
        """A write: each interested watcher is charged `watch_event_cpu_s` (one background CPU job)."""
        self.rv += 1
        self.counters["events"] += 1
        n = 0
        for k in keys:
            for w in self.by_key.get(k, ()):
                w.pending += 1
                n += 1
        if n:
            self.counters["deliveries"] += n
            asyncio.ensure_future(self.api.background(n * self.m.watch_event_cpu_s))

    def write(self, w: Watcher, line: bytes) -> None:
        t = w.writer.transport
        if not t.is_closing() and t.get_write_buffer_size() < (1 << 20):
            w.writer.write(chunk(line))

    async def flusher(self) -> None:
        """Coalesced events and periodic bookmarks to every synced watcher."""
        while True:
            await asyncio.sleep(self.m.event_flush_s)
            now = time.monotonic()
            for w in list(self.watchers):
                if not w.synced:
                    continue
                if w.pending:
                    self.write(w, b'{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"%d"}},'
                                  b'"events":%d}\n' % (self.rv, w.pending))
                    w.pending = 0
                if w.bookmarks and now - w.last_bookmark >= self.m.bookmark_period_s:
                    self.write(w, b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"%d"}}}\n'
                               % self.rv)
                    w.last_bookmark = now

    def stats(self) -> dict:
        top = sorted(self.peak_by_user.items(), key=lambda kv: -kv[1])[:10]
        return {"open_watches": len(self.watchers), "peak_open_watches": self.peak_open,
                "open_watches_by_class": self.by_class(), "peak_open_watches_by_user": dict(top),
                "resource_version": self.rv, "cache_start_rv": self.start_rv, **self.counters}

    def by_class(self) -> dict:
        out: dict[str, int] = {}
        for w in self.watchers:
            out[w.cls] = out.get(w.cls, 0) + 1
        return out


WATCH_RE = re.compile(r"[?&]watch=(1|true)(&|$)")


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
        self.metrics_body = metrics_text(model.resources())
        self.watch = WatchCache(self)

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
            self.hold(memory)
        heapq.heappush(self.heap, job)
        self.reschedule()
        await fut
        return job.seq

    def hold(self, memory: int) -> None:
        """Takes `memory` more bytes; past the limit the stand-in dies (raises Died)."""
        self.memory += memory
        total = self.m.baseline_memory_bytes + self.memory
        self.peak_memory = max(self.peak_memory, total)
        if total > self.m.memory_limit_bytes:
            self.die()
            raise Died()

    async def background(self, work_s: float) -> None:
        """CPU the stand-in spends on its own (an event's fan-out to its watchers)."""
        try:
            seq = await self.compute(work_s, None, 0)
            self.release(seq)
        except Died:
            pass

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
        self.watch.clear()
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
                if method == "GET" and WATCH_RE.search(target):
                    await self.serve_watch(reader, writer, target, headers)
                    break
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
        if path == "/__model/drop-watches" and method == "POST":
            return 200, json.dumps({"dropped": self.watch.drop()}).encode(), "application/json"
        if path.startswith("/__model/"):
            return 200, json.dumps(self.stats() if path == "/__model/stats" else
                                   {"series": self.series, "model": asdict(self.m),
                                    "deaths": self.deaths}).encode(), "application/json"
        cls = classify_user(headers.get("x-remote-user", ""))
        t = time.monotonic()
        m = self.m
        memory, wait = 0, 0.0
        res = resource_of(path)
        event = None
        if method == "GET" and res is not None and not res[2]:
            q = parse_query(query)
            scope = Scope(res[0], res[1], q)
            consistent = q.get("resourceVersion", "") == "" and q.get("resourceVersionMatch") != "NotOlderThan"
            if not consistent or m.consistent_list_from_cache():
                objects, size = scope.objects(m, indexed=True)  # from the watch cache
                work = m.request_cpu_s + objects * m.cache_list_cpu_per_object_s
                memory = m.cache_list_memory(objects, size)
                if consistent:
                    wait = m.read_wait_s  # etcd's current revision, then the cache catches up
            else:
                objects, size = scope.objects(m, indexed=False)  # a consistent read from etcd
                work = m.request_cpu_s + objects * m.list_cpu_per_object_s
                memory = m.etcd_list_memory(objects, size)
            body = b'{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[]}' % self.watch.rv
        elif method == "GET":
            work, wait = m.request_cpu_s, m.read_wait_s
            body = b'{"kind":"Status","status":"Success"}'
        else:
            work, wait = m.request_cpu_s + m.write_cpu_s, m.write_commit_s
            body = b'{"kind":"Status","status":"Success"}'
            if res is not None and res[2]:
                event = event_keys(res[0], res[1], res[2], m.nodes)
        try:
            seq = await self.compute(work, writer, memory)
            if wait:
                await asyncio.sleep(wait)  # still in flight, holding no CPU, while etcd answers
            if not self.release(seq):
                raise Died()
        except Died:
            self.count(cls, "failed")
            raise
        if event is not None:
            self.watch.event(event)
        self.count(cls, "served")
        self.count(cls, "latency_s", time.monotonic() - t)
        return 200, body, "application/json"

    # -- watches --------------------------------------------------------------------------------
    async def serve_watch(self, reader, writer, target: str, headers: dict) -> None:
        """A WATCH: a chunked response of JSON lines, open until the client, a drop or a death
        ends it. Raises Died."""
        path, _, query = target.partition("?")
        q = parse_query(query)
        user = headers.get("x-remote-user", "")
        cls = classify_user(user)
        res = resource_of(path)
        seq = await self.compute(self.m.request_cpu_s, writer, 0)
        if not self.release(seq):
            raise Died()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        rv = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents") == "true"
        initial = send_initial or rv in ("", "0")
        if res is None or (not initial and (not rv.isdigit() or int(rv) < self.watch.start_rv)):
            # cacher.go: a resourceVersion older than the cache's window is "too old" (410 Gone).
            self.watch.counters["gone"] += 1
            writer.write(chunk(b'{"type":"ERROR","object":{"kind":"Status","status":"Failure",'
                               b'"reason":"Expired","code":410}}\n') + b"0\r\n\r\n")
            await writer.drain()
            return
        scope = Scope(res[0], res[1], q)
        w = Watcher(writer, scope.key(), user, cls, q.get("allowWatchBookmarks") == "true", time.monotonic())
        self.watch.add(w)
        try:
            if initial:
                await self.initial_events(w, scope, send_initial)
            w.synced = True
            self.count(cls, "served")
            while not writer.transport.is_closing() and await reader.read(65536):
                pass  # nothing is expected from the client: EOF (or a reset) ends the watch
        finally:
            self.watch.remove(w)

    async def initial_events(self, w: Watcher, scope: Scope, bookmark: bool) -> None:
        """The cache's objects as ADDED events, a batch at a time; then, for sendInitialEvents,
        the BOOKMARK annotated k8s.io/initial-events-end (storage/util.go:
        AnnotateInitialEventsEndBookmark)."""
        m = self.m
        left, size = scope.objects(m, indexed=True)
        while left > 0 and not w.writer.transport.is_closing():
            b = min(left, m.watch_initial_batch)
            seq = await self.compute(b * m.watch_initial_cpu_per_object_s, w.writer, m.initial_batch_memory(b, size))
            if not self.release(seq):
                raise Died()
            left -= b
            self.watch.counters["initial_events_sent"] += b
            self.watch.write(w, b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"%d"}},"objects":%d}\n'
                             % (self.watch.rv, b))
        if bookmark:
            self.watch.write(w, b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"%d",'
                                b'"annotations":{"k8s.io/initial-events-end":"true"}}}}\n' % self.watch.rv)
        self.watch.counters["initial_phases_done"] += 1

    def stats(self) -> dict:
        return {"alive": self.alive, "in_flight": len(self.in_flight),
                "memory_bytes": self.m.baseline_memory_bytes + self.memory,
                "peak_memory_bytes": self.peak_memory, "peak_in_flight": self.peak_in_flight,
                "deaths": len(self.deaths), "death_times": self.deaths, "scrapes": self.scrapes,
                "per_class": self.per_class, "t": time.monotonic() - self.t0, **self.watch.stats()}

    async def sampler(self) -> None:
        while True:
            self.series.append([round(time.monotonic() - self.t0, 3), len(self.in_flight),
                                self.m.baseline_memory_bytes + self.memory, int(self.alive),
                                len(self.watch.watchers)])
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
        flusher = asyncio.ensure_future(self.watch.flusher())
        try:
            await self.sampler()
        finally:
            flusher.cancel()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0, help="listen port (0: the kernel picks one)")
    ap.add_argument("--port-file", help="write the port here once listening")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="override a Model parameter (numbers only), e.g. --set cores=16")
    ap.add_argument("--nodes", type=int, default=1000,
                    help="scale the cluster and the stand-in by NODES ÷ 1,000 (Model.scaled)")
    ap.add_argument("--apiserver-version", default=Model.apiserver_version,
                    help="the kube-apiserver minor version modelled (how LISTs are served: from "
                         "etcd or the cache, built whole or streamed), e.g. 1.34 or 1.30")
    args = ap.parse_args()
    base = replace(Model(), apiserver_version=args.apiserver_version)
    base.version()  # a malformed version fails here
    model = base.scaled(args.nodes) if args.nodes != 1000 else base
    for kv in args.set:
        k, _, v = kv.partition("=")
        if not hasattr(model, k) or isinstance(getattr(model, k), (dict, str)):
            ap.error(f"unknown numeric parameter {k}")
        setattr(model, k, type(getattr(model, k))(float(v)))
    try:
        asyncio.run(ApiServer(model).run(args.port, args.port_file))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
