//! Deterministic service-time jitter: a call's draw is a hash (splitmix64) of the scenario's
//! seed, the thread and the call number, so it is the same whatever order the calls run in and
//! runs that differ only in scheduling (e.g. 1 and 2 workers) serve the same work.

use crate::Nanos;

/// The splitmix64 output function.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How long a call's handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceTime {
    /// `exec` when `jitter` is 0, else uniform in `[exec − jitter, exec + jitter]` (`jitter` ≤ `exec`).
    Uniform { exec: Nanos, jitter: Nanos },
    /// One of these measured times, each equally likely.
    Sampled(Vec<Nanos>),
}

/// The service time of call `call` of thread `thread`.
pub fn service_time(seed: u64, thread: u32, call: u32, service: &ServiceTime) -> Nanos {
    // A value below `n` drawn from the call's hash, each equally likely.
    let below = |n: u64| {
        let r = mix(mix(seed ^ mix(u64::from(thread))) ^ u64::from(call));
        ((u128::from(r) * u128::from(n)) >> 64) as u64
    };
    match *service {
        ServiceTime::Uniform { exec, jitter } if jitter <= 0 => exec,
        ServiceTime::Uniform { exec, jitter } => {
            // 2·jitter + 1 values; jitter ≤ exec < 2^63, so the span fits in u64.
            let offset = below((jitter as u64).saturating_mul(2).saturating_add(1));
            let t = i128::from(exec) - i128::from(jitter) + i128::from(offset);
            Nanos::try_from(t.max(0)).unwrap_or(Nanos::MAX)
        }
        ServiceTime::Sampled(ref times) => times.get(below(times.len() as u64) as usize).copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_deterministic_and_bounded() {
        assert_eq!(service_time(1, 2, 3, &ServiceTime::Uniform { exec: 50, jitter: 0 }), 50);
        let exec = 50_000_000;
        let j = 10_000_000;
        let draws: Vec<Nanos> = (0..20_000).map(|k| service_time(7, 3, k, &ServiceTime::Uniform { exec, jitter: j })).collect();
        assert!(draws.iter().all(|d| (exec - j..=exec + j).contains(d)));
        let mean = draws.iter().map(|d| *d as f64).sum::<f64>() / draws.len() as f64;
        assert!((mean - exec as f64).abs() < 0.01 * exec as f64, "{mean}");
        // Each tenth of the range gets about a tenth of the draws.
        for b in 0..10 {
            let lo = exec - j + b * 2 * j / 10;
            let n = draws.iter().filter(|d| **d >= lo && **d < lo + 2 * j / 10).count();
            assert!((1700..2300).contains(&n), "bin {b}: {n}");
        }
        assert_eq!(service_time(7, 3, 5, &ServiceTime::Uniform { exec, jitter: j }), draws[5]);
        assert_ne!(service_time(8, 3, 5, &ServiceTime::Uniform { exec, jitter: j }), draws[5]);
        // Extreme values stay in range.
        assert!(service_time(1, 0, 0, &ServiceTime::Uniform { exec: Nanos::MAX, jitter: Nanos::MAX }) >= 0);
    }

    #[test]
    fn samples_are_drawn_evenly() {
        let samples = [10, 20, 30, 40];
        let service = ServiceTime::Sampled(samples.to_vec());
        let draws: Vec<Nanos> = (0..20_000).map(|k| service_time(7, 3, k, &service)).collect();
        for v in samples {
            let n = draws.iter().filter(|d| **d == v).count();
            assert!((4700..5300).contains(&n), "{v}: {n}");
        }
        assert_eq!(service_time(7, 3, 5, &service), draws[5]);
    }
}
