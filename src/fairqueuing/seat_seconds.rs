//! Seat-seconds: the unit of work of fair queuing, a `u64` fixed-point number with 10⁻⁸
//! seat-second resolution, exactly as upstream's `pkg/util/flowcontrol/request/seat_seconds.go`
//! (`SeatsTimesDuration`, `DurationPerSeat`, `String`).
//!
//! Arithmetic on readings of the progress meter R is modular (`wrapping_*`), as in Go, so
//! "subtracting a negative increment" (a negative duration wrapped to a huge value) works as an
//! addition.

use crate::Nanos;
use std::fmt;

/// Fixed-point units per seat-second (upstream `ssScale`).
pub const SS_SCALE: u64 = 100_000_000;

/// `n` units = `n / 1e8` seat-seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SeatSeconds(pub u64);

impl SeatSeconds {
    pub fn wrapping_add(self, o: SeatSeconds) -> SeatSeconds {
        SeatSeconds(self.0.wrapping_add(o.0))
    }
    pub fn wrapping_sub(self, o: SeatSeconds) -> SeatSeconds {
        SeatSeconds(self.0.wrapping_sub(o.0))
    }
}

/// Go's `uint64(f)` for a float64 that is already integral, as compiled on amd64: values below
/// 2⁶³ go through int64 (so negative values wrap modulo 2⁶⁴), larger ones are offset by 2⁶³.
fn go_f64_to_u64(x: f64) -> u64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    // NaN goes through int64 too, to 0.
    if x.is_nan() || x < TWO63 {
        (x as i64) as u64
    } else {
        ((x - TWO63) as i64 as u64).wrapping_add(1u64 << 63)
    }
}

/// Upstream `SeatsTimesDuration(seats, d) = SeatSeconds(round(seats × d_ns / 10))`.
pub fn seats_times_duration(seats: f64, d: Nanos) -> SeatSeconds {
    // Integral seats and a non-negative duration whose product is below 2^50 (every request's
    // work in practice): the same result in integer arithmetic (the float product is exact
    // there and the quotient's rounding cannot cross a half).
    if d >= 0 && (0.0..=4_294_967_295.0).contains(&seats) && seats.fract() == 0.0 {
        if let Some(x) = (seats as u64).checked_mul(d as u64).filter(|&x| x < 1 << 50) {
            return SeatSeconds((x + 5) / 10);
        }
    }
    seats_times_duration_float(seats, d)
}

fn seats_times_duration_float(seats: f64, d: Nanos) -> SeatSeconds {
    SeatSeconds(go_f64_to_u64((seats * d as f64 / 10.0).round()))
}

/// Upstream `DurationPerSeat`: `Duration(ss / seats × 10)` (float, truncated).
pub fn duration_per_seat(ss: SeatSeconds, seats: f64) -> Nanos {
    // float → int64 truncates (saturating in Rust, implementation-defined in Go).
    (ss.0 as f64 / seats * 10.0) as Nanos
}

impl fmt::Display for SeatSeconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:08}ss", self.0 / SS_SCALE, self.0 % SS_SCALE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NANOS_PER_SEC;

    const MS: Nanos = 1_000_000;

    #[test]
    fn string_vectors() {
        assert_eq!(SeatSeconds(1).to_string(), "0.00000001ss");
        assert_eq!(SeatSeconds(SS_SCALE - 1).to_string(), "0.99999999ss");
        assert_eq!(SeatSeconds(0).to_string(), "0.00000000ss");
        assert_eq!(seats_times_duration(1.0, NANOS_PER_SEC).to_string(), "1.00000000ss");
        assert_eq!(seats_times_duration(1.0, NANOS_PER_SEC), SeatSeconds(100_000_000));
        assert_eq!(seats_times_duration(123.0, 100 * MS).to_string(), "12.30000000ss");
        assert_eq!(seats_times_duration(1203.0, 10 * MS).to_string(), "12.03000000ss");
        assert_eq!(SeatSeconds(u64::MAX).to_string(), "184467440737.09551615ss");
    }

    #[test]
    fn duration_per_seat_vectors() {
        assert_eq!(duration_per_seat(seats_times_duration(10.0, NANOS_PER_SEC), 1.0), 10 * NANOS_PER_SEC);
        assert_eq!(duration_per_seat(seats_times_duration(1.0, NANOS_PER_SEC), 10.0), 100 * MS);
        assert_eq!(duration_per_seat(seats_times_duration(13.0, 5 * MS), 5.0), 13 * MS);
        assert_eq!(duration_per_seat(seats_times_duration(12.0, 0), 10.0), 0);
    }

    #[test]
    fn negative_durations_wrap() {
        let neg = seats_times_duration(1.0, -NANOS_PER_SEC);
        assert_eq!(neg.0, (-100_000_000i64) as u64);
        let x = SeatSeconds(500_000_000);
        // "subtracting a negative" adds.
        assert_eq!(x.wrapping_sub(neg), SeatSeconds(600_000_000));
        assert_eq!(x.wrapping_add(neg), SeatSeconds(400_000_000));
        // rounding half away from zero
        assert_eq!(seats_times_duration(1.0, 5), SeatSeconds(1));
        assert_eq!(seats_times_duration(1.0, -5).0, (-1i64) as u64);
        assert_eq!(seats_times_duration(f64::NAN, 5), SeatSeconds(0));
        // big values above 2^63
        let big = seats_times_duration(2000.0, i64::MAX / 2);
        assert!(big.0 > 1u64 << 63);
    }

    #[test]
    fn integer_path_matches_the_float_formula() {
        let mut rng = crate::test_rng::Rng(0x2545_f491_4f6c_dd1d);
        for k in 0..200_000u64 {
            let x = rng.next();
            let seats = (x % 4) as f64 + if k % 3 == 0 { (x >> 8) as f64 % 10_000.0 } else { 0.0 };
            let d = match k % 4 {
                0 => (x >> 20) as i64 % 100_000_000,
                1 => (x >> 12) as i64 % (1 << 40),
                2 => (x >> 40) as i64,
                _ => ((x >> 3) % 1000) as i64 * 5,
            };
            assert_eq!(seats_times_duration(seats, d), seats_times_duration_float(seats, d), "{seats} × {d}");
        }
        assert_eq!(seats_times_duration(1.0, 3_000_000), SeatSeconds(300_000));
        assert_eq!(seats_times_duration(1.0, 15), SeatSeconds(2));
        assert_eq!(seats_times_duration(1.5, 10), seats_times_duration_float(1.5, 10));
        assert_eq!(seats_times_duration(2.0, -25), seats_times_duration_float(2.0, -25));
    }
}
