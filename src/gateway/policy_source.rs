//! The cluster's policy (`clusterPolicy`) shared by the roots of one configuration in a process
//! whose workers share memory (the native host): one root reads the cluster and publishes each
//! policy it applies; every other root adopts the newest before it classifies a request, at the
//! cost of one atomic load when nothing changed. The Wasm host shares no memory between VMs: each
//! root reads the cluster itself ([`super::Root::default`]).

use crate::config::PluginConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A policy read from the cluster and applied by the reading root.
pub struct Published {
    pub config: PluginConfig,
    /// Where it was read (for the log).
    pub what: String,
}

/// The newest policy of one configuration, published by its reading root.
#[derive(Default)]
pub struct SharedPolicy {
    /// Policies published so far (0: none yet).
    count: AtomicU64,
    newest: Mutex<Option<(u64, Arc<Published>)>>,
}

impl SharedPolicy {
    /// How many policies were published: a root that adopted this many is current.
    pub fn published(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// The newest policy and its number (`None`: none yet, or a poisoned lock).
    pub fn newest(&self) -> Option<(u64, Arc<Published>)> {
        self.newest.lock().ok()?.clone()
    }

    /// Publishes a policy the reading root applied.
    pub fn publish(&self, p: Published) {
        let Ok(mut newest) = self.newest.lock() else { return };
        let n = newest.as_ref().map_or(0, |(n, _)| *n).wrapping_add(1);
        *newest = Some((n, Arc::new(p)));
        self.count.store(n, Ordering::Release);
    }
}

/// How a root takes the cluster's policy.
#[derive(Clone)]
pub enum PolicyRole {
    /// It reads the cluster itself and publishes what it applies.
    Reader(Arc<SharedPolicy>),
    /// It adopts what the reader published; `adopted`: the number of the policy it runs.
    Follower { source: Arc<SharedPolicy>, adopted: u64 },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_publication_is_numbered_and_the_newest_wins() {
        let s = SharedPolicy::default();
        assert_eq!(s.published(), 0);
        assert!(s.newest().is_none());
        let cfg = crate::config::parse_plugin_config(b"{}").unwrap();
        s.publish(Published { config: cfg.clone(), what: "a".into() });
        s.publish(Published { config: cfg, what: "b".into() });
        let (n, p) = s.newest().unwrap();
        assert_eq!((s.published(), n, p.what.as_str()), (2, 2, "b"));
    }
}
