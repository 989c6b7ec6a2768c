//! Levels kept decoded in process memory (`engine::level_table`, the native host's store) against
//! levels kept as bytes with compare-and-swap (`MemStore`, the Wasm host's shared data): the same
//! operations give the same decisions, notices and level states; workers sharing a level on the
//! typed store never lose or double a seat.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/rng.rs"]
mod rng;

#[path = "common/one_level.rs"]
mod one_level;
use apf_wasm::config::parse_plugin_config;
use apf_wasm::engine::level_table::ProcessStore;
use apf_wasm::engine::store::{MemStore, Store, WorkerStore};
use apf_wasm::engine::{self, Arriving, Compiled, Decision, Notice, NoticeKind};
use apf_wasm::fairqueuing::{Receipt, RequestId, RequestTag, WorkEstimate};
use apf_wasm::NANOS_PER_SEC;
use one_level::{one_level_json, Queuing};
use rng::Rng;

const MS: i64 = 1_000_000;

/// One Limited level "test" (and the suggested ones) with `seats` seats and `queues` queues,
/// compiled as configuration generation `generation`.
fn config(seats: u32, queues: u32, queue_length: u32, generation: u64) -> Compiled {
    let q = Queuing { queues, hand_size: 2, queue_length };
    Compiled::new(parse_plugin_config(one_level_json("test", seats, q, true).as_bytes()).unwrap(), generation)
}

fn level(c: &Compiled) -> usize {
    c.levels.iter().position(|l| l.name == "test").unwrap()
}

/// One step of a random sequence.
#[derive(Debug, Clone)]
enum Op {
    Admit { owner: u32, hash: u64, seats: u32, latency: i64, patience: i64 },
    Finish(usize),
    End(usize),
    TimeOut(usize),
    Expire,
    Purge(u32),
    Reconfigure,
    Borrow,
    Refuse,
}

fn draw(rng: &mut Rng) -> Op {
    match rng.below(20) {
        0..=8 => Op::Admit {
            owner: rng.range(1, 3),
            hash: rng.below(6) * 7919,
            seats: rng.range(1, 3),
            latency: if rng.below(4) == 0 { rng.range(1, 30) * MS } else { 0 },
            patience: rng.range(5, 200) * MS,
        },
        9..=12 => Op::Finish(rng.below(64) as usize),
        13 => Op::End(rng.below(64) as usize),
        14 => Op::TimeOut(rng.below(64) as usize),
        15 | 16 => Op::Expire,
        17 => Op::Purge(rng.range(1, 3)),
        18 => {
            if rng.below(3) == 0 {
                Op::Reconfigure
            } else {
                Op::Borrow
            }
        }
        _ => Op::Refuse,
    }
}

/// What the workers hold: executing receipts and waiting ids, as the byte store's results say
/// (the typed store must say the same).
#[derive(Default)]
struct Held {
    executing: Vec<Receipt>,
    waiting: Vec<RequestId>,
}

impl Held {
    fn note(&mut self, notices: &[Notice]) {
        for n in notices {
            self.waiting.retain(|id| *id != n.id);
            if let NoticeKind::Run { receipt, .. } = n.kind {
                self.executing.push(receipt);
            }
        }
    }
}

/// Runs `op` on `store` at `now` under `c`: its observable outcome as text, and an admission's
/// decision.
fn run(op: &Op, c: &Compiled, store: &dyn Store, now: i64, held: &Held, notices: &mut Vec<Notice>) -> (String, Option<Decision>) {
    let lvl = level(c);
    let key = c.levels[lvl].key.to_string();
    let pick = |v: &[RequestId], i: usize| v.get(i % v.len().max(1)).copied();
    let text = match *op {
        Op::Admit { owner, hash, seats, latency, patience } => {
            let work = WorkEstimate { initial_seats: seats, final_seats: seats.min(2), additional_latency: latency };
            let tag = RequestTag { owner, context: (now / MS) as u32, flow_schema: 0, flow_hash: hash, wait_deadline: now + patience };
            let r = engine::admit(c, store, now, Arriving { level: lvl, work, tag }, notices);
            return (format!("{r:?}"), r.ok().map(|(d, _)| d));
        }
        Op::Finish(i) => match held.executing.get(i % held.executing.len().max(1)) {
            Some(rc) => format!("{:?}", engine::finish(store, now, &key, rc, notices)),
            None => String::new(),
        },
        Op::End(i) => match pick(&held.waiting, i) {
            Some(id) => format!("{:?}", engine::end(store, now, &key, id, None, notices)),
            None => String::new(),
        },
        Op::TimeOut(i) => match pick(&held.waiting, i) {
            Some(id) => format!("{:?}", engine::time_out(store, now, &key, id)),
            None => String::new(),
        },
        Op::Expire => format!("{:?}", engine::expire_level(store, now, &key, notices)),
        Op::Purge(owner) => format!("{:?}", engine::purge_owner(store, now, &key, owner, notices)),
        Op::Borrow => format!("{:?}", engine::adjust_borrowing(c, store, now, notices)),
        Op::Refuse => format!("{}", engine::watch_limits::refused(store, now, &key)),
        Op::Reconfigure => String::new(),
    };
    (text, None)
}

/// What the sequences exercised: executions, queuings, rejections, dispatches, time-outs by
/// notice, reconfigurations that dispatched.
#[derive(Debug, Default)]
struct Seen {
    executed: usize,
    queued: usize,
    rejected: usize,
    dispatched: usize,
    timed_out: usize,
    /// Admissions that dispatched others: under a new generation, its reconfiguration.
    reconfigured: usize,
}

impl Seen {
    fn add(&mut self, op: &Op, decision: Option<Decision>, notices: &[Notice]) {
        match decision {
            Some(Decision::Execute(_)) => self.executed += 1,
            Some(Decision::Queued(_)) => self.queued += 1,
            Some(Decision::Rejected { .. }) => self.rejected += 1,
            None => {}
        }
        for n in notices {
            match n.kind {
                NoticeKind::Run { .. } => self.dispatched += 1,
                NoticeKind::Reject { .. } => self.timed_out += 1,
            }
        }
        if matches!(op, Op::Admit { .. }) && decision.is_some() && !notices.is_empty() {
            self.reconfigured += 1;
        }
    }
}

/// The same random sequence on both stores, compared after every step.
fn same_on_both(seed: u64, steps: usize, seen: &mut Seen) {
    let mut rng = Rng(seed);
    let configs = [config(6, 8, 4, 1), config(3, 4, 2, 2), config(9, 16, 6, 3), config(4, 2, 3, 4)];
    let mut generation = 0;
    let bytes = MemStore::new();
    let typed = ProcessStore::new();
    let (bw, tw) = (WorkerStore::new(&bytes), WorkerStore::new(&typed));
    let mut held = Held::default();
    let mut now = 1_000 * MS;
    for step in 0..steps {
        now += rng.range(0, 20) * MS;
        let op = draw(&mut rng);
        if let Op::Reconfigure = op {
            generation = (generation + 1).min(configs.len() - 1);
        }
        let c = &configs[generation];
        let key = c.levels[level(c)].key.to_string();
        let (mut bn, mut tn) = (Vec::new(), Vec::new());
        let b = run(&op, c, &bw, now, &held, &mut bn);
        let t = run(&op, c, &tw, now, &held, &mut tn);
        let ctx = format!("seed {seed} step {step}: {op:?}");
        assert_eq!(b, t, "{ctx}: outcome");
        assert_eq!(bn, tn, "{ctx}: notices");
        let (bs, ts) = (engine::read_level(&bw, &key).unwrap(), engine::read_level(&tw, &key).unwrap());
        assert_eq!(bs.map(|s| s.encode()), ts.map(|s| s.encode()), "{ctx}: level state");
        seen.add(&op, b.1, &bn);
        track(&op, &mut held, b.1, &bn);
    }
    let c = &configs[generation];
    let key = c.levels[level(c)].key.to_string();
    assert!(engine::read_level(&typed, &key).unwrap().is_some(), "the typed store kept the level");
    assert_eq!(typed.bytes.value_len(&key), 0, "no level bytes in the typed store");
}

/// Updates `held` after `op`: the decision, dispatches and removals it made.
fn track(op: &Op, held: &mut Held, decision: Option<Decision>, notices: &[Notice]) {
    match decision {
        Some(Decision::Execute(rc)) => held.executing.push(rc),
        Some(Decision::Queued(id)) => held.waiting.push(id),
        _ => {}
    }
    held.note(notices);
    match *op {
        Op::Finish(i) if !held.executing.is_empty() => {
            let n = held.executing.len();
            held.executing.remove(i % n);
        }
        Op::End(i) | Op::TimeOut(i) if !held.waiting.is_empty() => {
            let n = held.waiting.len();
            held.waiting.remove(i % n);
        }
        _ => {}
    }
}

#[test]
fn random_sequences_give_the_same_decisions_notices_and_states_on_both_stores() {
    let mut seen = Seen::default();
    for seed in 0..40 {
        same_on_both(seed, 400, &mut seen);
    }
    // The sequences reached every kind of outcome (else they prove little).
    let Seen { executed, queued, rejected, dispatched, timed_out, reconfigured } = seen;
    assert!([executed, queued, rejected, dispatched, timed_out, reconfigured].iter().all(|&n| n > 20), "{seen:?}");
}

#[test]
fn two_threads_on_one_typed_level_never_lose_or_double_a_seat() {
    let c = config(4, 8, 50, 1);
    let lvl = level(&c);
    let key = c.levels[lvl].key.to_string();
    let typed = ProcessStore::new();
    std::thread::scope(|s| {
        for owner in 1..=2u32 {
            let (c, typed, key) = (&c, &typed, key.as_str());
            s.spawn(move || hammer(c, typed, key, owner));
        }
    });
    let st = engine::read_level(&typed, &key).unwrap().unwrap();
    assert_eq!((st.qs.seats_in_use(), st.qs.requests_waiting(), st.qs.requests_executing()), (0, 0, 0));
}

/// One worker's requests on `key`: each executes (at once or when a notice dispatches it) and
/// finishes. A dispatch is finished by the worker whose operation made it, whoever owns the
/// request, so every receipt is finished exactly once; the level's seats never exceed its limit.
fn hammer(c: &Compiled, store: &ProcessStore, key: &str, owner: u32) {
    let w = WorkerStore::new(store);
    let lvl = level(c);
    let mut running: Vec<Receipt> = Vec::new();
    let mut notices = Vec::new();
    for i in 0..4_000u32 {
        let now = i64::from(i) * MS;
        let tag = RequestTag { owner, context: i, flow_schema: 0, flow_hash: u64::from(i % 5), wait_deadline: now + 1_000 * NANOS_PER_SEC };
        match engine::admit(c, &w, now, Arriving { level: lvl, work: WorkEstimate::ONE, tag }, &mut notices).unwrap().0 {
            Decision::Execute(rc) => running.push(rc),
            Decision::Queued(_) => {}
            Decision::Rejected { .. } => panic!("queues are long enough"),
        }
        collect(&mut notices, &mut running);
        let seats = engine::peek_level(&w, key, |st| st.qs.seats_in_use()).unwrap().unwrap();
        assert!(seats <= 4, "more seats in use than the level has: {seats}");
        if running.len() > 1 || i % 3 == 0 {
            if let Some(rc) = running.pop() {
                assert!(engine::finish(&w, now, key, &rc, &mut notices).unwrap(), "a seat released twice");
                collect(&mut notices, &mut running);
            }
        }
    }
    // Drain: finish what this worker holds, and whatever that dispatches to it.
    let mut now = 10_000 * MS;
    while let Some(rc) = running.pop() {
        now += MS;
        assert!(engine::finish(&w, now, key, &rc, &mut notices).unwrap());
        collect(&mut notices, &mut running);
    }
    // Requests still queued belong to the other worker, which drains them the same way; wait
    // (bounded) until none is left, finishing any dispatched to this worker meanwhile.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine::peek_level(&w, key, |st| st.qs.requests_waiting() + st.qs.requests_executing()).unwrap() != Some(0) {
        assert!(std::time::Instant::now() < deadline, "the level never drained");
        std::thread::yield_now();
    }
}

/// Dispatches seen by this worker join its running requests (the seats are taken in the level,
/// whoever the owner is: the worker that saw the notice releases them).
fn collect(notices: &mut Vec<Notice>, running: &mut Vec<Receipt>) {
    for n in notices.drain(..) {
        match n.kind {
            NoticeKind::Run { receipt, .. } => running.push(receipt),
            NoticeKind::Reject { .. } => panic!("nothing times out"),
        }
    }
}
