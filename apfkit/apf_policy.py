"""Plugin-configuration builders for the e2e tests and the benchmarks.

Plugin configuration (JSON, the filter's contract): `serverConcurrencyLimit`, `requestTimeout`
(Go duration), `suggestedDefaults`, `policy` (list of flowcontrol.apiserver.k8s.io/v1 FlowSchema /
PriorityLevelConfiguration objects), `identity`, `enforce`, `debugGroups`, `explainGroups`.

Seat arithmetic (reference kubernetes-apf.md §7.2): NominalCL(i) = ceil(S · NCS(i) / Σ NCS), where
the sum runs over every level, including the mandatory `exempt` (NCS 0) and `catch-all` (NCS 5)
that always exist. With `suggestedDefaults: false` and one extra Limited level of shares NCS:
NominalCL = ceil(S · NCS / (NCS + 5)). `lendablePercent: 0` and `borrowingLimitPercent: 0` pin the
level's CurrentCL to exactly NominalCL.
"""

from __future__ import annotations

import math
import uuid

API_VERSION = "flowcontrol.apiserver.k8s.io/v1"
CATCH_ALL_NCS = 5
FRONT_PROXY = {"sources": [{"type": "frontProxy"}]}
E2E_GROUP = "e2e-users"

ALL_RESOURCES = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"],
                 "clusterScope": True}
ALL_NON_RESOURCES = {"verbs": ["*"], "nonResourceURLs": ["*"]}


def nominal_cl(server_limit: int, ncs: int, share_sum: int) -> int:
    """Go: int(math.Ceil(float64(serverCL) * float64(ncs) / float64(shareSum)))."""
    return int(math.ceil(float(server_limit) * float(ncs) / float(share_sum)))


def shares_for_seats(server_limit: int, seats: int, other_shares: int = CATCH_ALL_NCS,
                     max_shares: int = 100_000) -> int:
    """Smallest NCS ≥ 1 with ceil(S·NCS/(NCS+other)) == seats; ValueError if none exists."""
    for ncs in range(1, max_shares + 1):
        n = nominal_cl(server_limit, ncs, ncs + other_shares)
        if n == seats:
            return ncs
        if n > seats:
            break
    raise ValueError(f"no nominalConcurrencyShares gives {seats} seats with "
                     f"serverConcurrencyLimit {server_limit}")


def server_limit_for_seats(seats: int) -> int:
    """A serverConcurrencyLimit for which `shares_for_seats` has a solution (2·seats, NCS 5)."""
    return max(2, 2 * seats)


def uid(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"apf-e2e/{name}"))


def priority_level(name: str, ncs: int, *, queues: int = 16, hand_size: int = 4,
                   queue_length_limit: int = 50, reject: bool = False,
                   lendable_percent: int = 0, borrowing_limit_percent: int | None = 0) -> dict:
    if reject:
        limit_response: dict = {"type": "Reject"}
    else:
        limit_response = {"type": "Queue", "queuing": {
            "queues": queues, "handSize": hand_size, "queueLengthLimit": queue_length_limit}}
    limited: dict = {"nominalConcurrencyShares": ncs, "lendablePercent": lendable_percent,
                     "limitResponse": limit_response}
    if borrowing_limit_percent is not None:
        limited["borrowingLimitPercent"] = borrowing_limit_percent
    return {
        "apiVersion": API_VERSION,
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name, "uid": uid("pl/" + name)},
        "spec": {"type": "Limited", "limited": limited},
    }


def flow_schema(name: str, level: str, *, precedence: int = 1000, groups: list[str] | None = None,
                users: list[str] | None = None, distinguisher: str | None = "ByUser",
                resource_rules: list | None = None, non_resource_rules: list | None = None) -> dict:
    subjects = [{"kind": "Group", "group": {"name": g}} for g in (groups or [])]
    subjects += [{"kind": "User", "user": {"name": u}} for u in (users or [])]
    rule: dict = {"subjects": subjects,
                  "resourceRules": resource_rules if resource_rules is not None else [ALL_RESOURCES],
                  "nonResourceRules": (non_resource_rules if non_resource_rules is not None
                                       else [ALL_NON_RESOURCES])}
    spec: dict = {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence,
                  "rules": [rule]}
    if distinguisher:
        spec["distinguisherMethod"] = {"type": distinguisher}
    return {"apiVersion": API_VERSION, "kind": "FlowSchema",
            "metadata": {"name": name, "uid": uid("fs/" + name)}, "spec": spec}


def group_policy(level: str, group: str, *, level_uid: str, schema_uid: str) -> list[dict]:
    """A queuing level (10 shares, 8 queues, hand 2, 10 per queue) and a FlowSchema named after
    `group` sending that group's resource requests to it (precedence 500), with fixed UIDs."""
    pl = priority_level(level, 10, queues=8, hand_size=2, queue_length_limit=10,
                        borrowing_limit_percent=None)
    fs = flow_schema(group, level, precedence=500, groups=[group], non_resource_rules=[])
    pl["metadata"]["uid"], fs["metadata"]["uid"] = level_uid, schema_uid
    return [pl, fs]


def plugin_config(**kw) -> dict:
    """Base plugin config: front-proxy identity, enforcing, explain/debug for system:masters and
    the e2e explain group. Keyword arguments override/add keys."""
    cfg: dict = {
        "identity": FRONT_PROXY,
        "enforce": True,
        "debugGroups": ["system:masters"],
        "explainGroups": ["e2e-explain"],
    }
    cfg.update(kw)
    return cfg


def single_level_config(seats: int, *, level: str = "e2e-level", schema: str = "e2e-users",
                        group: str = E2E_GROUP, queues: int = 16, hand_size: int = 4,
                        queue_length_limit: int = 50, request_timeout: str = "60s",
                        server_limit: int | None = None, **kw) -> dict:
    """`suggestedDefaults: false` + one Limited level with exactly `seats` seats that every user
    in `group` is classified into (ByUser flows)."""
    s = server_limit if server_limit is not None else server_limit_for_seats(seats)
    ncs = shares_for_seats(s, seats)
    assert nominal_cl(s, ncs, ncs + CATCH_ALL_NCS) == seats
    return plugin_config(
        serverConcurrencyLimit=s,
        requestTimeout=request_timeout,
        suggestedDefaults=False,
        policy=[
            priority_level(level, ncs, queues=queues, hand_size=hand_size,
                           queue_length_limit=queue_length_limit),
            flow_schema(schema, level, groups=[group]),
        ],
        **kw,
    )


def pl_uid(name: str) -> str:
    return uid("pl/" + name)


def fs_uid(name: str) -> str:
    return uid("fs/" + name)
