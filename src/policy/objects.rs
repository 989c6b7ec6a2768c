//! FlowSchema and PriorityLevelConfiguration API objects as users write them
//! (`flowcontrol/*/types.go`), parsed from JSON in every served version
//! (`flowcontrol.apiserver.k8s.io/v1`, `v1beta3`, `v1beta2`, `v1beta1`) and defaulted as upstream's
//! `pkg/apis/flowcontrol/v1*/defaults.go` do (`SetDefaults_FlowSchemaSpec`,
//! `SetDefaults_LimitedPriorityLevelConfiguration`, ...).
//!
//! Input forms: a single object, a JSON array of objects, or a list object (`kind: List`,
//! `FlowSchemaList`, `PriorityLevelConfigurationList`) with `items`, exactly as
//! `kubectl get flowschemas,prioritylevelconfigurations -o json` prints them. Versions may be
//! mixed. Unknown fields (`status` other than condition types, `managedFields`, extra metadata)
//! are ignored; JSON `null` counts as "absent", like Go's decoder.
//!
//! The parsed objects keep the API shape (optional sections stay optional) so that
//! `policy::validation` can report upstream's field errors; `to_model` turns a valid object into
//! the normalized `policy::model` types.
use serde_json::{Map, Value};

use super::model::{
    Distinguisher, FlowSchema, LimitResponse, NonResourcePolicyRule, PolicyRulesWithSubjects,
    PriorityLevel, PriorityLevelSpec, Queuing, ResourcePolicyRule, Subject,
};
use super::validation::{json_repr, FieldError};

pub const GROUP: &str = "flowcontrol.apiserver.k8s.io";
/// Annotation that keeps a v1beta3 `nominalConcurrencyShares: 0` from being defaulted to 30.
pub const V1BETA3_PRESERVE_ZERO_ANNOTATION: &str =
    "flowcontrol.k8s.io/v1beta3-preserve-zero-concurrency-shares";
pub const KIND_FLOW_SCHEMA: &str = "FlowSchema";
pub const KIND_PRIORITY_LEVEL: &str = "PriorityLevelConfiguration";

/// Default shares of a Limited level (all versions).
pub const DEFAULT_SHARES: i32 = 30;
/// Default `matchingPrecedence`.
pub const DEFAULT_MATCHING_PRECEDENCE: i32 = 1000;
pub const DEFAULT_QUEUES: i32 = 64;
pub const DEFAULT_HAND_SIZE: i32 = 8;
pub const DEFAULT_QUEUE_LENGTH_LIMIT: i32 = 50;

/// How deeply arrays / lists of objects may nest (an array holding List objects is fine).
const MAX_CONTAINER_DEPTH: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    V1,
    V1beta3,
    V1beta2,
    V1beta1,
}

impl ApiVersion {
    pub const ALL: [ApiVersion; 4] =
        [ApiVersion::V1, ApiVersion::V1beta1, ApiVersion::V1beta2, ApiVersion::V1beta3];

    /// `flowcontrol.apiserver.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            ApiVersion::V1 => "flowcontrol.apiserver.k8s.io/v1",
            ApiVersion::V1beta3 => "flowcontrol.apiserver.k8s.io/v1beta3",
            ApiVersion::V1beta2 => "flowcontrol.apiserver.k8s.io/v1beta2",
            ApiVersion::V1beta1 => "flowcontrol.apiserver.k8s.io/v1beta1",
        }
    }

    pub fn parse(s: &str) -> Option<ApiVersion> {
        ApiVersion::ALL.into_iter().find(|v| v.api_version() == s)
    }

    /// The name of the Limited shares field in this version (`flowcontrol/<version>/types.go`).
    pub fn shares_field(self) -> &'static str {
        match self {
            ApiVersion::V1 | ApiVersion::V1beta3 => "nominalConcurrencyShares",
            ApiVersion::V1beta2 | ApiVersion::V1beta1 => "assuredConcurrencyShares",
        }
    }
}

/// Which kind an object is (for error prefixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    FlowSchema,
    PriorityLevelConfiguration,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::FlowSchema => KIND_FLOW_SCHEMA,
            ObjectKind::PriorityLevelConfiguration => KIND_PRIORITY_LEVEL,
        }
    }
}

/// The parts of `metadata` we use.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectMeta {
    pub name: String,
    pub uid: String,
    pub namespace: String,
}

/// Where an object came from in the input (`items[3]`, `[0]`, or empty for a single object).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Origin {
    pub location: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FlowSchemaObject {
    pub version: ApiVersion,
    pub meta: ObjectMeta,
    pub origin: Origin,
    pub spec: FlowSchemaSpec,
    /// `status.conditions[*].type`, in order.
    pub condition_types: Vec<String>,
    /// The `spec` exactly as written (for the mandatory-object error message).
    pub raw_spec: Value,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlowSchemaSpec {
    pub priority_level_configuration: String,
    pub matching_precedence: i32,
    /// `distinguisherMethod.type`, `None` when there is no `distinguisherMethod`.
    pub distinguisher_method: Option<String>,
    pub rules: Vec<RuleObject>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleObject {
    pub subjects: Vec<SubjectObject>,
    pub resource_rules: Vec<ResourcePolicyRule>,
    pub non_resource_rules: Vec<NonResourcePolicyRule>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubjectObject {
    pub kind: String,
    /// `user.name` (`Some("")` when `user: {}`).
    pub user: Option<String>,
    pub group: Option<String>,
    pub service_account: Option<ServiceAccountObject>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceAccountObject {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PriorityLevelObject {
    pub version: ApiVersion,
    pub meta: ObjectMeta,
    pub origin: Origin,
    pub spec: PriorityLevelSpecObject,
    pub condition_types: Vec<String>,
    pub raw_spec: Value,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PriorityLevelSpecObject {
    /// `Exempt` or `Limited` (anything else is a validation error).
    pub type_: String,
    pub limited: Option<LimitedObject>,
    pub exempt: Option<ExemptObject>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LimitedObject {
    /// `nominalConcurrencyShares` (v1, v1beta3) / `assuredConcurrencyShares` (v1beta1/2), defaulted.
    pub nominal_concurrency_shares: i32,
    pub lendable_percent: Option<i32>,
    pub borrowing_limit_percent: Option<i32>,
    pub limit_response: LimitResponseObject,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LimitResponseObject {
    pub type_: String,
    pub queuing: Option<Queuing>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExemptObject {
    pub nominal_concurrency_shares: Option<i32>,
    pub lendable_percent: Option<i32>,
}

/// One parsed, defaulted API object.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiObject {
    FlowSchema(FlowSchemaObject),
    PriorityLevel(PriorityLevelObject),
}

impl ApiObject {
    pub fn kind(&self) -> ObjectKind {
        match self {
            ApiObject::FlowSchema(_) => ObjectKind::FlowSchema,
            ApiObject::PriorityLevel(_) => ObjectKind::PriorityLevelConfiguration,
        }
    }
    pub fn name(&self) -> &str {
        match self {
            ApiObject::FlowSchema(f) => &f.meta.name,
            ApiObject::PriorityLevel(p) => &p.meta.name,
        }
    }
    pub fn version(&self) -> ApiVersion {
        match self {
            ApiObject::FlowSchema(f) => f.version,
            ApiObject::PriorityLevel(p) => p.version,
        }
    }
    pub fn origin(&self) -> &Origin {
        match self {
            ApiObject::FlowSchema(f) => &f.origin,
            ApiObject::PriorityLevel(p) => &p.origin,
        }
    }
    /// Error prefix: `FlowSchema "team-a"` (or `FlowSchema at items[2]` when unnamed).
    pub fn describe(&self) -> String {
        describe_object(self.kind().as_str(), self.name(), &self.origin().location)
    }
}

/// `Kind "name"`, or `Kind at <location>` / `Kind (unnamed)` when the name is empty.
pub fn describe_object(kind: &str, name: &str, location: &str) -> String {
    if !name.is_empty() {
        format!("{kind} {}", json_repr(&Value::String(name.to_string())))
    } else if !location.is_empty() {
        format!("{kind} at {location}")
    } else {
        format!("{kind} (unnamed)")
    }
}

/// Parses JSON bytes holding objects in any accepted form. Syntax errors give one error with
/// line and column. Objects with type errors are left out and their errors returned.
pub fn parse_objects_json(bytes: &[u8]) -> (Vec<ApiObject>, Vec<String>) {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => parse_objects(&v),
        Err(e) => (Vec::new(), vec![format!("invalid JSON: {e}")]),
    }
}

/// Parses an already-decoded JSON value holding objects in any accepted form.
/// Returns the objects that parsed cleanly and every error found (type errors, unknown kinds
/// or versions), each prefixed with the object it belongs to.
pub fn parse_objects(v: &Value) -> (Vec<ApiObject>, Vec<String>) {
    let mut objs = Vec::new();
    let mut errs = Vec::new();
    collect(v, "", None, 0, &mut objs, &mut errs);
    (objs, errs)
}

/// Defaults for items of a typed list (`FlowSchemaList` items may omit kind / apiVersion).
#[derive(Clone, Copy)]
struct ItemDefaults<'a> {
    kind: &'a str,
    api_version: &'a str,
}

fn collect(
    v: &Value,
    loc: &str,
    defaults: Option<ItemDefaults<'_>>,
    depth: usize,
    objs: &mut Vec<ApiObject>,
    errs: &mut Vec<String>,
) {
    let here = if loc.is_empty() { "input".to_string() } else { loc.to_string() };
    if depth > MAX_CONTAINER_DEPTH {
        errs.push(format!("{here}: lists nested too deeply"));
        return;
    }
    match v {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect(item, &format!("{loc}[{i}]"), None, depth + 1, objs, errs);
            }
        }
        Value::Object(map) => {
            let kind = map.get("kind").and_then(Value::as_str).or(defaults.map(|d| d.kind));
            let list_kind = kind.is_some_and(|k| k.ends_with("List"));
            if list_kind || (kind.is_none() && map.contains_key("items")) {
                let item_defaults = match kind {
                    Some("FlowSchemaList") | Some("PriorityLevelConfigurationList") => {
                        let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
                        Some(ItemDefaults {
                            kind: kind.and_then(|k| k.strip_suffix("List")).unwrap_or(""),
                            api_version,
                        })
                    }
                    _ => None,
                };
                let items_loc = if loc.is_empty() { "items".to_string() } else { format!("{loc}.items") };
                match map.get("items") {
                    None | Some(Value::Null) => {}
                    Some(Value::Array(items)) => {
                        for (i, item) in items.iter().enumerate() {
                            collect(item, &format!("{items_loc}[{i}]"), item_defaults, depth + 1, objs, errs);
                        }
                    }
                    Some(other) => errs.push(format!(
                        "{items_loc}: Invalid value: {}: must be a list",
                        json_repr(other)
                    )),
                }
                return;
            }
            if let Some(o) = parse_object(map, loc, defaults, errs) {
                objs.push(o);
            }
        }
        other => errs.push(format!(
            "{here}: Invalid value: {}: expected a FlowSchema or PriorityLevelConfiguration object, an array of them, or a List",
            json_repr(other)
        )),
    }
}

fn parse_object(
    map: &Map<String, Value>,
    loc: &str,
    defaults: Option<ItemDefaults<'_>>,
    errs: &mut Vec<String>,
) -> Option<ApiObject> {
    let mut fe: Vec<FieldError> = Vec::new();
    // metadata first: the name is needed for error prefixes.
    let meta_map = get_map(map, "metadata", "metadata", &mut fe);
    let mut meta = ObjectMeta::default();
    let mut annotations: Vec<String> = Vec::new();
    if let Some(m) = meta_map {
        meta.name = get_string(m, "name", "metadata.name", &mut fe).unwrap_or_default();
        meta.uid = get_string(m, "uid", "metadata.uid", &mut fe).unwrap_or_default();
        meta.namespace = get_string(m, "namespace", "metadata.namespace", &mut fe).unwrap_or_default();
        if let Some(a) = get_map(m, "annotations", "metadata.annotations", &mut fe) {
            for (k, v) in a {
                match v {
                    Value::String(_) => annotations.push(k.clone()),
                    other => fe.push(FieldError::invalid(
                        &format!("metadata.annotations[{}]", json_repr(&Value::String(k.clone()))),
                        json_repr(other),
                        "must be a string",
                    )),
                }
            }
        }
    }
    let kind_str = match map.get("kind") {
        Some(Value::String(s)) => Some(s.as_str()),
        None | Some(Value::Null) => defaults.map(|d| d.kind),
        Some(other) => {
            fe.push(FieldError::invalid("kind", json_repr(other), "must be a string"));
            None
        }
    };
    let kind = match kind_str {
        Some(KIND_FLOW_SCHEMA) => Some(ObjectKind::FlowSchema),
        Some(KIND_PRIORITY_LEVEL) => Some(ObjectKind::PriorityLevelConfiguration),
        Some(other) => {
            fe.push(FieldError::not_supported(
                "kind",
                json_repr(&Value::String(other.to_string())),
                &[KIND_FLOW_SCHEMA, KIND_PRIORITY_LEVEL],
            ));
            None
        }
        None => {
            if !matches!(map.get("kind"), Some(v) if !v.is_null() && !v.is_string()) {
                fe.push(FieldError::required("kind", ""));
            }
            None
        }
    };
    let av_str = match map.get("apiVersion") {
        Some(Value::String(s)) => Some(s.as_str()),
        None | Some(Value::Null) => defaults.map(|d| d.api_version).filter(|s| !s.is_empty()),
        Some(other) => {
            fe.push(FieldError::invalid("apiVersion", json_repr(other), "must be a string"));
            None
        }
    };
    let version = match av_str {
        Some(s) => match ApiVersion::parse(s) {
            Some(v) => Some(v),
            None => {
                let supported: Vec<&str> = ApiVersion::ALL.iter().map(|v| v.api_version()).collect();
                fe.push(FieldError::not_supported(
                    "apiVersion",
                    json_repr(&Value::String(s.to_string())),
                    &supported,
                ));
                None
            }
        },
        None => {
            if !matches!(map.get("apiVersion"), Some(v) if !v.is_null() && !v.is_string()) {
                fe.push(FieldError::required("apiVersion", ""));
            }
            None
        }
    };
    let origin = Origin { location: loc.to_string() };
    let (Some(kind), Some(version)) = (kind, version) else {
        let k = kind.map(|k| k.as_str()).or(kind_str).unwrap_or("object");
        push_errors(errs, &describe_object(k, &meta.name, loc), fe);
        return None;
    };
    let raw_spec = map.get("spec").cloned().unwrap_or(Value::Null);
    let spec_map = get_map(map, "spec", "spec", &mut fe);
    let condition_types = parse_condition_types(map, &mut fe);
    let obj = match kind {
        ObjectKind::FlowSchema => {
            let spec = parse_fs_spec(spec_map, &mut fe);
            ApiObject::FlowSchema(FlowSchemaObject {
                version,
                meta,
                origin,
                spec,
                condition_types,
                raw_spec,
            })
        }
        ObjectKind::PriorityLevelConfiguration => {
            let preserve_zero = annotations.iter().any(|a| a == V1BETA3_PRESERVE_ZERO_ANNOTATION);
            let spec = parse_pl_spec(spec_map, version, preserve_zero, &mut fe);
            ApiObject::PriorityLevel(PriorityLevelObject {
                version,
                meta,
                origin,
                spec,
                condition_types,
                raw_spec,
            })
        }
    };
    if fe.is_empty() {
        Some(obj)
    } else {
        push_errors(errs, &obj.describe(), fe);
        None
    }
}

fn push_errors(errs: &mut Vec<String>, prefix: &str, fe: Vec<FieldError>) {
    for e in fe {
        errs.push(format!("{prefix}: {e}"));
    }
}

fn parse_condition_types(map: &Map<String, Value>, fe: &mut Vec<FieldError>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(status) = get_map(map, "status", "status", fe) else {
        return out;
    };
    for (i, c) in get_array(status, "conditions", "status.conditions", fe).iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        if let Some(cm) = as_map(c, &path, fe) {
            out.push(get_string(cm, "type", &format!("{path}.type"), fe).unwrap_or_default());
        }
    }
    out
}

fn parse_fs_spec(spec: Option<&Map<String, Value>>, fe: &mut Vec<FieldError>) -> FlowSchemaSpec {
    let mut out = FlowSchemaSpec::default();
    if let Some(s) = spec {
        if let Some(plr) = get_map(s, "priorityLevelConfiguration", "spec.priorityLevelConfiguration", fe) {
            out.priority_level_configuration =
                get_string(plr, "name", "spec.priorityLevelConfiguration.name", fe).unwrap_or_default();
        }
        out.matching_precedence = get_i32(s, "matchingPrecedence", "spec.matchingPrecedence", fe).unwrap_or(0);
        if let Some(dm) = get_map(s, "distinguisherMethod", "spec.distinguisherMethod", fe) {
            out.distinguisher_method =
                Some(get_string(dm, "type", "spec.distinguisherMethod.type", fe).unwrap_or_default());
        }
        for (i, r) in get_array(s, "rules", "spec.rules", fe).iter().enumerate() {
            let path = format!("spec.rules[{i}]");
            if let Some(rm) = as_map(r, &path, fe) {
                out.rules.push(parse_rule(rm, &path, fe));
            }
        }
    }
    // Defaulting (`defaults.go: SetDefaults_FlowSchemaSpec`).
    if out.matching_precedence == 0 {
        out.matching_precedence = DEFAULT_MATCHING_PRECEDENCE;
    }
    out
}

fn parse_rule(rm: &Map<String, Value>, path: &str, fe: &mut Vec<FieldError>) -> RuleObject {
    let mut rule = RuleObject::default();
    for (j, sv) in get_array(rm, "subjects", &format!("{path}.subjects"), fe).iter().enumerate() {
        let sp = format!("{path}.subjects[{j}]");
        if let Some(sm) = as_map(sv, &sp, fe) {
            let mut subj = SubjectObject {
                kind: get_string(sm, "kind", &format!("{sp}.kind"), fe).unwrap_or_default(),
                ..Default::default()
            };
            if let Some(u) = get_map(sm, "user", &format!("{sp}.user"), fe) {
                subj.user = Some(get_string(u, "name", &format!("{sp}.user.name"), fe).unwrap_or_default());
            }
            if let Some(g) = get_map(sm, "group", &format!("{sp}.group"), fe) {
                subj.group = Some(get_string(g, "name", &format!("{sp}.group.name"), fe).unwrap_or_default());
            }
            if let Some(sa) = get_map(sm, "serviceAccount", &format!("{sp}.serviceAccount"), fe) {
                subj.service_account = Some(ServiceAccountObject {
                    namespace: get_string(sa, "namespace", &format!("{sp}.serviceAccount.namespace"), fe)
                        .unwrap_or_default(),
                    name: get_string(sa, "name", &format!("{sp}.serviceAccount.name"), fe).unwrap_or_default(),
                });
            }
            rule.subjects.push(subj);
        }
    }
    for (j, rv) in get_array(rm, "resourceRules", &format!("{path}.resourceRules"), fe).iter().enumerate() {
        let rp = format!("{path}.resourceRules[{j}]");
        if let Some(m) = as_map(rv, &rp, fe) {
            rule.resource_rules.push(ResourcePolicyRule {
                verbs: get_strings(m, "verbs", &format!("{rp}.verbs"), fe),
                api_groups: get_strings(m, "apiGroups", &format!("{rp}.apiGroups"), fe),
                resources: get_strings(m, "resources", &format!("{rp}.resources"), fe),
                cluster_scope: get_bool(m, "clusterScope", &format!("{rp}.clusterScope"), fe).unwrap_or(false),
                namespaces: get_strings(m, "namespaces", &format!("{rp}.namespaces"), fe),
            });
        }
    }
    for (j, nv) in get_array(rm, "nonResourceRules", &format!("{path}.nonResourceRules"), fe)
        .iter()
        .enumerate()
    {
        let np = format!("{path}.nonResourceRules[{j}]");
        if let Some(m) = as_map(nv, &np, fe) {
            rule.non_resource_rules.push(NonResourcePolicyRule {
                verbs: get_strings(m, "verbs", &format!("{np}.verbs"), fe),
                non_resource_urls: get_strings(m, "nonResourceURLs", &format!("{np}.nonResourceURLs"), fe),
            });
        }
    }
    rule
}

fn parse_pl_spec(
    spec: Option<&Map<String, Value>>,
    version: ApiVersion,
    preserve_zero: bool,
    fe: &mut Vec<FieldError>,
) -> PriorityLevelSpecObject {
    let mut out = PriorityLevelSpecObject::default();
    let Some(s) = spec else {
        return out;
    };
    out.type_ = get_string(s, "type", "spec.type", fe).unwrap_or_default();
    if let Some(l) = get_map(s, "limited", "spec.limited", fe) {
        let shares_field = version.shares_field();
        let shares_path = format!("spec.limited.{shares_field}");
        let raw_shares = get_i32(l, shares_field, &shares_path, fe);
        let nominal_concurrency_shares = match version {
            // v1: pointer; nil → 30, explicit 0 kept.
            ApiVersion::V1 => raw_shares.unwrap_or(DEFAULT_SHARES),
            // v1beta3: plain int32; 0 → 30 unless the preserve-zero annotation is present.
            ApiVersion::V1beta3 => match raw_shares.unwrap_or(0) {
                0 if !preserve_zero => DEFAULT_SHARES,
                n => n,
            },
            // v1beta1/v1beta2: 0 → 30 (zero not expressible).
            ApiVersion::V1beta2 | ApiVersion::V1beta1 => match raw_shares.unwrap_or(0) {
                0 => DEFAULT_SHARES,
                n => n,
            },
        };
        let lendable_percent =
            Some(get_i32(l, "lendablePercent", "spec.limited.lendablePercent", fe).unwrap_or(0));
        let borrowing_limit_percent =
            get_i32(l, "borrowingLimitPercent", "spec.limited.borrowingLimitPercent", fe);
        let mut limit_response = LimitResponseObject::default();
        if let Some(lr) = get_map(l, "limitResponse", "spec.limited.limitResponse", fe) {
            limit_response.type_ = get_string(lr, "type", "spec.limited.limitResponse.type", fe).unwrap_or_default();
            if let Some(q) = get_map(lr, "queuing", "spec.limited.limitResponse.queuing", fe) {
                let p = "spec.limited.limitResponse.queuing";
                let mut queuing = Queuing {
                    queues: get_i32(q, "queues", &format!("{p}.queues"), fe).unwrap_or(0),
                    hand_size: get_i32(q, "handSize", &format!("{p}.handSize"), fe).unwrap_or(0),
                    queue_length_limit: get_i32(q, "queueLengthLimit", &format!("{p}.queueLengthLimit"), fe)
                        .unwrap_or(0),
                };
                if queuing.hand_size == 0 {
                    queuing.hand_size = DEFAULT_HAND_SIZE;
                }
                if queuing.queues == 0 {
                    queuing.queues = DEFAULT_QUEUES;
                }
                if queuing.queue_length_limit == 0 {
                    queuing.queue_length_limit = DEFAULT_QUEUE_LENGTH_LIMIT;
                }
                limit_response.queuing = Some(queuing);
            }
        }
        out.limited = Some(LimitedObject {
            nominal_concurrency_shares,
            lendable_percent,
            borrowing_limit_percent,
            limit_response,
        });
    }
    if let Some(e) = get_map(s, "exempt", "spec.exempt", fe) {
        out.exempt = Some(ExemptObject {
            nominal_concurrency_shares: get_i32(e, "nominalConcurrencyShares", "spec.exempt.nominalConcurrencyShares", fe),
            lendable_percent: get_i32(e, "lendablePercent", "spec.exempt.lendablePercent", fe),
        });
    }
    // Exempt defaults: the section is created for type Exempt, and its fields nil → 0.
    if out.type_ == "Exempt" && out.exempt.is_none() {
        out.exempt = Some(ExemptObject::default());
    }
    if let Some(e) = out.exempt.as_mut() {
        e.nominal_concurrency_shares.get_or_insert(0);
        e.lendable_percent.get_or_insert(0);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Typed accessors: null / absent → None; wrong type → field error naming the path.

fn as_map<'a>(v: &'a Value, path: &str, fe: &mut Vec<FieldError>) -> Option<&'a Map<String, Value>> {
    match v {
        Value::Object(m) => Some(m),
        Value::Null => None,
        other => {
            fe.push(FieldError::invalid(path, json_repr(other), "must be an object"));
            None
        }
    }
}

fn get_map<'a>(
    m: &'a Map<String, Value>,
    key: &str,
    path: &str,
    fe: &mut Vec<FieldError>,
) -> Option<&'a Map<String, Value>> {
    m.get(key).and_then(|v| as_map(v, path, fe))
}

fn get_array<'a>(m: &'a Map<String, Value>, key: &str, path: &str, fe: &mut Vec<FieldError>) -> &'a [Value] {
    match m.get(key) {
        None | Some(Value::Null) => &[],
        Some(Value::Array(a)) => a,
        Some(other) => {
            fe.push(FieldError::invalid(path, json_repr(other), "must be a list"));
            &[]
        }
    }
}

fn get_string(m: &Map<String, Value>, key: &str, path: &str, fe: &mut Vec<FieldError>) -> Option<String> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            fe.push(FieldError::invalid(path, json_repr(other), "must be a string"));
            None
        }
    }
}

fn get_strings(m: &Map<String, Value>, key: &str, path: &str, fe: &mut Vec<FieldError>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, v) in get_array(m, key, path, fe).iter().enumerate() {
        match v {
            Value::String(s) => out.push(s.clone()),
            // Go decodes null into "" for a []string element.
            Value::Null => out.push(String::new()),
            other => fe.push(FieldError::invalid(&format!("{path}[{i}]"), json_repr(other), "must be a string")),
        }
    }
    out
}

fn get_bool(m: &Map<String, Value>, key: &str, path: &str, fe: &mut Vec<FieldError>) -> Option<bool> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            fe.push(FieldError::invalid(path, json_repr(other), "must be a boolean"));
            None
        }
    }
}

fn get_i32(m: &Map<String, Value>, key: &str, path: &str, fe: &mut Vec<FieldError>) -> Option<i32> {
    match m.get(key) {
        None | Some(Value::Null) => None,
        Some(v @ Value::Number(n)) => match n.as_i64() {
            Some(i) => match i32::try_from(i) {
                Ok(x) => Some(x),
                Err(_) => {
                    fe.push(FieldError::invalid(path, json_repr(v), "must fit in a 32-bit signed integer"));
                    None
                }
            },
            None => {
                let msg = if n.is_u64() { "must fit in a 32-bit signed integer" } else { "must be an integer" };
                fe.push(FieldError::invalid(path, json_repr(v), msg));
                None
            }
        },
        Some(other) => {
            fe.push(FieldError::invalid(path, json_repr(other), "must be an integer"));
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion to the normalized model (call on validated objects).

impl FlowSchemaObject {
    pub fn to_model(&self) -> FlowSchema {
        FlowSchema {
            name: self.meta.name.clone(),
            uid: self.meta.uid.clone(),
            matching_precedence: self.spec.matching_precedence,
            priority_level: self.spec.priority_level_configuration.clone(),
            distinguisher: match self.spec.distinguisher_method.as_deref() {
                Some("ByUser") => Some(Distinguisher::ByUser),
                Some("ByNamespace") => Some(Distinguisher::ByNamespace),
                _ => None,
            },
            rules: self
                .spec
                .rules
                .iter()
                .map(|r| PolicyRulesWithSubjects {
                    subjects: r.subjects.iter().map(SubjectObject::to_model).collect(),
                    resource_rules: r.resource_rules.clone(),
                    non_resource_rules: r.non_resource_rules.clone(),
                })
                .collect(),
        }
    }
}

impl SubjectObject {
    pub fn to_model(&self) -> Subject {
        match (self.kind.as_str(), &self.user, &self.group, &self.service_account) {
            ("User", Some(name), _, _) => Subject::User { name: name.clone() },
            ("Group", _, Some(name), _) => Subject::Group { name: name.clone() },
            ("ServiceAccount", _, _, Some(sa)) => Subject::ServiceAccount {
                namespace: sa.namespace.clone(),
                name: sa.name.clone(),
            },
            _ => Subject::Invalid,
        }
    }
}

impl PriorityLevelObject {
    pub fn to_model(&self) -> PriorityLevel {
        let spec = match (&self.spec.limited, &self.spec.exempt) {
            (Some(l), _) if self.spec.type_ != "Exempt" => PriorityLevelSpec::Limited {
                nominal_concurrency_shares: l.nominal_concurrency_shares,
                lendable_percent: l.lendable_percent.unwrap_or(0),
                borrowing_limit_percent: l.borrowing_limit_percent,
                limit_response: match (l.limit_response.type_.as_str(), l.limit_response.queuing) {
                    ("Queue", Some(q)) => LimitResponse::Queue(q),
                    _ => LimitResponse::Reject,
                },
            },
            (_, e) => {
                let e = e.clone().unwrap_or_default();
                PriorityLevelSpec::Exempt {
                    nominal_concurrency_shares: e.nominal_concurrency_shares.unwrap_or(0),
                    lendable_percent: e.lendable_percent.unwrap_or(0),
                }
            }
        };
        PriorityLevel { name: self.meta.name.clone(), uid: self.meta.uid.clone(), spec }
    }
}
