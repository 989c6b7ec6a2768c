"""Fleet mode in real Envoys: three gateway processes (2 workers each) in front of one test
upstream, coordinated through a real etcd (Debian's etcd-server, started here on loopback with
TLS and authentication, set up as deploy/overlays/fleet's: apfkit/etcdproc.py).
The level's 20 seats are the limit of the whole fleet: without fleet mode each replica would
enforce all 20 (45 requests in flight with 15 closed-loop clients per replica).

Checked, with closed-loop clients against an upstream whose service time varies:
- equal load on all three: the upstream never has more than 20 of the level's requests in
  flight, and uses them (mean ≥ 70 %);
- two equal users on two replicas get throughput within 15 % of each other;
- all load on one replica: within 3 periods it uses ≥ 85 % of the fleet's seats; the load moved
  at once to another replica: the same there;
- every series of the dashboard's fleet row is exported;
- that replica killed (SIGKILL) while another takes the load: the seats serve the other within
  leaseTtl + 2 periods;
- etcd stopped under load: no request fails, the fleet limit still holds; etcd restarted: the
  replicas sync again and rebalance.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import threading
import time

import pytest

from apfkit import client
from apfkit.dashboard import FLEET_SERIES, dashboard_targets
from apfkit.envoyproc import EnvoyProcess, wait_until
from apfkit.fleet import LEASE_TTL, PERIOD, SEATS, Harness, InFlight, load

pytestmark = [pytest.mark.apf, pytest.mark.core]


@pytest.fixture
def fleet(wasm_module, envoy_bin):
    if shutil.which("etcd") is None:
        pytest.fail("etcd not installed (scripts/prereqs.sh e2e installs Debian's etcd-server)")
    h = Harness(wasm_module, envoy_bin)
    try:
        envoys = [h.replica() for _ in range(3)]
        wait_until(lambda: len(h.etcd.replicas()) == 3, timeout=20, what="three replica records in etcd")
        yield h.etcd, h.up, envoys
    finally:
        h.close()


def test_fleet_shares_one_limit_across_three_replicas(fleet):
    etcd, up, envoys = fleet
    ports = [e.ports["gateway"] for e in envoys]

    # Every replica's dump_fleet and stats see the three replicas.
    def sees_three(port: int, env: EnvoyProcess) -> bool:
        r = client.request(port, client.Req(path="/debug/api_priority_and_fairness/dump_fleet",
                                            user="admin", groups=("system:masters",)))
        dump = json.loads(r.body) if r.status == 200 else {}
        stats = env.stats("apf_wasm_fleet_replicas")
        return len(dump.get("replicas", [])) == 3 and dump.get("mode") == "Synced" and \
            any(v == 3 for v in stats.values())
    for port, env in zip(ports, envoys):
        wait_until(lambda: sees_three(port, env), timeout=10, what="dump_fleet and stats with 3 replicas")

    # Equal load: 15 closed-loop clients per replica (45 against 20 seats), measured once the
    # allocation has settled (the first replica to register starts with every seat and gives
    # them up as its requests finish).
    up.reset()
    res: list[client.Result] = []
    t = threading.Thread(target=lambda: res.extend(load(ports, 15, 13.0, "eq")))
    t.start()
    time.sleep(5.0)
    t_measure = time.monotonic()
    with InFlight(up) as s:
        time.sleep(7.0)
    t.join()
    assert not [r for r in res if r.status is None], "transport errors"
    served = [r for r in res if r.status == 200 and r.started >= t_measure]
    snap = up.snapshot()
    print(f"equal load: {len(served)} served, upstream max in flight {snap['max_in_flight']}, "
          f"mean {s.mean():.1f} of {SEATS}")
    assert snap["max_in_flight"] <= SEATS, f"the fleet used {snap['max_in_flight']} > {SEATS} seats"
    assert s.mean() >= 0.7 * SEATS, f"mean in flight {s.mean():.1f} < 70 % of {SEATS}"
    per_replica = [sum(1 for r in served if r.user.startswith(f"eq-{p}-")) for p in ports]
    print(f"served per replica: {per_replica} (20 seats split 7 / 7 / 6)")
    # Each replica exports its seats per level; under equal load they are about a third each.
    allocated = [sum(v for k, v in env.stats("apf_wasm_fleet_allocated_seats").items() if k.endswith(".e2e-level"))
                 for env in envoys]
    print(f"apf_wasm_fleet_allocated_seats: {allocated}")
    # Three processes' stats are read one after another, each flushed on its own tick: while a
    # seat moves between replicas they may show it twice. The sum is checked on one replica's
    # view of one snapshot (dump_fleet: every replica's allocation at one revision).
    assert min(allocated) >= 4 and max(allocated) <= SEATS, allocated
    r = client.request(ports[0], client.Req(path="/debug/api_priority_and_fairness/dump_fleet",
                                            user="admin", groups=("system:masters",)))
    one_view = [rep["levels"]["e2e-level"]["allocated"] for rep in json.loads(r.body)["replicas"]]
    print(f"dump_fleet allocation at revision {json.loads(r.body)['revision']}: {one_view}")
    assert len(one_view) == 3 and sum(one_view) <= SEATS and min(one_view) >= 4, one_view
    # Every series of the dashboard's fleet row is exported, the per-level one with its label.
    prom = envoys[0].stats_prometheus()
    wanted = {n for _, e in dashboard_targets(fleet=True) for n in FLEET_SERIES if n in e}
    assert wanted == FLEET_SERIES, wanted
    for name in FLEET_SERIES:
        assert re.search(rf"^{name}(\{{|\s)", prom, re.M), name
    assert re.search(r'^apf_wasm_fleet_allocated_seats\{priority_level="e2e-level"\} \d+', prom, re.M), \
        [ln for ln in prom.splitlines() if "allocated" in ln]

    # Two equal users on two replicas (the third idle) are served alike (within 15 %).
    up.reset()
    res = []
    t = threading.Thread(target=lambda: res.extend(load(ports[1:], 15, 10.0, "pair")))
    t.start()
    time.sleep(4.0)
    t_measure = time.monotonic()
    t.join()
    served = [r for r in res if r.status == 200 and r.started >= t_measure]
    pair = [sum(1 for r in served if r.user.startswith(f"pair-{p}-")) for p in ports[1:]]
    print(f"two equal users on two replicas: {pair} served")
    assert min(pair) >= 0.85 * max(pair), pair
    assert up.snapshot()["max_in_flight"] <= SEATS

    # All load on replica 0, from a fleet idle for two periods: within 3 periods it has ≥ 85 %
    # of the fleet's seats (mean over half a second), and keeps them.
    time.sleep(2 * PERIOD)
    up.reset()
    t0 = time.monotonic()
    with InFlight(up) as s:
        res = load(ports[:1], 30, 7.0, "one")
    reached = s.first_reaching(0.85 * SEATS)
    snap = up.snapshot()
    after = s.between(t0 + 3 * PERIOD)
    mean_after = sum(after) / max(1, len(after))
    print(f"load on one replica: ≥ 85 % of the seats after {reached - t0 if reached else None} s, "
          f"mean from 3 periods on {mean_after:.1f}, max {snap['max_in_flight']}")
    assert snap["max_in_flight"] <= SEATS
    assert reached is not None and reached - t0 <= 3 * PERIOD, f"85 % of the seats only at {reached and reached - t0}"
    assert mean_after >= 0.8 * SEATS, f"one loaded replica uses {mean_after:.1f} of {SEATS} seats"

    # The load moves to replica 1 at once: replica 1 has ≥ 85 % of the seats as fast (replica
    # 0's demand of the period before still counts for a period).
    up.reset()
    t0 = time.monotonic()
    with InFlight(up) as s:
        res = load(ports[1:2], 30, 6.0, "moved")
    reached = s.first_reaching(0.85 * SEATS)
    print(f"load moved to another replica: ≥ 85 % of the seats after {reached - t0 if reached else None} s, "
          f"max {up.snapshot()['max_in_flight']}")
    assert up.snapshot()["max_in_flight"] <= SEATS
    assert reached is not None and reached - t0 <= 3 * PERIOD, f"85 % of the seats only at {reached and reached - t0}"

    # Replica 1 loaded, replica 0 killed with load on it: its seats come to replica 1 within
    # leaseTtl + 2 periods.
    up.reset()
    result = []
    t1 = threading.Thread(target=lambda: result.extend(load(ports[1:2], 30, 14.0, "two")))
    t0 = threading.Thread(target=lambda: load(ports[:1], 15, 3.0, "dying"))
    t1.start()
    t0.start()
    time.sleep(1.5)
    envoys[0].proc.send_signal(signal.SIGKILL)
    envoys[0].proc.wait(timeout=10)
    t0.join()
    time.sleep(LEASE_TTL + 2 * PERIOD)
    with InFlight(up) as s:
        time.sleep(3.0)
    t1.join()
    print(f"after SIGKILL of a loaded replica: the survivor's mean in flight {s.mean():.1f}")
    assert up.snapshot()["max_in_flight"] <= SEATS
    assert s.mean() >= 0.85 * SEATS, f"the survivor uses {s.mean():.1f} of {SEATS} seats"
    wait_until(lambda: len(etcd.replicas()) == 2, timeout=LEASE_TTL + 2, what="the dead replica's record gone")

    # etcd stopped under load: nothing fails, the limit holds.
    up.reset()
    result = []
    t = threading.Thread(target=lambda: result.extend(load(ports[1:], 15, 8.0, "noetcd")))
    t.start()
    time.sleep(1.0)
    etcd.stop()
    t.join()
    failed = [r for r in result if r.status != 200]
    print(f"etcd stopped: {len(result)} requests, {len(failed)} not 200, "
          f"max in flight {up.snapshot()['max_in_flight']}")
    assert not failed, f"{len(failed)} requests failed with etcd down: {failed[:3]}"
    assert up.snapshot()["max_in_flight"] <= SEATS

    # etcd restarted (its data kept, so the records are back and their leases renewed): the
    # replicas sync again and rebalance: all load on replica 1 gets ≥ 85 % of the seats.
    etcd.start()
    t_back = time.monotonic()

    def synced(port: int) -> bool:
        r = client.request(port, client.Req(path="/debug/api_priority_and_fairness/dump_fleet",
                                            user="admin", groups=("system:masters",)))
        return r.status == 200 and json.loads(r.body).get("mode") == "Synced"
    for port in ports[1:]:
        wait_until(lambda: synced(port), timeout=LEASE_TTL + 2 * PERIOD, what="synced again after etcd's restart")
    print(f"etcd restarted: both replicas synced after {time.monotonic() - t_back:.1f} s")
    up.reset()
    t0 = time.monotonic()
    with InFlight(up) as s:
        load(ports[1:2], 30, 6.0, "back")
    reached = s.first_reaching(0.85 * SEATS)
    print(f"after etcd's restart, load on one replica: ≥ 85 % of the seats after "
          f"{reached - t0 if reached else None} s, max {up.snapshot()['max_in_flight']}")
    assert up.snapshot()["max_in_flight"] <= SEATS
    assert reached is not None and reached - t0 <= 3 * PERIOD, f"85 % of the seats only at {reached and reached - t0}"
