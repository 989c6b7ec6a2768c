//! The deterministic pseudo-random generator of the Rust tests: SplitMix64 (Steele, Lea and
//! Flood, "Fast splittable pseudorandom number generators", 2014), seedable, dependency-free, good
//! for every seed (0 included). Fixed seeds make every run draw the same values; the fleet chaos
//! tests (`tests/fleet_invariant.rs`) tune their phases to the values this exact algorithm
//! draws, so it must not change.
//!
//! Integration tests include it with `#[path = "common/rng.rs"] mod rng;` (as the other helpers
//! in `tests/common/`), the crate's unit tests as `crate::test_rng`. The fuzz harness has its own
//! (`fuzz/src/harness.rs`: `Rng`), part of its reproducible mutant streams.
#![allow(dead_code)]

/// SplitMix64 state; `Rng(seed)` starts a sequence.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n` (0 for n = 0), by remainder: the small bias does not matter to tests.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// In `lo..=hi`, for any integer type of the callers.
    pub fn range<T: Int>(&mut self, lo: T, hi: T) -> T {
        let (lo, hi) = (lo.to_i128(), hi.to_i128());
        T::from_i128(lo + i128::from(self.below((hi - lo + 1) as u64)))
    }

    /// Uniform in `[0, 1)`, 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: impl Into<f64>) -> bool {
        self.unit() * 100.0 < percent.into()
    }
}

/// The integer types [`Rng::range`] draws: each converts to and from `i128` without loss for the
/// bounds the tests use.
pub trait Int: Copy {
    fn to_i128(self) -> i128;
    fn from_i128(v: i128) -> Self;
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn from_i128(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}

int!(i32, i64, u32, u64, usize);
