//! Retry-After for one priority level (upstream
//! `pkg/util/flowcontrol/dropped_requests_tracker.go`, `droppedRequestsStats`).
//!
//! Multiplicative increase, additive decrease: starts at 1 s; when a drop arrives in a new
//! second, the drops of the previous `retry_after` seconds are counted; if at least
//! `3 × retry_after` and at least `retry_after` seconds have passed since the last increase, it
//! doubles (max 32); if fewer than `retry_after`, it decreases by 1. The engine keeps one
//! tracker per priority level (a level never seen has Retry-After 1, i.e. `Default`).
//!
//! History pruning follows the upstream code: entries more than `MAX_RETRY_AFTER` (32) seconds
//! older than the newest appended entry are dropped, so the history holds at most 33 entries.
//! Time is Unix seconds passed in by the caller.

use crate::codec::{CodecError, CodecResult, Reader, Writer};

/// Upper bound of Retry-After, seconds.
pub const MAX_RETRY_AFTER: i64 = 32;
/// Bound on the stored history (entries within 32 s of the newest, plus the newest).
pub const MAX_HISTORY: usize = (MAX_RETRY_AFTER as usize) + 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedRequestsTracker {
    /// `(unix second, drops in that second)`, oldest first.
    history: Vec<(i64, i64)>,
    current_unix: i64,
    current_count: i64,
    retry_after: i64,
    retry_after_update_unix: i64,
}

impl Default for DroppedRequestsTracker {
    fn default() -> Self {
        DroppedRequestsTracker { history: Vec::new(), current_unix: 0, current_count: 0, retry_after: 1, retry_after_update_unix: 0 }
    }
}

impl DroppedRequestsTracker {
    /// Current suggested Retry-After in seconds (1..=32).
    pub fn retry_after(&self) -> i64 {
        self.retry_after
    }

    /// Record one dropped (rejected) request at Unix second `now_unix_secs`.
    pub fn record_dropped(&mut self, now_unix_secs: i64) {
        if self.current_unix == now_unix_secs {
            self.current_count = self.current_count.saturating_add(1);
            return;
        }
        self.update_history(self.current_unix, self.current_count);
        self.current_unix = now_unix_secs;
        self.current_count = 1;
        self.update_retry_after(now_unix_secs);
    }

    fn update_history(&mut self, unix: i64, count: i64) {
        self.history.push((unix, count));
        let start = self.history.iter().position(|&(t, _)| unix.saturating_sub(t) <= MAX_RETRY_AFTER);
        self.history.drain(..start.unwrap_or(self.history.len()));
        // Keep the bound even if time jumps backwards (not possible upstream with a real clock).
        self.history.drain(..self.history.len().saturating_sub(MAX_HISTORY));
    }

    fn update_retry_after(&mut self, unix: i64) {
        let retry_after = self.retry_after;
        // Drops of the last `retry_after` seconds before this one.
        let recent = self.history.iter().rev().take_while(|&&(t, _)| unix.saturating_sub(t) <= retry_after);
        let dropped = recent.filter(|&&(t, _)| t < unix).fold(0i64, |d, &(_, n)| d.saturating_add(n));
        if unix.saturating_sub(self.retry_after_update_unix) >= retry_after && dropped >= retry_after.saturating_mul(3) {
            self.retry_after = retry_after.saturating_mul(2).min(MAX_RETRY_AFTER);
            self.retry_after_update_unix = unix;
            return;
        }
        if dropped < retry_after && retry_after > 1 {
            self.retry_after = retry_after - 1;
        }
    }

    pub fn encode(&self, w: &mut Writer) {
        for v in [self.retry_after, self.retry_after_update_unix, self.current_unix, self.current_count] {
            w.i64(v);
        }
        w.usize(self.history.len());
        for &(t, n) in &self.history {
            w.i64(t);
            w.i64(n);
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> CodecResult<Self> {
        let retry_after = r.i64()?;
        if !(1..=MAX_RETRY_AFTER).contains(&retry_after) {
            return Err(CodecError("retry-after out of range"));
        }
        let (retry_after_update_unix, current_unix, current_count) = (r.i64()?, r.i64()?, r.i64()?);
        let n = r.count(2)?;
        if n > MAX_HISTORY {
            return Err(CodecError("retry-after history too long"));
        }
        // A loop, not a `collect` into a `Result` (which cannot size the vector up front).
        let mut history = Vec::with_capacity(n);
        for _ in 0..n {
            history.push((r.i64()?, r.i64()?));
        }
        Ok(DroppedRequestsTracker { history, current_unix, current_count, retry_after, retry_after_update_unix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: i64 = 1_753_000_000;

    /// `TestDroppedRequestsTracker`.
    #[test]
    fn upstream_sequence() {
        let steps: [(i64, usize, i64); 11] = [
            (0, 5, 1),
            (1, 11, 2),
            (2, 1, 2),
            (3, 11, 4),
            (4, 1, 4),
            (7, 1, 8),
            (11, 1, 8),
            (15, 1, 7),
            (17, 1, 6),
            (21, 14, 5),
            (22, 1, 10),
        ];
        let mut t = DroppedRequestsTracker::default();
        for (i, &(secs, drops, expected)) in steps.iter().enumerate() {
            for _ in 0..drops {
                t.record_dropped(START + secs);
            }
            assert_eq!(t.retry_after(), expected, "step {i} (t={secs})");
            assert!(t.history.len() <= MAX_HISTORY);
        }
    }

    /// `TestDroppedRequestsTrackerPLIndependent`, one tracker per level.
    #[test]
    fn levels_independent() {
        let mut pls: Vec<DroppedRequestsTracker> = (0..10).map(|_| DroppedRequestsTracker::default()).collect();
        for pl in pls.iter_mut() {
            pl.record_dropped(START);
        }
        for pl in pls.iter_mut() {
            pl.record_dropped(START + 1);
            assert_eq!(pl.retry_after(), 1);
        }
        for _ in 0..5 {
            pls[0].record_dropped(START + 1);
        }
        for (i, pl) in pls.iter_mut().enumerate() {
            pl.record_dropped(START + 2);
            assert_eq!(pl.retry_after(), if i == 0 { 2 } else { 1 }, "pl-{i}");
        }
        assert_eq!(DroppedRequestsTracker::default().retry_after(), 1);
    }

    #[test]
    fn saturates_at_32_and_history_bounded() {
        let mut t = DroppedRequestsTracker::default();
        for s in 0..200 {
            for _ in 0..200 {
                t.record_dropped(START + s);
            }
            assert!((1..=MAX_RETRY_AFTER).contains(&t.retry_after()));
            assert!(t.history.len() <= MAX_HISTORY);
        }
        assert_eq!(t.retry_after(), 32);
        // Quiet period: decreases by one per new-second drop.
        t.record_dropped(START + 1000);
        assert_eq!(t.retry_after(), 31);
        // Time going backwards never panics and keeps bounds.
        for s in (0..100).rev() {
            t.record_dropped(s);
            assert!(t.history.len() <= MAX_HISTORY);
        }
        t.record_dropped(i64::MIN);
        t.record_dropped(i64::MAX);
    }

    #[test]
    fn codec_roundtrip_and_garbage() {
        let mut t = DroppedRequestsTracker::default();
        for s in 0..10 {
            for _ in 0..(s * 3) {
                t.record_dropped(START + s);
            }
        }
        let mut w = Writer::new();
        t.encode(&mut w);
        let b = w.into_bytes();
        assert_eq!(DroppedRequestsTracker::decode(&mut Reader::new(&b)).unwrap(), t);
        for n in 0..b.len() {
            assert!(DroppedRequestsTracker::decode(&mut Reader::new(&b[..n])).is_err());
        }
        for seed in 0u32..500 {
            let g: Vec<u8> = (0..(seed % 50)).map(|i| (seed.wrapping_mul(2654435761) >> (i % 24)) as u8).collect();
            let _ = DroppedRequestsTracker::decode(&mut Reader::new(&g));
        }
    }
}
