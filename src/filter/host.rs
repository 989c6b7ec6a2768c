//! The gateway's [`Host`] over the proxy-wasm ABI, panic-free.
//!
//! The proxy-wasm SDK's `hostcalls` wrappers `panic!` on any status they do not expect (and a
//! panic kills the worker's VM, hanging every paused request). We declare the few ABI v0.2.1
//! imports the filter uses ourselves and turn every status into a value. Buffers the host
//! returns were allocated through the SDK's exported `proxy_on_memory_allocate` (a boxed byte
//! slice), so they are reclaimed the same way the SDK does. HTTP calls go through the SDK, which
//! must know their tokens to deliver the replies to the root context.
#![allow(clashing_extern_declarations)]

use crate::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use crate::gateway::host::{serialize_pairs, Body, CallError, HeaderMap, Host, StatKind};
use crate::Nanos;
use proxy_wasm::types::{BufferType, MapType, MetricType, StreamType};
use std::cell::OnceCell;
use std::ptr::{null, null_mut};
use std::time::Duration;

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const EMPTY: u32 = 7;
const CAS_MISMATCH: u32 = 8;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_shared_data(key_data: *const u8, key_size: usize, value_data: *mut *mut u8, value_size: *mut usize, cas: *mut u32) -> u32;
    fn proxy_set_shared_data(key_data: *const u8, key_size: usize, value_data: *const u8, value_size: usize, cas: u32) -> u32;
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_resolve_shared_queue(
        vm_id_data: *const u8,
        vm_id_size: usize,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(queue_id: u32, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_get_header_map_pairs(map_type: MapType, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_add_header_map_value(map_type: MapType, key_data: *const u8, key_size: usize, value_data: *const u8, value_size: usize)
        -> u32;
    fn proxy_remove_header_map_value(map_type: MapType, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: StreamType) -> u32;
    fn proxy_get_property(path_data: *const u8, path_size: usize, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_define_metric(metric_type: MetricType, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: BufferType,
        start: usize,
        max_size: usize,
        value_data: *mut *mut u8,
        value_size: *mut usize,
    ) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
}

/// Calls a host function that hands over a buffer: the buffer (`None` if the host gave none),
/// or the status.
fn read(call: impl FnOnce(&mut *mut u8, &mut usize) -> u32) -> Result<Option<Vec<u8>>, u32> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    match call(&mut data, &mut size) {
        OK if data.is_null() => Ok(None),
        // SAFETY: allocated by proxy_on_memory_allocate as a boxed slice of exactly `size` bytes.
        OK => Ok(Some(unsafe { Vec::from_raw_parts(data, size, size) })),
        other => Err(other),
    }
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    fn clock_time_get(id: u32, precision: u64, time: *mut u64) -> u16;
}

/// A WASI clock in nanoseconds (0 on error).
fn clock(id: u32) -> i64 {
    let mut t: u64 = 0;
    // SAFETY: plain out-pointer to a local.
    let ok = unsafe { clock_time_get(id, 1, &mut t) } == 0;
    if ok {
        i64::try_from(t).unwrap_or(i64::MAX)
    } else {
        0
    }
}

/// Envoy's shared data, with this worker's own engine state ([`WorkerState`]).
#[derive(Default)]
pub struct HostStore(WorkerState);

thread_local! {
    /// One per VM (an Envoy worker), for the VM's life.
    static STORE: OnceCell<&'static dyn Store> = const { OnceCell::new() };
}

/// This worker's view of the shared store: the one [`set_store`] gave, else Envoy's shared data
/// ([`HostStore`]).
fn store() -> &'static dyn Store {
    STORE.with(|s| *s.get_or_init(|| Box::leak(Box::<HostStore>::default())))
}

/// Makes `store` this worker's view of the shared store; false when one is already in use.
pub(super) fn set_store(store: &'static dyn Store) -> bool {
    STORE.with(|s| s.set(store).is_ok())
}

impl Store for HostStore {
    fn worker(&self) -> Option<&WorkerState> {
        Some(&self.0)
    }

    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let mut cas: u32 = 0;
        // SAFETY: out-pointers from `read` and to a local; the key is a live slice.
        match read(|d, s| unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), d, s, &mut cas) }) {
            Ok(v) => Ok((v.filter(|v| !v.is_empty()), if cas == 0 { None } else { Some(cas) })),
            Err(NOT_FOUND) => Ok((None, None)),
            Err(other) => Err(StoreError(format!("get_shared_data({key}) status {other}"))),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        // SAFETY: pointers into live slices.
        let st = unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas.unwrap_or(0)) };
        match st {
            OK => Ok(SetOutcome::Written),
            CAS_MISMATCH => Ok(SetOutcome::CasMismatch),
            other => Err(StoreError(format!("set_shared_data({key}) status {other}"))),
        }
    }
}

fn status(st: u32) -> Result<(), u32> {
    (st == OK).then_some(()).ok_or(st)
}

fn map_type(map: HeaderMap) -> MapType {
    match map {
        HeaderMap::Request => MapType::HttpRequestHeaders,
        HeaderMap::Response => MapType::HttpResponseHeaders,
        HeaderMap::CallResponse => MapType::HttpCallResponseHeaders,
    }
}

/// Envoy, through the proxy-wasm ABI.
pub struct WasmHost;

impl Host for WasmHost {
    fn monotonic_nanos(&self) -> Nanos {
        clock(1)
    }

    fn realtime_nanos(&self) -> Nanos {
        clock(0)
    }

    fn store(&self) -> &dyn Store {
        store()
    }

    fn header_map_bytes(&self, map: HeaderMap) -> Vec<u8> {
        // SAFETY: out-pointers from `read`.
        read(|d, s| unsafe { proxy_get_header_map_pairs(map_type(map), d, s) }).ok().flatten().unwrap_or_default()
    }

    fn add_header(&self, map: HeaderMap, name: &str, value: &[u8]) -> bool {
        // SAFETY: pointers into live slices.
        unsafe { proxy_add_header_map_value(map_type(map), name.as_ptr(), name.len(), value.as_ptr(), value.len()) == OK }
    }

    fn remove_header(&self, map: HeaderMap, name: &str) -> bool {
        // SAFETY: pointer into a live slice.
        unsafe { proxy_remove_header_map_value(map_type(map), name.as_ptr(), name.len()) == OK }
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        // Segments separated by NUL, without a trailing one (as the ABI expects).
        let path = path.join("\0");
        // SAFETY: out-pointers from `read`; the path is a live slice.
        read(|d, s| unsafe { proxy_get_property(path.as_ptr(), path.len(), d, s) }).ok().flatten()
    }

    fn body_bytes(&self, body: Body, start: usize, max: usize) -> Option<Vec<u8>> {
        let buffer = match body {
            Body::Response => BufferType::HttpResponseBody,
            Body::CallResponse => BufferType::HttpCallResponseBody,
            Body::Configuration => BufferType::PluginConfiguration,
        };
        // SAFETY: out-pointers from `read`.
        let r = read(|d, s| unsafe { proxy_get_buffer_bytes(buffer, start, max, d, s) });
        Some(r.ok()?.unwrap_or_default())
    }

    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
        let h = serialize_pairs(headers);
        let details = "apf";
        let body_ptr = if body.is_empty() { null() } else { body.as_ptr() };
        // SAFETY: pointers into live slices.
        unsafe { proxy_send_local_response(status, details.as_ptr(), details.len(), body_ptr, body.len(), h.as_ptr(), h.len(), -1) == OK }
    }

    fn set_effective_context(&self, context: u32) -> bool {
        // SAFETY: no pointers.
        unsafe { proxy_set_effective_context(context) == OK }
    }

    fn resume_request(&self) -> bool {
        // SAFETY: no pointers.
        unsafe { proxy_continue_stream(StreamType::HttpRequest) == OK }
    }

    fn register_queue(&self, name: &str) -> Result<u32, u32> {
        let mut id: u32 = 0;
        // SAFETY: pointers to locals / live slices.
        status(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) }).map(|()| id)
    }

    fn resolve_queue(&self, name: &str) -> Option<u32> {
        let mut id: u32 = 0;
        // SAFETY: pointers to locals / live slices (an empty VM id: this VM's).
        status(unsafe { proxy_resolve_shared_queue("".as_ptr(), 0, name.as_ptr(), name.len(), &mut id) }).ok().map(|()| id)
    }

    fn enqueue(&self, queue: u32, msg: &[u8]) -> bool {
        // SAFETY: pointer into a live slice.
        unsafe { proxy_enqueue_shared_queue(queue, msg.as_ptr(), msg.len()) == OK }
    }

    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32> {
        // SAFETY: out-pointers from `read`.
        match read(|d, s| unsafe { proxy_dequeue_shared_queue(queue, d, s) }) {
            Ok(v) => Ok(Some(v.unwrap_or_default())),
            Err(EMPTY | NOT_FOUND) => Ok(None),
            Err(other) => Err(other),
        }
    }

    fn define_metric(&self, kind: StatKind, name: &str) -> Option<u32> {
        let kind = match kind {
            StatKind::Counter => MetricType::Counter,
            StatKind::Gauge => MetricType::Gauge,
        };
        let mut id: u32 = 0;
        // SAFETY: pointers to locals / live slices.
        status(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) }).ok().map(|()| id)
    }

    fn increment_metric(&self, id: u32, by: i64) {
        // SAFETY: no pointers.
        let _ = unsafe { proxy_increment_metric(id, by) };
    }

    fn record_metric(&self, id: u32, value: u64) {
        // SAFETY: no pointers.
        let _ = unsafe { proxy_record_metric(id, value) };
    }

    fn http_call(&self, cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> Result<u32, CallError> {
        // Through the SDK: it registers the token so that the reply reaches this root context.
        // It panics only on a status the ABI does not define for this call.
        let body = (!body.is_empty()).then_some(body);
        proxy_wasm::hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, vec![], timeout)
            .map_err(|s| CallError::Refused(s as u32))
    }

    fn set_tick_period_ms(&self, ms: u32) -> bool {
        // SAFETY: no pointers.
        unsafe { proxy_set_tick_period_milliseconds(ms) == OK }
    }
}
