//! Mailboxes between workers, and how a worker is woken: through the scheduler of one of its
//! streams, never by polling.
//!
//! Each Envoy worker registers one mailbox (the gateway's shared queue, [`crate::gateway::worker::
//! mailbox_name`]). A notice for a paused stream is pushed into its owner's mailbox and the
//! stream's own scheduler is committed ([`WAKE`]): Envoy runs `on_http_filter_scheduled` on the
//! owner's worker, which drains the mailbox. A stream registers its scheduler while it is queued
//! (and keeps it until it ends), or while it is a WATCH holding seats through its initial phase
//! and no other stream of the worker has one (`glue::ensure_waker`); the scheduler is removed from the table before it is deleted, under the same
//! lock every commit takes, so no thread commits a deleted scheduler.
//!
//! The per-worker timer (queue timeouts, watch holds, expiry, stats) comes from one module-owned
//! thread ([`start_ticker`]) that commits [`TICK`] every `TICK_MS` to one registered scheduler of
//! every worker. A worker with no stream awaiting seats or holding a WATCH's initial phase gets
//! no tick: it has nothing to time out, and it runs its timer as its last such stream ends
//! (`glue::stream_complete`); its pending stats are added and its lease renewed by the main
//! thread on its own timer (`idle_stats`, `leases`).

use super::abi::SchedulerPtr;
use hashbrown::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Event id of a wake-up: drain one mailbox message.
pub const WAKE: u64 = 1;
/// Event id of the worker's timer.
pub const TICK: u64 = 2;

/// One worker's mailbox and the schedulers of its waiting or seat-holding streams. Mailboxes
/// live as long as the process (a worker registers one and keeps it).
#[derive(Default)]
pub struct Mailbox {
    msgs: Mutex<VecDeque<Vec<u8>>>,
    wakers: Mutex<HashMap<u32, SchedulerPtr>>,
    /// How many schedulers `wakers` holds (written under its lock): [`Mailbox::idle`] reads it
    /// without taking the lock.
    wakeable: AtomicUsize,
}

#[derive(Default)]
struct Registry {
    names: HashMap<String, u32>,
    boxes: Vec<&'static Mailbox>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

/// The mailbox `id` (ids are 1-based).
fn mailbox(id: u32) -> Option<&'static Mailbox> {
    let r = registry().lock().ok()?;
    r.boxes.get(usize::try_from(id).ok()?.checked_sub(1)?).copied()
}

/// Registers (or finds) the mailbox `name`: its id and the mailbox.
pub fn register(name: &str) -> Option<(u32, &'static Mailbox)> {
    let mut r = registry().lock().ok()?;
    if let Some(&id) = r.names.get(name) {
        let b = *r.boxes.get(usize::try_from(id).ok()?.checked_sub(1)?)?;
        return Some((id, b));
    }
    let b: &'static Mailbox = Box::leak(Box::default());
    r.boxes.push(b);
    let id = u32::try_from(r.boxes.len()).ok()?;
    r.names.insert(name.to_string(), id);
    Some((id, b))
}

/// The id of the mailbox `name`.
pub fn resolve(name: &str) -> Option<u32> {
    registry().lock().ok()?.names.get(name).copied()
}

/// Pushes `msg` into mailbox `id` and wakes its stream `context` (or, when that stream has no
/// scheduler, any of the worker's streams).
pub fn post(id: u32, context: u32, msg: &[u8]) -> bool {
    let Some(b) = mailbox(id) else { return false };
    let Ok(mut msgs) = b.msgs.lock() else { return false };
    msgs.push_back(msg.to_vec());
    drop(msgs);
    if let Ok(w) = b.wakers.lock() {
        if let Some(s) = w.get(&context).or_else(|| w.values().next()) {
            s.commit(WAKE);
        }
    }
    true
}

/// The next message of mailbox `id` (`Ok(None)`: empty; `Err`: no such mailbox).
pub fn take(id: u32) -> Result<Option<Vec<u8>>, u32> {
    let b = mailbox(id).ok_or(1u32)?;
    let mut msgs = b.msgs.lock().map_err(|_| 10u32)?;
    Ok(msgs.pop_front())
}

impl Mailbox {
    /// The stream `context` can be woken through `s`.
    pub fn add_waker(&self, context: u32, s: SchedulerPtr) {
        if let Ok(mut w) = self.wakers.lock() {
            w.insert(context, s);
            self.wakeable.store(w.len(), Ordering::Release);
        }
    }

    /// Commits `event` to one stream of the worker that can be woken (none: nothing happens).
    pub fn wake_any(&self, event: u64) {
        if let Ok(w) = self.wakers.lock() {
            if let Some(s) = w.values().next() {
                s.commit(event);
            }
        }
    }

    /// Whether no stream of the worker can be woken (none has a scheduler).
    pub fn idle(&self) -> bool {
        self.wakeable.load(Ordering::Acquire) == 0
    }

    /// Forgets the scheduler of `context`; once this returns, no thread commits it.
    pub fn remove_waker(&self, context: u32) {
        if let Ok(mut w) = self.wakers.lock() {
            w.remove(&context);
            self.wakeable.store(w.len(), Ordering::Release);
        }
    }
}

/// Starts the timer thread once per process: every `period`, one [`TICK`] per worker that has a
/// registered stream, and one to the main thread per configuration (`callout::tick_configs`).
pub fn start_ticker(period: Duration) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new().name("apf-tick".into()).spawn(move || loop {
            std::thread::sleep(period);
            tick_all();
        });
        if let Err(e) = spawned {
            log::error!("apf: cannot start the timer thread: {e}");
        }
    });
}

fn tick_all() {
    super::callout::tick_configs();
    let boxes: Vec<&'static Mailbox> = match registry().lock() {
        Ok(r) => r.boxes.clone(),
        Err(_) => return,
    };
    for b in boxes {
        if let Ok(w) = b.wakers.lock() {
            if let Some(s) = w.values().next() {
                s.commit(TICK);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::abi::fake;

    fn commits_to(s: usize) -> Vec<u64> {
        fake::COMMITS.lock().unwrap().iter().filter(|(p, _)| *p == s).map(|(_, e)| *e).collect()
    }

    #[test]
    fn a_notice_wakes_its_stream_through_its_scheduler() {
        let (id, b) = register("test/mailbox/a").unwrap();
        assert_eq!(register("test/mailbox/a").unwrap().0, id, "one mailbox per name");
        assert_eq!(resolve("test/mailbox/a"), Some(id));
        b.add_waker(7, fake::scheduler(0x7001));
        b.add_waker(8, fake::scheduler(0x8001));
        assert!(post(id, 8, b"first"));
        assert!(post(id, 8, b"second"));
        assert_eq!(commits_to(0x8001), vec![WAKE, WAKE]);
        assert!(commits_to(0x7001).is_empty(), "only the addressed stream is woken");
        assert_eq!(take(id).unwrap().as_deref(), Some(&b"first"[..]));
        assert_eq!(take(id).unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(take(id).unwrap(), None);
    }

    #[test]
    fn a_notice_for_a_stream_without_scheduler_wakes_another_and_none_after_removal() {
        let (id, b) = register("test/mailbox/b").unwrap();
        assert!(b.idle());
        b.add_waker(1, fake::scheduler(0xb001));
        assert!(!b.idle());
        assert!(post(id, 99, b"x"));
        assert_eq!(commits_to(0xb001), vec![WAKE], "any stream of the worker drains the mailbox");
        b.remove_waker(1);
        assert!(b.idle());
        assert!(post(id, 1, b"y"));
        assert_eq!(commits_to(0xb001), vec![WAKE], "a removed scheduler is never committed");
        assert_eq!(take(id).unwrap().as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn unknown_mailboxes_are_errors_not_panics() {
        assert!(!post(0, 1, b"x"));
        assert!(!post(u32::MAX, 1, b"x"));
        assert!(take(0).is_err());
        assert_eq!(resolve("test/mailbox/none"), None);
    }
}
