//! `computeConcurrencyAllocation` (upstream `pkg/util/flowcontrol/conc_alloc.go`).
//!
//! Finds `fair_prop` such that `alloc_i = clamp(fair_prop × target_i, lower_i, upper_i)` and the
//! allocations sum to `required_sum`. Same constants (`MIN_TARGET = 0.001`, `EPSILON = 1e-7`),
//! same checks in the same order, same error conditions and the same bound-walking algorithm.
//!
//! Deviation: upstream does not look at NaN/±inf inputs (NaN slips through all comparisons).
//! Here any non-finite `lower_bound`, `upper_bound` or `target` is an error, checked first.

pub use super::alloc_error::AllocError;

/// One class to which an allocation is made (upstream `allocProblemItem`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocProblemItem {
    pub lower_bound: f64,
    pub upper_bound: f64,
    pub target: f64,
}

/// Targets smaller than this are treated as this.
pub const MIN_TARGET: f64 = 0.001;
/// Slack allowed when comparing sums.
pub const EPSILON: f64 = 0.0000001;

/// Go's `math.Min` (NaN-propagating; inputs here are finite).
fn go_min(a: f64, b: f64) -> f64 {
    -go_max(-a, -b)
}

/// Go's `math.Max` (NaN-propagating).
pub(super) fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b {
        a
    } else {
        b
    }
}

/// Returns `(allocs, fair_prop)` or an error saying why the problem has no solution.
/// `required_sum` is an integer as upstream (`int`).
pub fn compute_concurrency_allocation(required_sum: i64, classes: &[AllocProblemItem]) -> Result<(Vec<f64>, f64), AllocError> {
    if required_sum < 0 {
        return Err(AllocError::NegativeSum);
    }
    for (idx, item) in classes.iter().enumerate() {
        if !item.lower_bound.is_finite() || !item.upper_bound.is_finite() || !item.target.is_finite() {
            return Err(AllocError::NonFinite { class: idx, item: *item });
        }
    }
    let required = required_sum as f64;
    // The target used (inputs are finite here).
    let target_of = |c: &AllocProblemItem| c.target.max(MIN_TARGET);
    let (mut low_sum, mut high_sum, mut target_sum) = (0.0f64, 0.0f64, 0.0f64);
    // The ranges of the relative upper and lower bounds.
    let (mut ub_min, mut ub_max) = (f32::MAX as f64, 0.0f64);
    let (mut lb_min, mut lb_max) = (f32::MAX as f64, 0.0f64);
    // The relative bounds: (bound / target, target, is lower), item by item, lower first.
    let mut ascending: Vec<(f64, f64, bool)> = Vec::with_capacity(classes.len() * 2);
    for (idx, item) in classes.iter().enumerate() {
        let (lower, upper, target) = (item.lower_bound, item.upper_bound, item.target);
        if lower < 0.0 {
            return Err(AllocError::NegativeLowerBound { class: idx, lower });
        }
        if target < lower {
            return Err(AllocError::TargetBelowLowerBound { class: idx, target, lower });
        }
        if upper < lower {
            return Err(AllocError::UpperBelowLowerBound { class: idx, upper, lower });
        }
        let target = target_of(item);
        low_sum += lower;
        high_sum += upper;
        target_sum += target;
        let (rel_lower, rel_upper) = (lower / target, upper / target);
        ub_min = go_min(ub_min, rel_upper);
        ub_max = go_max(ub_max, rel_upper);
        lb_min = go_min(lb_min, rel_lower);
        lb_max = go_max(lb_max, rel_lower);
        ascending.extend([(rel_lower, target, true), (rel_upper, target, false)]);
    }
    if lb_max > 1.0 {
        let excess = lb_max - 1.0;
        return Err(AllocError::LowerRangeAboveOne { excess });
    }
    if low_sum - required > EPSILON {
        return Err(AllocError::LowerBoundsAboveSum { low_sum, required_sum });
    }
    if required - high_sum > EPSILON {
        return Err(AllocError::UpperBoundsBelowSum { high_sum, required_sum });
    }
    if required_sum == 0 {
        return Ok((vec![0.0; classes.len()], 0.0));
    }
    if low_sum - required > -EPSILON {
        return Ok((classes.iter().map(|c| c.lower_bound).collect(), lb_min));
    }
    if required - high_sum > -EPSILON {
        return Ok((classes.iter().map(|c| c.upper_bound).collect(), ub_max));
    }
    let mut fair_prop = required / target_sum;
    if lb_max <= fair_prop && fair_prop <= ub_min {
        return Ok((classes.iter().map(|c| target_of(c) * fair_prop).collect(), fair_prop));
    }
    // Some bounds matter: walk the relative bounds in ascending order (a stable sort).
    ascending.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    let mut sum_so_far = low_sum;
    fair_prop = lb_min;
    let mut sensitive_target_sum = 0.0f64;
    let mut delta_sensitive_target_sum = 0.0f64;
    let mut num_sensitive: i64 = 0;
    let mut delta_sensitive: i64 = 0;
    let mut bounds = ascending.into_iter();
    while sum_so_far < required {
        let next_bound = loop {
            sensitive_target_sum += delta_sensitive_target_sum;
            num_sensitive += delta_sensitive;
            let Some((bound, t, lower)) = bounds.next() else {
                return Err(AllocError::RanOutOfBounds);
            };
            (delta_sensitive, delta_sensitive_target_sum) = if lower { (1, t) } else { (-1, -t) };
            if bound > fair_prop {
                break bound;
            }
        };
        if num_sensitive == 0 {
            fair_prop = next_bound;
            continue;
        }
        let delta_fair_prop = (required - sum_so_far) / sensitive_target_sum;
        let next_prop = fair_prop + delta_fair_prop;
        if next_prop <= next_bound {
            fair_prop = next_prop;
            break;
        }
        sum_so_far += (next_bound - fair_prop) * sensitive_target_sum;
        fair_prop = next_bound;
    }
    let clamp = |c: &AllocProblemItem| go_max(c.lower_bound, go_min(c.upper_bound, fair_prop * target_of(c)));
    Ok((classes.iter().map(clamp).collect(), fair_prop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(target: f64, lower: f64, upper: f64) -> AllocProblemItem {
        AllocProblemItem { lower_bound: lower, upper_bound: upper, target }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn derived_vectors() {
        let (a, p) = compute_concurrency_allocation(10, &[it(5., 0., 10.), it(5., 0., 10.)]).unwrap();
        assert_eq!((a, p), (vec![5., 5.], 1.));
        let (a, p) = compute_concurrency_allocation(10, &[it(1., 0., 10.), it(9., 0., 3.)]).unwrap();
        assert!(close(a[0], 7., 1e-9) && close(a[1], 3., 1e-9) && close(p, 7., 1e-9), "{a:?} {p}");
        let (a, p) = compute_concurrency_allocation(20, &[it(10., 2., 6.), it(10., 2., 30.), it(5., 5., 5.)]).unwrap();
        assert!(close(a[0], 6., 1e-9) && close(a[1], 9., 1e-9) && close(a[2], 5., 1e-9), "{a:?}");
        assert!(close(p, 0.9, 1e-9), "{p}");
        let (a, p) = compute_concurrency_allocation(12, &[it(2., 1., 20.), it(4., 4., 20.), it(0., 0., 1.)]).unwrap();
        assert!(close(a[0], 3.999333, 1e-6) && close(a[1], 7.998667, 1e-6) && close(a[2], 0.002, 1e-6), "{a:?}");
        assert!(close(p, 1.999667, 1e-6), "{p}");
        let three = [it(1., 1., 5.); 3];
        assert_eq!(compute_concurrency_allocation(3, &three).unwrap().0, vec![1., 1., 1.]);
        assert_eq!(compute_concurrency_allocation(15, &three).unwrap().0, vec![5., 5., 5.]);
        assert_eq!(compute_concurrency_allocation(0, &three[..0]).unwrap(), (vec![], 0.0));
    }

    #[test]
    fn error_cases() {
        assert!(compute_concurrency_allocation(-1, &[]).is_err());
        assert!(compute_concurrency_allocation(1, &[]).is_err());
        assert!(compute_concurrency_allocation(5, &[it(1., -1., 5.)]).is_err());
        assert!(compute_concurrency_allocation(5, &[it(1., 2., 5.)]).is_err());
        assert!(compute_concurrency_allocation(5, &[it(3., 2., 1.)]).is_err());
        assert!(compute_concurrency_allocation(1, &[it(3., 2., 5.)]).is_err());
        assert!(compute_concurrency_allocation(10, &[it(3., 2., 5.)]).is_err());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(compute_concurrency_allocation(5, &[it(bad, 1., 5.)]).is_err());
            assert!(compute_concurrency_allocation(5, &[it(2., bad, 5.)]).is_err());
            assert!(compute_concurrency_allocation(5, &[it(2., 1., bad)]).is_err());
        }
        // "lbRange.max > 1" can only arise through MinTarget: target 0.0005 >= lower 0.0004... no:
        // lower/MinTarget > 1 requires lower > 0.001 > target, already rejected; exercise anyway.
        assert!(compute_concurrency_allocation(1, &[it(0.0005, 0.0004, 2.)]).is_ok());
    }
}
