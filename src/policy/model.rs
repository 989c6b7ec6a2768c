//! The normalized, version-independent policy model (the "internal" API types of upstream).
//! Produced by `policy::objects` (parsing + defaulting) and checked by `policy::validation`;
//! consumed by classification, limits and the engine. Plain data, no behaviour.

/// `PriorityLevelConfiguration` after defaulting.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityLevel {
    pub name: String,
    /// `metadata.uid` (empty for "imagined" built-in objects, as upstream).
    pub uid: String,
    pub spec: PriorityLevelSpec,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PriorityLevelSpec {
    Exempt {
        nominal_concurrency_shares: i32,
        lendable_percent: i32,
    },
    Limited {
        nominal_concurrency_shares: i32,
        lendable_percent: i32,
        /// `None` = unlimited borrowing (BorrowingCL = ServerCL).
        borrowing_limit_percent: Option<i32>,
        limit_response: LimitResponse,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum LimitResponse {
    Reject,
    Queue(Queuing),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queuing {
    pub queues: i32,
    pub hand_size: i32,
    pub queue_length_limit: i32,
}

/// `FlowSchema` after defaulting.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowSchema {
    pub name: String,
    pub uid: String,
    pub matching_precedence: i32,
    pub priority_level: String,
    pub distinguisher: Option<Distinguisher>,
    pub rules: Vec<PolicyRulesWithSubjects>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distinguisher {
    ByUser,
    ByNamespace,
}

/// One rule of a FlowSchema; as written (`objects::RuleObject`), its subjects are unchecked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyRulesWithSubjects<S = Subject> {
    pub subjects: Vec<S>,
    pub resource_rules: Vec<ResourcePolicyRule>,
    pub non_resource_rules: Vec<NonResourcePolicyRule>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    User {
        name: String,
    },
    Group {
        name: String,
    },
    ServiceAccount {
        namespace: String,
        name: String,
    },
    /// Unknown kind or missing member: never matches (upstream behaviour).
    Invalid,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourcePolicyRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub cluster_scope: bool,
    pub namespaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct NonResourcePolicyRule {
    pub verbs: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

/// The effective configuration: what the controller would digest.
/// `priority_levels` holds every usable level (mandatory ones included, sorted by name);
/// `flow_schemas` holds the usable FlowSchemas in matching order (precedence, then name), with
/// dangling ones removed (and reported in `warnings`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    pub priority_levels: Vec<PriorityLevel>,
    pub flow_schemas: Vec<FlowSchema>,
    pub warnings: Vec<String>,
}

impl Policy {
    pub fn level_index(&self, name: &str) -> Option<usize> {
        self.priority_levels.iter().position(|p| p.name == name)
    }
}

impl PriorityLevel {
    pub fn is_exempt(&self) -> bool {
        matches!(self.spec, PriorityLevelSpec::Exempt { .. })
    }
    pub fn nominal_concurrency_shares(&self) -> i32 {
        match &self.spec {
            PriorityLevelSpec::Exempt { nominal_concurrency_shares, .. }
            | PriorityLevelSpec::Limited { nominal_concurrency_shares, .. } => *nominal_concurrency_shares,
        }
    }
    pub fn lendable_percent(&self) -> i32 {
        match &self.spec {
            PriorityLevelSpec::Exempt { lendable_percent, .. } | PriorityLevelSpec::Limited { lendable_percent, .. } => *lendable_percent,
        }
    }
    /// The queuing parameters, if this is a Limited level that queues.
    pub fn queuing(&self) -> Option<Queuing> {
        match &self.spec {
            PriorityLevelSpec::Limited { limit_response: LimitResponse::Queue(q), .. } => Some(*q),
            _ => None,
        }
    }
}
