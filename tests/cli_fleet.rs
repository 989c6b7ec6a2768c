#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! `apf fleet --etcd URL` against an HTTP server answering with the in-memory etcd model: it
//! prints every replica record under the fleet's prefix as JSON with a top-level `replicas` array.

use apf_wasm::base64;
use apf_wasm::fleet::record::{LevelRecord, Record};
use apf_wasm::simulate::memetcd::MemEtcd;
use std::io::{Read, Write};
use std::net::TcpListener;

/// Serves `n` HTTP requests from `etcd`, one per connection.
fn serve(mut etcd: MemEtcd, n: usize) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        for _ in 0..n {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head_end, len) = loop {
                let k = c.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..k]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                    let len = head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
                    break (i + 4, len);
                }
            };
            while buf.len() < head_end + len {
                let k = c.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..k]);
            }
            let path = String::from_utf8_lossy(&buf).split_whitespace().nth(1).unwrap().to_string();
            let (status, body) = etcd.handle(&path, &[], &buf[head_end..head_end + len], 1);
            write!(c, "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n", body.len()).unwrap();
            c.write_all(&body).unwrap();
        }
    });
    (url, t)
}

fn put(etcd: &mut MemEtcd, key: &str, record: &Record) {
    let body = serde_json::json!({"key": base64::encode(key.as_bytes()), "value": base64::encode(&record.encode())});
    let (status, _) = etcd.handle("/v3/kv/put", &[], body.to_string().as_bytes(), 1);
    assert_eq!(status, 200);
}

#[test]
fn prints_every_replica_of_the_fleet() {
    let mut etcd = MemEtcd::new();
    for (id, claim) in [("r-a", 7), ("r-b", 13)] {
        let mut r = Record { heartbeat: 1, revision: 1, server_concurrency_limit: 20, ..Record::default() };
        r.levels.insert("lvl".into(), LevelRecord { claim, granted: claim, in_use: 2, ..LevelRecord::default() });
        put(&mut etcd, &format!("/apf-wasm/default/replicas/{id}"), &r);
    }
    put(&mut etcd, "/apf-wasm/other/replicas/r-c", &Record::default());
    let (url, server) = serve(etcd, 1);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = apf_wasm::cli::main_with(&["fleet".into(), "--etcd".into(), url], &mut out, &mut err);
    server.join().unwrap();
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let replicas = v["replicas"].as_array().unwrap();
    let ids: Vec<&str> = replicas.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["r-a", "r-b"], "{v}");
    assert_eq!(replicas[1]["record"]["levels"]["lvl"]["claim"], 13, "{v}");
}

#[test]
fn an_unreachable_etcd_is_an_error_not_a_panic() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = apf_wasm::cli::main_with(&["fleet".into(), "--etcd".into(), "http://127.0.0.1:1".into()], &mut out, &mut err);
    assert_eq!(code, 1);
    assert!(String::from_utf8_lossy(&err).contains("apf fleet:"));
    let code = apf_wasm::cli::main_with(&["fleet".into()], &mut out, &mut err);
    assert_eq!(code, 2);
}
