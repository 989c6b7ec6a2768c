//! Borrowing vectors: upstream `exempt_borrowing_test.go: TestUpdateBorrowing` (exempt borrowing,
//! driven through integrators with a fake clock advanced 10 s before each adjustment), the
//! default configuration's "idle CurrentCL" at ServerCL 600, and the steady state of upstream
//! `TestBorrowing` (both cases end with PL0 at 12 + 4 = 16).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::limits::borrowing::{
    update_borrowing, BorrowingLevel, BorrowingOutcome, BorrowingRegime, SeatDemandStats, BORROWING_ADJUSTMENT_PERIOD,
};
use apf_wasm::limits::integrator::Integrator;
use apf_wasm::Nanos;

struct Harness {
    now: Nanos,
    levels: Vec<BorrowingLevel>,
    integrators: Vec<Integrator>,
    nominal_sum: u32,
}

impl Harness {
    /// `(exempt, nominal, min, max)` per level; CurrentCL starts at Nominal − Lendable div 2.
    fn new(specs: &[(bool, u32, u32, u32)], nominal_sum: u32) -> Self {
        let now = 1_000 * BORROWING_ADJUSTMENT_PERIOD;
        let levels = specs
            .iter()
            .map(|&(exempt, nominal, min, max)| BorrowingLevel {
                exempt,
                nominal,
                min,
                max,
                stats: SeatDemandStats::default(),
                current: nominal - (nominal - min) / 2,
            })
            .collect::<Vec<_>>();
        let integrators = specs.iter().map(|_| Integrator::new(now)).collect();
        Harness { now, levels, integrators, nominal_sum }
    }

    fn set_demand(&mut self, idx: usize, x: f64) {
        self.integrators[idx].set(self.now, x);
    }

    fn adjust(&mut self) -> BorrowingOutcome {
        for (l, igr) in self.levels.iter_mut().zip(self.integrators.iter_mut()) {
            l.stats.update(&igr.reset(self.now));
        }
        update_borrowing(&mut self.levels, self.nominal_sum)
    }

    fn step_and_adjust(&mut self) -> BorrowingOutcome {
        self.now += BORROWING_ADJUSTMENT_PERIOD;
        self.adjust()
    }

    fn currents(&self) -> Vec<u32> {
        self.levels.iter().map(|l| l.current).collect()
    }
}

/// `exempt_borrowing_test.go` `TestUpdateBorrowing`. Order: workload-high, exempt,
/// workload-low, catch-all.
#[test]
fn update_borrowing_exempt_sequence() {
    let mut h = Harness::new(&[(false, 240, 120, 1110), (true, 0, 0, 870), (false, 600, 60, 1470), (false, 30, 30, 900)], 870);
    assert_eq!(240 + 600 + 30, h.nominal_sum);
    // Initial digest-time adjustment.
    h.adjust();
    // 1. Every demand 970 = ServerCL + 100.
    for i in 0..4 {
        h.set_demand(i, 970.0);
    }
    let out = h.step_and_adjust();
    assert_eq!(out.regime, BorrowingRegime::AllMin);
    assert_eq!(h.currents(), vec![120, 970, 60, 30]);
    // 2. Exempt demand 870 − (180+330+30) = 330; first adjustment still sees watermark 970.
    h.set_demand(1, 330.0);
    h.step_and_adjust();
    let out = h.step_and_adjust();
    assert_eq!(out.regime, BorrowingRegime::Shared { share_frac: 0.5 });
    assert_eq!(h.currents(), vec![180, 330, 330, 30]);
    // 3. Exempt demand 870 − (240+60+30) = 540, workload-low demand 1.
    h.set_demand(1, 540.0);
    h.set_demand(2, 1.0);
    h.step_and_adjust();
    let out = h.step_and_adjust();
    assert_eq!(out.regime, BorrowingRegime::Shared { share_frac: 1.0 });
    assert_eq!(h.currents(), vec![240, 540, 60, 30]);
    assert_eq!(out.fair_frac, 0.0);
}

/// Default configuration at ServerCL 600 (nominalCLSum 602), zero demand; expected values derived
/// by hand from `apf_controller.go: updateBorrowingLocked`.
#[test]
fn default_config_idle_current_cl_600() {
    // exempt, catch-all, system, node-high, leader-election, workload-high, workload-low, global-default
    let specs = [
        (true, 0, 0, 600),
        (false, 13, 13, 613),
        (false, 74, 50, 674),
        (false, 98, 73, 698),
        (false, 25, 25, 625),
        (false, 98, 49, 698),
        (false, 245, 24, 845),
        (false, 49, 24, 649),
    ];
    let mut h = Harness::new(&specs, 602);
    let initial: Vec<u32> = h.currents();
    assert_eq!(initial, vec![0, 13, 62, 86, 25, 74, 135, 37]);
    let out = h.adjust();
    assert_eq!(out.regime, BorrowingRegime::Allocated);
    assert!((out.fair_frac - 602.0 / 258.0).abs() < 1e-12, "{}", out.fair_frac);
    assert_eq!(h.currents(), vec![0, 30, 117, 170, 58, 114, 56, 56]);
    // Still idle after a full period: unchanged.
    let _ = h.step_and_adjust();
    assert_eq!(h.currents(), vec![0, 30, 117, 170, 58, 114, 56, 56]);
}

/// Upstream `borrowing_test.go` `TestBorrowing`, steady state: ServerCL 24, PL0/PL1 NCS 100
/// (NominalCL 12), catch-all NominalCL 1, exempt 0; flow 0 keeps 24 seats demanded, flow 1 six.
#[test]
fn borrowing_test_steady_state() {
    // (name, exempt, nominal, min, max)
    // lendable-limited: PL0 lendable 50 / borrowing 67 → min 6, max 12+8; PL1 33 / 50 → min 8, max 18.
    // borrowing-limited: PL0 50 / 33 → min 6, max 16; PL1 67 / 50 → min 4, max 18.
    for (case, pl0, pl1) in [("lendable-limited", (6, 20), (8, 18)), ("borrowing-limited", (6, 16), (4, 18))] {
        let specs = [(true, 0, 0, 24), (false, 1, 1, 25), (false, 12, pl0.0, pl0.1), (false, 12, pl1.0, pl1.1)];
        let mut h = Harness::new(&specs, 25);
        h.adjust();
        h.set_demand(2, 24.0);
        h.set_demand(3, 6.0);
        for _ in 0..5 {
            h.step_and_adjust();
        }
        let c = h.currents();
        // Derived with `conc_alloc.go: computeConcurrencyAllocation`: PL0 = 16 (fairProp 2/3 ×
        // target 24, resp. its MaxCL 16), PL1 = 8.
        assert_eq!(c, vec![0, 1, 16, 8], "{case}");
    }
}
