//! The engine's operations on the shared state: admit, finish, end, time out, expire, purge a
//! dead worker's requests, and the workers' leases.

use super::compiled::Compiled;
use super::store::Store;
use super::workers::Registry;
use super::*;
use crate::fairqueuing::queueset::Arrival;
use crate::fairqueuing::{Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// A classified request to admit.
#[derive(Debug, Clone, Copy)]
pub struct Arriving {
    /// Its priority level (index into the compiled levels).
    pub level: usize,
    pub work: WorkEstimate,
    pub tag: RequestTag,
}

/// Admits a classified request to its priority level: its decision, and the length of its
/// queue after it was enqueued (`None` when it was not enqueued): upstream's
/// `request_queue_length_after_enqueue`.
pub fn admit(
    c: &Compiled,
    store: &dyn Store,
    now: Nanos,
    request: Arriving,
    notices: &mut Vec<Notice>,
) -> Result<(Decision, Option<u32>), EngineError> {
    let Arriving { level, work, tag } = request;
    let lvl = c.levels.get(level).ok_or_else(|| EngineError::Config("level index out of range".into()))?;
    let r = update_level(store, now, &lvl.key, Some((lvl, c.generation)), notices, |st, out| {
        let started = st.qs.start_request(now, work, tag, out);
        let decision = match started.arrival {
            Arrival::Executing(rc) => Decision::Execute(rc),
            Arrival::Queued(id) => Decision::Queued(id),
            Arrival::Rejected(reason) => Decision::Rejected { reason, retry_after: st.reject(now) },
        };
        (decision, started.queue_length)
    })?;
    r.ok_or_else(|| EngineError::Config("arrival without a decision".into()))
}

/// The request's handler returned (or a WATCH finished initializing): release its seats
/// (after its additional latency, if any) and dispatch what fits. Returns false when the seats
/// were already released (double finish, or the owner's lease was reaped).
pub fn finish(store: &dyn Store, now: Nanos, level_key: &str, receipt: &Receipt, notices: &mut Vec<Notice>) -> Result<bool, EngineError> {
    Ok(update_level(store, now, level_key, None, notices, |st, out| st.qs.finish(now, receipt, out))?.unwrap_or(false))
}

/// The request's stream ended: an executing request (its receipt given) finishes; a waiting
/// one leaves its queue (counted as `time-out`, as upstream counts cancellations). A request
/// dispatched while its wake-up is still in flight is finished when the wake-up arrives.
pub fn end(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    id: RequestId,
    receipt: Option<&Receipt>,
    notices: &mut Vec<Notice>,
) -> Result<(), EngineError> {
    if let Some(rc) = receipt {
        return finish(store, now, level_key, rc, notices).map(|_| ());
    }
    update_level(store, now, level_key, None, notices, |st, _| st.qs.cancel(now, id)).map(|_| ())
}

/// Gives up waiting for a queued request (its wait limit passed). Returns the Retry-After to
/// answer with, or `None` when it was dispatched meanwhile (then it must be resumed instead).
pub fn time_out(store: &dyn Store, now: Nanos, level_key: &str, id: RequestId) -> Result<Option<i64>, EngineError> {
    let r = update_level(store, now, level_key, None, &mut Vec::new(), |st, _| st.qs.cancel(now, id).map(|_| st.reject(now)));
    Ok(r?.flatten())
}

/// Timer work for one level: wait deadlines and lingering seats that are due. Cheap when
/// nothing is due (one read, no write).
pub fn expire_level(store: &dyn Store, now: Nanos, level_key: &str, notices: &mut Vec<Notice>) -> Result<(), EngineError> {
    if peek_level(store, level_key, |st| st.qs.next_event())?.flatten().is_none_or(|t| t > now) {
        return Ok(());
    }
    // The time-outs come before the dispatches they made room for.
    let mut runs = Vec::new();
    let timed_out = update_level(store, now, level_key, None, &mut runs, |st, out| {
        let mut timed = Vec::new();
        st.qs.expire(now, &mut timed, out);
        let notice = |(id, tag): (RequestId, RequestTag), retry_after| {
            let kind = NoticeKind::Reject { reason: RejectReason::TimeOut, retry_after };
            Notice { owner: tag.owner, context: tag.context, level_key: level_key.to_string(), id, kind }
        };
        timed.into_iter().map(|t| notice(t, st.reject(now))).collect::<Vec<_>>()
    })?;
    notices.extend(timed_out.into_iter().flatten());
    notices.append(&mut runs);
    Ok(())
}

/// Lease expiry: drops every request of a dead worker from a level and dispatches what fits.
pub fn purge_owner(store: &dyn Store, now: Nanos, level_key: &str, owner: u32, notices: &mut Vec<Notice>) -> Result<usize, EngineError> {
    Ok(update_level(store, now, level_key, None, notices, |st, out| st.qs.remove_owner(owner, now, out))?.unwrap_or(0))
}

/// Renews this worker's lease (registering it on first call); returns its slot.
pub fn heartbeat(store: &dyn Store, instance: u64, now: Nanos) -> Result<u32, EngineError> {
    update_value(store, REGISTRY_KEY, Registry::decode, Registry::encode, |reg| reg.heartbeat(instance, now))
}

/// Renews, in one write, the leases of those of `instances` that are registered (a host whose
/// workers live exactly as long as its process renews them all from one thread); returns how
/// many were renewed.
pub fn renew_leases(store: &dyn Store, instances: &[u64], now: Nanos) -> Result<usize, EngineError> {
    update_value(store, REGISTRY_KEY, Registry::decode, Registry::encode, |reg| reg.renew(instances, now))
}

/// Reaps workers whose lease expired and releases everything they held in `level_keys`.
pub fn reap_dead_workers(
    store: &dyn Store,
    now: Nanos,
    ttl: Nanos,
    level_keys: &[String],
    notices: &mut Vec<Notice>,
) -> Result<Vec<workers::WorkerEntry>, EngineError> {
    let (cur, _) = store.get(REGISTRY_KEY)?;
    let reg = Registry::decode(cur.as_deref()).unwrap_or_default();
    if !reg.workers.iter().any(|e| now.saturating_sub(e.heartbeat) > ttl) {
        return Ok(Vec::new());
    }
    let dead = update_value(store, REGISTRY_KEY, Registry::decode, Registry::encode, |reg| reg.reap(now, ttl))?;
    for e in &dead {
        for key in level_keys {
            purge_owner(store, now, key, e.slot, notices)?;
        }
        watches::purge(store, e.slot)?;
    }
    Ok(dead)
}

/// Looks up the mailbox instance of a worker slot.
pub fn instance_of(store: &dyn Store, slot: u32) -> Result<Option<u64>, EngineError> {
    let (cur, _) = store.get(REGISTRY_KEY)?;
    Ok(Registry::decode(cur.as_deref()).unwrap_or_default().instance_of(slot))
}
