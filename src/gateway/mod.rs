//! The gateway: what the filter does with every request, timer tick and poll, as core code over
//! a small host interface ([`host::Host`]). The proxy-wasm filter (`src/filter`) implements the
//! interface for Envoy and forwards its callbacks here; native tests drive the very same code
//! through a mock host.
//!
//! - [`host`]: the host interface and the host's header-map serialization.
//! - [`worker`]: one worker's state — lease, mailbox, its requests, watches, stats — owned by the
//!   host and handed to every callback.
//! - [`request`]: one stream: digest, classify, admit / queue / reject, release when the
//!   upstream's response ends.
//! - [`root`]: one configuration: apply it, run the timer (expiry, borrowing, leases, polls,
//!   stats) and the mailbox, and route HTTP call replies.
//! - [`cluster_policy`]: the policy read from the cluster (`clusterPolicy`), with the served
//!   version's discovery.
//! - [`policy_source`]: the cluster's policy shared by the roots of one configuration (hosts
//!   whose workers share memory: one reads the cluster, the others adopt what it applied).
//! - [`counts_poll`]: the poll of the cluster's object counts (`clusterMetrics`).
//! - [`watch_limits`]: the open-watch limits (`watchLimits`): a WATCH's place, its refusal.
//! - [`stats`]: upstream's metrics and the gateway's own, as host stats.
//! - [`fleet`]: fleet mode — one worker per process holds the driver role and drives the
//!   fleet's etcd protocol ([`fleet::FleetRole`], held by the worker).
//! - [`offline`]: a host for one request outside a proxy (`apf classify`, the playground).
//!
//! Every worker shares one set of seats and queues per level in the host's store; whoever frees
//! seats dispatches by fair queuing, and a dispatched request owned by another worker is woken
//! through that worker's mailbox, because only the owning worker can resume a paused stream.

pub mod cluster_policy;
pub mod counts_poll;
pub mod fleet;
pub mod host;
pub mod offline;
pub mod policy_source;
pub mod request;
pub mod root;
pub mod stats;
pub mod watch_limits;
pub mod worker;

pub use host::{Action, Host};
pub use request::Request;
pub use root::Root;
pub use worker::Worker;
