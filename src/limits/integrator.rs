//! Seat-demand integrator (upstream `fairqueuing/integrator.go`, read by `apf_controller.go:
//! seatDemandStats.update`).
//!
//! A piecewise-constant variable `x(t)` is integrated over time: we keep `∫dt`, `∫x dt`,
//! `∫x² dt` plus the min and max of `x` seen since the last reset. The clock is passed in on
//! every call (`crate::Nanos`), never read here.
//!
//! Upstream semantics reproduced exactly:
//! - a fresh integrator has `x = 0`, `min = max = 0`;
//! - `set`/`add` first integrate the old `x` up to `now`, then update `x`, `min`, `max`;
//! - `average = ∫x dt / T`, `deviation = sqrt(∫x² dt / T − average²)`; both NaN when `T ≤ 0`,
//!   deviation NaN when the variance is negative;
//! - `reset` returns the results and restarts the integrals with `min = max = x`.
//!
//! `dt` is computed like Go's `Duration.Seconds()` (`secs + nanos/1e9`). Time going backwards
//! yields a negative `dt`, exactly as upstream would compute it.

use crate::codec::{CodecResult, Reader, Writer};
use crate::Nanos;

/// Statistical abstract of an integration period (upstream `IntegratorResults`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntegratorResults {
    /// Seconds integrated.
    pub duration_secs: f64,
    /// Time-weighted average (NaN if `duration_secs <= 0`).
    pub average: f64,
    /// Population standard deviation (NaN if `duration_secs <= 0` or variance < 0).
    pub deviation: f64,
    pub min: f64,
    pub max: f64,
}

impl IntegratorResults {
    /// Semantic equality treating all NaNs as equal (upstream `Equal`).
    pub fn equal(&self, other: &IntegratorResults) -> bool {
        fn eq_nan(a: f64, b: f64) -> bool {
            a == b || (a.is_nan() && b.is_nan())
        }
        self.duration_secs == other.duration_secs
            && self.min == other.min
            && self.max == other.max
            && eq_nan(self.average, other.average)
            && eq_nan(self.deviation, other.deviation)
    }
}

/// Go's `time.Duration.Seconds()` for a nanosecond difference.
pub fn go_duration_seconds(d: Nanos) -> f64 {
    let sec = d / crate::NANOS_PER_SEC;
    let nsec = d % crate::NANOS_PER_SEC;
    sec as f64 + nsec as f64 / 1e9
}

/// Piecewise-constant integrator over `Nanos` time (with upstream's `Moments` inline).
#[derive(Debug, Clone, PartialEq)]
pub struct Integrator {
    last_time: Nanos,
    x: f64,
    elapsed_secs: f64,
    integral_x: f64,
    integral_xx: f64,
    min: f64,
    max: f64,
}

impl Integrator {
    pub fn new(now: Nanos) -> Self {
        let (elapsed_secs, integral_x, integral_xx) = (0.0, 0.0, 0.0);
        Integrator { last_time: now, x: 0.0, elapsed_secs, integral_x, integral_xx, min: 0.0, max: 0.0 }
    }

    /// Current value of x.
    pub fn current(&self) -> f64 {
        self.x
    }

    /// Adds the moments of the old x held constant up to `now` (`ConstantMoments`, `Add`).
    fn update(&mut self, now: Nanos) {
        let dt = go_duration_seconds(now.saturating_sub(self.last_time));
        self.last_time = now;
        self.elapsed_secs += dt;
        self.integral_x += self.x * dt;
        self.integral_xx += self.x * self.x * dt;
    }

    /// Set x to a new value at time `now` (upstream `Observe`/`Set`).
    pub fn set(&mut self, now: Nanos, x: f64) {
        self.update(now);
        self.x = x;
        if x < self.min {
            self.min = x;
        }
        if x > self.max {
            self.max = x;
        }
    }

    /// Add `dx` to x at time `now`.
    pub fn add(&mut self, now: Nanos, dx: f64) {
        self.set(now, self.x + dx);
    }

    /// Integrate up to `now` and return the results (average and standard deviation with
    /// upstream's NaN rules).
    pub fn get_results(&mut self, now: Nanos) -> IntegratorResults {
        self.update(now);
        let (duration_secs, min, max) = (self.elapsed_secs, self.min, self.max);
        if duration_secs <= 0.0 || duration_secs.is_nan() {
            return IntegratorResults { duration_secs, average: f64::NAN, deviation: f64::NAN, min, max };
        }
        let average = self.integral_x / duration_secs;
        let variance = self.integral_xx / duration_secs - average * average;
        let deviation = if variance >= 0.0 { variance.sqrt() } else { f64::NAN };
        IntegratorResults { duration_secs, average, deviation, min, max }
    }

    /// Results up to `now`, then restart integration at `now` with `min = max = x`.
    pub fn reset(&mut self, now: Nanos) -> IntegratorResults {
        let r = self.get_results(now);
        *self = Integrator { min: self.x, max: self.x, x: self.x, ..Integrator::new(now) };
        r
    }

    pub fn encode(&self, w: &mut Writer) {
        w.i64(self.last_time);
        for v in [self.x, self.elapsed_secs, self.integral_x, self.integral_xx, self.min, self.max] {
            w.f64(v);
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> CodecResult<Self> {
        let (last_time, x) = (r.i64()?, r.f64()?);
        let (elapsed_secs, integral_x, integral_xx) = (r.f64()?, r.f64()?, r.f64()?);
        Ok(Integrator { last_time, x, elapsed_secs, integral_x, integral_xx, min: r.f64()?, max: r.f64()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC;

    /// `integrator_test.go` `TestIntegrator`.
    #[test]
    fn upstream_vector() {
        let mut now: Nanos = 1_700_000_000 * NANOS_PER_SEC;
        let mut igr = Integrator::new(now);
        igr.add(now, 3.0);
        now += NANOS_PER_SEC;
        let results = igr.get_results(now);
        let r_too = igr.reset(now);
        let e = IntegratorResults { duration_secs: 1.0, average: 3.0, deviation: 0.0, min: 0.0, max: 3.0 };
        assert!(e.equal(&results), "{results:?}");
        assert!(results.equal(&r_too), "{r_too:?}");
        igr.set(now, 2.0);
        let results = igr.get_results(now);
        let e = IntegratorResults { duration_secs: 0.0, average: f64::NAN, deviation: f64::NAN, min: 2.0, max: 3.0 };
        assert!(e.equal(&results), "{results:?}");
        now += 1_000_000;
        igr.add(now, -1.0);
        now += 1_000_000;
        let results = igr.get_results(now);
        let e = IntegratorResults { duration_secs: 0.002, average: 1.5, deviation: 0.5, min: 1.0, max: 3.0 };
        assert!(e.equal(&results), "{results:?}");
    }

    #[test]
    fn fresh_integrator() {
        let mut igr = Integrator::new(5);
        let r = igr.get_results(5);
        assert_eq!(r.min, 0.0);
        assert_eq!(r.max, 0.0);
        assert!(r.average.is_nan() && r.deviation.is_nan());
        let r = igr.reset(5 + NANOS_PER_SEC);
        assert_eq!((r.duration_secs, r.average, r.deviation), (1.0, 0.0, 0.0));
    }

    #[test]
    fn go_seconds() {
        assert_eq!(go_duration_seconds(1_500_000_000), 1.5);
        assert_eq!(go_duration_seconds(-1_500_000_000), -1.5);
        assert_eq!(go_duration_seconds(1_000_000), 0.001);
    }

    #[test]
    fn codec_roundtrip_and_garbage() {
        let mut igr = Integrator::new(7);
        igr.set(100, 4.0);
        igr.add(200, -1.5);
        let mut w = Writer::new();
        igr.encode(&mut w);
        let b = w.into_bytes();
        let d = Integrator::decode(&mut Reader::new(&b)).unwrap();
        assert_eq!(d, igr);
        for n in 0..b.len() {
            assert!(Integrator::decode(&mut Reader::new(&b[..n])).is_err());
        }
        let _ = Integrator::decode(&mut Reader::new(&[0xff; 80]));
    }
}
