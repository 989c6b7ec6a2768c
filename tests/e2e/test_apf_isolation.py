"""(c) Isolation: with a workload level saturated, exempt (`system:masters`) and leader-election
requests are not delayed (default/suggested policy)."""

from __future__ import annotations

import threading

import pytest

from apfkit.apf_policy import plugin_config
from apfkit.contract import assert_all_200_or_429, assert_classified, PL_UID
from apfkit.envoyproc import wait_until

pytestmark = pytest.mark.apf

# serverConcurrencyLimit 10 with the suggested levels (share sum 245): global-default has
# ceil(10*20/245) = 1 nominal seat; leader-election ceil(10*10/245) = 1 seat, not lendable.
CONFIG = plugin_config(serverConcurrencyLimit=10, requestTimeout="8s", suggestedDefaults=True)
HEAVY_CONNS = 16


def test_exempt_and_leader_election_unaffected_by_saturated_level(gateway):
    gw = gateway(CONFIG)
    heavy_out: list = []

    def heavy():
        heavy_out.extend(gw.concurrent(HEAVY_CONNS, HEAVY_CONNS, ["alice"],
                                       path="/api/v1/namespaces/default/pods?sleep=1",
                                       groups=("system:authenticated", "e2e-explain"), timeout=20))

    t = threading.Thread(target=heavy, daemon=True)
    t.start()
    try:
        wait_until(lambda: gw.upstream.snapshot()["user_in_flight"].get("alice", 0) >= 1,
                   timeout=5, what="alice's requests reach the upstream")
        exempt = gw.request("/api/v1/namespaces/default/pods", user="admin",
                            groups=("system:masters", "e2e-explain"), timeout=10)
        lease = gw.request("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x",
                           method="PUT", user="system:kube-scheduler",
                           groups=("system:authenticated", "e2e-explain"), timeout=10,
                           body=b"{}")
        in_flight_alice = gw.upstream.snapshot()["user_in_flight"].get("alice", 0)
    finally:
        t.join(timeout=30)
    assert not t.is_alive()
    assert in_flight_alice < HEAVY_CONNS, f"level not saturated: {in_flight_alice} in flight"
    assert exempt.status == 200 and exempt.elapsed < 0.5, gw.fail_msg(repr(exempt))
    assert lease.status == 200 and lease.elapsed < 0.5, gw.fail_msg(repr(lease))
    assert_classified(exempt)
    assert_classified(lease)
    assert_all_200_or_429(heavy_out)
    # Explain headers (caller in explainGroups) name the matched objects.
    assert {r.h("x-apf-prioritylevel") for r in heavy_out} == {"global-default"}
    assert {r.h("x-apf-flowschema") for r in heavy_out} == {"global-default"}
    assert exempt.h("x-apf-prioritylevel") == "exempt", exempt.headers
    assert lease.h("x-apf-prioritylevel") == "leader-election", lease.headers
    assert lease.h("x-apf-flowschema") == "system-leader-election", lease.headers
    heavy_pls = {r.h(PL_UID) for r in heavy_out}
    assert len(heavy_pls) == 1, heavy_pls
    if exempt.h(PL_UID) and lease.h(PL_UID):
        assert exempt.h(PL_UID) not in heavy_pls and lease.h(PL_UID) not in heavy_pls
        assert exempt.h(PL_UID) != lease.h(PL_UID)
    # Saturation is real: some of alice's requests waited (or were rejected).
    assert any(r.status == 429 or r.elapsed > 1.2 for r in heavy_out), heavy_out
