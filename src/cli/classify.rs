//! `apf classify [--config FILE|-] --method M --path P [--user U] [--group G]... [--header 'N: v']...
//! [--peer IP] [--mtls] [--cert-subject S]`: classify one request as the filter would and print
//! one JSON object: matched FlowSchema and priority level, distinguisher, flow hash (decimal
//! string), the queues of its shuffle-sharded hand (`[]` when the level does not queue), the
//! parsed RequestInfo, the identity, the work estimate and the long-running verdict.
//!
//! `--user`/`--group` give an already-authenticated identity (groups as given plus
//! `system:authenticated`, and service-account groups for `system:serviceaccount:` names);
//! otherwise the configured identity sources run on the `--header`s (with `--peer`, `--mtls`,
//! `--cert-subject` as the connection facts). Mutating requests are estimated with 0 interested
//! watches (the CLI has no watch state). Exit 0 on success, 1 on configuration errors, 2 on
//! usage errors.
use std::io::{Read, Write};

use serde_json::json;

use crate::classify::Classifier;
use crate::digest::identity::{identify, IdentityInput, UserInfo};
use crate::digest::request_info::{parse_generic, parse_request_info};
use crate::digest::work_estimate::estimate;
use crate::fairqueuing::shuffle_sharding::Dealer;
use crate::policy::config::{parse_plugin_config, RequestMode};

const USAGE: &str = "usage: apf classify [--config FILE|-] --method M --path P [--user U] [--group G]... \
[--header 'Name: value']... [--peer IP] [--mtls] [--cert-subject SUBJECT]\n";

#[derive(Default)]
struct Args {
    config: Option<String>,
    method: Option<String>,
    path: Option<String>,
    user: Option<String>,
    groups: Vec<String>,
    headers: Vec<(String, Vec<u8>)>,
    peer: Option<std::net::IpAddr>,
    mtls: bool,
    cert_subject: Option<String>,
}

fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let takes_value = matches!(
            flag,
            "--config" | "-c" | "--method" | "--path" | "--user" | "--group" | "--header" | "--peer" | "--cert-subject"
        );
        let value = if takes_value {
            match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or_else(|| format!("{flag} needs a value"))?,
            }
        } else {
            String::new()
        };
        match flag {
            "--config" | "-c" => a.config = Some(value),
            "--method" => a.method = Some(value),
            "--path" => a.path = Some(value),
            "--user" => a.user = Some(value),
            "--group" => a.groups.push(value),
            "--header" => {
                let (n, v) = value.split_once(':').ok_or_else(|| format!("--header {value:?}: expected 'Name: value'"))?;
                let n = n.trim();
                if n.is_empty() {
                    return Err(format!("--header {value:?}: empty header name"));
                }
                a.headers.push((n.to_ascii_lowercase(), v.trim().as_bytes().to_vec()));
            }
            "--peer" => a.peer = Some(value.parse().map_err(|_| format!("--peer {value:?}: not an IP address"))?),
            "--cert-subject" => a.cert_subject = Some(value),
            "--mtls" => a.mtls = true,
            "-h" | "--help" => return Ok(None),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    if a.method.is_none() || a.path.is_none() {
        return Err("--method and --path are required".into());
    }
    if a.user.is_none() && !a.groups.is_empty() {
        return Err("--group needs --user".into());
    }
    Ok(Some(a))
}

fn read_config(path: Option<&str>) -> Result<Vec<u8>, String> {
    match path {
        None => Ok(Vec::new()),
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| format!("reading stdin: {e}"))?;
            Ok(buf)
        }
        Some(p) => std::fs::read(p).map_err(|e| format!("reading {p}: {e}")),
    }
}

pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let a = match parse_args(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            let _ = out.write_all(USAGE.as_bytes());
            return 0;
        }
        Err(e) => {
            let _ = write!(err, "apf classify: {e}\n{USAGE}");
            return 2;
        }
    };
    let bytes = match read_config(a.config.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "apf classify: {e}");
            return 1;
        }
    };
    let cfg = match parse_plugin_config(&bytes) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                let _ = writeln!(err, "{e}");
            }
            return 1;
        }
    };
    let method = a.method.unwrap_or_default();
    let path = a.path.unwrap_or_default();
    let info = match cfg.request_mode {
        RequestMode::Kubernetes => parse_request_info(&method, path.as_bytes()),
        RequestMode::Generic => {
            let ns = cfg
                .namespace_header
                .as_deref()
                .and_then(|h| a.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(h)))
                .map(|(_, v)| v.as_slice());
            parse_generic(&method, path.as_bytes(), ns)
        }
    };
    let user = match &a.user {
        Some(u) => UserInfo::authenticated(u, &a.groups),
        None => identify(
            &cfg.identity,
            &IdentityInput {
                headers: &a.headers,
                peer: a.peer,
                mtls: a.mtls,
                cert_subject: a.cert_subject.as_deref(),
                jwt_claims: None,
            },
        ),
    };
    let classifier = Classifier::new(&cfg.policy);
    let cl = classifier.classify(&info, &user);
    let fs_name = cfg.policy.flow_schemas.get(cl.flow_schema).map(|f| f.name.as_str()).unwrap_or("");
    let level = cfg.policy.priority_levels.get(cl.priority_level);
    let queues: Vec<u32> = match level.and_then(|l| l.queuing()) {
        Some(q) => match Dealer::new(q.queues, q.hand_size) {
            Ok(d) => {
                let mut hand = Vec::new();
                d.deal_into_hand(cl.flow_hash, &mut hand);
                hand
            }
            Err(_) => Vec::new(),
        },
        None => Vec::new(),
    };
    let max_seats = cfg.limits.get(cl.priority_level).and_then(|l| l.max_seats);
    let work = estimate(&cfg.work_estimator, &info, max_seats, 0);
    let doc = json!({
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
        "longRunning": info.is_long_running(),
    });
    match serde_json::to_string_pretty(&doc) {
        Ok(s) => {
            let _ = writeln!(out, "{s}");
            0
        }
        Err(e) => {
            let _ = writeln!(err, "apf classify: {e}");
            1
        }
    }
}
