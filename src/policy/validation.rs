//! Validation of FlowSchema and PriorityLevelConfiguration objects, rule for rule as upstream's
//! `pkg/apis/flowcontrol/validation/validation.go`, with upstream's field-error
//! wording (`spec.matchingPrecedence: Invalid value: 10001: must not be greater than 10000`).
//! All errors are collected; each is prefixed with the object (`FlowSchema "team-a": ...`).
//!
//! Also checks what upstream enforces outside validation: duplicate names of one kind in the
//! same input, and that mandatory objects (`exempt`, `catch-all`) equal the built-in ones
//! (`validation.go: ValidateFlowSchema`, `ValidatePriorityLevelConfiguration`; the `exempt` level
//! may change only `spec.exempt`).
//!
//! Deviation: `metadata.namespace` set on these cluster-scoped objects is reported as
//! `Forbidden: not allowed on this type` (upstream clears / rejects it at the REST layer).
use std::collections::HashSet;
use std::fmt;

use serde_json::Value;

use super::bootstrap::{mandatory_flow_schemas, mandatory_priority_levels};
use super::error::{FieldError, FieldErrorKind, NameError, PolicyError};
use super::model::{NonResourcePolicyRule, Queuing, ResourcePolicyRule};
use super::objects::{ApiObject, FlowSchemaObject, PriorityLevelObject, RuleObject, SubjectObject};
use crate::fairqueuing::shuffle_sharding::{required_entropy_bits, MAX_HASH_BITS};

/// Maximum `matchingPrecedence` (`FlowSchemaMaxMatchingPrecedence`).
pub const MAX_MATCHING_PRECEDENCE: i32 = 10_000;
/// Maximum queues of a level (`priorityLevelConfigurationQueuingMaxQueues`).
pub const MAX_QUEUES: i32 = 10_000_000;

const SUPPORTED_VERBS: [&str; 9] = ["create", "delete", "deletecollection", "get", "list", "patch", "proxy", "update", "watch"];

/// One upstream-style field error: `<path>: <kind>[: <detail>]`.
fn field_error(path: impl fmt::Display, kind: FieldErrorKind, detail: &str) -> FieldError {
    FieldError { field: path.to_string(), kind, detail: detail.to_string() }
}

/// `Invalid value: <value>: <detail>`; a string `value` is already rendered (see
/// [`json_repr`]), numbers are bare.
pub fn invalid(path: impl fmt::Display, value: impl fmt::Display, detail: &str) -> FieldError {
    field_error(path, FieldErrorKind::Invalid(value.to_string()), detail)
}
pub fn required(path: impl fmt::Display, detail: &str) -> FieldError {
    field_error(path, FieldErrorKind::Required, detail)
}
pub fn forbidden(path: impl fmt::Display, detail: &str) -> FieldError {
    field_error(path, FieldErrorKind::Forbidden, detail)
}
fn duplicate(path: &str, value: String) -> FieldError {
    field_error(path, FieldErrorKind::Duplicate(value), "")
}
pub fn not_supported(path: impl fmt::Display, value: String, supported: &[&str]) -> FieldError {
    let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
    let detail = format!("supported values: {}", list.join(", "));
    field_error(path, FieldErrorKind::NotSupported(value), &detail)
}

/// Renders a value like upstream's field errors do (strings quoted, numbers bare, compound
/// values as JSON), shortened to at most 200 characters.
pub fn json_repr(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((end, _)) => format!("{}...", s.get(..end).unwrap_or_default()),
        None => s,
    }
}

/// A string rendered like Go's `%q` (close enough: JSON string escaping).
pub fn quote(s: &str) -> String {
    json_repr(&Value::from(s))
}

// ---------------------------------------------------------------------------------------------
// Names (k8s.io/apimachinery/pkg/util/validation).

fn is_label_syntax(s: &str) -> bool {
    let valid = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
    !s.is_empty() && !s.starts_with('-') && !s.ends_with('-') && s.bytes().all(valid)
}

fn is_subdomain_syntax(s: &str) -> bool {
    s.split('.').all(is_label_syntax)
}

/// The messages of the checks that failed.
fn failed(checks: [(bool, NameError); 2]) -> Vec<NameError> {
    checks.into_iter().filter_map(|(failed, msg)| failed.then_some(msg)).collect()
}

/// `IsDNS1123Label` messages (empty = valid).
pub fn dns1123_label_errors(s: &str) -> Vec<NameError> {
    let syntax = if is_subdomain_syntax(s) { NameError::LabelWithDots } else { NameError::LabelSyntax };
    failed([(s.len() > 63, NameError::TooLong { max: 63 }), (!is_label_syntax(s), syntax)])
}

/// `IsDNS1123Subdomain` messages (empty = valid).
pub fn dns1123_subdomain_errors(s: &str) -> Vec<NameError> {
    let too_long = (s.len() > 253, NameError::TooLong { max: 253 });
    failed([too_long, (!is_subdomain_syntax(s), NameError::SubdomainSyntax)])
}

/// One `Invalid value` error per message of a name check.
fn invalid_name<M: fmt::Display>(path: &str, name: &str, msgs: impl IntoIterator<Item = M>, errs: &mut Vec<FieldError>) {
    errs.extend(msgs.into_iter().map(|msg| invalid(path, quote(name), &msg.to_string())));
}

fn validate_meta(name: &str, namespace: &str, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(required("metadata.name", "name or generateName is required"));
    } else {
        invalid_name("metadata.name", name, dns1123_subdomain_errors(name), errs);
    }
    if !namespace.is_empty() {
        errs.push(forbidden("metadata.namespace", "not allowed on this type"));
    }
}

fn validate_conditions(types: &[String], errs: &mut Vec<FieldError>) {
    for (i, t) in types.iter().enumerate() {
        let p = format!("status.conditions[{i}].type");
        if types.iter().take(i).any(|seen| seen == t) {
            errs.push(duplicate(&p, quote(t)));
        }
        if t.is_empty() {
            errs.push(required(&p, "must not be empty"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// FlowSchema.

/// All field errors of one FlowSchema (unprefixed).
pub fn validate_flow_schema(fs: &FlowSchemaObject) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(&fs.meta.name, &fs.meta.namespace, &mut errs);
    let spec = &fs.spec;
    let mp = spec.matching_precedence;
    let invalid_mp = |detail: &str| invalid("spec.matchingPrecedence", mp, detail);
    if mp <= 0 {
        errs.push(invalid_mp("must be a positive value"));
    }
    if mp > MAX_MATCHING_PRECEDENCE {
        errs.push(invalid_mp(&format!("must not be greater than {MAX_MATCHING_PRECEDENCE}")));
    }
    if mp == 1 && fs.meta.name != "exempt" {
        errs.push(invalid_mp("only the schema named 'exempt' may have matchingPrecedence 1"));
    }
    let supported = ["ByNamespace", "ByUser"];
    if let Some(t) = spec.distinguisher_method.as_ref().filter(|t| !supported.contains(&t.as_str())) {
        let method = json_repr(&serde_json::json!({ "type": t }));
        errs.push(not_supported("spec.distinguisherMethod.type", method, &supported));
    }
    let pl = &spec.priority_level_configuration;
    let pl_path = "spec.priorityLevelConfiguration.name";
    if pl.is_empty() {
        errs.push(required(pl_path, "must reference a priority level"));
    } else {
        invalid_name(pl_path, pl, dns1123_subdomain_errors(pl), &mut errs);
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        validate_rule(rule, &format!("spec.rules[{i}]"), &mut errs);
    }
    let mandatory = mandatory_flow_schemas().into_iter().find(|m| m.meta.name == fs.meta.name);
    if mandatory.is_some_and(|mand| mand.spec != fs.spec) {
        let detail = format!("spec of '{}' must equal the fixed value", fs.meta.name);
        errs.push(invalid("spec", json_repr(&fs.raw_spec), &detail));
    }
    validate_conditions(&fs.condition_types, &mut errs);
    errs
}

fn validate_rule(rule: &RuleObject, path: &str, errs: &mut Vec<FieldError>) {
    if rule.subjects.is_empty() {
        errs.push(required(format!("{path}.subjects"), "subjects must contain at least one value"));
    }
    for (i, s) in rule.subjects.iter().enumerate() {
        validate_subject(s, &format!("{path}.subjects[{i}]"), errs);
    }
    if rule.resource_rules.is_empty() && rule.non_resource_rules.is_empty() {
        errs.push(required(path, "at least one of resourceRules and nonResourceRules has to be non-empty"));
    }
    for (i, r) in rule.resource_rules.iter().enumerate() {
        validate_resource_rule(r, &format!("{path}.resourceRules[{i}]"), errs);
    }
    for (i, r) in rule.non_resource_rules.iter().enumerate() {
        validate_non_resource_rule(r, &format!("{path}.nonResourceRules[{i}]"), errs);
    }
}

fn validate_subject(s: &SubjectObject, path: &str, errs: &mut Vec<FieldError>) {
    let sa = s.service_account.as_ref();
    let members = [
        ("serviceAccount", "ServiceAccount", sa.map(|sa| &sa.name)),
        ("user", "User", s.user.as_ref()),
        ("group", "Group", s.group.as_ref()),
    ];
    let Some(&(field, kind, name)) = members.iter().find(|m| m.1 == s.kind) else {
        let supported = ["Group", "ServiceAccount", "User"];
        return errs.push(not_supported(format!("{path}.kind"), quote(&s.kind), &supported));
    };
    let p = format!("{path}.{field}");
    match name {
        None => errs.push(required(&p, &format!("{field} is required when subject kind is '{kind}'"))),
        Some(n) if n.is_empty() => errs.push(required(format!("{p}.name"), "")),
        Some(n) if kind == "ServiceAccount" && n != "*" => invalid_name(&format!("{p}.name"), n, dns1123_subdomain_errors(n), errs),
        Some(_) => {}
    }
    if let Some(sa) = sa.filter(|_| kind == "ServiceAccount") {
        let ns_path = format!("{p}.namespace");
        if sa.namespace.is_empty() {
            errs.push(required(ns_path, "must specify namespace for service account"));
        } else {
            invalid_name(&ns_path, &sa.namespace, dns1123_label_errors(&sa.namespace), errs);
        }
    }
    for (field, kind, name) in members {
        if name.is_some() && s.kind != kind {
            let detail = format!("{field} is forbidden when subject kind is not '{kind}'");
            errs.push(forbidden(format!("{path}.{field}"), &detail));
        }
    }
}

/// Whether `list` holds no `'*'`; an error if it holds `'*'` and more.
fn no_wildcard(list: &[String], p: &str, what: &str, errs: &mut Vec<FieldError>) -> bool {
    let wildcard = list.iter().any(|s| s == "*");
    if wildcard && list.len() > 1 {
        let detail = format!("if '*' is present, must not specify other {what}");
        errs.push(invalid(p, json_repr(&list.into()), &detail));
    }
    !wildcard
}

/// A list that must not be empty and may hold `'*'` only alone; whether to check its members.
fn check_list(list: &[String], p: &str, if_empty: &str, what: &str, errs: &mut Vec<FieldError>) -> bool {
    if list.is_empty() {
        errs.push(required(p, if_empty));
        return false;
    }
    no_wildcard(list, p, what, errs)
}

fn validate_verbs(verbs: &[String], path: &str, errs: &mut Vec<FieldError>) {
    let p = format!("{path}.verbs");
    let verbs_required = "verbs must contain at least one value";
    if check_list(verbs, &p, verbs_required, "verbs", errs) && !verbs.iter().all(|v| SUPPORTED_VERBS.contains(&v.as_str())) {
        errs.push(not_supported(&p, json_repr(&verbs.into()), &SUPPORTED_VERBS));
    }
}

fn validate_resource_rule(r: &ResourcePolicyRule, path: &str, errs: &mut Vec<FieldError>) {
    validate_verbs(&r.verbs, path, errs);
    let p = format!("{path}.apiGroups");
    check_list(&r.api_groups, &p, "resource rules must supply at least one api group", "api groups", errs);
    let p = format!("{path}.resources");
    check_list(&r.resources, &p, "resource rules must supply at least one resource", "resources", errs);
    let p = format!("{path}.namespaces");
    if r.namespaces.is_empty() && !r.cluster_scope {
        let detail = "resource rules that are not cluster scoped must supply at least one namespace";
        errs.push(required(&p, detail));
    } else if no_wildcard(&r.namespaces, &p, "namespaces", errs) {
        for (i, ns) in r.namespaces.iter().enumerate() {
            let msgs = dns1123_label_errors(ns).into_iter();
            let msgs = msgs.map(|m| format!("each member of this list must be '*' or a DNS-1123 label; {m}"));
            invalid_name(&format!("{p}[{i}]"), ns, msgs, errs);
        }
    }
}

fn validate_non_resource_rule(r: &NonResourcePolicyRule, path: &str, errs: &mut Vec<FieldError>) {
    validate_verbs(&r.verbs, path, errs);
    let p = format!("{path}.nonResourceURLs");
    let required = "nonResourceURLs must contain at least one value";
    if check_list(&r.non_resource_urls, &p, required, "non-resource URLs", errs) {
        for (i, u) in r.non_resource_urls.iter().enumerate() {
            if let Some(msg) = non_resource_url_error(u) {
                errs.push(invalid(format!("{p}[{i}]"), quote(u), msg));
            }
        }
    }
}

/// `ValidateNonResourceURLPath`.
fn non_resource_url_error(path: &str) -> Option<&'static str> {
    let wildcards = path.matches('*').count();
    let wildcard_inside = wildcards > 1 || (wildcards == 1 && !path.ends_with("/*"));
    match path {
        "" => Some("must not be empty"),
        "/" => None,
        _ if !path.starts_with('/') => Some("must start with slash"),
        _ if path.contains(' ') => Some("must not contain white-space"),
        _ if path.contains("//") => Some("must not contain double slash"),
        _ if wildcard_inside => Some("wildcard can only do suffix matching"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// PriorityLevelConfiguration.

/// All field errors of one PriorityLevelConfiguration (unprefixed).
pub fn validate_priority_level(pl: &PriorityLevelObject) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(&pl.meta.name, &pl.meta.namespace, &mut errs);
    let spec = &pl.spec;
    if (pl.meta.name == "exempt") != (spec.type_ == "Exempt") {
        errs.push(invalid("spec.type", quote(&spec.type_), "type must be 'Exempt' if and only if name is 'exempt'"));
    }
    match spec.type_.as_str() {
        "Exempt" => {
            if spec.limited.is_some() {
                errs.push(forbidden("spec.limited", "must be nil if the type is not Limited"));
            }
            if let Some(e) = &spec.exempt {
                let shares = e.nominal_concurrency_shares;
                non_negative_shares("spec.exempt.nominalConcurrencyShares", shares, &mut errs);
                lendable_percent("spec.exempt.lendablePercent", e.lendable_percent, &mut errs);
            }
        }
        "Limited" => {
            if spec.exempt.is_some() {
                errs.push(forbidden("spec.exempt", "must be nil if the type is Limited"));
            }
            match &spec.limited {
                None => errs.push(required("spec.limited", "must not be empty when type is Limited")),
                Some(l) => {
                    let shares_path = format!("spec.limited.{}", pl.version.shares_field());
                    non_negative_shares(&shares_path, l.nominal_concurrency_shares, &mut errs);
                    validate_limit_response(&l.limit_response.type_, l.limit_response.queuing, &mut errs);
                    lendable_percent("spec.limited.lendablePercent", l.lendable_percent, &mut errs);
                    if let Some(b) = l.borrowing_limit_percent.filter(|b| *b < 0) {
                        let detail = "if specified, must be a non-negative integer";
                        errs.push(invalid("spec.limited.borrowingLimitPercent", b, detail));
                    }
                }
            }
        }
        other => errs.push(not_supported("spec.type", quote(other), &["Exempt", "Limited"])),
    }
    let mandatory = mandatory_priority_levels().into_iter().find(|m| m.meta.name == pl.meta.name);
    if let Some(mand) = mandatory {
        let mut have = pl.spec.clone();
        let detail = if pl.meta.name == "exempt" {
            have.exempt = mand.spec.exempt.clone();
            "spec of 'exempt' except the 'spec.exempt' field must equal the fixed value".to_string()
        } else {
            format!("spec of '{}' must equal the fixed value", pl.meta.name)
        };
        if have != mand.spec {
            errs.push(invalid("spec", json_repr(&pl.raw_spec), &detail));
        }
    }
    validate_conditions(&pl.condition_types, &mut errs);
    errs
}

fn non_negative_shares(path: &str, value: i32, errs: &mut Vec<FieldError>) {
    if value < 0 {
        errs.push(invalid(path, value, "must be a non-negative integer"));
    }
}

fn lendable_percent(path: &str, value: i32, errs: &mut Vec<FieldError>) {
    if !(0..=100).contains(&value) {
        errs.push(invalid(path, value, "must be between 0 and 100, inclusive"));
    }
}

fn validate_limit_response(type_: &str, queuing: Option<Queuing>, errs: &mut Vec<FieldError>) {
    let p = "spec.limited.limitResponse.queuing";
    match (type_, queuing) {
        ("Reject", Some(_)) => errs.push(forbidden(p, "must be nil if limited.limitResponse.type is not Limited")),
        ("Queue", None) => errs.push(required(p, "must not be empty if limited.limitResponse.type is Limited")),
        ("Queue", Some(q)) => validate_queuing(&q, p, errs),
        ("Reject", None) => {}
        (other, _) => {
            let supported = ["Queue", "Reject"];
            errs.push(not_supported("spec.limited.limitResponse.type", quote(other), &supported))
        }
    }
}

fn validate_queuing(q: &Queuing, path: &str, errs: &mut Vec<FieldError>) {
    let mut invalid = |field: &str, value: i32, detail: &str| {
        errs.push(invalid(format!("{path}.{field}"), value, detail));
    };
    if q.queue_length_limit <= 0 {
        invalid("queueLengthLimit", q.queue_length_limit, "must be positive");
    }
    if q.queues <= 0 {
        invalid("queues", q.queues, "must be positive");
    } else if q.queues > MAX_QUEUES {
        invalid("queues", q.queues, &format!("must not be greater than {MAX_QUEUES}"));
    }
    let (deck, hand) = (q.queues, q.hand_size);
    if hand <= 0 {
        invalid("handSize", hand, "must be positive");
    } else if hand > deck {
        invalid("handSize", hand, &format!("should not be greater than queues ({deck})"));
    } else if required_entropy_bits(deck, hand) > MAX_HASH_BITS {
        let detail = format!("required entropy bits of deckSize {deck} and handSize {hand} should not be greater than {MAX_HASH_BITS}");
        invalid("handSize", hand, &detail);
    }
}

// ---------------------------------------------------------------------------------------------
// A whole input.

/// Validates every object and checks for duplicate names per kind. Returns every error,
/// prefixed with its object (`FlowSchema "x": spec...`), in input order.
pub fn validate_objects(objs: &[ApiObject]) -> Vec<PolicyError> {
    let mut seen = HashSet::new();
    objs.iter()
        .flat_map(|o| {
            let (mut errs, is_fs) = match o {
                ApiObject::FlowSchema(fs) => (validate_flow_schema(fs), true),
                ApiObject::PriorityLevel(pl) => (validate_priority_level(pl), false),
            };
            if !o.name().is_empty() && !seen.insert((is_fs, o.name())) {
                errs.insert(0, duplicate("metadata.name", quote(o.name())));
            }
            let object = o.describe();
            errs.into_iter().map(move |error| PolicyError { object: object.clone(), error })
        })
        .collect()
}
