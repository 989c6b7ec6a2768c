"""Operations — hot reload under load through ECDS: the filter's configuration comes from a
watched file (`config_discovery` + `path_config_source.watched_directory`); while clients run, a
new policy is renamed into place (a level's shares change, a FlowSchema for a new group appears).
New requests follow it, nothing is lost or fails, the state drains to zero afterwards, and an
invalid update is refused without disturbing the running configuration."""

from __future__ import annotations

import threading
import time

import pytest

from apfkit import client
from apfkit.apf_policy import (E2E_GROUP, flow_schema, fs_uid, nominal_cl, pl_uid, plugin_config,
                        priority_level)
from apfkit.envoyproc import wait_until
from apfkit.observe import ecds_stat, level_rows, parse_prometheus, prom_sum

pytestmark = [pytest.mark.apf, pytest.mark.core]

PODS = "/api/v1/namespaces/default/pods"
LEVEL = "e2e-level"
NEW_GROUP = "e2e-new-group"
SERVER = 8
NOMINAL = "apiserver_flowcontrol_nominal_limit_seats"


def config(ncs: int, with_new_schema: bool) -> dict:
    policy = [priority_level(LEVEL, ncs, queues=8, hand_size=2, queue_length_limit=50),
              flow_schema("e2e-users", LEVEL, precedence=1000, groups=[E2E_GROUP])]
    if with_new_schema:
        policy.append(flow_schema("e2e-new", LEVEL, precedence=500, groups=[NEW_GROUP]))
    return plugin_config(serverConcurrencyLimit=SERVER, suggestedDefaults=False, policy=policy)


OLD_NCS, NEW_NCS = 5, 15
OLD_SEATS = nominal_cl(SERVER, OLD_NCS, OLD_NCS + 5)  # 4
NEW_SEATS = nominal_cl(SERVER, NEW_NCS, NEW_NCS + 5)  # 6


def _nominal(gw) -> float:
    return prom_sum(parse_prometheus(gw.stats_prometheus()), NOMINAL, priority_level=LEVEL)


def test_ops_ecds_hot_reload_under_load(gateway):
    assert (OLD_SEATS, NEW_SEATS) == (4, 6)
    gw = gateway(config(OLD_NCS, False), ecds=True, stats_config=True)
    wait_until(lambda: _nominal(gw) == OLD_SEATS, timeout=5, what=f"nominal seats {OLD_SEATS}")

    # 4 "old" users stay on e2e-users; 4 users also in the new group move to e2e-new.
    movers = [f"b{i}" for i in range(4)]
    conns = {**{f"a{i}": 1 for i in range(4)}, **{u: 1 for u in movers}}
    groups_of = {**{f"a{i}": (E2E_GROUP,) for i in range(4)},
                 **{u: (E2E_GROUP, NEW_GROUP) for u in movers}}
    out: list = []
    t = threading.Thread(target=lambda: out.extend(gw.closed_loop(
        conns, 5.0, path=f"{PODS}?sleep=0.1", groups_of=groups_of, timeout=15)), daemon=True)
    t0 = time.monotonic()
    t.start()
    try:
        # Saturated before the reload: 8 clients on 4 seats, requests are queued.
        wait_until(lambda: int(level_rows(gw)[LEVEL]["WaitingRequests"]) > 0, timeout=3,
                   what="queued requests before the reload")
        before = ecds_stat(gw, "config_reload")
        pushed_at = time.monotonic()
        gw.write_ecds(config(NEW_NCS, True))
        wait_until(lambda: ecds_stat(gw, "config_reload") > before, timeout=5,
                   what="ECDS config_reload")
        reloaded_at = time.monotonic()
        wait_until(lambda: _nominal(gw) == NEW_SEATS, timeout=5, what=f"nominal seats {NEW_SEATS}")
    finally:
        t.join(timeout=30)
    assert reloaded_at - t0 < 4.0, "the reload must land while the clients still run"

    bad = [r for r in out if r.status != 200]
    assert not bad, gw.fail_msg(f"{len(bad)} of {len(out)} not 200: {bad[:5]} "
                                f"{client.status_counts(out)}")
    for r in out:
        assert r.h("x-kubernetes-pf-prioritylevel-uid") == pl_uid(LEVEL), r.headers
    old_fs, new_fs = fs_uid("e2e-users"), fs_uid("e2e-new")
    for r in out:
        fs = r.h("x-kubernetes-pf-flowschema-uid")
        if r.user not in movers or r.started < pushed_at:
            assert fs == old_fs, (r, fs, r.started - pushed_at)
        elif r.started > reloaded_at + 0.5:
            # Every worker has the new configuration by now: new requests follow it.
            assert fs == new_fs, (r, fs, r.started - reloaded_at)
        else:
            assert fs in (old_fs, new_fs), (r, fs)
    late = [r for r in out if r.user in movers and r.started > reloaded_at + 0.5]
    assert len(late) >= 4, f"too few requests after the reload ({len(late)})"

    # Drained: every level shows 0 waiting / 0 executing.
    def drained():
        rows = level_rows(gw)
        drained.last = rows
        return all(r["WaitingRequests"] == "0" and r["ExecutingRequests"] == "0"
                   for r in rows.values())

    drained.last = None
    try:
        wait_until(drained, timeout=5, what="all levels drained")
    except TimeoutError:
        raise AssertionError(gw.fail_msg(f"not drained: {drained.last}"))

    # An invalid update is refused: the running configuration stays, the filter keeps serving.
    fails = ecds_stat(gw, "config_fail")
    successes = ecds_stat(gw, "update_success")
    rejected = ecds_stat(gw, "update_rejected")
    bad_cfg = config(NEW_NCS, True)
    bad_cfg["policy"][0]["spec"]["limited"]["nominalConcurrencyShares"] = -3
    bad_cfg["bogusKey"] = True
    gw.write_ecds(bad_cfg)
    wait_until(lambda: ecds_stat(gw, "config_fail") > fails, timeout=5, what="ECDS config_fail")
    # (config_reload counts this attempt too; update_success / update_rejected tell them apart.)
    assert ecds_stat(gw, "update_success") == successes
    assert ecds_stat(gw, "update_rejected") == rejected + 1
    # (Envoy's own "Filesystem config update rejected" warning is only flushed to the log file
    # every 10 s; update_rejected above says the same.)
    for line in ("apf: invalid configuration", 'unknown configuration key "bogusKey"'):
        wait_until(lambda: line in gw.log_tail(400), timeout=5,
                   what=f"{line!r} in the Envoy log")
    # Fresh connections (both workers) all still run the previous valid configuration.
    workers_before = gw.worker_connections()
    res = gw.concurrent(24, 12, movers, path=PODS, groups=(E2E_GROUP, NEW_GROUP), timeout=10)
    assert client.status_counts(res) == {200: 24}, gw.fail_msg(str(client.status_counts(res)))
    workers_after = gw.worker_connections()
    assert all(workers_after.get(w, 0) > n for w, n in workers_before.items()) \
        and len(workers_after) == 2, (workers_before, workers_after)
    for r in res:
        assert r.h("x-kubernetes-pf-flowschema-uid") == new_fs, r.headers
    assert _nominal(gw) == NEW_SEATS
