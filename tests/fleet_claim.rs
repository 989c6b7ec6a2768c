//! The claim protocol's state machine driven call by call against the in-memory etcd model:
//! the calls it makes, the lease deadline, a lease that is gone, writes whose answers are lost,
//! a record inherited from an earlier run, and the bound of seats in use across generations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use apf_wasm::base64;
use apf_wasm::etcd::{self, CompareResult, CompareTarget, RequestOp, TxnRequest};
use apf_wasm::fleet::config::{Credentials, FleetConfig};
use apf_wasm::fleet::record::Record;
use apf_wasm::fleet::{EtcdCall, Fleet, FleetMode};
use apf_wasm::limits::borrowing::SeatDemandStats;
use apf_wasm::simulate::memetcd::MemEtcd;
use fleet_sim::{test_policy, S};
use serde_json::Value;

const T0: i64 = 1_000 * S;
const HIGH: usize = 1;

fn config() -> FleetConfig {
    fleet_sim::config_with_cluster("etcd")
}

fn demand(levels: &[f64]) -> Vec<SeatDemandStats> {
    levels.iter().map(|&d| SeatDemandStats { avg: d, std_dev: 0.0, high_watermark: d as i64, smoothed: d }).collect()
}

/// Sends `calls` to etcd and their answers back, and so on until no call is left.
fn exchange(f: &mut Fleet, m: &mut MemEtcd, mut calls: Vec<EtcdCall>, now: i64) {
    while let Some(c) = calls.pop() {
        let (status, body) = m.handle(c.path, &c.headers, &c.body, now);
        calls.extend(f.on_response(c.id, status, &body, now));
    }
}

/// A replica that has registered: ticked and answered until synced.
fn synced(id: &str, m: &mut MemEtcd, d: &[f64], now: i64) -> Fleet {
    let mut f = Fleet::new(config(), test_policy(), id).unwrap();
    f.set_local_demand(&demand(d));
    let calls = f.tick(now);
    exchange(&mut f, m, calls, now);
    assert_eq!(f.mode(), FleetMode::Synced);
    f
}

/// One period: tick and answer everything.
fn period(f: &mut Fleet, m: &mut MemEtcd, now: i64) {
    let calls = f.tick(now);
    exchange(f, m, calls, now);
}

fn report(f: &mut Fleet, in_use: &[u32]) {
    let g = f.generation();
    f.set_seats_in_use(in_use, g);
}

fn json(c: &EtcdCall) -> Value {
    serde_json::from_slice(&c.body).unwrap()
}

#[test]
fn first_calls_and_registration() {
    let mut m = MemEtcd::new();
    let mut f = Fleet::new(config(), test_policy(), "gw-a").unwrap();
    assert!(Fleet::new(config(), test_policy(), "a/b").is_err());
    assert_eq!(f.mode(), FleetMode::Joining);
    assert_eq!(f.limits(), &[None, Some(0), Some(0), Some(0)], "nothing before the first claim");
    let calls = f.tick(T0);
    let paths: Vec<&str> = calls.iter().map(|c| c.path).collect();
    assert_eq!(paths, vec![etcd::LEASE_GRANT, etcd::KV_RANGE]);
    assert_eq!(json(&calls[0]), serde_json::json!({"TTL": "5"}));
    let prefix = b"/apf-wasm/default/replicas/";
    assert_eq!(
        json(&calls[1]),
        serde_json::json!({"key": base64::encode(prefix), "range_end": base64::encode(b"/apf-wasm/default/replicas0")})
    );
    assert_eq!(calls[0].headers, vec![("content-type", "application/json".to_string())]);
    // Nothing more until the answers come (one call of each kind at a time).
    assert!(f.tick(T0 + 2 * S).is_empty());
    // The range answer, then the grant's: the registration follows at once.
    let (s, b) = m.handle(calls[1].path, &[], &calls[1].body, T0);
    assert!(f.on_response(calls[1].id, s, &b, T0).is_empty(), "no write without a lease");
    let (s, b) = m.handle(calls[0].path, &[], &calls[0].body, T0);
    let reg = f.on_response(calls[0].id, s, &b, T0);
    assert_eq!(reg.len(), 1);
    let txn = TxnRequest::from_body(&reg[0].body).unwrap();
    let c = &txn.compare[0];
    assert_eq!(
        (c.key.as_slice(), c.range_end.as_slice(), c.result),
        (&prefix[..], &b"/apf-wasm/default/replicas0"[..], CompareResult::Less)
    );
    assert_eq!(c.target, CompareTarget::Mod(m.revision() + 1), "nothing under the prefix changed since the revision read");
    let RequestOp::Put(put) = &txn.success[0] else { panic!() };
    assert_eq!(put.key, b"/apf-wasm/default/replicas/gw-a");
    assert_eq!(put.lease, f.lease().unwrap());
    assert!(matches!(txn.success[1], RequestOp::Range(_)) && matches!(txn.failure[..], [RequestOp::Range(_)]));
    exchange(&mut f, &mut m, reg, T0);
    assert_eq!(f.mode(), FleetMode::Synced);
    // Alone, with no demand: the whole idle allocation.
    let alloc = f.allocation().unwrap().clone();
    let want: Vec<Option<u32>> = alloc.levels.iter().map(|l| (!l.exempt).then_some(l.current)).collect();
    assert_eq!(f.limits(), want.as_slice());
    let record = Record::decode(&m.get(&put.key).unwrap().value).unwrap();
    assert_eq!(record.claim("high"), alloc.levels[HIGH].current);
    assert_eq!(record.granted("high"), alloc.levels[HIGH].current);
    assert_eq!(record.server_concurrency_limit, 60);
}

#[test]
fn authentication_comes_first_and_the_token_goes_raw() {
    let mut m = MemEtcd::with_auth(&[("apf", "pw")], 100 * S);
    let mut cfg = config();
    cfg.etcd.credentials = Some(Credentials { username: "apf".into(), password: "pw".into() });
    let mut f = Fleet::new(cfg, test_policy(), "gw-a").unwrap();
    let calls = f.tick(T0);
    assert_eq!(calls.iter().map(|c| c.path).collect::<Vec<_>>(), vec![etcd::AUTHENTICATE]);
    assert_eq!(json(&calls[0]), serde_json::json!({"name": "apf", "password": "pw"}));
    let (s, b) = m.handle(calls[0].path, &[], &calls[0].body, T0);
    let next = f.on_response(calls[0].id, s, &b, T0);
    assert!(next.iter().all(|c| c.headers.iter().any(|(k, v)| *k == "authorization" && !v.starts_with("Bearer"))));
    let token = next[0].headers.iter().find(|(k, _)| *k == "authorization").unwrap().1.clone();
    exchange(&mut f, &mut m, next, T0);
    period(&mut f, &mut m, T0 + S);
    assert_eq!(f.mode(), FleetMode::Synced);
    let printed = format!("{f:?}");
    assert!(!printed.contains(&token) && !printed.contains("\"pw\""), "no secret in Debug output");
    // An invalid token (etcd restarted: simple tokens are gone) → authenticate again.
    m.restart(T0 + 2 * S);
    period(&mut f, &mut m, T0 + 2 * S);
    let calls = f.tick(T0 + 3 * S);
    assert_eq!(calls.iter().map(|c| c.path).collect::<Vec<_>>(), vec![etcd::AUTHENTICATE]);
    exchange(&mut f, &mut m, calls, T0 + 3 * S);
    period(&mut f, &mut m, T0 + 4 * S);
    assert_eq!(f.mode(), FleetMode::Synced);
}

#[test]
fn the_lease_is_trusted_until_k_plus_ttl_minus_period() {
    let mut m = MemEtcd::new();
    let mut f = synced("gw-a", &mut m, &[0.0, 5.0, 5.0, 1.0], T0);
    // Keepalives at T0+1s and T0+2s succeed (k = T0+2s); then etcd stops answering.
    period(&mut f, &mut m, T0 + S);
    period(&mut f, &mut m, T0 + 2 * S);
    assert_eq!(f.lease_deadline(), Some(T0 + 2 * S + 5 * S - S));
    let claims = f.claims().unwrap().to_vec();
    let before = f.limits().to_vec();
    assert_eq!(f.next_tick(T0 + 2 * S), T0 + 3 * S);
    assert_eq!(f.next_tick(T0 + 5 * S + S / 2), T0 + 6 * S, "the deadline is a tick");
    let mut t = T0 + 3 * S;
    while t < T0 + 6 * S {
        for c in f.tick(t) {
            f.on_response(c.id, 0, b"", t);
        }
        assert_eq!(f.mode(), FleetMode::Synced, "t = T0 + {} ms", (t - T0) / 1_000_000);
        assert_eq!(f.limits(), before.as_slice(), "the last allocation is kept");
        t += S / 10;
    }
    let calls = f.tick(T0 + 6 * S);
    assert_eq!(f.mode(), FleetMode::Fallback);
    let shares = f.static_shares();
    for (i, l) in f.limits().iter().enumerate() {
        if let Some(l) = l {
            assert_eq!(*l, shares[i].min(claims[i]));
        }
    }
    // etcd answers this period's keepalive (before T0+7s, when the lease would expire): alive.
    exchange(&mut f, &mut m, calls, T0 + 6 * S);
    assert_eq!(f.mode(), FleetMode::Synced);
    assert_eq!(f.lease_deadline(), Some(T0 + 10 * S));
    // Unanswered again until after the lease expired (T0+11s by etcd's clock): etcd says it is
    // gone, and the replica registers again at once.
    let mut t = T0 + 7 * S;
    while t < T0 + 12 * S {
        for c in f.tick(t) {
            f.on_response(c.id, 0, b"", t);
        }
        t += S / 10;
    }
    assert_eq!(f.mode(), FleetMode::Fallback);
    let lease = f.lease();
    period(&mut f, &mut m, T0 + 12 * S);
    assert_eq!(f.mode(), FleetMode::Synced);
    assert_ne!(f.lease(), lease);
}

#[test]
fn a_keepalive_without_ttl_means_the_lease_is_gone() {
    let mut m = MemEtcd::new();
    let mut f = synced("gw-a", &mut m, &[0.0, 5.0, 5.0, 1.0], T0);
    // The lease is revoked behind the replica's back (as if it had expired).
    let (s, _) = m.handle(etcd::LEASE_REVOKE, &[], &etcd::lease_id_request(f.lease().unwrap()), T0);
    assert_eq!(s, 200);
    let calls = f.tick(T0 + S);
    let keepalive = calls.iter().find(|c| c.path == etcd::LEASE_KEEPALIVE).unwrap().clone();
    let (s, b) = m.handle(keepalive.path, &[], &keepalive.body, T0 + S);
    assert!(!String::from_utf8_lossy(&b).contains("TTL"));
    let next = f.on_response(keepalive.id, s, &b, T0 + S);
    assert_eq!(next.iter().map(|c| c.path).collect::<Vec<_>>(), vec![etcd::LEASE_GRANT], "a new lease at once");
    assert_eq!(f.mode(), FleetMode::Joining);
    assert!(f.limits().iter().flatten().all(|&l| l == 0), "no seats until registered again");
    exchange(&mut f, &mut m, next, T0 + S);
    for c in calls.into_iter().filter(|c| c.path != etcd::LEASE_KEEPALIVE) {
        exchange(&mut f, &mut m, vec![c], T0 + S);
    }
    period(&mut f, &mut m, T0 + 2 * S);
    assert_eq!(f.mode(), FleetMode::Synced);
    assert!(f.limits()[HIGH].unwrap() > 0);
}

/// A lowering write whose answer is lost may still apply: the limit stays under it even when
/// the allocation rises again, until the record is seen past it; delivered late, it fails.
#[test]
fn a_write_with_a_lost_answer_counts_as_possibly_applied() {
    let mut m = MemEtcd::new();
    let mut a = synced("gw-a", &mut m, &[0.0, 30.0, 0.0, 0.0], T0);
    let mut b = synced("gw-b", &mut m, &[0.0, 0.0, 0.0, 0.0], T0);
    period(&mut a, &mut m, T0 + S);
    period(&mut b, &mut m, T0 + S);
    period(&mut a, &mut m, T0 + 2 * S);
    let high = a.limits()[HIGH].unwrap();
    assert!(high > 20, "{high}");
    // B's demand rises: A's share of high drops; A's lowering write is sent, its answer lost.
    b.set_local_demand(&demand(&[0.0, 30.0, 0.0, 0.0]));
    period(&mut b, &mut m, T0 + 3 * S);
    report(&mut a, &[0, 0, 0, 0]);
    period(&mut a, &mut m, T0 + 3 * S);
    let lowered = a.limits()[HIGH].unwrap();
    assert!(lowered < high, "{lowered} < {high}");
    report(&mut a, &[0, 0, 0, 0]);
    let calls = a.tick(T0 + 4 * S);
    let write = calls.iter().find(|c| c.path == etcd::KV_TXN).unwrap().clone();
    let put_claim = |c: &EtcdCall| {
        let t = TxnRequest::from_body(&c.body).unwrap();
        let RequestOp::Put(p) = &t.success[0] else { panic!() };
        Record::decode(&p.value).unwrap().claim("high")
    };
    let pending_claim = put_claim(&write);
    assert!(pending_claim < high);
    for c in calls {
        if c.id == write.id {
            a.on_response(c.id, 0, b"", T0 + 4 * S);
        } else {
            exchange(&mut a, &mut m, vec![c], T0 + 4 * S);
        }
    }
    // B's demand goes away again: A's allocation rises, but the lost write may still apply.
    b.set_local_demand(&demand(&[0.0, 0.0, 0.0, 0.0]));
    period(&mut b, &mut m, T0 + 4 * S);
    assert!(a.limits()[HIGH].unwrap() <= pending_claim);
    // A's next write succeeds (its record moved past the lost write's base): the limit rises.
    period(&mut a, &mut m, T0 + 5 * S);
    period(&mut a, &mut m, T0 + 6 * S);
    assert!(a.limits()[HIGH].unwrap() > pending_claim);
    let now_claim = Record::decode(&m.get(b"/apf-wasm/default/replicas/gw-a").unwrap().value).unwrap().claim("high");
    // Delivered late, the lost write fails its compare: the newer claim stays.
    let (s, body) = m.handle(write.path, &write.headers, &write.body, T0 + 6 * S);
    assert_eq!(s, 200);
    assert!(!etcd::TxnResponse::decode(s, &body).unwrap().succeeded);
    assert_eq!(Record::decode(&m.get(b"/apf-wasm/default/replicas/gw-a").unwrap().value).unwrap().claim("high"), now_claim);
}

/// A claim is lowered only to the larger of the seats in use and every limit handed out since
/// the generation they were measured under.
#[test]
fn claims_are_lowered_only_below_limits_workers_may_still_use() {
    let mut m = MemEtcd::new();
    let mut a = synced("gw-a", &mut m, &[0.0, 30.0, 0.0, 0.0], T0);
    let mut b = synced("gw-b", &mut m, &[0.0, 0.0, 0.0, 0.0], T0);
    for t in 1..4 {
        report(&mut a, &[0, 3, 0, 0]);
        period(&mut a, &mut m, T0 + t * S);
        period(&mut b, &mut m, T0 + t * S);
    }
    let old_gen = a.generation();
    let high = a.limits()[HIGH].unwrap();
    b.set_local_demand(&demand(&[0.0, 30.0, 0.0, 0.0]));
    period(&mut b, &mut m, T0 + 4 * S);
    period(&mut a, &mut m, T0 + 4 * S);
    let lowered = a.limits()[HIGH].unwrap();
    assert!(lowered < high);
    // Seats in use reported under the old generation: workers may still admit up to `high`.
    a.set_seats_in_use(&[0, 3, 0, 0], old_gen);
    period(&mut a, &mut m, T0 + 5 * S);
    assert_eq!(a.claims().unwrap()[HIGH], high, "the claim covers what workers may still admit");
    // Reported under the new generation (then a late report under the old one, ignored): the
    // claim drops to the allocation.
    report(&mut a, &[0, 3, 0, 0]);
    a.set_seats_in_use(&[0, 50, 0, 0], old_gen);
    period(&mut a, &mut m, T0 + 6 * S);
    assert_eq!(a.claims().unwrap()[HIGH], a.targets().unwrap()[HIGH]);
}

/// A process restarted with the same replica id finds its earlier record: it keeps the claims
/// (they cover nothing any more) but admits only what a fleet check grants it.
#[test]
fn an_inherited_record_is_granted_nothing_unchecked() {
    let mut m = MemEtcd::new();
    let a = synced("gw-a", &mut m, &[0.0, 30.0, 0.0, 0.0], T0);
    let claims = a.claims().unwrap().to_vec();
    drop(a);
    let mut again = Fleet::new(config(), test_policy(), "gw-a").unwrap();
    again.set_local_demand(&demand(&[0.0, 30.0, 0.0, 0.0]));
    let calls = again.tick(T0 + S);
    let range = calls.iter().find(|c| c.path == etcd::KV_RANGE).unwrap().clone();
    let (s, b) = m.handle(range.path, &[], &range.body, T0 + S);
    again.on_response(range.id, s, &b, T0 + S);
    assert_eq!(again.claims().unwrap(), claims.as_slice());
    assert_eq!(again.mode(), FleetMode::Joining, "no lease yet");
    let grant = calls.iter().find(|c| c.path == etcd::LEASE_GRANT).unwrap().clone();
    exchange(&mut again, &mut m, vec![grant], T0 + S);
    assert_eq!(again.mode(), FleetMode::Synced);
    assert_eq!(again.limits()[HIGH], Some(claims[HIGH]), "granted again by the check");
}

/// Two replicas that have seen each other, synced on `m`.
fn pair(m: &mut MemEtcd) -> (Fleet, Fleet) {
    let mut a = synced("gw-a", m, &[0.0, 30.0, 5.0, 1.0], T0);
    let mut b = synced("gw-b", m, &[0.0, 30.0, 5.0, 1.0], T0);
    for t in 1..3 {
        period(&mut a, m, T0 + t * S);
        period(&mut b, m, T0 + t * S);
    }
    assert_eq!(a.allocation().unwrap().replicas.len(), 2);
    (a, b)
}

/// After etcd lost its data, `f` recovers for leaseTtl under min(static share of the last fleet,
/// seats granted before), registering again meanwhile; then the allocation resumes.
fn recovers(f: &mut Fleet, m: &mut MemEtcd, start: i64) {
    let granted: Vec<u32> = f.limits().iter().map(|l| l.unwrap_or(0)).collect();
    let shares = f.static_shares();
    period(f, m, start);
    assert_eq!(f.mode(), FleetMode::Recovering);
    assert_eq!(f.data_losses(), 1);
    assert_eq!(f.recovering_until(), Some(start + 5 * S));
    assert!(f.next_tick(start + 4 * S + S / 2) <= start + 5 * S, "a tick when recovery ends");
    let mut t = start;
    while t < start + 5 * S {
        period(f, m, t);
        assert_eq!(f.mode(), FleetMode::Recovering);
        for (i, l) in f.limits().iter().enumerate() {
            if let Some(l) = l {
                assert!(
                    *l <= shares[i].min(granted[i]),
                    "t = {} ms level {i}: {l} > min({}, {})",
                    (t - start) / 1_000_000,
                    shares[i],
                    granted[i]
                );
            }
        }
        t += S / 2;
    }
    assert!(f.claims().is_some(), "registered again while recovering");
    assert!(f.limits()[HIGH].unwrap() > 0, "serving while recovering");
    period(f, m, start + 5 * S);
    assert_eq!(f.mode(), FleetMode::Synced);
    period(f, m, start + 6 * S);
    let want: Vec<Option<u32>> = f.allocation().unwrap().levels.iter().map(|l| (!l.exempt).then_some(l.current)).collect();
    assert_eq!(f.limits(), want.as_slice(), "alone in the new etcd: the whole allocation");
    assert_eq!(f.data_losses(), 1);
}

#[test]
fn etcd_losing_its_data_is_seen_by_its_cluster_id() {
    let mut m = MemEtcd::new();
    let (mut a, _b) = pair(&mut m);
    m.wipe();
    // Revision above every one seen: only the cluster id (and the vanished lease) tell.
    for i in 0..50 {
        let put = etcd::PutRequest { key: format!("/elsewhere/{i}").into_bytes(), value: b"x".to_vec(), lease: 0 };
        m.txn(&TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() }).unwrap();
    }
    recovers(&mut a, &mut m, T0 + 3 * S);
}

#[test]
fn etcd_losing_its_data_is_seen_by_its_revision_going_back() {
    let mut m = MemEtcd::new();
    let (mut a, _b) = pair(&mut m);
    let id = m.cluster_id();
    m.wipe();
    m.set_cluster_id(id);
    recovers(&mut a, &mut m, T0 + 3 * S);
}

#[test]
fn etcd_losing_its_data_is_seen_by_the_fleet_or_lease_vanishing_while_trusted() {
    let mut m = MemEtcd::new();
    let (mut a, _b) = pair(&mut m);
    let id = m.cluster_id();
    m.wipe();
    m.set_cluster_id(id);
    for i in 0..50 {
        let put = etcd::PutRequest { key: format!("/elsewhere/{i}").into_bytes(), value: b"x".to_vec(), lease: 0 };
        m.txn(&TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() }).unwrap();
    }
    recovers(&mut a, &mut m, T0 + 3 * S);
}

#[test]
fn an_etcd_restart_that_keeps_its_data_is_no_loss() {
    let mut m = MemEtcd::new();
    let (mut a, mut b) = pair(&mut m);
    m.restart(T0 + 3 * S);
    for t in 3..8 {
        period(&mut a, &mut m, T0 + t * S);
        period(&mut b, &mut m, T0 + t * S);
    }
    assert_eq!((a.mode(), b.mode(), a.data_losses(), b.data_losses()), (FleetMode::Synced, FleetMode::Synced, 0, 0));
}

#[test]
fn ignored_records_are_listed_and_counted_once_per_revision() {
    let mut m = MemEtcd::new();
    let mut a = synced("gw-a", &mut m, &[0.0, 30.0, 5.0, 1.0], T0);
    let put = |m: &mut MemEtcd, key: &str, value: &[u8]| {
        let p = etcd::PutRequest { key: format!("/apf-wasm/default/replicas/{key}").into_bytes(), value: value.to_vec(), lease: 0 };
        m.txn(&TxnRequest { success: vec![RequestOp::Put(p)], ..Default::default() }).unwrap();
    };
    put(&mut m, "junk", b"not json");
    put(&mut m, "huge", br#"{"format":1,"levels":{"high":{"claim":4294967295,"granted":4294967295}}}"#);
    for t in 1..4 {
        period(&mut a, &mut m, T0 + t * S);
    }
    let ignored: Vec<(&str, &str)> = a.ignored_records().iter().map(|r| (r.id.as_str(), r.reason.as_str())).collect();
    assert_eq!(
        ignored,
        vec![("huge", "no lease (a replica's record always has one)"), ("junk", "no lease (a replica's record always has one)")]
    );
    assert_eq!(a.ignored_total(), 2, "each (key, mod revision) counted once");
    assert_eq!(a.allocation().unwrap().replicas, vec!["gw-a".to_string()]);
    let want: Vec<Option<u32>> = a.allocation().unwrap().levels.iter().map(|l| (!l.exempt).then_some(l.current)).collect();
    assert_eq!(a.limits(), want.as_slice(), "the foreign keys take nothing");
    // Rewritten: a new mod revision, counted again.
    put(&mut m, "junk", b"still not json");
    period(&mut a, &mut m, T0 + 4 * S);
    assert_eq!(a.ignored_total(), 3);
    assert_eq!(a.ignored_records()[1].mod_revision, m.get(b"/apf-wasm/default/replicas/junk").unwrap().mod_revision);
}

/// A replica that leaves while recovering admits nothing and revokes its lease.
#[test]
fn leaving_while_recovering() {
    let mut m = MemEtcd::new();
    let (mut a, _b) = pair(&mut m);
    m.wipe();
    period(&mut a, &mut m, T0 + 3 * S);
    period(&mut a, &mut m, T0 + 4 * S);
    assert_eq!(a.mode(), FleetMode::Recovering);
    assert!(a.claims().is_some(), "registered again");
    let calls = a.leave(T0 + 4 * S);
    assert_eq!(calls.iter().map(|c| c.path).collect::<Vec<_>>(), vec![etcd::LEASE_REVOKE]);
    assert_eq!(a.mode(), FleetMode::Joining);
    assert!(a.limits().iter().flatten().all(|&l| l == 0));
    exchange(&mut a, &mut m, calls, T0 + 4 * S);
    assert!(m.get(b"/apf-wasm/default/replicas/gw-a").is_none(), "the record went with the lease");
    assert!(a.tick(T0 + 5 * S).is_empty());
    assert_eq!(a.mode(), FleetMode::Joining);
}
