//! Observability formatting, host-independent: upstream's debug dumps ([`dumps`]) and metrics
//! with their Envoy stat names ([`metrics`]).
pub mod dumps;
pub mod metric_error;
pub mod metrics;
