//! `apf fleet --etcd http://HOST:PORT [--prefix P] [--name N]`: the fleet's state as etcd holds
//! it — every replica's record (its demand, claims, granted seats and seats in use per level)
//! and the allocation every replica computes from them — as JSON with a top-level `replicas`
//! array. Reads etcd's JSON API directly (plain HTTP; for TLS, a local `etcdctl`-style proxy).

use crate::etcd::{RangeRequest, RangeResponse};
use crate::fleet::snapshot::Snapshot;
use serde_json::{json, Value};

const USAGE: &str = "usage: apf fleet --etcd http://HOST:PORT [--prefix /apf-wasm/] [--name default]\n";

pub(super) fn fleet(args: &[String]) -> super::Outcome {
    let (mut etcd, mut prefix, mut name) = (None, "/apf-wasm/".to_string(), "default".to_string());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| (2, format!("apf fleet: {a} needs a value\n{USAGE}")));
        match a.as_str() {
            "--etcd" => etcd = Some(value()?),
            "--prefix" => prefix = value()?,
            "--name" => name = value()?,
            "-h" | "--help" => return Ok(USAGE.to_string()),
            other => return Err((2, format!("apf fleet: unknown argument {other:?}\n{USAGE}"))),
        }
    }
    let etcd = etcd.ok_or_else(|| (2, format!("apf fleet: --etcd is required\n{USAGE}")))?;
    let host = etcd.strip_prefix("http://").ok_or_else(|| (2, format!("apf fleet: --etcd {etcd:?}: only http:// is supported\n")))?;
    let host = host.trim_end_matches('/');
    let key = format!("{prefix}{name}/replicas/");
    let body = RangeRequest::prefix(key.as_bytes()).to_json().to_string();
    let fail = |e: String| (1, format!("apf fleet: {e}\n"));
    let resp = super::http::request(host, "POST", "/v3/kv/range", &[("Content-Type", "application/json")], body.as_bytes())
        .map_err(|e| fail(format!("{etcd}: {e}")))?;
    let range = RangeResponse::decode(200, &resp).map_err(|e| fail(format!("{etcd}: unreadable answer: {e:?}")))?;
    let snapshot = Snapshot::from_range(key.as_bytes(), &range).map_err(|e| fail(format!("{etcd}: {e:?}")))?;
    Ok(format!("{}\n", serde_json::to_string_pretty(&render(&snapshot)).unwrap_or_default()))
}

/// The snapshot as JSON: each replica's record as it is stored.
fn render(s: &Snapshot) -> Value {
    let replicas: Vec<Value> = s
        .replicas
        .iter()
        .map(|r| {
            let record = match &r.record {
                Ok(rec) => rec.to_json(),
                Err(e) => json!({"error": e.to_string()}),
            };
            json!({"id": r.id, "lease": r.lease.to_string(), "modRevision": r.mod_revision.to_string(), "record": record})
        })
        .collect();
    json!({"revision": s.revision.to_string(), "replicas": replicas})
}
