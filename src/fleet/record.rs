//! A replica's record: the JSON value stored under `<prefix><name>/replicas/<replica-id>`,
//! bound to the replica's lease (format and fields: docs/fleet.md, "Etcd calls and record
//! format"). Per level it holds the replica's seat demand statistics (upstream's
//! `seatDemandStats`), its **claim** (an upper bound of its seats in use; 0 on exempt levels),
//! its **granted** seats (≤ the claim: the part that passed the fleet check, the replica admits
//! only below it), its seats in use, and while a request wider than its seats waits, that width
//! (`wide`) and the revision since which it waits (`wideSince`, its place in line).
//!
//! Decoding is total and lenient (unknown fields ignored, `null` as absent); a newer `format` is
//! an error. Decoding does not judge the numbers: [`Record::impossible`] does.

use super::allocation::clean;
use super::levels::FleetPolicy;
use crate::etcd::wire;
use crate::limits::borrowing::SeatDemandStats;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;

pub const RECORD_FORMAT: u64 = 1;

/// One level of a record.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LevelRecord {
    #[serde(flatten, with = "Demand")]
    pub demand: SeatDemandStats,
    #[serde(deserialize_with = "wire::int::deserialize")]
    pub claim: u32,
    #[serde(deserialize_with = "wire::int::deserialize")]
    pub granted: u32,
    #[serde(deserialize_with = "wire::int::deserialize")]
    pub in_use: u32,
    /// The seats of the widest request waiting for more seats than the replica has (0: none).
    #[serde(deserialize_with = "wire::int::deserialize", skip_serializing_if = "wire::is_default")]
    pub wide: u32,
    /// The revision from which the replica has been waiting for `wide` seats.
    #[serde(serialize_with = "wire::int::serialize", deserialize_with = "non_negative", skip_serializing_if = "wire::is_default")]
    pub wide_since: i64,
}

/// `seatDemandStats` as a record writes it: non-finite and negative values as 0.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SeatDemandStats", rename_all = "camelCase")]
struct Demand {
    #[serde(default, serialize_with = "finite", deserialize_with = "wire::or_default")]
    avg: f64,
    #[serde(default, serialize_with = "finite", deserialize_with = "wire::or_default")]
    std_dev: f64,
    #[serde(default, serialize_with = "non_negative_number", deserialize_with = "non_negative")]
    high_watermark: i64,
    #[serde(default, serialize_with = "finite", deserialize_with = "wire::or_default")]
    smoothed: f64,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Record {
    #[serde(deserialize_with = "wire::int::deserialize")]
    pub heartbeat: u64,
    #[serde(serialize_with = "wire::int::serialize", deserialize_with = "non_negative")]
    pub revision: i64,
    #[serde(deserialize_with = "wire::int::deserialize")]
    pub server_concurrency_limit: u32,
    /// By level name.
    #[serde(deserialize_with = "levels")]
    pub levels: BTreeMap<String, LevelRecord>,
}

/// The record as stored: with its format.
#[derive(Serialize)]
struct Versioned<'a> {
    format: u64,
    #[serde(flatten)]
    record: &'a Record,
}

/// Why a record does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    Json(String),
    Format(u64),
    /// A field of the wrong type or out of range.
    Field(String),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Json(e) => write!(f, "invalid JSON: {e}"),
            RecordError::Format(n) => write!(f, "unsupported record format {n}"),
            RecordError::Field(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for RecordError {}

/// JSON has no NaN or infinity.
fn finite<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(clean(*x))
}

fn non_negative_number<S: Serializer>(x: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_i64((*x).max(0))
}

/// A non-negative integer (a number or a string) as an `i64`.
fn non_negative<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let x: u64 = wire::int::deserialize(d)?;
    i64::try_from(x).map_err(D::Error::custom)
}

/// The levels: an object of objects (`null`: none; a level, flattened, is read as a map only).
fn levels<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, LevelRecord>, D::Error> {
    let levels: BTreeMap<String, Value> = wire::or_default(d)?;
    let level = |(name, l): (String, Value)| match LevelRecord::deserialize(l) {
        Ok(l) => Ok((name, l)),
        Err(e) => Err(D::Error::custom(format!("levels.{name}: {e}"))),
    };
    levels.into_iter().map(level).collect()
}

impl Record {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(Versioned { format: RECORD_FORMAT, record: self }).unwrap_or(Value::Null)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&Versioned { format: RECORD_FORMAT, record: self }).unwrap_or_default()
    }

    /// Unknown fields are ignored; a newer `format` is an error.
    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| RecordError::Json(e.to_string()))?;
        let field = |e: serde_json::Error| RecordError::Field(e.to_string());
        if !v.is_object() {
            return Err(RecordError::Field("expected an object".to_string()));
        }
        let format: u64 = wire::int::deserialize(v.get("format").cloned().unwrap_or(Value::Null)).map_err(field)?;
        if format != RECORD_FORMAT {
            return Err(RecordError::Format(format));
        }
        Record::deserialize(v).map_err(field)
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

    /// Why this record's numbers are impossible for a replica of a fleet running `policy`, if
    /// they are: granted above claim; on a level not exempt here, a claim above the largest Σ
    /// fleet CurrentCL ([`FleetPolicy::max_total`]), a width above [`FleetPolicy::wide_bound`],
    /// or a demand statistic negative, not finite or above [`FleetPolicy::demand_bound`]; claims
    /// summing above Σ CurrentCL. Bounds independent of any one level's shares, so that a replica
    /// in a rolling policy change is not ignored (docs/fleet.md, "Records are checked").
    pub fn impossible(&self, policy: &FleetPolicy) -> Option<String> {
        let max = policy.max_total();
        for (name, l) in &self.levels {
            if l.granted > l.claim {
                return Some(format!("levels.{name}: granted {} above claim {}", l.granted, l.claim));
            }
            let exempt = policy.levels.iter().any(|level| level.name == *name && level.exempt);
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
