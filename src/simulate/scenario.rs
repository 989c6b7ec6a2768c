//! The scenario document (JSON, see the module documentation of [`super`]) and its validation
//! into the [`Scenario`] the event loop runs.

use serde::Deserialize;

use crate::duration::{format_go_duration, parse_go_duration};
use crate::fairqueuing::{QueueSetConfig, WorkEstimate};
use crate::fleet::FleetConfig;
use crate::Nanos;

use super::jitter::ServiceTime;
use super::SimError;
use super::{MAX_REPLICAS, MAX_TOTAL_CALLS, MAX_TOTAL_THREADS, MAX_WORKERS};

const MAX_SEATS: i64 = 1_000_000;

#[derive(Deserialize)]
#[serde(untagged)]
enum DurationIn {
    Str(String),
    Nanos(i64),
}

impl DurationIn {
    fn get(&self, what: &str) -> Result<Nanos, SimError> {
        match self {
            DurationIn::Str(s) => parse_go_duration(s).map_err(|e| SimError::scenario(format!("{what}: {e}"))),
            DurationIn::Nanos(n) => Ok(*n),
        }
    }

    fn non_negative(&self, what: &str) -> Result<Nanos, SimError> {
        match self.get(what)? {
            v if v < 0 => Err(SimError::scenario(format!("{what} must not be negative"))),
            v => Ok(v),
        }
    }
}

fn or_zero(d: &Option<DurationIn>, what: &str) -> Result<Nanos, SimError> {
    d.as_ref().map_or(Ok(0), |d| d.get(what))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HashIn {
    Str(String),
    Num(u64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LevelIn {
    concurrency_limit: i64,
    #[serde(default)]
    queues: i64,
    #[serde(default)]
    queue_length_limit: i64,
    #[serde(default)]
    hand_size: i64,
    #[serde(default)]
    exempt: bool,
}

fn one() -> i64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClientIn {
    hash: HashIn,
    threads: i64,
    calls: i64,
    exec: Option<DurationIn>,
    service_times: Option<Vec<DurationIn>>,
    think: Option<DurationIn>,
    round_trip: Option<DurationIn>,
    service_jitter: Option<f64>,
    #[serde(default = "one")]
    initial_seats: i64,
    #[serde(default = "one")]
    final_seats: i64,
    additional_latency: Option<DurationIn>,
    #[serde(default)]
    split: bool,
    replica: Option<i64>,
}

/// The scenario's `fleet` object: the plugin configuration's `fleet` timings, and the etcd
/// round trip of the simulation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FleetIn {
    period: Option<DurationIn>,
    lease_ttl: Option<DurationIn>,
    etcd_delay: Option<DurationIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScenarioIn {
    priority_level: LevelIn,
    eval_duration: DurationIn,
    clients: Vec<ClientIn>,
    request_wait_limit: Option<DurationIn>,
    start_time: Option<DurationIn>,
    workers: Option<i64>,
    seed: Option<u64>,
    engine: Option<bool>,
    replicas: Option<i64>,
    fleet: Option<FleetIn>,
}

/// When a thread issues its next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Upstream's `uniformClient`: `exec + think` after the previous call was dispatched.
    AfterDispatch { think: Nanos },
    /// A real closed-loop client: `round_trip` after the previous call's handler returned.
    AfterResponse { round_trip: Nanos },
}

/// One client, validated.
#[derive(Debug, Clone)]
pub struct Client {
    pub hash: u64,
    pub threads: u32,
    pub calls: u32,
    pub service: ServiceTime,
    pub pacing: Pacing,
    pub work: WorkEstimate,
    pub split: bool,
    /// The replica (gateway process) its connections go to; 0 without a fleet.
    pub replica: u32,
}

/// Fleet mode: `replicas` gateway processes share the level through one etcd.
#[derive(Debug, Clone)]
pub struct FleetSim {
    pub replicas: u32,
    /// As the plugin configuration's `fleet` (the etcd cluster is the simulated one).
    pub config: FleetConfig,
    /// Round trip of an etcd call: etcd handles it half-way, its answer arrives at the end.
    pub etcd_delay: Nanos,
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub cfg: QueueSetConfig,
    pub exempt: bool,
    pub eval: Nanos,
    pub start: Nanos,
    pub wait_limit: Option<Nanos>,
    pub clients: Vec<Client>,
    pub workers: u32,
    pub seed: u64,
    /// False: the bare QueueSet instead of the engine (`"engine": false`).
    pub engine: bool,
    /// Whether the level can ever have a timer event (`QueueSet::next_event`: a wait deadline,
    /// or seats lingering for an additional latency).
    pub timers: bool,
    /// `"replicas"`: the level is shared by a fleet of gateway processes.
    pub fleet: Option<FleetSim>,
}

pub fn ranged(v: i64, lo: i64, hi: i64, what: &str) -> Result<u32, SimError> {
    if v < lo || v > hi {
        return Err(SimError::scenario(format!("{what} must be in [{lo}, {hi}], got {v}")));
    }
    u32::try_from(v).map_err(|_| SimError::scenario(format!("{what} out of range")))
}

/// The bare QueueSet has one owner.
pub fn check_workers(engine: bool, workers: u32) -> Result<(), SimError> {
    if !engine && workers != 1 {
        return Err(SimError::scenario("workers: the bare QueueSet (\"engine\": false) has one worker"));
    }
    Ok(())
}

/// A fleet runs the engine (each replica is a gateway process).
pub fn check_fleet(engine: bool, fleet: Option<&FleetSim>) -> Result<(), SimError> {
    if !engine && fleet.is_some() {
        return Err(SimError::scenario("replicas: a fleet runs the engine, not the bare QueueSet (\"engine\": false)"));
    }
    Ok(())
}

/// A scenario duration as the plugin configuration writes it (a Go duration string).
fn config_duration(d: &DurationIn) -> serde_json::Value {
    match d {
        DurationIn::Str(s) => serde_json::Value::from(s.as_str()),
        DurationIn::Nanos(n) => serde_json::Value::from(format_go_duration(*n)),
    }
}

/// `replicas` and `fleet`, validated: the timings as the plugin configuration's `fleet`
/// (`FleetConfig::from_json`, with its defaults and errors), the etcd delay shorter than a
/// period (the gateway's calls time out after one).
fn parse_fleet(replicas: Option<i64>, fleet: Option<&FleetIn>, exempt: bool) -> Result<Option<FleetSim>, SimError> {
    let Some(replicas) = replicas else {
        return match fleet {
            Some(_) => Err(SimError::scenario("fleet: needs replicas")),
            None => Ok(None),
        };
    };
    let replicas = ranged(replicas, 1, MAX_REPLICAS.into(), "replicas")?;
    if exempt {
        return Err(SimError::scenario("replicas: an exempt level is not limited by a fleet"));
    }
    let mut raw = serde_json::json!({"etcd": {"cluster": "etcd"}});
    if let (Some(f), Some(obj)) = (fleet, raw.as_object_mut()) {
        if let Some(p) = &f.period {
            obj.insert(String::from("period"), config_duration(p));
        }
        if let Some(l) = &f.lease_ttl {
            obj.insert(String::from("leaseTtl"), config_duration(l));
        }
    }
    let config = FleetConfig::from_json(&raw).map_err(|e| SimError::scenario(e.join("; ")))?;
    let etcd_delay = fleet.and_then(|f| f.etcd_delay.as_ref()).map(|d| d.non_negative("fleet.etcdDelay")).transpose()?.unwrap_or(0);
    if etcd_delay >= config.period {
        return Err(SimError::scenario(format!(
            "fleet.etcdDelay must be shorter than fleet.period ({}), got {}",
            format_go_duration(config.period),
            format_go_duration(etcd_delay)
        )));
    }
    Ok(Some(FleetSim { replicas, config, etcd_delay }))
}

impl Scenario {
    pub fn parse(json: &[u8]) -> Result<Scenario, SimError> {
        let sc: ScenarioIn = serde_json::from_slice(json).map_err(|e| SimError::scenario(format!("bad scenario: {e}")))?;
        let pl = &sc.priority_level;
        let cfg = parse_level(pl)?;
        let eval = sc.eval_duration.get("evalDuration")?;
        if eval <= 0 {
            return Err(SimError::scenario(format!("evalDuration must be positive, got {eval}ns")));
        }
        let start = or_zero(&sc.start_time, "startTime")?;
        let wait_limit = sc.request_wait_limit.as_ref().map(|d| d.non_negative("requestWaitLimit")).transpose()?;
        if sc.clients.len() > u16::MAX as usize {
            return Err(SimError::scenario("too many clients"));
        }
        let workers = ranged(sc.workers.unwrap_or(1), 1, MAX_WORKERS.into(), "workers")?;
        let engine = sc.engine.unwrap_or(true);
        check_workers(engine, workers)?;
        let fleet = parse_fleet(sc.replicas, sc.fleet.as_ref(), pl.exempt)?;
        check_fleet(engine, fleet.as_ref())?;
        let mut clients = Vec::with_capacity(sc.clients.len());
        let mut totals = ClientTotals::default();
        for (i, ci) in sc.clients.iter().enumerate() {
            clients.push(parse_client(i, ci, &mut totals, fleet.as_ref())?);
        }
        let seed = sc.seed.unwrap_or(1);
        let timers = wait_limit.is_some() || clients.iter().any(|c| c.work.additional_latency != 0);
        Ok(Scenario { cfg, exempt: pl.exempt, eval, start, wait_limit, clients, workers, seed, engine, timers, fleet })
    }
}

/// The priority level's queue set configuration, checked by the QueueSet itself too.
fn parse_level(pl: &LevelIn) -> Result<QueueSetConfig, SimError> {
    let c = ranged(pl.concurrency_limit, 0, MAX_SEATS, "priorityLevel.concurrencyLimit")?;
    let cfg = if pl.exempt {
        QueueSetConfig { desired_queues: -1, queue_length_limit: 0, hand_size: 0, concurrency_limit: c, strict_limit: false }
    } else {
        QueueSetConfig {
            desired_queues: ranged(pl.queues, 0, 1 << 26, "priorityLevel.queues")? as i32,
            queue_length_limit: ranged(pl.queue_length_limit, 0, MAX_SEATS, "priorityLevel.queueLengthLimit")?,
            hand_size: ranged(pl.hand_size, 0, 1 << 26, "priorityLevel.handSize")?,
            concurrency_limit: c,
            strict_limit: false,
        }
    };
    // The QueueSet's own checks (entropy of the hand, …) fail early with its message.
    crate::fairqueuing::queueset::QueueSet::new(cfg, 0).map_err(SimError::scenario)?;
    Ok(cfg)
}

/// Threads and calls summed over the clients parsed so far, bounded as they grow.
#[derive(Default)]
struct ClientTotals {
    calls: i64,
    threads: i64,
}

impl ClientTotals {
    fn add(&mut self, threads: u32, calls: u32) -> Result<(), SimError> {
        self.calls = self.calls.saturating_add((threads as i64).saturating_mul(calls as i64));
        self.threads = self.threads.saturating_add(threads as i64);
        if self.threads > MAX_TOTAL_THREADS {
            return Err(SimError::scenario(format!("too many threads in total (summed over clients > {MAX_TOTAL_THREADS})")));
        }
        if self.calls > MAX_TOTAL_CALLS {
            return Err(SimError::scenario(format!("too many calls in total (threads × calls summed over clients > {MAX_TOTAL_CALLS})")));
        }
        Ok(())
    }
}

/// The `i`th client, its threads and calls added to `totals`.
fn parse_client(i: usize, ci: &ClientIn, totals: &mut ClientTotals, fleet: Option<&FleetSim>) -> Result<Client, SimError> {
    let what = |f: &str| format!("clients[{i}].{f}");
    let threads = ranged(ci.threads, 0, MAX_TOTAL_CALLS, &what("threads"))?;
    let calls = ranged(ci.calls, 0, MAX_TOTAL_CALLS, &what("calls"))?;
    totals.add(threads, calls)?;
    let samples = ci.service_times.as_deref().unwrap_or_default();
    let samples: Vec<Nanos> = samples.iter().map(|d| d.non_negative(&what("serviceTimes[]"))).collect::<Result<_, _>>()?;
    // `None`: the call times are drawn from `samples`.
    let exec = match (&ci.exec, samples.is_empty(), ci.service_jitter) {
        (Some(e), true, _) => Some(e.non_negative(&what("exec"))?),
        (None, false, None) => None,
        (None, true, _) => return Err(SimError::scenario(format!("{}: one of exec and serviceTimes is required", what("exec")))),
        _ => return Err(SimError::scenario(format!("{}: serviceTimes excludes exec and serviceJitter", what("serviceTimes")))),
    };
    let pacing = parse_pacing(ci, &what)?;
    let service = match exec {
        None => ServiceTime::Sampled(samples),
        Some(exec) => ServiceTime::Uniform { exec, jitter: parse_jitter(ci.service_jitter, exec, &what)? },
    };
    let additional_latency = or_zero(&ci.additional_latency, &what("additionalLatency"))?;
    let hash = match &ci.hash {
        HashIn::Num(n) => *n,
        HashIn::Str(s) => s.trim().parse().map_err(|_| SimError::scenario(format!("client hash {s:?} is not a decimal uint64")))?,
    };
    let work = WorkEstimate {
        initial_seats: ranged(ci.initial_seats, 0, MAX_SEATS, &what("initialSeats"))?,
        final_seats: ranged(ci.final_seats, 0, MAX_SEATS, &what("finalSeats"))?,
        additional_latency,
    };
    let replica = parse_replica(i, ci.replica, fleet, &what)?;
    Ok(Client { hash, threads, calls, service, pacing, work, split: ci.split, replica })
}

/// When a client's next call starts: a think time after dispatch or a round trip after the
/// response (exactly one of them).
fn parse_pacing(ci: &ClientIn, what: &impl Fn(&str) -> String) -> Result<Pacing, SimError> {
    Ok(match (&ci.think, &ci.round_trip) {
        (Some(t), None) => Pacing::AfterDispatch { think: t.get(&what("think"))? },
        (None, Some(r)) => Pacing::AfterResponse { round_trip: r.non_negative(&what("roundTrip"))? },
        (None, None) => return Err(SimError::scenario(format!("{}: one of think and roundTrip is required", what("think")))),
        (Some(_), Some(_)) => return Err(SimError::scenario(format!("{}: think and roundTrip exclude each other", what("roundTrip")))),
    })
}

/// A uniform service time's jitter: the fraction `service_jitter` (in [0, 1]) of `exec`.
fn parse_jitter(service_jitter: Option<f64>, exec: Nanos, what: &impl Fn(&str) -> String) -> Result<Nanos, SimError> {
    match service_jitter {
        None => Ok(0),
        Some(j) if (0.0..=1.0).contains(&j) => Ok((exec as f64 * j).floor() as Nanos),
        Some(j) => Err(SimError::scenario(format!("{} must be in [0, 1], got {j}", what("serviceJitter")))),
    }
}

/// The replica the `i`th client calls: given (needs a fleet), else round-robin over the replicas.
fn parse_replica(i: usize, replica: Option<i64>, fleet: Option<&FleetSim>, what: &impl Fn(&str) -> String) -> Result<u32, SimError> {
    let replicas = fleet.map_or(1, |f| f.replicas);
    match replica {
        None => Ok(u32::try_from(i as u64 % u64::from(replicas)).unwrap_or(0)),
        Some(_) if fleet.is_none() => Err(SimError::scenario(format!("{}: needs replicas", what("replica")))),
        Some(r) => ranged(r, 0, i64::from(replicas) - 1, &what("replica")),
    }
}
