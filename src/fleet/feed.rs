//! Feeding one process's [`Fleet`] from its priority levels and applying the fleet's limits to
//! them, shared by the gateway (`gateway::fleet`) and the simulator (`simulate::fleet`); the
//! host's own concerns (which worker drives, sending the calls, routing notices) stay with it.
//! Every [`SAMPLE_EVERY`] each level's seat demand (in use plus waiting, upstream `queueset.go`'s
//! `seatDemandIntegrator`), seats in use and widest waiting request are sampled, seats in use
//! going to the fleet at once; every `period` the demand statistics (upstream
//! `seatDemandStats.update`) and the widest waiting requests go to the fleet.

use super::claim::{EtcdCall, Fleet};
use super::levels::{remap, FleetPolicy};
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
    /// The configuration generation it runs (made for, or last reconfigured to).
    generation: u64,
    /// The levels' names, in the configuration's order (the order of every per-level vector).
    names: Vec<String>,
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
            names: c.levels.iter().map(|l| l.name.clone()).collect(),
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

    /// The configuration generation the feed runs.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A newer configuration `c` for the same fleet (its `fleet` object unchanged): the fleet
    /// keeps its lease and record and re-plans its levels in place ([`Fleet::set_policy`]); the
    /// period's demand, seats in use and widest waiting request carry over by level name.
    pub fn reconfigure(&mut self, c: &Compiled, now: Nanos) {
        let map: Vec<Option<usize>> = c.levels.iter().map(|l| self.names.iter().position(|n| *n == l.name)).collect();
        self.demand = remap(&self.demand, &map, Integrator::new(now));
        self.stats = remap(&self.stats, &map, SeatDemandStats::default());
        (self.in_use, self.widest) = (remap(&self.in_use, &map, 0), remap(&self.widest, &map, 0));
        self.names = c.levels.iter().map(|l| l.name.clone()).collect();
        self.generation = c.generation;
        // The levels run the limits last applied until the next apply (this configuration's
        // new levels none): reports of seats in use stay valid under that fleet generation.
        self.applied = self.applied.map(|(_, g)| (0, g));
        self.fleet.set_policy(FleetPolicy::from_config(&c.config), now);
    }

    /// Leave the fleet gracefully ([`Fleet::leave_gracefully`]; call on every tick once asked).
    pub fn leave_gracefully(&mut self, now: Nanos) -> Vec<EtcdCall> {
        self.fleet.leave_gracefully(now)
    }

    /// Leave the fleet at once ([`Fleet::leave`]): the lease revoke to send.
    pub fn leave(&mut self, now: Nanos) -> Vec<EtcdCall> {
        self.fleet.leave(now)
    }

    /// Levels a newer configuration removed, while seats may be in use on them: in use, plus
    /// the level's limit while requests wait (they may still be dispatched under it).
    fn sample_draining(&mut self, store: &dyn Store) {
        let names: Vec<String> = self.fleet.draining_levels().map(str::to_string).collect();
        for name in names {
            let seats = match engine::read_level(store, &engine::level_key(&name)) {
                Ok(Some(st)) if st.qs.requests_waiting() > 0 => st.qs.seats_in_use().max(st.qs.config().concurrency_limit),
                Ok(Some(st)) => st.qs.seats_in_use(),
                Ok(None) => 0,
                Err(_) => continue,
            };
            self.fleet.set_draining_in_use(&name, seats);
        }
    }

    /// One timer tick at `now`: samples each level's seat demand and seats in use from `store`;
    /// at the end of a period hands the fleet the period's demand statistics and the seats in
    /// use; then the fleet's periodic work.
    pub fn tick(&mut self, c: &Compiled, store: &dyn Store, now: Nanos) -> Tick {
        if self.last_sample.is_none_or(|t| now.saturating_sub(t) >= SAMPLE_EVERY) {
            self.last_sample = Some(now);
            let levels = c.levels.iter().zip(&mut self.demand).zip(&mut self.in_use).zip(&mut self.widest);
            for (((lvl, x), u), w) in levels {
                let Ok(Some(st)) = engine::read_level(store, &lvl.key) else { continue };
                x.set(now, f64::from(st.qs.seat_demand()));
                (*u, *w) = (st.qs.seats_in_use(), (*w).max(st.qs.widest_waiting()));
            }
            // Seats in use go to the fleet with every sample (claims come down as soon as
            // requests drain), demand statistics at the end of each period.
            let applied = self.applied.map_or(0, |(_, g)| g);
            self.fleet.set_seats_in_use(&self.in_use, applied);
            self.sample_draining(store);
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
