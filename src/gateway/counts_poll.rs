//! The poll of the cluster's object counts (`workEstimator.clusterMetrics`): one worker of the
//! process claims each poll of the cluster's `/metrics` in shared data, scans the reply in
//! pieces and records the counts there; every worker re-reads them into its own copy.

use super::host::{call_status, call_timeout, describe_status, Body, CallError, Host, PollTarget};
use super::stats::Own;
use super::worker::Worker;
use crate::config::PluginConfig;
use crate::digest::metrics_scan::{MetricsScanner, ScrapedCounts};
use crate::engine;
use crate::policy::cluster::ClusterMetrics;
use crate::Nanos;
use std::time::Duration;

/// How often a worker re-reads the shared object counts.
const COUNTS_READ_EVERY: Nanos = 250_000_000;
/// The `/metrics` response is read from the host in pieces of this size.
const METRICS_READ_CHUNK: usize = 1 << 20;

/// The poll of the cluster's `/metrics` a root has under way.
#[derive(Default)]
pub struct CountsPoll {
    call: Option<u32>,
}

/// Why a poll of the object counts failed.
enum CountsFailure {
    /// The host did not start the call.
    Call { cluster: String, error: CallError },
    /// Not `200` (`None`: no response).
    Status(Option<u16>),
    /// The response holds none of the object-count metrics.
    NoSamples,
}

impl std::fmt::Display for CountsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountsFailure::Call { cluster, error } => write!(f, "cannot call cluster {cluster:?}: {error}"),
            CountsFailure::Status(status) => f.write_str(&describe_status(*status)),
            CountsFailure::NoSamples => f.write_str("no apiserver_resource_objects or apiserver_storage_objects sample in the response"),
        }
    }
}

impl CountsPoll {
    /// Keeps this worker's copy of the cluster's object counts fresh and, when the next poll of
    /// the cluster's `/metrics` is due, claims it (one worker polls for all) and starts it.
    pub fn maybe_start(&mut self, h: &dyn Host, w: &mut Worker, config: &PluginConfig, now: Nanos) {
        refresh_if_due(h, w, config, now);
        let Some(cm) = config.cluster_metrics.as_ref() else { return };
        if self.call.is_some() || w.counts().is_some_and(|s| now < s.next_poll) {
            return;
        }
        match engine::object_counts::claim(h.store(), now, w.instance(), cm.timeout) {
            Ok(true) => {}
            Ok(false) => return w.refresh_counts(h, now),
            Err(e) => return log::warn!("apf: claiming the object counts poll failed: {e}"),
        }
        let timeout = call_timeout(cm.timeout, Duration::from_secs(10));
        let target = PollTarget { cluster: &cm.cluster, authority: &cm.authority, token: cm.token.as_ref(), timeout };
        match target.get(h, &cm.path, "text/plain") {
            Ok(t) => self.call = Some(t),
            Err(error) => record(h, w, cm, Err(CountsFailure::Call { cluster: cm.cluster.clone(), error })),
        }
    }

    /// The reply of an HTTP call: false if it is not this poll's. The `/metrics` response is
    /// scanned in pieces (only the three metrics' lines are kept).
    pub fn on_response(&mut self, h: &dyn Host, w: &mut Worker, config: Option<&PluginConfig>, token: u32, body_size: usize) -> bool {
        if self.call.take_if(|t| *t == token).is_none() {
            return false;
        }
        let Some(cm) = config.and_then(|c| c.cluster_metrics.as_ref()) else { return true };
        match call_status(h) {
            Some(200) => {}
            status => {
                record(h, w, cm, Err(CountsFailure::Status(status)));
                return true;
            }
        }
        let mut scanner = MetricsScanner::new();
        for at in (0..body_size).step_by(METRICS_READ_CHUNK) {
            let chunk = h.body_bytes(Body::CallResponse, at, METRICS_READ_CHUNK.min(body_size.saturating_sub(at)));
            let Some(chunk) = chunk.filter(|c| !c.is_empty()) else { break };
            scanner.feed(&chunk);
        }
        let scraped = scanner.finish();
        if scraped.samples == 0 {
            record(h, w, cm, Err(CountsFailure::NoSamples));
            return true;
        }
        if scraped.malformed > 0 {
            log::warn!("apf: {} malformed object count lines in the cluster's metrics", scraped.malformed);
        }
        record(h, w, cm, Ok(scraped));
        true
    }
}

/// Re-reads the shared object counts into this worker's copy when the configuration uses them
/// and the copy is older than the re-read period.
pub fn refresh_if_due(h: &dyn Host, w: &mut Worker, config: &PluginConfig, now: Nanos) {
    if uses_counts(config) {
        w.refresh_counts_every(h, now, COUNTS_READ_EVERY);
    }
}

/// Whether the configuration estimates work from the cluster's object counts.
pub fn uses_counts(config: &PluginConfig) -> bool {
    config.work_estimator.learn_from_responses || config.cluster_metrics.is_some()
}

/// Records a poll's outcome in shared data (a failure keeps the last counts in use) and
/// re-reads the counts.
fn record(h: &dyn Host, w: &mut Worker, cm: &ClusterMetrics, outcome: Result<ScrapedCounts, CountsFailure>) {
    let now = h.monotonic_nanos();
    let outcome = outcome.as_ref().map_err(ToString::to_string);
    match &outcome {
        Ok(s) => {
            log::debug!("apf: object counts of {} resources read from the cluster", s.entries.len());
            w.stats().count_own(Own::CountsRefreshes);
        }
        Err(why) => {
            let stale_after = crate::duration::format_go_duration(cm.stale_after);
            log::warn!(
                "apf: reading object counts from the cluster's {} failed: {why}; the last counts stay in use (stale after {stale_after})",
                cm.path
            );
            w.stats().count_own(Own::CountsRefreshFailures);
        }
    }
    match engine::object_counts::record(h.store(), now, cm.period, outcome.as_ref().map_err(String::as_str).copied()) {
        Ok(_) => w.refresh_counts(h, now),
        Err(e) => log::warn!("apf: storing the object counts failed: {e}"),
    }
}
