//! Panic-free host calls.
//!
//! The proxy-wasm SDK's `hostcalls` wrappers `panic!` on any status they do not expect (and a
//! panic kills the worker's VM, hanging every paused request). We declare the few ABI v0.2.1
//! imports the filter uses ourselves and turn every status into a value. Buffers the host
//! returns were allocated through the SDK's exported `proxy_on_memory_allocate` (a boxed byte
//! slice), so they are reclaimed the same way the SDK does.
#![allow(clashing_extern_declarations)]

use crate::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use proxy_wasm::types::{BufferType, MapType, MetricType, StreamType};
use std::ptr::{null, null_mut};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const EMPTY: u32 = 7;
const CAS_MISMATCH: u32 = 8;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_shared_data(key_data: *const u8, key_size: usize, value_data: *mut *mut u8, value_size: *mut usize, cas: *mut u32) -> u32;
    fn proxy_set_shared_data(key_data: *const u8, key_size: usize, value_data: *const u8, value_size: usize, cas: u32) -> u32;
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_resolve_shared_queue(vm_id_data: *const u8, vm_id_size: usize, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_dequeue_shared_queue(queue_id: u32, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_get_header_map_pairs(map_type: MapType, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_add_header_map_value(map_type: MapType, key_data: *const u8, key_size: usize, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_remove_header_map_value(map_type: MapType, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_send_local_response(status_code: u32, details_data: *const u8, details_size: usize, body_data: *const u8, body_size: usize, headers_data: *const u8, headers_size: usize, grpc_status: i32) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: StreamType) -> u32;
    fn proxy_get_property(path_data: *const u8, path_size: usize, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
    fn proxy_define_metric(metric_type: MetricType, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_get_buffer_bytes(buffer_type: BufferType, start: usize, max_size: usize, value_data: *mut *mut u8, value_size: *mut usize) -> u32;
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

/// `max` bytes from `start` of a host buffer (fewer at its end; `None` on a host error).
pub fn buffer_bytes(buffer: BufferType, start: usize, max: usize) -> Option<Vec<u8>> {
    // SAFETY: out-pointers from `read`.
    let r = read(|d, s| unsafe { proxy_get_buffer_bytes(buffer, start, max, d, s) });
    Some(r.ok()?.unwrap_or_default())
}

pub fn set_tick_period_ms(ms: u32) -> bool {
    // SAFETY: no pointers.
    unsafe { proxy_set_tick_period_milliseconds(ms) == OK }
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
    if ok { i64::try_from(t).unwrap_or(i64::MAX) } else { 0 }
}

/// Process-wide monotonic time in nanoseconds (the same clock for every worker VM).
pub fn monotonic_nanos() -> i64 {
    clock(1)
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn realtime_nanos() -> i64 {
    clock(0)
}

/// Envoy's shared data, with this worker's own engine state ([`WorkerState`]).
#[derive(Default)]
pub struct HostStore(WorkerState);

#[cfg(not(feature = "bench-isolated-levels"))]
type FilterStore = HostStore;
#[cfg(feature = "bench-isolated-levels")]
type FilterStore = super::isolated_levels::IsolatedLevels<HostStore>;

thread_local! {
    /// One per VM (an Envoy worker), for the VM's life.
    static STORE: &'static FilterStore = Box::leak(Box::default());
}

/// This worker's view of the shared store.
pub fn store() -> &'static FilterStore {
    STORE.with(|s| *s)
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

pub fn register_queue(name: &str) -> Result<u32, u32> {
    let mut id: u32 = 0;
    // SAFETY: pointers to locals / live slices.
    status(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) }).map(|()| id)
}

/// The id of the queue `name` of this VM (`None`: there is none, or a host error).
pub fn resolve_queue(name: &str) -> Option<u32> {
    let mut id: u32 = 0;
    // SAFETY: pointers to locals / live slices (an empty VM id: this VM's).
    status(unsafe { proxy_resolve_shared_queue("".as_ptr(), 0, name.as_ptr(), name.len(), &mut id) }).ok().map(|()| id)
}

pub fn enqueue(queue: u32, msg: &[u8]) -> bool {
    // SAFETY: pointer into a live slice.
    unsafe { proxy_enqueue_shared_queue(queue, msg.as_ptr(), msg.len()) == OK }
}

pub fn dequeue(queue: u32) -> Result<Option<Vec<u8>>, u32> {
    // SAFETY: out-pointers from `read`.
    match read(|d, s| unsafe { proxy_dequeue_shared_queue(queue, d, s) }) {
        Ok(v) => Ok(Some(v.unwrap_or_default())),
        Err(EMPTY | NOT_FOUND) => Ok(None),
        Err(other) => Err(other),
    }
}

/// Name of a worker's mailbox (a shared queue named after its random instance id).
pub fn mailbox_name(instance: u64) -> String {
    format!("apf/v3/mailbox/{instance:016x}")
}

/// The host's serialized header map (parse with [`borrowed_pairs`]).
pub fn header_map_bytes(map: MapType) -> Vec<u8> {
    // SAFETY: out-pointers from `read`.
    read(|d, s| unsafe { proxy_get_header_map_pairs(map, d, s) }).ok().flatten().unwrap_or_default()
}

/// Header pairs borrowed from the host's map serialization (u32 count, count × (u32 name len,
/// u32 value len), then each name and value followed by a NUL), without copying (Envoy's names
/// are already lowercase; a non-UTF-8 name is skipped).
pub fn borrowed_pairs(bytes: &[u8]) -> Vec<(&str, &[u8])> {
    let rd = |at: usize| -> Option<usize> {
        let s: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(u32::from_le_bytes(s) as usize)
    };
    let n = rd(0).unwrap_or(0).min(bytes.len() / 8);
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

pub fn add_header(map: MapType, name: &str, value: &[u8]) -> bool {
    // SAFETY: pointers into live slices.
    unsafe { proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) == OK }
}

pub fn remove_header(map: MapType, name: &str) -> bool {
    // SAFETY: pointer into a live slice.
    unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) == OK }
}

/// The host's header map serialization (see [`borrowed_pairs`]).
fn serialize_map(headers: &[(&str, &[u8])]) -> Vec<u8> {
    let len = |n: usize| (n as u32).to_le_bytes();
    let sizes = headers.iter().flat_map(|(k, v)| [len(k.len()), len(v.len())]).flatten();
    let data = headers.iter().flat_map(|(k, v)| [k.as_bytes(), b"\0", v, b"\0"]).flatten();
    len(headers.len()).into_iter().chain(sizes).chain(data.copied()).collect()
}

/// Sends a local reply on the current (or effective) context.
pub fn send_response(status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
    let h = serialize_map(headers);
    let details = "apf";
    // SAFETY: pointers into live slices.
    unsafe { proxy_send_local_response(status, details.as_ptr(), details.len(), if body.is_empty() { null() } else { body.as_ptr() }, body.len(), h.as_ptr(), h.len(), -1) == OK }
}

/// Makes `context` the target of following host calls; false if it no longer exists.
pub fn set_effective_context(context: u32) -> bool {
    // SAFETY: no pointers.
    unsafe { proxy_set_effective_context(context) == OK }
}

pub fn resume_request() -> bool {
    // SAFETY: no pointers.
    unsafe { proxy_continue_stream(StreamType::HttpRequest) == OK }
}

/// A property (e.g. `source.address`) as raw bytes.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    // Segments separated by NUL, without a trailing one (as the ABI expects).
    let path = path.join("\0");
    // SAFETY: out-pointers from `read`; the path is a live slice.
    read(|d, s| unsafe { proxy_get_property(path.as_ptr(), path.len(), d, s) }).ok().flatten()
}

/// The id of the metric `name` kept in `slot`, defined on first use (`None` while the host
/// refuses it).
pub fn metric_id(slot: &mut Option<u32>, kind: MetricType, name: &str) -> Option<u32> {
    if slot.is_none() {
        let mut id: u32 = 0;
        // SAFETY: pointers to locals / live slices.
        *slot = status(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) }).ok().map(|()| id);
    }
    *slot
}

pub fn increment_metric(id: u32, by: i64) {
    // SAFETY: no pointers.
    let _ = unsafe { proxy_increment_metric(id, by) };
}

pub fn record_metric(id: u32, value: u64) {
    // SAFETY: no pointers.
    let _ = unsafe { proxy_record_metric(id, value) };
}
