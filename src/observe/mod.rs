//! Observability formatting, host-independent (upstream `pkg/util/flowcontrol/metrics/metrics.go`,
//! `apf_controller_debug.go`).
//!
//! - [`dumps`]: the text of upstream's `/debug/api_priority_and_fairness/dump_*` endpoints
//!   (rows joined by `",\t"` and aligned like Go's `text/tabwriter`), RFC3339Nano formatting.
//! - [`metrics`]: upstream metric names, label sets and buckets, and their mapping to flat
//!   Envoy stat names plus the Envoy `stats_tags` / Istio `proxyStatsMatcher` config that turns
//!   them back into Prometheus labels.
pub mod dumps;
pub mod metrics;
