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
    std::fs::write(
        &cfgp,
        r#"{"identity":{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8"]}]},
        "workEstimator":{"objectCounts":{"pods":{"count":5000,"averageObjectSizeBytes":2000}}}}"#,
    )
    .unwrap();
    let c = cfgp.to_str().unwrap();
    let (code, v, err) = call(&[
        "--config",
        c,
        "--method",
        "GET",
        "--path",
        "/api/v1/pods",
        "--header",
        "X-Remote-User: system:serviceaccount:default:default",
        "--peer",
        "10.1.1.1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["flowSchema"], "service-accounts");
    assert_eq!(v["flowHash"], "13424615363282033023");
    assert_eq!(v["queues"], serde_json::json!([127, 66, 18, 15, 64, 74]));
    // 5000 × 2000 B = 10 MB from storage → 100 seats, capped by workload-low's max seats
    assert!(v["seats"]["initial"].as_u64().unwrap() > 1);
    // untrusted peer → anonymous
    let (_, v, _) =
        call(&["--config", c, "--method", "GET", "--path", "/api/v1/pods", "--header", "X-Remote-User: bob", "--peer", "192.168.1.1"]);
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

const METRICS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/metrics/kube-apiserver-1.34.txt");

#[test]
fn list_costs_from_a_clusters_metrics() {
    // 50,000 pods of 4,096 B (2.048e+08 / 50,000): 2,048 seats, capped at global-default's 8.
    let (code, v, err) = call(&["--metrics", METRICS, "--method", "GET", "--path", "/api/v1/pods", "--user", "alice"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["seats"]["initial"], 8);
    assert_eq!(
        v["objectCounts"],
        serde_json::json!({"resource": "pods", "count": 50000, "averageObjectSizeBytes": 4096, "source": "cluster metrics"})
    );
    // 6 leases of 450 B from the watch cache: 1 seat; without --metrics every LIST is 1 seat.
    let (_, v, _) = call(&[
        "--metrics",
        METRICS,
        "--method",
        "GET",
        "--path",
        "/apis/coordination.k8s.io/v1/leases?resourceVersion=0",
        "--user",
        "alice",
    ]);
    assert_eq!((v["seats"]["initial"].clone(), v["objectCounts"]["count"].clone()), (serde_json::json!(1), serde_json::json!(6)));
    let (_, v, _) = call(&["--method", "GET", "--path", "/api/v1/pods", "--user", "alice"]);
    assert_eq!(v["seats"]["initial"], 1);
    // Limited LIST from storage: 100 × 3,000 B = 300 kB → 3 seats.
    let (_, v, _) =
        call(&["--metrics", METRICS, "--method", "GET", "--path", "/api/v1/configmaps?limit=100&resourceVersion=7", "--user", "alice"]);
    assert_eq!(v["seats"]["initial"], 3);
    // Not reported by the cluster: 1 seat, said so.
    let (_, v, _) = call(&["--metrics", METRICS, "--method", "GET", "--path", "/apis/example.com/v1/widgets", "--user", "alice"]);
    assert_eq!(v["seats"]["initial"], 1);
    assert!(v["objectCounts"]["source"].as_str().unwrap().starts_with("none"), "{v}");
    // The configuration's table overrides the cluster.
    let cfg = std::env::temp_dir().join(format!("apf-classify-table-{}.json", std::process::id()));
    std::fs::write(&cfg, r#"{"workEstimator": {"objectCounts": {"pods": {"count": 10, "averageObjectSizeBytes": 100}}}}"#).unwrap();
    let (_, v, _) =
        call(&["--config", cfg.to_str().unwrap(), "--metrics", METRICS, "--method", "GET", "--path", "/api/v1/pods", "--user", "alice"]);
    let _ = std::fs::remove_file(&cfg);
    assert_eq!(
        (v["seats"]["initial"].clone(), v["objectCounts"]["source"].clone()),
        (serde_json::json!(1), serde_json::json!("objectCounts table"))
    );
}

#[test]
fn metrics_from_a_url_and_errors() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            req.extend_from_slice(&buf[..n]);
        }
        let body = "apiserver_resource_objects{resource=\"pods\",group=\"\"} 1000\napiserver_resource_size_estimate_bytes{group=\"\",resource=\"pods\"} 2e+06\n";
        // Chunked, as kube-apiserver answers.
        let (a, b) = body.split_at(40);
        write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        )
        .unwrap();
        String::from_utf8_lossy(&req).into_owned()
    });
    let url = format!("http://127.0.0.1:{port}/metrics");
    // 1000 × 2,000 B = 2 MB → 20 seats, capped at 8.
    let (code, v, err) = call(&["--metrics", &url, "--token", "t0k", "--method", "GET", "--path", "/api/v1/pods", "--user", "alice"]);
    let req = server.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(req.starts_with("GET /metrics HTTP/1.1\r\n") && req.contains("Authorization: Bearer t0k\r\n"), "{req}");
    assert_eq!((v["seats"]["initial"].clone(), v["objectCounts"]["count"].clone()), (serde_json::json!(8), serde_json::json!(1000)));
    let (code, _, err) = call(&["--metrics", "https://example.invalid/metrics", "--method", "GET", "--path", "/api/v1/pods"]);
    assert_eq!(code, 1);
    assert!(err.contains("kubectl get --raw /metrics"), "{err}");
    let (code, _, err) = call(&["--metrics", "/nonexistent/metrics.txt", "--method", "GET", "--path", "/api/v1/pods"]);
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = call(&["--metrics", "Cargo.toml", "--method", "GET", "--path", "/api/v1/pods"]);
    assert!(code == 1 && err.contains("no apiserver_resource_objects"), "{err}");
    let (code, _, _) = call(&["--config", "-", "--metrics", "-", "--method", "GET", "--path", "/"]);
    assert_eq!(code, 2);
}
