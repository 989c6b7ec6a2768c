"""Policy from the cluster: the gateway reads FlowSchemas and priority levels
from the protected apiserver through an Envoy cluster, with a bearer token, and enforces them
like a reload; an invalid cluster policy changes nothing; a policy read again with only what a
live apiserver changes on every read (resourceVersion, managedFields, status, order) is not
applied again, a changed spec is.

The test upstream lists the objects as a live kube-apiserver does (apfkit/upstream.py,
"Flowcontrol"): every read differs from the one before outside the objects' specs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from apfkit.envoyproc import wait_until
from apfkit.observe import APPLIED

pytestmark = [pytest.mark.apf, pytest.mark.core]

FC = "flowcontrol.apiserver.k8s.io/v1"
PL = {"apiVersion": FC, "kind": "PriorityLevelConfiguration",
      "metadata": {"name": "cluster-level", "uid": "pl-from-cluster"},
      "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 10,
               "limitResponse": {"type": "Queue", "queuing": {"queues": 8, "handSize": 2, "queueLengthLimit": 10}}}}}


def flow_schema(precedence: int, uid: str = "fs-from-cluster") -> dict:
    return {"apiVersion": FC, "kind": "FlowSchema",
            "metadata": {"name": "from-cluster", "uid": uid},
            "spec": {"priorityLevelConfiguration": {"name": "cluster-level"}, "matchingPrecedence": precedence,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [{"kind": "Group", "group": {"name": "cluster-team"}}],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                   "clusterScope": True, "namespaces": ["*"]}]}]}}


def fs_uid(gw) -> str:
    r = gw.request(user="carol", groups=("cluster-team",))
    assert r.status == 200, r
    return r.headers.get("x-kubernetes-pf-flowschema-uid", "")


def test_policy_is_read_from_the_cluster(gateway):
    gw = gateway({"identity": {"sources": [{"type": "frontProxy"}]},
                  "clusterPolicy": {"cluster": "apiserver", "period": "1s", "token": "s3cret",
                                    "authority": "kubernetes.default.svc"}})
    before = fs_uid(gw)
    assert before != "fs-from-cluster"
    gw.upstream.set_flowcontrol([flow_schema(500)], [PL])
    def applied() -> bool:
        # Each worker reads the policy itself: require it on several fresh connections in a row.
        for _ in range(8):
            r = gw.request(user="carol", groups=("cluster-team",))
            if (r.headers.get("x-kubernetes-pf-flowschema-uid"), r.headers.get("x-kubernetes-pf-prioritylevel-uid")) != ("fs-from-cluster", "pl-from-cluster"):
                return False
        return True

    wait_until(applied, timeout=15, what="the cluster's FlowSchema and level apply on every worker")
    # The requests above may all have reached one worker: let every reader (Wasm: each worker's
    # VM and the main thread's; native: the main thread's, whose policy every worker adopts; each
    # polling every second) read the valid policy before it changes.
    n = len(gw.upstream.received("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"))
    wait_until(lambda: len(gw.upstream.received("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")) >= n + 9,
               timeout=15, what="three more seconds of reads of the valid policy")
    reads = gw.upstream.received("/apis/flowcontrol.apiserver.k8s.io/v1/")
    assert reads and all(h.get("authorization") == ["Bearer s3cret"] for _, h in reads), reads[:2]
    # An invalid cluster policy (precedence above 10000; 0 would be defaulted to 1000, as
    # upstream does) is refused: the previous one keeps serving (applied, its UID would show).
    gw.upstream.set_flowcontrol([flow_schema(10001, uid="fs-invalid")], [PL])
    n = len(gw.upstream.received("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"))
    wait_until(lambda: len(gw.upstream.received("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")) >= n + 4,
               timeout=15, what="the gateway re-reads the invalid policy")
    assert fs_uid(gw) == "fs-from-cluster"
    assert gw.request(user="admin", groups=("system:masters",), path="/healthz").status == 200


GROUP = "/apis/flowcontrol.apiserver.k8s.io"


def objects_at(version: str) -> tuple[dict, dict]:
    """The FlowSchema and level as `version` of the group writes them (UIDs name the version, so
    the policy in force shows which version's read applied)."""
    fs = flow_schema(500, uid=f"fs-{version}")
    pl = json.loads(json.dumps(PL))
    pl["metadata"]["uid"] = f"pl-{version}"
    for o in (fs, pl):
        o["apiVersion"] = f"flowcontrol.apiserver.k8s.io/{version}"
    if version in ("v1beta2", "v1beta1"):
        # flowcontrol/v1beta2/types.go: the shares are `assuredConcurrencyShares`.
        limited = pl["spec"]["limited"]
        limited["assuredConcurrencyShares"] = limited.pop("nominalConcurrencyShares")
    return fs, pl


def test_policy_follows_the_served_version(gateway):
    """Without pathPrefix the gateway discovers the served flowcontrol version: a cluster serving
    only v1beta2 (1.23-1.25), then only v1beta3, then only v1 (an upgrade) is followed with no
    configuration change."""
    gw = gateway({"identity": {"sources": [{"type": "frontProxy"}]},
                  "clusterPolicy": {"cluster": "apiserver", "period": "1s", "token": "s3cret",
                                    "authority": "kubernetes.default.svc"}})
    for version in ("v1beta2", "v1beta3", "v1"):
        gw.upstream.reset()
        fs, pl = objects_at(version)
        gw.upstream.set_flowcontrol([fs], [pl])
        gw.upstream.set_flowcontrol_versions([version])

        def applied() -> bool:
            for _ in range(8):  # each worker reads the policy itself: several fresh connections
                r = gw.request(user="carol", groups=("cluster-team",))
                uids = (r.headers.get("x-kubernetes-pf-flowschema-uid"), r.headers.get("x-kubernetes-pf-prioritylevel-uid"))
                if uids != (f"fs-{version}", f"pl-{version}"):
                    return False
            return True

        wait_until(applied, timeout=20, what=f"the policy served at {version} applies on every worker")
        paths = [p for p, _ in gw.upstream.received(GROUP)]
        assert GROUP in paths, f"the discovery document was read again: {paths[:8]}"
        assert f"{GROUP}/{version}/flowschemas" in paths, paths[:8]
        assert f"{GROUP}/{version}/prioritylevelconfigurations" in paths, paths[:8]
    # Reads settle on v1: nothing else is asked for once discovery named it.
    gw.upstream.reset()
    n = len(gw.upstream.received(f"{GROUP}/v1/flowschemas"))
    wait_until(lambda: len(gw.upstream.received(f"{GROUP}/v1/flowschemas")) >= n + 4, timeout=15, what="more v1 reads")
    others = [p for p, _ in gw.upstream.received(GROUP) if p != GROUP and not p.startswith(f"{GROUP}/v1/")]
    assert not others, others[:5]
    # The log names the version each policy came from (Envoy flushes its log file every 10 s).
    logged = lambda: all(f"cluster policy from {GROUP}/{v} generation" in gw.envoy.log_path.read_text(errors="replace")
                         for v in ("v1beta2", "v1beta3", "v1"))
    wait_until(logged, timeout=20, what="the log names each version the policy came from")


# "apf: cluster policy from <prefix> generation G applied: L priority levels, S flow schemas, ..."
# as Envoy logs it: [time][thread id][level][wasm] ...
def applied_lines(gw) -> list[tuple[str, int]]:
    """(thread id, flow schemas) of each "cluster policy ... applied" line in Envoy's log."""
    text = gw.envoy.log_path.read_text(errors="replace")
    return [(m.group(1), int(m.group(2))) for m in map(APPLIED.match, text.splitlines()) if m]


def second_schema() -> dict:
    fs = flow_schema(400, uid="fs-second")
    fs["metadata"]["name"] = "second-from-cluster"
    fs["spec"]["rules"][0]["subjects"] = [{"kind": "Group", "group": {"name": "second-team"}}]
    return fs


def test_unchanged_policy_is_applied_once(gateway):
    """Read N times with only volatile changes, the cluster's policy is applied once by each VM
    that reads it (native: the main thread's root, whose policy the workers adopt; a
    re-application would log again, recompile the policy and re-plan the fleet); a changed spec
    (one more FlowSchema) is applied. Envoy writes its log file every 10 s: the lines of the
    first policy are all in the file once those of the second are."""
    polls = 5
    gw = gateway({"identity": {"sources": [{"type": "frontProxy"}]},
                  "clusterPolicy": {"cluster": "apiserver", "period": "1s", "token": "s3cret"}})
    schemas = lambda: {n for _, n in applied_lines(gw)}  # noqa: E731
    gw.upstream.set_flowcontrol([flow_schema(500)], [PL])
    wait_until(lambda: fs_uid(gw) == "fs-from-cluster", timeout=15, what="the cluster's policy applies")
    wait_until(lambda: schemas(), timeout=20, what="the applied lines in Envoy's log")
    first = max(schemas())
    readers = {t for t, n in applied_lines(gw) if n == first}
    lists = gw.upstream.flowcontrol_lists()
    wait_until(lambda: gw.upstream.flowcontrol_lists() >= lists + 2 * polls * len(readers),
               timeout=3 * polls + 10, what=f"{polls} more reads by each of the {len(readers)} readers")
    # A real change: one more FlowSchema.
    gw.upstream.set_flowcontrol([flow_schema(500), second_schema()], [PL])
    r = wait_until(lambda: (lambda r: r if r.headers.get("x-kubernetes-pf-flowschema-uid") == "fs-second" else None)(
        gw.request(user="dave", groups=("second-team",))), timeout=15, what="the changed policy applies")
    assert r.status == 200, r
    wait_until(lambda: {t for t, n in applied_lines(gw) if n == first + 1} >= readers, timeout=25,
               what="every reader's applied line of the changed policy in Envoy's log")
    lines = applied_lines(gw)
    before = Counter(t for t, n in lines[:next(i for i, (_, n) in enumerate(lines) if n == first + 1)] if n == first)
    reads = gw.upstream.flowcontrol_lists()
    print(f"cluster policy: {reads} list reads, applied per reader thread before the change: {dict(before)}, "
          f"after: {dict(Counter(t for t, n in lines if n == first + 1))}")
    assert set(before) == readers and all(v == 1 for v in before.values()), \
        f"an unchanged policy was applied again: {dict(before)} applications per thread over {polls}+ reads each"
