//! An in-memory proxy for the gateway: one process ([`Proxy`]: shared data, shared queues,
//! stats, the clock, HTTP calls) and its workers ([`Node`]: a [`MockHost`], the worker's state
//! and one root), so every path of the filter runs natively. Streams are driven by hand:
//! `request` runs the request-headers callback, `respond` the response callbacks, `close` the
//! end of a stream; paused streams are resumed or answered by the gateway through the host,
//! which records it on the stream. Like Envoy, the host applies a resume or a local reply after
//! the callback returns (here: it only records them).
#![allow(dead_code)]

use apf_wasm::engine::store::{MemStore, SetOutcome, Store, StoreError, WorkerState};
use apf_wasm::gateway::host::{pairs, serialize_pairs, Action, Body, CallError, HeaderMap, Host, StatKind};
use apf_wasm::gateway::{Request, Root, Worker};
use apf_wasm::Nanos;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

/// A local reply the gateway sent on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One stream as the proxy sees it.
#[derive(Debug, Default, Clone)]
pub struct Stream {
    pub request_headers: Vec<(String, Vec<u8>)>,
    pub response_headers: Vec<(String, Vec<u8>)>,
    /// The response body chunk being delivered.
    pub body_chunk: Vec<u8>,
    pub properties: HashMap<String, Vec<u8>>,
    pub reply: Option<Reply>,
    /// Resumed by the gateway after a pause.
    pub resumed: bool,
    /// The stream is gone (closed by the client): calls on it fail.
    pub gone: bool,
}

impl Stream {
    pub fn request_header(&self, name: &str) -> Vec<String> {
        let v = self.request_headers.iter().filter(|(k, _)| k == name);
        v.map(|(_, v)| String::from_utf8_lossy(v).into_owned()).collect()
    }
    pub fn response_header(&self, name: &str) -> Option<String> {
        let v = self.response_headers.iter().rev().find(|(k, _)| k == name);
        v.map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// An HTTP call the gateway started.
#[derive(Debug, Clone)]
pub struct Call {
    pub token: u32,
    pub worker: usize,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

impl Call {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP call response: headers, body.
type CallResponse = (Vec<(String, Vec<u8>)>, Vec<u8>);

/// The process: shared by every worker.
pub struct Proxy {
    pub store: MemStore,
    pub now: Cell<Nanos>,
    /// Shared queues: id − 1 → (name, messages).
    queues: RefCell<Vec<(String, VecDeque<Vec<u8>>)>>,
    /// Stats by name: (kind, value).
    pub stats: RefCell<BTreeMap<String, (StatKind, i64)>>,
    stat_names: RefCell<Vec<String>>,
    pub calls: RefCell<Vec<Call>>,
    next_token: Cell<u32>,
    /// The HTTP call response being delivered.
    call_response: RefCell<CallResponse>,
    /// Stream ids are unique in the process.
    next_context: Cell<u32>,
}

impl Proxy {
    pub fn new() -> Rc<Proxy> {
        Rc::new(Proxy {
            store: MemStore::new(),
            now: Cell::new(1_000_000_000),
            queues: RefCell::new(Vec::new()),
            stats: RefCell::new(BTreeMap::new()),
            stat_names: RefCell::new(Vec::new()),
            calls: RefCell::new(Vec::new()),
            next_token: Cell::new(1),
            call_response: RefCell::new((Vec::new(), Vec::new())),
            next_context: Cell::new(100),
        })
    }

    pub fn advance(&self, d: Duration) {
        self.now.set(self.now.get() + d.as_nanos() as Nanos);
    }

    /// A stat's value (0 if undefined).
    pub fn stat(&self, name: &str) -> i64 {
        self.stats.borrow().get(name).map_or(0, |(_, v)| *v)
    }

    /// Whether the stat `name` was defined.
    pub fn has_stat(&self, name: &str) -> bool {
        self.stats.borrow().contains_key(name)
    }

    /// Messages waiting in the queue `name`.
    pub fn queued_messages(&self, name: &str) -> usize {
        self.queues.borrow().iter().find(|(n, _)| n == name).map_or(0, |(_, q)| q.len())
    }
}

/// One worker's view of the shared data: the shared values and its own engine state.
struct View {
    proxy: Rc<Proxy>,
    state: WorkerState,
}

impl Store for View {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.proxy.store.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.proxy.store.set(key, value, cas)
    }
    fn worker(&self) -> Option<&WorkerState> {
        Some(&self.state)
    }
}

/// One worker's host.
pub struct MockHost {
    pub proxy: Rc<Proxy>,
    pub index: usize,
    view: View,
    /// The stream the running callback is about (the effective context).
    current: Cell<u32>,
    pub streams: RefCell<HashMap<u32, Stream>>,
    /// The configuration being applied.
    pub configuration: RefCell<Vec<u8>>,
    pub tick_ms: Cell<u32>,
}

impl MockHost {
    fn with_stream<T>(&self, f: impl FnOnce(&mut Stream) -> T) -> Option<T> {
        let mut s = self.streams.borrow_mut();
        s.get_mut(&self.current.get()).filter(|s| !s.gone).map(f)
    }
}

impl Host for MockHost {
    fn monotonic_nanos(&self) -> Nanos {
        self.proxy.now.get()
    }
    fn realtime_nanos(&self) -> Nanos {
        1_700_000_000_000_000_000 + self.proxy.now.get()
    }
    fn store(&self) -> &dyn Store {
        &self.view
    }
    fn header_map_bytes(&self, map: HeaderMap) -> Vec<u8> {
        let encode = |h: &[(String, Vec<u8>)]| {
            let h: Vec<(&str, &[u8])> = h.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
            serialize_pairs(&h)
        };
        match map {
            HeaderMap::Request => self.with_stream(|s| encode(&s.request_headers)).unwrap_or_default(),
            HeaderMap::Response => self.with_stream(|s| encode(&s.response_headers)).unwrap_or_default(),
            HeaderMap::CallResponse => encode(&self.proxy.call_response.borrow().0),
        }
    }
    fn add_header(&self, map: HeaderMap, name: &str, value: &[u8]) -> bool {
        self.with_stream(|s| match map {
            HeaderMap::Request => s.request_headers.push((name.to_string(), value.to_vec())),
            HeaderMap::Response => s.response_headers.push((name.to_string(), value.to_vec())),
            HeaderMap::CallResponse => {}
        })
        .is_some()
    }
    fn remove_header(&self, map: HeaderMap, name: &str) -> bool {
        self.with_stream(|s| match map {
            HeaderMap::Request => s.request_headers.retain(|(k, _)| k != name),
            HeaderMap::Response => s.response_headers.retain(|(k, _)| k != name),
            HeaderMap::CallResponse => {}
        })
        .is_some()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.with_stream(|s| s.properties.get(&path.join(".")).cloned()).flatten()
    }
    fn body_bytes(&self, body: Body, start: usize, max: usize) -> Option<Vec<u8>> {
        let slice = |b: &[u8]| b.get(start.min(b.len())..start.saturating_add(max).min(b.len())).map(<[u8]>::to_vec);
        match body {
            Body::Response => self.with_stream(|s| slice(&s.body_chunk)).flatten(),
            Body::CallResponse => slice(&self.proxy.call_response.borrow().1),
            Body::Configuration => slice(&self.configuration.borrow()),
        }
    }
    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
        let headers = headers.iter().map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into_owned())).collect();
        let reply = Reply { status, headers, body: String::from_utf8_lossy(body).into_owned() };
        self.with_stream(|s| s.reply = Some(reply)).is_some()
    }
    fn set_effective_context(&self, context: u32) -> bool {
        let live = self.streams.borrow().get(&context).is_some_and(|s| !s.gone);
        if live {
            self.current.set(context);
        }
        live
    }
    fn resume_request(&self) -> bool {
        self.with_stream(|s| s.resumed = true).is_some()
    }
    fn register_queue(&self, name: &str) -> Result<u32, u32> {
        let mut q = self.proxy.queues.borrow_mut();
        if let Some(i) = q.iter().position(|(n, _)| n == name) {
            return Ok(i as u32 + 1);
        }
        q.push((name.to_string(), VecDeque::new()));
        Ok(q.len() as u32)
    }
    fn resolve_queue(&self, name: &str) -> Option<u32> {
        self.proxy.queues.borrow().iter().position(|(n, _)| n == name).map(|i| i as u32 + 1)
    }
    fn enqueue(&self, queue: u32, msg: &[u8]) -> bool {
        let mut q = self.proxy.queues.borrow_mut();
        q.get_mut(queue as usize - 1).map(|(_, q)| q.push_back(msg.to_vec())).is_some()
    }
    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, u32> {
        let mut q = self.proxy.queues.borrow_mut();
        q.get_mut(queue as usize - 1).map(|(_, q)| q.pop_front()).ok_or(1)
    }
    fn define_metric(&self, kind: StatKind, name: &str) -> Option<u32> {
        let mut names = self.proxy.stat_names.borrow_mut();
        self.proxy.stats.borrow_mut().entry(name.to_string()).or_insert((kind, 0));
        if let Some(i) = names.iter().position(|n| n == name) {
            return Some(i as u32);
        }
        names.push(name.to_string());
        Some(names.len() as u32 - 1)
    }
    fn increment_metric(&self, id: u32, by: i64) {
        if let Some(n) = self.proxy.stat_names.borrow().get(id as usize) {
            if let Some(e) = self.proxy.stats.borrow_mut().get_mut(n) {
                e.1 += by;
            }
        }
    }
    fn record_metric(&self, id: u32, value: u64) {
        if let Some(n) = self.proxy.stat_names.borrow().get(id as usize) {
            if let Some(e) = self.proxy.stats.borrow_mut().get_mut(n) {
                e.1 = value as i64;
            }
        }
    }
    fn http_call(&self, cluster: &str, headers: &[(&str, &str)], body: &[u8], timeout: Duration) -> Result<u32, CallError> {
        let token = self.proxy.next_token.get();
        self.proxy.next_token.set(token + 1);
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.proxy.calls.borrow_mut().push(Call {
            token,
            worker: self.index,
            cluster: cluster.to_string(),
            headers,
            body: body.to_vec(),
            timeout,
        });
        Ok(token)
    }
    fn set_tick_period_ms(&self, ms: u32) -> bool {
        self.tick_ms.set(ms);
        true
    }
}

/// One worker: its host, its state, its root (one configuration) and its streams' gateway state.
pub struct Node {
    pub host: MockHost,
    pub worker: Worker,
    pub root: Root,
    pub requests: HashMap<u32, Request>,
}

impl Node {
    pub fn new(proxy: &Rc<Proxy>, index: usize) -> Node {
        let host = MockHost {
            proxy: proxy.clone(),
            index,
            view: View { proxy: proxy.clone(), state: WorkerState::new() },
            current: Cell::new(0),
            streams: RefCell::new(HashMap::new()),
            configuration: RefCell::new(Vec::new()),
            tick_ms: Cell::new(0),
        };
        Node { host, worker: Worker::new(index as u64 + 1), root: Root::default(), requests: HashMap::new() }
    }

    /// Applies a configuration (as Envoy's `on_configure`).
    pub fn configure(&mut self, config: &str) -> bool {
        *self.host.configuration.borrow_mut() = config.as_bytes().to_vec();
        self.root.on_configure(&self.host, config.as_bytes())
    }

    /// A new stream with `headers` (`:method`, `:path`, …) and `properties`; its request
    /// headers run through the gateway. Returns the stream's id and the gateway's action.
    pub fn request(&mut self, headers: &[(&str, &str)], properties: &[(&str, &[u8])]) -> (u32, Action) {
        let ctx = self.host.proxy.next_context.get();
        self.host.proxy.next_context.set(ctx + 1);
        let s = Stream {
            request_headers: headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect(),
            properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect(),
            ..Stream::default()
        };
        self.host.streams.borrow_mut().insert(ctx, s);
        self.host.current.set(ctx);
        let mut r = self.root.new_request(ctx);
        let action = r.on_request_headers(&self.host, &mut self.worker);
        self.requests.insert(ctx, r);
        (ctx, action)
    }

    /// The upstream's response on `ctx`: headers, then the body in `chunks` (the last ends it;
    /// none: a response without a body). Returns the response headers the client gets.
    pub fn respond(&mut self, ctx: u32, status: u32, headers: &[(&str, &str)], chunks: &[&[u8]]) -> Vec<(String, Vec<u8>)> {
        self.response_headers(ctx, status, headers, chunks.is_empty());
        for (i, c) in chunks.iter().enumerate() {
            self.response_body(ctx, c, i + 1 == chunks.len());
        }
        self.stream(ctx).response_headers
    }

    pub fn response_headers(&mut self, ctx: u32, status: u32, headers: &[(&str, &str)], end: bool) {
        {
            let mut streams = self.host.streams.borrow_mut();
            let s = streams.get_mut(&ctx).expect("stream");
            s.response_headers = vec![(":status".to_string(), status.to_string().into_bytes())];
            s.response_headers.extend(headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())));
        }
        self.host.current.set(ctx);
        let r = self.requests.get_mut(&ctx).expect("request");
        r.on_response_headers(&self.host, &mut self.worker, end);
    }

    pub fn response_body(&mut self, ctx: u32, chunk: &[u8], end: bool) {
        self.host.streams.borrow_mut().get_mut(&ctx).expect("stream").body_chunk = chunk.to_vec();
        self.host.current.set(ctx);
        let r = self.requests.get_mut(&ctx).expect("request");
        r.on_response_body(&self.host, &mut self.worker, chunk.len(), end);
    }

    /// The stream ends (logged and destroyed), e.g. the client went away.
    pub fn close(&mut self, ctx: u32) {
        if let Some(mut r) = self.requests.remove(&ctx) {
            self.host.current.set(ctx);
            r.on_stream_end(&self.host, &mut self.worker);
        }
        if let Some(s) = self.host.streams.borrow_mut().get_mut(&ctx) {
            s.gone = true;
        }
    }

    /// One timer tick.
    pub fn tick(&mut self) {
        self.root.on_tick(&self.host, &mut self.worker);
    }

    /// Delivers the messages in this worker's mailbox (as `on_queue_ready`, once per message).
    pub fn deliver_mail(&mut self) {
        let name = apf_wasm::gateway::worker::mailbox_name(self.worker.instance());
        while self.host.proxy.queued_messages(&name) > 0 {
            self.root.on_queue_ready(&self.host, &mut self.worker);
        }
    }

    /// The reply to the HTTP call `token` (`status` `None`: the call failed, no response).
    pub fn call_response(&mut self, token: u32, status: Option<u32>, body: &[u8]) {
        let headers = status.map(|s| vec![(":status".to_string(), s.to_string().into_bytes())]).unwrap_or_default();
        *self.host.proxy.call_response.borrow_mut() = (headers, body.to_vec());
        self.root.on_http_call_response(&self.host, &mut self.worker, token, body.len());
    }

    pub fn stream(&self, ctx: u32) -> Stream {
        self.host.streams.borrow().get(&ctx).cloned().expect("stream")
    }
}

/// Request headers for a resource request by `user` in `groups` (front-proxy headers).
pub fn headers<'a>(method: &'a str, path: &'a str, user: &'a str, groups: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![(":method", method), (":path", path), (":authority", "gateway")];
    h.push(("x-remote-user", user));
    h.extend(groups.iter().map(|g| ("x-remote-group", *g)));
    h
}

/// Header pairs of a host serialization, as owned strings (for assertions).
pub fn decoded(bytes: &[u8]) -> Vec<(String, String)> {
    pairs(bytes).into_iter().map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into_owned())).collect()
}

impl Node {
    /// A new configuration on this worker, as Envoy applies a reloaded filter configuration: a
    /// second root on the same worker (its state, mailbox and streams stay). Applied: new streams
    /// get the new root, streams already open keep the configuration they were classified under.
    /// Refused (`false`): the previous root keeps serving.
    pub fn reload(&mut self, config: &str) -> bool {
        *self.host.configuration.borrow_mut() = config.as_bytes().to_vec();
        let mut root = Root::default();
        let ok = root.on_configure(&self.host, config.as_bytes());
        if ok {
            self.root = root;
        }
        ok
    }

    /// A request that a debug group member sends for `/debug/api_priority_and_fairness/<dump>`
    /// (`headers`: its identity), answered by the gateway: the dump's body.
    pub fn dump(&mut self, dump: &str, identity: &[(&str, &str)], properties: &[(&str, &[u8])]) -> String {
        let path = format!("/debug/api_priority_and_fairness/{dump}");
        let mut h = vec![(":method", "GET"), (":path", path.as_str()), (":authority", "gateway")];
        h.extend_from_slice(identity);
        let (ctx, action) = self.request(&h, properties);
        assert_eq!(action, Action::Pause, "dump {dump} not answered by the gateway");
        let reply = self.stream(ctx).reply.expect("dump answered");
        self.close(ctx);
        reply.body
    }
}

/// (WaitingRequests, ExecutingRequests) of `level` in a `dump_priority_levels` body.
pub fn level_row(dump: &str, level: &str) -> (u32, u32) {
    let mut lines = dump.lines();
    let cols: Vec<&str> = lines.next().expect("header line").split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).expect("column");
    let row = lines.map(|l| l.split(',').map(str::trim).collect::<Vec<_>>()).find(|r| r.first() == Some(&level));
    let row = row.unwrap_or_else(|| panic!("no row for {level} in\n{dump}"));
    let num = |name: &str| row.get(col(name)).and_then(|v| v.parse().ok()).expect("number");
    (num("WaitingRequests"), num("ExecutingRequests"))
}

/// A process with `n` workers, each configured with `cfg` and ticked once.
pub fn gateway(n: usize, cfg: &str) -> (Rc<Proxy>, Vec<Node>) {
    let proxy = Proxy::new();
    let mut nodes: Vec<Node> = (0..n).map(|i| Node::new(&proxy, i)).collect();
    for node in &mut nodes {
        assert!(node.configure(cfg), "configuration refused");
        node.tick();
    }
    (proxy, nodes)
}

/// A Limited priority level `name` (UID `pl-<name>`) with `shares` nominal shares, no lending
/// or borrowing, queuing in `queues` queues of `queue_length_limit` with hand size `hand`.
pub fn priority_level(name: &str, shares: u32, queues: u32, hand: u32, queue_length_limit: u32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name, "uid": format!("pl-{name}")},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": shares, "lendablePercent": 0,
                 "borrowingLimitPercent": 0, "limitResponse": {"type": "Queue", "queuing": {
                     "queues": queues, "handSize": hand, "queueLengthLimit": queue_length_limit}}}}
    })
}

/// A FlowSchema `name` (UID `fs-<name>`, ByUser) sending every request of `groups` to `level`.
pub fn flow_schema(name: &str, level: &str, precedence: u32, groups: &[&str]) -> serde_json::Value {
    let subjects: Vec<serde_json::Value> = groups.iter().map(|g| serde_json::json!({"kind": "Group", "group": {"name": g}})).collect();
    serde_json::json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": name, "uid": format!("fs-{name}")},
        "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": subjects,
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "namespaces": ["*"], "clusterScope": true}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}
    })
}

/// A response header's value in `respond`'s result.
pub fn header_value(headers: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    headers.iter().rev().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}
