//! Open-watch limits at the gateway (`watchLimits`, [`crate::engine::watch_limits`]): a WATCH
//! takes a place for its flow and level when it arrives, before it asks for seats, and gives it
//! back when its stream ends (upstream end, client close, reset: [`super::Worker::stream_ended`]).
//! A WATCH beyond a limit is answered 429 with a Retry-After, as APF's own rejections
//! (`apf_filters.go: tooManyRequests`), and counted in `rejected_requests_total` with
//! `reason="watch-limit"`.

use super::host::{Host, StatKind};
use crate::classify::flow_hash;
use crate::engine::compiled::Digest;
use crate::engine::watch_limits::{self as limits, Exceeded, Limit, Place};
use crate::engine::Compiled;
use crate::observe::metrics::sanitize_label_value;
use crate::policy::model::Distinguisher;

/// The `reason` label (and `x-apf-reject-reason`) of a WATCH refused by a limit.
pub const WATCH_LIMIT: &str = "watch-limit";
/// The gauge of open watches per level: `apf_wasm_open_watches{priority_level}`.
pub const OPEN_WATCHES: &str = "apf_wasm_open_watches";

/// A digested request's flow: upstream's flow hash of its FlowSchema and distinguisher
/// (`hashFlowID`). The classifier only hashes for levels with several queues; for the others it
/// is computed here from the FlowSchema's distinguisher method.
pub fn flow_of(c: &Compiled, d: &Digest) -> u64 {
    if d.class.flow_hash != 0 {
        return d.class.flow_hash;
    }
    let Some(fs) = c.config.policy.flow_schemas.get(d.class.flow_schema) else { return 0 };
    let distinguisher = match fs.distinguisher {
        None => "",
        Some(Distinguisher::ByUser) => d.user.name.as_str(),
        Some(Distinguisher::ByNamespace) => d.info.namespace.as_str(),
    };
    flow_hash(&fs.name, distinguisher)
}

/// The place a WATCH takes and the limits it is under (`None`: not a watch, or `watchLimits`
/// is off). With limits configured every WATCH takes a place, limited or not, so that the gauge
/// and the dump show every level's open watches.
pub fn place_of(c: &Compiled, d: &Digest) -> Option<(Place, Limit)> {
    let wl = &c.config.watch_limits;
    if !d.is_watch || !wl.is_on() {
        return None;
    }
    let lvl = c.levels.get(d.class.priority_level)?;
    let limit = wl.for_level(&lvl.name, lvl.exempt);
    let fs = c.config.policy.flow_schemas.get(d.class.flow_schema).map(|f| f.name.clone()).unwrap_or_default();
    Some((Place { level: lvl.name.clone(), flow_schema: fs, flow_hash: flow_of(c, d) }, limit))
}

/// A refusal in words (logs, `apf classify`).
pub fn describe(over: Exceeded) -> String {
    match over {
        Exceeded::Flow { open, limit } => format!("its flow has {open} open watches (watchLimits.perFlow {limit})"),
        Exceeded::Level { open, limit } => format!("its priority level has {open} open watches (watchLimits.perLevel {limit})"),
    }
}

/// Sets `apf_wasm_open_watches{priority_level}` for every level of `c` (the same value from
/// every worker: the process's count). `ids` keeps the gauges' ids by level name.
pub fn export_gauges(h: &dyn Host, c: &Compiled, ids: &mut hashbrown::HashMap<String, Option<u32>>) {
    if !c.config.watch_limits.is_on() {
        return;
    }
    let Ok(places) = limits::read(h.store()) else { return };
    for lvl in &c.levels {
        let id = ids.entry(lvl.name.clone()).or_insert(None);
        if id.is_none() {
            *id = h.define_metric(StatKind::Gauge, &format!("{OPEN_WATCHES}.priority_level.{}", sanitize_label_value(&lvl.name)));
        }
        if let Some(id) = *id {
            h.record_metric(id, u64::from(places.of_level(&lvl.name)));
        }
    }
}
