//! The etcd v3 JSON API (the grpc-gateway at `/v3/*`, etcd 3.4 to 3.7): the requests and
//! responses the fleet uses, both ways — a replica encodes requests and decodes responses, the
//! in-memory model ([`super::memetcd`]) decodes requests and encodes responses.
//!
//! The gateway's conventions (etcd `api/etcdserverpb/gw/rpc.pb.gw.go`, `dev-guide/api_grpc_gateway.md`):
//! keys and values are base64; 64-bit integers are JSON strings (numbers are accepted when
//! decoding); fields with their default value are omitted (a false `succeeded`, a zero `TTL`,
//! an empty `kvs` are absent); field names are snake_case (camelCase accepted when decoding
//! requests). Errors are a non-200 status with `{"error", "code", "message"}` (3.6 dropped
//! `error`), or `{"error": {...}}` in a streamed answer.
//!
//! Every decoder is total: malformed JSON, a missing or mistyped field, bad base64 → an
//! [`EtcdError`], never a panic.

use super::base64;
use serde_json::{json, Map, Value};

pub const AUTHENTICATE: &str = "/v3/auth/authenticate";
pub const LEASE_GRANT: &str = "/v3/lease/grant";
pub const LEASE_KEEPALIVE: &str = "/v3/lease/keepalive";
pub const LEASE_REVOKE: &str = "/v3/lease/revoke";
pub const KV_RANGE: &str = "/v3/kv/range";
pub const KV_PUT: &str = "/v3/kv/put";
pub const KV_TXN: &str = "/v3/kv/txn";

/// gRPC status codes that matter here (`google.golang.org/grpc/codes`).
pub mod codes {
    pub const INVALID_ARGUMENT: i64 = 3;
    pub const NOT_FOUND: i64 = 5;
    pub const PERMISSION_DENIED: i64 = 7;
    pub const FAILED_PRECONDITION: i64 = 9;
    pub const UNAVAILABLE: i64 = 14;
    pub const UNAUTHENTICATED: i64 = 16;
}

/// etcd's messages (`api/v3rpc/rpctypes/error.go`).
pub const ERR_LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
pub const ERR_INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";
pub const ERR_USER_EMPTY: &str = "etcdserver: user name is empty";
pub const ERR_AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";

/// Why a call did not give the expected answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// No answer: the host's timeout, a reset or an unreachable cluster (status 0).
    NoResponse,
    /// An error answer: the HTTP status, the gRPC code (0 when absent) and the message.
    Status { status: u16, code: i64, message: String },
    /// A 200 answer that is not what the call returns.
    Malformed(String),
}

impl EtcdError {
    /// The token is missing, invalid or expired: authenticate again.
    pub fn is_auth(&self) -> bool {
        match self {
            EtcdError::Status { status, code, message } => {
                *status == 401 || *code == codes::UNAUTHENTICATED || message.contains("auth token") || message.contains(ERR_USER_EMPTY)
            }
            _ => false,
        }
    }

    /// The lease named in the call does not exist (expired or revoked).
    pub fn is_lease_not_found(&self) -> bool {
        matches!(self, EtcdError::Status { message, .. } if message.contains(ERR_LEASE_NOT_FOUND))
    }
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::NoResponse => write!(f, "no response"),
            EtcdError::Status { status, code, message } => write!(f, "HTTP {status} (code {code}): {message}"),
            EtcdError::Malformed(m) => write!(f, "malformed response: {m}"),
        }
    }
}

type Res<T> = Result<T, EtcdError>;

fn bad<T>(what: impl Into<String>) -> Res<T> {
    Err(EtcdError::Malformed(what.into()))
}

// ---------------------------------------------------------------------------------------------
// field access (total)

/// The first present, non-null field among `names` (snake_case first, then camelCase).
fn get<'a>(v: &'a Value, names: &[&str]) -> Option<&'a Value> {
    names.iter().find_map(|n| v.get(n).filter(|x| !x.is_null()))
}

fn int(v: &Value, names: &[&str]) -> Res<i64> {
    match get(v, names) {
        None => Ok(0),
        Some(Value::String(s)) => {
            s.parse::<i64>().or_else(|_| bad(format!("{}: {s:?} is not an int64", names.first().copied().unwrap_or(""))))
        }
        Some(Value::Number(n)) => {
            n.as_i64().map_or_else(|| bad(format!("{}: {n} is not an int64", names.first().copied().unwrap_or(""))), Ok)
        }
        Some(_) => bad(format!("{}: expected an integer", names.first().copied().unwrap_or(""))),
    }
}

fn uint(v: &Value, names: &[&str]) -> Res<u64> {
    match get(v, names) {
        None => Ok(0),
        Some(Value::String(s)) => {
            s.parse::<u64>().or_else(|_| bad(format!("{}: {s:?} is not a uint64", names.first().copied().unwrap_or(""))))
        }
        Some(Value::Number(n)) => {
            n.as_u64().map_or_else(|| bad(format!("{}: {n} is not a uint64", names.first().copied().unwrap_or(""))), Ok)
        }
        Some(_) => bad(format!("{}: expected an integer", names.first().copied().unwrap_or(""))),
    }
}

fn bytes(v: &Value, names: &[&str]) -> Res<Vec<u8>> {
    match get(v, names) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => base64::decode(s).or_else(|e| bad(format!("{}: {e}", names.first().copied().unwrap_or("")))),
        Some(_) => bad(format!("{}: expected a base64 string", names.first().copied().unwrap_or(""))),
    }
}

fn boolean(v: &Value, names: &[&str]) -> Res<bool> {
    match get(v, names) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => bad(format!("{}: expected a boolean", names.first().copied().unwrap_or(""))),
    }
}

fn string(v: &Value, names: &[&str]) -> Res<String> {
    match get(v, names) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => bad(format!("{}: expected a string", names.first().copied().unwrap_or(""))),
    }
}

fn array<'a>(v: &'a Value, names: &[&str]) -> Res<&'a [Value]> {
    match get(v, names) {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => bad(format!("{}: expected an array", names.first().copied().unwrap_or(""))),
    }
}

fn object<'a>(v: &'a Value, what: &str) -> Res<&'a Map<String, Value>> {
    v.as_object().map_or_else(|| bad(format!("{what}: expected an object")), Ok)
}

/// An int64 as the gateway writes it.
fn s64(x: i64) -> Value {
    Value::String(x.to_string())
}

fn b64(b: &[u8]) -> Value {
    Value::String(base64::encode(b))
}

/// Inserts `key: value` unless `value` is the default (omitted like the gateway does).
fn put_int(m: &mut Map<String, Value>, key: &str, x: i64) {
    if x != 0 {
        m.insert(key.to_string(), s64(x));
    }
}

fn put_bytes(m: &mut Map<String, Value>, key: &str, b: &[u8]) {
    if !b.is_empty() {
        m.insert(key.to_string(), b64(b));
    }
}

fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// The first JSON value of a body (a streamed answer may hold several, one per line).
fn first_json(body: &[u8]) -> Res<Value> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => bad(format!("invalid JSON: {e}")),
        None => bad("empty body"),
    }
}

/// The JSON of a 200 answer, or the error the answer carries.
pub fn answer(status: u16, body: &[u8]) -> Res<Value> {
    if status == 0 {
        return Err(EtcdError::NoResponse);
    }
    if status != 200 {
        let v = first_json(body).unwrap_or(Value::Null);
        let message = match get(&v, &["message"]) {
            Some(Value::String(s)) => s.clone(),
            _ => match get(&v, &["error"]) {
                Some(Value::String(s)) => s.clone(),
                _ => String::from_utf8_lossy(body.get(..body.len().min(200)).unwrap_or_default()).into_owned(),
            },
        };
        let code = match get(&v, &["code"]) {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            _ => 0,
        };
        return Err(EtcdError::Status { status, code, message });
    }
    first_json(body)
}

/// A streamed answer's message (`{"result": ...}`), or the error it carries (`{"error": ...}`).
fn stream_result(v: &Value) -> Res<&Value> {
    if let Some(e) = get(v, &["error"]) {
        let message = match get(e, &["message"]) {
            Some(Value::String(s)) => s.clone(),
            _ => e.to_string(),
        };
        let code = get(e, &["grpc_code", "code"]).and_then(Value::as_i64).unwrap_or(0);
        let status = get(e, &["http_code"]).and_then(Value::as_u64).and_then(|s| u16::try_from(s).ok()).unwrap_or(500);
        return Err(EtcdError::Status { status, code, message });
    }
    get(v, &["result"]).map_or_else(|| bad("stream message without result"), Ok)
}

/// An error body as the 3.4/3.5 gateway writes it.
pub fn error_body(code: i64, message: &str) -> Vec<u8> {
    to_vec(&json!({"error": message, "code": code, "message": message}))
}

/// The HTTP status the gateway answers for a gRPC code (`runtime.HTTPStatusFromCode`).
pub fn http_status(code: i64) -> u16 {
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

/// `range_end` for every key starting with `prefix` (clientv3 `GetPrefixRangeEnd`): the prefix
/// with its last byte below 0xff incremented and what follows dropped; `\0` (every key from
/// `prefix` on) when there is none.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last.saturating_add(1));
            return end;
        }
    }
    vec![0]
}

// ---------------------------------------------------------------------------------------------
// requests

/// `{"name", "password"}` for `/v3/auth/authenticate`.
pub fn authenticate_request(name: &str, password: &str) -> Vec<u8> {
    to_vec(&json!({"name": name, "password": password}))
}

/// `{"TTL"}` for `/v3/lease/grant` (etcd picks the ID).
pub fn lease_grant_request(ttl_secs: i64) -> Vec<u8> {
    to_vec(&json!({"TTL": s64(ttl_secs)}))
}

/// `{"ID"}` for `/v3/lease/keepalive` and `/v3/lease/revoke`.
pub fn lease_id_request(id: i64) -> Vec<u8> {
    to_vec(&json!({"ID": s64(id)}))
}

/// The TTL of a grant request, the ID of a keepalive / revoke request.
pub fn decode_lease_request(body: &[u8]) -> Res<(i64, i64)> {
    let v = first_json(body)?;
    object(&v, "lease request")?;
    Ok((int(&v, &["ID"])?, int(&v, &["TTL"])?))
}

/// Name and password of an authenticate request.
pub fn decode_authenticate_request(body: &[u8]) -> Res<(String, String)> {
    let v = first_json(body)?;
    object(&v, "authenticate request")?;
    Ok((string(&v, &["name"])?, string(&v, &["password"])?))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: Vec<u8>,
    /// Empty: the single key `key`.
    pub range_end: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// 0: no lease.
    pub lease: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
}

/// `Compare.CompareTarget` with the value compared against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// `Compare.CompareResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    /// Non-empty: the compare holds for every key in `[key, range_end)` (etcd 3.3+).
    pub range_end: Vec<u8>,
    pub result: CompareResult,
    pub target: CompareTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

impl RangeRequest {
    /// Every key under `prefix`.
    pub fn prefix(prefix: &[u8]) -> RangeRequest {
        RangeRequest { key: prefix.to_vec(), range_end: prefix_range_end(prefix) }
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), b64(&self.key));
        put_bytes(&mut m, "range_end", &self.range_end);
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<RangeRequest> {
        object(v, "range request")?;
        Ok(RangeRequest { key: bytes(v, &["key"])?, range_end: bytes(v, &["range_end", "rangeEnd"])? })
    }
}

impl PutRequest {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), b64(&self.key));
        put_bytes(&mut m, "value", &self.value);
        put_int(&mut m, "lease", self.lease);
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<PutRequest> {
        object(v, "put request")?;
        Ok(PutRequest { key: bytes(v, &["key"])?, value: bytes(v, &["value"])?, lease: int(v, &["lease"])? })
    }
}

impl RequestOp {
    pub fn to_json(&self) -> Value {
        match self {
            RequestOp::Range(r) => json!({"request_range": r.to_json()}),
            RequestOp::Put(p) => json!({"request_put": p.to_json()}),
            RequestOp::DeleteRange(d) => {
                let mut m = Map::new();
                m.insert("key".into(), b64(&d.key));
                put_bytes(&mut m, "range_end", &d.range_end);
                json!({"request_delete_range": Value::Object(m)})
            }
        }
    }

    pub fn from_json(v: &Value) -> Res<RequestOp> {
        if let Some(r) = get(v, &["request_range", "requestRange"]) {
            return Ok(RequestOp::Range(RangeRequest::from_json(r)?));
        }
        if let Some(p) = get(v, &["request_put", "requestPut"]) {
            return Ok(RequestOp::Put(PutRequest::from_json(p)?));
        }
        if let Some(d) = get(v, &["request_delete_range", "requestDeleteRange"]) {
            object(d, "delete range request")?;
            return Ok(RequestOp::DeleteRange(DeleteRangeRequest {
                key: bytes(d, &["key"])?,
                range_end: bytes(d, &["range_end", "rangeEnd"])?,
            }));
        }
        bad("request op: expected request_range, request_put or request_delete_range")
    }
}

/// An enum field: its name or its number, the first variant when absent.
fn enum_index(v: &Value, names: &[&str], variants: &[&str]) -> Res<usize> {
    match get(v, names) {
        None => Ok(0),
        Some(Value::String(s)) => variants.iter().position(|x| x == s).map_or_else(|| bad(format!("unknown enum value {s:?}")), Ok),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < variants.len())
            .map_or_else(|| bad(format!("unknown enum value {n}")), Ok),
        Some(_) => bad("enum: expected a string or a number"),
    }
}

const TARGETS: [&str; 5] = ["VERSION", "CREATE", "MOD", "VALUE", "LEASE"];
const RESULTS: [&str; 4] = ["EQUAL", "GREATER", "LESS", "NOT_EQUAL"];

impl Compare {
    /// Every key in `[key, range_end)` has a mod revision below `revision` (nothing in that range
    /// was written after `revision − 1`; an empty range passes).
    pub fn mod_less(key: &[u8], range_end: &[u8], revision: i64) -> Compare {
        Compare { key: key.to_vec(), range_end: range_end.to_vec(), result: CompareResult::Less, target: CompareTarget::Mod(revision) }
    }

    /// `key`'s mod revision is `revision` (0: the key does not exist).
    pub fn mod_equal(key: &[u8], revision: i64) -> Compare {
        Compare { key: key.to_vec(), range_end: Vec::new(), result: CompareResult::Equal, target: CompareTarget::Mod(revision) }
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), b64(&self.key));
        put_bytes(&mut m, "range_end", &self.range_end);
        let result = match self.result {
            CompareResult::Equal => "EQUAL",
            CompareResult::Greater => "GREATER",
            CompareResult::Less => "LESS",
            CompareResult::NotEqual => "NOT_EQUAL",
        };
        m.insert("result".into(), result.into());
        let (target, field, value) = match &self.target {
            CompareTarget::Version(x) => ("VERSION", "version", s64(*x)),
            CompareTarget::Create(x) => ("CREATE", "create_revision", s64(*x)),
            CompareTarget::Mod(x) => ("MOD", "mod_revision", s64(*x)),
            CompareTarget::Value(b) => ("VALUE", "value", b64(b)),
            CompareTarget::Lease(x) => ("LEASE", "lease", s64(*x)),
        };
        m.insert("target".into(), target.into());
        m.insert(field.into(), value);
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<Compare> {
        object(v, "compare")?;
        let result = match enum_index(v, &["result"], &RESULTS)? {
            0 => CompareResult::Equal,
            1 => CompareResult::Greater,
            2 => CompareResult::Less,
            _ => CompareResult::NotEqual,
        };
        let target = match enum_index(v, &["target"], &TARGETS)? {
            0 => CompareTarget::Version(int(v, &["version"])?),
            1 => CompareTarget::Create(int(v, &["create_revision", "createRevision"])?),
            2 => CompareTarget::Mod(int(v, &["mod_revision", "modRevision"])?),
            3 => CompareTarget::Value(bytes(v, &["value"])?),
            _ => CompareTarget::Lease(int(v, &["lease"])?),
        };
        Ok(Compare { key: bytes(v, &["key"])?, range_end: bytes(v, &["range_end", "rangeEnd"])?, result, target })
    }
}

impl TxnRequest {
    pub fn to_json(&self) -> Value {
        let ops = |o: &[RequestOp]| Value::Array(o.iter().map(RequestOp::to_json).collect());
        json!({
            "compare": Value::Array(self.compare.iter().map(Compare::to_json).collect()),
            "success": ops(&self.success),
            "failure": ops(&self.failure),
        })
    }

    pub fn to_body(&self) -> Vec<u8> {
        to_vec(&self.to_json())
    }

    pub fn from_body(body: &[u8]) -> Res<TxnRequest> {
        let v = first_json(body)?;
        object(&v, "txn request")?;
        let ops = |name: &str| array(&v, &[name])?.iter().map(RequestOp::from_json).collect::<Res<Vec<_>>>();
        Ok(TxnRequest {
            compare: array(&v, &["compare"])?.iter().map(Compare::from_json).collect::<Res<Vec<_>>>()?,
            success: ops("success")?,
            failure: ops("failure")?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// responses

/// `ResponseHeader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: u64,
    /// The store revision when the request was applied.
    pub revision: i64,
    pub raft_term: u64,
}

impl Header {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put_u = |k: &str, x: u64| {
            if x != 0 {
                m.insert(k.to_string(), Value::String(x.to_string()));
            }
        };
        put_u("cluster_id", self.cluster_id);
        put_u("member_id", self.member_id);
        put_int(&mut m, "revision", self.revision);
        if self.raft_term != 0 {
            m.insert("raft_term".into(), Value::String(self.raft_term.to_string()));
        }
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<Header> {
        match get(v, &["header"]) {
            None => Ok(Header::default()),
            Some(h) => {
                object(h, "header")?;
                Ok(Header {
                    cluster_id: uint(h, &["cluster_id"])?,
                    member_id: uint(h, &["member_id"])?,
                    revision: int(h, &["revision"])?,
                    raft_term: uint(h, &["raft_term"])?,
                })
            }
        }
    }
}

/// `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Vec<u8>,
    pub lease: i64,
}

impl KeyValue {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        put_bytes(&mut m, "key", &self.key);
        put_int(&mut m, "create_revision", self.create_revision);
        put_int(&mut m, "mod_revision", self.mod_revision);
        put_int(&mut m, "version", self.version);
        put_bytes(&mut m, "value", &self.value);
        put_int(&mut m, "lease", self.lease);
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<KeyValue> {
        object(v, "kv")?;
        Ok(KeyValue {
            key: bytes(v, &["key"])?,
            create_revision: int(v, &["create_revision"])?,
            mod_revision: int(v, &["mod_revision"])?,
            version: int(v, &["version"])?,
            value: bytes(v, &["value"])?,
            lease: int(v, &["lease"])?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    pub header: Header,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

impl RangeResponse {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("header".into(), self.header.to_json());
        if !self.kvs.is_empty() {
            m.insert("kvs".into(), Value::Array(self.kvs.iter().map(KeyValue::to_json).collect()));
        }
        if self.more {
            m.insert("more".into(), Value::Bool(true));
        }
        put_int(&mut m, "count", self.count);
        Value::Object(m)
    }

    pub fn from_json(v: &Value) -> Res<RangeResponse> {
        object(v, "range response")?;
        Ok(RangeResponse {
            header: Header::from_json(v)?,
            kvs: array(v, &["kvs"])?.iter().map(KeyValue::from_json).collect::<Res<Vec<_>>>()?,
            more: boolean(v, &["more"])?,
            count: int(v, &["count"])?,
        })
    }

    pub fn decode(status: u16, body: &[u8]) -> Res<RangeResponse> {
        RangeResponse::from_json(&answer(status, body)?)
    }
}

/// One answer of a txn's ops (`ResponseOp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put { header: Header },
    DeleteRange { header: Header, deleted: i64 },
}

impl ResponseOp {
    pub fn to_json(&self) -> Value {
        match self {
            ResponseOp::Range(r) => json!({"response_range": r.to_json()}),
            ResponseOp::Put { header } => json!({"response_put": {"header": header.to_json()}}),
            ResponseOp::DeleteRange { header, deleted } => {
                let mut m = Map::new();
                m.insert("header".into(), header.to_json());
                put_int(&mut m, "deleted", *deleted);
                json!({"response_delete_range": Value::Object(m)})
            }
        }
    }

    pub fn from_json(v: &Value) -> Res<ResponseOp> {
        if let Some(r) = get(v, &["response_range"]) {
            return Ok(ResponseOp::Range(RangeResponse::from_json(r)?));
        }
        if let Some(p) = get(v, &["response_put"]) {
            object(p, "put response")?;
            return Ok(ResponseOp::Put { header: Header::from_json(p)? });
        }
        if let Some(d) = get(v, &["response_delete_range"]) {
            object(d, "delete range response")?;
            return Ok(ResponseOp::DeleteRange { header: Header::from_json(d)?, deleted: int(d, &["deleted"])? });
        }
        bad("response op: expected response_range, response_put or response_delete_range")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    pub header: Header,
    /// Absent in JSON when false.
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

impl TxnResponse {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("header".into(), self.header.to_json());
        if self.succeeded {
            m.insert("succeeded".into(), Value::Bool(true));
        }
        if !self.responses.is_empty() {
            m.insert("responses".into(), Value::Array(self.responses.iter().map(ResponseOp::to_json).collect()));
        }
        Value::Object(m)
    }

    pub fn decode(status: u16, body: &[u8]) -> Res<TxnResponse> {
        let v = answer(status, body)?;
        object(&v, "txn response")?;
        Ok(TxnResponse {
            header: Header::from_json(&v)?,
            succeeded: boolean(&v, &["succeeded"])?,
            responses: array(&v, &["responses"])?.iter().map(ResponseOp::from_json).collect::<Res<Vec<_>>>()?,
        })
    }

    /// The first range answer among the responses.
    pub fn range(&self) -> Option<&RangeResponse> {
        self.responses.iter().find_map(|r| match r {
            ResponseOp::Range(r) => Some(r),
            _ => None,
        })
    }
}

/// A lease grant or keepalive answer: the lease and its remaining TTL in seconds (0 — absent
/// in JSON — when the lease does not exist).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseResponse {
    pub header: Header,
    pub id: i64,
    pub ttl: i64,
    /// `LeaseGrantResponse.error`.
    pub error: String,
}

impl LeaseResponse {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("header".into(), self.header.to_json());
        put_int(&mut m, "ID", self.id);
        put_int(&mut m, "TTL", self.ttl);
        if !self.error.is_empty() {
            m.insert("error".into(), Value::String(self.error.clone()));
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> Res<LeaseResponse> {
        object(v, "lease response")?;
        Ok(LeaseResponse { header: Header::from_json(v)?, id: int(v, &["ID"])?, ttl: int(v, &["TTL"])?, error: string(v, &["error"])? })
    }

    /// `/v3/lease/grant`'s answer.
    pub fn decode_grant(status: u16, body: &[u8]) -> Res<LeaseResponse> {
        let r = LeaseResponse::from_json(&answer(status, body)?)?;
        if !r.error.is_empty() {
            return Err(EtcdError::Status { status, code: 0, message: r.error });
        }
        if r.id == 0 || r.ttl <= 0 {
            return bad("lease grant without an ID or a TTL");
        }
        Ok(r)
    }

    /// `/v3/lease/keepalive`'s answer: one streamed message `{"result": ...}`.
    pub fn decode_keepalive(status: u16, body: &[u8]) -> Res<LeaseResponse> {
        let v = answer(status, body)?;
        LeaseResponse::from_json(stream_result(&v)?)
    }

    /// A keepalive answer as the gateway streams it.
    pub fn keepalive_body(&self) -> Vec<u8> {
        let mut b = to_vec(&json!({"result": self.to_json()}));
        b.push(b'\n');
        b
    }
}

/// `/v3/lease/revoke`'s and other header-only answers.
pub fn decode_header_only(status: u16, body: &[u8]) -> Res<Header> {
    let v = answer(status, body)?;
    object(&v, "response")?;
    Header::from_json(&v)
}

/// `/v3/auth/authenticate`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthenticateResponse {
    pub header: Header,
    pub token: String,
}

impl AuthenticateResponse {
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("header".into(), self.header.to_json());
        if !self.token.is_empty() {
            m.insert("token".into(), Value::String(self.token.clone()));
        }
        Value::Object(m)
    }

    pub fn decode(status: u16, body: &[u8]) -> Res<AuthenticateResponse> {
        let v = answer(status, body)?;
        object(&v, "authenticate response")?;
        let r = AuthenticateResponse { header: Header::from_json(&v)?, token: string(&v, &["token"])? };
        if r.token.is_empty() {
            return bad("authenticate answer without a token");
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_end_of_prefixes() {
        assert_eq!(prefix_range_end(b"/a/"), b"/a0");
        assert_eq!(prefix_range_end(b"a\xff"), b"b");
        assert_eq!(prefix_range_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_range_end(b""), b"\0");
    }

    #[test]
    fn compare_json_round_trip() {
        let c = Compare::mod_less(b"/p/", b"/p0", 43);
        let v = c.to_json();
        assert_eq!(v, json!({"key": "L3Av", "range_end": "L3Aw", "result": "LESS", "target": "MOD", "mod_revision": "43"}));
        assert_eq!(Compare::from_json(&v).unwrap(), c);
        // Defaults: target VERSION, result EQUAL; numbers for enums.
        let c = Compare::from_json(&json!({"key": "YQ==", "target": 2, "result": 0, "modRevision": 5})).unwrap();
        assert_eq!(c, Compare::mod_equal(b"a", 5));
        assert_eq!(Compare::from_json(&json!({"key": "YQ=="})).unwrap().target, CompareTarget::Version(0));
        assert!(Compare::from_json(&json!({"key": "YQ==", "target": "AGE"})).is_err());
    }

    #[test]
    fn errors_and_defaults() {
        assert_eq!(answer(0, b""), Err(EtcdError::NoResponse));
        let e = RangeResponse::decode(404, &error_body(codes::NOT_FOUND, ERR_LEASE_NOT_FOUND)).unwrap_err();
        assert!(e.is_lease_not_found() && !e.is_auth());
        let e = TxnResponse::decode(401, br#"{"code":16,"message":"etcdserver: invalid auth token"}"#).unwrap_err();
        assert!(e.is_auth());
        let e = TxnResponse::decode(503, b"upstream connect error").unwrap_err();
        assert_eq!(e, EtcdError::Status { status: 503, code: 0, message: "upstream connect error".into() });
        let t = TxnResponse::decode(200, br#"{"header":{"revision":"7"}}"#).unwrap();
        assert_eq!((t.header.revision, t.succeeded, t.responses.len()), (7, false, 0));
        assert!(TxnResponse::decode(200, br#"{"header":{"revision":7.5}}"#).is_err());
        assert!(TxnResponse::decode(200, br#"{"succeeded":"true"}"#).is_err());
        assert!(RangeResponse::decode(200, br#"{"kvs":[{"key":"!!"}]}"#).is_err());
        assert!(RangeResponse::decode(200, b"[]").is_err());
        let k = LeaseResponse::decode_keepalive(200, b"{\"result\":{\"header\":{\"revision\":\"3\"},\"ID\":\"12\"}}\n").unwrap();
        assert_eq!((k.id, k.ttl), (12, 0));
        let e = LeaseResponse::decode_keepalive(
            200,
            br#"{"error":{"grpc_code":5,"http_code":404,"message":"etcdserver: requested lease not found"}}"#,
        );
        assert!(e.unwrap_err().is_lease_not_found());
        assert!(LeaseResponse::decode_grant(200, br#"{"ID":"5","TTL":"5","error":"too many leases"}"#).is_err());
        assert!(AuthenticateResponse::decode(200, br#"{"header":{}}"#).is_err());
    }
}
