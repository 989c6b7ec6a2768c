//! The policy read from the cluster (`clusterPolicy`): every `period`, the group's discovery
//! document when the served `flowcontrol.apiserver.k8s.io` version is to be (re)discovered, then
//! the FlowSchema and PriorityLevelConfiguration lists, merged into the configuration document
//! ([`crate::policy::cluster::merged_config`]). A policy whose meaning did not change is not
//! applied again; a failed or invalid read keeps the current one.

use super::host::{call_status, call_timeout, describe_status, Body, Host, PollTarget};
use crate::config::{parse_plugin_config, PluginConfig};
use crate::policy::cluster::ClusterPolicy;
use crate::policy::discovery;
use crate::policy::objects::ApiVersion;
use crate::Nanos;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::time::Duration;

/// State of the periodic policy read from the cluster.
#[derive(Default)]
pub struct ClusterFetch {
    /// The configuration document the policy is merged into.
    base: Option<serde_json::Value>,
    next: Nanos,
    tokens: [Option<u32>; 2],
    /// The responses read so far (both cleared when one fails).
    bodies: [Option<Vec<u8>>; 2],
    /// Digest of the last applied policy's meaning (re-reading an unchanged policy changes
    /// nothing: see `cluster::merged_config`).
    applied: Option<u64>,
    /// The read of the group's discovery document under way (without `pathPrefix`).
    discovery: Option<u32>,
    /// The served version discovered last; `None` until discovery first answers (the lists are
    /// read at [`discovery::FALLBACK`]'s path meanwhile).
    version: Option<ApiVersion>,
    /// Policy reads started since discovery last answered.
    reads_since_discovery: u32,
    /// Read the discovery document before the next read (it failed, or a list answered 404).
    rediscover: bool,
    /// The path prefix of the lists under way.
    prefix: String,
}

/// A configuration the cluster's policy made, and where it was read (for the log).
pub struct Fetched {
    pub config: PluginConfig,
    pub what: String,
}

/// Where the policy is read.
fn target(cp: &ClusterPolicy) -> PollTarget<'_> {
    let timeout = call_timeout(cp.timeout, Duration::from_secs(5));
    PollTarget { cluster: &cp.cluster, authority: &cp.authority, token: cp.token.as_ref(), timeout }
}

impl ClusterFetch {
    /// A new read of the policy into the configuration document `base`.
    pub fn new(base: Option<serde_json::Value>) -> ClusterFetch {
        ClusterFetch { base, ..ClusterFetch::default() }
    }

    fn busy(&self) -> bool {
        self.discovery.is_some() || self.tokens.iter().any(Option::is_some)
    }

    fn discovery_due(&self) -> bool {
        self.version.is_none() || self.rediscover || self.reads_since_discovery >= discovery::REDISCOVER_EVERY
    }

    /// Where the lists are read: `pathPrefix`, else the discovered (or fallback) version's.
    fn prefix_of(&self, cp: &ClusterPolicy) -> String {
        cp.path_prefix.clone().unwrap_or_else(|| discovery::path_prefix(self.version.unwrap_or(discovery::FALLBACK)))
    }

    /// Starts reading the cluster's policy when due: the group's discovery document first when
    /// the served version is to be (re)discovered, else the two lists.
    pub fn maybe_start(&mut self, h: &dyn Host, cp: &ClusterPolicy, now: Nanos) {
        if now < self.next || self.busy() {
            return;
        }
        self.next = now.saturating_add(cp.period);
        if cp.path_prefix.is_none() && self.discovery_due() {
            match target(cp).get(h, discovery::DISCOVERY_PATH, "application/json") {
                Ok(t) => return self.discovery = Some(t),
                Err(e) => {
                    self.rediscover = true;
                    let (path, prefix) = (discovery::DISCOVERY_PATH, self.prefix_of(cp));
                    log::warn!("apf: cannot read {path} from cluster {:?}: {e}; reading {prefix} meanwhile", cp.cluster);
                }
            }
        }
        self.start_lists(h, cp);
    }

    /// Starts the two list calls.
    fn start_lists(&mut self, h: &dyn Host, cp: &ClusterPolicy) {
        let prefix = self.prefix_of(cp);
        self.bodies = [None, None];
        self.reads_since_discovery = self.reads_since_discovery.saturating_add(1);
        self.tokens = ClusterPolicy::paths(&prefix).map(|path| {
            let call = target(cp).get(h, &path, "application/json");
            call.map_err(|e| log::warn!("apf: cannot read the cluster policy from cluster {:?}: {e}", cp.cluster)).ok()
        });
        self.prefix = prefix;
    }

    /// The reply of a call of this read (other tokens are ignored): the configuration to apply
    /// once both lists are in and the policy's meaning changed.
    pub fn on_response(&mut self, h: &dyn Host, cp: &ClusterPolicy, token: u32, body_size: usize) -> Option<Fetched> {
        if self.discovery.take_if(|t| *t == token).is_some() {
            self.discovery_response(h, cp, body_size);
            return None;
        }
        let (i, t) = self.tokens.iter_mut().enumerate().find(|(_, t)| **t == Some(token))?;
        *t = None;
        let body = self.list_response(h, cp, body_size)?;
        if let Some(b) = self.bodies.get_mut(i) {
            *b = Some(body);
        }
        self.merged()
    }

    /// The discovery document's reply: the version to read from now on (a failed or unusable
    /// reply keeps the previous one, and discovery is retried at the next read); then the lists.
    fn discovery_response(&mut self, h: &dyn Host, cp: &ClusterPolicy, body_size: usize) {
        let outcome = match call_status(h) {
            Some(200) => {
                discovery::choose_version(&h.body_bytes(Body::CallResponse, 0, body_size).unwrap_or_default()).map_err(|e| e.to_string())
            }
            status => Err(describe_status(status)),
        };
        match outcome {
            Ok(d) => {
                if self.version != Some(d.version) {
                    let preferred = d.preferred.as_deref().unwrap_or("none");
                    let (group, prefix) = (discovery::GROUP, discovery::path_prefix(d.version));
                    log::info!("apf: the cluster serves {group} {:?} (preferred: {preferred}); reading the policy from {prefix}", d.served);
                }
                self.version = Some(d.version);
                self.rediscover = false;
                self.reads_since_discovery = 0;
            }
            Err(why) => {
                self.rediscover = true;
                let which = if self.version.is_some() { "the version in use" } else { "the newest version, until discovery answers" };
                let (group, path, prefix) = (discovery::GROUP, discovery::DISCOVERY_PATH, self.prefix_of(cp));
                log::warn!("apf: discovering the served {group} version ({path}) failed: {why}; reading {prefix} ({which})");
            }
        }
        self.start_lists(h, cp);
    }

    /// A list's reply: its body if it answered `200`; else the read fails (and a `404` without
    /// `pathPrefix` makes the next read discover the served version again).
    fn list_response(&mut self, h: &dyn Host, cp: &ClusterPolicy, body_size: usize) -> Option<Vec<u8>> {
        let status = call_status(h);
        if status == Some(200) {
            return Some(h.body_bytes(Body::CallResponse, 0, body_size).unwrap_or_default());
        }
        self.bodies = [None, None];
        if status == Some(404) && cp.path_prefix.is_none() {
            // The version read is no longer served (the cluster was upgraded or downgraded):
            // discover again, at once unless discovery has just named this version.
            let prefix = &self.prefix;
            log::warn!("apf: reading the cluster policy from {prefix} failed: HTTP status 404; discovering the served version again");
            self.rediscover = true;
            if self.reads_since_discovery > 1 {
                self.next = h.monotonic_nanos();
            }
            return None;
        }
        let (prefix, why) = (&self.prefix, describe_status(status));
        log::warn!("apf: reading the cluster policy from {prefix} failed: {why}; keeping the current one");
        None
    }

    /// Both lists are in: the configuration they make, unless its meaning is the one applied.
    fn merged(&mut self) -> Option<Fetched> {
        let [Some(fs), Some(pl)] = &self.bodies else { return None };
        let base = self.base.as_ref()?;
        let prefix = &self.prefix;
        let merged = match crate::policy::cluster::merged_config(base, &[fs, pl]) {
            Ok(m) => m,
            Err(e) => {
                log::error!("apf: cluster policy from {prefix} unusable, keeping the current one: {e}");
                return None;
            }
        };
        // The merged configuration holds only what the policy means (not resourceVersions,
        // managedFields or status): a re-read that changed nothing else changes nothing.
        let digest = BuildHasherDefault::<DefaultHasher>::default().hash_one(&merged);
        if self.applied.replace(digest) == Some(digest) {
            return None;
        }
        match parse_plugin_config(&merged) {
            Ok(config) => Some(Fetched { config, what: format!("cluster policy from {prefix}") }),
            Err(errors) => {
                let (n, all) = (errors.len(), errors.join("; "));
                log::error!("apf: invalid cluster policy from {prefix} ({n} errors); keeping the current one: {all}");
                None
            }
        }
    }
}
