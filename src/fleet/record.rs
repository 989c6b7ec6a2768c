//! A replica's record: the JSON value stored (base64, as every etcd value) under
//! `<prefix><name>/replicas/<replica-id>`, bound to the replica's lease.
//!
//! ```json
//! {"format": 1, "heartbeat": 42, "revision": "1187", "serverConcurrencyLimit": 600,
//!  "levels": {"workload-low": {"avg": 3.5, "stdDev": 1.2, "highWatermark": 6, "smoothed": 4.1,
//!                              "claim": 20, "granted": 20, "inUse": 5}, ...}}
//! ```
//! - `levels`: per priority level (by name) the replica's seat demand statistics (upstream's
//!   `seatDemandStats`: `avg`, `stdDev`, `highWatermark`, `smoothed`), its **claim** (the seats it
//!   may use; an upper bound of its seats in use; 0 for exempt levels, which are not limited)
//!   its **granted** seats (the part of the claim that passed the fleet check: the replica admits
//!   requests only while its seats in use are below it; equal to the claim except while requests
//!   admitted outside the fleet's accounting — after the record was lost — drain), and its
//!   seats in use when it wrote the record. While a request wider than the replica's seats on a
//!   level waits there, `wide` is its seats and `wideSince` the revision from which the replica
//!   has been waiting for them (its place in the line for seats, [`crate::fleet::allocation`]);
//!   both are left out otherwise.
//! - `revision`: the store revision of the snapshot the replica planned this record from.
//! - `heartbeat`: counts the replica's writes.
//! - `serverConcurrencyLimit`: the fleet limit the replica runs with (a mismatch shows a
//!   configuration rollout in progress).
//!
//! Decoding is total and lenient about what it does not know (unknown fields are ignored, so a
//! newer writer can add some); a record of a newer `format` is an error. Decoding does not judge
//! the numbers: [`crate::fleet::snapshot::Snapshot::checked`] ignores a record whose numbers are
//! impossible, and one that does not decode.

use super::levels::FleetPolicy;
use crate::limits::borrowing::SeatDemandStats;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub const RECORD_FORMAT: u64 = 1;

/// One level of a record.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LevelRecord {
    pub demand: SeatDemandStats,
    pub claim: u32,
    pub granted: u32,
    pub in_use: u32,
    /// The seats of the widest request waiting for more seats than the replica has (0: none).
    pub wide: u32,
    /// The revision from which the replica has been waiting for `wide` seats.
    pub wide_since: i64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    pub heartbeat: u64,
    pub revision: i64,
    pub server_concurrency_limit: u32,
    /// By level name.
    pub levels: BTreeMap<String, LevelRecord>,
}

/// A finite, non-negative float (JSON has no NaN or infinity).
fn finite(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// A number as written: a negative value is kept (the snapshot's check refuses the record).
fn num(v: &Value, key: &str) -> Result<f64, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(0.0),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| format!("{key}: {n} is not a number")),
        Some(_) => Err(format!("{key}: expected a number")),
    }
}

fn unsigned(v: &Value, key: &str) -> Result<u64, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| format!("{key}: {n} is not a non-negative integer")),
        Some(Value::String(s)) => s.parse().map_err(|_| format!("{key}: {s:?} is not a non-negative integer")),
        Some(_) => Err(format!("{key}: expected an integer")),
    }
}

fn seats(v: &Value, key: &str) -> Result<u32, String> {
    u32::try_from(unsigned(v, key)?).map_err(|_| format!("{key}: more seats than fit 32 bits"))
}

impl LevelRecord {
    fn to_json(self) -> Value {
        let d = &self.demand;
        let mut v = json!({
            "avg": finite(d.avg), "stdDev": finite(d.std_dev), "highWatermark": d.high_watermark.max(0),
            "smoothed": finite(d.smoothed), "claim": self.claim, "granted": self.granted, "inUse": self.in_use,
        });
        if let (Some(m), true) = (v.as_object_mut(), self.wide > 0) {
            m.insert("wide".into(), json!(self.wide));
            m.insert("wideSince".into(), json!(self.wide_since.to_string()));
        }
        v
    }

    fn from_json(v: &Value) -> Result<LevelRecord, String> {
        if !v.is_object() {
            return Err("expected an object".to_string());
        }
        let hw = i64::try_from(unsigned(v, "highWatermark")?).unwrap_or(i64::MAX);
        Ok(LevelRecord {
            demand: SeatDemandStats { avg: num(v, "avg")?, std_dev: num(v, "stdDev")?, high_watermark: hw, smoothed: num(v, "smoothed")? },
            claim: seats(v, "claim")?,
            granted: seats(v, "granted")?,
            in_use: seats(v, "inUse")?,
            wide: seats(v, "wide")?,
            wide_since: i64::try_from(unsigned(v, "wideSince")?).map_err(|_| "wideSince: out of range".to_string())?,
        })
    }
}

impl Record {
    pub fn to_json(&self) -> Value {
        let levels: Map<String, Value> = self.levels.iter().map(|(k, l)| (k.clone(), l.to_json())).collect();
        json!({
            "format": RECORD_FORMAT, "heartbeat": self.heartbeat, "revision": self.revision.to_string(),
            "serverConcurrencyLimit": self.server_concurrency_limit, "levels": Value::Object(levels),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
        if !v.is_object() {
            return Err("expected an object".to_string());
        }
        let format = unsigned(&v, "format")?;
        if format != RECORD_FORMAT {
            return Err(format!("unsupported record format {format}"));
        }
        let revision = i64::try_from(unsigned(&v, "revision")?).map_err(|_| "revision: out of range".to_string())?;
        let mut levels = BTreeMap::new();
        match v.get("levels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (name, l) in m {
                    levels.insert(name.clone(), LevelRecord::from_json(l).map_err(|e| format!("levels.{name}: {e}"))?);
                }
            }
            Some(_) => return Err("levels: expected an object".to_string()),
        }
        Ok(Record {
            heartbeat: unsigned(&v, "heartbeat")?,
            revision,
            server_concurrency_limit: seats(&v, "serverConcurrencyLimit")?,
            levels,
        })
    }

    /// The claim on a level (0 when the record does not name it).
    pub fn claim(&self, level: &str) -> u32 {
        self.levels.get(level).map_or(0, |l| l.claim)
    }

    /// The granted seats on a level (0 when the record does not name it).
    pub fn granted(&self, level: &str) -> u32 {
        self.levels.get(level).map_or(0, |l| l.granted)
    }

    /// Σ claims over every level the record names.
    pub fn total_claim(&self) -> u64 {
        self.levels.values().map(|l| u64::from(l.claim)).sum()
    }
}

/// Why a demand statistic is impossible: negative, not finite, or above `bound` (none for
/// exempt levels: nothing limits them).
fn impossible_demand(d: &SeatDemandStats, bound: Option<u64>) -> Option<String> {
    // One replica holds at most `bound` seats: the average and the high watermark stay within
    // it, the standard deviation of values within [0, bound] within bound ÷ 2 (Popoviciu), and
    // the smoothed value (upstream `seatDemandStats.update`: the largest recent average +
    // deviation, decaying) within bound × (1 + √2) ÷ 2; the checks leave a factor of 2 above
    // the last two for rounding.
    let b = bound.map_or(f64::INFINITY, |b| b as f64);
    let hw = d.high_watermark as f64;
    let checks = [("avg", d.avg, b), ("stdDev", d.std_dev, b), ("highWatermark", hw, b), ("smoothed", d.smoothed, 2.0 * b)];
    checks
        .iter()
        .find(|(_, x, max)| !x.is_finite() || *x < 0.0 || x > max)
        .map(|(name, x, max)| format!("{name} {x} not within [0, {max}]"))
}

impl Record {
    /// Why this record's numbers are impossible for a replica of a fleet running `policy`, if
    /// they are: on a level that is not exempt here, a claim or a grant above the largest Σ
    /// fleet CurrentCL ([`FleetPolicy::max_total`]: no level ever has more seats than the whole
    /// fleet), a waiting width above [`FleetPolicy::wide_bound`], or a demand statistic that is
    /// negative, not finite or above [`FleetPolicy::demand_bound`]; granted seats above the
    /// claim; claims over all levels above the largest Σ fleet CurrentCL. The bounds do not
    /// depend on any one level's shares or queues, so that a replica still running the previous
    /// policy in a rolling change of them is not ignored; they do depend on
    /// `serverConcurrencyLimit` (see docs/fleet.md, "Records nobody trusts").
    pub fn impossible(&self, policy: &FleetPolicy) -> Option<String> {
        let max = policy.max_total();
        for (name, l) in &self.levels {
            if l.granted > l.claim {
                return Some(format!("levels.{name}: granted {} above claim {}", l.granted, l.claim));
            }
            let exempt = policy.index(name).and_then(|i| policy.levels.get(i)).is_some_and(|level| level.exempt);
            let bound = (!exempt).then(|| policy.demand_bound());
            if let Some(why) = impossible_demand(&l.demand, bound) {
                return Some(format!("levels.{name}: {why}"));
            }
            if exempt {
                continue;
            }
            if u64::from(l.claim) > max {
                return Some(format!("levels.{name}: claim {} above the largest Σ CurrentCL {max}", l.claim));
            }
            if u64::from(l.wide) > policy.wide_bound() {
                return Some(format!("levels.{name}: wide {} above the widest possible {}", l.wide, policy.wide_bound()));
            }
        }
        let total = self.total_claim();
        (total > max).then(|| format!("claims sum to {total}, above the largest Σ CurrentCL {max}"))
    }
}

/// A replica id usable in a key: non-empty, printable ASCII without `/`.
pub fn valid_replica_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 253 && id.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_leniency() {
        let mut r = Record { heartbeat: 3, revision: 99, server_concurrency_limit: 600, levels: BTreeMap::new() };
        r.levels.insert(
            "a".into(),
            LevelRecord {
                demand: SeatDemandStats { avg: 1.5, std_dev: 0.5, high_watermark: 3, smoothed: 2.0 },
                claim: 7,
                granted: 6,
                in_use: 2,
                wide: 0,
                wide_since: 0,
            },
        );
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        r.levels.insert("w".into(), LevelRecord { claim: 1, granted: 1, wide: 4, wide_since: 1180, ..LevelRecord::default() });
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert_eq!(r.claim("a") + r.claim("b"), 7);
        let lenient = Record::decode(br#"{"format":1,"future":true,"levels":{"x":{"claim":4,"avg":null}}}"#).unwrap();
        assert_eq!(lenient.claim("x"), 4);
        for bad in [
            &b"{"[..],
            b"[]",
            br#"{"format":2}"#,
            br#"{"format":1,"levels":[]}"#,
            br#"{"format":1,"levels":{"x":{"claim":-1}}}"#,
            br#"{"format":1,"levels":{"x":{"claim":4294967296}}}"#,
        ] {
            assert!(Record::decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(valid_replica_id("gw-7f9c.ns_1") && !valid_replica_id("a/b") && !valid_replica_id("") && !valid_replica_id("a b"));
    }
}
