//! A host for one request outside any proxy: `apf classify` and the playground digest a request
//! through the very function the filter runs ([`super::request::digest_request`]), from its
//! headers and connection facts. Nothing else is hosted: no streams to pause, no stats, no calls.

use super::host::{serialize_pairs, Body, CallError, HeaderMap, Host, StatKind};
use crate::engine::store::{MemStore, Store};
use crate::Nanos;
use std::time::Duration;

/// One request: its headers (`:method`, `:path` and the rest, lowercase names) and the
/// properties the identity sources read (`source.address`, `connection.mtls`,
/// `connection.subject_peer_certificate`).
#[derive(Default)]
pub struct OneRequest {
    pub headers: Vec<(String, Vec<u8>)>,
    pub properties: Vec<(String, Vec<u8>)>,
    store: MemStore,
}

impl OneRequest {
    pub fn new(method: &str, path: &str, headers: &[(String, Vec<u8>)]) -> OneRequest {
        let mut all = vec![(":method".to_string(), method.as_bytes().to_vec()), (":path".to_string(), path.as_bytes().to_vec())];
        all.extend(headers.iter().cloned());
        OneRequest { headers: all, ..OneRequest::default() }
    }

    /// Sets the property `path` (dot-separated, e.g. `source.address`).
    pub fn property(mut self, path: &str, value: &[u8]) -> OneRequest {
        self.properties.push((path.to_string(), value.to_vec()));
        self
    }
}

impl Host for OneRequest {
    fn monotonic_nanos(&self) -> Nanos {
        0
    }
    fn realtime_nanos(&self) -> Nanos {
        0
    }
    fn store(&self) -> &dyn Store {
        &self.store
    }
    fn header_map_bytes(&self, map: HeaderMap) -> Vec<u8> {
        if map != HeaderMap::Request {
            return Vec::new();
        }
        let h: Vec<(&str, &[u8])> = self.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
        serialize_pairs(&h)
    }
    fn add_header(&self, _map: HeaderMap, _name: &str, _value: &[u8]) -> bool {
        false
    }
    fn remove_header(&self, _map: HeaderMap, _name: &str) -> bool {
        false
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let want = path.join(".");
        self.properties.iter().find(|(k, _)| *k == want).map(|(_, v)| v.clone())
    }
    fn body_bytes(&self, _body: Body, _start: usize, _max: usize) -> Option<Vec<u8>> {
        None
    }
    fn send_response(&self, _status: u32, _headers: &[(&str, &[u8])], _body: &[u8]) -> bool {
        false
    }
    fn set_effective_context(&self, _context: u32) -> bool {
        false
    }
    fn resume_request(&self) -> bool {
        false
    }
    fn register_queue(&self, _name: &str) -> Result<u32, u32> {
        Err(0)
    }
    fn resolve_queue(&self, _name: &str) -> Option<u32> {
        None
    }
    fn enqueue(&self, _queue: u32, _msg: &[u8]) -> bool {
        false
    }
    fn dequeue(&self, _queue: u32) -> Result<Option<Vec<u8>>, u32> {
        Ok(None)
    }
    fn define_metric(&self, _kind: StatKind, _name: &str) -> Option<u32> {
        None
    }
    fn increment_metric(&self, _id: u32, _by: i64) {}
    fn record_metric(&self, _id: u32, _value: u64) {}
    fn http_call(&self, _cluster: &str, _headers: &[(&str, &str)], _body: &[u8], _timeout: Duration) -> Result<u32, CallError> {
        Err(CallError::NoProxy)
    }
    fn set_tick_period_ms(&self, _ms: u32) -> bool {
        false
    }
}
