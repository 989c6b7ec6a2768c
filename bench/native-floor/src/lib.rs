//! The native floor: what an APF filter cannot avoid doing in Envoy, as a dynamic module, with
//! no logic. Per request: read `:method`, `:path`, `X-Remote-User` and `X-Remote-Group`; one
//! compare-and-swap on state shared by every worker on arrival and one on completion; add the
//! two `X-Kubernetes-PF-*` response headers. The wasm floor module
//! (`../shared/bench/floor-module/src/lib.rs`) does the same through proxy-wasm, its shared state
//! being the host's shared data; here the shared state is an atomic in process memory, which is
//! what a native host would use. CPU per request with this module loaded, beside the wasm floor
//! and Envoy's own `local_ratelimit`, is what the wasm host costs and the floor for a native
//! apf-wasm.
//!
//! `abi` holds every `unsafe` line (the ABI declarations and the exported event hooks); this file
//! is the module's behaviour in safe Rust over the [`Host`] trait.

// The ABI glue references symbols only Envoy provides: not in the native unit tests.
#[cfg(not(test))]
mod abi;

use std::sync::atomic::{AtomicI64, Ordering};

/// The seats in use, shared by all workers (the wasm floor's `floor/seats` shared-data key).
static SEATS: AtomicI64 = AtomicI64::new(0);

/// Request headers read on arrival: the request line and the identity an APF filter classifies.
pub const REQUEST_HEADERS: [&str; 4] = [":method", ":path", "x-remote-user", "x-remote-group"];

/// Response headers added on every response, as apf-wasm adds them (values as the wasm floor's).
pub const RESPONSE_HEADERS: [(&str, &str); 2] = [
    ("x-kubernetes-pf-flowschema-uid", "00000000-0000-0000-0000-000000000001"),
    ("x-kubernetes-pf-prioritylevel-uid", "00000000-0000-0000-0000-000000000002"),
];

/// The calls the floor makes on one request's filter: what `abi` implements over Envoy.
pub trait Host {
    /// The first value of request header `name`, if any (its length, to keep it observable).
    fn request_header_len(&self, name: &str) -> Option<usize>;
    /// Adds a response header; false when Envoy refused it.
    fn add_response_header(&self, name: &str, value: &str) -> bool;
}

/// Moves the shared seat count by `delta` with one compare-and-swap, retried on a conflict at
/// most 8 times as the wasm floor's `bump` does. Returns the count written, `None` when every
/// attempt conflicted.
pub fn bump(delta: i64) -> Option<i64> {
    let mut cur = SEATS.load(Ordering::Relaxed);
    for _ in 0..8 {
        let next = cur.wrapping_add(delta);
        match SEATS.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(next),
            Err(seen) => cur = seen,
        }
    }
    None
}

/// The seats in use now.
pub fn seats() -> i64 {
    SEATS.load(Ordering::Relaxed)
}

/// Request headers arrived: read the four headers, take a seat.
pub fn on_request_headers(host: &impl Host) {
    for name in REQUEST_HEADERS {
        std::hint::black_box(host.request_header_len(name));
    }
    std::hint::black_box(bump(1));
}

/// Response headers leaving: add the two APF headers.
pub fn on_response_headers(host: &impl Host) {
    for (name, value) in RESPONSE_HEADERS {
        std::hint::black_box(host.add_response_header(name, value));
    }
}

/// The stream is complete (the wasm floor's `on_log`): give the seat back.
pub fn on_stream_complete() {
    std::hint::black_box(bump(-1));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::Mutex;

    /// The seat count is process-wide: tests that read it run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[derive(Default)]
    struct Recorder {
        read: RefCell<Vec<String>>,
        added: RefCell<Vec<(String, String)>>,
    }

    impl Host for Recorder {
        fn request_header_len(&self, name: &str) -> Option<usize> {
            self.read.borrow_mut().push(name.to_string());
            Some(name.len())
        }
        fn add_response_header(&self, name: &str, value: &str) -> bool {
            self.added.borrow_mut().push((name.to_string(), value.to_string()));
            true
        }
    }

    #[test]
    fn a_request_reads_four_headers_takes_and_returns_a_seat_and_adds_two_headers() {
        let _serial = SERIAL.lock();
        let host = Recorder::default();
        let before = seats();
        on_request_headers(&host);
        assert_eq!(seats(), before + 1);
        on_response_headers(&host);
        on_stream_complete();
        assert_eq!(seats(), before);
        assert_eq!(*host.read.borrow(), REQUEST_HEADERS.map(String::from).to_vec());
        let added: Vec<String> = host.added.borrow().iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(added, ["x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"]);
    }

    #[test]
    fn bumps_from_many_threads_balance() {
        let _serial = SERIAL.lock();
        let before = seats();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        while bump(1).is_none() {}
                        while bump(-1).is_none() {}
                    }
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok());
        }
        assert_eq!(seats(), before);
    }
}
