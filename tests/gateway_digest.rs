#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! One digest pipeline: every request of the classification fixtures
//! (tests/fixtures/classify/requests.json) is classified by `apf classify` (its JSON document)
//! and by the filter over the mock host (the explanation headers of the response, and the
//! digest the filter's `digest_request` makes from the same stream), and both must agree on
//! FlowSchema, priority level, flow hash and seats.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::cli::classify::{classify_request, ClassifyRequest};
use apf_wasm::config::parse_plugin_config;
use apf_wasm::digest::work_estimate::no_cluster_stats;
use apf_wasm::engine::Compiled;
use apf_wasm::gateway::request::digest_request;
use mock_host::{Node, Proxy};
use serde_json::Value;

#[test]
fn cli_and_filter_digest_every_fixture_alike() {
    let fixtures: Value = serde_json::from_str(include_str!("fixtures/classify/requests.json")).unwrap();
    let cfg_text = fixtures["config"].to_string();
    let compiled = Compiled::new(parse_plugin_config(cfg_text.as_bytes()).unwrap(), 0);
    let proxy = Proxy::new();
    let mut node = Node::new(&proxy, 0);
    assert!(node.configure(&cfg_text));
    node.tick();
    let requests = fixtures["requests"].as_array().unwrap();
    assert!(requests.len() >= 10);
    for r in requests {
        let (method, path) = (r["method"].as_str().unwrap(), r["path"].as_str().unwrap());
        let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(user) = r["user"].as_str() {
            headers.push(("x-remote-user".into(), user.as_bytes().to_vec()));
        }
        for g in r["groups"].as_array().unwrap() {
            headers.push(("x-remote-group".into(), g.as_str().unwrap().as_bytes().to_vec()));
        }
        let cert = r.get("certificate").and_then(Value::as_str);

        // The CLI.
        let req = ClassifyRequest {
            method: method.into(),
            path: path.into(),
            headers: headers.clone(),
            mtls: cert.is_some(),
            cert_subject: cert.map(str::to_string),
            ..ClassifyRequest::default()
        };
        let cli = classify_request(&compiled, &req);
        let cli_seats = cli["seats"]["initial"].as_u64().unwrap().max(cli["seats"]["final"].as_u64().unwrap());

        // The filter over the mock host.
        let mut h: Vec<(&str, &str)> = vec![(":method", method), (":path", path), (":authority", "gw")];
        let text: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap())).collect();
        h.extend(text.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let props: Vec<(&str, &[u8])> = match cert {
            Some(c) => vec![("connection.mtls", &[1u8][..]), ("connection.subject_peer_certificate", c.as_bytes())],
            None => vec![],
        };
        let (ctx, _) = node.request(&h, &props);
        let d = digest_request(&node.host, &compiled, &no_cluster_stats).digest;
        let what = format!("{method} {path} ({:?})", r["user"]);
        let fs_name = &compiled.config.policy.flow_schemas[d.class.flow_schema].name;
        let pl_name = &compiled.levels[d.class.priority_level].name;
        assert_eq!(cli["flowSchema"].as_str(), Some(fs_name.as_str()), "{what}");
        assert_eq!(cli["priorityLevel"].as_str(), Some(pl_name.as_str()), "{what}");
        assert_eq!(cli["flowHash"].as_str(), Some(d.class.flow_hash.to_string().as_str()), "{what}");
        assert_eq!(cli["requestInfo"]["verb"].as_str(), Some(d.info.verb.as_str()), "{what}");
        assert_eq!(cli_seats, u64::from(d.work.max_seats()), "{what}");
        // What the filter did with the stream says the same (long-running requests are not
        // admitted, so they carry no explanation).
        node.respond(ctx, 200, &[], &[]);
        let s = node.stream(ctx);
        if !d.long_running || d.is_watch {
            assert_eq!(s.response_header("x-apf-flowschema").as_deref(), Some(fs_name.as_str()), "{what}");
            assert_eq!(s.response_header("x-apf-prioritylevel").as_deref(), Some(pl_name.as_str()), "{what}");
            assert_eq!(s.response_header("x-apf-seats"), Some(cli_seats.to_string()), "{what}");
        }
        node.close(ctx);
    }
}
