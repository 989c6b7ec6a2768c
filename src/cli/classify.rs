//! `apf classify [--config FILE|-] --method M --path P [--user U] [--group G]... [--header 'N: v']...
//! [--peer IP] [--mtls] [--cert-subject S]`: classify one request as the filter would and print
//! one JSON object: matched FlowSchema and priority level, distinguisher, flow hash (decimal
//! string), the queues of its shuffle-sharded hand (`[]` when the level does not queue), the
//! parsed RequestInfo, the identity, the work estimate and the long-running verdict; with
//! `watchLimits` configured, the open-watch limits a WATCH is under (`watchLimit`).
//!
//! `--user`/`--group` give an already-authenticated identity (groups as given plus
//! `system:authenticated`, and service-account groups for `system:serviceaccount:` names);
//! otherwise the configured identity sources run on the `--header`s (with `--peer`, `--mtls`,
//! `--cert-subject` as the connection facts). Mutating requests are estimated with 0 interested
//! watches (the CLI has no watch state). Exit 0 on success, 1 on configuration errors, 2 on
//! usage errors.
//!
//! `--metrics FILE|-|http://HOST:PORT/PATH` costs LIST and WATCH requests with the object counts
//! and sizes a kube-apiserver publishes on `/metrics` (as the gateway's
//! `workEstimator.clusterMetrics` does): "what would this LIST cost in my cluster?". For a real
//! cluster: `kubectl get --raw /metrics | apf classify --metrics - ...` (kubectl authenticates;
//! `--token T` adds a bearer token to a plain-HTTP URL).
use std::io::Write;

use serde_json::json;

use super::{CliError, HttpError};
use crate::config::parse_plugin_config;
use crate::digest::identity::UserInfo;
use crate::digest::metrics_scan::{scan_metrics, ScrapedCounts};
use crate::digest::request_info::RequestInfo;
use crate::digest::work_estimate::{get_by_resource, StatsLookup};
use crate::engine::compiled::{Digest, RequestLine};
use crate::engine::object_counts::resource_key;
use crate::engine::Compiled;
use crate::fairqueuing::shuffle_sharding::Dealer;
use crate::gateway::offline::OneRequest;
use crate::gateway::request::digest_request;
use crate::gateway::watch_limits::place_of;

const USAGE: &str = "usage: apf classify [--config FILE|-] --method M --path P [--user U] [--group G]... \
[--header 'Name: value']... [--peer IP] [--mtls] [--cert-subject SUBJECT] \
[--metrics FILE|-|http://HOST:PORT/PATH [--token T]]\n";

/// The flags: the request, and where its configuration and object counts come from.
#[derive(Default)]
struct Args {
    req: ClassifyRequest,
    config: Option<String>,
    metrics: Option<String>,
    token: Option<String>,
}

fn parse_args(args: &[String]) -> Result<Option<Args>, CliError> {
    let mut a = Args::default();
    let (mut method, mut path) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let takes_value = matches!(
            flag,
            "--config"
                | "-c"
                | "--method"
                | "--path"
                | "--user"
                | "--group"
                | "--header"
                | "--peer"
                | "--cert-subject"
                | "--metrics"
                | "--token"
        );
        let value = match (takes_value, inline) {
            (false, _) => String::new(),
            (true, Some(v)) => v,
            (true, None) => it.next().cloned().ok_or_else(|| CliError::Usage(format!("{flag} needs a value")))?,
        };
        match flag {
            "--config" | "-c" => a.config = Some(value),
            "--method" => method = Some(value),
            "--path" => path = Some(value),
            "--user" => a.req.user = Some(value),
            "--group" => a.req.groups.push(value),
            "--header" => {
                let (n, v) = value.split_once(':').ok_or_else(|| CliError::Usage(format!("--header {value:?}: expected 'Name: value'")))?;
                let n = n.trim();
                if n.is_empty() {
                    return Err(CliError::Usage(format!("--header {value:?}: empty header name")));
                }
                a.req.headers.push((n.to_ascii_lowercase(), v.trim().as_bytes().to_vec()));
            }
            "--peer" => a.req.peer = Some(value.parse().map_err(|_| CliError::Usage(format!("--peer {value:?}: not an IP address")))?),
            "--cert-subject" => a.req.cert_subject = Some(value),
            "--metrics" => a.metrics = Some(value),
            "--token" => a.token = Some(value),
            "--mtls" => a.req.mtls = true,
            "-h" | "--help" => return Ok(None),
            _ => return Err(CliError::Usage(format!("unexpected argument {arg:?}"))),
        }
    }
    let (Some(method), Some(path)) = (method, path) else {
        return Err(CliError::Usage("--method and --path are required".into()));
    };
    (a.req.method, a.req.path) = (method, path);
    if a.req.user.is_none() && !a.req.groups.is_empty() {
        return Err(CliError::Usage("--group needs --user".into()));
    }
    if a.config.as_deref() == Some("-") && a.metrics.as_deref() == Some("-") {
        return Err(CliError::Usage("--config and --metrics cannot both read stdin".into()));
    }
    Ok(Some(a))
}

/// The body of `--metrics`: a file, stdin (`-`) or a plain-HTTP URL.
fn read_metrics(source: &str, token: Option<&str>) -> Result<Vec<u8>, CliError> {
    let metrics = |error| CliError::Metrics { source: source.to_string(), error: Box::new(error) };
    if let Some(rest) = source.strip_prefix("http://") {
        return http_get(rest, token).map_err(|e| metrics(CliError::Http(e)));
    }
    if source.starts_with("https://") {
        let why = "https is not supported here; use `kubectl get --raw /metrics | apf classify --metrics - ...`";
        return Err(metrics(CliError::Usage(why.to_string())));
    }
    super::read_input(Some(source))
}

/// A GET of `host:port/path` (default path `/metrics`).
fn http_get(host_path: &str, token: Option<&str>) -> Result<Vec<u8>, HttpError> {
    let (host, path) = host_path.find('/').map_or((host_path, "/metrics"), |i| host_path.split_at(i));
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.as_deref().map(|a| ("Authorization", a)).into_iter().chain([("Accept", "text/plain")]).collect();
    super::http::request(host, "GET", path, &headers, &[])
}

pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    super::report(classify(args), out, err)
}

pub(super) fn classify(args: &[String]) -> super::Outcome {
    fn fail(e: impl std::fmt::Display) -> (i32, String) {
        (1, format!("apf classify: {e}\n"))
    }
    let Some(mut a) = parse_args(args).map_err(|e| (2, format!("apf classify: {e}\n{USAGE}")))? else {
        return Ok(USAGE.to_string());
    };
    let bytes = super::read_input(a.config.as_deref()).map_err(fail)?;
    let cfg = parse_plugin_config(&bytes).map_err(|errors| (1, errors.iter().map(|e| format!("{e}\n")).collect()))?;
    if let Some(m) = &a.metrics {
        let scraped = scan_metrics(&read_metrics(m, a.token.as_deref()).map_err(fail)?);
        if scraped.samples == 0 {
            let e = "--metrics: no apiserver_resource_objects or apiserver_storage_objects sample found";
            return Err(fail(e));
        }
        a.req.metrics = Some(scraped);
    }
    let doc = serde_json::to_string_pretty(&classify_request(&Compiled::new(cfg, 0), &a.req)).map_err(fail)?;
    Ok(format!("{doc}\n"))
}

/// One request to classify: what the CLI's flags give.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassifyRequest {
    pub method: String,
    /// Path with optional query.
    pub path: String,
    /// An already-authenticated user (`--user`); `None` runs the configured identity sources.
    pub user: Option<String>,
    pub groups: Vec<String>,
    /// Lowercase header names.
    pub headers: Vec<(String, Vec<u8>)>,
    pub peer: Option<std::net::IpAddr>,
    pub mtls: bool,
    pub cert_subject: Option<String>,
    /// Object counts read from a kube-apiserver's `/metrics` (`--metrics`).
    pub metrics: Option<ScrapedCounts>,
}

/// The `apf classify` decision for one request under a valid configuration, as JSON (the
/// document the CLI prints; also used by the browser playground). The request is digested by
/// the filter's own pipeline ([`digest_request`], over a host holding just this request), or
/// for an already-authenticated `user` by the same digest without the identity sources.
pub fn classify_request(c: &Compiled, req: &ClassifyRequest) -> serde_json::Value {
    let cfg = &c.config;
    let d = digest_of(c, req);
    let watch_limit = cfg.watch_limits.is_on().then(|| watch_limit(c, &d));
    let (info, user, cl, work, stats) = (d.info, d.user, d.class, d.work, d.stats);
    let fs_name = cfg.policy.flow_schemas.get(cl.flow_schema).map(|f| f.name.as_str()).unwrap_or("");
    let level = cfg.policy.priority_levels.get(cl.priority_level);
    let mut queues = Vec::new();
    if let Some(d) = level.and_then(|l| l.queuing()).and_then(|q| Dealer::new(q.queues, q.hand_size).ok()) {
        d.deal_into_hand(cl.flow_hash, &mut queues);
    }
    let counts = stats.map(|st| object_counts(c, &info, st));
    let mut doc = json!({
        "flowSchema": fs_name,
        "priorityLevel": level.map(|l| l.name.as_str()).unwrap_or(""),
        "distinguisher": cl.distinguisher,
        "flowHash": cl.flow_hash.to_string(),
        "queues": queues,
        "requestInfo": {
            "isResourceRequest": info.is_resource_request,
            "verb": info.verb,
            "apiGroup": info.api_group,
            "apiVersion": info.api_version,
            "namespace": info.namespace,
            "resource": info.resource,
            "subresource": info.subresource,
            "name": info.name,
        },
        "user": { "name": user.name, "groups": user.groups },
        "seats": {
            "initial": work.initial_seats,
            "final": work.final_seats,
            "additionalLatencyMs": work.additional_latency as f64 / 1e6,
        },
        "objectCounts": counts,
        "longRunning": info.is_long_running(),
    });
    if let (Some(w), Some(m)) = (watch_limit, doc.as_object_mut()) {
        m.insert("watchLimit".into(), w);
    }
    doc
}

/// The request's digest: by the filter's pipeline over a host holding just this request, or
/// for an already-authenticated `user` without the identity sources. Object counts come from
/// `--metrics`; mutating requests are estimated with no open watches (the gateway counts its
/// own).
fn digest_of(c: &Compiled, req: &ClassifyRequest) -> Digest {
    let cfg = &c.config;
    let cluster = |group: &str, resource: &str| {
        let found = req.metrics.as_ref().and_then(|m| get_by_resource(&m.entries, group, resource));
        found.map_or(StatsLookup::NotFound, |s| StatsLookup::Found(*s))
    };
    match &req.user {
        Some(u) => {
            let ns = cfg.namespace_header.as_deref().and_then(|h| req.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(h)));
            let user = UserInfo::authenticated(u, &req.groups);
            let line =
                RequestLine { method: req.method.as_bytes(), path: req.path.as_bytes(), namespace_header: ns.map(|(_, v)| v.as_slice()) };
            c.digest_for(line, user, |_| 0, &cluster)
        }
        None => {
            let mut host = OneRequest::new(&req.method, &req.path, &req.headers);
            if let Some(peer) = req.peer {
                // `source.address` as Envoy gives it: `ip:port` (`[v6]:port`).
                host = host.property("source.address", std::net::SocketAddr::new(peer, 0).to_string().as_bytes());
            }
            host = host.property("connection.mtls", &[u8::from(req.mtls)]);
            if let Some(subject) = &req.cert_subject {
                host = host.property("connection.subject_peer_certificate", subject.as_bytes());
            }
            digest_request(&host, c, &cluster).digest
        }
    }
}

/// The `objectCounts` entry of a LIST or WATCH: the resource's count and average size as the
/// work estimate saw them (`st`), and where they came from.
fn object_counts(c: &Compiled, info: &RequestInfo, st: StatsLookup) -> serde_json::Value {
    let key = resource_key(&info.api_group, &info.resource);
    let source = if c.config.work_estimator.stats(&info.api_group, &info.resource) != StatsLookup::NotFound {
        "objectCounts table"
    } else if matches!(st, StatsLookup::Found(_)) {
        "cluster metrics"
    } else {
        "none (1 seat, as upstream for a resource without counts)"
    };
    match st {
        StatsLookup::Found(s) => {
            json!({"resource": key, "count": s.count, "averageObjectSizeBytes": s.average_object_size_bytes, "source": source})
        }
        _ => json!({"resource": key, "source": source}),
    }
}

/// The open-watch limits a request is under (`watchLimits` configured): for a WATCH, the
/// per-flow and per-level limits of its flow (the flow hash counted, which also covers levels
/// that do not shuffle-shard); otherwise why none applies. The CLI has no open watches.
fn watch_limit(c: &Compiled, d: &Digest) -> serde_json::Value {
    if !d.is_watch {
        return json!({"applies": false, "why": "not a WATCH"});
    }
    match place_of(c, d).filter(|(_, limit)| limit.is_some()) {
        Some((place, limit)) => json!({
            "applies": true,
            "perFlow": limit.per_flow,
            "perLevel": limit.per_level,
            "flowHash": place.flow_hash.to_string(),
            "why": "a WATCH beyond a limit of its flow or priority level is answered 429 (reason watch-limit) until one closes",
        }),
        None => {
            json!({"applies": false, "why": "no watchLimits entry applies to its priority level (perFlow does not apply to exempt levels)"})
        }
    }
}
