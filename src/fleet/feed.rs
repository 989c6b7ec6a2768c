//! Feeding one process's [`Fleet`] from its priority levels and applying the fleet's limits to
//! them: what a host does around the state machine, with the host's own concerns (which worker
//! drives, sending the calls, routing the notices) left to it. The gateway
//! (`gateway::fleet`) and the simulator (`simulate::fleet`) both drive the fleet through this.
//!
//! Every timer tick the host calls [`FleetFeed::tick`]: every [`SAMPLE_EVERY`] each level's seat
//! demand (seats in use plus seats waiting, what upstream's `queueset.go` keeps in its
//! `seatDemandIntegrator`) goes into a per-period integrator, and the seats in use (under the
//! generation of the limits last applied) and the widest waiting request are noted, the seats in
//! use going to the fleet at once; every `period` the period's demand statistics
//! (`SeatDemandStats::update`, upstream `seatDemandStats.update`) and the period's widest waiting
//! request go to the fleet. The host sends the
//! calls [`FleetFeed::tick`] and [`FleetFeed::on_response`] return, and calls
//! [`FleetFeed::apply`] after each (forced at the end of a period).

use super::claim::{EtcdCall, Fleet};
use crate::engine::store::Store;
use crate::engine::{self, Compiled, EngineError, Notice};
use crate::limits::borrowing::SeatDemandStats;
use crate::limits::integrator::Integrator;
use crate::Nanos;

/// Each level's seat demand is sampled this often (each sample decodes every level); the
/// integrator weighs a sample by how long it held.
pub const SAMPLE_EVERY: Nanos = 200_000_000;

/// One process's fleet membership and the state that feeds it.
#[derive(Debug, Clone)]
pub struct FleetFeed {
    fleet: Fleet,
    /// The configuration generation it was made for.
    generation: u64,
    /// Per level: the seat demand over the current period, and its statistics so far.
    demand: Vec<Integrator>,
    stats: Vec<SeatDemandStats>,
    in_use: Vec<u32>,
    /// Per level: the widest waiting request seen by the samples of the current period.
    widest: Vec<u32>,
    period_start: Nanos,
    last_sample: Option<Nanos>,
    /// (configuration generation, fleet generation) of the limits last applied to the levels.
    applied: Option<(u64, u64)>,
}

/// What one [`FleetFeed::tick`] asks of the host.
#[derive(Debug)]
pub struct Tick {
    /// The etcd calls to send.
    pub calls: Vec<EtcdCall>,
    /// A period ended: apply the limits even if they did not change (a worker with a newer
    /// configuration may have created or reconfigured a level meanwhile).
    pub period_ended: bool,
}

impl FleetFeed {
    /// The feed of `fleet` for the levels of `c`, its first period starting at `now`.
    pub fn new(fleet: Fleet, c: &Compiled, now: Nanos) -> FleetFeed {
        let n = c.levels.len();
        FleetFeed {
            fleet,
            generation: c.generation,
            demand: (0..n).map(|_| Integrator::new(now)).collect(),
            stats: vec![SeatDemandStats::default(); n],
            in_use: vec![0; n],
            widest: vec![0; n],
            period_start: now,
            last_sample: None,
            applied: None,
        }
    }

    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The configuration generation the feed was made for (a newer one needs a new feed).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// One timer tick at `now`: samples each level's seat demand and seats in use from `store`;
    /// at the end of a period hands the fleet the period's demand statistics and the seats in
    /// use; then the fleet's periodic work.
    pub fn tick(&mut self, c: &Compiled, store: &dyn Store, now: Nanos) -> Tick {
        let sample = self.last_sample.is_none_or(|t| now.saturating_sub(t) >= SAMPLE_EVERY);
        if sample {
            self.last_sample = Some(now);
        }
        for (i, lvl) in c.levels.iter().enumerate().filter(|_| sample) {
            let Ok(Some(st)) = engine::read_level(store, &lvl.key) else { continue };
            if let Some(x) = self.demand.get_mut(i) {
                x.set(now, f64::from(st.qs.seat_demand()));
            }
            if let Some(u) = self.in_use.get_mut(i) {
                *u = st.qs.seats_in_use();
            }
            if let Some(w) = self.widest.get_mut(i) {
                *w = (*w).max(st.qs.widest_waiting());
            }
        }
        // Seats in use go to the fleet with every sample (so that claims come down as soon as
        // requests drain), demand statistics at the end of each period.
        if sample {
            let applied = self.applied.map_or(0, |(_, g)| g);
            self.fleet.set_seats_in_use(&self.in_use, applied);
        }
        let period_ended = now.saturating_sub(self.period_start) >= self.fleet.config().period;
        if period_ended {
            self.period_start = now;
            for (s, x) in self.stats.iter_mut().zip(self.demand.iter_mut()) {
                s.update(&x.reset(now));
            }
            self.fleet.set_local_demand(&self.stats);
            self.fleet.set_widest_waiting(&self.widest);
            self.widest.iter_mut().for_each(|w| *w = 0);
        }
        Tick { calls: self.fleet.tick(now), period_ended }
    }

    /// An etcd answer (status 0: none, or the call could not be sent); the calls to send next.
    pub fn on_response(&mut self, id: u64, status: u16, body: &[u8], now: Nanos) -> Vec<EtcdCall> {
        self.fleet.on_response(id, status, body, now)
    }

    /// Applies the fleet's limits to the levels of `c` in `store` when they changed (or the
    /// configuration did), or when `force`d; what the levels dispatched goes to `notices`.
    pub fn apply(
        &mut self,
        c: &Compiled,
        store: &dyn Store,
        now: Nanos,
        force: bool,
        notices: &mut Vec<Notice>,
    ) -> Result<(), EngineError> {
        let want = (c.generation, self.fleet.generation());
        if self.applied == Some(want) && !force {
            return Ok(());
        }
        engine::set_limits(c, store, now, self.fleet.limits(), notices)?;
        self.applied = Some(want);
        Ok(())
    }
}
