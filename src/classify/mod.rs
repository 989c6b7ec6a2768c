//! Classification: FlowSchema matching, flow distinguisher and flow hash (upstream `rule.go`;
//! `apf_controller.go: startRequest`, `computeFlowDistinguisher`, `hashFlowID`).
//!
//! The FlowSchemas of the effective policy are already in matching order (precedence, then
//! name); the first that matches wins, and a request that matches nothing is given to
//! `catch-all` (`apf_controller.go: digestFlowSchemasLocked`, `startRequest`). Matching follows
//! `pkg/util/flowcontrol/rule.go` exactly (`matchesFlowSchema`, `containsString`): `"*"` is a
//! wildcard only as the sole element of a list, namespace-less resource requests need
//! `clusterScope`, non-resource URLs match sub-paths. The distinguisher and flow hash are only
//! computed for non-exempt levels that queue with more than one queue (`apf_controller.go:
//! startRequest`, `computeFlowDistinguisher`, `hashFlowID`).
//!
//! [`Classifier`] precompiles the policy (per-list wildcard flags, level indices) so that
//! matching allocates nothing; only the distinguisher string is built for queuing levels.
//! FlowSchemas whose subjects are all literal Users/Groups or ServiceAccounts carry a hashed
//! prefilter so that long policies are scanned cheaply (a FlowSchema whose keys the user lacks
//! cannot match, nor one of ServiceAccounts a user who is none), and one whose rules are all
//! non-resource (resource) rules is skipped for resource (non-resource) requests.

mod matching;

pub use matching::matches;

use crate::digest::identity::UserInfo;
use crate::digest::request_info::RequestInfo;
use crate::policy::model::{Distinguisher, Policy};
use matching::{CompiledSchema, UserKeys};
use sha2::{Digest, Sha256};

/// The outcome of classifying one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Classification {
    /// Index into `policy.flow_schemas`.
    pub flow_schema: usize,
    /// Index into `policy.priority_levels`.
    pub priority_level: usize,
    /// Flow distinguisher ("" unless the level queues with more than one queue).
    pub distinguisher: String,
    /// `hashFlowID(fs name, distinguisher)` (0 when the distinguisher is not computed).
    pub flow_hash: u64,
}

/// Upstream `hashFlowID`: first 8 bytes of SHA-256(fsName ‖ 0x00 ‖ distinguisher), little-endian.
pub fn flow_hash(fs_name: &str, distinguisher: &str) -> u64 {
    let h = Sha256::new().chain_update(fs_name).chain_update([0u8]).chain_update(distinguisher);
    u64::from_le_bytes(h.finalize().first_chunk().copied().unwrap_or_default())
}

/// Slots of the flow-hash memo (a power of two).
const HASH_MEMO_SLOTS: usize = 256;
/// Longer distinguishers are not memoized (bounds the memo's memory).
const HASH_MEMO_MAX_LEN: usize = 256;

/// A direct-mapped memo of recent `flow_hash` results keyed by (FlowSchema index,
/// distinguisher). SHA-256 is by far the most expensive step of classification (especially in
/// Wasm, without hardware SHA), and the same flows come back again and again. A hit returns
/// exactly what `flow_hash` would compute; a miss (or a busy lock) computes it.
#[derive(Debug, Default)]
struct HashMemo {
    slots: std::sync::Mutex<Vec<Option<(usize, String, u64)>>>,
}

impl HashMemo {
    fn slot(schema: usize, distinguisher: &str) -> usize {
        let h = matching::subject_key(0, distinguisher) ^ (schema as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h ^ (h >> 32)) as usize) & (HASH_MEMO_SLOTS - 1)
    }

    fn hash(&self, schema: usize, fs_name: &str, distinguisher: &str) -> u64 {
        if distinguisher.len() > HASH_MEMO_MAX_LEN {
            return flow_hash(fs_name, distinguisher);
        }
        let Ok(mut slots) = self.slots.try_lock() else { return flow_hash(fs_name, distinguisher) };
        if slots.is_empty() {
            slots.resize(HASH_MEMO_SLOTS, None);
        }
        let i = Self::slot(schema, distinguisher);
        let Some(slot) = slots.get_mut(i) else { return flow_hash(fs_name, distinguisher) };
        let hit = slot.as_ref().filter(|(s, d, _)| *s == schema && d == distinguisher);
        if let Some((_, _, h)) = hit {
            return *h;
        }
        let h = flow_hash(fs_name, distinguisher);
        *slot = Some((schema, distinguisher.to_string(), h));
        h
    }
}

impl Clone for HashMemo {
    fn clone(&self) -> Self {
        HashMemo::default()
    }
}

/// A policy compiled for fast classification.
#[derive(Debug, Clone)]
pub struct Classifier {
    schemas: Vec<CompiledSchema>,
    /// Index of the `catch-all` FlowSchema (or the last one).
    fallback: usize,
    memo: HashMemo,
}

impl Classifier {
    pub fn new(policy: &Policy) -> Self {
        let fs = &policy.flow_schemas;
        let schemas = fs.iter().map(|f| CompiledSchema::new(f, policy)).collect();
        let catch_all = fs.iter().position(|f| f.name == "catch-all");
        let fallback = catch_all.unwrap_or(fs.len().saturating_sub(1));
        Classifier { schemas, fallback, memo: HashMemo::default() }
    }

    /// Classifies one request: the first matching FlowSchema, or the catch-all. The policy must
    /// contain at least one FlowSchema (the effective policy always holds `catch-all`); otherwise
    /// indices 0 are returned.
    pub fn classify(&self, info: &RequestInfo, user: &UserInfo) -> Classification {
        let mut class = Classification::default();
        self.classify_into(info, user, &mut class);
        class
    }

    /// [`Classifier::classify`] written into `out`, the distinguisher's buffer reused.
    pub fn classify_into(&self, info: &RequestInfo, user: &UserInfo, out: &mut Classification) {
        let keys = UserKeys::new(user);
        let matches = |s: &CompiledSchema| s.matches(info, user, &keys);
        let idx = self.schemas.iter().position(matches).unwrap_or(self.fallback);
        out.distinguisher.clear();
        let Some(s) = self.schemas.get(idx) else {
            (out.flow_schema, out.priority_level, out.flow_hash) = (0, 0, 0);
            return;
        };
        out.flow_hash = if s.hashes {
            let d = match s.distinguisher {
                None => "",
                Some(Distinguisher::ByUser) => user.name.as_str(),
                Some(Distinguisher::ByNamespace) => info.namespace.as_str(),
            };
            out.distinguisher.push_str(d);
            self.memo.hash(idx, &s.name, d)
        } else {
            0
        };
        (out.flow_schema, out.priority_level) = (idx, s.level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_memo_returns_exact_flow_hashes() {
        let memo = HashMemo::default();
        let long = "x".repeat(HASH_MEMO_MAX_LEN + 1);
        for round in 0..3 {
            for schema in 0..4usize {
                for d in ["", "alice", "bob", "system:serviceaccount:ns:sa", long.as_str()] {
                    let name = format!("fs-{schema}");
                    assert_eq!(memo.hash(schema, &name, d), flow_hash(&name, d), "round {round} {schema} {d}");
                }
            }
        }
        // Many flows: collisions in the memo only evict.
        for i in 0..2000 {
            let d = format!("user-{i}");
            assert_eq!(memo.hash(i % 3, "global-default", &d), flow_hash("global-default", &d));
        }
    }
}
