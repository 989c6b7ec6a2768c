//! Benchmark control only (feature `bench-isolated-levels`, never in a release module): a store
//! that keys this VM's levels apart, so that every worker runs the same code on levels of its
//! own and nothing is shared. Measured beside the real module, it isolates what sharing costs.

use crate::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use std::borrow::Cow;

thread_local! {
    /// This VM's suffix for level keys.
    static SUFFIX: String = {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        format!("#{:016x}", u64::from_le_bytes(b))
    };
}

/// `S` with this VM's level keys suffixed.
#[derive(Default)]
pub struct IsolatedLevels<S>(S);

fn key(key: &str) -> Cow<'_, str> {
    if key.starts_with(crate::engine::LEVEL_KEY_PREFIX) {
        Cow::Owned(SUFFIX.with(|s| format!("{key}{s}")))
    } else {
        Cow::Borrowed(key)
    }
}

impl<S: Store> Store for IsolatedLevels<S> {
    fn get(&self, k: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.0.get(&key(k))
    }

    fn set(&self, k: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.0.set(&key(k), value, cas)
    }

    fn worker(&self) -> Option<&WorkerState> {
        self.0.worker()
    }
}
