//! Records are checked, not trusted: what `Snapshot::checked` ignores and why, and a fleet under
//! foreign keys written under its prefix — a lease-less key that does not decode, a lease-less
//! record claiming 4294967295 seats, one with a demand of 1e9 — keeps its seats in use, takes a
//! restarted replica in, and raises (the compare that guards raises is not blocked by a key
//! written once).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use apf_wasm::etcd::{Header, KeyValue, RangeResponse};
use apf_wasm::fleet::record::Record;
use apf_wasm::fleet::snapshot::Snapshot;
use fleet_sim::{one_level_policy, test_policy, Net, Sim, MS, S};

const DT: i64 = 50 * MS;
const PREFIX: &[u8] = b"/apf-wasm/default/replicas/";

fn kv(id: &[u8], value: &str, lease: i64) -> KeyValue {
    let mut key = PREFIX.to_vec();
    key.extend_from_slice(id);
    KeyValue { key, mod_revision: 7, value: value.as_bytes().to_vec(), lease, ..KeyValue::default() }
}

fn checked(kvs: Vec<KeyValue>) -> Snapshot {
    let r = RangeResponse { header: Header { revision: 9, ..Header::default() }, count: kvs.len() as i64, kvs, more: false };
    Snapshot::from_range(PREFIX, &r).unwrap().checked(&test_policy(), "")
}

fn reason(id: &[u8], value: &str, lease: i64) -> String {
    let s = checked(vec![kv(id, value, lease)]);
    assert!(s.replicas.is_empty(), "{} kept", String::from_utf8_lossy(id));
    assert_eq!(s.ignored.len(), 1);
    assert_eq!(s.ignored[0].mod_revision, 7);
    s.ignored[0].reason.clone()
}

#[test]
fn the_bounds_of_the_test_policy() {
    let p = test_policy();
    // high: NominalCL 20, MaxCL 80; the others' MinCL 3 + 10 out of nominalCLSum 60. low:
    // MaxCL 90, the others' MinCL 15 + 10. catch-all: MaxCL 70, the others' 15 + 3.
    assert_eq!((p.level_max(0), p.level_max(1), p.level_max(2), p.level_max(3)), (None, Some(47), Some(35), Some(42)));
    assert_eq!(p.max_total(), 61);
    // One bound for every level: Σ CurrentCL 61 + the largest queues, low's 16 queues × 50
    // requests × plMaxSeats 5; the widest waiting request, within the Σ CurrentCL.
    assert_eq!(p.demand_bound(), 61 + 16 * 50 * 5);
    assert_eq!(p.wide_bound(), 61);
    assert_eq!(one_level_policy(20).level_max(0), Some(20));
}

#[test]
fn what_is_ignored_and_why() {
    let good =
        r#"{"format":1,"levels":{"high":{"avg":3.5,"stdDev":1.2,"highWatermark":6,"smoothed":4.1,"claim":20,"granted":20,"inUse":5}}}"#;
    let s = checked(vec![kv(b"gw-a", good, 5)]);
    assert_eq!((s.replicas.len(), s.ignored.len()), (1, 0));
    assert_eq!(reason(b"gw-a", good, 0), "no lease (a replica's record always has one)");
    assert_eq!(reason(b"gw/a", good, 5), "not a replica key");
    assert_eq!(reason(b"gw\xffa", good, 5), "not a replica key");
    assert!(reason(b"gw-a", "not json", 5).starts_with("does not decode: invalid JSON"));
    assert_eq!(reason(b"gw-a", r#"{"format":2}"#, 5), "does not decode: unsupported record format 2");
    let r = |levels: &str| reason(b"gw-a", &format!(r#"{{"format":1,"levels":{levels}}}"#), 5);
    assert_eq!(r(r#"{"high":{"claim":4294967295}}"#), "impossible: levels.high: claim 4294967295 above the largest Σ CurrentCL 61");
    assert_eq!(r(r#"{"high":{"claim":62,"granted":62}}"#), "impossible: levels.high: claim 62 above the largest Σ CurrentCL 61");
    assert_eq!(r(r#"{"high":{"claim":4,"granted":5}}"#), "impossible: levels.high: granted 5 above claim 4");
    assert_eq!(r(r#"{"high":{"claim":1,"wide":62}}"#), "impossible: levels.high: wide 62 above the widest possible 61");
    assert_eq!(r(r#"{"high":{"avg":-1}}"#), "impossible: levels.high: avg -1 not within [0, 4061]");
    assert_eq!(r(r#"{"low":{"avg":1e9}}"#), "impossible: levels.low: avg 1000000000 not within [0, 4061]");
    assert_eq!(r(r#"{"low":{"highWatermark":4062}}"#), "impossible: levels.low: highWatermark 4062 not within [0, 4061]");
    assert_eq!(r(r#"{"low":{"smoothed":8123}}"#), "impossible: levels.low: smoothed 8123 not within [0, 8122]");
    assert_eq!(r(r#"{"unknown":{"avg":4062}}"#), "impossible: levels.unknown: avg 4062 not within [0, 4061]");
    assert_eq!(r(r#"{"exempt":{"avg":-0.5}}"#), "impossible: levels.exempt: avg -0.5 not within [0, inf]");
    assert_eq!(
        r(r#"{"high":{"claim":40,"granted":40},"unknown":{"claim":22,"granted":22}}"#),
        "impossible: claims sum to 62, above the largest Σ CurrentCL 61"
    );
    // Within the bounds: kept; an exempt level's demand has no upper bound (nothing limits it).
    let s = checked(vec![kv(b"gw-a", r#"{"format":1,"levels":{"high":{"claim":47,"granted":47,"avg":2447},"exempt":{"avg":1e9}}}"#, 5)]);
    assert_eq!((s.replicas.len(), s.ignored.len()), (1, 0));
    // A replica still running a previous policy in a rolling change of the levels' shares or
    // queues: more seats on `high` than this policy's shares could ever give it (47), and more
    // demand than its queues hold. Kept: its claims must count.
    let previous = r#"{"format":1,"levels":{"high":{"claim":55,"granted":55,"avg":3000,"highWatermark":3000,"wide":58}}}"#;
    let s = checked(vec![kv(b"gw-a", previous, 5)]);
    assert_eq!((s.replicas.len(), s.ignored.len()), (1, 0));
    // This replica's own record is never ignored for its numbers (it wrote them, maybe under
    // another policy); without a lease it is, as any other.
    let own = r#"{"format":1,"levels":{"high":{"claim":4294967295}}}"#;
    let r = RangeResponse { header: Header { revision: 9, ..Header::default() }, count: 1, kvs: vec![kv(b"gw-a", own, 5)], more: false };
    let s = Snapshot::from_range(PREFIX, &r).unwrap().checked(&test_policy(), "gw-a");
    assert_eq!((s.replicas.len(), s.ignored.len()), (1, 0));
    // A replica's own record is never impossible.
    let mut rec = Record::decode(good.as_bytes()).unwrap();
    rec.levels.get_mut("high").unwrap().demand.avg = f64::NAN;
    assert_eq!(Record::decode(&rec.encode()).unwrap().impossible(&test_policy()), None);
}

/// Three replicas with more demand than 20 seats, converged; `foreign` written once under the
/// prefix. The fleet keeps every seat in use, a restarted replica gets seats, and raises go on.
fn under_foreign_key(what: &str, suffix: &[u8], value: &str, ttl_secs: i64) {
    let mut sim = Sim::with_policy(23, Net { delay_max: 30 * MS, ..Net::perfect() }, one_level_policy(20));
    for _ in 0..3 {
        sim.start_replica(None, vec![10]);
        sim.run(0.3, DT);
    }
    sim.run(4.0, DT);
    sim.converged().unwrap();
    sim.put_foreign(suffix, value.as_bytes(), ttl_secs);
    let (mut sum, mut steps) = (0u64, 0u64);
    for _ in 0..200 {
        sim.step(DT);
        sum += u64::from(sim.fleet_in_use()[0]);
        steps += 1;
    }
    let mean = sum as f64 / steps as f64;
    sim.converged().unwrap();
    assert!(sim.replicas.iter().all(|r| r.fleet.ignored_total() == 1 && r.fleet.ignored_records().len() == 1), "{what}");
    // A replica restarted (a new process) gets its share.
    sim.crash(2);
    let slot = sim.start_replica(Some(2), vec![10]);
    let t0 = sim.now;
    while sim.replicas[slot].fleet.limits()[0].unwrap_or(0) == 0 || sim.converged().is_err() {
        // The crashed replica's claims hold until its lease expires.
        assert!(sim.now - t0 < sim.config.lease_ttl + 3 * S, "{what}: the restarted replica gets no seats");
        sim.step(DT);
    }
    let restarted = sim.now - t0;
    // Load moves to one replica: its raises pass the prefix compare.
    sim.replicas[0].demand = vec![30];
    sim.replicas[1].demand = vec![0];
    sim.replicas[slot].demand = vec![0];
    let t1 = sim.now;
    while sim.replicas[0].fleet.limits()[0].unwrap() < 17 {
        assert!(sim.now - t1 < 3 * S, "{what}: no raise");
        sim.step(DT);
    }
    eprintln!(
        "{what}: mean {mean:.1} of 20 seats in use; a replica crashed and restarted has seats after {} ms; load moved: 17 of 20 after {} ms",
        restarted / MS,
        (sim.now - t1) / MS
    );
    assert!(mean >= 19.5, "{what}: mean {mean}");
}

#[test]
fn foreign_keys_take_no_seats() {
    under_foreign_key("lease-less undecodable key", b"junk", "\u{0}garbage", 0);
    under_foreign_key(
        "lease-less record claiming 4294967295",
        b"x",
        r#"{"format":1,"levels":{"workload":{"claim":4294967295,"granted":4294967295}}}"#,
        0,
    );
    under_foreign_key(
        "record with a lease and demand 1e9",
        b"x",
        r#"{"format":1,"levels":{"workload":{"avg":1e9,"highWatermark":1000000000,"smoothed":1e9}}}"#,
        60,
    );
    under_foreign_key("record of a newer format with a lease", b"gw-future", r#"{"format":2,"levels":{}}"#, 60);
}
