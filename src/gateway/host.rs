//! What the gateway asks of its proxy: the host interface.
//!
//! Everything the request logic, the timers and the polls need from Envoy goes through
//! [`Host`]: headers and properties of the current stream, local replies, pausing and resuming,
//! the clock, HTTP calls and their replies, shared data and shared queues, and stats. The
//! proxy-wasm filter implements it over the ABI (`src/filter`); tests implement it in memory
//! (`tests/common/mock_host.rs`), so every path of the filter runs natively.
//!
//! A host must defer a resumed stream's continuation and a local reply until the callback that
//! asked for them returns (Envoy does: `continueStream` and `sendLocalResponse` are queued with
//! `addAfterVmCallAction`), so the gateway never re-enters itself.

use crate::engine::store::Store;
use crate::Nanos;
use std::time::Duration;

/// A header map of the current stream or HTTP call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderMap {
    Request,
    Response,
    /// The response headers of the HTTP call being delivered.
    CallResponse,
}

/// A body the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body {
    /// The chunk of the response body being delivered.
    Response,
    /// The body of the HTTP call response being delivered.
    CallResponse,
    /// The plugin configuration being applied.
    Configuration,
}

/// The kind of a stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatKind {
    Counter,
    Gauge,
}

/// What reads a header map's pairs ([`Host::with_header_pairs`]).
pub type PairsVisitor<'a> = dyn FnMut(&[(&str, &[u8])]) + 'a;

/// What the gateway does with the stream after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Held (queued or answered locally): resumed later through [`Host::resume_request`].
    Pause,
}

/// The proxy, as the gateway sees it. Every call is total: a host error is a value (`false`,
/// `None`, `Err`), never a panic.
pub trait Host {
    /// Process-wide monotonic time in nanoseconds (one origin for every worker).
    fn monotonic_nanos(&self) -> Nanos;
    /// Wall-clock time in nanoseconds since the Unix epoch.
    fn realtime_nanos(&self) -> Nanos;
    /// The process's shared data, with this worker's engine state.
    fn store(&self) -> &dyn Store;

    /// A header map in the host's serialization (read with [`pairs`]); empty on error.
    fn header_map_bytes(&self, map: HeaderMap) -> Vec<u8>;
    /// Runs `f` once over a header map's pairs as [`pairs`] reads them (names that are not
    /// UTF-8 left out; empty on error). A host that holds the headers borrows them instead of
    /// serializing and re-reading them (the native host: an encode and a decode of the whole
    /// map per request).
    fn with_header_pairs(&self, map: HeaderMap, f: &mut PairsVisitor<'_>) {
        let raw = self.header_map_bytes(map);
        f(&pairs(&raw));
    }
    fn add_header(&self, map: HeaderMap, name: &str, value: &[u8]) -> bool;
    fn remove_header(&self, map: HeaderMap, name: &str) -> bool;
    /// A property of the current stream (e.g. `source.address`) as raw bytes.
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// `max` bytes from `start` of a body (fewer at its end; `None` on a host error).
    fn body_bytes(&self, body: Body, start: usize, max: usize) -> Option<Vec<u8>>;

    /// Answers the current (or effective) stream locally.
    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool;
    /// Makes `context` the target of the following stream calls; false if it is gone.
    fn set_effective_context(&self, context: u32) -> bool;
    /// Resumes the effective stream's request.
    fn resume_request(&self) -> bool;

    /// Registers this worker's queue `name`.
    fn register_queue(&self, name: &str) -> Result<u32, u32>;
    /// The id of this VM's queue `name` (`None`: no such queue, or a host error).
    fn resolve_queue(&self, name: &str) -> Option<u32>;
    fn enqueue(&self, queue: u32, msg: &[u8]) -> bool;
    /// Posts `msg` to `queue` for the owner's stream `context`: a host that can wake that stream
    /// directly (the native host, through the stream's scheduler) does; others enqueue.
    fn enqueue_for(&self, queue: u32, context: u32, msg: &[u8]) -> bool {
        let _ = context;
        self.enqueue(queue, msg)
    }
    /// The next message (`Ok(None)`: the queue is empty).
    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32>;

    /// Defines a stat; its id (`None` while the host refuses it).
    fn define_metric(&self, kind: StatKind, name: &str) -> Option<u32>;
    fn increment_metric(&self, id: u32, by: i64);
    fn record_metric(&self, id: u32, value: u64);

    /// Starts an HTTP call to the proxy's cluster `cluster` (`body` empty: none); its token,
    /// delivered back with the reply.
    fn http_call(&self, cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> Result<u32, CallError>;
    /// How often the root's timer fires.
    fn set_tick_period_ms(&self, ms: u32) -> bool;
}

/// Why the host did not start an HTTP call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The host refused it with this proxy-wasm status (e.g. `BadArgument`: an unknown cluster).
    Refused(u32),
    /// No proxy to call through (a request digested outside any proxy).
    NoProxy,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The ABI's status names (proxy-wasm spec, `proxy_status_t`).
        let name = |s: u32| match s {
            1 => Some("NotFound"),
            2 => Some("BadArgument"),
            3 => Some("SerializationFailure"),
            4 => Some("ParseFailure"),
            7 => Some("Empty"),
            8 => Some("CasMismatch"),
            10 => Some("InternalFailure"),
            _ => None,
        };
        match self {
            CallError::Refused(s) => match name(*s) {
                Some(n) => f.write_str(n),
                None => write!(f, "status {s}"),
            },
            CallError::NoProxy => f.write_str("no proxy"),
        }
    }
}

/// The `:status` of the HTTP call response being delivered (`None`: no response — a timeout or
/// a connection failure — or no number).
pub fn call_status(h: &dyn Host) -> Option<u16> {
    let raw = h.header_map_bytes(HeaderMap::CallResponse);
    let status = pairs(&raw).into_iter().find_map(|(k, v)| (k == ":status").then_some(v))?;
    std::str::from_utf8(status).ok()?.parse().ok()
}

/// An HTTP call's timeout from a validated (positive) duration of the configuration
/// (`fallback` in a release build if it is not).
pub fn call_timeout(nanos: crate::Nanos, fallback: Duration) -> Duration {
    debug_assert!(nanos > 0, "a call timeout of {nanos} ns passed validation");
    u64::try_from(nanos).map_or(fallback, Duration::from_nanos)
}

/// Where a poll goes: an Envoy cluster, the `:authority`, the bearer token (if any) and the
/// call's timeout.
pub struct PollTarget<'a> {
    pub cluster: &'a str,
    pub authority: &'a str,
    pub token: Option<&'a String>,
    pub timeout: Duration,
}

impl PollTarget<'_> {
    /// Starts a GET of `path`; the call's token.
    pub fn get(&self, h: &dyn Host, path: &str, accept: &str) -> Result<u32, CallError> {
        let bearer = self.token.map(|t| format!("Bearer {t}"));
        let auth = bearer.as_deref().map(|b| ("authorization", b));
        let headers = [(":method", "GET"), (":path", path), (":authority", self.authority), ("accept", accept)];
        let headers: Vec<(&str, &str)> = headers.into_iter().chain(auth).collect();
        h.http_call(self.cluster, &headers, &[], self.timeout)
    }
}

/// How a call's reply went, for the logs: `HTTP status <n>`, or no response.
pub fn describe_status(status: Option<u16>) -> String {
    status.map_or_else(|| "no response (timeout or connection failure)".to_string(), |s| format!("HTTP status {s}"))
}

/// Header pairs borrowed from the host's map serialization (u32 count, count × (u32 name
/// length, u32 value length), then each name and value followed by a NUL), without copying. A
/// non-UTF-8 name is skipped; a truncated or inconsistent buffer yields the pairs before the
/// damage.
pub fn pairs(bytes: &[u8]) -> Vec<(&str, &[u8])> {
    let rd = |at: usize| -> Option<usize> {
        let s: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(u32::from_le_bytes(s) as usize)
    };
    // Each pair's reads stop at the end of the bytes, so a count larger than the bytes hold
    // yields no invented pair (and allocates nothing: pairs are collected as they are found).
    let n = rd(0).unwrap_or(0);
    let mut p = 4usize.saturating_add(n.saturating_mul(8));
    // The `len` bytes at `p`, then past them and their NUL.
    let mut next = |len: usize| {
        let s = bytes.get(p..p.checked_add(len)?)?;
        p = p.saturating_add(len).saturating_add(1);
        Some(s)
    };
    let pairs = (0..n).map_while(|i| Some((next(rd(4 + i * 8)?)?, next(rd(8 + i * 8)?)?)));
    pairs.filter_map(|(k, v)| Some((std::str::from_utf8(k).ok()?, v))).collect()
}

/// The host's map serialization of `headers` (what [`pairs`] reads).
pub fn serialize_pairs(headers: &[(&str, &[u8])]) -> Vec<u8> {
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let sizes = headers.iter().flat_map(|(k, v)| [len(k.len()), len(v.len())]).flatten();
    let data = headers.iter().flat_map(|(k, v)| [k.as_bytes(), b"\0", v, b"\0"]).flatten();
    len(headers.len()).into_iter().chain(sizes).chain(data.copied()).collect()
}
