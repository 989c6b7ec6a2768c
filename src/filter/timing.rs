//! Benchmark instrumentation, compiled in only with the cargo feature `bench-timing` (never in
//! a release module; without it every function here is empty and inlined away): the wall time
//! the filter spends in its callbacks, in the request digest and admission, and in the shared
//! data and queue host calls, per span, exported with the metrics flush as counters
//! `apf_wasm_bench_<span>_nanoseconds_total`. `bench/run.py --timing` reads them per window.
//! The request digest is pure computation on this worker's own data: its time per request
//! compared between runs tells how fast this machine runs the same code.

/// What a [`span`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    RequestHeaders,
    Log,
    QueueReady,
    Digest,
    Admit,
    SharedGet,
    SharedSet,
    Enqueue,
}

#[cfg(feature = "bench-timing")]
mod imp {
    use super::super::host;
    use super::Span;
    use std::cell::{Cell, RefCell};

    pub const NAMES: [&str; 8] = [
        "apf_wasm_bench_request_headers_nanoseconds_total",
        "apf_wasm_bench_log_nanoseconds_total",
        "apf_wasm_bench_queue_ready_nanoseconds_total",
        "apf_wasm_bench_digest_nanoseconds_total",
        "apf_wasm_bench_admit_nanoseconds_total",
        "apf_wasm_bench_shared_get_nanoseconds_total",
        "apf_wasm_bench_shared_set_nanoseconds_total",
        "apf_wasm_bench_enqueue_nanoseconds_total",
    ];

    thread_local! {
        static TOTALS: Cell<[i64; 8]> = const { Cell::new([0; 8]) };
        static IDS: RefCell<[Option<u32>; 8]> = const { RefCell::new([None; 8]) };
    }

    pub struct Guard(Span, i64);

    pub fn span(s: Span) -> Guard {
        Guard(s, host::monotonic_nanos())
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let d = host::monotonic_nanos().saturating_sub(self.1);
            TOTALS.with(|t| {
                let mut v = t.get();
                if let Some(x) = v.get_mut(self.0 as usize) {
                    *x = x.saturating_add(d);
                }
                t.set(v);
            });
        }
    }

    pub fn flush() {
        let deltas = TOTALS.with(|t| t.replace([0; 8]));
        IDS.with(|ids| super::super::metrics::add_to_counters(&NAMES, &mut ids.borrow_mut()[..], deltas));
    }
}

#[cfg(feature = "bench-timing")]
pub use imp::{flush, span};

/// Without `bench-timing`: nothing.
#[cfg(not(feature = "bench-timing"))]
pub struct Guard;

#[cfg(not(feature = "bench-timing"))]
#[inline(always)]
pub fn span(_: Span) -> Guard {
    Guard
}

#[cfg(not(feature = "bench-timing"))]
#[inline(always)]
pub fn flush() {}
