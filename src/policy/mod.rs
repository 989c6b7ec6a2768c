//! Policy: FlowSchema and PriorityLevelConfiguration objects in every served API version,
//! upstream defaulting and validation, Kubernetes' built-in configuration, and the plugin
//! configuration document that Envoy / Istio pass to the filter.
pub mod model;
