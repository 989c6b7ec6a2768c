//! HTTP calls of the native host: every call goes out from the main thread as a configuration's
//! callout, and its reply goes back to the thread (and root) that asked.
//!
//! Why the main thread: a stream's callout (`..._http_filter_http_callout`) is cancelled with its
//! stream, and the gateway starts its calls from a root's timer, which runs in whatever stream
//! of the worker carries the tick — often one about to end. A configuration's callout
//! (`filter_config.cc: DynamicModuleHttpFilterConfig::sendHttpCallout`) lives as long as the
//! configuration, but uses the calling thread's cluster manager, so it is started on the main
//! thread, from the configuration's scheduler event; its reply arrives on the main thread.
//!
//! The path of a call: [`start`] (any thread, inside a root's hook) queues the request in the
//! [`outbox`] under a fresh token and commits the configuration's scheduler ([`CALLS`]); on the
//! main thread [`send_queued`] starts every queued request of that configuration; its reply
//! ([`done`]) is pushed into the asking thread's [`Inbox`] and that worker is woken through one
//! of its streams' schedulers (`wake::Mailbox::wake_any`). A worker with no wakeable stream
//! takes its replies at its next hook ([`take_replies`]). A reply is delivered to the root of the
//! configuration that asked, through `Root::on_http_call_response`, with [`with_reply`] making
//! its status, headers and body what the host reads as `HeaderMap::CallResponse` /
//! `Body::CallResponse`.
//!
//! The main thread also runs a root per configuration, ticked through the configuration's
//! scheduler ([`TICK`], from the timer thread): as the proxy-wasm root context of the main thread
//! does, it keeps the polls (cluster policy, object counts) and the fleet driver going while no
//! worker has a stream.

use super::abi::{ConfigPtr, ConfigSchedulerPtr};
use super::wake;
use crate::gateway::host::{serialize_pairs, CallError};
use hashbrown::HashMap;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Configuration-scheduler event: start the queued calls.
pub const CALLS: u64 = 1;
/// Configuration-scheduler event: the main thread's timer.
pub const TICK: u64 = 2;
/// Stream-scheduler event: replies wait in the worker's inbox.
pub const REPLIES: u64 = 3;

/// A call's reply: the token it was started under, the asking root's configuration, the
/// response headers in the host's serialization (empty: no response) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub token: u32,
    pub config: u64,
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
}

/// One thread's replies, and the mailbox through which it is woken.
#[derive(Default)]
pub struct Inbox {
    replies: Mutex<VecDeque<Reply>>,
    waiting: AtomicUsize,
    mailbox: Mutex<Option<&'static wake::Mailbox>>,
}

/// A request waiting for the main thread.
struct Queued {
    config: u64,
    token: u32,
    cluster: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Duration,
    inbox: Arc<Inbox>,
}

/// Calls under way: (configuration, callout id) → (token, asking thread's inbox).
type Pending = HashMap<(u64, u64), (u32, Arc<Inbox>)>;

thread_local! {
    static INBOX: Arc<Inbox> = Arc::new(Inbox::default());
    /// The reply being delivered on this thread.
    static CURRENT: RefCell<Option<Reply>> = const { RefCell::new(None) };
    /// The configuration whose root runs on this thread now.
    static CONFIG: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

fn outbox() -> &'static Mutex<Vec<Queued>> {
    static O: OnceLock<Mutex<Vec<Queued>>> = OnceLock::new();
    O.get_or_init(Mutex::default)
}

fn pending() -> &'static Mutex<Pending> {
    static P: OnceLock<Mutex<Pending>> = OnceLock::new();
    P.get_or_init(Mutex::default)
}

/// The live configurations' schedulers, by configuration id.
fn schedulers() -> &'static Mutex<HashMap<u64, ConfigSchedulerPtr>> {
    static S: OnceLock<Mutex<HashMap<u64, ConfigSchedulerPtr>>> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

/// Commits `event` to the scheduler of configuration `config`: whether it is live.
fn commit(config: u64, event: u64) -> bool {
    let Ok(s) = schedulers().lock() else { return false };
    s.get(&config).map(|s| s.commit(event)).is_some()
}

/// Registers the scheduler of a new configuration (main thread).
pub fn add_config(config: u64, envoy: ConfigPtr) {
    match envoy.new_scheduler() {
        Some(s) => drop(schedulers().lock().map(|mut all| all.insert(config, s))),
        None => log::error!("apf: Envoy gave the configuration no scheduler; HTTP calls and the main thread's timer are off"),
    }
}

/// Forgets a destroyed configuration: its scheduler (deleted once no thread can commit it), its
/// queued requests and its calls under way (Envoy cancels them).
pub fn remove_config(config: u64) {
    let gone = schedulers().lock().ok().and_then(|mut all| all.remove(&config));
    if let Some(s) = gone {
        s.delete();
    }
    if let Ok(mut q) = outbox().lock() {
        q.retain(|c| c.config != config);
    }
    if let Ok(mut p) = pending().lock() {
        p.retain(|(c, _), _| *c != config);
    }
}

/// Commits [`TICK`] to every live configuration (from the timer thread).
pub fn tick_configs() {
    if let Ok(all) = schedulers().lock() {
        all.values().for_each(|s| s.commit(TICK));
    }
}

/// Runs `f` as the root of configuration `config` (the calls it starts are that root's).
pub fn as_config<T>(config: u64, f: impl FnOnce() -> T) -> T {
    let before = CONFIG.with(|c| c.replace(Some(config)));
    let out = f();
    CONFIG.with(|c| c.set(before));
    out
}

/// Queues a call of the root running on this thread: its token (`NoProxy`: no root runs, or its
/// configuration is gone).
pub fn start(cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> Result<u32, CallError> {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let config = CONFIG.with(|c| c.get()).ok_or(CallError::NoProxy)?;
    let token = NEXT.fetch_add(1, Ordering::Relaxed).max(1);
    let inbox = INBOX.with(Arc::clone);
    if let (Some(m), Ok(mut slot)) = (super::host::mailbox(), inbox.mailbox.lock()) {
        *slot = Some(m);
    }
    let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let q = Queued { config, token, cluster: cluster.to_string(), headers, body: body.to_vec(), timeout, inbox };
    outbox().lock().map_err(|_| CallError::Refused(10))?.push(q);
    if commit(config, CALLS) {
        return Ok(token);
    }
    if let Ok(mut q) = outbox().lock() {
        q.retain(|c| c.token != token);
    }
    Err(CallError::NoProxy)
}

/// Starts the queued calls of configuration `config` (main thread); a call Envoy refuses is
/// answered at once with no response (logged).
pub fn send_queued(config: u64, envoy: ConfigPtr) {
    let mine: Vec<Queued> = match outbox().lock() {
        Ok(mut q) => {
            let (mine, rest) = std::mem::take(&mut *q).into_iter().partition(|c| c.config == config);
            *q = rest;
            mine
        }
        Err(_) => return,
    };
    for q in mine {
        let hs: Vec<(&str, &[u8])> = q.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())).collect();
        let ms = u64::try_from(q.timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        match envoy.http_callout(&q.cluster, &hs, &q.body, ms) {
            Ok(id) => drop(pending().lock().map(|mut p| p.insert((config, id), (q.token, q.inbox)))),
            Err(r) => {
                log::warn!("apf: Envoy refused the HTTP call to cluster {:?} (callout init result {r})", q.cluster);
                deliver(&q.inbox, Reply { token: q.token, config, headers: Vec::new(), body: Vec::new() });
            }
        }
    }
}

/// The reply of callout `id` of configuration `config` (main thread; `headers` empty: no
/// response).
pub fn done(config: u64, id: u64, headers: &[(Vec<u8>, Vec<u8>)], body: Vec<u8>) {
    let Some((token, inbox)) = pending().lock().ok().and_then(|mut p| p.remove(&(config, id))) else { return };
    let pairs: Vec<(&str, &[u8])> = headers.iter().filter_map(|(k, v)| Some((std::str::from_utf8(k).ok()?, v.as_slice()))).collect();
    let headers = if pairs.is_empty() { Vec::new() } else { serialize_pairs(&pairs) };
    deliver(&inbox, Reply { token, config, headers, body });
}

/// Pushes `reply` into `inbox` and wakes its worker (a thread without a mailbox, the main
/// thread, takes it when the hook returns).
fn deliver(inbox: &Inbox, reply: Reply) {
    if let Ok(mut r) = inbox.replies.lock() {
        r.push_back(reply);
        inbox.waiting.fetch_add(1, Ordering::Release);
    }
    if let Ok(m) = inbox.mailbox.lock() {
        if let Some(m) = m.as_ref() {
            m.wake_any(REPLIES);
        }
    }
}

/// The replies waiting for this thread (cheap when there are none).
pub fn take_replies() -> Vec<Reply> {
    INBOX.with(|i| {
        if i.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let Ok(mut r) = i.replies.lock() else { return Vec::new() };
        i.waiting.store(0, Ordering::Release);
        r.drain(..).collect()
    })
}

/// Runs `f` with `reply` as the call response the host reads.
pub fn with_reply<T>(reply: Reply, f: impl FnOnce() -> T) -> T {
    CURRENT.with(|c| *c.borrow_mut() = Some(reply));
    let out = f();
    CURRENT.with(|c| *c.borrow_mut() = None);
    out
}

/// The response headers of the reply being delivered (host serialization; empty: none).
pub fn reply_headers() -> Vec<u8> {
    CURRENT.with(|c| c.borrow().as_ref().map(|r| r.headers.clone()).unwrap_or_default())
}

/// `max` bytes from `start` of the reply body being delivered (`None`: no reply).
pub fn reply_body(start: usize, max: usize) -> Option<Vec<u8>> {
    CURRENT.with(|c| {
        let c = c.borrow();
        let body = &c.as_ref()?.body;
        let end = start.saturating_add(max).min(body.len());
        Some(body.get(start.min(end)..end).unwrap_or_default().to_vec())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::host::{pairs, serialize_pairs};
    use crate::native::abi::fake;

    #[test]
    fn a_call_goes_out_on_the_main_thread_and_its_reply_comes_back_to_the_asker() {
        add_config(71, fake::config(0x7100));
        let token = as_config(71, || start("apiserver", &[(":path", "/x")], b"", Duration::from_secs(1))).unwrap();
        assert!(fake::CONFIG_COMMITS.lock().unwrap().contains(&(0x7100, CALLS)));
        assert!(take_replies().is_empty(), "nothing before the main thread sends it");
        send_queued(71, fake::config(0x7100));
        let id = fake::CALLOUTS.lock().unwrap().iter().find(|(c, _)| c == "apiserver").unwrap().1;
        done(71, id, &[(b":status".to_vec(), b"200".to_vec())], b"hello".to_vec());
        done(71, id, &[], Vec::new()); // a second reply to the same callout is ignored
        let replies = take_replies();
        assert_eq!(replies.len(), 1);
        let r = replies.into_iter().next().unwrap();
        assert_eq!((r.token, r.config), (token, 71));
        with_reply(r, || {
            assert_eq!(pairs(&reply_headers()), vec![(":status", &b"200"[..])]);
            assert_eq!(reply_body(1, 3).as_deref(), Some(&b"ell"[..]));
            assert_eq!(reply_body(9, 3).as_deref(), Some(&b""[..]));
        });
        assert_eq!(reply_body(0, 1), None, "no reply outside delivery");
        remove_config(71);
    }

    #[test]
    fn a_refused_call_is_answered_without_response_and_calls_need_a_live_root() {
        add_config(72, fake::config(0x7200));
        let token = as_config(72, || start("missing", &[], b"", Duration::from_secs(1))).unwrap();
        send_queued(72, fake::config(0x7200));
        let r = take_replies();
        assert_eq!(r, vec![Reply { token, config: 72, headers: Vec::new(), body: Vec::new() }]);
        assert_eq!(start("x", &[], b"", Duration::from_secs(1)), Err(CallError::NoProxy), "no root runs");
        remove_config(72);
        assert_eq!(as_config(72, || start("x", &[], b"", Duration::from_secs(1))), Err(CallError::NoProxy));
        assert!(!serialize_pairs(&[]).is_empty());
    }
}
