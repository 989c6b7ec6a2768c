//! `apf simulate [--workers N] SCENARIO.json` (or `-` for stdin): runs the deterministic
//! fair-queuing simulator (`crate::simulate`) — the filter's admission path with N simulated
//! Envoy workers — and prints its result as one line of JSON.

pub const HELP: &str = "usage: apf simulate [--workers N] SCENARIO.json   (use - for stdin)

Runs a scenario through the filter's admission path (the engine over a shared store, as in
Envoy) on a virtual clock and prints one line of JSON: per client the time-weighted seats
executing over the evaluation window (averageSeats, and per half), calls executed and
rejected (by reason), throughput (calls completed in the window per second) and queueWait
(p50, p90, max in seconds, of the calls started in the window).

  --workers N   simulated Envoy workers (1-64, per replica), overriding the scenario's
                \"workers\"; thread j of client i runs on worker (i + j) mod N

Scenario (JSON; durations as Go durations such as \"50ms\" or integer nanoseconds):
  priorityLevel      concurrencyLimit, queues, queueLengthLimit, handSize, exempt
  evalDuration       the evaluation window
  clients[]          hash (flow hash, decimal uint64), threads, calls (per thread), exec,
                     and one of:
                       think      next call exec + think after the previous one was dispatched
                                  (upstream's uniformScenario harness)
                       roundTrip  next call this long after the previous one's response
                                  (a real closed-loop client)
                     serviceJitter  j: each call's exec drawn uniformly from
                                  [exec*(1-j), exec*(1+j)] (deterministic, see seed)
                     serviceTimes   instead of exec: a list of measured service times,
                                  each call's drawn from them (each equally likely)
                     initialSeats, finalSeats (default 1), additionalLatency, split
  workers            simulated Envoy workers (default 1)
  seed               seed of the serviceJitter draws (default 1)
  requestWaitLimit   queue wait limit of every request (default none)
  startTime          absolute start of the scenario (default 0)
  engine             false: drive the bare QueueSet as upstream's harness does (1 worker)
  replicas           fleet mode: N gateway processes (1-32) share the level (its
                     concurrencyLimit is the fleet's) through one simulated etcd, each with
                     its own store, workers and clients, running the gateway's fleet code
  fleet              period, leaseTtl (as the plugin configuration's fleet; default 1s, 5s),
                     etcdDelay (round trip of an etcd call, shorter than period; default 0)
  clients[].replica  the replica a client's connections go to (default: client i on
                     replica i mod replicas)

In fleet mode the result also has \"fleet\": the limit, the most seats in use in the whole
fleet at once (maxExecuting, and when), and per replica its clients, its seats (the fleet's
allocation) and seats in use at every period from the start through the window, every change
of its seats, and its most seats in use.

With think 0 a call is waiting when its predecessor's seat is released and takes it back; a
real client (roundTrip) arrives after its response, when a waiting request of another flow
has already taken the seat. With a constant exec the seats then free at the same phases
cycle after cycle and such a client waits for the next one (up to a whole exec): see the
simulate module documentation, \"Phase locking\".
";

pub(super) fn simulate(args: &[String]) -> super::Outcome {
    let mut workers = None;
    let mut path = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "-h" | "--help" => return Ok(HELP.to_string()),
            "--workers" => it.next().map(String::as_str),
            s if s.starts_with("--workers=") => s.strip_prefix("--workers="),
            s if path.is_none() && (s == "-" || !s.starts_with('-')) => {
                path = Some(s);
                continue;
            }
            _ => return Err((2, format!("apf simulate: unexpected argument {a:?}\n{HELP}"))),
        };
        let n = value.and_then(|v| v.parse::<u32>().ok());
        workers = Some(n.ok_or_else(|| (2, "apf simulate: --workers needs a number of workers\n".to_string()))?);
    }
    let path = path.ok_or_else(|| (2, HELP.to_string()))?;
    fn fail(e: impl std::fmt::Display) -> (i32, String) {
        (1, format!("apf simulate: {e}\n"))
    }
    let data = match path {
        "-" => super::read_input(Some(path)).map_err(|e| e.to_string()),
        _ => std::fs::read(path).map_err(|e| format!("{path}: {e}")),
    };
    let opts = crate::simulate::Options { workers, ..crate::simulate::Options::default() };
    let run = crate::simulate::run_scenario_with(&data.map_err(fail)?, &opts).map_err(fail)?;
    Ok(format!("{}\n", run.result.to_json()))
}
