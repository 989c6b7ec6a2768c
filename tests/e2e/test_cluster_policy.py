"""Policy from the cluster: the gateway reads FlowSchemas and priority levels
from the protected apiserver through an Envoy cluster, with a bearer token, and enforces them
like a reload; an invalid cluster policy changes nothing."""

from __future__ import annotations

import pytest

from envoyproc import wait_until

pytestmark = pytest.mark.apf

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
