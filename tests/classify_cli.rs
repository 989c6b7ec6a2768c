#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `apf classify` end to end (in-process).
use apf_wasm::cli::classify::run;
use serde_json::Value;

fn call(args: &[&str]) -> (i32, Value, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&args, &mut out, &mut err);
    let v = serde_json::from_slice(&out).unwrap_or(Value::Null);
    (code, v, String::from_utf8_lossy(&err).into_owned())
}

#[test]
fn default_policy_user() {
    let (code, v, err) = call(&["--method", "GET", "--path", "/api/v1/namespaces/default/pods", "--user", "alice", "--group", "dev"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["flowSchema"], "global-default");
    assert_eq!(v["priorityLevel"], "global-default");
    assert_eq!(v["distinguisher"], "alice");
    assert_eq!(v["flowHash"], "17644606172554983095");
    assert_eq!(v["queues"], serde_json::json!([55, 62, 126, 125, 105, 1]));
    assert_eq!(v["requestInfo"]["verb"], "list");
    assert_eq!(v["requestInfo"]["namespace"], "default");
    assert_eq!(v["requestInfo"]["isResourceRequest"], true);
    assert_eq!(v["user"]["groups"], serde_json::json!(["dev", "system:authenticated"]));
    assert_eq!(v["seats"]["initial"], 1);
    assert_eq!(v["seats"]["final"], 0);
    assert_eq!(v["longRunning"], false);
}

#[test]
fn exempt_and_watch() {
    let (code, v, _) = call(&["--method", "GET", "--path", "/api/v1/pods?watch=true", "--user", "root", "--group", "system:masters"]);
    assert_eq!(code, 0);
    assert_eq!(v["flowSchema"], "exempt");
    assert_eq!(v["queues"], serde_json::json!([]));
    assert_eq!(v["flowHash"], "0");
    assert_eq!(v["longRunning"], true);
    assert_eq!(v["requestInfo"]["verb"], "watch");
}

#[test]
fn headers_run_identity_sources() {
    let dir = std::env::temp_dir().join(format!("apf-classify-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfgp = dir.join("cfg.json");
    std::fs::write(&cfgp, r#"{"identity":{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8"]}]},
        "workEstimator":{"objectCounts":{"pods":{"count":5000,"averageObjectSizeBytes":2000}}}}"#).unwrap();
    let c = cfgp.to_str().unwrap();
    let (code, v, err) = call(&["--config", c, "--method", "GET", "--path", "/api/v1/pods", "--header", "X-Remote-User: system:serviceaccount:default:default", "--peer", "10.1.1.1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["flowSchema"], "service-accounts");
    assert_eq!(v["flowHash"], "13424615363282033023");
    assert_eq!(v["queues"], serde_json::json!([127, 66, 18, 15, 64, 74]));
    // 5000 × 2000 B = 10 MB from storage → 100 seats, capped by workload-low's max seats
    assert!(v["seats"]["initial"].as_u64().unwrap() > 1);
    // untrusted peer → anonymous
    let (_, v, _) = call(&["--config", c, "--method", "GET", "--path", "/api/v1/pods", "--header", "X-Remote-User: bob", "--peer", "192.168.1.1"]);
    assert_eq!(v["user"]["name"], "system:anonymous");
    assert_eq!(v["user"]["groups"], serde_json::json!(["system:unauthenticated"]));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn usage_errors() {
    assert_eq!(call(&["--method", "GET"]).0, 2);
    assert_eq!(call(&["--method", "GET", "--path", "/", "--group", "g"]).0, 2);
    assert_eq!(call(&["--method", "GET", "--path", "/", "--header", "nocolon"]).0, 2);
    assert_eq!(call(&["--method", "GET", "--path", "/", "--peer", "x"]).0, 2);
    assert_eq!(call(&["--bogus"]).0, 2);
    assert_eq!(call(&["--config", "/nonexistent/x.json", "--method", "GET", "--path", "/"]).0, 1);
    assert_eq!(call(&["--help"]).0, 0);
}
