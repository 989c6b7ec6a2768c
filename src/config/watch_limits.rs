//! The `watchLimits` object of the plugin configuration (beyond upstream): the most WATCHes one
//! flow, or one priority level, may hold open on this process. The engine counts the places
//! (`engine::watch_limits`); `crate::config` parses the object.

/// The configured limits (`watchLimits`): `per_flow` for every flow of a non-exempt level,
/// `per_level` by level name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchLimits {
    pub per_flow: Option<u32>,
    pub per_level: Vec<(String, u32)>,
}

impl WatchLimits {
    /// Whether any limit is configured (off otherwise: nothing is counted).
    pub fn is_on(&self) -> bool {
        self.per_flow.is_some() || !self.per_level.is_empty()
    }

    /// The limits that apply to a watch of `level` (`exempt`: no per-flow limit).
    pub fn for_level(&self, level: &str, exempt: bool) -> Limit {
        let per_level = self.per_level.iter().find(|(l, _)| l == level).map(|(_, n)| *n);
        Limit { per_flow: self.per_flow.filter(|_| !exempt), per_level }
    }
}

/// The limits of one watch's flow and level (`None`: unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limit {
    pub per_flow: Option<u32>,
    pub per_level: Option<u32>,
}

impl Limit {
    /// Whether either limit applies.
    pub fn is_some(&self) -> bool {
        self.per_flow.is_some() || self.per_level.is_some()
    }
}
