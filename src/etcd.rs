//! The etcd v3 JSON API (the grpc-gateway at `/v3/*`, etcd 3.4 to 3.7) as serde types: a
//! replica encodes requests and decodes responses, the in-memory model
//! (`simulate/memetcd.rs`) the reverse, through the same derives. The gateway's conventions
//! (etcd `api/etcdserverpb/gw/rpc.pb.gw.go`), written once in [`wire`]: keys and values base64,
//! 64-bit integers JSON strings (numbers accepted), default values omitted, snake_case names
//! (camelCase accepted in requests). Errors are a non-200 status with `{"error", "code",
//! "message"}` (3.6 dropped `error`), or `{"error": {...}}` in a streamed answer. Every decoder
//! is total: anything malformed is an [`EtcdError`], never a panic.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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
    pub const FAILED_PRECONDITION: i64 = 9;
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

impl std::error::Error for EtcdError {}

type Res<T> = Result<T, EtcdError>;

fn bad<T>(what: impl Into<String>) -> Res<T> {
    Err(EtcdError::Malformed(what.into()))
}

/// The gateway's field encodings, for `#[serde(with = ...)]` and `deserialize_with`. A JSON
/// `null` counts as the field's absence (its default).
pub mod wire {
    use serde::de::{DeserializeOwned, Error};
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    /// An int64 / uint64 as the gateway writes it: a JSON string (a number accepted).
    pub mod int {
        use super::*;

        pub fn serialize<S: Serializer, T: std::fmt::Display>(x: &T, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(x)
        }

        pub fn deserialize<'de, D: Deserializer<'de>, T: std::str::FromStr + Default>(d: D) -> Result<T, D::Error> {
            let parse = |s: &str| s.parse::<T>().map_err(|_| D::Error::custom(format!("{s:?} is not a 64-bit integer")));
            match Value::deserialize(d)? {
                Value::Null => Ok(T::default()),
                Value::String(s) => parse(&s),
                Value::Number(n) => parse(&n.to_string()),
                _ => Err(D::Error::custom("expected an integer")),
            }
        }
    }

    /// Bytes as base64 (`base64.StdEncoding`, as Go's `encoding/json` writes `[]byte`).
    pub mod bytes {
        use super::*;
        use crate::base64;

        pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&base64::encode(b))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            match Value::deserialize(d)? {
                Value::Null => Ok(Vec::new()),
                Value::String(s) => base64::decode(&s).map_err(D::Error::custom),
                _ => Err(D::Error::custom("expected a base64 string")),
            }
        }
    }

    /// Any value, `null` as the default.
    pub fn or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }

    /// A message: a JSON object (serde would also take an array for a struct).
    pub fn object<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(T::default()),
            v => super::from_object(&v).map_err(D::Error::custom),
        }
    }

    /// A repeated message: an array of objects.
    pub fn objects<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(Vec::new()),
            Value::Array(a) => a.iter().map(|v| super::from_object(v).map_err(D::Error::custom)).collect(),
            _ => Err(D::Error::custom("expected an array")),
        }
    }

    /// An enum: its name, or its number (`null`: the first variant).
    pub fn enumeration<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<T, D::Error> {
        use serde::de::IntoDeserializer;
        let index = |i: Option<u64>| u32::try_from(i.unwrap_or(u64::MAX)).map_err(D::Error::custom);
        match Value::deserialize(d)? {
            Value::Null => T::deserialize(0u32.into_deserializer()),
            Value::Number(n) => T::deserialize(index(n.as_u64())?.into_deserializer()),
            v => T::deserialize(v).map_err(D::Error::custom),
        }
    }

    pub fn is_default<T: Default + PartialEq>(x: &T) -> bool {
        *x == T::default()
    }
}

/// A message decoded from a JSON object.
fn from_object<T: serde::de::DeserializeOwned>(v: &Value) -> Res<T> {
    if !v.is_object() {
        return bad("expected an object");
    }
    T::deserialize(v).or_else(|e| bad(e.to_string()))
}

/// A message's JSON (serializing these types cannot fail).
pub fn to_vec<T: Serialize>(v: &T) -> Vec<u8> {
    let body = serde_json::to_vec(v);
    debug_assert!(body.is_ok(), "JSON of a message");
    body.unwrap_or_default()
}

/// `to_json` / `from_json` for the messages, through their serde derives.
macro_rules! json_codec {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn to_json(&self) -> Value {
                serde_json::to_value(self).unwrap_or(Value::Null)
            }

            pub fn from_json(v: &Value) -> Res<$t> {
                from_object(v)
            }
        }
    )*};
}

json_codec!(RangeRequest, PutRequest, Compare, TxnRequest, KeyValue, RangeResponse, TxnResponse, LeaseResponse, AuthenticateResponse);

/// The first JSON value of a body (a streamed answer may hold several, one per line).
fn first_json(body: &[u8]) -> Res<Value> {
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => bad(format!("invalid JSON: {e}")),
        None => bad("empty body"),
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The JSON of a 200 answer, or the error the answer carries.
pub fn answer(status: u16, body: &[u8]) -> Res<Value> {
    if status == 0 {
        return Err(EtcdError::NoResponse);
    }
    if status != 200 {
        let v = first_json(body).unwrap_or(Value::Null);
        let raw = || String::from_utf8_lossy(body.get(..body.len().min(200)).unwrap_or_default()).into_owned();
        let message = text(&v, "message").or_else(|| text(&v, "error")).unwrap_or_else(raw);
        let code = v.get("code").and_then(Value::as_i64).unwrap_or(0);
        return Err(EtcdError::Status { status, code, message });
    }
    first_json(body)
}

/// A streamed answer's message (`{"result": ...}`), or the error it carries (`{"error": ...}`).
fn stream_result(v: &Value) -> Res<&Value> {
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        let message = text(e, "message").unwrap_or_else(|| e.to_string());
        let code = ["grpc_code", "code"].iter().find_map(|k| e.get(k).filter(|x| !x.is_null())).and_then(Value::as_i64).unwrap_or(0);
        let status = e.get("http_code").and_then(Value::as_u64).and_then(|s| u16::try_from(s).ok()).unwrap_or(500);
        return Err(EtcdError::Status { status, code, message });
    }
    v.get("result").filter(|r| !r.is_null()).map_or_else(|| bad("stream message without result"), Ok)
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

/// `{"name", "password"}` for `/v3/auth/authenticate`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthenticateRequest {
    #[serde(deserialize_with = "wire::or_default")]
    pub name: String,
    #[serde(deserialize_with = "wire::or_default")]
    pub password: String,
}

/// `{"TTL"}` for `/v3/lease/grant` (etcd picks the ID), `{"ID"}` for `/v3/lease/keepalive` and
/// `/v3/lease/revoke`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LeaseRequest {
    #[serde(rename = "ID", with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub id: i64,
    #[serde(rename = "TTL", with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub ttl: i64,
}

pub fn authenticate_request(name: &str, password: &str) -> Vec<u8> {
    to_vec(&AuthenticateRequest { name: name.to_string(), password: password.to_string() })
}

pub fn lease_grant_request(ttl_secs: i64) -> Vec<u8> {
    to_vec(&LeaseRequest { id: 0, ttl: ttl_secs })
}

pub fn lease_id_request(id: i64) -> Vec<u8> {
    to_vec(&LeaseRequest { id, ttl: 0 })
}

/// A request body (an object).
pub fn decode_request<T: serde::de::DeserializeOwned>(body: &[u8]) -> Res<T> {
    from_object(&first_json(body)?)
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RangeRequest {
    #[serde(with = "wire::bytes")]
    pub key: Vec<u8>,
    /// Empty: the single key `key`.
    #[serde(with = "wire::bytes", alias = "rangeEnd", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PutRequest {
    #[serde(with = "wire::bytes")]
    pub key: Vec<u8>,
    #[serde(with = "wire::bytes", skip_serializing_if = "Vec::is_empty")]
    pub value: Vec<u8>,
    /// 0: no lease.
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub lease: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    #[serde(rename = "request_range", alias = "requestRange")]
    Range(RangeRequest),
    #[serde(rename = "request_put", alias = "requestPut")]
    Put(PutRequest),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompareResult {
    #[default]
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// `Compare.CompareTarget`'s names.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum TargetName {
    #[default]
    Version,
    Create,
    Mod,
    Value,
    Lease,
}

/// A compare on the wire: the target's name and its value in the field of that name (written
/// even when 0, as the `target_union` oneof is), enums by name or number.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct CompareWire {
    #[serde(with = "wire::bytes")]
    key: Vec<u8>,
    #[serde(with = "wire::bytes", alias = "rangeEnd", skip_serializing_if = "Vec::is_empty")]
    range_end: Vec<u8>,
    #[serde(deserialize_with = "wire::enumeration")]
    result: CompareResult,
    #[serde(deserialize_with = "wire::enumeration")]
    target: TargetName,
    #[serde(skip_serializing_if = "Value::is_null")]
    version: Value,
    #[serde(alias = "createRevision", skip_serializing_if = "Value::is_null")]
    create_revision: Value,
    #[serde(alias = "modRevision", skip_serializing_if = "Value::is_null")]
    mod_revision: Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    value: Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    lease: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CompareWire", into = "CompareWire")]
pub struct Compare {
    pub key: Vec<u8>,
    /// Non-empty: the compare holds for every key in `[key, range_end)` (etcd 3.3+).
    pub range_end: Vec<u8>,
    pub result: CompareResult,
    pub target: CompareTarget,
}

impl TryFrom<CompareWire> for Compare {
    type Error = serde_json::Error;

    fn try_from(w: CompareWire) -> Result<Compare, serde_json::Error> {
        let target = match w.target {
            TargetName::Version => CompareTarget::Version(wire::int::deserialize(w.version)?),
            TargetName::Create => CompareTarget::Create(wire::int::deserialize(w.create_revision)?),
            TargetName::Mod => CompareTarget::Mod(wire::int::deserialize(w.mod_revision)?),
            TargetName::Value => CompareTarget::Value(wire::bytes::deserialize(w.value)?),
            TargetName::Lease => CompareTarget::Lease(wire::int::deserialize(w.lease)?),
        };
        Ok(Compare { key: w.key, range_end: w.range_end, result: w.result, target })
    }
}

impl From<Compare> for CompareWire {
    fn from(c: Compare) -> CompareWire {
        let mut w = CompareWire { key: c.key, range_end: c.range_end, result: c.result, ..CompareWire::default() };
        let (target, slot, value) = match c.target {
            CompareTarget::Version(x) => (TargetName::Version, &mut w.version, x.to_string()),
            CompareTarget::Create(x) => (TargetName::Create, &mut w.create_revision, x.to_string()),
            CompareTarget::Mod(x) => (TargetName::Mod, &mut w.mod_revision, x.to_string()),
            CompareTarget::Value(b) => (TargetName::Value, &mut w.value, crate::base64::encode(&b)),
            CompareTarget::Lease(x) => (TargetName::Lease, &mut w.lease, x.to_string()),
        };
        *slot = Value::String(value);
        w.target = target;
        w
    }
}

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
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TxnRequest {
    #[serde(deserialize_with = "wire::objects")]
    pub compare: Vec<Compare>,
    #[serde(deserialize_with = "wire::objects")]
    pub success: Vec<RequestOp>,
    #[serde(deserialize_with = "wire::objects")]
    pub failure: Vec<RequestOp>,
}

impl RangeRequest {
    /// Every key under `prefix`.
    pub fn prefix(prefix: &[u8]) -> RangeRequest {
        RangeRequest { key: prefix.to_vec(), range_end: prefix_range_end(prefix) }
    }
}

impl TxnRequest {
    pub fn to_body(&self) -> Vec<u8> {
        to_vec(self)
    }

    pub fn from_body(body: &[u8]) -> Res<TxnRequest> {
        decode_request(body)
    }
}

/// `ResponseHeader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Header {
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub cluster_id: u64,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub member_id: u64,
    /// The store revision when the request was applied.
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub revision: i64,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub raft_term: u64,
}

/// `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KeyValue {
    #[serde(with = "wire::bytes", skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<u8>,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub create_revision: i64,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub mod_revision: i64,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub version: i64,
    #[serde(with = "wire::bytes", skip_serializing_if = "Vec::is_empty")]
    pub value: Vec<u8>,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub lease: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RangeResponse {
    #[serde(deserialize_with = "wire::object")]
    pub header: Header,
    #[serde(deserialize_with = "wire::objects", skip_serializing_if = "Vec::is_empty")]
    pub kvs: Vec<KeyValue>,
    #[serde(deserialize_with = "wire::or_default", skip_serializing_if = "wire::is_default")]
    pub more: bool,
    #[serde(with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub count: i64,
}

impl RangeResponse {
    pub fn decode(status: u16, body: &[u8]) -> Res<RangeResponse> {
        from_object(&answer(status, body)?)
    }
}

/// One answer of a txn's ops (`ResponseOp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_put")]
    Put {
        #[serde(default, deserialize_with = "wire::object")]
        header: Header,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TxnResponse {
    #[serde(deserialize_with = "wire::object")]
    pub header: Header,
    /// Absent in JSON when false.
    #[serde(deserialize_with = "wire::or_default", skip_serializing_if = "wire::is_default")]
    pub succeeded: bool,
    #[serde(deserialize_with = "wire::objects", skip_serializing_if = "Vec::is_empty")]
    pub responses: Vec<ResponseOp>,
}

impl TxnResponse {
    pub fn decode(status: u16, body: &[u8]) -> Res<TxnResponse> {
        from_object(&answer(status, body)?)
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
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LeaseResponse {
    #[serde(deserialize_with = "wire::object")]
    pub header: Header,
    #[serde(rename = "ID", with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub id: i64,
    #[serde(rename = "TTL", with = "wire::int", skip_serializing_if = "wire::is_default")]
    pub ttl: i64,
    /// `LeaseGrantResponse.error`.
    #[serde(deserialize_with = "wire::or_default", skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl LeaseResponse {
    /// `/v3/lease/grant`'s answer.
    pub fn decode_grant(status: u16, body: &[u8]) -> Res<LeaseResponse> {
        let r: LeaseResponse = from_object(&answer(status, body)?)?;
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
        from_object(stream_result(&v)?)
    }

    /// A keepalive answer as the gateway streams it.
    pub fn keepalive_body(&self) -> Vec<u8> {
        let mut b = to_vec(&json!({ "result": self }));
        b.push(b'\n');
        b
    }
}

/// A header-only answer (`/v3/lease/revoke`'s, `/v3/kv/put`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HeaderResponse {
    #[serde(deserialize_with = "wire::object")]
    pub header: Header,
}

pub fn decode_header_only(status: u16, body: &[u8]) -> Res<Header> {
    from_object(&answer(status, body)?).map(|r: HeaderResponse| r.header)
}

/// `/v3/auth/authenticate`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthenticateResponse {
    #[serde(deserialize_with = "wire::object")]
    pub header: Header,
    #[serde(deserialize_with = "wire::or_default", skip_serializing_if = "String::is_empty")]
    pub token: String,
}

impl AuthenticateResponse {
    pub fn decode(status: u16, body: &[u8]) -> Res<AuthenticateResponse> {
        let r: AuthenticateResponse = from_object(&answer(status, body)?)?;
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
        let e = RangeResponse::decode(
            404,
            &serde_json::to_vec(&json!({"error": ERR_LEASE_NOT_FOUND, "code": 5, "message": ERR_LEASE_NOT_FOUND})).unwrap(),
        )
        .unwrap_err();
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
