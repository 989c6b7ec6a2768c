//! Envoy's dynamic-module ABI (Envoy 1.40, `source/extensions/dynamic_modules/abi/abi.h`): our
//! own declarations of exactly the callbacks the native host calls, the event hooks the module
//! exports, and safe wrappers over both. This is the only module of `src/native` with `unsafe`.
//!
//! Facts from the header and from Envoy's implementation
//! (`filters/http/dynamic_modules/filter_config.cc: newDynamicModuleHttpFilterConfig`,
//! `abi_impl.cc`, `dynamic_modules.cc: newDynamicModule`):
//! - `envoy_dynamic_module_on_program_init` returns the ABI version string; Envoy logs a match or
//!   a "deprecated" warning, and refuses the module only when it returns null. An Envoy lacking
//!   a callback this module imports refuses it at load: the module is linked with `-z now`
//!   (`native-build.sh`), so dlopen reports the undefined symbol.
//! - Envoy resolves every `on_http_filter_*` hook below at configuration time (a missing one fails
//!   the configuration); `config_scheduled`, the config-level callout hooks and `local_reply` are
//!   optional (`local_reply` and the config-level stream hooks are not exported here).
//! - A configuration's scheduler may be committed from any thread; the event runs on the main
//!   thread as `on_http_filter_config_scheduled` (`filter_config.cc:
//!   DynamicModuleHttpFilterConfig::onScheduled`). A configuration's HTTP callout goes through the
//!   calling thread's cluster manager (`DynamicModuleHttpFilterConfig::sendHttpCallout`:
//!   `getThreadLocalCluster`), so it is started on the main thread; its reply
//!   (`on_http_filter_config_http_callout_done`) arrives there, and in-flight callouts are
//!   cancelled when the configuration is destroyed. A stream's callout
//!   (`..._http_filter_http_callout`) dies with its stream, which is why the module does not use it.
//! - `envoy_buffer`s Envoy hands over are valid for the duration of the hook; `module_buffer`s we
//!   pass are read during the call only.
//! - A filter's scheduler may be committed from any thread; the event runs on the filter's worker
//!   as `on_http_filter_scheduled`, and is dropped if the filter is gone.
#![allow(unsafe_code)]

use super::glue;
use std::ffi::c_void;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The ABI version this module is built against, NUL-terminated: Envoy 1.40's
/// `ENVOY_DYNAMIC_MODULES_ABI_VERSION` (1.40 logs "Dynamic module ABI version v0.2.0 matched.";
/// any other string loads with a "deprecated" warning).
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    ptr: *const u8,
    length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const u8,
    length: usize,
}

impl ModuleBuffer {
    fn of(b: &[u8]) -> ModuleBuffer {
        ModuleBuffer { ptr: b.as_ptr(), length: b.len() }
    }
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

const BLANK_HEADER: EnvoyHeader = EnvoyHeader { key_ptr: std::ptr::null(), key_length: 0, value_ptr: std::ptr::null(), value_length: 0 };

/// Header maps up to this size are read into buffers on the stack.
pub const STACK_HEADERS: usize = 32;
/// Label values passed to a metric callback without allocating (more are collected).
const STACK_LABELS: usize = 8;

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHeader {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type`.
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;
/// `envoy_dynamic_module_type_http_body_type_ReceivedResponseBody`.
pub const RECEIVED_RESPONSE_BODY: u32 = 2;
/// `envoy_dynamic_module_type_attribute_id`: `source.address`, `destination.address`,
/// `connection.mtls`, `connection.subject_peer_certificate`.
pub const ATTR_SOURCE_ADDRESS: u32 = 24;
pub const ATTR_DESTINATION_ADDRESS: u32 = 26;
pub const ATTR_CONNECTION_MTLS: u32 = 29;
pub const ATTR_SUBJECT_PEER_CERTIFICATE: u32 = 33;
/// `..._request_headers_status` / `..._body_status` / `..._trailers_status`: `Continue`.
pub const CONTINUE: u32 = 0;
/// `..._request_headers_status_StopAllIterationAndWatermark`: hold headers, body and trailers.
pub const STOP_ALL_ITERATION_AND_WATERMARK: u32 = 4;
/// `envoy_dynamic_module_type_log_level`.
pub const LOG_DEBUG: u32 = 1;
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

/// An Envoy HTTP filter (`envoy_dynamic_module_type_http_filter_envoy_ptr`), valid from
/// `on_http_filter_new` until `on_http_filter_destroy`, on its worker thread only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FilterPtr(*mut c_void);

/// A filter's scheduler (`..._http_filter_scheduler_module_ptr`): committed from any thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SchedulerPtr(*mut c_void);

// SAFETY: Envoy documents `scheduler_commit` as callable from any thread; the pointer is only
// deleted by its owner after it has been removed from every shared table (see `wake.rs`).
unsafe impl Send for SchedulerPtr {}
// SAFETY: as above; commit takes the pointer by value and Envoy synchronizes internally.
unsafe impl Sync for SchedulerPtr {}

/// A configuration's scheduler (`..._http_filter_config_scheduler_module_ptr`): committed from any
/// thread, its events run on the main thread.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConfigSchedulerPtr(*mut c_void);

// SAFETY: Envoy documents `config_scheduler_commit` as callable from any thread; the pointer is
// deleted only after its removal from the shared table every commit reads (see `callout.rs`).
unsafe impl Send for ConfigSchedulerPtr {}
// SAFETY: as above.
unsafe impl Sync for ConfigSchedulerPtr {}

/// `envoy_dynamic_module_type_http_callout_init_result_Success`.
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_http_callout_result_Success`.
pub const CALLOUT_SUCCESS: u32 = 0;

extern "C" {
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(config: *mut c_void) -> *mut c_void;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler: *mut c_void, event_id: u64);
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: *mut c_void);
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: *mut c_void,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: u32) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: *mut c_void, header_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(filter: *mut c_void, header_type: u32, out: *mut EnvoyHeader) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(filter: *mut c_void, header_type: u32, key: ModuleBuffer, value: ModuleBuffer)
        -> bool;
    fn envoy_dynamic_module_callback_http_set_header(filter: *mut c_void, header_type: u32, key: ModuleBuffer, value: ModuleBuffer)
        -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: *mut c_void,
        status: u32,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: *mut c_void);
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(filter: *mut c_void, id: u32, out: *mut EnvoyBuffer) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_bool(filter: *mut c_void, id: u32, out: *mut bool) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_size(filter: *mut c_void, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: *mut c_void, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(filter: *mut c_void, body_type: u32, out: *mut EnvoyBuffer) -> bool;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_size: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_size: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_increment_gauge(
        filter: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_decrement_gauge(
        filter: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_set_gauge(
        filter: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: *mut c_void) -> *mut c_void;
    fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: *mut c_void, event_id: u64);
    fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: *mut c_void);
}

/// Logs `message` at `level` through Envoy's `dynamic_modules` logger.
pub fn log(level: u32, message: &str) {
    // SAFETY: the buffer points into a live string, read during the call.
    unsafe { envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes())) }
}

/// Whether Envoy's `dynamic_modules` logger would print `level`.
pub fn log_enabled(level: u32) -> bool {
    // SAFETY: no pointers.
    unsafe { envoy_dynamic_module_callback_log_enabled(level) }
}

/// Copies the slice Envoy's buffer points at (empty for a null buffer).
fn copy(ptr: *const u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: Envoy guarantees `len` readable bytes at `ptr` for the duration of the hook that
    // asked for them (abi.h: envoy_buffer ownership); we copy them out at once.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

/// The slice Envoy's buffer points at, valid until the hook that asked for it returns (empty
/// for a null buffer).
fn borrowed<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Envoy guarantees `len` readable bytes at `ptr` for the duration of the hook that
    // asked for them (abi.h: envoy_buffer ownership); callers (`with_headers`) drop the slice
    // before the hook returns.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// `b` as a string when it is UTF-8: checked word-wise when it is ASCII (header names always are
/// on Envoy's codecs), else by `std::str::from_utf8`.
pub fn utf8(b: &[u8]) -> Option<&str> {
    if b.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(b) });
    }
    std::str::from_utf8(b).ok()
}

impl FilterPtr {
    /// No filter: the main thread's root runs outside any stream (nothing may be asked of it).
    pub fn none() -> FilterPtr {
        FilterPtr(std::ptr::null_mut())
    }

    pub fn is_none(self) -> bool {
        self.0.is_null()
    }

    /// Runs `f` over every header of `header_type` (names, values) as Envoy holds them, without
    /// copying them (and without allocating for up to [`STACK_HEADERS`] headers).
    pub fn with_headers<T>(self, header_type: u32, f: impl FnOnce(&[(&[u8], &[u8])]) -> T) -> T {
        // SAFETY: a live filter on this thread (FilterPtr's contract).
        let n = unsafe { envoy_dynamic_module_callback_http_get_headers_size(self.0, header_type) };
        if n == 0 {
            return f(&[]);
        }
        if n > STACK_HEADERS {
            let mut raw = vec![BLANK_HEADER; n];
            let mut pairs = vec![(&[][..], &[][..]); n];
            return f(self.headers_into(header_type, &mut raw, &mut pairs));
        }
        let mut raw = [BLANK_HEADER; STACK_HEADERS];
        let mut pairs = [(&[][..], &[][..]); STACK_HEADERS];
        match (raw.get_mut(..n), pairs.get_mut(..n)) {
            (Some(raw), Some(pairs)) => f(self.headers_into(header_type, raw, pairs)),
            _ => f(&[]),
        }
    }

    /// Fills `raw` (as many as Envoy counted) and `pairs` (as long) with the headers: `pairs`, or
    /// nothing when Envoy fails.
    fn headers_into<'p>(
        self,
        header_type: u32,
        raw: &mut [EnvoyHeader],
        pairs: &'p mut [(&'p [u8], &'p [u8])],
    ) -> &'p [(&'p [u8], &'p [u8])] {
        debug_assert_eq!(raw.len(), pairs.len());
        // SAFETY: `raw` has room for the headers Envoy just counted (its length).
        if !unsafe { envoy_dynamic_module_callback_http_get_headers(self.0, header_type, raw.as_mut_ptr()) } {
            return &[];
        }
        for (p, h) in pairs.iter_mut().zip(raw.iter()) {
            *p = (borrowed(h.key_ptr, h.key_length), borrowed(h.value_ptr, h.value_length));
        }
        pairs
    }

    pub fn add_header(self, header_type: u32, name: &str, value: &[u8]) -> bool {
        // SAFETY: a live filter; buffers into live slices read during the call.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(self.0, header_type, ModuleBuffer::of(name.as_bytes()), ModuleBuffer::of(value))
        }
    }

    /// Removes the header `name` (a set to a null value, as abi.h documents).
    pub fn remove_header(self, header_type: u32, name: &str) -> bool {
        let none = ModuleBuffer { ptr: std::ptr::null(), length: 0 };
        // SAFETY: a live filter; the key points into a live string.
        unsafe { envoy_dynamic_module_callback_http_set_header(self.0, header_type, ModuleBuffer::of(name.as_bytes()), none) }
    }

    pub fn send_response(self, status: u32, headers: &[(&str, &[u8])], body: &[u8], details: &str) {
        let hs: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader { key_ptr: k.as_ptr(), key_length: k.len(), value_ptr: v.as_ptr(), value_length: v.len() })
            .collect();
        // SAFETY: a live filter; every pointer points into slices alive for the call.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.0,
                status,
                hs.as_ptr(),
                hs.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            )
        }
    }

    pub fn continue_decoding(self) {
        // SAFETY: a live filter on this thread.
        unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) }
    }

    pub fn attribute_string(self, id: u32) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
        // SAFETY: a live filter; `out` is a local Envoy fills.
        let ok = unsafe { envoy_dynamic_module_callback_http_filter_get_attribute_string(self.0, id, &mut out) };
        ok.then(|| copy(out.ptr, out.length))
    }

    pub fn attribute_bool(self, id: u32) -> Option<bool> {
        let mut out = false;
        // SAFETY: a live filter; `out` is a local Envoy fills.
        let ok = unsafe { envoy_dynamic_module_callback_http_filter_get_attribute_bool(self.0, id, &mut out) };
        ok.then_some(out)
    }

    /// The body chunk(s) of `body_type` being delivered, concatenated.
    pub fn body(self, body_type: u32) -> Option<Vec<u8>> {
        // SAFETY: a live filter on this thread.
        let n = unsafe { envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, body_type) };
        let mut chunks = vec![EnvoyBuffer { ptr: std::ptr::null(), length: 0 }; n];
        // SAFETY: `chunks` has room for the `n` chunks Envoy just counted.
        if n > 0 && !unsafe { envoy_dynamic_module_callback_http_get_body_chunks(self.0, body_type, chunks.as_mut_ptr()) } {
            return None;
        }
        Some(chunks.iter().flat_map(|c| copy(c.ptr, c.length)).collect())
    }

    /// The size of the body of `body_type` being delivered.
    pub fn body_size(self, body_type: u32) -> usize {
        // SAFETY: a live filter on this thread.
        unsafe { envoy_dynamic_module_callback_http_get_body_size(self.0, body_type) }
    }

    /// A new scheduler for this filter (`None`: Envoy gave none).
    pub fn new_scheduler(self) -> Option<SchedulerPtr> {
        // SAFETY: a live filter on its worker thread, as scheduler_new requires.
        let p = unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) };
        (!p.is_null()).then_some(SchedulerPtr(p))
    }
}

/// An Envoy filter configuration (`..._http_filter_config_envoy_ptr`), valid from
/// `on_http_filter_config_new` (where stats are defined) until `on_http_filter_config_destroy`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConfigPtr(*mut c_void);

// SAFETY: the pointer is only handed back to Envoy on the main thread (scheduler creation in
// `on_http_filter_config_new`, callouts in `on_http_filter_config_scheduled`), while the
// configuration lives; other threads only carry it.
unsafe impl Send for ConfigPtr {}

impl ConfigPtr {
    /// A scheduler whose events run on the main thread (`None`: Envoy gave none).
    pub fn new_scheduler(self) -> Option<ConfigSchedulerPtr> {
        // SAFETY: a live configuration (called from on_http_filter_config_new).
        let p = unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.0) };
        (!p.is_null()).then_some(ConfigSchedulerPtr(p))
    }

    /// Starts an HTTP callout to `cluster` from the main thread: its id, or Envoy's init result.
    pub fn http_callout(self, cluster: &str, headers: &[(&str, &[u8])], body: &[u8], timeout_ms: u64) -> Result<u64, u32> {
        let hs: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader { key_ptr: k.as_ptr(), key_length: k.len(), value_ptr: v.as_ptr(), value_length: v.len() })
            .collect();
        let mut id = 0u64;
        // SAFETY: a live configuration on the main thread; every buffer points into slices
        // alive for the call (Envoy copies them into its request); `id` is a local Envoy fills.
        let r = unsafe {
            envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.0,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                hs.as_ptr(),
                hs.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        if r == CALLOUT_INIT_SUCCESS {
            Ok(id)
        } else {
            Err(r)
        }
    }
}

impl ConfigSchedulerPtr {
    /// Runs `on_http_filter_config_scheduled(event_id)` on the main thread.
    pub fn commit(self, event_id: u64) {
        // SAFETY: a scheduler not yet deleted (callers commit only while it is registered).
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, event_id) }
    }

    /// Frees the scheduler; it must no longer be reachable by any thread.
    pub fn delete(self) {
        // SAFETY: created by config_scheduler_new, deleted once, after its removal from the table.
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
    }
}

/// `envoy_dynamic_module_type_metrics_result_Success`.
pub const METRICS_SUCCESS: u32 = 0;

/// How a gauge changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GaugeOp {
    Add,
    Sub,
    Set,
}

impl ConfigPtr {
    /// Defines a counter (`gauge`: a gauge) family with `labels`: its id, or the metrics result.
    pub fn define(self, gauge: bool, name: &str, labels: &[&str]) -> Result<usize, u32> {
        let ls: Vec<ModuleBuffer> = labels.iter().map(|l| ModuleBuffer::of(l.as_bytes())).collect();
        let mut id = 0usize;
        let n = ModuleBuffer::of(name.as_bytes());
        // SAFETY: called during on_http_filter_config_new with Envoy's config pointer; every
        // buffer points into slices alive for the call; `id` is a local Envoy fills.
        let r = unsafe {
            if gauge {
                envoy_dynamic_module_callback_http_filter_config_define_gauge(self.0, n, ls.as_ptr(), ls.len(), &mut id)
            } else {
                envoy_dynamic_module_callback_http_filter_config_define_counter(self.0, n, ls.as_ptr(), ls.len(), &mut id)
            }
        };
        if r == METRICS_SUCCESS {
            Ok(id)
        } else {
            Err(r)
        }
    }
}

thread_local! {
    /// The configuration whose main-thread hook runs now (null outside one): the stats of the
    /// main thread's root, which has no stream, are recorded through it.
    static HOOK_CONFIG: std::cell::Cell<*mut c_void> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// Runs a configuration hook's body with `envoy` as the configuration stats go through.
fn in_config_hook<T>(envoy: *mut c_void, body: impl FnOnce() -> T) -> T {
    let before = HOOK_CONFIG.with(|c| c.replace(envoy));
    let out = body();
    HOOK_CONFIG.with(|c| c.set(before));
    out
}

/// `envoy_dynamic_module_type_metrics_result_MetricNotFound`: no filter and no configuration.
const METRIC_NOT_FOUND: u32 = 1;

type MetricFn = unsafe extern "C" fn(*mut c_void, usize, *const ModuleBuffer, usize, u64) -> u32;

impl FilterPtr {
    /// Calls `on_filter` with this filter, or, for [`FilterPtr::none`] inside a configuration's
    /// main-thread hook, `on_config` with that configuration (the same family ids: see
    /// `metrics.rs`).
    fn metric(self, on_filter: MetricFn, on_config: MetricFn, id: usize, labels: &[String], value: u64) -> u32 {
        // On the stack for the families' few labels (a flush calls this once per series).
        let mut stack = [const { ModuleBuffer { ptr: std::ptr::null(), length: 0 } }; STACK_LABELS];
        let heap: Vec<ModuleBuffer>;
        let ls: &[ModuleBuffer] = if labels.len() <= STACK_LABELS {
            for (slot, l) in stack.iter_mut().zip(labels) {
                *slot = ModuleBuffer::of(l.as_bytes());
            }
            stack.get(..labels.len()).unwrap_or_default()
        } else {
            heap = labels.iter().map(|l| ModuleBuffer::of(l.as_bytes())).collect();
            &heap
        };
        let (f, target) = if self.0.is_null() { (on_config, HOOK_CONFIG.with(|c| c.get())) } else { (on_filter, self.0) };
        if target.is_null() {
            return METRIC_NOT_FOUND;
        }
        // SAFETY: a live filter on its thread, or the configuration of the main-thread hook
        // running now (alive during it); label buffers point into slices alive for the call.
        unsafe { f(target, id, ls.as_ptr(), ls.len(), value) }
    }

    /// Adds `value` to the counter `id` (series `labels`): the metrics result.
    pub fn increment_counter(self, id: usize, labels: &[String], value: u64) -> u32 {
        self.metric(
            envoy_dynamic_module_callback_http_filter_increment_counter,
            envoy_dynamic_module_callback_http_filter_config_increment_counter,
            id,
            labels,
            value,
        )
    }

    /// Changes the gauge `id` (series `labels`) by `op` `value`: the metrics result.
    pub fn gauge(self, op: GaugeOp, id: usize, labels: &[String], value: u64) -> u32 {
        let (on_filter, on_config): (MetricFn, MetricFn) = match op {
            GaugeOp::Add => (
                envoy_dynamic_module_callback_http_filter_increment_gauge,
                envoy_dynamic_module_callback_http_filter_config_increment_gauge,
            ),
            GaugeOp::Sub => (
                envoy_dynamic_module_callback_http_filter_decrement_gauge,
                envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
            ),
            GaugeOp::Set => {
                (envoy_dynamic_module_callback_http_filter_set_gauge, envoy_dynamic_module_callback_http_filter_config_set_gauge)
            }
        };
        self.metric(on_filter, on_config, id, labels, value)
    }
}

impl SchedulerPtr {
    /// Runs `on_http_filter_scheduled(event_id)` on the filter's worker (dropped if it is gone).
    pub fn commit(self, event_id: u64) {
        // SAFETY: a scheduler not yet deleted (callers commit only while it is registered).
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event_id) }
    }

    /// Frees the scheduler; it must no longer be reachable by any thread.
    pub fn delete(self) {
        // SAFETY: created by scheduler_new, deleted once, after its removal from shared tables.
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
    }
}

/// Runs a hook's body, catching a panic (logged; `fallback` returned to Envoy).
fn guard<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log(LOG_ERROR, &format!("apf: panic in {hook}; the stream continues"));
        fallback
    })
}

/// Envoy's bytes as a slice for the duration of a hook.
fn bytes<'a>(b: EnvoyBuffer) -> &'a [u8] {
    if b.ptr.is_null() || b.length == 0 {
        return &[];
    }
    // SAFETY: Envoy guarantees `length` readable bytes at `ptr` during the hook (abi.h).
    unsafe { std::slice::from_raw_parts(b.ptr, b.length) }
}

/// The module's state of one filter, as handed back by Envoy.
fn filter_state<'a>(module: *const c_void) -> Option<&'a mut glue::Filter> {
    // SAFETY: `module` is null or the pointer `on_http_filter_new` leaked from a Box, used only
    // on its worker thread until `on_http_filter_destroy` reclaims it.
    unsafe { (module as *mut glue::Filter).as_mut() }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    guard("on_program_init", std::ptr::null(), || {
        glue::program_init();
        ABI_VERSION.as_ptr().cast()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guard("on_http_filter_config_new", std::ptr::null(), || match glue::config_new(ConfigPtr(envoy), bytes(name), bytes(config)) {
        Some(c) => Box::into_raw(Box::new(c)) as *const c_void,
        None => std::ptr::null(),
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guard("on_http_filter_config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: the pointer config_new leaked; Envoy destroys a configuration once.
            let c = unsafe { Box::from_raw(config as *mut glue::Config) };
            glue::config_destroy(*c);
        }
    })
}

/// The module's configuration, as handed back by Envoy.
fn config_state<'a>(module: *const c_void) -> Option<&'a glue::Config> {
    // SAFETY: `module` is null or the pointer `on_http_filter_config_new` leaked, alive until
    // `on_http_filter_config_destroy`, after which Envoy calls no hook of the configuration.
    unsafe { (module as *const glue::Config).as_ref() }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(envoy: *mut c_void, module: *const c_void, event_id: u64) {
    guard("on_http_filter_config_scheduled", (), || {
        in_config_hook(envoy, || config_state(module).map_or((), |c| glue::config_scheduled(c, event_id)))
    })
}

/// The headers Envoy hands over, copied (names, values).
fn header_pairs(headers: *const EnvoyHeader, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    if headers.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: Envoy passes `n` headers at `headers`, valid during the hook (abi.h).
    let hs = unsafe { std::slice::from_raw_parts(headers, n) };
    hs.iter().map(|h| (copy(h.key_ptr, h.key_length), copy(h.value_ptr, h.value_length))).collect()
}

/// The body chunks Envoy hands over, concatenated.
fn chunks(body: *const EnvoyBuffer, n: usize) -> Vec<u8> {
    if body.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: Envoy passes `n` buffers at `body`, valid during the hook (abi.h).
    let cs = unsafe { std::slice::from_raw_parts(body, n) };
    cs.iter().flat_map(|c| copy(c.ptr, c.length)).collect()
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    envoy: *mut c_void,
    module: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body: *const EnvoyBuffer,
    body_size: usize,
) {
    guard("on_http_filter_config_http_callout_done", (), || {
        let Some(c) = config_state(module) else { return };
        let (hs, b) =
            if result == CALLOUT_SUCCESS { (header_pairs(headers, headers_size), chunks(body, body_size)) } else { Default::default() };
        in_config_hook(envoy, || glue::config_callout_done(c, callout_id, hs, b));
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(_name: EnvoyBuffer, _config: EnvoyBuffer) -> *const c_void {
    log(LOG_ERROR, "apf: per-route configuration is not supported");
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void, envoy: *mut c_void) -> *const c_void {
    guard("on_http_filter_new", std::ptr::null(), || {
        // SAFETY: the pointer config_new leaked, alive until config_destroy, which Envoy calls
        // only after every filter of the configuration is gone.
        let Some(c) = (unsafe { (config as *const glue::Config).as_ref() }) else { return std::ptr::null() };
        Box::into_raw(Box::new(glue::filter_new(c, FilterPtr(envoy)))) as *const c_void
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guard("on_http_filter_destroy", (), || {
        if !module.is_null() {
            // SAFETY: the pointer filter_new leaked; Envoy destroys a filter once.
            let f = unsafe { Box::from_raw(module as *mut glue::Filter) };
            glue::filter_destroy(f);
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(_envoy: *mut c_void, module: *const c_void, _end: bool) -> u32 {
    guard("on_http_filter_request_headers", CONTINUE, || filter_state(module).map_or(CONTINUE, glue::request_headers))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(_envoy: *mut c_void, _module: *const c_void, _end: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(_envoy: *mut c_void, _module: *const c_void) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(_envoy: *mut c_void, module: *const c_void, end: bool) -> u32 {
    guard("on_http_filter_response_headers", CONTINUE, || filter_state(module).map_or(CONTINUE, |f| glue::response_headers(f, end)))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(_envoy: *mut c_void, module: *const c_void, end: bool) -> u32 {
    guard("on_http_filter_response_body", CONTINUE, || filter_state(module).map_or(CONTINUE, |f| glue::response_body(f, end)))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(_envoy: *mut c_void, module: *const c_void) -> u32 {
    guard("on_http_filter_response_trailers", CONTINUE, || filter_state(module).map_or(CONTINUE, glue::response_trailers))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_envoy: *mut c_void, module: *const c_void) {
    guard("on_http_filter_stream_complete", (), || filter_state(module).map_or((), glue::stream_complete))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(_envoy: *mut c_void, module: *const c_void, event_id: u64) {
    guard("on_http_filter_scheduled", (), || filter_state(module).map_or((), |f| glue::scheduled(f, event_id)))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: *mut c_void,
    _module: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _body: *const EnvoyBuffer,
    _body_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _chunks: *const EnvoyBuffer,
    _chunks_size: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _trailers: *const EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(_envoy: *mut c_void, _module: *const c_void, _stream_id: u64) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: *mut c_void,
    _module: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: *mut c_void,
    _module: *const c_void,
) {
}

/// A stand-in for Envoy in the unit tests: the callbacks the module imports, recording what
/// the module asked (no pointer is dereferenced).
#[cfg(test)]
pub mod fake {
    use super::{EnvoyBuffer, EnvoyHeader, ModuleBuffer, ModuleHeader};
    use std::ffi::c_void;
    use std::sync::Mutex;

    /// Every (scheduler, event id) committed, and every filter continued.
    pub static COMMITS: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    pub static CONTINUED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    /// A scheduler pointer the fake recognizes (never dereferenced).
    pub fn scheduler(n: usize) -> super::SchedulerPtr {
        super::SchedulerPtr(n as *mut c_void)
    }

    pub fn filter(n: usize) -> super::FilterPtr {
        super::FilterPtr(n as *mut c_void)
    }

    /// Every config-scheduler event committed, and every callout started (cluster, id).
    pub static CONFIG_COMMITS: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    pub static CALLOUTS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

    pub fn config(n: usize) -> super::ConfigPtr {
        super::ConfigPtr(n as *mut c_void)
    }

    /// The metric callbacks (configuration- and stream-level): accepted, ignored.
    macro_rules! metric_stubs {
        ($($name:ident),* $(,)?) => {$(
            #[no_mangle]
            extern "C" fn $name(_: *mut c_void, _id: usize, _l: *const ModuleBuffer, _n: usize, _v: u64) -> u32 {
                0
            }
        )*};
    }
    metric_stubs!(
        envoy_dynamic_module_callback_http_filter_config_increment_counter,
        envoy_dynamic_module_callback_http_filter_config_increment_gauge,
        envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
        envoy_dynamic_module_callback_http_filter_config_set_gauge,
        envoy_dynamic_module_callback_http_filter_increment_counter,
        envoy_dynamic_module_callback_http_filter_increment_gauge,
        envoy_dynamic_module_callback_http_filter_decrement_gauge,
        envoy_dynamic_module_callback_http_filter_set_gauge,
    );
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(c: *mut c_void) -> *mut c_void {
        c
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(s: *mut c_void, event_id: u64) {
        CONFIG_COMMITS.lock().unwrap().push((s as usize, event_id));
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(_s: *mut c_void) {}
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        _c: *mut c_void,
        id: *mut u64,
        cluster: ModuleBuffer,
        _h: *const ModuleHeader,
        _n: usize,
        _b: ModuleBuffer,
        _t: u64,
    ) -> u32 {
        let name = String::from_utf8(unsafe { std::slice::from_raw_parts(cluster.ptr, cluster.length) }.to_vec()).unwrap();
        if name == "missing" {
            return 2;
        }
        let mut all = CALLOUTS.lock().unwrap();
        let n = all.len() as u64 + 100;
        all.push((name, n));
        unsafe { *id = n };
        0
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_log(_level: u32, _message: ModuleBuffer) {}
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_log_enabled(_level: u32) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(_f: *mut c_void, _t: u32) -> usize {
        0
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_get_headers(_f: *mut c_void, _t: u32, _out: *mut EnvoyHeader) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_add_header(_f: *mut c_void, _t: u32, _k: ModuleBuffer, _v: ModuleBuffer) -> bool {
        true
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_set_header(_f: *mut c_void, _t: u32, _k: ModuleBuffer, _v: ModuleBuffer) -> bool {
        true
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_send_response(
        _f: *mut c_void,
        _s: u32,
        _h: *const ModuleHeader,
        _n: usize,
        _b: ModuleBuffer,
        _d: ModuleBuffer,
    ) {
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(f: *mut c_void) {
        CONTINUED.lock().unwrap().push(f as usize);
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(_f: *mut c_void, _id: u32, _o: *mut EnvoyBuffer) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_bool(_f: *mut c_void, _id: u32, _o: *mut bool) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_get_body_size(_f: *mut c_void, _t: u32) -> usize {
        0
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(_f: *mut c_void, _t: u32) -> usize {
        0
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(_f: *mut c_void, _t: u32, _o: *mut EnvoyBuffer) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        _c: *mut c_void,
        _n: ModuleBuffer,
        _l: *const ModuleBuffer,
        _ln: usize,
        _id: *mut usize,
    ) -> u32 {
        1
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        _c: *mut c_void,
        _n: ModuleBuffer,
        _l: *const ModuleBuffer,
        _ln: usize,
        _id: *mut usize,
    ) -> u32 {
        1
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(f: *mut c_void) -> *mut c_void {
        f
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(s: *mut c_void, event_id: u64) {
        COMMITS.lock().unwrap().push((s as usize, event_id));
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(_s: *mut c_void) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_hook_returns_its_fallback() {
        assert_eq!(guard("test", CONTINUE, || panic!("boom")), CONTINUE);
        assert_eq!(guard("test", 7u32, || 3), 3);
    }

    #[test]
    fn hooks_without_module_state_let_the_stream_continue() {
        let null = std::ptr::null();
        assert_eq!(envoy_dynamic_module_on_http_filter_request_headers(std::ptr::null_mut(), null, true), CONTINUE);
        assert_eq!(envoy_dynamic_module_on_http_filter_response_headers(std::ptr::null_mut(), null, true), CONTINUE);
        envoy_dynamic_module_on_http_filter_destroy(null);
        envoy_dynamic_module_on_http_filter_config_destroy(null);
    }

    #[test]
    fn the_abi_version_is_envoy_1_40s_nul_terminated() {
        assert_eq!(ABI_VERSION, b"v0.2.0\0");
    }
}
