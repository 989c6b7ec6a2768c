//! Errors of the identity configuration (`identity` in the plugin configuration): a CIDR that
//! does not parse, and a source that cannot be used as configured. Displayed with the field
//! path the configuration errors use (`identity.sources[1].userHeader: ...`).
use std::fmt;

/// Which part of a CIDR is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidrProblem {
    /// Not an IPv4 or IPv6 address.
    BadAddress,
    /// Not one to three digits.
    BadPrefixLength,
    /// Longer than the address (32 for IPv4, 128 for IPv6).
    PrefixAbove(u8),
}

/// `invalid CIDR "<input>": <problem>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError {
    pub input: String,
    pub problem: CidrProblem,
}

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let input = &self.input;
        match self.problem {
            CidrProblem::BadAddress => write!(f, "invalid CIDR {input:?}: bad address"),
            CidrProblem::BadPrefixLength => write!(f, "invalid CIDR {input:?}: bad prefix length"),
            CidrProblem::PrefixAbove(max) => write!(f, "invalid CIDR {input:?}: prefix length above {max}"),
        }
    }
}

impl std::error::Error for CidrError {}

/// A source (`identity.sources[source]`) that cannot be used as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    /// An impersonation source with `setFrontProxyHeaders`.
    ImpersonationForwarded { source: usize },
    /// A `frontProxy` source with `setFrontProxyHeaders` but no `trustedSourceCidrs`.
    FrontProxyTrustsAnyone { source: usize },
    /// `userHeader` / `groupHeader` (`key`) is not an HTTP header name.
    BadHeaderName { source: usize, key: &'static str, header: String },
    /// `userClaim` / `groupsClaim` (`key`) is empty.
    EmptyClaim { source: usize, key: &'static str },
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::ImpersonationForwarded { source: i } => write!(
                f,
                "identity.sources[{i}]: an impersonation source cannot be used with setFrontProxyHeaders (the impersonated user would be forwarded as authenticated; kube-apiserver authorizes Impersonate-* headers itself, which reach it unchanged)"
            ),
            IdentityError::FrontProxyTrustsAnyone { source: i } => write!(
                f,
                "identity.sources[{i}]: a frontProxy source used with setFrontProxyHeaders needs trustedSourceCidrs (the authenticating hop's addresses); otherwise any client's X-Remote-* headers would be forwarded as its identity"
            ),
            IdentityError::BadHeaderName { source: i, key, header } => {
                write!(f, "identity.sources[{i}].{key}: {header:?} is not a valid header name")
            }
            IdentityError::EmptyClaim { source: i, key } => write!(f, "identity.sources[{i}].{key} must not be empty"),
        }
    }
}

impl std::error::Error for IdentityError {}
