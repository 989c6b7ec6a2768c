//! Policy validation errors, shaped as upstream's `field.Error`
//! (`k8s.io/apimachinery/pkg/util/validation/field/errors.go`): the field path, the error
//! type with the offending value, and a detail; displayed with upstream's wording
//! (`spec.matchingPrecedence: Invalid value: 10001: must not be greater than 10000`). A
//! [`PolicyError`] adds the object (`FlowSchema "team-a": ...`).
use std::fmt;

/// The type of a field error (`field.ErrorType`), with the rendered value where upstream
/// prints one (strings quoted, numbers bare, compound values as JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Invalid value: <value>` (`field.Invalid`).
    Invalid(String),
    /// `Required value` (`field.Required`).
    Required,
    /// `Forbidden` (`field.Forbidden`).
    Forbidden,
    /// `Duplicate value: <value>` (`field.Duplicate`).
    Duplicate(String),
    /// `Unsupported value: <value>` (`field.NotSupported`).
    NotSupported(String),
}

/// One field error: `<field>: <kind>[: <detail>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub detail: String,
}

impl fmt::Display for FieldErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldErrorKind::Invalid(v) => write!(f, "Invalid value: {v}"),
            FieldErrorKind::Required => f.write_str("Required value"),
            FieldErrorKind::Forbidden => f.write_str("Forbidden"),
            FieldErrorKind::Duplicate(v) => write!(f, "Duplicate value: {v}"),
            FieldErrorKind::NotSupported(v) => write!(f, "Unsupported value: {v}"),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.detail.as_str() {
            "" => write!(f, "{}: {}", self.field, self.kind),
            detail => write!(f, "{}: {}: {detail}", self.field, self.kind),
        }
    }
}

impl std::error::Error for FieldError {}

/// A field error of one object of the input: `<object>: <field error>`, the object as
/// `ApiObject::describe` names it (`FlowSchema "team-a"`, with its place in the input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub object: String,
    pub error: FieldError,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.error)
    }
}

impl std::error::Error for PolicyError {}

/// Why a name is not a DNS-1123 label or subdomain (`IsDNS1123Label`, `IsDNS1123Subdomain` in
/// `k8s.io/apimachinery/pkg/util/validation/validation.go`), with upstream's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameError {
    /// Longer than `max` characters.
    TooLong { max: usize },
    /// A label (no dots) with characters outside `[-a-z0-9]` or a leading / trailing `-`.
    LabelSyntax,
    /// A valid subdomain where a label is required.
    LabelWithDots,
    /// Not a subdomain.
    SubdomainSyntax,
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::TooLong { max } => write!(f, "must be no more than {max} characters"),
            NameError::LabelWithDots => f.write_str("must not contain dots"),
            NameError::LabelSyntax => write!(f, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL_FMT}')"),
            NameError::SubdomainSyntax => write!(f, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_SUBDOMAIN_FMT}')"),
        }
    }
}

impl std::error::Error for NameError {}

/// Which response of the protected cluster was unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseKind {
    /// The API group's discovery document (`discovery::choose_version`).
    Discovery,
    /// A FlowSchema or PriorityLevelConfiguration list (`cluster::merged_config`).
    PolicyList,
}

/// A response of the protected cluster that the gateway cannot use; the message says why
/// (the gateway logs it and keeps what it has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseError {
    pub kind: ResponseKind,
    pub message: String,
}

impl ResponseError {
    pub fn discovery(message: impl Into<String>) -> ResponseError {
        ResponseError { kind: ResponseKind::Discovery, message: message.into() }
    }

    pub fn policy_list(message: impl Into<String>) -> ResponseError {
        ResponseError { kind: ResponseKind::PolicyList, message: message.into() }
    }
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ResponseError {}
