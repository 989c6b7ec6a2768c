//! The debug dumps of upstream's `/debug/api_priority_and_fairness/*` endpoints
//! (`apf_controller_debug.go`), built from the global shared state so every worker answers with the
//! whole gateway's view. Shared state keeps flow hashes and per-owner executing counts, not
//! requests' details: `docs/deviations.md` lists what the dumps show instead.

use super::{read_level, Compiled};
use crate::engine::store::Store;
use crate::fairqueuing::queueset::ExecutingByOwner;
use crate::observe::dumps::{self, PriorityLevelRow, QueueRow, RequestRow};
use crate::Nanos;
use std::fmt::Write as _;

/// At most this many queue rows per level (validation allows up to 10⁷ queues).
pub const MAX_QUEUE_ROWS: usize = 100_000;

pub const DEBUG_PREFIX: &str = "/debug/api_priority_and_fairness/";

/// Which dump a path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    PriorityLevels,
    Queues,
    Requests {
        details: bool,
    },
    /// Our own dump (not upstream's): the object counts LIST and WATCH costs come from.
    ObjectCounts,
    /// Our own dump: fleet mode's replicas, their demand, allocation and seats (JSON; rendered by
    /// the gateway from what its fleet driver publishes).
    Fleet,
    /// Our own dump: open watches under `watchLimits`, per level and the flows with most.
    Watches,
}

/// Parses `path?query` into a dump request, `None` if it is not a debug dump path.
pub fn dump_kind(path_and_query: &[u8]) -> Option<DumpKind> {
    let s = std::str::from_utf8(path_and_query).ok()?;
    let (path, query) = s.split_once('?').unwrap_or((s, ""));
    match path.strip_prefix(DEBUG_PREFIX)?.trim_end_matches('/') {
        "dump_priority_levels" => Some(DumpKind::PriorityLevels),
        "dump_queues" => Some(DumpKind::Queues),
        "dump_object_counts" => Some(DumpKind::ObjectCounts),
        "dump_fleet" => Some(DumpKind::Fleet),
        "dump_watches" => Some(DumpKind::Watches),
        "dump_requests" => {
            let on = |kv: &str| kv.strip_prefix("includeRequestDetails=").is_some_and(|v| !v.is_empty());
            Some(DumpKind::Requests { details: query.split('&').any(on) })
        }
        _ => None,
    }
}

/// Renders a dump at `now`. `to_unix` converts the engine's monotonic nanoseconds to Unix
/// nanoseconds.
pub fn render(c: &Compiled, store: &dyn Store, kind: DumpKind, now: Nanos, to_unix: &dyn Fn(Nanos) -> i64) -> String {
    if kind == DumpKind::ObjectCounts {
        return render_object_counts(c, store, now);
    }
    if kind == DumpKind::Watches {
        return render_watches(c, store);
    }
    let mut levels: Vec<_> = c.levels.iter().collect();
    levels.sort_by(|a, b| a.name.cmp(&b.name));
    let fs_name = |i: u16| c.config.policy.flow_schemas.get(usize::from(i)).map(|f| f.name.clone()).unwrap_or_default();
    let mut pl_rows = Vec::new();
    let mut q_rows = Vec::new();
    let mut r_rows = Vec::new();
    for lvl in levels {
        let st = read_level(store, &lvl.key).inspect_err(|e| log::warn!("apf: dump: {}: {e}", lvl.name));
        // A level no request has reached yet has no stored state: show it fresh.
        let Some(st) = st.ok().flatten().or_else(|| super::LevelState::new(lvl.qs_config, c.generation, 0).ok()) else { continue };
        let snap = st.qs.snapshot();
        let cnt = snap.counters;
        pl_rows.push(PriorityLevelRow {
            name: lvl.name.clone(),
            active_queues: snap.queues.iter().filter(|q| !q.waiting.is_empty()).count() as u64,
            is_idle: st.qs.is_idle(),
            waiting: u64::from(snap.requests_waiting),
            executing: u64::from(snap.requests_executing),
            dispatched: cnt.dispatched,
            rejected: cnt.rejected_queue_full + cnt.rejected_concurrency_limit + cnt.timed_out,
            cancelled: cnt.timed_out,
            ..Default::default()
        });
        // Upstream lists every queue; idle ones are not stored here, so they print as empty.
        let desired = usize::try_from(snap.desired_queues).unwrap_or(0).min(MAX_QUEUE_ROWS);
        let mut next_idle = 0usize;
        let idle_row = |i: usize| QueueRow {
            level: lvl.name.clone(),
            index: i as u64,
            next_dispatch_r: "0.00000000ss".into(),
            total_work_sum: "0.00000000ss".into(),
            ..Default::default()
        };
        for q in &snap.queues {
            let qi = q.index as usize;
            q_rows.extend((next_idle..qi.min(desired)).map(idle_row));
            next_idle = next_idle.max(qi + 1);
            q_rows.push(QueueRow {
                level: lvl.name.clone(),
                index: u64::from(q.index),
                pending: q.waiting.len() as u64,
                executing: u64::from(q.requests_executing),
                seats_in_use: q.seats_in_use,
                next_dispatch_r: q.next_dispatch_r.clone(),
                initial_seats_sum: q.initial_seats_sum,
                max_seats_sum: q.max_seats_sum,
                total_work_sum: q.total_work_sum.clone(),
            });
            r_rows.extend(q.waiting.iter().enumerate().map(|(i, w)| RequestRow {
                level: lvl.name.clone(),
                flow_schema: fs_name(w.flow_schema),
                queue_index: i64::from(q.index),
                index_in_queue: i as i64,
                flow_distinguisher: format!("hash:{:016x}", w.flow_hash),
                arrive_time_ns_unix: to_unix(w.arrival),
                initial_seats: u64::from(w.initial_seats),
                final_seats: u64::from(w.final_seats),
                additional_latency: crate::duration::format_go_duration(w.additional_latency),
                ..Default::default()
            }));
            push_exec_rows(&mut r_rows, &lvl.name, i64::from(q.index), &q.executing_by_owner);
        }
        q_rows.extend((next_idle..desired).map(idle_row));
        push_exec_rows(&mut r_rows, &lvl.name, -1, &snap.queueless_executing_by_owner);
    }
    match kind {
        // (ObjectCounts returned above.)
        DumpKind::PriorityLevels | DumpKind::ObjectCounts | DumpKind::Fleet | DumpKind::Watches => dumps::dump_priority_levels(&pl_rows),
        DumpKind::Queues => dumps::dump_queues(&q_rows),
        // Rows without details print empty detail columns.
        DumpKind::Requests { details } => dumps::dump_requests(&r_rows, details),
    }
}

/// Executing requests are not stored individually (their owners keep them), only counted per
/// owner: one row per executing request with what is known.
fn push_exec_rows(rows: &mut Vec<RequestRow>, level: &str, queue: i64, owners: &[ExecutingByOwner]) {
    for e in owners {
        let per = e.seats / u64::from(e.executing.max(1));
        let row = RequestRow {
            level: level.to_string(),
            queue_index: queue,
            index_in_queue: -1,
            flow_distinguisher: format!("worker:{}", e.owner),
            initial_seats: per,
            final_seats: per,
            additional_latency: "0s".to_string(),
            ..Default::default()
        };
        rows.extend(std::iter::repeat_n(row, e.executing.min(10_000) as usize));
    }
}

/// At most this many flows in the watches dump (those with most open watches).
pub const MAX_WATCH_FLOW_ROWS: usize = 100;

/// Open watches under `watchLimits`: every level's count and limit, then the flows with most
/// open watches (all workers of the process), with their limit.
pub fn render_watches(c: &Compiled, store: &dyn Store) -> String {
    let wl = &c.config.watch_limits;
    if !wl.is_on() {
        return "# watch limits: off (watchLimits)\n".to_string();
    }
    let places = super::watch_limits::read(store).inspect_err(|e| log::warn!("apf: dump: watches: {e}")).unwrap_or_default();
    let show = |n: Option<u32>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    let mut levels: Vec<_> = c.levels.iter().collect();
    levels.sort_by(|a, b| a.name.cmp(&b.name));
    let mut text = String::from("PriorityLevelName,\tOpenWatches,\tPerLevelLimit\n");
    for l in levels {
        let limit = wl.for_level(&l.name, l.exempt);
        let _ = writeln!(text, "{},\t{},\t{}", l.name, places.of_level(&l.name), show(limit.per_level));
    }
    let mut out = dumps::tabwrite(&text);
    let mut text = String::from("PriorityLevelName,\tFlowSchemaName,\tFlowDistinguisher,\tOpenWatches,\tPerFlowLimit\n");
    for (p, n) in places.flows().into_iter().take(MAX_WATCH_FLOW_ROWS) {
        let exempt = c.levels.iter().any(|l| l.name == p.level && l.exempt);
        let limit = wl.for_level(&p.level, exempt).per_flow;
        let _ = writeln!(text, "{},\t{},\thash:{:016x},\t{n},\t{}", p.level, p.flow_schema, p.flow_hash, show(limit));
    }
    out.push('\n');
    out.push_str(&dumps::tabwrite(&text));
    out
}

/// The object counts the work estimator uses: one row per resource of the configuration's
/// `objectCounts` table (`Source` table, which wins) and of the cluster's `/metrics` (`Source`
/// cluster, with the age of its last refresh and whether it is stale) and of those learned from
/// LIST responses (`Source` learned), then the polling state.
pub fn render_object_counts(c: &Compiled, store: &dyn Store, now: Nanos) -> String {
    let est = &c.config.work_estimator;
    let mut text = String::from("Resource,\tObjectCount,\tAverageObjectSizeBytes,\tSource,\tAgeSeconds,\tStale\n");
    for (k, v) in &est.object_counts {
        let (count, avg) = match v {
            crate::digest::work_estimate::ObjectCountEntry::Count(n) => (*n, est.default_average_object_size_bytes),
            crate::digest::work_estimate::ObjectCountEntry::Detailed(s) => (s.count, s.average_object_size_bytes),
        };
        text.push_str(&format!("{k},\t{count},\t{avg},\ttable,\t-,\tfalse\n"));
    }
    let shared = super::object_counts::read(store).inspect_err(|e| log::warn!("apf: dump: object counts: {e}"));
    let shared = shared.ok().and_then(|(s, _)| s);
    let stale_after = c.config.cluster_metrics.as_ref().map(|m| m.stale_after).unwrap_or(crate::policy::cluster::DEFAULT_STALE_AFTER);
    let secs = |t: Nanos| format!("{:.1}", now.saturating_sub(t) as f64 / 1e9);
    for (counts, source) in shared.iter().flat_map(|s| [(&s.tracker, "cluster"), (&s.learned, "learned")]) {
        for (k, st, at) in counts.entries() {
            let stale = source == "cluster" && now.saturating_sub(at) > stale_after;
            let _ = writeln!(text, "{k},\t{},\t{},\t{source},\t{},\t{stale}", st.count, st.average_object_size_bytes, secs(at));
        }
    }
    let mut out = dumps::tabwrite(&text);
    let Some(m) = &c.config.cluster_metrics else {
        out.push_str("# cluster metrics: off (workEstimator.clusterMetrics)\n");
        return out;
    };
    let go = crate::duration::format_go_duration;
    let _ = writeln!(
        out,
        "# cluster metrics: cluster {:?} path {:?} every {}, stale after {}",
        m.cluster,
        m.path,
        go(m.period),
        go(stale_after)
    );
    let Some(s) = &shared else {
        out.push_str("# no poll yet\n");
        return out;
    };
    if s.last_success > 0 {
        let _ = writeln!(out, "# last successful poll {}s ago", secs(s.last_success));
    } else {
        out.push_str("# no successful poll yet\n");
    }
    if s.consecutive_failures > 0 {
        let _ = writeln!(out, "# {} failed polls since, the last {}s ago: {}", s.consecutive_failures, secs(s.last_failure), s.last_error);
    }
    out
}
