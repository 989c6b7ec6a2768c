//! Upstream `conc_alloc_test.go` `TestConcAlloc`: 10,000 random allocation problems checked for
//! sum, bounds and proportionality (fpSlack 1e-10). The generator follows upstream's shapes
//! ("bound from below", "bound from above", "not-set-by-bounds", zero-target extras); the PRNG
//! is the tests' SplitMix64 (`tests/common/rng.rs`, not Go's math/rand), seeded with upstream's
//! seed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::limits::conc_alloc::{compute_concurrency_allocation, AllocProblemItem, MIN_TARGET};

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

const FP_SLACK: f64 = 1e-10;

fn f64_rel_diff(a: f64, b: f64) -> f64 {
    let den = a.abs().max(b.abs());
    if den == 0.0 {
        0.0
    } else {
        (a - b).abs() / den
    }
}

/// Calls `consume` n times with indices [0,n) and floats summing to x.
fn partition64(r: &mut Rng, n: usize, x: f64, mut consume: impl FnMut(&mut Rng, usize, f64)) {
    if n == 0 {
        return;
    }
    let mut divs: Vec<f64> = (0..n - 1).map(|_| r.unit()).collect();
    divs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut last = 0.0;
    for (idx, div) in divs.iter().enumerate() {
        consume(r, idx, (div - last) * x);
        last = *div;
    }
    consume(r, n - 1, (1.0 - last) * x);
}

#[derive(Default)]
struct Tally {
    errors_expected: usize,
    solved: usize,
    styles: [usize; 4],
}

fn test1(r: &mut Rng, tally: &mut Tally) {
    let mut prob_len = [0usize, 1, 2, 3, 4, 6, 9][r.below(7) as usize];
    let zero = AllocProblemItem { lower_bound: 0.0, upper_bound: 0.0, target: 0.0 };
    let mut classes = vec![zero; prob_len];
    let mut low_sum = 0.0f64;
    let mut high_sum = 0.0f64;
    let mut required_sum: i64 = 0;
    let mut required_f = 0.0f64;
    let mut style = 3;
    if prob_len > 0 {
        match r.below(20) {
            0 => {
                style = 0;
                required_sum = r.below(prob_len as u64 * 3) as i64;
                required_f = required_sum as f64;
                partition64(r, prob_len, required_f, |r, j, x| {
                    classes[j].lower_bound = x;
                    classes[j].target = x + 2.0 * r.unit();
                    classes[j].upper_bound = x + 3.0 * r.unit();
                    low_sum += classes[j].lower_bound;
                    high_sum += classes[j].upper_bound;
                });
            }
            1 => {
                style = 1;
                required_sum = r.below(prob_len as u64 * 3) as i64 + 1;
                required_f = required_sum as f64;
                partition64(r, prob_len, required_f, |r, j, x| {
                    classes[j].upper_bound = x;
                    classes[j].lower_bound = x * (1.25 * r.unit() - 1.0).max(0.0);
                    classes[j].target = classes[j].lower_bound + r.unit();
                    low_sum += classes[j].lower_bound;
                    high_sum += classes[j].upper_bound;
                });
            }
            _ => {
                style = 2;
                for c in classes.iter_mut() {
                    let x = (r.unit() * 5.0 - 1.0).max(0.0);
                    c.lower_bound = x;
                    c.target = x + 2.0 * r.unit();
                    c.upper_bound = x + 3.0 * r.unit();
                    low_sum += c.lower_bound;
                    high_sum += c.upper_bound;
                }
                required_f = (low_sum + (high_sum - low_sum) * r.unit()).round();
                required_sum = required_f as i64;
            }
        }
    }
    tally.styles[style] += 1;
    while r.unit() < 0.25 {
        let ub = r.unit() + 0.00001;
        classes.push(AllocProblemItem { lower_bound: 0.0, upper_bound: ub, target: 0.0 });
        high_sum += ub;
        if prob_len > 1 {
            let m = r.below(prob_len as u64) as usize;
            classes.swap(m, prob_len);
        }
        prob_len = classes.len();
    }
    let res = compute_concurrency_allocation(required_sum, &classes);
    let expect_err = low_sum - required_f > FP_SLACK || required_f - high_sum > FP_SLACK;
    let (allocs, fair_prop) = match res {
        Err(e) => {
            assert!(expect_err, "requiredSum={required_sum} classes={classes:?}: unexpected error {e}");
            tally.errors_expected += 1;
            return;
        }
        Ok(v) => v,
    };
    assert!(!expect_err, "requiredSum={required_sum} classes={classes:?}: expected error, got {allocs:?}");
    tally.solved += 1;
    let actual: f64 = allocs.iter().sum();
    assert!(f64_rel_diff(required_f, actual) <= FP_SLACK, "requiredSum={required_sum} classes={classes:?}: allocs {allocs:?} sum {actual}");
    for (idx, item) in classes.iter().enumerate() {
        let target = item.target.max(MIN_TARGET);
        let alloc = fair_prop * target;
        if alloc <= item.lower_bound {
            assert_eq!(allocs[idx], item.lower_bound, "item {idx} should be lower bound; {classes:?}");
        } else if alloc >= item.upper_bound {
            assert_eq!(allocs[idx], item.upper_bound, "item {idx} should be upper bound; {classes:?}");
        } else {
            assert!(f64_rel_diff(alloc, allocs[idx]) <= FP_SLACK, "item {idx}: {} not proportional ({alloc}); {classes:?}", allocs[idx]);
        }
    }
}

#[test]
fn conc_alloc_random_property() {
    let mut r = Rng(1234567890);
    let mut tally = Tally::default();
    for _ in 0..10_000 {
        test1(&mut r, &mut tally);
    }
    // All shapes were exercised and most problems were solvable.
    assert!(tally.styles.iter().all(|&n| n > 0), "{:?}", tally.styles);
    assert!(tally.solved > 9_000, "solved {} errors {}", tally.solved, tally.errors_expected);
}
