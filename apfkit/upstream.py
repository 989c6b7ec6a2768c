"""A test upstream that answers like a (tiny) kube-apiserver and records concurrency.

Stdlib only. Used by the e2e tests and the benchmarks (in-process, `Upstream()`; bench/
apiserver_model.py serves its `metrics_text`) and by ./run-gateway.sh as the demo upstream
(`python3 apfkit/upstream.py --port 0 --port-file F`).

Recorded: requests in flight now and at most, total count, per-user counts (from the
`X-Remote-User` header as forwarded by Envoy), per-user max in flight, a bounded event log, and
the headers of the last requests (`Upstream.received()`).
Per-request delay: query `?sleep=SECONDS` or header `x-sleep-ms`.
(Answers on a kept-alive connection take ~40 ms more than that unless `Upstream.set_nodelay()`
was called: see there.)
Misbehaviour (chaos tests): query `?chaos=` (after the delay, if any)
  reset  close the connection without answering (TCP RST)
  500    answer 500 with a Status body
  stall  hold the request `sleep` seconds (default 30) or until the peer (Envoy) closes the
         connection, then close without answering (a stalled backend; the client gives up first)

Control endpoints (called directly, not through Envoy):
  GET  /__stats  -> JSON {max_in_flight, in_flight, total, per_user, per_user_max_in_flight, ...}
  POST /__reset  (or GET) -> zero the counters (in_flight is kept: it is live state)

Like a kube-apiserver with many objects (set from the tests, in-process):
  GET /metrics   Prometheus text as kube-apiserver's: `apiserver_resource_objects{group,resource}`,
                 `apiserver_resource_size_estimate_bytes{group,resource}` (the SUM of the objects'
                 sizes) and `apiserver_storage_objects{resource="pods"|"deployments.apps"}` from
                 `Upstream.set_object_counts`, amid ~1.5 MB of other metrics, sent chunked.
                 `Upstream.set_metrics_failure(500)` makes it fail; `Upstream.set_metrics_token(t)`
                 makes it require `Authorization: Bearer t` (401 otherwise, as kube-apiserver
                 for a bad token). Scrapes are not requests in flight; `Upstream.scrapes()` lists
                 them (with the status answered), `received("/metrics")` their headers.
  LIST pods      `/api/v1/pods`, `/api/v1/namespaces/<ns>/pods`: a PodList of the pods set with
                 `Upstream.set_pods(n, size_bytes)` (default: the one `demo-pod`, in whatever
                 namespace is asked); `limit` is ignored (no continue token).
  WATCH pods     `?watch=true|1` or `/api/v1/watch/...`: 200, chunked, one JSON event + "\n" per
                 chunk. `sendInitialEvents=true`: ADDED per pod spread over `init_ms`, then the
                 BOOKMARK annotated `k8s.io/initial-events-end` (unless `set_watch(bookmark=False)`);
                 legacy (resourceVersion "" or "0", no sendInitialEvents=true): the ADDED events
                 only; resourceVersion=N: no initial events. Then the stream stays open (a plain
                 BOOKMARK every `bookmark_every` s when `allowWatchBookmarks=true`) until the peer
                 closes, `timeoutSeconds` (default 60) passes or the upstream stops. Watches are not
                 requests in flight: they have their own counters (`watch_init_in_flight`: from
                 just before the first initial event to just before the event that ends the
                 initial state is written; `watch_init_max`, `watches_total`, `watches_open`) and
                 `Upstream.watches()`.
  Flowcontrol    `/apis/flowcontrol.apiserver.k8s.io` (the group's discovery document) and
                 `<version>/{flowschemas,prioritylevelconfigurations}`: the objects set with
                 `Upstream.set_flowcontrol`, served LIVE, as a running kube-apiserver lists them:
                 the list's and every object's `metadata.resourceVersion` grow on every request
                 the upstream receives (one global counter, as etcd's revision moves with writes
                 anywhere in the cluster), `metadata.generation` grows only when an object's spec
                 changes, FlowSchemas' `status.conditions` (type Dangling) are rewritten with a
                 fresh `lastTransitionTime` as the APF config controller does, `managedFields`
                 carry the time of the last write, and the items come in a different order from
                 one read to the next. Only the spec is stable (`flowcontrol_list`). These
                 reads (the gateway's own) are not requests in flight; `flowcontrol_lists()`
                 counts them.
  Upgrades       any request with `Connection: upgrade` and an `Upgrade` header (kubectl exec,
                 attach, port-forward: `websocket` or `SPDY/3.1`): 101 with that Upgrade (for
                 WebSocket the Sec-WebSocket-Accept of its key and the first subprotocol offered),
                 then every byte received is echoed back, raw (no WebSocket or SPDY framing), until
                 the peer closes. Not requests in flight: `upgrades_open` / `upgrades_total`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import random
import select
import socket
import struct
import sys
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

POD_LIST = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "1"},
    "items": [
        {
            "metadata": {
                "name": "demo-pod",
                "namespace": "default",
                "uid": "6a1f2b0e-0000-4000-8000-000000000001",
                "resourceVersion": "1",
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]},
            "status": {"phase": "Running"},
        }
    ],
}

VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-apf-e2e",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

API_VERSIONS = {
    "kind": "APIVersions",
    "versions": ["v1"],
    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
}

API_GROUP_LIST = {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}

CORE_V1_RESOURCES = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "v1",
    "resources": [
        {
            "name": "pods",
            "singularName": "pod",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": ["po"],
        },
        {
            "name": "namespaces",
            "singularName": "namespace",
            "namespaced": False,
            "kind": "Namespace",
            "verbs": ["get", "list"],
            "shortNames": ["ns"],
        },
    ],
}


# -- /metrics -----------------------------------------------------------------------------------

def go_float(v: float) -> str:
    """A sample value as Prometheus' Go client writes it: strconv.FormatFloat(v, 'g', -1, 64), so
    2e8 is `2e+08` and 1234567 is `1.234567e+06` (exponent form from 10^6 up)."""
    v = float(v)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    t = Decimal(repr(abs(v))).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    nd, dp = len(digits), len(digits) + int(t.exponent)
    exp = dp - 1
    if exp < -4 or exp >= 6:  # shortest formatting decides with precision 6
        mant = digits[0] + ("." + digits[1:] if nd > 1 else "")
        return f"{sign}{mant}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if dp <= 0:
        return f"{sign}0.{'0' * -dp}{digits}"
    if dp >= nd:
        return sign + digits + "0" * (dp - nd)
    return f"{sign}{digits[:dp]}.{digits[dp:]}"


_NOISE_RESOURCES = [("", "pods"), ("", "configmaps"), ("", "secrets"), ("", "nodes"), ("", "events"),
                    ("", "services"), ("", "endpoints"), ("", "namespaces"), ("", "serviceaccounts"),
                    ("apps", "deployments"), ("apps", "replicasets"), ("batch", "jobs"),
                    ("coordination.k8s.io", "leases"), ("discovery.k8s.io", "endpointslices")]
_NOISE_VERBS = [("GET", "namespace"), ("LIST", "cluster"), ("LIST", "namespace"), ("WATCH", "cluster"),
                ("WATCH", "namespace"), ("POST", "namespace"), ("PUT", "namespace"),
                ("PATCH", "namespace"), ("DELETE", "namespace")]
_DURATION_LE = ["0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1", "1.25", "1.5", "2", "3",
                "4", "5", "6", "8", "10", "15", "20", "30", "45", "60", "+Inf"]
_SIZE_LE = ["1000", "10000", "100000", "1e+06", "1e+07", "1e+08", "1e+09", "+Inf"]
_NOISE: tuple[str, str, str] | None = None


def _noise() -> tuple[str, str, str]:
    """Other metrics a kube-apiserver exposes, ~1.5 MB, as (the families sorted before
    `apiserver_resource_objects`, those between `apiserver_resource_size_estimate_bytes` and
    `apiserver_storage_objects`, those after it)."""
    global _NOISE
    if _NOISE is not None:
        return _NOISE
    before = ["# HELP aggregator_discovery_aggregation_count_total [ALPHA] Counter of number of times discovery was aggregated",
              "# TYPE aggregator_discovery_aggregation_count_total counter",
              "aggregator_discovery_aggregation_count_total 42",
              "# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution in seconds for each verb, dry run value, group, version, resource, subresource, scope and component.",
              "# TYPE apiserver_request_duration_seconds histogram"]
    k = 0
    for group, resource in _NOISE_RESOURCES:
        version = "v1"
        for verb, scope in _NOISE_VERBS:
            for sub in ("", "status"):
                labels = (f'component="apiserver",dry_run="",group="{group}",resource="{resource}",'
                          f'scope="{scope}",subresource="{sub}",verb="{verb}",version="{version}"')
                n = 0
                for i, le in enumerate(_DURATION_LE):
                    k += 1
                    n += (k * 7919 + i) % 97
                    before.append(f'apiserver_request_duration_seconds_bucket{{{labels},le="{le}"}} {n}')
                before.append(f"apiserver_request_duration_seconds_sum{{{labels}}} {go_float(n * 0.0123)}")
                before.append(f"apiserver_request_duration_seconds_count{{{labels}}} {n}")
    after = ["# HELP apiserver_response_sizes [STABLE] Response size distribution in bytes for each group, version, verb, resource, subresource, scope and component.",
             "# TYPE apiserver_response_sizes histogram"]
    for group, resource in _NOISE_RESOURCES:
        for verb, scope in _NOISE_VERBS[:5]:
            labels = (f'component="apiserver",group="{group}",resource="{resource}",scope="{scope}",'
                      f'subresource="",verb="{verb}",version="v1"')
            n = 0
            for i, le in enumerate(_SIZE_LE):
                n += (i * 31 + len(resource)) % 13
                after.append(f'apiserver_response_sizes_bucket{{{labels},le="{le}"}} {n}')
            after.append(f"apiserver_response_sizes_sum{{{labels}}} {go_float(n * 1234.5)}")
            after.append(f"apiserver_response_sizes_count{{{labels}}} {n}")
    tail = ["# HELP apiserver_storage_size_bytes [STABLE] Size of the storage database file physically allocated in bytes.",
            "# TYPE apiserver_storage_size_bytes gauge",
            'apiserver_storage_size_bytes{storage_cluster_id="etcd-0"} 1.2345678e+08',
            "# HELP etcd_request_duration_seconds [ALPHA] Etcd request latency in seconds for each operation and object type.",
            "# TYPE etcd_request_duration_seconds histogram"]
    for _, resource in _NOISE_RESOURCES:
        for op in ("get", "list", "listWithCount", "create", "update", "delete"):
            n = 0
            for i, le in enumerate(_DURATION_LE):
                n += (i + len(op)) % 11
                tail.append(f'etcd_request_duration_seconds_bucket{{operation="{op}",type="/registry/{resource}",le="{le}"}} {n}')
    tail += ["# HELP process_cpu_seconds_total [STABLE] Total user and system CPU time spent in seconds.",
             "# TYPE process_cpu_seconds_total counter", "process_cpu_seconds_total 1234.56",
             "# HELP process_resident_memory_bytes [STABLE] Resident memory size in bytes.",
             "# TYPE process_resident_memory_bytes gauge", "process_resident_memory_bytes 1.073741824e+09"]
    _NOISE = ("\n".join(before) + "\n", "\n".join(after) + "\n", "\n".join(tail) + "\n")
    return _NOISE


def metrics_text(counts: dict[str, tuple[int, int]], legacy_only: bool = False) -> bytes:
    """kube-apiserver's /metrics with the object counts `counts` ({"pods": (count, average size),
    "apps/deployments": ...}): `apiserver_resource_objects` and `apiserver_resource_size_estimate_bytes`
    (count × average; both omitted with `legacy_only`, as before 1.34) and
    `apiserver_storage_objects` (resource "pods" / "deployments.apps"), amid other families."""
    before, after, tail = _noise()
    keys = []
    for key, (count, avg) in sorted(counts.items()):
        group, _, resource = key.rpartition("/")
        keys.append((group, resource, count, avg))
    out = [before]
    if not legacy_only:
        out.append("# HELP apiserver_resource_objects [ALPHA] Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.\n"
                   "# TYPE apiserver_resource_objects gauge\n")
        out += [f'apiserver_resource_objects{{group="{g}",resource="{r}"}} {go_float(c)}\n' for g, r, c, _ in keys]
        out.append("# HELP apiserver_resource_size_estimate_bytes [ALPHA] Estimated size of stored objects in database. Estimate is based on sum of last observed sizes of serialized objects. In case of a fetching error, the value will be -1.\n"
                   "# TYPE apiserver_resource_size_estimate_bytes gauge\n")
        out += [f'apiserver_resource_size_estimate_bytes{{group="{g}",resource="{r}"}} {go_float(c * a if c >= 0 else -1)}\n'
                for g, r, c, a in keys]
    out.append(after)
    out.append("# HELP apiserver_storage_objects [STABLE] Number of stored objects at the time of last check split by kind. In case of a fetching error, the value will be -1.\n"
               "# TYPE apiserver_storage_objects gauge\n")
    out += [f'apiserver_storage_objects{{resource="{r + "." + g if g else r}"}} {go_float(c)}\n' for g, r, c, _ in keys]
    out.append(tail)
    return "".join(out).encode()


# -- pods and watches ---------------------------------------------------------------------------

FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io"
TRUE_VALUES = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def make_pods(n: int, size_bytes: int, namespaces: tuple[str, ...] = ("default",)) -> list[dict]:
    """`n` pods (list items: no kind/apiVersion) named pod-00000… spread over `namespaces`, each
    padded with an annotation to about `size_bytes` of compact JSON."""
    pods = []
    for i in range(n):
        pod = {"metadata": {"name": f"pod-{i:05d}", "namespace": namespaces[i % len(namespaces)],
                            "uid": f"6a1f2b0e-0000-4000-8000-{i:012d}", "resourceVersion": str(1000 + i),
                            "creationTimestamp": "2024-01-01T00:00:00Z", "labels": {"app": "apf-e2e"},
                            "annotations": {"apf-e2e/padding": ""}},
               "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]},
               "status": {"phase": "Running"}}
        pad = size_bytes - len(json.dumps(pod, separators=(",", ":")))
        pod["metadata"]["annotations"]["apf-e2e/padding"] = "x" * max(0, pad)
        pods.append(pod)
    return pods


def pods_path(path: str) -> tuple[str | None, bool] | None:
    """(namespace or None for all, watch path form) for a pods collection path, else None:
    /api/v1/pods, /api/v1/namespaces/<ns>/pods, /api/v1/watch/pods, /api/v1/watch/namespaces/<ns>/pods."""
    parts = path.rstrip("/").split("/")
    if parts[:3] != ["", "api", "v1"]:
        return None
    rest, watch = parts[3:], False
    if rest[:1] == ["watch"]:
        rest, watch = rest[1:], True
    if rest == ["pods"]:
        return None, watch
    if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "pods" and rest[1]:
        return rest[1], watch
    return None


def rfc3339(t: float) -> str:
    """A Kubernetes timestamp (metav1.Time: RFC 3339, whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def flowcontrol_list(resource: str, version: str, objects: list[dict], levels: set[str],
                     generations: dict[str, int], revision: int, now: float) -> dict:
    """The list `resource` of `version` as a live kube-apiserver answers it at store revision
    `revision`: the objects' specs as set, everything else volatile (see the module docstring).
    `levels`: the names of the existing priority levels (a FlowSchema's Dangling condition);
    `generations`: metadata.generation per object name."""
    items = json.loads(json.dumps(objects))
    # The APF config controller writes FlowSchemas' status (apf_controller.go: the consumer's
    # Dangling conditions); the config producer keeps the levels' specs (rest/storage_flowcontrol.go).
    role = "consumer" if resource == "flowschemas" else "producer"
    manager = f"api-priority-and-fairness-config-{role}-{version}"
    gv = f"flowcontrol.apiserver.k8s.io/{version}"
    for i, o in enumerate(items):
        meta = o.setdefault("metadata", {})
        name = meta.get("name", "")
        # Each object last written a few revisions back (its status, by the APF controller).
        meta["resourceVersion"] = str(revision - len(items) + i)
        meta["generation"] = generations.get(name, 1)
        meta.setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
        fields = {"f:status": {"f:conditions": {}}} if resource == "flowschemas" else {"f:spec": {}}
        meta["managedFields"] = [
            {"manager": "kube-apiserver", "operation": "Update", "apiVersion": gv,
             "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
            {"manager": manager, "operation": "Apply", "apiVersion": gv,
             "time": rfc3339(now), "fieldsType": "FieldsV1", "fieldsV1": fields,
             **({"subresource": "status"} if resource == "flowschemas" else {})}]
        if resource == "flowschemas":
            pl = ((o.get("spec") or {}).get("priorityLevelConfiguration") or {}).get("name", "")
            found = pl in levels
            o["status"] = {"conditions": [{
                "type": "Dangling", "status": "False" if found else "True",
                "lastTransitionTime": rfc3339(now), "reason": "Found" if found else "NotFound",
                "message": (f"This FlowSchema references the PriorityLevelConfiguration object named "
                            f"\"{pl}\" and it {'exists' if found else 'does not exist'}")}]}
        else:
            o["status"] = {}
    random.Random(revision).shuffle(items)  # the order varies from one read to the next
    kind = "FlowSchemaList" if resource == "flowschemas" else "PriorityLevelConfigurationList"
    return {"kind": kind, "apiVersion": gv, "metadata": {"resourceVersion": str(revision)}, "items": items}


class Cluster:
    """What the fake apiserver serves beyond the fixed documents (set in-process by the tests;
    not cleared by `Stats.reset`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.pods: list[dict] | None = None  # None: the demo pod, in whatever namespace is asked
        self.pods_gen = 0  # bumped by every set_pods (invalidates list_cache)
        self.list_cache: dict[str | None, bytes] = {}
        self.counts: dict[str, tuple[int, int]] = {}
        self.legacy_only = False
        self.metrics_body = metrics_text({})
        self.metrics_failure: int | None = None
        self.metrics_token: str | None = None
        self.watch_init_ms = 150.0
        self.watch_bookmark = True
        self.bookmark_every = 1.0
        self.revision = 1000  # the store's revision: moves with every request (see `touch`)
        self.fc_lists = 0  # flowcontrol lists served

    def touch(self) -> int:
        """One more request reached the cluster: the store's revision moves (other clients'
        writes, the controllers' status updates). Returns the new revision."""
        with self.lock:
            self.revision += 1
            return self.revision

    def resource_version(self) -> str:
        return "1" if self.pods is None else str(1000 + len(self.pods))

    def pods_in(self, ns: str | None) -> list[dict]:
        """The pods of namespace `ns` (all for None), as list items (copies)."""
        with self.lock:
            if self.pods is None:
                items = json.loads(json.dumps(POD_LIST["items"]))
                if ns is not None:
                    for item in items:
                        item["metadata"]["namespace"] = ns
                return items
            return [p for p in self.pods if ns is None or p["metadata"]["namespace"] == ns]

    def list_body(self, ns: str | None) -> bytes:
        """The PodList of namespace `ns` (all for None), serialized once per set of pods."""
        with self.lock:
            body = self.list_cache.get(ns)
            if body is not None:
                return body
            gen, demo, rv = self.pods_gen, self.pods is None, self.resource_version()
        doc = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
               "items": self.pods_in(ns)}
        body = json.dumps(doc).encode() if demo else json.dumps(doc, separators=(",", ":")).encode()
        with self.lock:
            if gen == self.pods_gen and len(self.list_cache) < 64:
                self.list_cache[ns] = body
        return body


class Stats:
    """Thread-safe counters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.user_in_flight: dict[str, int] = {}
        # Watches (live state, kept by reset): open now, and in their initial phase now.
        self.watches_open = 0
        self.watch_init_in_flight = 0
        self.upgrades_open = 0  # upgraded (101) connections open now
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.max_in_flight = self.in_flight
            self.total = 0
            self.per_user: dict[str, int] = {}
            self.per_user_max_in_flight: dict[str, int] = dict(self.user_in_flight)
            self.events: list[tuple[float, float, str, str]] = []  # (start, end, user, path)
            self.chaos: dict[str, int] = {}  # ?chaos= misbehaviours performed, by kind
            self.received: list[tuple[str, list[tuple[str, str]]]] = []  # (path, headers)
            self.scrapes: list[tuple[float, int]] = []  # GET /metrics: (monotonic at arrival, status)
            self.watch_init_max = self.watch_init_in_flight
            self.watches_total = 0
            self.watches: list[dict] = []  # one record per watch opened since the reset
            self.upgrades_total = 0
            self.trailers: list[tuple[str, str, str]] = []  # request trailers: (path, name, value)
            # The flowcontrol objects served like an apiserver (items without kind/apiVersion,
            # as real list responses); set with Upstream.set_flowcontrol. Not reset.
            if not hasattr(self, "flowcontrol"):
                self.flowcontrol: dict[str, list[dict]] = {"flowschemas": [], "prioritylevelconfigurations": []}
                self.flowcontrol_generations: dict[str, dict[str, int]] = {}
            # The flowcontrol versions served (the first is the preferred one, as in the group's
            # discovery document); set with Upstream.set_flowcontrol_versions. Not reset.
            if not hasattr(self, "flowcontrol_versions"):
                self.flowcontrol_versions: list[str] = ["v1", "v1beta3"]

    def count_chaos(self, kind: str) -> None:
        with self.lock:
            self.chaos[kind] = self.chaos.get(kind, 0) + 1

    def record_headers(self, path: str, headers: list[tuple[str, str]]) -> None:
        with self.lock:
            if len(self.received) < 10_000:
                self.received.append((path, headers))

    def begin(self, user: str) -> float:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.total += 1
            self.per_user[user] = self.per_user.get(user, 0) + 1
            n = self.user_in_flight.get(user, 0) + 1
            self.user_in_flight[user] = n
            self.per_user_max_in_flight[user] = max(self.per_user_max_in_flight.get(user, 0), n)
        return time.monotonic()

    def end(self, user: str, start: float, path: str) -> None:
        with self.lock:
            self.in_flight -= 1
            self.user_in_flight[user] = self.user_in_flight.get(user, 1) - 1
            if len(self.events) < 100_000:
                self.events.append((start, time.monotonic(), user, path))

    def record_scrape(self, at: float, status: int) -> None:
        with self.lock:
            if len(self.scrapes) < 100_000:
                self.scrapes.append((at, status))

    def watch_open(self, rec: dict) -> None:
        with self.lock:
            self.watches_open += 1
            self.watches_total += 1
            if len(self.watches) < 100_000:
                self.watches.append(rec)

    def watch_init_begin(self, rec: dict) -> None:
        with self.lock:
            self.watch_init_in_flight += 1
            self.watch_init_max = max(self.watch_init_max, self.watch_init_in_flight)
            rec["init_start"] = time.monotonic()

    def watch_init_end(self, rec: dict) -> None:
        """The initial phase is over (idempotent). Called just BEFORE the event that ends it is
        written (the annotated bookmark; a legacy watch's last initial event), or when the stream
        ends without it. Counting the end before the bytes leave (as `end` does for requests)
        keeps `watch_init_in_flight` a lower bound of what a gateway holding the seats until that
        event passed can have dispatched: bookkeeping after the write could lose the race with the
        gateway's next dispatch (this thread may wait for the GIL while Envoy moves on)."""
        with self.lock:
            if rec.get("init_start") is not None and rec.get("init_end") is None:
                rec["init_end"] = time.monotonic()
                self.watch_init_in_flight -= 1

    def watch_close(self, rec: dict) -> None:
        with self.lock:
            self.watches_open -= 1
            rec["end"] = time.monotonic()

    def upgrade(self, delta: int) -> None:
        with self.lock:
            self.upgrades_open += delta
            self.upgrades_total += max(0, delta)

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "max_in_flight": self.max_in_flight,
                "in_flight": self.in_flight,
                "total": self.total,
                "per_user": dict(self.per_user),
                "per_user_max_in_flight": dict(self.per_user_max_in_flight),
                "user_in_flight": {u: n for u, n in self.user_in_flight.items() if n},
                "chaos": dict(self.chaos),
                "metrics_scrapes": len(self.scrapes),
                "watches_total": self.watches_total,
                "watches_open": self.watches_open,
                "watch_init_in_flight": self.watch_init_in_flight,
                "watch_init_max": self.watch_init_max,
                "upgrades_open": self.upgrades_open,
                "upgrades_total": self.upgrades_total,
            }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "apf-e2e-upstream"

    def log_message(self, fmt: str, *args) -> None:  # quiet
        if getattr(self.server, "verbose", False):
            sys.stderr.write("upstream: " + (fmt % args) + "\n")

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode())

    def _drain_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _read_chunked(self) -> bytes:
        """A chunked request body; its trailer fields are recorded (`Upstream.trailers()`)."""
        body = b""
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            body += self.rfile.read(size)
            self.rfile.readline(8)
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        while True:
            line = self.rfile.readline(65536).rstrip(b"\r\n")
            if not line:
                return body
            name, _, value = line.decode("latin-1").partition(":")
            with stats.lock:
                stats.trailers.append((self.path, name.strip(), value.strip()))

    def _handle(self) -> None:
        if getattr(self.server, "nodelay", False) and not getattr(self, "_nodelay_on", False):
            try:
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self._nodelay_on = True
        self._drain_body()
        url = urlsplit(self.path)
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        if url.path == "/__stats":
            return self._json(200, stats.snapshot())
        if url.path == "/__reset":
            stats.reset()
            return self._json(200, {"reset": True})
        if url.path == "/__events":
            with stats.lock:
                ev = list(stats.events)
            return self._json(200, ev)

        stats.record_headers(self.path, list(self.headers.items()))
        self.server.cluster.touch()  # type: ignore[attr-defined]
        if url.path == "/metrics":
            return self._metrics()
        if url.path.rstrip("/") == FLOWCONTROL or url.path.startswith(FLOWCONTROL + "/"):
            return self._answer(url.path)  # the gateway's own policy reads: not in flight
        upgrade = self.headers.get("Upgrade")
        if upgrade and "upgrade" in (self.headers.get("Connection") or "").lower():
            return self._upgrade(upgrade.strip())
        user = self.headers.get("X-Remote-User") or ""
        qs = parse_qs(url.query)
        delay = 0.0
        try:
            if "sleep" in qs:
                delay = float(qs["sleep"][0])
            elif self.headers.get("x-sleep-ms"):
                delay = float(self.headers["x-sleep-ms"]) / 1000.0
        except ValueError:
            delay = 0.0
        delay = max(0.0, min(delay, 60.0))
        pods = pods_path(url.path)
        if pods is not None and (pods[1] or qs.get("watch", [""])[-1] in TRUE_VALUES):
            # A watch is not a request in flight: its own counters, and no ?chaos=.
            return self._watch(pods[0], qs, user, delay)
        chaos = qs.get("chaos", [""])[0]
        start = stats.begin(user)
        try:
            if chaos == "stall":
                self._stall(delay or 30.0)
            elif delay:
                time.sleep(delay)
        finally:
            # In flight = received and not yet answered: count the end before the response
            # leaves, or the gateway's next dispatch can race this thread's bookkeeping.
            stats.end(user, start, url.path)
        if chaos in ("reset", "stall"):
            stats.count_chaos(chaos)
            return self._reset()
        if chaos == "500":
            stats.count_chaos(chaos)
            return self._json(500, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "chaos", "code": 500})
        self._answer(url.path)

    def _stall(self, limit: float) -> None:
        """Wait up to `limit` seconds, returning early once the peer closed the connection."""
        deadline = time.monotonic() + limit
        sock = self.connection
        while time.monotonic() < deadline:
            r, _, _ = select.select([sock], [], [], 0.05)
            if r:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        return
                except OSError:
                    return
                time.sleep(0.05)  # pipelined bytes, not a close: keep stalling

    def _reset(self) -> None:
        """Abort the connection with a TCP RST and no response."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass

    def _answer(self, path: str) -> None:
        p = path.rstrip("/") or "/"
        if p in ("/healthz", "/readyz", "/livez") or p.startswith(("/healthz/", "/readyz/", "/livez/")):
            return self._send(200, b"ok", "text/plain; charset=utf-8")
        if p == "/version":
            return self._json(200, VERSION)
        if p == "/api":
            return self._json(200, API_VERSIONS)
        if p == "/apis":
            return self._json(200, API_GROUP_LIST)
        if p == "/api/v1":
            return self._json(200, CORE_V1_RESOURCES)
        group = FLOWCONTROL
        if p == group or p.startswith(group + "/"):
            stats: Stats = self.server.stats  # type: ignore[attr-defined]
            with stats.lock:
                served = list(stats.flowcontrol_versions)
            gv = lambda v: {"groupVersion": f"flowcontrol.apiserver.k8s.io/{v}", "version": v}
            if p == group:
                # The group's discovery document (an APIGroup), as kube-apiserver serves it.
                doc = {"kind": "APIGroup", "apiVersion": "v1", "name": "flowcontrol.apiserver.k8s.io",
                       "versions": [gv(v) for v in served]}
                if served:
                    doc["preferredVersion"] = gv(served[0])
                return self._json(200, doc)
            version, _, res = p[len(group) + 1:].partition("/")
            if version in served and res in ("flowschemas", "prioritylevelconfigurations"):
                cluster: Cluster = self.server.cluster  # type: ignore[attr-defined]
                with stats.lock:
                    objects = stats.flowcontrol.get(res, [])
                    levels = {pl.get("metadata", {}).get("name", "")
                              for pl in stats.flowcontrol.get("prioritylevelconfigurations", [])}
                    generations = dict(stats.flowcontrol_generations.get(res, {}))
                revision = cluster.touch()
                with cluster.lock:
                    cluster.fc_lists += 1
                doc = flowcontrol_list(res, version, objects, levels, generations, revision, time.time())
                return self._json(200, doc)
            if version not in served:
                return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404, "message": "the server could not find the requested resource"})
        pods = pods_path(p)
        if pods is not None or (p.startswith("/api/v1/namespaces/") and p.endswith("/pods")):
            ns = pods[0] if pods is not None else p.split("/")[4]
            cluster: Cluster = self.server.cluster  # type: ignore[attr-defined]
            return self._send_big(200, cluster.list_body(ns))
        return self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                                "path": path, "method": self.command})

    def _send_big(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        """Like _send, the body written in pieces of 256 KiB (a large LIST leaves in several
        writes, as from a real apiserver)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        view = memoryview(body)
        for i in range(0, len(body), 256 * 1024):
            self.wfile.write(view[i:i + 256 * 1024])

    # -- /metrics ------------------------------------------------------------------------------
    def _metrics(self) -> None:
        """kube-apiserver's /metrics (chunked, as Go's server sends a body of unknown length), or
        the failure set with Upstream.set_metrics_failure. Not a request in flight."""
        at = time.monotonic()
        cluster: Cluster = self.server.cluster  # type: ignore[attr-defined]
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        with cluster.lock:
            failure, body, token = cluster.metrics_failure, cluster.metrics_body, cluster.metrics_token
        if not failure and token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            failure = 401
        stats.record_scrape(at, failure or 200)
        if failure:
            reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 429: "TooManyRequests",
                      503: "ServiceUnavailable"}.get(failure, "InternalError")
            return self._json(failure, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                        "status": "Failure", "message": f"/metrics: {reason}",
                                        "reason": reason, "code": failure})
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.command == "HEAD":
            return
        view = memoryview(body)
        for i in range(0, len(body), 64 * 1024):
            self._chunk(view[i:i + 64 * 1024])
        self.wfile.write(b"0\r\n\r\n")

    # -- upgrades ------------------------------------------------------------------------------
    def _upgrade(self, protocol: str) -> None:
        """101 Switching Protocols, then echo (see the module docstring)."""
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        self.close_connection = True
        self.send_response(101)
        self.send_header("Upgrade", protocol)
        self.send_header("Connection", "Upgrade")
        if protocol.lower() == "websocket":
            key = (self.headers.get("Sec-WebSocket-Key") or "").strip()
            digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
            self.send_header("Sec-WebSocket-Accept", base64.b64encode(digest).decode())
            offered = [p.strip() for v in self.headers.get_all("Sec-WebSocket-Protocol") or []
                       for p in v.split(",") if p.strip()]
            if offered:
                self.send_header("Sec-WebSocket-Protocol", offered[0])
        self.end_headers()
        stats.upgrade(+1)
        try:
            while True:
                data = self.rfile.read1(64 * 1024)
                if not data:
                    return
                self.wfile.write(data)
        except OSError:
            return
        finally:
            stats.upgrade(-1)

    # -- watches -------------------------------------------------------------------------------
    def _chunk(self, data) -> None:
        self.wfile.write(b"%x\r\n" % len(data) + bytes(data) + b"\r\n")

    def _event(self, kind: str, obj: dict) -> None:
        """One watch event: its JSON and a newline in one chunk (kube-apiserver flushes each)."""
        self._chunk(json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n")

    def _peer_closed_until(self, until: float) -> bool:
        """Wait until the monotonic time `until`; True (early) once the peer closed the
        connection or the upstream is stopping."""
        cluster: Cluster = self.server.cluster  # type: ignore[attr-defined]
        sock = self.connection
        while True:
            if cluster.stopping.is_set():
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            r, _, _ = select.select([sock], [], [], min(left, 0.05))
            if r:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True
                time.sleep(min(0.05, max(0.0, until - time.monotonic())))  # bytes, not a close

    def _watch(self, ns: str | None, qs: dict, user: str, delay: float) -> None:
        """A pods watch, streamed as kube-apiserver does (see the module docstring)."""
        cluster: Cluster = self.server.cluster  # type: ignore[attr-defined]
        stats: Stats = self.server.stats  # type: ignore[attr-defined]
        flag = lambda k: qs.get(k, [""])[-1] in TRUE_VALUES  # noqa: E731
        send_initial = flag("sendInitialEvents")
        rv = qs.get("resourceVersion", [""])[-1]
        legacy = not send_initial and rv in ("", "0")
        bookmarks = flag("allowWatchBookmarks")
        try:
            timeout = float(qs.get("timeoutSeconds", ["60"])[-1])
        except ValueError:
            timeout = 60.0
        timeout = max(0.0, min(timeout, 3600.0)) or 60.0
        with cluster.lock:
            init_s, annotated, every = cluster.watch_init_ms / 1000.0, cluster.watch_bookmark, cluster.bookmark_every
        items = cluster.pods_in(ns) if (send_initial or legacy) else []
        rv_now = cluster.resource_version()
        rec = {"user": user, "path": self.path, "start": time.monotonic(),
               "mode": "initial-events" if send_initial else ("legacy" if legacy else "from-rv"),
               "headers_sent": None, "init_start": None, "init_end": None, "bookmark_sent": None,
               "events": 0, "end": None, "ended_by": None}
        self.close_connection = True
        if delay and self._peer_closed_until(time.monotonic() + delay):
            return
        stats.watch_open(rec)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            rec["headers_sent"] = time.monotonic()
            if send_initial or legacy:
                stats.watch_init_begin(rec)
                t0, n = time.monotonic(), len(items)
                for i, item in enumerate(items):
                    # Spread over init_s: the first at once, the last at init_s.
                    if self._peer_closed_until(t0 + (init_s * i / (n - 1) if n > 1 else 0.0)):
                        rec["ended_by"] = "peer"
                        return
                    if legacy and i == n - 1:
                        stats.watch_init_end(rec)  # before the write: see Stats.watch_init_end
                    self._event("ADDED", {"kind": "Pod", "apiVersion": "v1", **item})
                    rec["events"] += 1
                if send_initial:
                    if self._peer_closed_until(t0 + init_s):
                        rec["ended_by"] = "peer"
                        return
                    if annotated:
                        stats.watch_init_end(rec)  # before the write: see Stats.watch_init_end
                        self._event("BOOKMARK", {
                            "kind": "Pod", "apiVersion": "v1",
                            "metadata": {"resourceVersion": rv_now, "creationTimestamp": None,
                                         "annotations": {INITIAL_EVENTS_END: "true"}},
                            "spec": {"containers": None}, "status": {}})
                        rec["bookmark_sent"] = time.monotonic()
                        rec["events"] += 1
                else:
                    stats.watch_init_end(rec)
            deadline = rec["start"] + timeout
            next_bookmark = time.monotonic() + every
            while True:
                periodic = bookmarks and every > 0
                if self._peer_closed_until(min(deadline, next_bookmark) if periodic else deadline):
                    rec["ended_by"] = "stopping" if cluster.stopping.is_set() else "peer"
                    return
                if time.monotonic() >= deadline:
                    self.wfile.write(b"0\r\n\r\n")  # timeoutSeconds: the stream ends cleanly
                    rec["ended_by"] = "timeout"
                    return
                self._event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                         "metadata": {"resourceVersion": rv_now, "creationTimestamp": None},
                                         "spec": {"containers": None}, "status": {}})
                rec["events"] += 1
                next_bookmark = time.monotonic() + every
        except OSError:
            rec["ended_by"] = "error"
        finally:
            stats.watch_init_end(rec)
            stats.watch_close(rec)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        # Peers (Envoy) closing connections mid-answer is normal in these tests: stay quiet.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Upstream:
    """An upstream on 127.0.0.1 with an OS-chosen free port, served from a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, verbose: bool = False) -> None:
        self.stats = Stats()
        self.server = _Server((host, port), _Handler)
        self.server.stats = self.stats  # type: ignore[attr-defined]
        self.server.verbose = verbose  # type: ignore[attr-defined]
        self.cluster = Cluster()
        self.server.cluster = self.cluster  # type: ignore[attr-defined]
        self.host = host
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "Upstream":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.cluster.stopping.set()  # open watch streams end
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # In-process access (tests); the HTTP control endpoints say the same.
    def snapshot(self) -> dict:
        return self.stats.snapshot()

    def reset(self) -> None:
        self.stats.reset()

    def set_nodelay(self, on: bool = True) -> None:
        """Answer with TCP_NODELAY (from each connection's next request on, so also on the
        connections Envoy already pooled). Off by default: a response leaves in two writes (head,
        then body), and with Nagle on, the body waits for the peer's delayed ACK of the head, so
        every answer on a reused connection takes ~40 ms longer than its `sleep`. Tests that time
        the service need it on."""
        self.server.nodelay = on  # type: ignore[attr-defined]

    def set_flowcontrol(self, flowschemas: list[dict], prioritylevelconfigurations: list[dict]) -> None:
        """Objects served at /apis/flowcontrol.apiserver.k8s.io/<version>/{flowschemas,
        prioritylevelconfigurations} for each served version (set_flowcontrol_versions), as a
        live apiserver lists them: items without kind, their specs as given, metadata and status
        changing on every read (the module docstring). Counts as a write."""
        strip = lambda objs: [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objs]
        new = {"flowschemas": strip(flowschemas), "prioritylevelconfigurations": strip(prioritylevelconfigurations)}
        with self.stats.lock:
            old = self.stats.flowcontrol
            for res, objs in new.items():
                # metadata.generation: bumped when an object's spec changes (as the apiserver's
                # strategy does), kept otherwise.
                before = {o.get("metadata", {}).get("name"): o.get("spec") for o in old.get(res, [])}
                gens = self.stats.flowcontrol_generations.setdefault(res, {})
                for o in objs:
                    name = o.get("metadata", {}).get("name", "")
                    if name not in gens or before.get(name) != o.get("spec"):
                        gens[name] = gens.get(name, 0) + 1
            self.stats.flowcontrol = new
        self.cluster.touch()  # a write

    def flowcontrol_lists(self) -> int:
        """Flowcontrol lists (FlowSchemas or priority levels) served since the start."""
        with self.cluster.lock:
            return self.cluster.fc_lists

    def set_flowcontrol_versions(self, versions: list[str]) -> None:
        """The flowcontrol.apiserver.k8s.io versions served from now on, the preferred one first
        (default ["v1", "v1beta3"], as kube-apiserver 1.29+): the group's discovery document
        /apis/flowcontrol.apiserver.k8s.io lists them, and the lists of any other version answer
        404. Every served version lists the objects set_flowcontrol gave, as they are."""
        with self.stats.lock:
            self.stats.flowcontrol_versions = list(versions)

    def set_object_counts(self, counts: dict[str, tuple[int, int]], legacy_only: bool = False) -> None:
        """What /metrics reports from now on: {"pods": (count, average object size in bytes),
        "apps/deployments": (count, average), ...} (keys `resource` for the core group,
        `group/resource` otherwise). The size metric is the SUM, count × average. With
        `legacy_only` only `apiserver_storage_objects` (a cluster before 1.34)."""
        body = metrics_text(counts, legacy_only)
        with self.cluster.lock:
            self.cluster.counts, self.cluster.legacy_only = dict(counts), legacy_only
            self.cluster.metrics_body = body

    def set_metrics_token(self, token: str | None) -> None:
        """/metrics answers 401 unless the request carries `Authorization: Bearer <token>`;
        None: no token needed."""
        with self.cluster.lock:
            self.cluster.metrics_token = token

    def set_metrics_failure(self, status: int | None) -> None:
        """/metrics answers `status` (e.g. 500, 403) with a Status body; None restores it."""
        with self.cluster.lock:
            self.cluster.metrics_failure = status

    def set_pods(self, n: int | None, size_bytes: int = 1000,
                 namespaces: tuple[str, ...] = ("default",)) -> None:
        """Serve `n` pods of about `size_bytes` each (JSON), spread over `namespaces`, in LISTs
        and watches; None restores the single demo pod."""
        pods = None if n is None else make_pods(n, size_bytes, tuple(namespaces))
        with self.cluster.lock:
            self.cluster.pods = pods
            self.cluster.pods_gen += 1
            self.cluster.list_cache = {}

    def set_watch(self, init_ms: float | None = None, bookmark: bool | None = None,
                  bookmark_every: float | None = None) -> None:
        """Watches opened from now on: initial events spread over `init_ms` (default 150);
        `bookmark=False` never sends the bookmark that ends them; a plain BOOKMARK every
        `bookmark_every` seconds (default 1) afterwards when the watch allows bookmarks."""
        with self.cluster.lock:
            if init_ms is not None:
                self.cluster.watch_init_ms = float(init_ms)
            if bookmark is not None:
                self.cluster.watch_bookmark = bool(bookmark)
            if bookmark_every is not None:
                self.cluster.bookmark_every = float(bookmark_every)

    def scrapes(self) -> list[tuple[float, int]]:
        """GET /metrics since the last reset: (time.monotonic() at arrival, status answered)."""
        with self.stats.lock:
            return list(self.stats.scrapes)

    def trailers(self) -> list[tuple[str, str, str]]:
        """Request trailer fields received since the last reset: (path, name, value)."""
        with self.stats.lock:
            return list(self.stats.trailers)

    def watches(self) -> list[dict]:
        """One record per watch opened since the last reset (copies): user, path, mode
        (initial-events | legacy | from-rv), and time.monotonic() of start, headers_sent,
        init_start, init_end, bookmark_sent (the annotated one), end (None while open); events
        sent, ended_by (peer | timeout | stopping | error)."""
        with self.stats.lock:
            return [dict(r) for r in self.stats.watches]

    def received(self, path_prefix: str = "") -> list[tuple[str, dict[str, list[str]]]]:
        """(path with query, {lower-cased header name: [values]}) of the requests received since
        the last reset whose path starts with `path_prefix` (at most 10 000 kept)."""
        with self.stats.lock:
            got = list(self.stats.received)
        out = []
        for path, headers in got:
            if path.startswith(path_prefix):
                h: dict[str, list[str]] = {}
                for k, v in headers:
                    h.setdefault(k.lower(), []).append(v)
                out.append((path, h))
        return out

    def __enter__(self) -> "Upstream":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    ap.add_argument("--port-file", help="write the bound port to this file once listening")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    up = Upstream(args.host, args.port, args.verbose)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(up.port))
        import os
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"upstream: listening on http://{up.host}:{up.port}", file=sys.stderr, flush=True)
    try:
        up.server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        up.server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
