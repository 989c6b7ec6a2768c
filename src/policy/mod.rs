//! Policy: FlowSchema and PriorityLevelConfiguration objects in every served API version,
//! upstream defaulting and validation, Kubernetes' built-in configuration, and the policy's
//! sources in the cluster (`clusterPolicy`, served-version discovery).
pub mod bootstrap;
pub mod cluster;
pub mod discovery;
pub mod error;
pub mod model;
pub mod objects;
pub mod validation;

pub use bootstrap::{default_policy, effective_policy, policy_from_json, policy_from_value};
