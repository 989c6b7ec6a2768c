//! The etcd JSON API codec and the in-memory model against the gateway's conventions
//! (`shared/reference/etcd-fleet.md`): base64 keys and values, 64-bit integers as strings,
//! default values omitted (a false `succeeded`, a zero `TTL`, empty `kvs` and zero `count` are
//! absent), errors as `{"error","code","message"}` with the gateway's HTTP status; range
//! compares (etcd 3.3+) and their behaviour on empty ranges; leases; token authentication.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use apf_wasm::etcd::{
    self, Compare, CompareResult, CompareTarget, EtcdError, LeaseResponse, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse,
};
use apf_wasm::simulate::memetcd::MemEtcd;
use apf_wasm::NANOS_PER_SEC as S;
use serde_json::{json, Value};

fn call(m: &mut MemEtcd, path: &str, body: &Value, now: i64) -> (u16, Value) {
    let (status, b) = m.handle(path, &[], &serde_json::to_vec(body).unwrap(), now);
    (status, serde_json::from_slice(&b).unwrap())
}

fn put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp::Put(PutRequest { key: key.to_vec(), value: value.to_vec(), lease })
}

#[test]
fn gateway_json_shapes() {
    let mut m = MemEtcd::new();
    // Lease grant: ID and TTL as strings.
    let (s, v) = call(&mut m, "/v3/lease/grant", &json!({"TTL": "5"}), 0);
    assert_eq!(s, 200);
    let id = v["ID"].as_str().unwrap().parse::<i64>().unwrap();
    assert_eq!(v["TTL"], "5");
    assert!(v["header"]["revision"].is_string() && v["header"]["cluster_id"].is_string());
    // Empty range: no kvs, no count.
    let (_, v) = call(&mut m, "/v3/kv/range", &json!({"key": "L3Av", "range_end": "L3Aw"}), 0);
    assert_eq!(v.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["header"]);
    // A put bound to the lease, read back: base64, strings, the lease, no default fields.
    let (s, _) = call(&mut m, "/v3/kv/put", &json!({"key": "L3AvYQ==", "value": "eA==", "lease": id.to_string()}), 0);
    assert_eq!(s, 200);
    let (_, v) = call(&mut m, "/v3/kv/range", &json!({"key": "L3Av", "range_end": "L3Aw"}), 0);
    assert_eq!(v["count"], "1");
    assert_eq!(
        v["kvs"][0],
        json!({"key": "L3AvYQ==", "create_revision": "2", "mod_revision": "2", "version": "1", "value": "eA==", "lease": id.to_string()})
    );
    // A txn whose compare fails: `succeeded` absent, the failure branch's range answered.
    let txn = json!({
        "compare": [{"key": "L3AvYQ==", "target": "MOD", "result": "EQUAL", "mod_revision": "1"}],
        "success": [{"request_put": {"key": "L3AvYQ==", "value": "eQ=="}}],
        "failure": [{"request_range": {"key": "L3Av", "range_end": "L3Aw"}}],
    });
    let (s, v) = call(&mut m, "/v3/kv/txn", &txn, 0);
    assert_eq!(s, 200);
    assert!(v.get("succeeded").is_none());
    assert_eq!(v["responses"][0]["response_range"]["count"], "1");
    // The same txn comparing the right revision: succeeded, the put's revision.
    let mut ok = txn.clone();
    ok["compare"][0]["mod_revision"] = json!("2");
    let (_, v) = call(&mut m, "/v3/kv/txn", &ok, 0);
    assert_eq!(v["succeeded"], true);
    assert_eq!(v["header"]["revision"], "3");
    assert_eq!(v["responses"][0]["response_put"]["header"]["revision"], "3");
    // Keepalive: one streamed message; an unknown lease has no TTL.
    let (s, b) = m.handle("/v3/lease/keepalive", &[], br#"{"ID":"12345"}"#, 0);
    assert_eq!(s, 200);
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["result"]["ID"], "12345");
    assert!(v["result"].get("TTL").is_none());
    assert_eq!(LeaseResponse::decode_keepalive(s, &b).unwrap().ttl, 0);
    // Errors: a put on a missing lease.
    let (s, v) = call(&mut m, "/v3/kv/put", &json!({"key": "YQ==", "value": "eA==", "lease": "99"}), 0);
    assert_eq!(s, 404);
    assert_eq!(v, json!({"error": etcd::ERR_LEASE_NOT_FOUND, "code": 5, "message": etcd::ERR_LEASE_NOT_FOUND}));
    let (s, _) = call(&mut m, "/v3/lease/revoke", &json!({"ID": "99"}), 0);
    assert_eq!(s, 404);
    // Revoking the lease deletes its keys; the last put had no lease, so the key stays.
    let (_, v) = call(&mut m, "/v3/kv/put", &json!({"key": "L3AvYg==", "value": "eA==", "lease": id.to_string()}), 0);
    assert!(v.get("header").is_some());
    let (s, _) = call(&mut m, "/v3/lease/revoke", &json!({"ID": id.to_string()}), 0);
    assert_eq!(s, 200);
    let left = m.range(b"/p/", b"/p0");
    assert_eq!((left.len(), left[0].key.as_slice(), left[0].lease), (1, &b"/p/a"[..], 0));
}

#[test]
fn range_compares() {
    let mut m = MemEtcd::new();
    let range_end = etcd::prefix_range_end(b"/f/");
    let less = |r: i64| Compare::mod_less(b"/f/", &range_end, r);
    let txn = |c: Compare| TxnRequest { compare: vec![c], success: vec![], failure: vec![] };
    // An empty range compares as a zero KeyValue: mod_revision 0 < R+1.
    assert!(m.txn(&txn(less(1))).unwrap().succeeded);
    // A value compare on missing keys always fails.
    let value =
        Compare { key: b"/f/a".to_vec(), range_end: vec![], result: CompareResult::NotEqual, target: CompareTarget::Value(b"x".to_vec()) };
    assert!(!m.txn(&txn(value.clone())).unwrap().succeeded);
    let w = |k: &[u8]| TxnRequest { success: vec![put(k, b"v", 0)], ..Default::default() };
    m.txn(&w(b"/f/a")).unwrap();
    m.txn(&w(b"/f/b")).unwrap();
    m.txn(&w(b"/g/x")).unwrap();
    assert_eq!(m.revision(), 4);
    // Every key of the range must satisfy it; keys outside do not matter.
    assert!(!m.txn(&txn(less(3))).unwrap().succeeded);
    assert!(m.txn(&txn(less(4))).unwrap().succeeded);
    assert!(m.txn(&txn(value)).unwrap().succeeded);
    // "Create only if absent".
    let create = |k: &[u8]| Compare { key: k.to_vec(), range_end: vec![], result: CompareResult::Equal, target: CompareTarget::Create(0) };
    assert!(!m.txn(&txn(create(b"/f/a"))).unwrap().succeeded);
    assert!(m.txn(&txn(create(b"/f/c"))).unwrap().succeeded);
    // A writing txn is one revision; its range sees its own put; a read-only txn is none.
    let t = TxnRequest {
        compare: vec![less(4)],
        success: vec![put(b"/f/c", b"1", 0), put(b"/f/d", b"2", 0), RequestOp::Range(RangeRequest::prefix(b"/f/"))],
        failure: vec![],
    };
    let r = m.txn(&t).unwrap();
    assert_eq!((r.header.revision, m.revision()), (5, 5));
    assert_eq!(r.range().unwrap().kvs.iter().map(|kv| kv.mod_revision).collect::<Vec<_>>(), vec![2, 3, 5, 5]);
    // The model answers what the codec decodes, and back.
    let body = serde_json::to_vec(&r.to_json()).unwrap();
    assert_eq!(TxnResponse::decode(200, &body).unwrap(), r);
    assert_eq!(TxnRequest::from_body(&t.to_body()).unwrap(), t);
    // A put on a missing lease in the chosen branch fails the whole txn; in the other, not.
    let bad = TxnRequest { compare: vec![less(1)], success: vec![put(b"/f/e", b"x", 7)], failure: vec![] };
    assert!(!m.txn(&bad).unwrap().succeeded);
    let bad = TxnRequest { compare: vec![], success: vec![put(b"/f/e", b"x", 7), put(b"/f/f", b"y", 0)], failure: vec![] };
    assert!(m.txn(&bad).is_err());
    assert!(m.get(b"/f/f").is_none());
    assert_eq!(m.revision(), 5);
    // The history: the store at a past revision.
    assert_eq!(m.range_at(b"/f/", &range_end, 3).len(), 2);
    assert_eq!(m.range_at(b"/f/", &range_end, 1).len(), 0);
}

#[test]
fn leases_expire_by_the_models_clock_and_a_restart_renews_them() {
    let mut m = MemEtcd::new();
    let grant = |m: &mut MemEtcd, ttl: i64, now: i64| {
        let (s, b) = m.handle(etcd::LEASE_GRANT, &[], &etcd::lease_grant_request(ttl), now);
        LeaseResponse::decode_grant(s, &b).unwrap().id
    };
    let (a, b) = (grant(&mut m, 5, 0), grant(&mut m, 5, 0));
    m.txn(&TxnRequest { success: vec![put(b"/r/a", b"1", a), put(b"/r/b", b"2", b)], ..Default::default() }).unwrap();
    // Kept alive at 4 s: a lives until 9 s, b expires at 5 s.
    let (s, body) = m.handle(etcd::LEASE_KEEPALIVE, &[], &etcd::lease_id_request(a), 4 * S);
    assert_eq!(LeaseResponse::decode_keepalive(s, &body).unwrap().ttl, 5);
    m.advance(5 * S);
    assert_eq!(m.range(b"/r/", b"/r0").len(), 1);
    // Down from 6 s to 30 s: on restart, every lease gets its full TTL again.
    m.restart(30 * S);
    assert_eq!(m.leases(), vec![(a, 35 * S)]);
    m.advance(34 * S);
    assert_eq!(m.range(b"/r/", b"/r0").len(), 1);
    m.advance(35 * S);
    assert!(m.range(b"/r/", b"/r0").is_empty());
}

#[test]
fn token_authentication() {
    let mut m = MemEtcd::with_auth(&[("apf", "pw")], 10 * S);
    let range = serde_json::to_vec(&RangeRequest::prefix(b"/x/").to_json()).unwrap();
    let (s, b) = m.handle(etcd::KV_RANGE, &[], &range, 0);
    let e = RangeResponse::decode(s, &b).unwrap_err();
    assert_eq!((s, e.is_auth()), (400, true), "no token: user name is empty");
    let (s, b) = m.handle(etcd::AUTHENTICATE, &[], &etcd::authenticate_request("apf", "bad"), 0);
    assert_eq!(s, 400);
    assert!(!RangeResponse::decode(s, &b).unwrap_err().is_auth());
    let (s, b) = m.handle(etcd::AUTHENTICATE, &[], &etcd::authenticate_request("apf", "pw"), 0);
    let token = etcd::AuthenticateResponse::decode(s, &b).unwrap().token;
    // The token goes raw in the authorization header.
    let headers = [("authorization", token.clone())];
    let (s, _) = m.handle(etcd::KV_RANGE, &headers, &range, S);
    assert_eq!(s, 200);
    let (s, b) = m.handle(etcd::KV_RANGE, &headers, &range, 10 * S);
    assert_eq!(s, 401);
    let e = RangeResponse::decode(s, &b).unwrap_err();
    assert!(e.is_auth());
    assert_eq!(e, EtcdError::Status { status: 401, code: 16, message: etcd::ERR_INVALID_AUTH_TOKEN.into() });
}

#[test]
fn decoders_accept_numbers_and_camel_case_and_reject_wrong_types() {
    let r = RangeResponse::decode(200, br#"{"header":{"revision":7},"kvs":[{"key":"YQ==","mod_revision":"3"}],"count":1}"#).unwrap();
    assert_eq!((r.header.revision, r.kvs[0].mod_revision, r.kvs[0].value.len()), (7, 3, 0));
    let c = Compare::from_json(&json!({"key": "YQ==", "rangeEnd": "Yg==", "target": "MOD", "result": "LESS", "modRevision": "9"})).unwrap();
    assert_eq!(c, Compare::mod_less(b"a", b"b", 9));
    for bad in [
        &br#"{"header":{"revision":"x"}}"#[..],
        br#"{"header":{"revision":"99999999999999999999"}}"#,
        br#"{"header":[]}"#,
        br#"{"kvs":{}}"#,
        br#"{"kvs":[{"key":1}]}"#,
        br#"{"kvs":[{"value":"YQ"}]}"#,
        br#"{"more":1}"#,
        br#"null"#,
        br#""#,
        b"\xff",
    ] {
        assert!(RangeResponse::decode(200, bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    assert!(matches!(TxnResponse::decode(200, br#"{"responses":[{"response_watch":{}}]}"#), Err(EtcdError::Malformed(_))));
    assert_eq!(RangeResponse::decode(0, b"whatever"), Err(EtcdError::NoResponse));
}
