//! The APF engine: one global QueueSet per priority level ([`LevelState`]), kept in a shared
//! key-value store with compare-and-swap so that every Envoy worker VM of the process sees and
//! updates the same seats and queues (`docs/design.md` shows the shared keys). The engine is
//! host-independent: the clock is a `Nanos` argument, the store a [`store::Store`]. Keys are
//! namespaced and versioned because Istio leaves `vm_id` empty, so several plugins may share one
//! namespace. Operations return [`Notice`]s: requests owned by some worker that must now be
//! resumed (dispatched) or answered 429; [`requests`] routes them to their owner.
//!
//! - `level_state`: one level's stored state and its one write path; `notice`: decisions and
//!   notices; `operations`: admit, finish, end, time out, expire, purge, leases; `borrowing`: the
//!   levels' limits (upstream's borrowing, or the fleet's allocation); `error`: [`EngineError`].
//! - [`compiled`]: a configuration compiled for the request path and its digest pipeline;
//!   [`requests`]: one worker's request table; [`store`]: the shared store and its CAS update;
//!   [`level_table`]: levels kept decoded in process memory (the native host's store);
//!   [`cache`]: a worker's own last writes; [`workers`]: leases; [`watches`]: open watches;
//!   [`watch_limits`]: the places of open watches under `watchLimits`;
//!   [`object_counts`]: the cluster's object counts in shared data; [`debug`]: the dumps;
//!   [`contention`]: the global state's cost counters.

mod borrowing;
pub mod cache;
pub mod compiled;
pub mod contention;
pub mod debug;
mod error;
mod level_state;
pub mod level_table;
mod notice;
pub mod object_counts;
mod operations;
pub mod requests;
pub mod store;
pub mod watch_limits;
pub mod watches;
pub mod workers;

use crate::codec::{CodecError, Reader};
pub use compiled::{Compiled, LevelRuntime};
use store::{update, Store};

pub const LEVEL_STATE_VERSION: u8 = 1;
/// CAS retries before an operation gives up (the caller then fails open for that request).
pub const MAX_CAS_TRIES: u32 = 64;
pub const REGISTRY_KEY: &str = "apf/v3/workers";
pub const BORROW_KEY: &str = "apf/v3/borrow";
pub const WATCHES_KEY: &str = "apf/v3/watches";
pub const LEVEL_KEY_PREFIX: &str = "apf/v3/pl/";

pub fn level_key(level_name: &str) -> String {
    format!("{LEVEL_KEY_PREFIX}{level_name}")
}

/// A reader of a shared value's fields after its format version, which must be `version`.
pub(crate) fn versioned<'a>(bytes: &'a [u8], version: u8, what: &'static str) -> Result<Reader<'a>, CodecError> {
    let mut r = Reader::new(bytes);
    if r.u8()? == version {
        Ok(r)
    } else {
        Err(CodecError(what))
    }
}

/// Read-modify-write of a whole shared value with [`update`]; an absent or unreadable value
/// starts from the default.
pub(crate) fn update_value<S: Default, T>(
    store: &dyn Store,
    key: &str,
    decode: fn(Option<&[u8]>) -> Result<S, CodecError>,
    encode: fn(&S) -> Vec<u8>,
    mut f: impl FnMut(&mut S) -> T,
) -> Result<T, EngineError> {
    update(store, key, MAX_CAS_TRIES, |cur| {
        let mut st = decode(cur).unwrap_or_default();
        let r = f(&mut st);
        Ok((encode(&st), r))
    })
}

pub use borrowing::*;
pub use error::EngineError;
pub use level_state::*;
pub use notice::*;
pub use operations::*;
