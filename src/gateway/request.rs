//! One request through the gateway: digest, classify, admit / queue / reject, and release
//! when the upstream's response ends (or the stream does).

use super::host::{pairs, Action, Body, HeaderMap, Host};
use super::stats::{Flow, EXTRA_NONE, M};
use super::watch_limits;
use super::worker::{self, Extra, Hold, Local, Worker};
use crate::digest::identity::{IdentityConfig, IdentityInput, IdentitySource};
use crate::digest::initial_events::MarkerScanner;
use crate::digest::list_size::ListBodyScanner;
use crate::digest::request_info::RequestInfo;
use crate::digest::work_estimate::{ClusterStats, StatsLookup, WatchInit};
use crate::engine::compiled::{Digest, RequestLine};
use crate::engine::object_counts::SharedCounts;
use crate::engine::requests::Phase;
use crate::engine::{self, debug, Arriving, Compiled, Decision, Notice};
use crate::fairqueuing::RequestTag;
use crate::Nanos;
use serde_json::Value;
use std::rc::Rc;

/// The gateway's state of one stream.
#[derive(Default)]
pub struct Request {
    /// The host's id of the stream.
    pub ctx: u32,
    /// The configuration the request is classified under (`None`: none applied yet).
    pub compiled: Option<Rc<Compiled>>,
    /// A classified request, for the PF response headers (`x-apf-seats`: the seats charged);
    /// `None` for a request answered here (429, debug dump).
    class: Option<Extra>,
    /// A WATCH: its request, how its initial phase ends, and the counts it was costed with.
    watch: Option<(RequestInfo, WatchInit, Option<StatsLookup>)>,
    /// The WATCH holds its seats while its initial state streams (body chunks are inspected).
    holding: bool,
    /// A LIST of a resource without counts whose response may teach its cost (resource key).
    learn: Option<(String, ListBodyScanner)>,
}

impl Request {
    /// A new stream `ctx` under the configuration `compiled`.
    pub fn new(ctx: u32, compiled: Option<Rc<Compiled>>) -> Request {
        Request { ctx, compiled, ..Request::default() }
    }

    /// Whether the stream is a WATCH holding its seats through its initial phase.
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// At a WATCH's response headers: hold its seats while its initial state streams, or
    /// release them now (no initial events, not admitted here, or not a watch stream).
    fn start_watch(&mut self, h: &dyn Host, w: &mut Worker, max_hold: crate::Nanos) {
        let Some((info, init, stats)) = self.watch.take() else { return };
        let now = h.monotonic_nanos();
        if init != WatchInit::None && w.request(self.ctx).is_some_and(|l| l.phase == Phase::Executing) {
            let (ok, _, identity) = response(h);
            if ok {
                let expected_bytes = match stats {
                    Some(StatsLookup::Found(s)) if s.count > 0 && s.average_object_size_bytes > 0 => {
                        u64::try_from(s.count.saturating_mul(s.average_object_size_bytes)).ok()
                    }
                    _ => None,
                };
                // The bookmark's bytes are not visible in a compressed stream.
                let marker = (init == WatchInit::Bookmark && identity).then(MarkerScanner::new);
                let deadline = now.saturating_add(max_hold);
                let hold = Hold { deadline, last_data: now, bytes: 0, expected_bytes, marker, info };
                w.hold(self.ctx, hold);
                self.holding = true;
                return;
            }
        }
        w.end_watch_init(h, self.ctx, now, Some(&info));
    }

    /// The request's headers: digest, classify, and admit, queue or reject it.
    pub fn on_request_headers(&mut self, h: &dyn Host, w: &mut Worker) -> Action {
        match self.compiled.clone() {
            Some(c) => self.admit(h, w, c),
            None => Action::Continue,
        }
    }

    /// Admission in four steps: the answers given here (leave, 403, dumps; identity headers
    /// written first), the request's class and bookkeeping, registration and the engine's
    /// decision, and what the decision makes of the stream. The digest is written over the
    /// worker's last one (its buffers reused) and given back.
    fn admit(&mut self, h: &dyn Host, w: &mut Worker, rc: Rc<Compiled>) -> Action {
        let c: &Compiled = &rc;
        let now = h.monotonic_nanos();
        let mut digested = w.take_digest();
        let counts = w.counts();
        let cluster = |group: &str, resource: &str| cluster_lookup(c, counts, group, resource, now);
        digest_request_into(h, c, &cluster, &mut digested);
        let action = match local_answer(h, c, &digested, now) {
            Some(answered) => answered,
            None => self.decide(h, w, &rc, &digested.digest, now),
        };
        w.keep_digest(digested);
        action
    }

    /// Classification, registration and the engine's decision for a request not answered
    /// here.
    fn decide(&mut self, h: &dyn Host, w: &mut Worker, rc: &Rc<Compiled>, d: &Digest, now: Nanos) -> Action {
        let Some(extra) = self.classify(rc, d) else { return Action::Continue };
        if let Some(refused) = admit_watch(h, w, self.ctx, d, &extra, now) {
            self.class = None;
            return refused;
        }
        let Some((decision, notices)) = self.enter(h, w, d, &extra, now) else { return Action::Continue };
        let action = self.act(h, w, &extra, decision);
        if self.class.is_none() {
            // Rejected by APF: a watch's place is not kept for a stream answered here.
            w.release_watch_place(h, self.ctx);
        }
        w.route(h, notices, now);
        action
    }

    /// The request's class (`None`: not queued here, i.e. long-running or no level), and the
    /// stream's bookkeeping: PF headers (no seats charged until admitted), what its response
    /// may teach, its watch.
    fn classify(&mut self, rc: &Rc<Compiled>, d: &Digest) -> Option<Extra> {
        let c: &Compiled = rc;
        if d.long_running && !d.is_watch {
            return None;
        }
        let level = c.levels.get(d.class.priority_level)?;
        let explain = !c.config.explain_groups.is_empty() && d.user.groups.iter().any(|g| c.config.explain_groups.contains(g));
        let (pl, fs, seats) = (d.class.priority_level, d.class.flow_schema, d.work.max_seats());
        let extra = Extra { explain, enforce: level.enforce, compiled: rc.clone(), pl, fs, seats, is_watch: d.is_watch };
        self.class = Some(Extra { seats: 0, ..extra.clone() });
        let key = || engine::object_counts::resource_key(&d.info.api_group, &d.info.resource);
        let learn = c.config.work_estimator.learn_from_responses;
        self.learn = (learn && d.stats == Some(StatsLookup::NotFound) && learnable(&d.info)).then(|| (key(), ListBodyScanner::new()));
        self.watch = d.is_watch.then(|| (d.info.clone(), d.watch_init, d.stats));
        Some(extra)
    }

    /// Registers the worker and asks the engine: its decision (tracked in the worker's table
    /// when the request takes or awaits seats) and the notices to route; `None` when the worker
    /// cannot register (the request passes).
    fn enter(&mut self, h: &dyn Host, w: &mut Worker, d: &Digest, extra: &Extra, now: Nanos) -> Option<(Admitted, Vec<Notice>)> {
        let Some(slot) = w.ensure_registered(h, now) else {
            log::warn!("apf: worker not registered; letting the request through");
            return None;
        };
        self.class = Some(extra.clone());
        let c: &Compiled = &extra.compiled;
        w.note_levels(c);
        let tag = RequestTag {
            owner: slot,
            context: self.ctx,
            flow_schema: u16::try_from(d.class.flow_schema).unwrap_or(u16::MAX),
            flow_hash: d.class.flow_hash,
            wait_deadline: now.saturating_add(d.wait_limit),
        };
        let mut notices = Vec::new();
        let decision = engine::admit(c, h.store(), now, Arriving { level: d.class.priority_level, work: d.work, tag }, &mut notices);
        let level = c.levels.get(extra.pl).map(|l| l.key.clone());
        let admitted =
            decision.as_ref().ok().zip(level).and_then(|((d, _), key)| Local::admitted(key, d, now, tag.wait_deadline, extra.clone()));
        if let Some(e) = admitted {
            w.track(self.ctx, e);
        }
        Some((decision, notices))
    }

    /// What the engine's decision makes of the stream (dry run: accounted as queued or
    /// rejected, but let through).
    fn act(&mut self, h: &dyn Host, w: &mut Worker, extra: &Extra, decision: Admitted) -> Action {
        let stop = if extra.enforce { Action::Pause } else { Action::Continue };
        extra.record(w.stats(), |f| record_admission(f, extra, &decision));
        match decision {
            Ok((Decision::Execute(_), _)) => Action::Continue,
            Ok((Decision::Queued(_), _)) => stop,
            Ok((Decision::Rejected { reason, retry_after }, _)) => {
                if extra.enforce {
                    self.class = None;
                    worker::send_429(h, extra, retry_after, reason.as_str());
                }
                stop
            }
            Err(e) => {
                log::warn!("apf: admission failed, letting the request through: {e}");
                Action::Continue
            }
        }
    }

    /// Feeds a LIST response chunk to the learning scanner; at the end, stores what it learned.
    fn learn_from(&mut self, h: &dyn Host, body_size: usize, end_of_stream: bool) {
        let Some((key, mut scanner)) = self.learn.take() else { return };
        let Some(chunk) = h.body_bytes(Body::Response, 0, body_size) else { return };
        scanner.feed(&chunk);
        if !end_of_stream {
            return self.learn = Some((key, scanner));
        }
        let Some(stats) = scanner.finish().map(|obs| obs.stats()) else { return };
        log::debug!("apf: learned {key}: {} objects of {} bytes from a LIST response", stats.count, stats.average_object_size_bytes);
        if let Err(e) = engine::object_counts::learn(h.store(), h.monotonic_nanos(), &key, stats) {
            log::warn!("apf: storing a learned object count failed: {e}");
        }
    }

    /// The upstream's response has ended (the apiserver's handler returned): the request's
    /// seats are free, whether or not the client has read the response. Upstream frees them
    /// when the handler returns (`priority-and-fairness.go: priorityAndFairnessHandler.Handle`,
    /// the `execute` closure), so a client that never reads (an HTTP/2 stream with a zero
    /// window, open downstream long after this) cannot keep them. A watch that ends closes.
    fn upstream_ended(&mut self, h: &dyn Host, w: &mut Worker) {
        self.holding = false;
        w.stream_ended(h, self.ctx);
    }

    fn response_headers(&mut self, h: &dyn Host, w: &mut Worker) -> Action {
        let Some(x) = self.class.clone() else { return Action::Continue };
        if w.was_rejected(self.ctx) {
            return Action::Continue;
        }
        for (k, v) in worker::pf_headers(&x) {
            h.add_header(HeaderMap::Response, k, v);
        }
        if x.explain {
            let waited = w.request(self.ctx).map_or(0, |l| l.waited);
            h.add_header(HeaderMap::Response, "x-apf-queued-ms", (waited / 1_000_000).to_string().as_bytes());
            h.add_header(HeaderMap::Response, "x-apf-seats", x.seats.to_string().as_bytes());
        }
        // The learning scanner reads only `200` uncompressed JSON responses.
        if self.learn.is_some() && response(h) != (true, true, true) {
            self.learn = None;
        }
        // A WATCH holds its seats while it initializes (upstream: until the storage layer
        // signals that its initial events were sent); from then on it counts as an open
        // watch for the mutating-request estimator.
        self.start_watch(h, w, x.compiled.config.watch_initial_events_max_hold);
        Action::Continue
    }

    /// A chunk of a held WATCH's initial state (not the stream's end): ends the initial phase
    /// at the initial-events bookmark or, unmarked, at the expected size.
    fn watch_data(&mut self, h: &dyn Host, w: &mut Worker, body_size: usize) {
        let now = h.monotonic_nanos();
        let ended = w.held(self.ctx).map(|hold| {
            hold.last_data = now;
            hold.bytes = hold.bytes.saturating_add(body_size as u64);
            match hold.marker.as_mut() {
                Some(m) => h.body_bytes(Body::Response, 0, body_size).is_some_and(|chunk| m.feed(&chunk)),
                None => hold.expected_bytes.is_some_and(|e| hold.bytes >= e),
            }
        });
        // `None`: released meanwhile (maximum hold time, or the quiet rule on the timer).
        self.holding = ended == Some(false);
        if ended == Some(true) {
            w.end_watch_init(h, self.ctx, now, None);
        }
    }

    /// The response's headers (`end`: the response has no body).
    pub fn on_response_headers(&mut self, h: &dyn Host, w: &mut Worker, end: bool) -> Action {
        let action = self.response_headers(h, w);
        if end {
            self.upstream_ended(h, w);
        }
        action
    }

    /// A chunk of the response body (`end_of_stream`: the last).
    pub fn on_response_body(&mut self, h: &dyn Host, w: &mut Worker, body_size: usize, end_of_stream: bool) -> Action {
        self.learn_from(h, body_size, end_of_stream);
        if end_of_stream {
            self.upstream_ended(h, w);
        } else if self.holding {
            self.watch_data(h, w, body_size);
        }
        Action::Continue
    }

    /// The response's trailers: its end.
    pub fn on_response_trailers(&mut self, h: &dyn Host, w: &mut Worker) -> Action {
        self.upstream_ended(h, w);
        Action::Continue
    }

    /// The stream is done (logged, or destroyed): whatever it still holds is released.
    pub fn on_stream_end(&mut self, h: &dyn Host, w: &mut Worker) {
        w.stream_ended(h, self.ctx);
    }
}

/// The engine's answer to an arriving request: its decision, and its queue's length after it
/// was enqueued (`None`: not enqueued).
type Admitted = Result<(Decision, Option<u32>), engine::EngineError>;

/// The stats of an admission, under one lock: the request's estimated seats, its queue's length
/// after it was enqueued ([`M::QueueLengthAfterEnqueue`]), then what the decision makes of it.
fn record_admission(f: &mut Flow<'_>, extra: &Extra, decision: &Admitted) {
    f.observe(M::WorkEstimatedSeats, EXTRA_NONE, f64::from(extra.seats));
    if let Ok((_, Some(length))) = decision {
        f.observe(M::QueueLengthAfterEnqueue, EXTRA_NONE, f64::from(*length));
    }
    match decision {
        Ok((Decision::Execute(_), _)) => extra.dispatched(f, 0),
        Ok((Decision::Queued(_), _)) => extra.queued(f, 1),
        Ok((Decision::Rejected { reason, .. }, _)) => {
            f.add(M::Rejected, reason.as_str(), 1);
            f.observe(M::WaitDuration, "false", 0.0);
        }
        Err(_) => {}
    }
}

/// The content headers of the gateway's own JSON responses.
const JSON: [(&str, &[u8]); 2] = [("content-type", b"application/json"), ("x-content-type-options", b"nosniff")];

/// The answers given here, before admission: the fleet leave request, a refused identity
/// (`403`), the debug dumps; `None`: the request goes on to admission. The identity headers are
/// written before any dump (and any later early return: exempt, long-running), so the upstream
/// sees only the identity derived here on every request this filter lets through.
fn local_answer(h: &dyn Host, c: &Compiled, d: &Digested, now: Nanos) -> Option<Action> {
    if d.leave && c.config.fleet.is_some() {
        let ends = [["source", "address"], ["destination", "address"]].map(|p| h.property(&p).and_then(|b| parse_peer(&b)));
        let (status, body) = super::fleet::leave_request(h, ends, now);
        h.send_response(status, &JSON, body.as_bytes());
        return Some(Action::Pause);
    }
    // setFrontProxyHeaders (nothing to change without it): when a verified credential names a
    // user that cannot be forwarded, the request is refused and never reaches the upstream.
    if let Some(why) = d.refuse.as_deref() {
        log::debug!("apf: refused: {why}");
        let body = crate::digest::identity::forbidden_status(why);
        h.send_response(403, &JSON, body.as_bytes());
        return Some(Action::Pause);
    }
    for name in &d.remove {
        h.remove_header(HeaderMap::Request, name);
    }
    for (k, v) in &d.add {
        h.add_header(HeaderMap::Request, k, v.as_bytes());
    }
    let debug_caller = || d.digest.user.groups.iter().any(|g| c.config.debug_groups.contains(g));
    let kind = d.dump.filter(|_| debug_caller())?;
    if kind == debug::DumpKind::Fleet {
        let body = super::fleet::render_dump(h.store(), now);
        h.send_response(200, &JSON, body.as_bytes());
        return Some(Action::Pause);
    }
    let offset = h.realtime_nanos().saturating_sub(now);
    let body = debug::render(c, h.store(), kind, now, &|t| t.saturating_add(offset));
    h.send_response(200, &worker::TEXT_PLAIN, body.as_bytes());
    Some(Action::Pause)
}

/// A request as the gateway reads it from its host: what it changes in the request's identity
/// headers on the way upstream, and its digest.
#[derive(Default)]
pub struct Digested {
    /// Request headers to remove (untrusted identity headers, client-supplied front-proxy ones).
    pub remove: Vec<String>,
    /// Front-proxy identity headers to add (`setFrontProxyHeaders`).
    pub add: Vec<(String, String)>,
    /// A verified credential names a user that cannot be forwarded: refuse with this reason.
    pub refuse: Option<String>,
    /// The path is a debug dump's (served only to `debugGroups`).
    pub dump: Option<debug::DumpKind>,
    /// `POST /apf-wasm/fleet/leave` (answered here in fleet mode, loopback peers only).
    pub leave: bool,
    pub digest: Digest,
}

/// Reads the current request from the host (headers, and the connection facts and JWT claims
/// its identity sources need) and digests it: RequestInfo, identity, classification, work
/// estimate (LISTs and WATCHes with the object counts `cluster` gives), wait limit. The filter
/// and `apf classify` run this same function.
pub fn digest_request(h: &dyn Host, c: &Compiled, cluster: ClusterStats) -> Digested {
    let mut out = Digested::default();
    digest_request_into(h, c, cluster, &mut out);
    out
}

/// [`digest_request`] written over `out` (every field rewritten, its strings' buffers reused).
pub fn digest_request_into(h: &dyn Host, c: &Compiled, cluster: ClusterStats, out: &mut Digested) {
    let mut read = false;
    h.with_header_pairs(HeaderMap::Request, &mut |headers| {
        digest_headers(h, c, cluster, headers, out);
        read = true;
    });
    if !read {
        digest_headers(h, c, cluster, &[], out);
    }
}

/// [`digest_request_into`] over the request's header pairs.
fn digest_headers(h: &dyn Host, c: &Compiled, cluster: ClusterStats, headers: &[(&str, &[u8])], out: &mut Digested) {
    let last = |name: &str| headers.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let (method, path) = (last(":method").unwrap_or(b"GET"), last(":path").unwrap_or(b"/"));
    let wanted = |k: &str| c.identity_headers.iter().any(|n| n == k) || c.identity_prefixes.iter().any(|p| k.starts_with(p.as_str()));
    let (mut stack, mut heap) = ([("", &[][..]); STACK_IDENTITY_HEADERS], Vec::new());
    let identity_headers = select(headers, wanted, &mut stack, &mut heap);
    let ns_header = c.config.namespace_header.as_deref().and_then(|n| headers.iter().find(|(k, _)| *k == n)).map(|(_, v)| *v);
    // Facts about the downstream connection that identity sources may need.
    let peer = if c.needs.peer { h.property(&["source", "address"]).and_then(|b| parse_peer(&b)) } else { None };
    let mtls = c.needs.mtls && h.property(&["connection", "mtls"]).is_some_and(|b| b.first().is_some_and(|&m| m != 0));
    let subject = || h.property(&["connection", "subject_peer_certificate"]).and_then(|b| String::from_utf8(b).ok());
    let cert_subject = (c.needs.cert_subject && mtls).then(subject).flatten();
    let jwt_claims = if c.needs.jwt { jwt_claims(h, &c.config.identity) } else { None };
    let input =
        IdentityInput { headers: identity_headers, peer, mtls, cert_subject: cert_subject.as_deref(), jwt_claims: jwt_claims.as_ref() };
    let mut remove = if c.needs.strip { c.config.identity.headers_to_strip(&input) } else { Vec::new() };
    // The identity is derived once: forwarded (`setFrontProxyHeaders`) and classified.
    let identified = c.config.identity.identified(&input);
    let fwd = identified.front_proxy_headers(&input, headers.iter().map(|(k, v)| (*k, *v)));
    remove.extend(fwd.remove);
    let watch_count = |info: &RequestInfo| engine::watches::interested_count(h.store(), info);
    let line = RequestLine { method, path, namespace_header: ns_header };
    identified.user_into(&mut out.digest.user);
    c.digest_into(line, watch_count, cluster, &mut out.digest);
    let leave = method == b"POST" && path.split(|&b| b == b'?').next() == Some(super::fleet::LEAVE_PATH.as_bytes());
    (out.remove, out.add, out.refuse) = (remove, fwd.add, fwd.refuse);
    // Only a path under the debug prefix can be a dump (the path is not decoded again for the
    // others).
    let dump = path.starts_with(debug::DEBUG_PREFIX.as_bytes()).then(|| debug::dump_kind(path)).flatten();
    (out.dump, out.leave) = (dump, leave);
}

/// Identity headers a request carries at most without a vector allocated for them.
const STACK_IDENTITY_HEADERS: usize = 16;

/// The headers `keep` wants, in order: in `stack` when they fit, else collected into `heap`.
fn select<'b, 'a, 'v>(
    headers: &[(&'a str, &'v [u8])],
    keep: impl Fn(&str) -> bool,
    stack: &'b mut [(&'a str, &'v [u8]); STACK_IDENTITY_HEADERS],
    heap: &'b mut Vec<(&'a str, &'v [u8])>,
) -> &'b [(&'a str, &'v [u8])] {
    let mut n = 0;
    for &(k, v) in headers.iter().filter(|(k, _)| keep(k)) {
        match stack.get_mut(n) {
            Some(slot) => *slot = (k, v),
            None => {
                heap.extend(stack.iter().copied());
                heap.extend(headers.iter().filter(|(k, _)| keep(k)).skip(n).copied());
                return heap;
            }
        }
        n += 1;
    }
    stack.get(..n).unwrap_or_default()
}

/// The object counts of a resource as the gateway has them: polled from the cluster
/// (`clusterMetrics`, stale after `staleAfter`), or learned from LIST responses.
fn cluster_lookup(c: &Compiled, counts: Option<&SharedCounts>, group: &str, resource: &str, now: Nanos) -> StatsLookup {
    let stale_after = c.config.cluster_metrics.as_ref().map(|m| m.stale_after);
    match (stale_after, c.config.work_estimator.learn_from_responses) {
        (None, false) => StatsLookup::NotFound,
        (Some(stale_after), _) => counts.map_or(StatsLookup::NotFound, |s| s.lookup(group, resource, now, stale_after)),
        (None, true) => counts.map_or(StatsLookup::NotFound, |s| s.learned_lookup(group, resource, now)),
    }
}

/// A LIST whose response is the whole collection: every namespace, no selector, no name, not a
/// continued page.
fn learnable(info: &RequestInfo) -> bool {
    let q = &info.query;
    info.verb == "list"
        && info.namespace.is_empty()
        && info.name.is_empty()
        && q.label_selector.is_empty()
        && q.field_selector.is_empty()
        && q.continue_token.is_empty()
}

/// What the response headers say about the body: (`:status` 200, JSON, not compressed (no
/// `content-encoding` but `identity`)).
fn response(h: &dyn Host) -> (bool, bool, bool) {
    let (mut ok, mut json, mut identity) = (false, false, true);
    h.with_header_pairs(HeaderMap::Response, &mut |headers| {
        for &(k, v) in headers {
            match k {
                ":status" => ok = v == b"200",
                "content-type" => json = v.windows(4).any(|w| w.eq_ignore_ascii_case(b"json")),
                "content-encoding" if !v.eq_ignore_ascii_case(b"identity") => identity = false,
                _ => {}
            }
        }
    });
    (ok, json, identity)
}

/// `source.address` is `ip:port` (`[v6]:port` for IPv6).
fn parse_peer(b: &[u8]) -> Option<std::net::IpAddr> {
    let s = std::str::from_utf8(b).ok()?;
    s.parse::<std::net::SocketAddr>().map(|sa| sa.ip()).or_else(|_| s.parse()).ok()
}

/// The claims a `jwt` source needs, read as leaf properties of the jwt_authn filter's dynamic
/// metadata (`metadata.filter_metadata["envoy.filters.http.jwt_authn"][<metadataKey>][<claim>]`;
/// Envoy serializes leaf strings, not whole structs). A list claim arrives as the host's pair
/// serialization or as a string; both are handled.
fn jwt_claims(h: &dyn Host, cfg: &IdentityConfig) -> Option<Value> {
    let jwt = cfg.sources.iter().find(|s| matches!(s, IdentitySource::Jwt { .. }));
    let Some(IdentitySource::Jwt { metadata_key: key, user_claim, groups_claim, .. }) = jwt else { return None };
    let get = |claim: &str| h.property(&["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", key.as_str(), claim]);
    let user = get(user_claim).and_then(|b| String::from_utf8(b).ok())?;
    let b = get(groups_claim).unwrap_or_default();
    let pairs = pairs(&b);
    // A list arrives as the host's pair serialization: all the pairs its count announces (an
    // empty list is just a zero count); anything else is the claim's string form.
    let count = b.get(..4).and_then(|c| c.try_into().ok()).map(u32::from_le_bytes);
    let is_list = count.is_some_and(|n| usize::try_from(n).is_ok_and(|n| n == pairs.len()));
    let groups: Vec<Value> = if !is_list {
        String::from_utf8_lossy(&b).split(',').map(str::trim).filter(|g| !g.is_empty()).map(Value::from).collect()
    } else {
        pairs.iter().map(|(k, _)| Value::from(*k)).collect()
    };
    Some(serde_json::json!({ user_claim.as_str(): user, groups_claim.as_str(): groups }))
}

/// Takes the arriving WATCH `ctx`'s place, or refuses it: the 429 sent (`Some`; in dry run the
/// refusal is only counted). Any failure of the shared state lets the watch through.
fn admit_watch(h: &dyn Host, w: &mut Worker, ctx: u32, d: &Digest, extra: &Extra, now: Nanos) -> Option<Action> {
    let (place, limit) = watch_limits::place_of(&extra.compiled, d)?;
    let slot = w.ensure_registered(h, now)?;
    let over = match engine::watch_limits::acquire(h.store(), slot, &place, limit) {
        Ok(None) => {
            w.keep_watch_place(ctx, place);
            return None;
        }
        Ok(Some(over)) => over,
        Err(e) => {
            log::warn!("apf: open-watch limit check failed, letting the watch through: {e}");
            return None;
        }
    };
    log::debug!("apf: watch of flow {:016x} on {} refused: {}", place.flow_hash, place.level, watch_limits::describe(over));
    extra.add(w.stats(), M::Rejected, watch_limits::WATCH_LIMIT, 1);
    if !extra.enforce {
        return None;
    }
    let key = extra.compiled.levels.get(extra.pl).map(|l| l.key.clone())?;
    worker::send_429(h, extra, engine::watch_limits::refused(h.store(), now, &key), watch_limits::WATCH_LIMIT);
    Some(Action::Pause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_headers_keep_their_order_on_the_stack_and_beyond_it() {
        let names: Vec<String> = (0..40).map(|i| format!("x-{i}")).collect();
        let headers: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), n.as_bytes())).collect();
        for (len, keep_every) in [(0, 1), (5, 1), (40, 2), (40, 1)] {
            let keep = |k: &str| k.trim_start_matches("x-").parse::<usize>().is_ok_and(|i| i % keep_every == 0);
            let want: Vec<(&str, &[u8])> = headers.iter().take(len).filter(|(k, _)| keep(k)).copied().collect();
            let (mut stack, mut heap) = ([("", &[][..]); STACK_IDENTITY_HEADERS], Vec::new());
            assert_eq!(select(headers.get(..len).unwrap(), keep, &mut stack, &mut heap), want.as_slice());
        }
    }
}
