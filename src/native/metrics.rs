//! Stats of the native host, under the wasm module's names.
//!
//! Envoy freezes stat creation once `on_http_filter_config_new` returns
//! (`filter_config.cc: newDynamicModuleHttpFilterConfig`), while label values stay free at run
//! time. So every family the gateway may use ([`stat_families`]) is defined, with its label keys,
//! in each configuration; the gateway's flat series names (`family.key.value…`) are parsed back
//! into (family, label values) when it defines a series. Envoy names a tagged stat
//! `family.key.value…` and exports it to Prometheus as `family{key="value",…}`: the same names
//! and labels as the wasm module (whose names are turned into tags by `envoy/stats_config.yaml`),
//! under the `dynamicmodulescustom.` namespace, which the admin endpoints strip as they strip
//! `wasmcustom.`.

use super::abi::{ConfigPtr, FilterPtr, GaugeOp};
use crate::gateway::host::StatKind;
use crate::gateway::stats::stat_families;
use hashbrown::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// A defined family: Envoy's id, kind and label keys.
struct Family {
    id: usize,
    kind: StatKind,
    labels: Vec<&'static str>,
}

fn families() -> &'static Mutex<HashMap<String, Family>> {
    static F: OnceLock<Mutex<HashMap<String, Family>>> = OnceLock::new();
    F.get_or_init(Mutex::default)
}

/// One series this worker defined: its family's id and kind, and its label values.
pub struct Series {
    family: usize,
    kind: StatKind,
    values: Vec<String>,
}

/// Every series any thread defined, by id: an id means the same series on every thread, so a
/// worker's pending deltas can be added by the main thread (`idle_stats`).
static SERIES: RwLock<Vec<Arc<Series>>> = RwLock::new(Vec::new());

/// Defines every family in the configuration being created (ids are positions in definition
/// order, so every configuration gives a family the same id).
pub fn define_families(c: ConfigPtr) {
    let Ok(mut known) = families().lock() else { return };
    for (kind, name, labels) in stat_families() {
        match c.define(kind == StatKind::Gauge, &name, &labels) {
            Ok(id) => match known.get(&name) {
                Some(f) if f.id != id => log::error!("apf: stat family {name} got id {id}, was {}", f.id),
                Some(_) => {}
                None => drop(known.insert(name, Family { id, kind, labels })),
            },
            Err(r) => log::warn!("apf: defining stat family {name} failed (metrics result {r})"),
        }
    }
}

/// Splits a flat series name into its family and label values (the family's keys, in order;
/// `le`, always last, may contain a dot).
fn parse<'a>(name: &'a str, known: &HashMap<String, Family>) -> Option<(&'a str, Vec<String>)> {
    let (family, rest) = name.split_once('.').unwrap_or((name, ""));
    let f = known.get(family)?;
    let mut values = Vec::with_capacity(f.labels.len());
    let mut rest = rest;
    for key in &f.labels {
        let (k, tail) = rest.split_once('.')?;
        if k != *key {
            return None;
        }
        let (v, next) = if k == "le" { (tail, "") } else { tail.split_once('.').unwrap_or((tail, "")) };
        values.push(v.to_string());
        rest = next;
    }
    rest.is_empty().then_some((family, values))
}

/// A series of the gateway: this worker's id for it.
pub fn define(kind: StatKind, name: &str) -> Option<u32> {
    let known = families().lock().ok()?;
    let Some((family, values)) = parse(name, &known) else {
        log::warn!("apf: no stat family for {name}");
        return None;
    };
    let f = known.get(family)?;
    debug_assert!(f.kind == kind, "stat {name} defined as {kind:?}, its family is {:?}", f.kind);
    let s = Series { family: f.id, kind: f.kind, values };
    drop(known);
    let mut all = SERIES.write().ok()?;
    all.push(Arc::new(s));
    u32::try_from(all.len() - 1).ok()
}

/// Runs `f` on the series `id` (the list's lock is not held across Envoy's calls).
fn with_series(id: u32, f: impl FnOnce(&Series)) {
    if let Some(s) = series(id) {
        f(&s);
    }
}

pub fn increment(filter: FilterPtr, id: u32, by: i64) {
    with_series(id, |s| add(filter, s, by));
}

/// The series `id`.
fn series(id: u32) -> Option<Arc<Series>> {
    SERIES.read().ok()?.get(usize::try_from(id).ok()?).cloned()
}

/// Adds `by` to the counter or gauge `s` (a counter only grows).
fn add(filter: FilterPtr, s: &Series, by: i64) {
    match s.kind {
        StatKind::Counter if by > 0 => {
            let _ = filter.increment_counter(s.family, &s.values, by.unsigned_abs());
        }
        StatKind::Counter => {}
        StatKind::Gauge => {
            let op = if by >= 0 { GaugeOp::Add } else { GaugeOp::Sub };
            let _ = filter.gauge(op, s.family, &s.values, by.unsigned_abs());
        }
    }
}

pub fn record(filter: FilterPtr, id: u32, value: u64) {
    with_series(id, |s| {
        let _ = filter.gauge(GaugeOp::Set, s.family, &s.values, value);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics::{self as names, MetricKind, METRICS};

    fn table() -> HashMap<String, Family> {
        stat_families().into_iter().enumerate().map(|(id, (kind, name, labels))| (name, Family { id, kind, labels })).collect()
    }

    #[test]
    fn every_series_the_gateway_names_parses_back_to_a_family() {
        let t = table();
        for spec in METRICS {
            let values: Vec<&str> = spec.labels.iter().map(|_| "v-1").collect();
            let series: Vec<String> = match spec.kind {
                MetricKind::Histogram => names::histogram_stat_names(spec, &values).unwrap().all().cloned().collect(),
                _ => vec![names::stat_name(spec, &values).unwrap()],
            };
            for s in series {
                let (family, got) = parse(&s, &t).unwrap_or_else(|| panic!("{s} has no family"));
                assert!(s.starts_with(family));
                assert_eq!(&got[..spec.labels.len()], &values[..], "{s}");
            }
        }
    }

    #[test]
    fn le_keeps_its_dot_and_label_order_is_checked() {
        let t = table();
        let s = "apiserver_flowcontrol_request_wait_duration_seconds_bucket.priority_level.a.flow_schema.b.execute.true.le.0.005";
        let (family, v) = parse(s, &t).unwrap();
        assert_eq!(family, "apiserver_flowcontrol_request_wait_duration_seconds_bucket");
        assert_eq!(v, ["a", "b", "true", "0.005"]);
        assert!(parse("apiserver_flowcontrol_dispatched_requests_total.flow_schema.b.priority_level.a", &t).is_none());
        assert!(parse("apiserver_flowcontrol_dispatched_requests_total.priority_level.a", &t).is_none(), "a label missing");
        assert!(parse("no_such_family", &t).is_none());
        let (f, v) = parse("apf_wasm_shared_state_writes_total", &t).unwrap();
        assert_eq!((f, v.len()), ("apf_wasm_shared_state_writes_total", 0));
        assert_eq!(parse("apf_wasm_open_watches.priority_level.x", &t).unwrap().1, ["x"]);
    }

    #[test]
    fn an_id_names_the_same_series_on_every_thread() {
        let name = "apf_wasm_test_family_total";
        families().lock().unwrap().insert(name.to_string(), Family { id: 77, kind: StatKind::Counter, labels: vec!["priority_level"] });
        let series_name = format!("{name}.priority_level.pl-1");
        let id = std::thread::spawn(move || define(StatKind::Counter, &series_name)).join().unwrap().unwrap();
        let s = series(id).expect("defined on another thread, found on this one");
        assert_eq!((s.family, s.kind, &s.values[..]), (77, StatKind::Counter, &["pl-1".to_string()][..]));
        let again = define(StatKind::Counter, &format!("{name}.priority_level.pl-2")).unwrap();
        assert_ne!(again, id, "every definition gets its own id");
    }
}
