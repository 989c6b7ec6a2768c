//! Detection of the end of a WatchList stream's initial events in the response body.
//!
//! A watch with `sendInitialEvents=true` first replays the current state as ADDED events, then
//! sends a BOOKMARK whose object carries the annotation `k8s.io/initial-events-end: "true"`
//! (`staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go: InitialEventsAnnotationKey`,
//! added by `staging/src/k8s.io/apiserver/pkg/storage/util.go: AnnotateInitialEventsEndBookmark`
//! and checked by its `HasInitialEventsEndBookmarkAnnotation`; clients wait for it in
//! `staging/src/k8s.io/client-go/tools/cache/reflector.go: watchList`). The annotation key is
//! written verbatim in both JSON and protobuf streams (a map key is a length-prefixed string),
//! so the gateway looks for its bytes as the body goes by, in chunks cut anywhere.

/// The annotation key marking the initial-events-end bookmark.
pub const INITIAL_EVENTS_END: &[u8] = b"k8s.io/initial-events-end";

const M: usize = INITIAL_EVENTS_END.len();
/// Bytes kept from earlier chunks: one short of the marker, enough for any split of it.
const CARRY: usize = M - 1;

/// Streaming search for [`INITIAL_EVENTS_END`]; no allocation.
#[derive(Debug, Clone, Default)]
pub struct MarkerScanner {
    /// The last bytes fed (at most `CARRY`), in order.
    carry: [u8; CARRY],
    carry_len: usize,
    found: bool,
    bytes: u64,
}

/// Whether `hay` contains the marker (candidates start at a `k`).
fn contains_marker(hay: &[u8]) -> bool {
    let Some(&first) = INITIAL_EVENTS_END.first() else {
        return true;
    };
    let mut from = 0;
    while let Some(rest) = hay.get(from..) {
        if rest.len() < M {
            return false;
        }
        let Some(i) = rest.iter().position(|&b| b == first) else {
            return false;
        };
        if rest.get(i..i + M) == Some(INITIAL_EVENTS_END) {
            return true;
        }
        from += i + 1;
    }
    false
}

impl MarkerScanner {
    pub fn new() -> MarkerScanner {
        MarkerScanner::default()
    }

    /// Feeds the next chunk; true once the marker has been seen (in this chunk or spanning the previous ones). After true, further calls keep returning true without scanning.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        self.bytes = self.bytes.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        if self.found || chunk.is_empty() {
            return self.found;
        }
        let carry = self.carry.get(..self.carry_len).unwrap_or_default();
        // Markers across the boundary: the carry and the chunk's first bytes.
        let mut window = [0u8; 2 * CARRY];
        let mut n = 0;
        for (d, s) in window.iter_mut().zip(carry.iter().chain(chunk.iter().take(CARRY))) {
            *d = *s;
            n += 1;
        }
        if contains_marker(window.get(..n).unwrap_or_default()) || contains_marker(chunk) {
            self.found = true;
            self.carry_len = 0;
            return true;
        }
        // The new carry: the last CARRY bytes of carry + chunk.
        let mut next = [0u8; CARRY];
        let from_chunk = chunk.len().min(CARRY);
        let from_carry = (CARRY - from_chunk).min(self.carry_len);
        let old = self.carry.get(self.carry_len - from_carry..self.carry_len).unwrap_or_default();
        let new = chunk.get(chunk.len() - from_chunk..).unwrap_or_default();
        let mut k = 0;
        for (d, s) in next.iter_mut().zip(old.iter().chain(new)) {
            *d = *s;
            k += 1;
        }
        self.carry = next;
        self.carry_len = k;
        false
    }

    pub fn found(&self) -> bool {
        self.found
    }

    /// Body bytes fed so far (saturating u64).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
