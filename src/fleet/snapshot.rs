//! A snapshot: every replica record under the fleet's prefix at one store revision, as one range
//! read returns it. The allocation is computed from a snapshot, and the claims it holds are what
//! a raise is checked against.
//!
//! Records are checked, not trusted ([`Snapshot::checked`]): what is not a replica's record
//! counts for nothing and is listed in [`Snapshot::ignored`].

use super::allocation::{allocate, Allocation, ReplicaDemand, WideNeed};
use super::levels::FleetPolicy;
use super::record::{valid_replica_id, LevelRecord, Record, RecordError};
use crate::etcd::{EtcdError, RangeResponse};
use crate::limits::borrowing::SeatDemandStats;

/// One key under the prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaEntry {
    /// The key without the prefix.
    pub id: String,
    pub mod_revision: i64,
    pub lease: i64,
    /// The decoded record, or why it does not decode.
    pub record: Result<Record, RecordError>,
}

/// A key under the prefix that is not taken for a replica's record, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredRecord {
    /// The key without the prefix (invalid UTF-8 replaced).
    pub id: String,
    pub mod_revision: i64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// The store revision of the read.
    pub revision: i64,
    /// Sorted by id.
    pub replicas: Vec<ReplicaEntry>,
    /// Keys [`Snapshot::checked`] took out of `replicas`, sorted by id.
    pub ignored: Vec<IgnoredRecord>,
}

/// The others' claims in a snapshot, as a raise is checked against them.
#[derive(Debug, Clone, PartialEq)]
pub struct OthersClaims {
    /// Per level of the policy.
    pub per_level: Vec<u64>,
    /// Over every level every record names (levels this replica does not know included).
    pub total: u64,
}

/// Why an entry is not a replica's record (`None`: it is one).
fn ignore_reason(e: &ReplicaEntry, policy: &FleetPolicy, own: &str) -> Option<String> {
    if e.lease == 0 {
        return Some("no lease (a replica's record always has one)".to_string());
    }
    if !valid_replica_id(&e.id) {
        return Some("not a replica key".to_string());
    }
    match &e.record {
        Err(why) => Some(format!("does not decode: {why}")),
        // This replica's own record is what it wrote: never impossible to itself, whatever
        // policy it has switched to since.
        Ok(_) if e.id == own => None,
        Ok(r) => r.impossible(policy).map(|why| format!("impossible: {why}")),
    }
}

impl Snapshot {
    /// The records of a range over `prefix`. A truncated answer (`more`) is an error: a
    /// snapshot must hold every record.
    pub fn from_range(prefix: &[u8], r: &RangeResponse) -> Result<Snapshot, EtcdError> {
        if r.more || r.count > r.kvs.len() as i64 {
            return Err(EtcdError::Malformed(format!("range holds {} of {} keys", r.kvs.len(), r.count)));
        }
        let mut replicas: Vec<ReplicaEntry> = r
            .kvs
            .iter()
            .filter_map(|kv| {
                let id = kv.key.strip_prefix(prefix)?;
                Some(ReplicaEntry {
                    // Invalid UTF-8 becomes U+FFFD, which no replica id has.
                    id: String::from_utf8_lossy(id).into_owned(),
                    mod_revision: kv.mod_revision,
                    lease: kv.lease,
                    record: Record::decode(&kv.value),
                })
            })
            .collect();
        replicas.sort_by(|a, b| a.id.cmp(&b.id));
        replicas.dedup_by(|a, b| a.id == b.id);
        Ok(Snapshot { revision: r.header.revision, replicas, ignored: Vec::new() })
    }

    /// This snapshot with what is not a replica's record of a fleet running `policy` moved to
    /// [`Snapshot::ignored`], whole: a key without a lease (it would never expire), a key that is
    /// not a replica id, a record that does not decode (a newer format included: a format change
    /// needs a new fleet `name`), a record whose numbers are impossible ([`Record::impossible`]).
    pub fn checked(mut self, policy: &FleetPolicy, own: &str) -> Snapshot {
        let (mut kept, mut ignored) = (Vec::with_capacity(self.replicas.len()), Vec::new());
        for e in self.replicas {
            match ignore_reason(&e, policy, own) {
                Some(reason) => ignored.push(IgnoredRecord { id: e.id, mod_revision: e.mod_revision, reason }),
                None => kept.push(e),
            }
        }
        self.replicas = kept;
        self.ignored.extend(ignored);
        self.ignored.sort_by(|a, b| a.id.cmp(&b.id));
        self
    }

    pub fn get(&self, id: &str) -> Option<&ReplicaEntry> {
        self.replicas.binary_search_by(|e| e.id.as_str().cmp(id)).ok().and_then(|i| self.replicas.get(i))
    }

    /// This snapshot with `id`'s record replaced (or added): the state a write of `record`
    /// creates.
    pub fn with_record(&self, id: &str, record: Record) -> Snapshot {
        let mut s = self.clone();
        s.replicas.retain(|e| e.id != id);
        let at = s.replicas.partition_point(|e| e.id.as_str() < id);
        s.replicas.insert(at, ReplicaEntry { id: id.to_string(), mod_revision: 0, lease: 0, record: Ok(record) });
        s
    }

    /// The allocation of this snapshot (in an unchecked snapshot, a record that does not decode
    /// counts as a replica without demand).
    pub fn allocate(&self, policy: &FleetPolicy) -> Allocation {
        let demand: Vec<Vec<SeatDemandStats>> =
            self.replicas.iter().map(|e| per_level(e.record.as_ref().ok(), policy, |l| l.demand)).collect();
        let need = |l: &LevelRecord| WideNeed { seats: l.wide, since: l.wide_since };
        let wide: Vec<Vec<WideNeed>> = self.replicas.iter().map(|e| per_level(e.record.as_ref().ok(), policy, need)).collect();
        let input: Vec<ReplicaDemand<'_>> =
            self.replicas.iter().zip(demand.iter().zip(&wide)).map(|(e, (d, w))| ReplicaDemand { id: &e.id, demand: d, wide: w }).collect();
        allocate(policy, &input)
    }

    /// The claims of every replica but `id` (records that do not decode count for nothing: a
    /// checked snapshot has none).
    pub fn others_claims(&self, policy: &FleetPolicy, id: &str) -> OthersClaims {
        let mut c = OthersClaims { per_level: vec![0; policy.levels.len()], total: 0 };
        for r in self.replicas.iter().filter(|e| e.id != id).filter_map(|e| e.record.as_ref().ok()) {
            for (sum, l) in c.per_level.iter_mut().zip(&policy.levels) {
                *sum = sum.saturating_add(u64::from(r.claim(&l.name)));
            }
            c.total = c.total.saturating_add(r.total_claim());
        }
        c
    }
}

/// A record's value per level of `policy` (levels it does not name, or no record: the default).
pub fn per_level<T: Default>(record: Option<&Record>, policy: &FleetPolicy, f: impl Fn(&LevelRecord) -> T) -> Vec<T> {
    policy.levels.iter().map(|l| record.and_then(|r| r.levels.get(&l.name)).map(&f).unwrap_or_default()).collect()
}

/// A record's claims per level of `policy`.
pub fn claims_of(record: &Record, policy: &FleetPolicy) -> Vec<u32> {
    per_level(Some(record), policy, |l| l.claim)
}

/// A record's granted seats per level of `policy`.
pub fn granted_of(record: &Record, policy: &FleetPolicy) -> Vec<u32> {
    per_level(Some(record), policy, |l| l.granted)
}
