//! Learned LIST costs (our extension, `workEstimator.learnFromResponses`): the size and item
//! count of a LIST response, observed as its JSON body streams through the gateway, for resources
//! whose object counts neither the cluster's `/metrics` nor the `objectCounts` table give.
//!
//! Upstream's LIST formula (`request/list_work_estimator.go: seatsBasedOnObjectSize`) needs the
//! resource's object count `n` and average stored object size `a`. A complete LIST response of the
//! resource (every namespace, no selector, no continue token) carries all `n` objects, so the
//! gateway takes `n` = the items (each object's `metadata` has exactly one `"resourceVersion":"`,
//! the list's own metadata one more) and `a` = body bytes ÷ `n`. A full LIST then costs
//! ⌈bytes ÷ 100 kB⌉ as upstream's ⌈n·a ÷ 100 kB⌉. The error is the ratio of the JSON wire size to
//! the stored size: about 1 for custom resources (stored as JSON), about 1.5–3 for built-in types
//! (stored as protobuf), so learned costs err on the expensive side; protobuf or compressed
//! responses are not learned from.

/// Counts the occurrences of a fixed pattern (at most [`MAX_PATTERN`] bytes) in a stream fed in
/// chunks cut anywhere; no allocation.
#[derive(Debug, Clone)]
pub struct PatternCounter {
    pattern: &'static [u8],
    /// The last bytes fed (one short of the pattern at most), in order.
    carry: [u8; MAX_PATTERN],
    carry_len: usize,
    count: u64,
}

pub const MAX_PATTERN: usize = 32;

/// Occurrences of `pat` in `hay`.
fn count_in(hay: &[u8], pat: &[u8]) -> u64 {
    hay.windows(pat.len().max(1)).filter(|w| w.first() == pat.first() && *w == pat).count() as u64
}

/// Copies what `src` yields into `dst`, as far as it holds; returns how many bytes it copied.
fn fill<'a>(dst: &mut [u8], src: impl Iterator<Item = &'a u8>) -> usize {
    dst.iter_mut().zip(src).map(|(d, s)| *d = *s).count()
}

impl PatternCounter {
    pub fn new(pattern: &'static [u8]) -> PatternCounter {
        debug_assert!(!pattern.is_empty() && pattern.len() <= MAX_PATTERN);
        PatternCounter { pattern, carry: [0; MAX_PATTERN], carry_len: 0, count: 0 }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        let keep = self.pattern.len().saturating_sub(1).min(MAX_PATTERN);
        let carry = self.carry.get(..self.carry_len).unwrap_or_default();
        // Occurrences that start in the carry (and so end in this chunk), then those starting in
        // the chunk: each is counted once, in the chunk where it ends.
        let mut window = [0u8; 2 * MAX_PATTERN];
        let n = fill(&mut window, carry.iter().chain(chunk.iter().take(keep)));
        self.count += count_in(window.get(..n).unwrap_or_default(), self.pattern);
        self.count += count_in(chunk, self.pattern);
        // Keep the last `keep` bytes of carry + chunk.
        let drop = (carry.len() + chunk.len()).saturating_sub(keep);
        let mut next = [0u8; MAX_PATTERN];
        self.carry_len = fill(&mut next, carry.iter().chain(chunk).skip(drop));
        self.carry = next;
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Observes one JSON LIST response body.
#[derive(Debug, Clone)]
pub struct ListBodyScanner {
    bytes: u64,
    resource_versions: PatternCounter,
    continues: PatternCounter,
    empty_continues: PatternCounter,
}

impl Default for ListBodyScanner {
    fn default() -> Self {
        ListBodyScanner {
            bytes: 0,
            resource_versions: PatternCounter::new(b"\"resourceVersion\":\""),
            continues: PatternCounter::new(b"\"continue\":\""),
            empty_continues: PatternCounter::new(b"\"continue\":\"\""),
        }
    }
}

/// What a complete LIST response says of its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListObservation {
    pub items: i64,
    pub bytes: i64,
}

impl ListBodyScanner {
    pub fn new() -> ListBodyScanner {
        ListBodyScanner::default()
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        self.resource_versions.feed(chunk);
        self.continues.feed(chunk);
        self.empty_continues.feed(chunk);
    }

    /// The observation, if the body was a whole collection: a list with at least one item and
    /// no continue token (a page of a paginated LIST says nothing of the rest).
    pub fn finish(&self) -> Option<ListObservation> {
        if self.continues.count() > self.empty_continues.count() {
            return None;
        }
        let items = self.resource_versions.count().checked_sub(1).filter(|n| *n > 0)?;
        Some(ListObservation { items: i64::try_from(items).ok()?, bytes: i64::try_from(self.bytes).ok()? })
    }
}

impl ListObservation {
    /// The stats upstream's formula takes: `n` items of `bytes ÷ n` each.
    pub fn stats(&self) -> crate::digest::work_estimate::ObjectStats {
        crate::digest::work_estimate::ObjectStats { count: self.items, average_object_size_bytes: self.bytes / self.items.max(1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &[u8] = br#"{"kind":"WidgetList","apiVersion":"example.com/v1","metadata":{"resourceVersion":"77","continue":""},"items":[{"metadata":{"name":"a","resourceVersion":"5","annotations":{"x":"{\"resourceVersion\":\"1\"}"}}},{"metadata":{"name":"b","resourceVersion":"6"}}]}"#;

    #[test]
    fn counts_items_and_bytes_whatever_the_chunking() {
        for size in [1usize, 2, 3, 7, 18, 19, 20, 64, LIST.len()] {
            let mut s = ListBodyScanner::new();
            for c in LIST.chunks(size) {
                s.feed(c);
            }
            assert_eq!(s.finish(), Some(ListObservation { items: 2, bytes: LIST.len() as i64 }), "chunks of {size}");
        }
        let o = ListObservation { items: 2, bytes: 1001 };
        assert_eq!((o.stats().count, o.stats().average_object_size_bytes), (2, 500));
    }

    #[test]
    fn pages_and_empty_lists_teach_nothing() {
        let page = br#"{"kind":"WidgetList","metadata":{"resourceVersion":"7","continue":"eyJ2Ijoi","remainingItemCount":10},"items":[{"metadata":{"resourceVersion":"5"}}]}"#;
        for size in [1usize, 5, page.len()] {
            let mut s = ListBodyScanner::new();
            page.chunks(size).for_each(|c| s.feed(c));
            assert_eq!(s.finish(), None);
        }
        let mut s = ListBodyScanner::new();
        s.feed(br#"{"kind":"WidgetList","metadata":{"resourceVersion":"7"},"items":[]}"#);
        assert_eq!(s.finish(), None);
        let mut s = ListBodyScanner::new();
        s.feed(b"\x6b\x38\x73\x00protobuf");
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn pattern_counter_matches_a_naive_count() {
        let mut rng = crate::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let mut hay = Vec::new();
            for _ in 0..300 {
                hay.push(b"ab\"c"[rng.below(4) as usize]);
            }
            let pat: &'static [u8] = b"ab\"ab";
            let naive = hay.windows(pat.len()).filter(|w| *w == pat).count() as u64;
            let mut c = PatternCounter::new(pat);
            let mut at = 0;
            while at < hay.len() {
                let n = 1 + rng.below(9) as usize;
                let end = (at + n).min(hay.len());
                c.feed(&hay[at..end]);
                at = end;
            }
            assert_eq!(c.count(), naive);
        }
    }
}
