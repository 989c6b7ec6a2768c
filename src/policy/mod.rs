//! Policy: FlowSchema and PriorityLevelConfiguration objects in every served API version,
//! upstream defaulting and validation, Kubernetes' built-in configuration, and the plugin
//! configuration document that Envoy / Istio pass to the filter.
pub mod bootstrap;
pub mod cluster;
pub mod config;
pub mod discovery;
pub mod fleet;
pub mod model;
pub mod objects;
pub mod validation;

pub use bootstrap::{default_policy, effective_policy, policy_from_json, policy_from_value};
pub use config::{parse_plugin_config, PluginConfig, RequestMode};
