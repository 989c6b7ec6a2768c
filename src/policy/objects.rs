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
use std::cell::RefCell;

use serde_json::{Map, Value};

use super::error::FieldError;
use super::model::{
    Distinguisher, FlowSchema, LimitResponse, NonResourcePolicyRule, PolicyRulesWithSubjects, PriorityLevel, PriorityLevelSpec, Queuing,
    ResourcePolicyRule, Subject,
};
use super::validation::{invalid, json_repr, not_supported, quote, required};

/// Annotation that keeps a v1beta3 `nominalConcurrencyShares: 0` from being defaulted to 30.
pub const V1BETA3_PRESERVE_ZERO_ANNOTATION: &str = "flowcontrol.k8s.io/v1beta3-preserve-zero-concurrency-shares";
pub const KIND_FLOW_SCHEMA: &str = "FlowSchema";
pub const KIND_PRIORITY_LEVEL: &str = "PriorityLevelConfiguration";
const KINDS: [&str; 2] = [KIND_FLOW_SCHEMA, KIND_PRIORITY_LEVEL];

/// Default shares of a Limited level (all versions).
pub const DEFAULT_SHARES: i32 = 30;
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
    pub const ALL: [ApiVersion; 4] = [ApiVersion::V1, ApiVersion::V1beta1, ApiVersion::V1beta2, ApiVersion::V1beta3];

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

/// The parts of `metadata` we use.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectMeta {
    pub name: String,
    pub uid: String,
    pub namespace: String,
}

/// One API object of either kind, with its kind-specific `spec`.
#[derive(Debug, Clone, PartialEq)]
pub struct Object<S> {
    pub version: ApiVersion,
    pub meta: ObjectMeta,
    /// Where the object came from in the input (`items[3]`, `[0]`, or empty for a single
    /// object; `built-in` for Kubernetes' own).
    pub location: String,
    pub spec: S,
    /// `status.conditions[*].type`, in order.
    pub condition_types: Vec<String>,
    /// The `spec` exactly as written (for the mandatory-object error message).
    pub raw_spec: Value,
}

pub type FlowSchemaObject = Object<FlowSchemaSpec>;
pub type PriorityLevelObject = Object<PriorityLevelSpecObject>;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlowSchemaSpec {
    pub priority_level_configuration: String,
    pub matching_precedence: i32,
    /// `distinguisherMethod.type`, `None` when there is no `distinguisherMethod`.
    pub distinguisher_method: Option<String>,
    pub rules: Vec<RuleObject>,
}

pub type RuleObject = PolicyRulesWithSubjects<SubjectObject>;

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
    pub lendable_percent: i32,
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
    pub nominal_concurrency_shares: i32,
    pub lendable_percent: i32,
}

/// One parsed, defaulted API object.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiObject {
    FlowSchema(FlowSchemaObject),
    PriorityLevel(PriorityLevelObject),
}

impl ApiObject {
    /// Kind, version, metadata and origin.
    fn header(&self) -> (&'static str, ApiVersion, &ObjectMeta, &str) {
        match self {
            ApiObject::FlowSchema(f) => (KIND_FLOW_SCHEMA, f.version, &f.meta, &f.location),
            ApiObject::PriorityLevel(p) => (KIND_PRIORITY_LEVEL, p.version, &p.meta, &p.location),
        }
    }
    pub fn name(&self) -> &str {
        &self.header().2.name
    }
    pub fn version(&self) -> ApiVersion {
        self.header().1
    }
    /// Error prefix: `FlowSchema "team-a"` (or `FlowSchema at items[2]` when unnamed).
    pub fn describe(&self) -> String {
        let (kind, _, meta, location) = self.header();
        describe_object(kind, &meta.name, location)
    }
}

/// `Kind "name"`, or `Kind at <location>` / `Kind (unnamed)` when the name is empty.
pub fn describe_object(kind: &str, name: &str, location: &str) -> String {
    match (name, location) {
        ("", "") => format!("{kind} (unnamed)"),
        ("", location) => format!("{kind} at {location}"),
        (name, _) => format!("{kind} {}", quote(name)),
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

/// Defaults for items of a typed list (`FlowSchemaList` items may omit kind / apiVersion):
/// `(kind, apiVersion)`.
type ItemDefaults<'a> = Option<(&'a str, &'a str)>;

fn collect<'a>(v: &'a Value, loc: &str, defaults: ItemDefaults<'a>, depth: usize, objs: &mut Vec<ApiObject>, errs: &mut Vec<String>) {
    let here = if loc.is_empty() { "input" } else { loc };
    if depth > MAX_CONTAINER_DEPTH {
        return errs.push(format!("{here}: lists nested too deeply"));
    }
    let (items, prefix, item_defaults) = match v {
        Value::Array(items) => (items, loc.to_string(), None),
        Value::Object(map) => {
            let kind = map.get("kind").and_then(Value::as_str).or(defaults.map(|d| d.0));
            if !kind.map_or(map.contains_key("items"), |k| k.ends_with("List")) {
                objs.extend(parse_object(map, loc, defaults, errs));
                return;
            }
            let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            let item_kind = kind.and_then(|k| k.strip_suffix("List")).filter(|k| KINDS.contains(k));
            let item_defaults = item_kind.map(|k| (k, api_version));
            let prefix = if loc.is_empty() { "items".to_string() } else { format!("{loc}.items") };
            match map.get("items") {
                None | Some(Value::Null) => return,
                Some(Value::Array(items)) => (items, prefix, item_defaults),
                Some(other) => return errs.push(invalid(&prefix, json_repr(other), "must be a list").to_string()),
            }
        }
        other => {
            let detail = "expected a FlowSchema or PriorityLevelConfiguration object, an array of them, or a List";
            return errs.push(invalid(here, json_repr(other), detail).to_string());
        }
    };
    for (i, item) in items.iter().enumerate() {
        collect(item, &format!("{prefix}[{i}]"), item_defaults, depth + 1, objs, errs);
    }
}

fn parse_object<'a>(map: &'a Map<String, Value>, loc: &str, defaults: ItemDefaults<'a>, errs: &mut Vec<String>) -> Option<ApiObject> {
    let fe = RefCell::new(Vec::new());
    let root = Node { m: map, path: String::new(), fe: &fe };
    // metadata first: the name is needed for error prefixes.
    let mut meta = ObjectMeta::default();
    let mut preserve_zero = false;
    if let Some(m) = root.obj("metadata") {
        meta = ObjectMeta { name: m.str("name"), uid: m.str("uid"), namespace: m.str("namespace") };
        for (k, v) in m.obj("annotations").into_iter().flat_map(|a| a.m) {
            if v.is_string() {
                preserve_zero |= k == V1BETA3_PRESERVE_ZERO_ANNOTATION;
            } else {
                let path = format!("metadata.annotations[{}]", quote(k));
                fe.borrow_mut().push(invalid(&path, json_repr(v), "must be a string"));
            }
        }
    }
    let kind_str = root.header("kind", defaults.map(|d| d.0), &KINDS);
    let api_version = defaults.map(|d| d.1).filter(|s| !s.is_empty());
    let supported = ApiVersion::ALL.map(ApiVersion::api_version);
    let version = root.header("apiVersion", api_version, &supported).and_then(ApiVersion::parse);
    let prefix = describe_object(kind_str.unwrap_or("object"), &meta.name, loc);
    let obj = kind_str.filter(|k| KINDS.contains(k)).zip(version).map(|(kind, version)| {
        let location = loc.to_string();
        let raw_spec = map.get("spec").cloned().unwrap_or(Value::Null);
        // An absent spec reads as an empty one (all defaults).
        let no_spec = Map::new();
        let spec = root.obj("spec").unwrap_or(Node { m: &no_spec, path: "spec.".to_string(), fe: &fe });
        let condition_types = match root.obj("status") {
            Some(status) => status.objs("conditions", |c| c.str("type")),
            None => Vec::new(),
        };
        if kind == KIND_FLOW_SCHEMA {
            let spec = parse_fs_spec(spec);
            ApiObject::FlowSchema(Object { version, meta, location, spec, condition_types, raw_spec })
        } else {
            let preserve_zero = preserve_zero && version == ApiVersion::V1beta3;
            let spec = parse_pl_spec(spec, version, preserve_zero);
            ApiObject::PriorityLevel(Object { version, meta, location, spec, condition_types, raw_spec })
        }
    });
    let fe = fe.into_inner();
    if fe.is_empty() {
        return obj;
    }
    errs.extend(fe.iter().map(|e| format!("{prefix}: {e}")));
    None
}

fn parse_fs_spec(s: Node) -> FlowSchemaSpec {
    let level = s.obj("priorityLevelConfiguration").map(|plr| plr.str("name"));
    // Defaulting (`defaults.go: SetDefaults_FlowSchemaSpec`): 0 → 1000.
    let precedence = s.int("matchingPrecedence").filter(|p| *p != 0);
    FlowSchemaSpec {
        priority_level_configuration: level.unwrap_or_default(),
        matching_precedence: precedence.unwrap_or(DEFAULT_MATCHING_PRECEDENCE),
        distinguisher_method: s.obj("distinguisherMethod").map(|dm| dm.str("type")),
        rules: s.objs("rules", parse_rule),
    }
}

fn parse_rule(r: Node) -> RuleObject {
    RuleObject {
        subjects: r.objs("subjects", |s| SubjectObject {
            kind: s.str("kind"),
            user: s.obj("user").map(|u| u.str("name")),
            group: s.obj("group").map(|g| g.str("name")),
            service_account: s
                .obj("serviceAccount")
                .map(|sa| ServiceAccountObject { namespace: sa.str("namespace"), name: sa.str("name") }),
        }),
        resource_rules: r.objs("resourceRules", |m| ResourcePolicyRule {
            verbs: m.strs("verbs"),
            api_groups: m.strs("apiGroups"),
            resources: m.strs("resources"),
            cluster_scope: m.get("clusterScope", |v| v.as_bool().ok_or("must be a boolean")) == Some(true),
            namespaces: m.strs("namespaces"),
        }),
        non_resource_rules: r
            .objs("nonResourceRules", |m| NonResourcePolicyRule { verbs: m.strs("verbs"), non_resource_urls: m.strs("nonResourceURLs") }),
    }
}

fn parse_pl_spec(s: Node, version: ApiVersion, preserve_zero: bool) -> PriorityLevelSpecObject {
    let type_ = s.str("type");
    let limited = s.obj("limited").map(|l| {
        let shares = l.int(version.shares_field());
        let nominal_concurrency_shares = match version {
            // v1: pointer; nil → 30, explicit 0 kept.
            ApiVersion::V1 => shares.unwrap_or(DEFAULT_SHARES),
            // v1beta3: plain int32; 0 → 30 unless the preserve-zero annotation is present.
            // v1beta1/v1beta2: 0 → 30 (zero not expressible).
            _ => match shares.unwrap_or(0) {
                0 if !preserve_zero => DEFAULT_SHARES,
                n => n,
            },
        };
        let lendable_percent = l.int("lendablePercent").unwrap_or(0);
        let borrowing_limit_percent = l.int("borrowingLimitPercent");
        let limit_response = l.obj("limitResponse").map(|lr| LimitResponseObject {
            type_: lr.str("type"),
            queuing: lr.obj("queuing").map(|q| {
                let int_or = |key, default| q.int(key).filter(|n| *n != 0).unwrap_or(default);
                Queuing {
                    queues: int_or("queues", DEFAULT_QUEUES),
                    hand_size: int_or("handSize", DEFAULT_HAND_SIZE),
                    queue_length_limit: int_or("queueLengthLimit", DEFAULT_QUEUE_LENGTH_LIMIT),
                }
            }),
        });
        let limit_response = limit_response.unwrap_or_default();
        LimitedObject { nominal_concurrency_shares, lendable_percent, borrowing_limit_percent, limit_response }
    });
    // Exempt defaults: the section is created for type Exempt, and its fields nil → 0.
    let exempt = s.obj("exempt").map(|e| ExemptObject {
        nominal_concurrency_shares: e.int("nominalConcurrencyShares").unwrap_or(0),
        lendable_percent: e.int("lendablePercent").unwrap_or(0),
    });
    let exempt = exempt.or_else(|| (type_ == "Exempt").then(ExemptObject::default));
    PriorityLevelSpecObject { type_, limited, exempt }
}

// ---------------------------------------------------------------------------------------------
// Typed access: null / absent → None; wrong type → field error naming the path.

/// A JSON object being read, with the path prefix of its fields (`spec.limited.`; empty for the
/// object itself) and the field errors found so far in its object.
struct Node<'a> {
    m: &'a Map<String, Value>,
    path: String,
    fe: &'a RefCell<Vec<FieldError>>,
}

type Conv<'a, T> = fn(&'a Value) -> Result<T, &'static str>;

fn as_object(v: &Value) -> Result<&Map<String, Value>, &'static str> {
    v.as_object().ok_or("must be an object")
}

fn as_string(v: &Value) -> Result<String, &'static str> {
    v.as_str().map(str::to_string).ok_or("must be a string")
}

impl<'a> Node<'a> {
    fn error<T>(&self, e: FieldError) -> Option<T> {
        self.fe.borrow_mut().push(e);
        None
    }

    /// `conv` of `v` at `path`.
    fn typed<T>(&self, v: &'a Value, path: &str, conv: Conv<'a, T>) -> Option<T> {
        match conv(v) {
            _ if v.is_null() => None,
            Ok(t) => Some(t),
            Err(msg) => self.error(invalid(path, json_repr(v), msg)),
        }
    }

    fn get<T>(&self, key: &str, conv: Conv<'a, T>) -> Option<T> {
        self.typed(self.m.get(key)?, &format!("{}{key}", self.path), conv)
    }

    /// `kind` / `apiVersion`: its string value, else `default`; required unless defaulted, and
    /// one of `supported`.
    fn header(&self, key: &str, default: Option<&'a str>, supported: &[&str]) -> Option<&'a str> {
        let value = match self.m.get(key).filter(|v| !v.is_null()) {
            Some(_) => self.get(key, |v| v.as_str().ok_or("must be a string")),
            None if default.is_none() => self.error(required(key, "")),
            None => default,
        };
        if let Some(s) = value.filter(|s| !supported.contains(s)) {
            self.fe.borrow_mut().push(not_supported(key, quote(s), supported));
        }
        value
    }

    fn obj(&self, key: &str) -> Option<Node<'a>> {
        let m = self.get(key, as_object)?;
        Some(Node { m, path: format!("{}{key}.", self.path), fe: self.fe })
    }

    /// A string member, "" when absent.
    fn str(&self, key: &str) -> String {
        self.get(key, as_string).unwrap_or_default()
    }

    fn int(&self, key: &str) -> Option<i32> {
        self.get(key, |v| match v.as_i64().or(v.as_u64().map(|_| i64::MAX)) {
            Some(i) => i32::try_from(i).map_err(|_| "must fit in a 32-bit signed integer"),
            None => Err("must be an integer"),
        })
    }

    /// `f` of each member of the list `key` and its path, where `f` gives a value.
    fn each<T>(&self, key: &str, mut f: impl FnMut(String, &'a Value) -> Option<T>) -> Vec<T> {
        let list = self.get(key, |v| v.as_array().ok_or("must be a list"));
        let list = list.map_or(&[][..], Vec::as_slice).iter().enumerate();
        list.filter_map(|(i, v)| f(format!("{}{key}[{i}]", self.path), v)).collect()
    }

    /// `f` of each object in the list `key` (`null` members are skipped).
    fn objs<T>(&self, key: &str, mut f: impl FnMut(Node<'a>) -> T) -> Vec<T> {
        self.each(key, |path, v| {
            let m = self.typed(v, &path, as_object)?;
            Some(f(Node { m, path: format!("{path}."), fe: self.fe }))
        })
    }

    fn strs(&self, key: &str) -> Vec<String> {
        self.each(key, |path, v| match v {
            // Go decodes null into "" for a []string element.
            Value::Null => Some(String::new()),
            v => self.typed(v, &path, as_string),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion to the normalized model (call on validated objects).

impl FlowSchemaObject {
    pub fn to_model(&self) -> FlowSchema {
        let rules = self.spec.rules.iter().map(|r| PolicyRulesWithSubjects {
            subjects: r.subjects.iter().map(SubjectObject::to_model).collect(),
            resource_rules: r.resource_rules.clone(),
            non_resource_rules: r.non_resource_rules.clone(),
        });
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
            rules: rules.collect(),
        }
    }
}

impl SubjectObject {
    pub fn to_model(&self) -> Subject {
        match (self.kind.as_str(), &self.user, &self.group, &self.service_account) {
            ("User", Some(name), _, _) => Subject::User { name: name.clone() },
            ("Group", _, Some(name), _) => Subject::Group { name: name.clone() },
            ("ServiceAccount", _, _, Some(sa)) => Subject::ServiceAccount { namespace: sa.namespace.clone(), name: sa.name.clone() },
            _ => Subject::Invalid,
        }
    }
}

impl PriorityLevelObject {
    pub fn to_model(&self) -> PriorityLevel {
        let spec = match &self.spec.limited {
            Some(l) if self.spec.type_ != "Exempt" => PriorityLevelSpec::Limited {
                nominal_concurrency_shares: l.nominal_concurrency_shares,
                lendable_percent: l.lendable_percent,
                borrowing_limit_percent: l.borrowing_limit_percent,
                limit_response: match (l.limit_response.type_.as_str(), l.limit_response.queuing) {
                    ("Queue", Some(q)) => LimitResponse::Queue(q),
                    _ => LimitResponse::Reject,
                },
            },
            _ => {
                let ExemptObject { nominal_concurrency_shares, lendable_percent } = self.spec.exempt.clone().unwrap_or_default();
                PriorityLevelSpec::Exempt { nominal_concurrency_shares, lendable_percent }
            }
        };
        PriorityLevel { name: self.meta.name.clone(), uid: self.meta.uid.clone(), spec }
    }
}
