//! Benchmark control only (feature `bench-isolated-levels`, never in a release module): a store
//! that keys this VM's levels apart, so that every worker runs the same code on levels of its
//! own and nothing is shared. Measured beside the real module, it isolates what sharing costs.

use crate::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use std::borrow::Cow;

pub struct IsolatedLevels<S> {
    inner: S,
    /// This VM's suffix for level keys.
    suffix: String,
}

impl<S: Default> Default for IsolatedLevels<S> {
    fn default() -> Self {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        IsolatedLevels { inner: S::default(), suffix: format!("#{:016x}", u64::from_le_bytes(b)) }
    }
}

impl<S> IsolatedLevels<S> {
    fn key<'a>(&self, key: &'a str) -> Cow<'a, str> {
        if key.starts_with(crate::engine::LEVEL_KEY_PREFIX) {
            Cow::Owned(format!("{key}{}", self.suffix))
        } else {
            Cow::Borrowed(key)
        }
    }
}

impl<S: Store> Store for IsolatedLevels<S> {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.inner.get(&self.key(key))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.inner.set(&self.key(key), value, cas)
    }

    fn worker(&self) -> Option<&WorkerState> {
        self.inner.worker()
    }
}
