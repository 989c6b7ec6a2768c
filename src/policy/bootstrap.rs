//! Kubernetes' built-in APF configuration (1.34+, `pkg/apis/flowcontrol/bootstrap/default.go`;
//! `MandatoryPriorityLevelConfigurations`, `SuggestedPriorityLevelConfigurations`,
//! `MandatoryFlowSchemas`, `SuggestedFlowSchemas`) and the assembly of the effective policy the
//! controller digests (`apf_controller.go: digestConfigObjects`, `digestFlowSchemasLocked`,
//! `imaginePL`): mandatory objects always exist, suggested ones are added unless turned off, user
//! objects replace built-in ones of the same name, dangling FlowSchemas are dropped with a warning.
//!
//! Built-in ("imagined") objects have an empty uid, as upstream's imagined mandatory objects.
use serde_json::Value;

use super::error::PolicyError;
use super::model::{NonResourcePolicyRule, Policy, Queuing, ResourcePolicyRule};
use super::objects::{
    ApiObject, ApiVersion, ExemptObject, FlowSchemaObject, FlowSchemaSpec, LimitResponseObject, LimitedObject, Object, ObjectMeta,
    PriorityLevelObject, PriorityLevelSpecObject, RuleObject, ServiceAccountObject, SubjectObject,
};
use super::validation::{quote, validate_objects};

pub const NAME_EXEMPT: &str = "exempt";
pub const NAME_CATCH_ALL: &str = "catch-all";

const USER_KCM: &str = "system:kube-controller-manager";
const USER_SCHEDULER: &str = "system:kube-scheduler";
const BY_USER: Option<&str> = Some("ByUser");
const BY_NAMESPACE: Option<&str> = Some("ByNamespace");

fn builtin<S>(name: &str, spec: S) -> Object<S> {
    Object {
        version: ApiVersion::V1,
        meta: ObjectMeta { name: name.to_string(), ..Default::default() },
        location: "built-in".to_string(),
        spec,
        condition_types: Vec::new(),
        raw_spec: Value::Null,
    }
}

/// A Limited level that queues with `(queues, handSize)` and queue length limit 50, or rejects
/// when that is `None`.
fn limited(name: &str, shares: i32, lendable_percent: i32, queues: Option<(i32, i32)>) -> PriorityLevelObject {
    let queuing = queues.map(|(queues, hand_size)| Queuing { queues, hand_size, queue_length_limit: 50 });
    let type_ = if queuing.is_some() { "Queue" } else { "Reject" }.to_string();
    let limited = LimitedObject {
        nominal_concurrency_shares: shares,
        lendable_percent,
        borrowing_limit_percent: None,
        limit_response: LimitResponseObject { type_, queuing },
    };
    builtin(name, PriorityLevelSpecObject { type_: "Limited".to_string(), limited: Some(limited), exempt: None })
}

/// The mandatory levels `exempt` and `catch-all`
/// (`default.go: MandatoryPriorityLevelConfigurations`).
pub fn mandatory_priority_levels() -> Vec<PriorityLevelObject> {
    let exempt = Some(ExemptObject::default());
    let exempt = PriorityLevelSpecObject { type_: "Exempt".to_string(), limited: None, exempt };
    vec![builtin(NAME_EXEMPT, exempt), limited(NAME_CATCH_ALL, 5, 0, None)]
}

/// The suggested levels (`default.go: SuggestedPriorityLevelConfigurations`).
pub fn suggested_priority_levels() -> Vec<PriorityLevelObject> {
    vec![
        limited("system", 30, 33, Some((64, 6))),
        limited("node-high", 40, 25, Some((64, 6))),
        limited("leader-election", 10, 0, Some((16, 4))),
        limited("workload-high", 40, 50, Some((128, 6))),
        limited("workload-low", 100, 90, Some((128, 6))),
        limited("global-default", 20, 50, Some((128, 6))),
    ]
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn group(name: &str) -> SubjectObject {
    SubjectObject { kind: "Group".to_string(), group: Some(name.to_string()), ..Default::default() }
}

fn user(name: &str) -> SubjectObject {
    SubjectObject { kind: "User".to_string(), user: Some(name.to_string()), ..Default::default() }
}

fn kube_system_service_accounts() -> SubjectObject {
    let sa = ServiceAccountObject { namespace: "kube-system".to_string(), name: "*".to_string() };
    SubjectObject { kind: "ServiceAccount".to_string(), service_account: Some(sa), ..Default::default() }
}

fn everyone() -> Vec<SubjectObject> {
    vec![group("system:unauthenticated"), group("system:authenticated")]
}

fn resource_rule(verbs: &[&str], groups: &[&str], resources: &[&str], cluster: bool) -> ResourcePolicyRule {
    ResourcePolicyRule {
        verbs: strs(verbs),
        api_groups: strs(groups),
        resources: strs(resources),
        cluster_scope: cluster,
        namespaces: strs(&["*"]),
    }
}

fn non_resource_rule(verbs: &[&str], urls: &[&str]) -> NonResourcePolicyRule {
    NonResourcePolicyRule { verbs: strs(verbs), non_resource_urls: strs(urls) }
}

fn rule(subjects: Vec<SubjectObject>, rr: Vec<ResourcePolicyRule>, nrr: Vec<NonResourcePolicyRule>) -> RuleObject {
    RuleObject { subjects, resource_rules: rr, non_resource_rules: nrr }
}

/// "all resources + all non-resource" for the given subjects.
fn everything(subjects: Vec<SubjectObject>) -> RuleObject {
    rule(subjects, vec![resource_rule(&["*"], &["*"], &["*"], true)], vec![non_resource_rule(&["*"], &["*"])])
}

/// A FlowSchema with one rule.
fn fs(name: &str, precedence: i32, level: &str, distinguisher: Option<&str>, rule: RuleObject) -> FlowSchemaObject {
    builtin(
        name,
        FlowSchemaSpec {
            priority_level_configuration: level.to_string(),
            matching_precedence: precedence,
            distinguisher_method: distinguisher.map(str::to_string),
            rules: vec![rule],
        },
    )
}

/// The mandatory FlowSchemas `exempt` and `catch-all` (`default.go: MandatoryFlowSchemas`).
pub fn mandatory_flow_schemas() -> Vec<FlowSchemaObject> {
    vec![
        fs(NAME_EXEMPT, 1, NAME_EXEMPT, None, everything(vec![group("system:masters")])),
        fs(NAME_CATCH_ALL, 10_000, NAME_CATCH_ALL, BY_USER, everything(everyone())),
    ]
}

/// The suggested FlowSchemas of Kubernetes 1.34+ (`default.go: SuggestedFlowSchemas`).
pub fn suggested_flow_schemas() -> Vec<FlowSchemaObject> {
    let leases = |verbs: &[&str]| resource_rule(verbs, &["coordination.k8s.io"], &["leases"], false);
    let probes = rule(everyone(), vec![], vec![non_resource_rule(&["get"], &["/healthz", "/readyz", "/livez"])]);
    let leaders = vec![user(USER_KCM), user(USER_SCHEDULER), kube_system_service_accounts()];
    let leader_election = rule(leaders, vec![leases(&["get", "create", "update"])], vec![]);
    let nodes = resource_rule(&["*"], &[""], &["nodes", "nodes/status"], true);
    let node_high = rule(vec![group("system:nodes")], vec![nodes, leases(&["*"])], vec![]);
    let kcm = everything(vec![user(USER_KCM)]);
    let scheduler = everything(vec![user(USER_SCHEDULER)]);
    let kube_system = everything(vec![kube_system_service_accounts()]);
    vec![
        fs("probes", 2, NAME_EXEMPT, None, probes),
        fs("system-leader-election", 100, "leader-election", BY_USER, leader_election),
        fs("system-node-high", 400, "node-high", BY_USER, node_high),
        fs("system-nodes", 500, "system", BY_USER, everything(vec![group("system:nodes")])),
        fs("kube-controller-manager", 800, "workload-high", BY_NAMESPACE, kcm),
        fs("kube-scheduler", 800, "workload-high", BY_NAMESPACE, scheduler),
        fs("kube-system-service-accounts", 900, "workload-high", BY_NAMESPACE, kube_system),
        fs("service-accounts", 9000, "workload-low", BY_USER, everything(vec![group("system:serviceaccounts")])),
        fs("global-default", 9900, "global-default", BY_USER, everything(everyone())),
    ]
}

/// The effective policy (see the module documentation and [`Policy`]) of user objects, which are
/// validated here: any error → `Err` with all errors.
pub fn effective_policy(user_objects: &[ApiObject], suggested_defaults: bool) -> Result<Policy, Vec<PolicyError>> {
    let errs = validate_objects(user_objects);
    if !errs.is_empty() {
        return Err(errs);
    }
    let mut levels = mandatory_priority_levels();
    let mut schemas = mandatory_flow_schemas();
    if suggested_defaults {
        levels.extend(suggested_priority_levels());
        schemas.extend(suggested_flow_schemas());
    }
    fn replace<S: Clone>(objects: &mut Vec<Object<S>>, o: &Object<S>) {
        objects.retain(|x| x.meta.name != o.meta.name);
        objects.push(o.clone());
    }
    for o in user_objects {
        match o {
            ApiObject::PriorityLevel(p) => replace(&mut levels, p),
            ApiObject::FlowSchema(f) => replace(&mut schemas, f),
        }
    }
    let priority_levels = levels.iter().map(PriorityLevelObject::to_model).collect();
    let mut policy = Policy { priority_levels, ..Default::default() };
    policy.priority_levels.sort_by(|a, b| a.name.cmp(&b.name));
    let mut flow_schemas: Vec<_> = schemas.iter().map(FlowSchemaObject::to_model).collect();
    flow_schemas.sort_by(|a, b| (a.matching_precedence, &a.name).cmp(&(b.matching_precedence, &b.name)));
    let (usable, dangling): (Vec<_>, Vec<_>) = flow_schemas.into_iter().partition(|f| policy.level_index(&f.priority_level).is_some());
    policy.flow_schemas = usable;
    policy.warnings = dangling
        .iter()
        .map(|f| {
            format!(
        "FlowSchema {} ignored: This FlowSchema references the PriorityLevelConfiguration object named {} but there is no such object",
        quote(&f.name),
        quote(&f.priority_level)
    )
        })
        .collect();
    Ok(policy)
}

/// Parses objects (any accepted form, see `objects`) and builds the effective policy; parse
/// and validation errors are reported together.
pub fn policy_from_value(v: &Value, suggested_defaults: bool) -> Result<Policy, Vec<String>> {
    let (objs, errs) = super::objects::parse_objects(v);
    match effective_policy(&objs, suggested_defaults) {
        Ok(p) if errs.is_empty() => Ok(p),
        result => Err(errs.into_iter().chain(result.err().into_iter().flatten().map(|e| e.to_string())).collect()),
    }
}

/// Like [`policy_from_value`] from JSON bytes.
pub fn policy_from_json(bytes: &[u8], suggested_defaults: bool) -> Result<Policy, Vec<String>> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| vec![format!("invalid JSON: {e}")])?;
    policy_from_value(&v, suggested_defaults)
}

/// Kubernetes' default configuration (mandatory + suggested objects).
pub fn default_policy() -> Policy {
    effective_policy(&[], true).unwrap_or_default()
}
