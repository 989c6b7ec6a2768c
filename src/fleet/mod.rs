//! Fleet mode: one APF across every gateway replica, coordinated through etcd.
//!
//! With `fleet` configured, `serverConcurrencyLimit` is the limit of the whole fleet. Every
//! replica keeps its own APF for the traffic it receives, under a per-level seat allocation the
//! fleet recomputes every `period` from every replica's seat demand. Plain core Rust: the clock
//! is passed in and there is no I/O — the state machine produces etcd requests (path + JSON
//! body) and consumes etcd responses (status + body), so any host drives it. `docs/fleet.md`
//! states the guarantees and the protocol.
//!
//! - [`config`]: the `fleet` configuration object.
//! - [`levels`]: the priority levels' static limits at the fleet limit.
//! - [`allocation`]: the pure allocation function (fleet borrowing, split among replicas).
//! - [`record`]: a replica's record in etcd and the key layout.
//! - [`snapshot`]: every record under the prefix at one revision.
//! - The etcd v3 JSON API it speaks is etcd's own, shared with the in-memory etcd: [`crate::etcd`].
//! - [`claim`]: the claim protocol, the state machine a host drives ([`Fleet`]).
//! - [`feed`]: feeding a process's levels' demand to its [`Fleet`] and applying its limits
//!   ([`FleetFeed`]), shared by the gateway and the simulator.

pub mod allocation;
pub mod claim;
pub mod feed;
pub mod levels;
pub mod record;
pub mod snapshot;

/// The `fleet` object of the plugin configuration lives with the configuration
/// ([`crate::config::fleet`]); re-exported here, where the protocol uses it.
pub use crate::config::fleet as config;
pub use allocation::{allocate, Allocation, ReplicaDemand, WideNeed};
pub use claim::{EtcdCall, Fleet, FleetError, FleetMode};
pub use config::FleetConfig;
pub use feed::FleetFeed;
pub use levels::{FleetLevel, FleetPolicy};
