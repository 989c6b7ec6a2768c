//! Envoy's dynamic-module ABI (Envoy 1.40, ABI "v0.2.0") for the native floor: our own
//! declarations of exactly the types and callbacks used, and the event hooks Envoy 1.40 resolves
//! for an HTTP filter. Every `unsafe` of the crate is in this file.
//!
//! Facts from Envoy's `source/extensions/dynamic_modules/abi/abi.h` (types, callbacks, status
//! enums: `Continue` is 0 in every `envoy_dynamic_module_type_on_http_filter_*_status`),
//! `source/extensions/dynamic_modules/dynamic_modules.cc: newDynamicModule` (calls
//! `envoy_dynamic_module_on_program_init`; a null return fails the load, a version other than
//! Envoy's own logs "ABI version … is deprecated" and loads) and
//! `source/extensions/filters/http/dynamic_modules/filter_config.cc:
//! newDynamicModuleHttpFilterConfig` (the hooks an HTTP filter module must export: a missing one
//! fails the filter's configuration). Hook signatures as Envoy 1.40 instantiates them.
//!
//! Panics never cross the boundary: every hook runs its body under `catch_unwind` and answers
//! `Continue` (or nothing) if it panicked, so the request goes on.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `ENVOY_DYNAMIC_MODULES_ABI_VERSION` of Envoy 1.40 (abi.h), NUL-terminated.
const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
pub struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
pub struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

impl ModuleBuffer {
    fn of(s: &str) -> Self {
        Self { ptr: s.as_ptr().cast(), length: s.len() }
    }
}

/// `envoy_dynamic_module_type_envoy_http_header` (only passed through, never read here).
#[repr(C)]
pub struct EnvoyHttpHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type` (a C enum: `int`).
type HeaderType = u32;
const REQUEST_HEADER: HeaderType = 0;
const RESPONSE_HEADER: HeaderType = 2;
/// Every `envoy_dynamic_module_type_on_http_filter_*_status` is a C enum whose `Continue` is 0.
type Status = u32;
const CONTINUE: Status = 0;

extern "C" {
    /// abi.h: `envoy_dynamic_module_callback_http_get_header`. The `index`-th value of `key` in
    /// the given map written to `result` (ptr null when absent); the value count to
    /// `optional_size` when not null. The value lives as long as the header map.
    fn envoy_dynamic_module_callback_http_get_header(
        filter_envoy_ptr: *mut c_void,
        header_type: HeaderType,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    /// abi.h: `envoy_dynamic_module_callback_http_add_header`. Envoy copies key and value.
    fn envoy_dynamic_module_callback_http_add_header(
        filter_envoy_ptr: *mut c_void,
        header_type: HeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
}

/// One request's filter as Envoy knows it (`DynamicModuleHttpFilter*`).
struct EnvoyFilter(*mut c_void);

impl crate::Host for EnvoyFilter {
    fn request_header_len(&self, name: &str) -> Option<usize> {
        let mut out = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };
        // SAFETY: self.0 is the filter pointer Envoy passed to the running hook, valid for its
        // duration; `name` outlives the call and Envoy only reads it; `out` is a live local
        // Envoy writes once; a null `optional_size` is allowed (abi.h).
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(self.0, REQUEST_HEADER, ModuleBuffer::of(name), &mut out, 0, std::ptr::null_mut())
        };
        (found && !out.ptr.is_null()).then_some(out.length)
    }

    fn add_response_header(&self, name: &str, value: &str) -> bool {
        // SAFETY: as above; Envoy copies both buffers before returning.
        unsafe { envoy_dynamic_module_callback_http_add_header(self.0, RESPONSE_HEADER, ModuleBuffer::of(name), ModuleBuffer::of(value)) }
    }
}

/// A non-null address standing for the module's config and filter objects: the floor keeps no
/// state per config or per request (Envoy treats a null config as a failed load).
static NO_STATE: u8 = 0;

fn no_state() -> *const c_void {
    (&NO_STATE as *const u8).cast()
}

/// Runs a hook's body; a panic is caught and turned into `fallback`.
fn guarded<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// Called once when Envoy loads the module: the ABI version the module was built against.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy_ptr: *mut c_void,
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    no_state()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_config: *const c_void) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(_config: *const c_void, _filter_envoy_ptr: *mut c_void) -> *const c_void {
    no_state()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _end_of_stream: bool,
) -> Status {
    guarded(CONTINUE, || {
        crate::on_request_headers(&EnvoyFilter(filter_envoy_ptr));
        CONTINUE
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _end_of_stream: bool,
) -> Status {
    guarded(CONTINUE, || {
        crate::on_response_headers(&EnvoyFilter(filter_envoy_ptr));
        CONTINUE
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_filter_envoy_ptr: *mut c_void, _filter: *const c_void) {
    guarded((), crate::on_stream_complete)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_filter: *const c_void) {}

// The hooks below are required by Envoy 1.40 for any HTTP filter module; the floor has nothing
// to do in them.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _end_of_stream: bool,
) -> Status {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(_filter_envoy_ptr: *mut c_void, _filter: *const c_void) -> Status {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _end_of_stream: bool,
) -> Status {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(_filter_envoy_ptr: *mut c_void, _filter: *const c_void) -> Status {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(_filter_envoy_ptr: *mut c_void, _filter: *const c_void, _event_id: u64) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter_envoy_ptr: *mut c_void,
    _filter: *const c_void,
) {
}
