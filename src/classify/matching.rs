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

/// FNV-1a over a kind tag and a name: the subject prefilter's key.
pub(crate) fn subject_key(kind: u8, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(kind).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
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
}

impl UserKeys {
    pub(crate) fn new(user: &UserInfo) -> Self {
        let mut k = UserKeys { keys: [0; MAX_KEYS], len: 0, overflow: user.groups.len() + 1 > MAX_KEYS };
        // With too many groups only the first keys are filled, and `overflow` ignores them.
        let names = std::iter::once((KEY_USER, user.name.as_str())).chain(user.groups.iter().map(|g| (KEY_GROUP, g.as_str())));
        for (slot, (kind, name)) in k.keys.iter_mut().zip(names) {
            *slot = subject_key(kind, name);
            k.len += 1;
        }
        k
    }
    fn may_match(&self, prefilter: &[u64]) -> bool {
        self.overflow || self.keys.iter().take(self.len).any(|k| prefilter.contains(k))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CompiledSchema {
    pub(crate) name: String,
    pub(crate) level: usize,
    pub(crate) distinguisher: Option<Distinguisher>,
    /// Level is non-exempt, queues, with more than one queue (`apf_controller.go: startRequest`).
    pub(crate) hashes: bool,
    /// When every subject is a literal User or Group: their keys. A user with none of these
    /// keys cannot match, so the full check is skipped (exact: hash collisions only cost the
    /// full check).
    prefilter: Option<Vec<u64>>,
    rules: Vec<PolicyRulesWithSubjects>,
}

impl CompiledSchema {
    pub(crate) fn new(fs: &FlowSchema, policy: &Policy) -> Self {
        let level_idx = policy.level_index(&fs.priority_level);
        let level = level_idx.and_then(|i| policy.priority_levels.get(i));
        let hashes = level.is_some_and(|l| !l.is_exempt() && l.queuing().is_some_and(|q| q.queues > 1));
        let mut keys = Vec::new();
        let mut literal = true;
        for s in fs.rules.iter().flat_map(|p| p.subjects.iter()) {
            match s {
                Subject::User { name } if name != WILDCARD => keys.push(subject_key(KEY_USER, name)),
                Subject::Group { name } if name != WILDCARD => keys.push(subject_key(KEY_GROUP, name)),
                Subject::Invalid => {}
                _ => literal = false,
            }
        }
        CompiledSchema {
            prefilter: literal.then_some(keys),
            name: fs.name.clone(),
            level: level_idx.unwrap_or(0),
            distinguisher: fs.distinguisher,
            hashes,
            rules: fs.rules.clone(),
        }
    }

    pub(crate) fn matches(&self, info: &RequestInfo, user: &UserInfo, keys: &UserKeys) -> bool {
        self.prefilter.as_ref().is_none_or(|p| keys.may_match(p)) && self.rules.iter().any(|p| prws_matches(p, info, user))
    }
}
