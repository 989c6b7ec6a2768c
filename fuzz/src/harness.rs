//! A deterministic, dependency-free mutation fuzzer: the runnable-everywhere twin of the
//! `cargo fuzz` targets (which need libFuzzer and nightly-only flags).
//!
//! Every corpus file is run as is, then mutants: a seeded xorshift picks a pool entry (the corpus
//! plus mutants the target *accepted*, i.e. parsed as valid, so structured formats are explored
//! beyond their syntax checks) and applies 1–8 mutations (bit flips, interesting bytes and
//! numbers, inserts, deletions, duplications, dictionary tokens, splices with other entries,
//! repeated chunks). The same seed gives the same inputs.
//!
//! A failure is a panic inside the target (property checks are assertions), an input slower than
//! the time limit, or a peak of live heap above the allocation limit (measured by a [`Probe`], a
//! counting global allocator in the test binary). The failing input is minimised, written under
//! the artifact directory and shown escaped in the panic message.
//!
//! Environment: `APF_FUZZ_ITERS` (mutants per target), `APF_FUZZ_SECS` (time budget per target,
//! whichever ends first), `APF_FUZZ_SEED`, `APF_FUZZ_TIMEOUT_MS` (per input),
//! `APF_FUZZ_MAX_MB` (peak live heap per input).

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

/// A fuzz target: returns whether the input was accepted as valid (accepted mutants join the pool).
pub type Target = fn(&[u8]) -> bool;

/// xorshift64* (deterministic, no dependency).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (0 when n == 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len()))
    }
}

/// Run limits, from the environment with per-target defaults.
#[derive(Debug, Clone)]
pub struct Config {
    pub iters: u64,
    pub budget: Duration,
    pub seed: u64,
    pub timeout: Duration,
    pub max_peak_bytes: usize,
    pub max_len: usize,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl Config {
    pub fn from_env(default_iters: u64, default_secs: f64, max_len: usize) -> Config {
        let secs = std::env::var("APF_FUZZ_SECS").ok().and_then(|v| v.trim().parse::<f64>().ok());
        let iters = env_u64("APF_FUZZ_ITERS").unwrap_or(if secs.is_some() { u64::MAX } else { default_iters });
        Config {
            iters,
            budget: Duration::from_secs_f64(secs.unwrap_or(default_secs).max(0.0)),
            seed: env_u64("APF_FUZZ_SEED").unwrap_or(0x00A9_F00D),
            timeout: Duration::from_millis(env_u64("APF_FUZZ_TIMEOUT_MS").unwrap_or(10_000)),
            max_peak_bytes: env_u64("APF_FUZZ_MAX_MB").unwrap_or(256).saturating_mul(1 << 20) as usize,
            max_len,
        }
    }
}

/// Peak-live-heap measurement for the current thread (see the test binary's global allocator).
#[derive(Clone, Copy)]
pub struct Probe {
    pub reset: fn(),
    pub peak: fn() -> usize,
}

/// What one run did.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub corpus: usize,
    pub execs: u64,
    pub accepted: u64,
    pub pool: usize,
    pub elapsed: Duration,
    pub slowest: Duration,
    /// The slowest input (written to the artifact directory as `<target>-slowest`).
    pub slowest_input: Vec<u8>,
    pub peak_bytes: usize,
}

/// Interesting decimal numbers for text formats.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "7",
    "8",
    "31",
    "32",
    "33",
    "63",
    "64",
    "127",
    "128",
    "255",
    "256",
    "1000",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1000000000",
    "1000000000000",
    "100000000000000000000",
    "1e308",
    "1e309",
    "-1e308",
    "1.5",
    "0.5",
    "1e-9",
    "NaN",
    "Infinity",
    "00",
    "01",
    "1_000",
    "0x10",
];

/// Interesting binary chunks: varint extremes, `2^40`, `2^63`, overlong encodings.
const BYTES: &[&[u8]] = &[
    &[0x00],
    &[0x01],
    &[0x7f],
    &[0x80, 0x01],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x20],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
    &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[0x80, 0x00],
    &[0xff; 11],
    &[0, 0, 0, 0, 0, 0, 0xf8, 0x7f],
    &[0, 0, 0, 0, 0, 0, 0xf0, 0x7f],
    &[0, 0, 0, 0, 0, 0, 0xf0, 0xff],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xef, 0x7f],
];

fn digits_at(data: &[u8], start: usize) -> Option<(usize, usize)> {
    let from = (start..data.len()).find(|&i| data.get(i).is_some_and(u8::is_ascii_digit))?;
    let end = (from..data.len()).find(|&i| !data.get(i).is_some_and(u8::is_ascii_digit)).unwrap_or(data.len());
    let from = if from > 0 && data.get(from - 1) == Some(&b'-') { from - 1 } else { from };
    Some((from, end))
}

/// One random mutation of `data` in place.
fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, pool: &[Vec<u8>], dict: &[&[u8]], max_len: usize) {
    let len = data.len();
    match rng.below(16) {
        0 if len > 0 => {
            let i = rng.below(len);
            if let Some(b) = data.get_mut(i) {
                *b ^= 1 << rng.below(8);
            }
        }
        1 if len > 0 => {
            let i = rng.below(len);
            let v = *rng
                .pick(&[
                    0u8, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'%', b'/', b'?', b'&', b'=', b'\n', b',', b':', b'{', b'[', b'.', b' ', b'-',
                ])
                .unwrap_or(&0);
            if let Some(b) = data.get_mut(i) {
                *b = v;
            }
        }
        2 => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(4);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(i..i, bytes);
        }
        3 if len > 0 => {
            let i = rng.below(len);
            let n = 1 + rng.below((len - i).min(32));
            data.drain(i..i + n);
        }
        4 if len > 0 => {
            let i = rng.below(len);
            let n = 1 + rng.below((len - i).min(64));
            let chunk: Vec<u8> = data.get(i..i + n).map(<[u8]>::to_vec).unwrap_or_default();
            let at = rng.below(len + 1);
            data.splice(at..at, chunk);
        }
        5 | 6 if !dict.is_empty() => {
            let tok = rng.pick(dict).copied().unwrap_or_default();
            let i = rng.below(len + 1);
            if rng.one_in(2) || i == len {
                data.splice(i..i, tok.iter().copied());
            } else {
                let end = (i + tok.len()).min(len);
                data.splice(i..end, tok.iter().copied());
            }
        }
        7 if !pool.is_empty() => {
            // Splice: our prefix, another entry's suffix.
            let other = rng.pick(pool).cloned().unwrap_or_default();
            let cut = rng.below(len + 1);
            let ocut = rng.below(other.len() + 1);
            data.truncate(cut);
            data.extend_from_slice(other.get(ocut..).unwrap_or_default());
        }
        8 | 9 => {
            // Replace a number (text formats) with an interesting one.
            let start = rng.below(len + 1);
            let num = rng.pick(NUMBERS).copied().unwrap_or("0").as_bytes();
            match digits_at(data, start).or_else(|| digits_at(data, 0)) {
                Some((a, b)) => {
                    data.splice(a..b, num.iter().copied());
                }
                None => {
                    data.splice(start..start, num.iter().copied());
                }
            }
        }
        10 if len > 0 => {
            data.truncate(rng.below(len));
        }
        11 if len > 1 => {
            let (i, j) = (rng.below(len), rng.below(len));
            data.swap(i, j);
        }
        12 if len > 0 => {
            let i = rng.below(len);
            if let Some(b) = data.get_mut(i) {
                *b = b.wrapping_add((rng.below(33) as u8).wrapping_sub(16));
            }
        }
        13 if !pool.is_empty() && len > 0 => {
            // Crossover: overwrite a range with a range of another entry.
            let other = rng.pick(pool).cloned().unwrap_or_default();
            if !other.is_empty() {
                let oi = rng.below(other.len());
                let n = 1 + rng.below((other.len() - oi).min(64));
                let i = rng.below(len);
                let end = (i + n).min(len);
                data.splice(i..end, other.get(oi..oi + n).unwrap_or_default().iter().copied());
            }
        }
        14 => {
            // Repeat a short chunk many times (deep nesting, long runs, many items).
            let i = rng.below(len + 1);
            let chunk: Vec<u8> = if len > 0 && rng.one_in(2) {
                let a = rng.below(len);
                let n = 1 + rng.below((len - a).min(8));
                data.get(a..a + n).map(<[u8]>::to_vec).unwrap_or_default()
            } else {
                rng.pick(dict).map(|t| t.to_vec()).unwrap_or_else(|| vec![b'['])
            };
            let limit = if rng.one_in(4) { 4000 } else { 40 };
            let times = 2 + rng.below(limit);
            let rep: Vec<u8> = chunk.iter().copied().cycle().take(chunk.len().saturating_mul(times).min(max_len)).collect();
            data.splice(i..i, rep);
        }
        _ => {
            let chunk = rng.pick(BYTES).copied().unwrap_or_default();
            let i = rng.below(len + 1);
            if rng.one_in(2) || i == len {
                data.splice(i..i, chunk.iter().copied());
            } else {
                let end = (i + chunk.len()).min(len);
                data.splice(i..end, chunk.iter().copied());
            }
        }
    }
    data.truncate(max_len);
}

/// A mutant of a random pool entry.
pub fn mutant(rng: &mut Rng, pool: &[Vec<u8>], dict: &[&[u8]], max_len: usize) -> Vec<u8> {
    let mut data = rng.pick(pool).cloned().unwrap_or_default();
    let n = 1 + rng.below(8);
    for _ in 0..n {
        mutate_once(rng, &mut data, pool, dict, max_len);
    }
    data
}

/// Reads every file of a corpus directory (sorted by name, so runs are reproducible).
pub fn load_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect(),
        Err(_) => Vec::new(),
    };
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Panics are expected while minimising: silence the hook on this thread only.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                prev(info);
            }
        }));
    });
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok(bool),
    Panic(String),
    Slow(Duration),
    Alloc(usize),
}

fn run_one(target: Target, data: &[u8], cfg: &Config, probe: Option<Probe>) -> (Outcome, Duration, usize) {
    if let Some(p) = probe {
        (p.reset)();
    }
    let t = Instant::now();
    let r = panic::catch_unwind(AssertUnwindSafe(|| target(data)));
    let dt = t.elapsed();
    let peak = probe.map(|p| (p.peak)()).unwrap_or(0);
    let outcome = match r {
        Err(e) => Outcome::Panic(
            e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default(),
        ),
        Ok(_) if dt > cfg.timeout => Outcome::Slow(dt),
        Ok(_) if peak > cfg.max_peak_bytes => Outcome::Alloc(peak),
        Ok(a) => Outcome::Ok(a),
    };
    (outcome, dt, peak)
}

fn same_kind(a: &Outcome, b: &Outcome) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Greedy chunk-deletion minimiser (bounded number of attempts).
fn minimise(target: Target, data: &[u8], want: &Outcome, cfg: &Config, probe: Option<Probe>) -> Vec<u8> {
    let mut best = data.to_vec();
    let mut attempts = 0;
    let mut chunk = best.len().div_ceil(2).max(1);
    QUIET.with(|q| q.set(true));
    while chunk >= 1 && attempts < 3000 {
        let mut i = 0;
        let mut changed = false;
        while i < best.len() && attempts < 3000 {
            let mut cand = best.clone();
            let end = (i + chunk).min(cand.len());
            cand.drain(i..end);
            attempts += 1;
            let (o, _, _) = run_one(target, &cand, cfg, probe);
            if same_kind(&o, want) {
                best = cand;
                changed = true;
            } else {
                i += chunk;
            }
        }
        if !changed {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    QUIET.with(|q| q.set(false));
    best
}

/// Printable form of an input: text escaped as a Rust byte string.
pub fn escape(data: &[u8]) -> String {
    let shown = data.get(..data.len().min(4096)).unwrap_or_default();
    let mut s: String = shown.iter().flat_map(|&b| std::ascii::escape_default(b)).map(char::from).collect();
    if data.len() > shown.len() {
        s.push_str(&format!("... ({} bytes)", data.len()));
    }
    s
}

/// Runs `target` over the corpus and then mutants; panics (test failure) with the minimised
/// failing input. Returns what was done.
pub fn fuzz(
    name: &str,
    target: Target,
    corpus: Vec<Vec<u8>>,
    dict: &[&[u8]],
    cfg: &Config,
    probe: Option<Probe>,
    artifacts: &Path,
) -> Stats {
    install_quiet_hook();
    let start = Instant::now();
    let mut rng = Rng::new(cfg.seed ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)));
    let mut stats = Stats { corpus: corpus.len(), ..Stats::default() };
    let mut pool: Vec<Vec<u8>> = if corpus.is_empty() { vec![Vec::new()] } else { corpus.clone() };
    let fixed = pool.len();
    let mut i: u64 = 0;
    loop {
        let from_corpus = (i as usize) < corpus.len();
        if !from_corpus && (i - corpus.len() as u64 >= cfg.iters || start.elapsed() >= cfg.budget) {
            break;
        }
        let data = match corpus.get(i as usize) {
            Some(c) => c.clone(),
            None => mutant(&mut rng, &pool, dict, cfg.max_len),
        };
        i += 1;
        let (outcome, dt, peak) = run_one(target, &data, cfg, probe);
        stats.execs += 1;
        if dt > stats.slowest {
            stats.slowest = dt;
            stats.slowest_input = data.clone();
        }
        stats.peak_bytes = stats.peak_bytes.max(peak);
        match outcome {
            Outcome::Ok(accepted) => {
                if accepted {
                    stats.accepted += 1;
                    if !from_corpus && data.len() <= cfg.max_len {
                        if pool.len() < fixed + 256 {
                            pool.push(data);
                        } else {
                            let k = fixed + rng.below(256);
                            if let Some(slot) = pool.get_mut(k) {
                                *slot = data;
                            }
                        }
                    }
                }
            }
            bad => {
                let min = minimise(target, &data, &bad, cfg, probe);
                let _ = std::fs::create_dir_all(artifacts);
                let path = artifacts.join(format!("{name}-crash-{i}"));
                let _ = std::fs::write(&path, &data);
                let min_path = artifacts.join(format!("{name}-crash-{i}-min"));
                let _ = std::fs::write(&min_path, &min);
                let what = match bad {
                    Outcome::Panic(m) => format!("panicked: {m}"),
                    Outcome::Slow(d) => format!("took {d:?} (limit {:?})", cfg.timeout),
                    Outcome::Alloc(b) => format!("peak live heap {b} bytes (limit {})", cfg.max_peak_bytes),
                    Outcome::Ok(_) => String::new(),
                };
                panic!(
                    "fuzz target {name} failed on input #{i} (seed {:#x}): {what}\n  minimised ({} bytes, {}): b\"{}\"\n  original ({} bytes): {}",
                    cfg.seed,
                    min.len(),
                    min_path.display(),
                    escape(&min),
                    data.len(),
                    path.display()
                );
            }
        }
    }
    stats.pool = pool.len();
    stats.elapsed = start.elapsed();
    let _ = std::fs::create_dir_all(artifacts);
    let _ = std::fs::write(artifacts.join(format!("{name}-slowest")), &stats.slowest_input);
    stats
}
