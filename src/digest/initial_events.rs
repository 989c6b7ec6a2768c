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

use crate::digest::list_size::PatternCounter;

/// The annotation key marking the initial-events-end bookmark.
pub const INITIAL_EVENTS_END: &[u8] = b"k8s.io/initial-events-end";

/// Streaming search for [`INITIAL_EVENTS_END`]; no allocation.
#[derive(Debug, Clone)]
pub struct MarkerScanner {
    marker: PatternCounter,
    bytes: u64,
}

impl Default for MarkerScanner {
    fn default() -> Self {
        MarkerScanner { marker: PatternCounter::new(INITIAL_EVENTS_END), bytes: 0 }
    }
}

impl MarkerScanner {
    pub fn new() -> MarkerScanner {
        MarkerScanner::default()
    }

    /// Feeds the next chunk; true once the marker has been seen (in this chunk or spanning the
    /// previous ones). After true, further calls keep returning true without scanning.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        self.bytes = self.bytes.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        if !self.found() {
            self.marker.feed(chunk);
        }
        self.found()
    }

    pub fn found(&self) -> bool {
        self.marker.count() > 0
    }

    /// Body bytes fed so far (saturating u64).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
