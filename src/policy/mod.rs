//! Policy: FlowSchema and PriorityLevelConfiguration objects in every served API version,
//! upstream defaulting and validation, Kubernetes' built-in configuration, and the plugin
//! configuration document that Envoy / Istio pass to the filter.
//!
//! - `model`: the normalized, version-independent types the rest of the crate uses.
//! - `objects`: JSON parsing of the API objects (v1, v1beta3, v1beta2, v1beta1) + defaulting
//!   (`flowcontrol/*/types.go`, `pkg/apis/flowcontrol/v1*/defaults.go`).
//! - `validation`: upstream's validation rules and error wording
//!   (`pkg/apis/flowcontrol/validation/validation.go`).
//! - `bootstrap`: the built-in mandatory and suggested objects
//!   (`pkg/apis/flowcontrol/bootstrap/default.go`) and effective-policy assembly
//!   (`apf_controller.go: digestConfigObjects`).
//! - `config`: the plugin configuration document.
pub mod bootstrap;
pub mod cluster;
pub mod config;
pub mod model;
pub mod objects;
pub mod validation;

pub use bootstrap::{default_policy, effective_policy, policy_from_json, policy_from_value};
pub use config::{parse_plugin_config, PluginConfig, RequestMode};
