//! Benchmark control for the saturated benchmark (not part of the product): apf-wasm's filter
//! with a store that keys this VM's levels apart, so that every worker runs the same code on
//! levels of its own and nothing is shared. Measured beside the real module, it isolates what
//! sharing costs. Never a production module: it splits each level per worker.

use apf_wasm::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use apf_wasm::engine::LEVEL_KEY_PREFIX;
use apf_wasm::filter::HostStore;
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
struct IsolatedLevels<S>(S);

fn key(key: &str) -> Cow<'_, str> {
    if key.starts_with(LEVEL_KEY_PREFIX) {
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

proxy_wasm::main! {{
    apf_wasm::filter::start(Some(Box::leak(Box::<IsolatedLevels<HostStore>>::default())));
}}
