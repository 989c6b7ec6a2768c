//! FlowSchema matching rules (`pkg/util/flowcontrol/rule.go`: `matchesFlowSchema`,
//! `matchesPolicyRule` and the `matches*` / `matchPolicyRule*` helpers) without allocating, and
//! the classifier's per-FlowSchema form with its subject prefilter.

use crate::digest::identity::{UserInfo, SA_PREFIX};
use crate::digest::request_info::RequestInfo;
use crate::policy::model::{
    Distinguisher, FlowSchema, NonResourcePolicyRule, Policy, PolicyRulesWithSubjects, ResourcePolicyRule, Subject,
};

const WILDCARD: &str = "*";

/// `"*"` is a wildcard only when it is the sole element.
fn is_sole_wildcard(list: &[String]) -> bool {
    matches!(list, [only] if only == WILDCARD)
}

/// `containsString` with the sole-wildcard rule.
fn contains(list: &[String], s: &str) -> bool {
    is_sole_wildcard(list) || list.iter().any(|x| x == s)
}

/// `resource` or `resource/subresource` equality without building the string.
fn resource_eq(entry: &str, resource: &str, subresource: &str) -> bool {
    if subresource.is_empty() {
        return entry == resource;
    }
    entry.strip_prefix(resource).and_then(|r| r.strip_prefix('/')) == Some(subresource)
}

fn subject_matches(s: &Subject, user: &UserInfo) -> bool {
    match s {
        Subject::User { name } => name == WILDCARD || *name == user.name,
        Subject::Group { name } => name == WILDCARD || user.groups.iter().any(|g| g == name),
        Subject::ServiceAccount { namespace, name } => {
            let rest = user.name.strip_prefix(SA_PREFIX).and_then(|r| r.strip_prefix(namespace.as_str()));
            rest.and_then(|r| r.strip_prefix(':')).is_some_and(|r| name == WILDCARD || r == name)
        }
        Subject::Invalid => false,
    }
}

/// `matchesNonResourceURL` for one rule URL.
fn url_matches(u: &str, path: &str) -> bool {
    if u == WILDCARD || u == path {
        return true;
    }
    let p = u.strip_suffix('*').unwrap_or(u);
    path.strip_prefix(p).is_some_and(|rest| p.ends_with('/') || rest.starts_with('/'))
}

fn resource_rule_matches(r: &ResourcePolicyRule, info: &RequestInfo) -> bool {
    contains(&r.verbs, &info.verb)
        && (is_sole_wildcard(&r.resources) || r.resources.iter().any(|e| resource_eq(e, &info.resource, &info.subresource)))
        && contains(&r.api_groups, &info.api_group)
        && if info.namespace.is_empty() { r.cluster_scope } else { contains(&r.namespaces, &info.namespace) }
}

fn non_resource_rule_matches(r: &NonResourcePolicyRule, info: &RequestInfo) -> bool {
    contains(&r.verbs, &info.verb) && r.non_resource_urls.iter().any(|u| url_matches(u, &info.path))
}

fn prws_matches(p: &PolicyRulesWithSubjects, info: &RequestInfo, user: &UserInfo) -> bool {
    p.subjects.iter().any(|s| subject_matches(s, user))
        && if info.is_resource_request {
            p.resource_rules.iter().any(|r| resource_rule_matches(r, info))
        } else {
            p.non_resource_rules.iter().any(|r| non_resource_rule_matches(r, info))
        }
}

/// Whether FlowSchema `fs` matches the request (`matchesFlowSchema`).
pub fn matches(fs: &FlowSchema, info: &RequestInfo, user: &UserInfo) -> bool {
    fs.rules.iter().any(|p| prws_matches(p, info, user))
}

/// A word-at-a-time multiplicative hash (FxHash's step) over a kind tag and a name: the
/// subject prefilter's key. Collisions only cost the full check.
pub(crate) fn subject_key(kind: u8, name: &str) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let bytes = name.as_bytes();
    let mut h = step(u64::from(kind), bytes.len() as u64);
    let mut words = bytes.chunks_exact(8);
    for w in words.by_ref() {
        h = step(h, w.first_chunk().copied().map_or(0, u64::from_le_bytes));
    }
    let tail = words.remainder().iter().rev().fold(0u64, |t, &b| (t << 8) | u64::from(b));
    step(h, tail)
}

pub(crate) const KEY_USER: u8 = 1;
pub(crate) const KEY_GROUP: u8 = 2;
/// Most identity keys (user + groups) the prefilter considers; beyond that it is bypassed.
pub(crate) const MAX_KEYS: usize = 32;

/// The requesting user's subject keys, computed once per classification.
pub(crate) struct UserKeys {
    keys: [u64; MAX_KEYS],
    len: usize,
    /// Too many groups: the prefilter is not used.
    overflow: bool,
    /// The user is a service account (only then can a ServiceAccount subject match).
    service_account: bool,
}

impl UserKeys {
    #[inline(always)]
    pub(crate) fn new(user: &UserInfo) -> Self {
        let overflow = user.groups.len() + 1 > MAX_KEYS;
        let service_account = user.name.starts_with(SA_PREFIX);
        let mut k = UserKeys { keys: [0; MAX_KEYS], len: 0, overflow, service_account };
        // With too many groups only the first keys are filled, and `overflow` ignores them.
        let names = std::iter::once((KEY_USER, user.name.as_str())).chain(user.groups.iter().map(|g| (KEY_GROUP, g.as_str())));
        for (slot, (kind, name)) in k.keys.iter_mut().zip(names) {
            *slot = subject_key(kind, name);
            k.len += 1;
        }
        k
    }
    fn may_match(&self, prefilter: &Prefilter) -> bool {
        self.overflow
            || (prefilter.service_accounts && self.service_account)
            || self.keys.get(..self.len).is_some_and(|mine| prefilter.keys.iter().any(|k| mine.contains(k)))
    }
}

/// What a user must have for a FlowSchema whose subjects are all literal Users, Groups or
/// ServiceAccounts to match: one of the keys, or be a service account.
#[derive(Debug, Clone)]
struct Prefilter {
    keys: Vec<u64>,
    /// Some subject is a ServiceAccount (it matches only a `system:serviceaccount:` user).
    service_accounts: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledSchema {
    pub(crate) name: String,
    pub(crate) level: usize,
    pub(crate) distinguisher: Option<Distinguisher>,
    /// Level is non-exempt, queues, with more than one queue (`apf_controller.go: startRequest`).
    pub(crate) hashes: bool,
    /// When every subject is a literal User or Group or a ServiceAccount: their keys. A user
    /// with none of these keys (and not a service account, if a subject is one) cannot match,
    /// so the full check is skipped (exact: hash collisions only cost the full check).
    prefilter: Option<Prefilter>,
    /// Some rule has resource rules (else no resource request can match), and non-resource
    /// rules (else no non-resource request can match): `matchesPolicyRule` needs one.
    resource_rules: bool,
    non_resource_rules: bool,
    rules: Vec<PolicyRulesWithSubjects>,
}

impl CompiledSchema {
    pub(crate) fn new(fs: &FlowSchema, policy: &Policy) -> Self {
        let level_idx = policy.level_index(&fs.priority_level);
        let level = level_idx.and_then(|i| policy.priority_levels.get(i));
        let hashes = level.is_some_and(|l| !l.is_exempt() && l.queuing().is_some_and(|q| q.queues > 1));
        let mut pre = Prefilter { keys: Vec::new(), service_accounts: false };
        let mut literal = true;
        for s in fs.rules.iter().flat_map(|p| p.subjects.iter()) {
            match s {
                Subject::User { name } if name != WILDCARD => pre.keys.push(subject_key(KEY_USER, name)),
                Subject::Group { name } if name != WILDCARD => pre.keys.push(subject_key(KEY_GROUP, name)),
                Subject::ServiceAccount { .. } => pre.service_accounts = true,
                Subject::Invalid => {}
                _ => literal = false,
            }
        }
        CompiledSchema {
            prefilter: literal.then_some(pre),
            resource_rules: fs.rules.iter().any(|p| !p.resource_rules.is_empty()),
            non_resource_rules: fs.rules.iter().any(|p| !p.non_resource_rules.is_empty()),
            name: fs.name.clone(),
            level: level_idx.unwrap_or(0),
            distinguisher: fs.distinguisher,
            hashes,
            rules: fs.rules.clone(),
        }
    }

    pub(crate) fn matches(&self, info: &RequestInfo, user: &UserInfo, keys: &UserKeys) -> bool {
        let shape = if info.is_resource_request { self.resource_rules } else { self.non_resource_rules };
        shape && self.prefilter.as_ref().is_none_or(|p| keys.may_match(p)) && self.rules.iter().any(|p| prws_matches(p, info, user))
    }
}
