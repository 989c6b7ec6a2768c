//! The fleet allocation: unit vectors and property tests over random policies, fleets and
//! demands (a small deterministic PRNG, fixed seeds).
//!
//! What is checked, for every limited level of every random case:
//! - the replicas' seats sum to the level's fleet CurrentCL exactly (never above it);
//! - Σ fleet CurrentCL over the limited levels ≤ `nominalCLSum` + ⌊limited levels / 2⌋: upstream's
//!   `updateBorrowingLocked` gives the limited levels `nominalCLSum` (Σ NominalCL over all
//!   levels, exempt included; its ceil rounding may exceed `serverConcurrencyLimit` by up to one
//!   seat per level) or less, and rounds each level's share half away from zero; exempt levels
//!   take `max(MinCL, highWatermark)` on top, unlimited, as upstream;
//! - every replica gets at least the minimum `⌊C / 8N⌋`, which is ≥ 1 when `C ≥ N`;
//! - the result does not depend on the order of the replicas;
//! - demand-monotone: raising one replica's demand for a level never lowers its seats there
//!   while the level's fleet CurrentCL stays the same (the split itself is monotone for any fixed
//!   CurrentCL). When the raise changes the level's fleet CurrentCL, the replica's seats can drop
//!   by a little: upstream's borrowing can lower a level's CurrentCL when its high watermark
//!   rises (moving from the allocated regime to the shared one), the minimum grows in steps, and
//!   largest remainder can take a seat from a replica when the total grows (the Alabama
//!   paradox). The test counts those cases and checks that a fleet of one is never affected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, clippy::unnecessary_cast)]

use apf_wasm::fleet::allocation::{allocate, demand_weight, minimum_share, split_seats, static_share, Allocation, ReplicaDemand};
use apf_wasm::fleet::levels::FleetPolicy;
use apf_wasm::limits::borrowing::{update_borrowing, BorrowingLevel, SeatDemandStats};
use apf_wasm::policy::default_policy;
use apf_wasm::policy::model::{LimitResponse, PriorityLevel, PriorityLevelSpec, Queuing};

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// A float in `[0, hi)`.
trait Float {
    fn f(&mut self, hi: f64) -> f64;
}

impl Float for Rng {
    fn f(&mut self, hi: f64) -> f64 {
        self.unit() * hi
    }
}

fn limited(name: &str, shares: i32, lendable: i32, borrowing: Option<i32>, queue: bool) -> PriorityLevel {
    let limit_response =
        if queue { LimitResponse::Queue(Queuing { queues: 64, hand_size: 6, queue_length_limit: 50 }) } else { LimitResponse::Reject };
    PriorityLevel {
        name: name.into(),
        uid: String::new(),
        spec: PriorityLevelSpec::Limited {
            nominal_concurrency_shares: shares,
            lendable_percent: lendable,
            borrowing_limit_percent: borrowing,
            limit_response,
        },
    }
}

fn exempt(shares: i32, lendable: i32) -> PriorityLevel {
    PriorityLevel {
        name: "exempt".into(),
        uid: String::new(),
        spec: PriorityLevelSpec::Exempt { nominal_concurrency_shares: shares, lendable_percent: lendable },
    }
}

fn random_policy(rng: &mut Rng) -> FleetPolicy {
    if rng.chance(30) {
        return FleetPolicy::new(rng.range(1, 3000) as u32, &default_policy().priority_levels);
    }
    let mut levels = vec![exempt(rng.range(0, 20) as i32, rng.range(0, 100) as i32)];
    for i in 0..rng.range(1, 6) {
        let borrowing = if rng.chance(50) { None } else { Some(rng.range(0, 200) as i32) };
        levels.push(limited(&format!("l{i}"), rng.range(1, 100) as i32, rng.range(0, 100) as i32, borrowing, rng.chance(70)));
    }
    FleetPolicy::new(rng.range(1, 2000) as u32, &levels)
}

fn random_stats(rng: &mut Rng, scale: f64) -> SeatDemandStats {
    if rng.chance(30) {
        return SeatDemandStats::default();
    }
    let avg = rng.f(scale);
    let std_dev = if rng.chance(50) { 0.0 } else { rng.f(avg.max(1.0)) };
    SeatDemandStats {
        avg,
        std_dev,
        high_watermark: (avg + 2.0 * std_dev + rng.f(3.0)).round() as i64,
        smoothed: avg + std_dev + rng.f(scale / 4.0),
    }
}

struct Case {
    policy: FleetPolicy,
    ids: Vec<String>,
    demand: Vec<Vec<SeatDemandStats>>,
}

impl Case {
    fn random(rng: &mut Rng) -> Case {
        let policy = random_policy(rng);
        let n = rng.range(1, 7) as usize;
        let scale = f64::from(policy.server_concurrency_limit) / n as f64 * [0.1, 0.5, 1.0, 3.0][rng.below(4) as usize];
        let ids = (0..n).map(|i| format!("gw-{:02}-{}", rng.below(100), i)).collect();
        let demand = (0..n).map(|_| policy.levels.iter().map(|_| random_stats(rng, scale)).collect()).collect();
        Case { policy, ids, demand }
    }

    fn replicas(&self) -> Vec<ReplicaDemand<'_>> {
        self.ids.iter().zip(&self.demand).map(|(id, d)| ReplicaDemand { id, demand: d, wide: &[] }).collect()
    }

    fn allocate(&self) -> Allocation {
        allocate(&self.policy, &self.replicas())
    }
}

fn check_bounds(case: &Case, a: &Allocation) {
    let n = case.ids.len();
    assert_eq!(a.replicas.len(), n);
    assert!(a.replicas.windows(2).all(|w| w[0] < w[1]), "replicas sorted and unique");
    let mut limited_sum = 0u64;
    for (l, la) in case.policy.levels.iter().zip(&a.levels) {
        assert_eq!(la.exempt, l.exempt);
        assert_eq!(la.seats.len(), n);
        if l.exempt {
            let hw = la.demand.high_watermark.clamp(0, i64::from(u32::MAX)) as u32;
            assert_eq!(la.current, l.limits.min.max(hw), "exempt: max(MinCL, highWatermark)");
            assert!(la.seats.iter().all(|&s| s == 0));
            continue;
        }
        limited_sum += u64::from(la.current);
        let sum: u64 = la.seats.iter().map(|&s| u64::from(s)).sum();
        assert_eq!(sum, u64::from(la.current), "level {}: Σ seats == fleet CurrentCL", l.name);
        assert!(
            la.current <= l.limits.max.max(l.limits.initial_current),
            "level {}: CurrentCL {} above MaxCL {}",
            l.name,
            la.current,
            l.limits.max
        );
        let min = minimum_share(la.current, n);
        assert_eq!(la.minimum, min);
        if la.current as usize >= n {
            assert!(min >= 1);
        }
        assert!(la.seats.iter().all(|&s| s >= min), "level {}: minimum {min} kept: {:?}", l.name, la.seats);
        assert!(static_share(la.current, n) as u64 * n as u64 <= u64::from(la.current));
    }
    let limited_levels = case.policy.limited_levels() as u64;
    assert!(
        limited_sum <= u64::from(case.policy.nominal_sum()) + limited_levels / 2,
        "Σ limited CurrentCL {limited_sum} > nominalCLSum {} + {}",
        case.policy.nominal_sum(),
        limited_levels / 2
    );
    assert_eq!(a.limited_total(), limited_sum);
    assert!(u64::from(case.policy.nominal_sum()) <= u64::from(case.policy.server_concurrency_limit) + case.policy.levels.len() as u64);
}

#[test]
fn bounds_minimum_and_determinism() {
    let mut rng = Rng(0x5eed_0001);
    for _ in 0..3000 {
        let case = Case::random(&mut rng);
        let a = case.allocate();
        check_bounds(&case, &a);
        // Any order of the replicas, same allocation.
        let mut order: Vec<usize> = (0..case.ids.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let shuffled: Vec<ReplicaDemand<'_>> =
            order.iter().map(|&i| ReplicaDemand { id: &case.ids[i], demand: &case.demand[i], wide: &[] }).collect();
        assert_eq!(allocate(&case.policy, &shuffled), a);
        for (i, id) in case.ids.iter().enumerate() {
            let mine = a.seats_of(id).unwrap();
            let idx = a.replica_index(id).unwrap();
            assert_eq!(mine, a.levels.iter().map(|l| l.seats[idx]).collect::<Vec<_>>(), "replica {i}");
        }
    }
}

#[test]
fn demand_monotone() {
    let mut rng = Rng(0x5eed_0002);
    let (mut checked, mut current_changed, mut dropped_when_changed) = (0, 0, 0);
    for _ in 0..3000 {
        let mut case = Case::random(&mut rng);
        let before = case.allocate();
        let r = rng.below(case.ids.len() as u64) as usize;
        let l = rng.below(case.policy.levels.len() as u64) as usize;
        if case.policy.levels[l].exempt {
            continue;
        }
        let s = &mut case.demand[r][l];
        let extra = rng.f(20.0);
        match rng.below(4) {
            0 => s.avg += extra,
            1 => s.std_dev += extra,
            2 => {
                s.avg += extra;
                s.smoothed += extra;
                s.high_watermark += extra.ceil() as i64;
            }
            _ => {
                s.avg *= 1.0 + rng.f(2.0);
                s.smoothed = s.smoothed.max(s.avg + s.std_dev);
            }
        }
        let after = case.allocate();
        check_bounds(&case, &after);
        let id = &case.ids[r];
        let (old, new) = (before.seats_of(id).unwrap()[l], after.seats_of(id).unwrap()[l]);
        if before.levels[l].current == after.levels[l].current {
            checked += 1;
            assert!(new >= old, "level {l} replica {id}: {old} → {new} with CurrentCL {}", after.levels[l].current);
        } else {
            current_changed += 1;
            dropped_when_changed += usize::from(new < old);
            if case.ids.len() == 1 {
                assert!(new >= old, "a fleet of one gets the level's CurrentCL, monotone in its demand");
            }
        }
    }
    eprintln!(
        "monotone checks: {checked} with CurrentCL unchanged, {current_changed} changed ({dropped_when_changed} of them lowered the seats)"
    );
    assert!(checked > 1000, "{checked}");
}

#[test]
fn split_is_monotone_in_own_weight() {
    let mut rng = Rng(0x5eed_0003);
    for _ in 0..20_000 {
        let n = rng.range(1, 8) as usize;
        let current = rng.range(0, 700) as u32;
        let mut w: Vec<u64> = (0..n).map(|_| if rng.chance(25) { 0 } else { rng.range(0, 50_000) }).collect();
        let before = split_seats(current, &w);
        assert_eq!(before.iter().map(|&s| u64::from(s)).sum::<u64>(), u64::from(current));
        let r = rng.below(n as u64) as usize;
        w[r] += rng.range(1, 30_000);
        let after = split_seats(current, &w);
        assert!(after[r] >= before[r], "{current} seats, weights {w:?}: {before:?} → {after:?}");
    }
}

/// A fleet of one is one kube-apiserver: its fleet CurrentCL is upstream's, and it gets it all;
/// a fleet whose replicas' demands add up to that apiserver's demand gets the same CurrentCLs.
#[test]
fn fleet_equals_one_apiserver_with_the_summed_demand() {
    let mut rng = Rng(0x5eed_0004);
    for _ in 0..500 {
        let policy = random_policy(&mut rng);
        let single: Vec<SeatDemandStats> = policy
            .levels
            .iter()
            .map(|_| {
                let avg = rng.range(0, 60) as f64;
                SeatDemandStats {
                    avg,
                    std_dev: 0.0,
                    high_watermark: avg as i64 + rng.range(0, 5) as i64,
                    smoothed: avg + rng.range(0, 10) as f64,
                }
            })
            .collect();
        let mut upstream: Vec<BorrowingLevel> = policy
            .levels
            .iter()
            .zip(&single)
            .map(|(l, s)| BorrowingLevel {
                exempt: l.exempt,
                nominal: l.limits.nominal,
                min: l.limits.min,
                max: l.limits.max,
                stats: *s,
                current: l.limits.initial_current,
            })
            .collect();
        update_borrowing(&mut upstream, policy.nominal_sum());
        let one = allocate(&policy, &[ReplicaDemand { id: "only", demand: &single, wide: &[] }]);
        for ((u, a), l) in upstream.iter().zip(&one.levels).zip(&policy.levels) {
            assert_eq!(a.current, u.current);
            if !l.exempt {
                assert_eq!(a.seats, vec![u.current]);
            }
        }
        // Three replicas: integer parts of the demand spread over them (sums exact in f64).
        let parts: Vec<Vec<SeatDemandStats>> = (0..3)
            .map(|k| {
                single
                    .iter()
                    .map(|s| {
                        let third = |x: f64| ((x as i64 + 2 - k) / 3) as f64;
                        SeatDemandStats {
                            avg: third(s.avg),
                            std_dev: 0.0,
                            high_watermark: (s.high_watermark + 2 - k) / 3,
                            smoothed: third(s.smoothed),
                        }
                    })
                    .collect()
            })
            .collect();
        let ids = ["a", "b", "c"];
        let replicas: Vec<ReplicaDemand<'_>> = ids.iter().zip(&parts).map(|(id, d)| ReplicaDemand { id, demand: d, wide: &[] }).collect();
        let three = allocate(&policy, &replicas);
        for (u, a) in upstream.iter().zip(&three.levels) {
            assert_eq!(a.current, u.current);
        }
    }
}

/// `exempt_borrowing_test.go: TestUpdateBorrowing`'s levels with its demand spread over two
/// replicas: the fleet gets upstream's CurrentCLs, and each level's seats follow demand.
#[test]
fn upstream_exempt_borrowing_vector_over_two_replicas() {
    let levels = vec![
        limited("workload-high", 40, 50, None, true),
        exempt(0, 0),
        limited("workload-low", 100, 90, None, true),
        limited("catch-all", 5, 0, None, false),
    ];
    let policy = FleetPolicy::new(870, &levels);
    assert_eq!(policy.levels.iter().map(|l| l.limits.nominal).collect::<Vec<_>>(), vec![240, 0, 600, 30]);
    let stats = |x: f64| SeatDemandStats { avg: x, std_dev: 0.0, high_watermark: x as i64, smoothed: x };
    // Exempt demand 540 = 270 + 270; workload-low demand 1 on one replica only; the others 970.
    let a = vec![stats(485.0), stats(270.0), stats(1.0), stats(485.0)];
    let b = vec![stats(485.0), stats(270.0), stats(0.0), stats(485.0)];
    let alloc = allocate(&policy, &[ReplicaDemand { id: "b", demand: &b, wide: &[] }, ReplicaDemand { id: "a", demand: &a, wide: &[] }]);
    let current: Vec<u32> = alloc.levels.iter().map(|l| l.current).collect();
    assert_eq!(current, vec![240, 540, 60, 30], "upstream's step 3");
    assert_eq!(alloc.levels[0].seats, vec![120, 120]);
    assert_eq!(alloc.levels[2].minimum, 3);
    assert_eq!(alloc.levels[2].seats, vec![57, 3], "workload-low: all but the minimum to the replica with demand");
    assert_eq!(alloc.levels[3].seats, vec![15, 15]);
    assert_eq!(alloc.seats_of("a").unwrap(), vec![120, 0, 57, 15]);
    assert_eq!(alloc.static_shares(), vec![120, 270, 30, 15]);
}

#[test]
fn no_replicas_and_weights() {
    let policy = FleetPolicy::new(600, &default_policy().priority_levels);
    let a = allocate(&policy, &[]);
    assert!(a.replicas.is_empty() && a.levels.iter().all(|l| l.seats.is_empty()));
    assert_eq!(a.seats_of("x"), None);
    // Idle CurrentCL at 600 seats (kubernetes-apf.md §7.6): the fleet of nobody is idle.
    let idle: Vec<u32> = a.levels.iter().map(|l| l.current).collect();
    let by_name = |n: &str| idle[policy.index(n).unwrap()];
    assert_eq!((by_name("catch-all"), by_name("workload-low"), by_name("system")), (30, 56, 117));
    assert_eq!(demand_weight(&SeatDemandStats { avg: 1.5, std_dev: 0.25, high_watermark: 9, smoothed: 9.0 }), 1750);
    assert_eq!(demand_weight(&SeatDemandStats { avg: f64::NAN, std_dev: -1.0, high_watermark: 9, smoothed: 9.0 }), 0);
    assert_eq!(demand_weight(&SeatDemandStats { avg: f64::INFINITY, std_dev: 1e300, high_watermark: 0, smoothed: 0.0 }), 1_000_000_000_000);
    // Repeated ids are merged whatever the order.
    let d1 = vec![SeatDemandStats { avg: 5.0, ..Default::default() }; policy.levels.len()];
    let d2 = vec![SeatDemandStats { std_dev: 2.0, ..Default::default() }; policy.levels.len()];
    let x = allocate(&policy, &[ReplicaDemand { id: "r", demand: &d1, wide: &[] }, ReplicaDemand { id: "r", demand: &d2, wide: &[] }]);
    let y = allocate(&policy, &[ReplicaDemand { id: "r", demand: &d2, wide: &[] }, ReplicaDemand { id: "r", demand: &d1, wide: &[] }]);
    assert_eq!(x, y);
    assert_eq!(x.replicas, vec!["r".to_string()]);
}

/// Room for wide requests over random splits: Σ unchanged, the minimum and every width already
/// satisfied kept, and the oldest need served whenever the others' surplus covers it.
#[test]
fn room_for_wide_requests() {
    use apf_wasm::fleet::allocation::make_room_for_wide;
    use apf_wasm::fleet::WideNeed;
    let mut rng = Rng(0x5eed_0003);
    let mut served_first = 0;
    for _ in 0..20_000 {
        let n = rng.range(1, 6) as usize;
        let current = rng.range(0, 40) as u32;
        let weights: Vec<u64> = (0..n).map(|_| rng.below(5_000)).collect();
        let before = split_seats(current, &weights);
        let minimum = minimum_share(current, n);
        let wide: Vec<WideNeed> = (0..n)
            .map(|_| {
                if rng.chance(40) {
                    WideNeed { seats: rng.range(1, 12) as u32, since: rng.range(1, 5) as i64 }
                } else {
                    WideNeed::default()
                }
            })
            .collect();
        let mut seats = before.clone();
        make_room_for_wide(current, minimum, &mut seats, &wide);
        assert_eq!(seats.iter().sum::<u32>(), current, "{before:?} {wide:?} → {seats:?}");
        for i in 0..n {
            assert!(seats[i] >= minimum.min(before[i]), "minimum: {before:?} {wide:?} → {seats:?}");
            let need = wide[i].seats.min(current);
            if need > 0 && before[i] >= need {
                assert!(seats[i] >= need, "a satisfied width kept: {before:?} {wide:?} → {seats:?}");
            }
        }
        // The oldest need (ties: first id) is served when the others can give enough.
        let first = (0..n).filter(|&i| wide[i].seats.min(current) > before[i]).min_by_key(|&i| (wide[i].since, i));
        if let Some(i) = first {
            let need = wide[i].seats.min(current);
            let floor = |j: usize| {
                let own = wide[j].seats.min(current);
                if own > 0 && own <= before[j] {
                    own.max(minimum)
                } else {
                    minimum
                }
            };
            let room: u32 = (0..n).filter(|&j| j != i).map(|j| before[j].saturating_sub(floor(j))).sum();
            if room >= need - before[i] {
                assert_eq!(seats[i], need, "oldest need: {before:?} {wide:?} → {seats:?}");
                served_first += 1;
            }
        }
    }
    assert!(served_first > 1_000, "{served_first}");
}

/// `FleetPolicy::level_max` bounds every limited level's fleet CurrentCL for any demand — a
/// record claiming more is impossible and ignored — and is tight: all demand on one level (and
/// none exempt) reaches it whenever upstream's borrowing is in its allocation regime.
#[test]
fn level_max_bounds_every_current_cl_and_is_reached() {
    let mut rng = Rng(0x5eed_0007);
    let (mut cases, mut reached, mut allocated) = (0, 0, 0);
    for _ in 0..3000 {
        let case = Case::random(&mut rng);
        let a = case.allocate();
        let mut total = 0u64;
        for (i, l) in a.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            let max = case.policy.level_max(i).unwrap();
            assert!(l.current <= max, "level {i}: CurrentCL {} > level_max {max}: {:?}", l.current, case.policy);
            total += u64::from(l.current);
            cases += 1;
        }
        assert!(total <= case.policy.max_total());
        // All demand on one limited level, the others idle.
        let Some(i) = case.policy.levels.iter().position(|l| !l.exempt) else { continue };
        let hot = SeatDemandStats { avg: 1e6, std_dev: 0.0, high_watermark: 1_000_000, smoothed: 1e6 };
        let demand: Vec<SeatDemandStats> =
            (0..case.policy.levels.len()).map(|j| if j == i { hot } else { SeatDemandStats::default() }).collect();
        let a = allocate(&case.policy, &[ReplicaDemand { id: "gw", demand: &demand, wide: &[] }]);
        if a.regime == apf_wasm::limits::borrowing::BorrowingRegime::Allocated {
            allocated += 1;
            reached += usize::from(a.levels[i].current == case.policy.level_max(i).unwrap());
        }
    }
    eprintln!("{cases} levels bounded; all demand on one level reached the bound in {reached} of {allocated} allocated cases");
    assert!(cases > 3000 && allocated > 500);
    assert_eq!(reached, allocated);
}
