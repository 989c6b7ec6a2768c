//! The priority levels as the fleet sees them: the static per-level limits computed from the
//! fleet limit (`serverConcurrencyLimit`) exactly as the engine computes them for one process
//! (`limits::static_limits::compute_limits`, upstream `apf_controller.go:
//! finishQueueSetReconfigsLocked`).

use crate::limits::static_limits::{compute_limits, LevelLimits};
use crate::policy::config::PluginConfig;
use crate::policy::model::PriorityLevel;

/// One priority level's static values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLevel {
    pub name: String,
    /// Exempt levels are never limited; their demand still counts (it lowers `remaining` in
    /// `updateBorrowingLocked`).
    pub exempt: bool,
    pub limits: LevelLimits,
}

/// The fleet limit and its levels (in the policy's order, which the engine also uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPolicy {
    /// `serverConcurrencyLimit`: the limit of the whole fleet.
    pub server_concurrency_limit: u32,
    pub levels: Vec<FleetLevel>,
}

impl FleetPolicy {
    /// The static limits of `levels` at the fleet limit `server_cl`.
    pub fn new(server_cl: u32, levels: &[PriorityLevel]) -> FleetPolicy {
        let (limits, _) = compute_limits(server_cl, levels);
        let levels = levels.iter().zip(limits).map(|(l, limits)| FleetLevel { name: l.name.clone(), exempt: l.is_exempt(), limits });
        FleetPolicy { server_concurrency_limit: server_cl, levels: levels.collect() }
    }

    /// The levels of a parsed plugin configuration (its limits are already computed).
    pub fn from_config(cfg: &PluginConfig) -> FleetPolicy {
        let levels = cfg.policy.priority_levels.iter().zip(&cfg.limits);
        let levels = levels.map(|(l, limits)| FleetLevel { name: l.name.clone(), exempt: l.is_exempt(), limits: *limits });
        FleetPolicy { server_concurrency_limit: cfg.server_concurrency_limit, levels: levels.collect() }
    }

    /// `nominalCLSum`: Σ NominalCL over every level, exempt ones included (upstream passes it to
    /// `updateBorrowingLocked`; the ceil rounding may make it exceed the fleet limit).
    pub fn nominal_sum(&self) -> u32 {
        self.levels.iter().fold(0u32, |s, l| s.saturating_add(l.limits.nominal))
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.levels.iter().position(|l| l.name == name)
    }

    /// How many levels are limited (not exempt).
    pub fn limited_levels(&self) -> usize {
        self.levels.iter().filter(|l| !l.exempt).count()
    }
}
