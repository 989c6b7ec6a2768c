//! Worker registry and leases.
//!
//! Every Envoy worker VM that takes part registers under a random 64-bit instance id and gets a
//! never-reused slot number; the slot is the owner recorded with each of its requests in the
//! shared QueueSets. A worker renews its lease (heartbeat) on its timer. A worker whose heartbeat
//! is older than the lease TTL is presumed dead (its VM crashed or was torn down): any other
//! worker reaps it, which removes its waiting requests and releases the seats of its executing
//! ones, so no seat can leak whatever happens to a VM.

use crate::codec::{CodecResult, Writer};
use crate::Nanos;

pub const REGISTRY_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerEntry {
    pub slot: u32,
    pub instance: u64,
    pub heartbeat: Nanos,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Registry {
    /// Highest slot ever handed out (slots are never reused).
    pub last_slot: u32,
    pub workers: Vec<WorkerEntry>,
}

impl Registry {
    pub fn decode(bytes: Option<&[u8]>) -> CodecResult<Registry> {
        let Some(bytes) = bytes else { return Ok(Registry::default()) };
        let mut r = super::versioned(bytes, REGISTRY_VERSION, "registry version")?;
        let last_slot = r.u32()?;
        let n = r.count(3)?;
        let workers = (0..n).map(|_| Ok(WorkerEntry { slot: r.u32()?, instance: r.fixed64()?, heartbeat: r.i64()? }));
        Ok(Registry { last_slot, workers: workers.collect::<CodecResult<_>>()? })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(8 + self.workers.len() * 20);
        w.u8(REGISTRY_VERSION);
        w.u32(self.last_slot);
        w.usize(self.workers.len());
        for e in &self.workers {
            w.u32(e.slot);
            w.fixed64(e.instance);
            w.i64(e.heartbeat);
        }
        w.into_bytes()
    }

    /// Registers or renews `instance`; returns its slot.
    pub fn heartbeat(&mut self, instance: u64, now: Nanos) -> u32 {
        if let Some(e) = self.workers.iter_mut().find(|e| e.instance == instance) {
            e.heartbeat = e.heartbeat.max(now);
            return e.slot;
        }
        self.last_slot = self.last_slot.wrapping_add(1).max(1);
        let slot = self.last_slot;
        self.workers.push(WorkerEntry { slot, instance, heartbeat: now });
        slot
    }

    /// Renews the leases of those of `instances` that are registered (an unregistered one is
    /// left out: renewing never hands out a slot); returns how many were renewed.
    pub fn renew(&mut self, instances: &[u64], now: Nanos) -> usize {
        let renewed = self.workers.iter_mut().filter(|e| instances.contains(&e.instance));
        renewed.map(|e| e.heartbeat = e.heartbeat.max(now)).count()
    }

    /// Removes and returns the workers whose lease expired.
    pub fn reap(&mut self, now: Nanos, ttl: Nanos) -> Vec<WorkerEntry> {
        self.workers.extract_if(.., |e| now.saturating_sub(e.heartbeat) > ttl).collect()
    }

    pub fn instance_of(&self, slot: u32) -> Option<u64> {
        self.workers.iter().find(|e| e.slot == slot).map(|e| e.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_unique_and_leases_expire() {
        let mut r = Registry::default();
        let a = r.heartbeat(11, 0);
        let b = r.heartbeat(22, 0);
        assert_ne!(a, b);
        assert_eq!(r.heartbeat(11, 5), a);
        let bytes = r.encode();
        let mut r2 = Registry::decode(Some(&bytes)).unwrap();
        assert_eq!(r2, r);
        let dead = r2.reap(20, 10);
        assert_eq!(dead.len(), 2);
        let c = r2.heartbeat(11, 21);
        assert!(c > b, "slots are never reused");
        assert!(Registry::decode(Some(&[9, 9, 9])).is_err());
    }

    #[test]
    fn renewal_keeps_registered_workers_and_registers_nobody() {
        let mut r = Registry::default();
        let a = r.heartbeat(11, 0);
        r.heartbeat(22, 0);
        assert_eq!(r.renew(&[11, 33], 8), 1, "33 never registered");
        assert_eq!(r.instance_of(a), Some(11));
        assert_eq!(r.workers.len(), 2, "no slot handed out by a renewal");
        let dead = r.reap(10, 5);
        assert_eq!(dead.iter().map(|e| e.instance).collect::<Vec<_>>(), vec![22], "11 was renewed at 8");
        assert_eq!(r.renew(&[11], 3), 1);
        assert_eq!(r.workers.first().map(|e| e.heartbeat), Some(8), "a renewal never moves a lease back");
    }
}
