#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Static limits and max seats (`apf_controller.go: finishQueueSetReconfigsLocked`) for the default
//! configuration at several ServerCL values (derived by hand from that function) and for the levels
//! of `exempt_borrowing_test.go: TestUpdateBorrowing` and `borrowing_test.go: TestBorrowing`.
use apf_wasm::limits::static_limits::compute_limits;
use apf_wasm::policy::default_policy;
use apf_wasm::policy::model::{LimitResponse, PriorityLevel, PriorityLevelSpec, Queuing};

/// name → (nominal, min, maxSeats) at the given ServerCL, and nominalCLSum.
fn check(server: u32, sum: u32, rows: &[(&str, u32, u32, Option<u32>)]) {
    let p = default_policy();
    let (lim, s) = compute_limits(server, &p.priority_levels);
    assert_eq!(s, sum, "nominalCLSum at {server}");
    for (name, nominal, min, seats) in rows {
        let i = p.level_index(name).unwrap();
        assert_eq!(lim[i].nominal, *nominal, "{name} nominal at {server}");
        assert_eq!(lim[i].min, *min, "{name} min at {server}");
        assert_eq!(lim[i].max_seats, *seats, "{name} max seats at {server}");
        assert_eq!(lim[i].max, lim[i].nominal + server, "{name} max at {server}");
    }
}

#[test]
fn defaults_at_600_full_row() {
    let p = default_policy();
    let (lim, sum) = compute_limits(600, &p.priority_levels);
    assert_eq!(sum, 602);
    // name, nominal, lendable, min, max, initial, maxSeats
    let want = [
        ("exempt", 0, 0, 0, 600, 0, None),
        ("catch-all", 13, 0, 13, 613, 13, None),
        ("system", 74, 24, 50, 674, 62, Some(12)),
        ("node-high", 98, 25, 73, 698, 86, Some(15)),
        ("leader-election", 25, 0, 25, 625, 25, Some(4)),
        ("workload-high", 98, 49, 49, 698, 74, Some(15)),
        ("workload-low", 245, 221, 24, 845, 135, Some(37)),
        ("global-default", 49, 25, 24, 649, 37, Some(8)),
    ];
    for (name, nominal, lendable, min, max, initial, seats) in want {
        let l = lim[p.level_index(name).unwrap()];
        assert_eq!(
            (l.nominal, l.lendable, l.min, l.max, l.initial_current, l.max_seats, l.borrowing),
            (nominal, lendable, min, max, initial, seats, 600),
            "{name}"
        );
    }
}

#[test]
fn defaults_at_24() {
    check(
        24,
        25,
        &[
            ("catch-all", 1, 1, None),
            ("system", 3, 2, Some(1)),
            ("node-high", 4, 3, Some(1)),
            ("leader-election", 1, 1, Some(1)),
            ("workload-high", 4, 2, Some(1)),
            ("workload-low", 10, 1, Some(1)),
            ("global-default", 2, 1, Some(1)),
        ],
    );
}

#[test]
fn defaults_at_100() {
    check(
        100,
        105,
        &[
            ("catch-all", 3, 3, None),
            ("system", 13, 9, Some(2)),
            ("node-high", 17, 13, Some(2)),
            ("leader-election", 5, 5, Some(1)),
            ("workload-high", 17, 8, Some(2)),
            ("workload-low", 41, 4, Some(6)),
            ("global-default", 9, 4, Some(1)),
        ],
    );
}

#[test]
fn defaults_at_1000() {
    check(
        1000,
        1004,
        &[
            ("catch-all", 21, 21, None),
            ("system", 123, 82, Some(19)),
            ("node-high", 164, 123, Some(25)),
            ("leader-election", 41, 41, Some(7)),
            ("workload-high", 164, 82, Some(25)),
            ("workload-low", 409, 41, Some(62)),
            ("global-default", 82, 41, Some(13)),
        ],
    );
}

#[test]
fn defaults_at_3000() {
    check(
        3000,
        3003,
        &[
            ("catch-all", 62, 62, None),
            ("system", 368, 247, Some(56)),
            ("node-high", 490, 367, Some(74)),
            ("leader-election", 123, 123, Some(19)),
            ("workload-high", 490, 245, Some(74)),
            ("workload-low", 1225, 122, Some(184)),
            ("global-default", 245, 122, Some(37)),
        ],
    );
}

fn limited(name: &str, ncs: i32, lendable: i32, borrowing: Option<i32>, lr: LimitResponse) -> PriorityLevel {
    PriorityLevel {
        name: name.into(),
        uid: String::new(),
        spec: PriorityLevelSpec::Limited {
            nominal_concurrency_shares: ncs,
            lendable_percent: lendable,
            borrowing_limit_percent: borrowing,
            limit_response: lr,
        },
    }
}

#[test]
fn exempt_borrowing_test_nominals() {
    // exempt_borrowing_test.go: ServerCL 870 → NominalCL 240 / 0 / 600 / 30, MinCL 120 / 0 / 60 / 30.
    let q = LimitResponse::Queue(Queuing { queues: 128, hand_size: 6, queue_length_limit: 50 });
    let levels = vec![
        limited("workload-high", 40, 50, None, q.clone()),
        PriorityLevel {
            name: "exempt".into(),
            uid: String::new(),
            spec: PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 },
        },
        limited("workload-low", 100, 90, None, q),
        limited("catch-all", 5, 0, None, LimitResponse::Reject),
    ];
    let (lim, sum) = compute_limits(870, &levels);
    assert_eq!(sum, 870);
    assert_eq!(lim.iter().map(|l| l.nominal).collect::<Vec<_>>(), [240, 0, 600, 30]);
    assert_eq!(lim.iter().map(|l| l.min).collect::<Vec<_>>(), [120, 0, 60, 30]);
}

#[test]
fn borrowing_test_levels() {
    // borrowing_test.go: two NCS-100 levels + exempt (0) + catch-all (5) at ServerCL 24 → 12 each.
    let q = LimitResponse::Queue(Queuing { queues: 10, hand_size: 2, queue_length_limit: 10 });
    let mut levels =
        default_policy().priority_levels.into_iter().filter(|l| l.name == "exempt" || l.name == "catch-all").collect::<Vec<_>>();
    levels.push(limited("flow-0", 100, 50, Some(67), q.clone()));
    levels.push(limited("flow-1", 100, 33, Some(50), q));
    let (lim, _) = compute_limits(24, &levels);
    assert_eq!(lim[2].nominal, 12);
    assert_eq!(lim[3].nominal, 12);
    // round(12 × 0.50) = 6, round(12 × 0.67) = round(8.04) = 8; round(12 × 0.33) = round(3.96) = 4, borrowing 6.
    assert_eq!((lim[2].lendable, lim[2].borrowing, lim[2].min, lim[2].max), (6, 8, 6, 20));
    assert_eq!((lim[3].lendable, lim[3].borrowing, lim[3].min, lim[3].max), (4, 6, 8, 18));
}

#[test]
fn round_half_away_from_zero() {
    // NominalCL 5 with lendable 50% → 2.5 → 3 (Go math.Round), not banker's 2.
    let levels = vec![limited("a", 1, 50, Some(10), LimitResponse::Reject)];
    let (lim, _) = compute_limits(5, &levels);
    assert_eq!(lim[0].nominal, 5);
    assert_eq!(lim[0].lendable, 3);
    assert_eq!(lim[0].borrowing, 1); // round(0.5) = 1
}

#[test]
fn huge_values_saturate() {
    let q = LimitResponse::Queue(Queuing { queues: 1, hand_size: 1, queue_length_limit: 1 });
    let levels = vec![limited("a", i32::MAX, 100, Some(i32::MAX), q), limited("b", i32::MAX, 0, None, LimitResponse::Reject)];
    let (lim, sum) = compute_limits(u32::MAX, &levels);
    assert!(sum >= lim[0].nominal);
    assert_eq!(lim[0].max, u32::MAX);
}
