//! Errors of the work estimator's configuration (`workEstimator` in the plugin configuration),
//! displayed with their field path as the configuration errors are.
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkEstimatorError {
    /// An `objectCounts` entry with a negative count or average size.
    NegativeObjectCount { key: String },
    /// An `objectCounts` key that is neither `resource` nor `group/resource`.
    BadObjectCountKey { key: String },
    /// A negative `defaultAverageObjectSizeBytes`.
    NegativeDefaultAverageSize,
}

impl fmt::Display for WorkEstimatorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkEstimatorError::NegativeObjectCount { key } => write!(f, "workEstimator.objectCounts[{key:?}]: negative value"),
            WorkEstimatorError::BadObjectCountKey { key } => {
                write!(f, "workEstimator.objectCounts: bad key {key:?} (want \"resource\" or \"group/resource\")")
            }
            WorkEstimatorError::NegativeDefaultAverageSize => f.write_str("workEstimator.defaultAverageObjectSizeBytes: negative"),
        }
    }
}

impl std::error::Error for WorkEstimatorError {}
