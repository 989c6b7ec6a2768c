//! Why an allocation problem of `compute_concurrency_allocation` has no solution, with
//! upstream's messages (`pkg/util/flowcontrol/conc_alloc.go: computeConcurrencyAllocation`).
use std::fmt;

use super::conc_alloc::AllocProblemItem;

#[derive(Debug, Clone, PartialEq)]
pub enum AllocError {
    /// `required_sum` is negative.
    NegativeSum,
    /// A class has a NaN or infinite bound or target (checked here, not upstream).
    NonFinite {
        class: usize,
        item: AllocProblemItem,
    },
    NegativeLowerBound {
        class: usize,
        lower: f64,
    },
    TargetBelowLowerBound {
        class: usize,
        target: f64,
        lower: f64,
    },
    UpperBelowLowerBound {
        class: usize,
        upper: f64,
        lower: f64,
    },
    /// The largest relative lower bound exceeds 1 by `excess`.
    LowerRangeAboveOne {
        excess: f64,
    },
    LowerBoundsAboveSum {
        low_sum: f64,
        required_sum: i64,
    },
    UpperBoundsBelowSum {
        high_sum: f64,
        required_sum: i64,
    },
    /// The bound walk ran out of bounds (upstream's "impossible").
    RanOutOfBounds,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::NegativeSum => f.write_str("negative sums are not supported"),
            AllocError::NonFinite { class, item } => write!(f, "class {class} has a non-finite bound or target: {item:?}"),
            AllocError::NegativeLowerBound { class, lower } => {
                write!(f, "lower bound {class} is {lower} but negative lower bounds are not allowed")
            }
            AllocError::TargetBelowLowerBound { class, target, lower } => {
                write!(f, "target {class} is {target}, which is below its lower bound of {lower}")
            }
            AllocError::UpperBelowLowerBound { class, upper, lower } => {
                write!(f, "upper bound {class} is {upper} but should not be less than the lower bound {lower}")
            }
            AllocError::LowerRangeAboveOne { excess } => {
                write!(f, "lbRange.max-1={excess}, which is impossible because lbRange.max can not be greater than 1")
            }
            AllocError::LowerBoundsAboveSum { low_sum, required_sum } => {
                write!(f, "lower bounds sum to {low_sum}, which is higher than the required sum of {required_sum}")
            }
            AllocError::UpperBoundsBelowSum { high_sum, required_sum } => {
                write!(f, "upper bounds sum to {high_sum}, which is lower than the required sum of {required_sum}")
            }
            AllocError::RanOutOfBounds => f.write_str("impossible: ran out of bounds to consider in bound-constrained problem"),
        }
    }
}

impl std::error::Error for AllocError {}
