//! The stats an idle worker owes, added by the main thread: nothing in Envoy 1.40's ABI wakes a
//! worker without a stream, so a worker going idle hands its pending deltas over here (one
//! `try_lock`, no Envoy call), and the main thread's timer adds them, merged per series, through
//! the configuration (`glue::config_scheduled`). A worker whose hand-over finds the lock taken
//! (or the list full) keeps its deltas and flushes them itself later, as before: every delta is
//! added once, by one thread.

use super::abi::FilterPtr;
use super::metrics::{self, Series};
use hashbrown::HashMap;
use std::sync::{Arc, Mutex, TryLockError};

/// Deltas handed over and not yet added, by series.
static OWED: Mutex<Vec<(Arc<Series>, i64)>> = Mutex::new(Vec::new());

/// At most this many deltas wait (the main thread drains them every timer period).
const MAX_OWED: usize = 1 << 16;

/// Moves the deltas `take` yields (this worker's stat ids) into the owed list: false, with
/// `take` not called, when the list is busy or full.
pub fn hand_over(take: impl FnOnce(&mut Vec<(u32, i64)>)) -> bool {
    let mut owed = match OWED.try_lock() {
        Ok(o) => o,
        Err(TryLockError::WouldBlock | TryLockError::Poisoned(_)) => return false,
    };
    if owed.len() >= MAX_OWED {
        return false;
    }
    let mut deltas = Vec::new();
    take(&mut deltas);
    owed.extend(deltas.into_iter().filter_map(|(id, by)| Some((metrics::series(id)?, by))));
    true
}

/// Adds every owed delta, merged per series (main thread, inside a configuration's hook).
pub fn add_owed() {
    let owed = match OWED.lock() {
        Ok(mut o) if !o.is_empty() => std::mem::take(&mut *o),
        _ => return,
    };
    for (s, by) in merged(owed).into_iter().filter(|(_, by)| *by != 0) {
        metrics::add(FilterPtr::none(), &s, by);
    }
}

/// One delta per series: the sum of its deltas (a series' deltas all have its kind).
fn merged<T>(owed: Vec<(Arc<T>, i64)>) -> Vec<(Arc<T>, i64)> {
    let mut at: HashMap<*const T, usize> = HashMap::new();
    let mut out: Vec<(Arc<T>, i64)> = Vec::new();
    for (s, by) in owed {
        match at.get(&Arc::as_ptr(&s)).and_then(|&i| out.get_mut(i)) {
            Some((_, sum)) => *sum = sum.saturating_add(by),
            None => {
                at.insert(Arc::as_ptr(&s), out.len());
                out.push((s, by));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn deltas_of_one_series_are_summed_once_and_others_kept_apart() {
        let (a, b, a_twin) = (Arc::new("a"), Arc::new("b"), Arc::new("a"));
        let owed = vec![(a.clone(), 2), (b.clone(), -1), (a.clone(), 3), (a_twin.clone(), 7), (b.clone(), 1)];
        let m = merged(owed);
        assert_eq!(m.len(), 3, "one entry per series (by identity, not by value)");
        assert!(Arc::ptr_eq(&m[0].0, &a) && m[0].1 == 5);
        assert!(Arc::ptr_eq(&m[1].0, &b) && m[1].1 == 0);
        assert!(Arc::ptr_eq(&m[2].0, &a_twin) && m[2].1 == 7);
    }
}
