//! An in-memory model of one etcd member behind its JSON gateway, for tests and the simulator:
//! it answers the same bodies etcd 3.4's gateway does for the calls the fleet makes.
//!
//! Modelled: a key-value store with a store revision, per key `create_revision`,
//! `mod_revision`, `version` and `lease`; the full history of every key (to read the store at a
//! past revision); range with `range_end` (`\0` = every key from `key` on); put; txn with
//! compares on one key or a range of keys (etcd 3.3+, `server/etcdserver/apply.go: applyCompare`,
//! `compareKV`), one revision per writing txn whose ranges see its own writes, and the lease of
//! every put of the chosen branch checked first (`checkRequestPut`); leases with a TTL that
//! expire by the model's clock (their keys deleted at one revision) and that a restart renews to
//! their full TTL (as a leader change does); optional simple-token authentication with tokens
//! that expire; every answer's header with the cluster id, member id, store revision and raft
//! term (`etcdserverpb.ResponseHeader`); losing every piece of data ([`MemEtcd::wipe`]). Errors are `{"error","code","message"}` with the gateway's HTTP status.
//! Not modelled: compaction, watches, multiple members, range limits and sorting options.

use crate::etcd::{
    self, codes, AuthenticateRequest, AuthenticateResponse, Compare, CompareResult, CompareTarget, Header, HeaderResponse, KeyValue,
    LeaseRequest, LeaseResponse, PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse,
};
use crate::Nanos;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
struct Lease {
    ttl_secs: i64,
    expires_at: Nanos,
}

/// The model. Every call takes the model's clock `now` (nanoseconds).
#[derive(Debug, Clone)]
pub struct MemEtcd {
    revision: i64,
    kvs: BTreeMap<Vec<u8>, KeyValue>,
    /// Every state every key had: (revision, value or deleted).
    history: BTreeMap<Vec<u8>, Vec<(i64, Option<KeyValue>)>>,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
    users: BTreeMap<String, String>,
    tokens: BTreeMap<String, Nanos>,
    token_ttl: Nanos,
    next_token: u64,
    raft_term: u64,
    cluster_id: u64,
}

impl Default for MemEtcd {
    fn default() -> Self {
        MemEtcd::new()
    }
}

/// An error answer as the 3.4/3.5 gateway writes it, with the HTTP status it gives the code.
fn error(code: i64, message: &str) -> (u16, Vec<u8>) {
    let body = serde_json::json!({"error": message, "code": code, "message": message});
    (http_status(code), serde_json::to_vec(&body).unwrap_or_default())
}

/// The HTTP status the gateway answers for a gRPC code (`runtime.HTTPStatusFromCode`).
fn http_status(code: i64) -> u16 {
    match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    }
}

fn ok<T: serde::Serialize>(v: &T) -> (u16, Vec<u8>) {
    (200, serde_json::to_vec(v).unwrap_or_default())
}

/// Whether `key` is in `[start, end)` as etcd reads a range: an empty `end` is the single key
/// `start`, `\0` every key from `start` on.
fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        _ => key >= start && key < end,
    }
}

impl MemEtcd {
    pub fn new() -> MemEtcd {
        MemEtcd {
            revision: 1,
            kvs: BTreeMap::new(),
            history: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: 0x694d_7a3c_0000_0001,
            users: BTreeMap::new(),
            tokens: BTreeMap::new(),
            token_ttl: 300 * crate::NANOS_PER_SEC,
            next_token: 1,
            raft_term: 2,
            cluster_id: 0x1c2f_3b4a_5d6e_7f80,
        }
    }

    /// Authentication on, with these users; simple tokens valid for `token_ttl`.
    pub fn with_auth(users: &[(&str, &str)], token_ttl: Nanos) -> MemEtcd {
        let mut m = MemEtcd::new();
        m.users = users.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect();
        m.token_ttl = token_ttl;
        m
    }

    fn header(&self) -> Header {
        Header { cluster_id: self.cluster_id, member_id: 0x8e9d_0c1b_2a39_4857, revision: self.revision, raft_term: self.raft_term }
    }

    /// The store revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn get(&self, key: &[u8]) -> Option<&KeyValue> {
        self.kvs.get(key)
    }

    /// Every key in `[key, range_end)` now.
    pub fn range(&self, key: &[u8], range_end: &[u8]) -> Vec<KeyValue> {
        self.kvs.iter().filter(|(k, _)| in_range(k, key, range_end)).map(|(_, v)| v.clone()).collect()
    }

    /// Every key in `[key, range_end)` as the store held them at `revision`.
    pub fn range_at(&self, key: &[u8], range_end: &[u8], revision: i64) -> Vec<KeyValue> {
        let versions = self.history.iter().filter(|(k, _)| in_range(k, key, range_end));
        versions.filter_map(|(_, v)| v.iter().rev().find(|(r, _)| *r <= revision).and_then(|(_, kv)| kv.clone())).collect()
    }

    /// Leases alive now, with their expiry.
    pub fn leases(&self) -> Vec<(i64, Nanos)> {
        self.leases.iter().map(|(id, l)| (*id, l.expires_at)).collect()
    }

    /// Lease expiry and token expiry up to `now`: each expired lease's keys go at one revision.
    pub fn advance(&mut self, now: Nanos) {
        let expired: Vec<i64> = self.leases.iter().filter(|(_, l)| now >= l.expires_at).map(|(id, _)| *id).collect();
        for id in expired {
            self.revoke(id);
        }
        self.tokens.retain(|_, exp| now < *exp);
    }

    /// A restart (or a leader change): every lease gets its full TTL again, however long the
    /// member was down (etcd `lessor.Promote`), and simple tokens (kept in memory) are gone.
    pub fn restart(&mut self, now: Nanos) {
        for l in self.leases.values_mut() {
            l.expires_at = now.saturating_add(l.ttl_secs.saturating_mul(crate::NANOS_PER_SEC));
        }
        self.tokens.clear();
        self.raft_term = self.raft_term.saturating_add(1);
    }

    /// The member lost its data and started again empty (its data directory wiped, or restored
    /// from nothing): the store revision back to 1, every key, its history and every lease gone,
    /// tokens gone, and a new cluster id (a new cluster bootstrapped). Lease ids go on from
    /// where they were (etcd makes them from the member id and the clock, so a new lease does
    /// not take an old one's id). Users stay (re-created with the cluster).
    pub fn wipe(&mut self) {
        self.revision = 1;
        self.kvs.clear();
        self.history.clear();
        self.leases.clear();
        self.tokens.clear();
        self.raft_term = 2;
        self.cluster_id = self.cluster_id.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    }

    /// The cluster id in every answer's header.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Sets the cluster id (a wiped member restarted with the same initial cluster token and
    /// members gets the same id again).
    pub fn set_cluster_id(&mut self, id: u64) {
        self.cluster_id = id;
    }

    fn write(&mut self, key: Vec<u8>, kv: Option<KeyValue>) {
        self.history.entry(key.clone()).or_default().push((self.revision, kv.clone()));
        match kv {
            Some(kv) => self.kvs.insert(key, kv),
            None => self.kvs.remove(&key),
        };
    }

    fn revoke(&mut self, id: i64) -> bool {
        if self.leases.remove(&id).is_none() {
            return false;
        }
        let keys: Vec<Vec<u8>> = self.kvs.iter().filter(|(_, v)| v.lease == id).map(|(k, _)| k.clone()).collect();
        if !keys.is_empty() {
            self.revision = self.revision.saturating_add(1);
            for k in keys {
                self.write(k, None);
            }
        }
        true
    }

    /// One HTTP call: `POST path` with `headers` (lowercase names) and a JSON body.
    pub fn handle(&mut self, path: &str, headers: &[(&str, String)], body: &[u8], now: Nanos) -> (u16, Vec<u8>) {
        self.advance(now);
        if path == etcd::AUTHENTICATE {
            return self.authenticate(body, now);
        }
        if !self.users.is_empty() {
            match headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("authorization")) {
                None => return error(codes::INVALID_ARGUMENT, etcd::ERR_USER_EMPTY),
                Some((_, t)) if !self.tokens.contains_key(t) => return error(codes::UNAUTHENTICATED, etcd::ERR_INVALID_AUTH_TOKEN),
                Some(_) => {}
            }
        }
        match path {
            etcd::LEASE_GRANT | etcd::LEASE_KEEPALIVE | etcd::LEASE_REVOKE => self.lease_call(path, body, now),
            etcd::KV_RANGE => match etcd::decode_request::<RangeRequest>(body) {
                Ok(r) => ok(&self.read(&r)),
                Err(e) => error(codes::INVALID_ARGUMENT, &e.to_string()),
            },
            etcd::KV_PUT => match etcd::decode_request::<PutRequest>(body) {
                Ok(p) => {
                    let txn = TxnRequest { compare: Vec::new(), success: vec![RequestOp::Put(p)], failure: Vec::new() };
                    match self.txn(&txn) {
                        Ok(t) => ok(&HeaderResponse { header: t.header }),
                        Err(e) => e,
                    }
                }
                Err(e) => error(codes::INVALID_ARGUMENT, &e.to_string()),
            },
            etcd::KV_TXN => match TxnRequest::from_body(body) {
                Ok(t) => match self.txn(&t) {
                    Ok(r) => ok(&r),
                    Err(e) => e,
                },
                Err(e) => error(codes::INVALID_ARGUMENT, &e.to_string()),
            },
            _ => (404, b"Not Found\n".to_vec()),
        }
    }

    fn authenticate(&mut self, body: &[u8], now: Nanos) -> (u16, Vec<u8>) {
        let Ok(AuthenticateRequest { name, password }) = etcd::decode_request(body) else {
            return error(codes::INVALID_ARGUMENT, "invalid authenticate request");
        };
        if self.users.is_empty() {
            return error(codes::FAILED_PRECONDITION, "etcdserver: authentication is not enabled");
        }
        if self.users.get(&name) != Some(&password) {
            return error(codes::INVALID_ARGUMENT, etcd::ERR_AUTH_FAILED);
        }
        let token = format!("{}.{}", self.random_token(), self.next_token);
        self.next_token = self.next_token.saturating_add(1);
        self.tokens.insert(token.clone(), now.saturating_add(self.token_ttl));
        ok(&AuthenticateResponse { header: self.header(), token })
    }

    fn random_token(&self) -> String {
        // Simple tokens are 16 random letters; any string does.
        let mut x = self.next_token.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
        (0..16)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect()
    }

    fn lease_call(&mut self, path: &str, body: &[u8], now: Nanos) -> (u16, Vec<u8>) {
        let Ok(LeaseRequest { id, ttl }) = etcd::decode_request(body) else {
            return error(codes::INVALID_ARGUMENT, "invalid lease request");
        };
        match path {
            etcd::LEASE_GRANT => {
                let id = self.next_lease;
                self.next_lease = self.next_lease.saturating_add(0x1_0003);
                let ttl = ttl.max(1);
                self.leases.insert(id, Lease { ttl_secs: ttl, expires_at: now.saturating_add(ttl.saturating_mul(crate::NANOS_PER_SEC)) });
                ok(&LeaseResponse { header: self.header(), id, ttl, error: String::new() })
            }
            etcd::LEASE_KEEPALIVE => {
                // An unknown lease answers TTL 0, which the gateway omits.
                let ttl = match self.leases.get_mut(&id) {
                    Some(l) => {
                        l.expires_at = now.saturating_add(l.ttl_secs.saturating_mul(crate::NANOS_PER_SEC));
                        l.ttl_secs
                    }
                    None => 0,
                };
                (200, LeaseResponse { header: self.header(), id, ttl, error: String::new() }.keepalive_body())
            }
            _ => {
                if self.revoke(id) {
                    ok(&HeaderResponse { header: self.header() })
                } else {
                    error(codes::NOT_FOUND, etcd::ERR_LEASE_NOT_FOUND)
                }
            }
        }
    }

    fn read(&self, r: &RangeRequest) -> RangeResponse {
        let kvs = self.range(&r.key, &r.range_end);
        RangeResponse { header: self.header(), count: kvs.len() as i64, kvs, more: false }
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs = self.range(&c.key, &c.range_end);
        let holds = |kv: &KeyValue| {
            let ord = match &c.target {
                CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
                CompareTarget::Create(x) => kv.create_revision.cmp(x),
                CompareTarget::Mod(x) => kv.mod_revision.cmp(x),
                CompareTarget::Version(x) => kv.version.cmp(x),
                CompareTarget::Lease(x) => kv.lease.cmp(x),
            };
            match c.result {
                CompareResult::Equal => ord.is_eq(),
                CompareResult::NotEqual => ord.is_ne(),
                CompareResult::Greater => ord.is_gt(),
                CompareResult::Less => ord.is_lt(),
            }
        };
        if kvs.is_empty() {
            // etcd: a value compare on missing keys fails; others compare a zero KeyValue.
            return !matches!(c.target, CompareTarget::Value(_)) && holds(&KeyValue::default());
        }
        kvs.iter().all(holds)
    }

    /// Applies a txn; `Err` is an error answer (nothing applied).
    pub fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse, (u16, Vec<u8>)> {
        let succeeded = t.compare.iter().all(|c| self.compare(c));
        let ops = if succeeded { &t.success } else { &t.failure };
        for op in ops {
            if let RequestOp::Put(p) = op {
                if p.key.is_empty() {
                    return Err(error(codes::INVALID_ARGUMENT, "etcdserver: key is not provided"));
                }
                if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                    return Err(error(codes::NOT_FOUND, etcd::ERR_LEASE_NOT_FOUND));
                }
            }
        }
        let writes = ops.iter().any(|o| !matches!(o, RequestOp::Range(_)));
        if writes {
            self.revision = self.revision.saturating_add(1);
        }
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(match op {
                RequestOp::Range(r) => {
                    ResponseOp::Range(RangeResponse { header: Header { revision: self.revision, ..Header::default() }, ..self.read(r) })
                }
                RequestOp::Put(p) => {
                    let prev = self.kvs.get(&p.key);
                    let kv = KeyValue {
                        key: p.key.clone(),
                        create_revision: prev.map_or(self.revision, |k| k.create_revision),
                        mod_revision: self.revision,
                        version: prev.map_or(1, |k| k.version.saturating_add(1)),
                        value: p.value.clone(),
                        lease: p.lease,
                    };
                    self.write(p.key.clone(), Some(kv));
                    ResponseOp::Put { header: Header { revision: self.revision, ..Header::default() } }
                }
            });
        }
        Ok(TxnResponse { header: self.header(), succeeded, responses })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = crate::NANOS_PER_SEC;

    #[test]
    fn lease_expiry_deletes_keys_at_one_revision() {
        let mut m = MemEtcd::new();
        let (_, b) = m.handle(etcd::LEASE_GRANT, &[], &etcd::lease_grant_request(2), 0);
        let id = LeaseResponse::decode_grant(200, &b).unwrap().id;
        for k in [&b"/p/a"[..], b"/p/b"] {
            let put = TxnRequest {
                success: vec![RequestOp::Put(PutRequest { key: k.to_vec(), value: b"v".to_vec(), lease: id })],
                ..Default::default()
            };
            assert!(m.txn(&put).unwrap().succeeded);
        }
        assert_eq!(m.revision(), 3);
        m.advance(2 * S - 1);
        assert_eq!(m.range(b"/p/", b"/p0").len(), 2);
        m.advance(2 * S);
        assert_eq!((m.range(b"/p/", b"/p0").len(), m.revision()), (0, 4));
        assert_eq!(m.range_at(b"/p/", b"/p0", 3).len(), 2);
        let (s, b) = m.handle(etcd::LEASE_KEEPALIVE, &[], &etcd::lease_id_request(id), 3 * S);
        assert_eq!((s, LeaseResponse::decode_keepalive(s, &b).unwrap().ttl), (200, 0));
    }
}
