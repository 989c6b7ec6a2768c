//! Open watches, for the mutating estimator (`watch_tracker.go`: `RegisterWatch`,
//! `GetInterestedWatchCount`).

use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::digest::request_info::RequestInfo;
use crate::digest::selectors;

// ---------------------------------------------------------------------------------------------
// WatchTracker (`watch_tracker.go`: `RegisterWatch`, `GetInterestedWatchCount`)

/// Identifies one registered watch (returned by [`WatchTracker::register`], passed to `forget`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    pub api_group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Hash, PartialEq, Eq)]
struct KeyRef<'a>(&'a str, &'a str, &'a str, &'a str);

/// Derived `Hash` hashes the fields in order, so a `KeyRef` hashes like its `WatchKey`: lookups
/// need no allocation.
impl hashbrown::Equivalent<WatchKey> for KeyRef<'_> {
    fn equivalent(&self, k: &WatchKey) -> bool {
        self.0 == k.api_group && self.1 == k.resource && self.2 == k.namespace && self.3 == k.name
    }
}

/// Counts open watches per (group, resource, namespace, name), upstream `watchTracker`.
/// Built-in index: `pods` watches pinned to a node (`spec.nodeName=<non-empty>`) are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchTracker {
    counts: hashbrown::HashMap<WatchKey, u32>,
}

const READ_ONLY_VERBS: [&str; 4] = ["get", "list", "watch", "proxy"];

impl WatchTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// `RegisterWatch`: only verb `watch`; returns the key to `forget` when the watch ends,
    /// or None if the watch is not tracked.
    pub fn register(&mut self, info: &RequestInfo) -> Option<WatchKey> {
        if info.verb != "watch" {
            return None;
        }
        if info.api_group.is_empty() && info.resource == "pods" && pinned_to_node(info) {
            return None;
        }
        let key = WatchKey {
            api_group: info.api_group.clone(),
            resource: info.resource.clone(),
            namespace: info.namespace.clone(),
            name: info.name.clone(),
        };
        let c = self.counts.entry(key.clone()).or_insert(0);
        *c = c.saturating_add(1);
        Some(key)
    }

    /// The watch ended: decrement, deleting zero entries.
    pub fn forget(&mut self, key: &WatchKey) {
        let k = KeyRef(&key.api_group, &key.resource, &key.namespace, &key.name);
        if let Some(c) = self.counts.get_mut(&k) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.counts.remove(&k);
            }
        }
    }

    fn get(&self, g: &str, r: &str, ns: &str, n: &str) -> u32 {
        self.counts.get(&KeyRef(g, r, ns, n)).copied().unwrap_or(0)
    }

    /// `GetInterestedWatchCount` (0 for read-only verbs).
    pub fn interested_count(&self, info: &RequestInfo) -> u32 {
        if READ_ONLY_VERBS.contains(&info.verb.as_str()) {
            return 0;
        }
        let (g, r) = (info.api_group.as_str(), info.resource.as_str());
        let mut n = self.get(g, r, "", "");
        if !info.namespace.is_empty() {
            n = n.saturating_add(self.get(g, r, &info.namespace, ""));
        }
        if !info.name.is_empty() {
            n = n.saturating_add(self.get(g, r, &info.namespace, &info.name));
        }
        n
    }

    /// Total tracked watches.
    pub fn total(&self) -> u64 {
        self.counts.values().map(|&c| u64::from(c)).sum()
    }

    /// Deterministic encoding (entries sorted by key).
    pub fn encode(&self, w: &mut Writer) {
        let mut entries: Vec<(&WatchKey, u32)> = self.counts.iter().map(|(k, c)| (k, *c)).collect();
        entries.sort();
        w.usize(entries.len());
        for (k, c) in entries {
            w.str(&k.api_group);
            w.str(&k.resource);
            w.str(&k.namespace);
            w.str(&k.name);
            w.u32(c);
        }
    }

    pub fn decode(r: &mut Reader) -> CodecResult<Self> {
        let n = r.count(5)?;
        let mut counts = hashbrown::HashMap::with_capacity(n);
        for _ in 0..n {
            let key = WatchKey {
                api_group: r.str()?.to_string(),
                resource: r.str()?.to_string(),
                namespace: r.str()?.to_string(),
                name: r.str()?.to_string(),
            };
            let c = r.u32()?;
            if c == 0 {
                return Err(CodecError("zero watch count"));
            }
            if counts.insert(key, c).is_some() {
                return Err(CodecError("duplicate watch key"));
            }
        }
        Ok(WatchTracker { counts })
    }
}

/// Whether `getIndexValue(r, "spec.nodeName")` is a node name (not "", which it also is when the
/// list options do not decode).
fn pinned_to_node(info: &RequestInfo) -> bool {
    let q = &info.query;
    let node = |t: Vec<_>| selectors::requires_exact_match(&t, "spec.nodeName").is_some_and(|n| !n.is_empty());
    !q.decode_failed() && selectors::parse_field_selector(&q.field_selector).is_some_and(node)
}
