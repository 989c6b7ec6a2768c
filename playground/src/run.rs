//! Classification and simulation: thin wrappers over the code behind `apf classify`
//! ([`apf_wasm::cli::classify::classify_request`]) and `apf simulate`
//! ([`apf_wasm::simulate::run_scenario_traced`]).
use serde_json::{json, Map, Value};

use apf_wasm::cli::classify::{classify_request, ClassifyRequest};
use apf_wasm::duration::parse_go_duration;
use apf_wasm::simulate::{fair_alloc, run_scenario_traced, SeatTrace};
use apf_wasm::{Nanos, NANOS_PER_SEC};

use crate::parse_config;

/// Number of time bins of the seats-per-client series.
pub const SERIES_BINS: usize = 300;

fn fail(errors: Vec<String>) -> Value {
    json!({ "ok": false, "errors": errors })
}

fn str_field(m: &Map<String, Value>, key: &str, errs: &mut Vec<String>) -> Option<String> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            errs.push(format!("request.{key}: expected a string"));
            None
        }
    }
}

/// The request form as JSON: `{"method","path","user","groups":[…],"headers":{"name":"value"}}`
/// (`headers` may also be an array of `"Name: value"` strings).
fn parse_request(text: &str) -> Result<ClassifyRequest, Vec<String>> {
    let v: Value = serde_json::from_str(text).map_err(|e| vec![format!("request: invalid JSON: {e}")])?;
    let Value::Object(m) = v else {
        return Err(vec!["request: expected a JSON object".to_string()]);
    };
    let mut errs = Vec::new();
    let method = str_field(&m, "method", &mut errs).unwrap_or_else(|| "GET".to_string());
    let path = str_field(&m, "path", &mut errs).unwrap_or_default();
    if path.is_empty() {
        errs.push("request.path: Required value".to_string());
    }
    let user = str_field(&m, "user", &mut errs).filter(|u| !u.is_empty());
    let mut groups = Vec::new();
    match m.get("groups") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for g in a {
                match g.as_str() {
                    Some(g) if !g.is_empty() => groups.push(g.to_string()),
                    Some(_) => {}
                    None => errs.push("request.groups: expected strings".to_string()),
                }
            }
        }
        Some(_) => errs.push("request.groups: expected an array of strings".to_string()),
    }
    let mut headers = Vec::new();
    match m.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(h)) => {
            for (k, v) in h {
                match v.as_str() {
                    Some(v) => headers.push((k.to_ascii_lowercase(), v.as_bytes().to_vec())),
                    None => errs.push(format!("request.headers.{k}: expected a string")),
                }
            }
        }
        Some(Value::Array(a)) => {
            for h in a {
                match h.as_str().and_then(|h| h.split_once(':')) {
                    Some((n, v)) if !n.trim().is_empty() => {
                        headers.push((n.trim().to_ascii_lowercase(), v.trim().as_bytes().to_vec()));
                    }
                    _ => errs.push(format!("request.headers: expected \"Name: value\", got {h}")),
                }
            }
        }
        Some(_) => errs.push("request.headers: expected an object or an array".to_string()),
    }
    if !groups.is_empty() && user.is_none() {
        errs.push("request.groups: groups need a user".to_string());
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(ClassifyRequest { method, path, user, groups, headers, ..ClassifyRequest::default() })
}

/// `apf classify` for one request under a configuration (the editor text, see
/// [`crate::normalize_config`]): the CLI's JSON document, or `{ok: false, errors}`.
pub fn classify_value(config: &str, request: &str) -> Value {
    let cfg = match parse_config(config) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match parse_request(request) {
        Ok(req) => classify_request(&apf_wasm::engine::Compiled::new(cfg, 0), &req),
        Err(e) => fail(e),
    }
}

fn duration(v: Option<&Value>) -> Option<Nanos> {
    match v? {
        Value::String(s) => parse_go_duration(s).ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn int(v: Option<&Value>, default: i64) -> i64 {
    v.and_then(Value::as_i64).unwrap_or(default)
}

/// Each client's seat demand in the two halves of the evaluation window, as the upstream
/// harness computes the expected share (reference §10.2): `threads × initialSeats × exec /
/// (exec + think)`, split clients with half their threads in the first half.
fn demands(scenario: &Value) -> Vec<[f64; 2]> {
    let clients = scenario.get("clients").and_then(Value::as_array).cloned().unwrap_or_default();
    clients
        .iter()
        .map(|c| {
            let threads = int(c.get("threads"), 0) as f64;
            let seats = int(c.get("initialSeats"), 1) as f64;
            let exec = duration(c.get("exec")).unwrap_or(0) as f64;
            let think = duration(c.get("think")).unwrap_or(0) as f64;
            let busy = if exec + think > 0.0 { exec / (exec + think) } else { 1.0 };
            let full = threads * seats * busy;
            let split = c.get("split").and_then(Value::as_bool).unwrap_or(false);
            let first = if split { (int(c.get("threads"), 0) / 2) as f64 * seats * busy } else { full };
            [first, full]
        })
        .collect()
}

/// Time-weighted average executing seats of each client in `bins` equal bins of
/// `[start, eval_end]`; returns (bin edges in seconds from the start, per-client values).
pub fn binned_series(trace: &SeatTrace, clients: usize, bins: usize) -> (Vec<f64>, Vec<Vec<f64>>) {
    let span = trace.eval_end.saturating_sub(trace.start).max(1);
    let bins = bins.max(1);
    let edge = |k: usize| -> Nanos { trace.start + ((span as i128) * (k as i128) / (bins as i128)) as Nanos };
    let edges: Vec<f64> = (0..=bins).map(|k| (edge(k) - trace.start) as f64 / NANOS_PER_SEC as f64).collect();
    let mut area = vec![vec![0i128; bins]; clients];
    let mut seats = vec![0i64; clients];
    let mut last = vec![trace.start; clients];
    // Adds `s` seats held over [from, to) to the bins it overlaps.
    let add = |row: &mut Vec<i128>, from: Nanos, to: Nanos, s: i64| {
        if s == 0 || to <= from {
            return;
        }
        let first = (((from - trace.start) as i128) * bins as i128 / span as i128) as usize;
        for (k, cell) in row.iter_mut().enumerate().skip(first) {
            let (a, b) = (edge(k), edge(k + 1));
            if a >= to {
                break;
            }
            let lo = from.max(a);
            let hi = to.min(b);
            if hi > lo {
                *cell += s as i128 * (hi - lo) as i128;
            }
        }
    };
    for ch in &trace.changes {
        let i = ch.client as usize;
        let t = ch.t.clamp(trace.start, trace.eval_end);
        if let (Some(row), Some(s), Some(l)) = (area.get_mut(i), seats.get_mut(i), last.get_mut(i)) {
            add(row, *l, t, *s);
            *l = t;
            *s = ch.seats;
        }
    }
    for i in 0..clients {
        if let (Some(row), Some(s), Some(l)) = (area.get_mut(i), seats.get(i), last.get(i)) {
            add(row, *l, trace.eval_end, *s);
        }
    }
    let values = area
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .map(|(k, a)| {
                    let w = (edge(k + 1) - edge(k)).max(1);
                    (*a as f64) / (w as f64)
                })
                .collect()
        })
        .collect();
    (edges, values)
}

/// `apf simulate` for one scenario, plus `series`: each client's executing seats over the
/// evaluation window (time-weighted averages in [`SERIES_BINS`] bins), the level's limit and
/// each client's fair share per half (upstream `fairAlloc` of the demands, §10.2).
pub fn simulate_value(scenario: &str) -> Value {
    let (result, trace) = match run_scenario_traced(scenario.as_bytes()) {
        Ok(r) => r,
        Err(e) => return fail(vec![e.to_string()]),
    };
    let mut out = match serde_json::to_value(&result) {
        Ok(v) => v,
        Err(e) => return fail(vec![e.to_string()]),
    };
    let sc: Value = serde_json::from_str(scenario).unwrap_or(Value::Null);
    let n = result.clients.len();
    let (t, values) = binned_series(&trace, n, SERIES_BINS);
    let dem = demands(&sc);
    let exempt = sc.pointer("/priorityLevel/exempt").and_then(Value::as_bool).unwrap_or(false);
    let cap = f64::from(trace.concurrency_limit);
    let halves: Vec<Vec<f64>> = (0..2)
        .map(|h| {
            let d: Vec<f64> = dem.iter().map(|x| x.get(h).copied().unwrap_or(0.0)).collect();
            if exempt {
                d
            } else {
                fair_alloc(&d, cap)
            }
        })
        .collect();
    let hashes: Vec<String> = sc
        .get("clients")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|c| c.get("hash").map(|h| h.to_string().replace('"', "")).unwrap_or_default()).collect())
        .unwrap_or_default();
    let clients: Vec<Value> = values
        .into_iter()
        .enumerate()
        .map(|(i, seats)| {
            let share = |h: usize| halves.get(h).and_then(|v| v.get(i)).copied().unwrap_or(0.0);
            let demand = dem.get(i).copied().unwrap_or([0.0, 0.0]);
            json!({
                "name": format!("client {i}"),
                "hash": hashes.get(i).cloned().unwrap_or_default(),
                "seats": seats,
                "demand": demand,
                "fairShare": [share(0), share(1)],
            })
        })
        .collect();
    if let Value::Object(m) = &mut out {
        m.insert(
            "series".into(),
            json!({
                "limit": trace.concurrency_limit,
                "exempt": exempt,
                "t": t,
                "clients": clients,
            }),
        );
    }
    out
}

/// An example scenario: three tenants share a priority level of 8 seats (64 queues, hand 6,
/// as `workload-high`): a greedy one with 10 busy threads, a light one, and one that doubles
/// its load half way through.
pub fn default_scenario_value() -> Value {
    json!({
        "priorityLevel": { "concurrencyLimit": 8, "queues": 64, "queueLengthLimit": 50, "handSize": 6 },
        "evalDuration": "30s",
        "clients": [
            { "hash": "1001001001", "threads": 10, "calls": 30, "exec": "1s", "think": "0s" },
            { "hash": "2002002002", "threads": 3, "calls": 15, "exec": "1s", "think": "1s" },
            { "hash": "3003003003", "threads": 6, "calls": 30, "exec": "1s", "think": "0s", "split": true }
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_a_kubelet_into_node_high_with_a_hand() {
        let req = r#"{"method":"GET","path":"/api/v1/nodes/node-1","user":"system:node:node-1","groups":["system:nodes"]}"#;
        let v = classify_value(&crate::default_config(), req);
        assert_eq!(v["flowSchema"], "system-node-high", "{v}");
        assert_eq!(v["priorityLevel"], "node-high");
        assert_eq!(v["distinguisher"], "system:node:node-1");
        assert_eq!(v["queues"].as_array().unwrap().len(), 6);
        assert_eq!(v["seats"]["initial"], 1);
        // The same document as `apf classify` prints.
        let mut out = Vec::new();
        let mut err = Vec::new();
        let args: Vec<String> = ["--method", "GET", "--path", "/api/v1/nodes/node-1", "--user", "system:node:node-1", "--group", "system:nodes"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(apf_wasm::cli::classify::run(&args, &mut out, &mut err), 0);
        let cli: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(cli, v);
    }

    #[test]
    fn classify_reports_config_and_request_errors() {
        let v = classify_value("[{\"kind\":\"FlowSchema\"}]", r#"{"method":"GET","path":"/"}"#);
        assert_eq!(v["ok"], false);
        let v = classify_value("", r#"{"method":"GET"}"#);
        assert!(v["errors"][0].as_str().unwrap().contains("request.path"), "{v}");
        let v = classify_value("", "nope");
        assert_eq!(v["ok"], false);
        // Anonymous requests run the identity sources (none configured: anonymous).
        let v = classify_value("", r#"{"method":"GET","path":"/healthz"}"#);
        assert_eq!(v["flowSchema"], "probes", "{v}");
    }

    #[test]
    fn simulation_series_matches_the_averages_and_fair_shares() {
        let sc = default_scenario_value().to_string();
        let v = simulate_value(&sc);
        let series = &v["series"];
        assert_eq!(series["limit"], 8);
        let t = series["t"].as_array().unwrap();
        assert_eq!(t.len(), SERIES_BINS + 1);
        assert_eq!(t.last().unwrap().as_f64(), Some(30.0));
        let clients = series["clients"].as_array().unwrap();
        assert_eq!(clients.len(), 3);
        for (i, c) in clients.iter().enumerate() {
            let seats: Vec<f64> = c["seats"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let mean = seats.iter().sum::<f64>() / seats.len() as f64;
            let avg = v["clients"][i]["averageSeats"].as_f64().unwrap();
            assert!((mean - avg).abs() < 1e-9, "client {i}: {mean} vs {avg}");
            assert!(seats.iter().all(|s| *s <= 8.0 + 1e-9));
        }
        // fairAlloc([10, 1.5, 3], 8) = [3.5, 1.5, 3]; second half ([10, 1.5, 6], 8) = [3.25, 1.5, 3.25].
        let shares: Vec<Value> = clients.iter().map(|c| c["fairShare"].clone()).collect();
        assert_eq!(shares, vec![json!([3.5, 3.25]), json!([1.5, 1.5]), json!([3.0, 3.25])]);
        assert_eq!(clients[0]["hash"], "1001001001");
    }

    #[test]
    fn simulation_errors_are_reported() {
        let v = simulate_value("{}");
        assert_eq!(v["ok"], false);
        assert!(v["errors"][0].as_str().unwrap().contains("scenario"), "{v}");
    }
}
