//! Caller identity (user name and groups) from the sources the operator enables, as
//! kube-apiserver's authenticators derive it (`request/headerrequest/requestheader.go`,
//! `request/x509/x509.go: CommonNameUserConversion`, `endpoints/filters/impersonation.go`).
//!
//! kube-apiserver classifies the *authenticated, impersonated* user. A gateway has to take the
//! identity from an authenticating hop: front-proxy headers (`X-Remote-User` / `X-Remote-Group`
//! / `X-Remote-Extra-*`), impersonation headers (`Impersonate-User` / `Impersonate-Group`), the
//! verified client certificate (CN = user, O = groups) or JWT claims validated by Envoy's
//! `jwt_authn` filter. Sources are tried in configuration order; the first that yields a user
//! wins. A source only counts when the peer is trusted for it (`trustedSourceCidrs`, absent =
//! any peer; `requireMtls`); with `stripUntrusted` its headers are removed from requests from
//! untrusted peers (see [`IdentityConfig::headers_to_strip`]).
//!
//! With `setFrontProxyHeaders` the filter is the authenticating front proxy itself: every
//! client-supplied `X-Remote-*` header is removed and the identity derived here (from what Envoy
//! verified) is written as `X-Remote-User` / `X-Remote-Group` / `X-Remote-Extra-*` for the
//! upstream kube-apiserver's request-header authenticator (see
//! [`IdentityConfig::front_proxy_headers`]). The apiserver then authenticates exactly the
//! identity classified here: a verified credential whose user cannot be forwarded is refused
//! (`403`), and an anonymous request loses the other credentials kube-apiserver would
//! authenticate instead (`Authorization`, the WebSocket bearer-token subprotocol).
//!
//! Groups are completed as kube-apiserver does: authenticated users get `system:authenticated`
//! (unless they already carry it or `system:unauthenticated`); service accounts
//! `system:serviceaccount:<ns>:<name>` get `system:serviceaccounts` and
//! `system:serviceaccounts:<ns>` (for impersonation only when no groups were given, as the
//! impersonation filter does); nobody → `system:anonymous` in `system:unauthenticated`.
//!
//! Deviation: a group header value containing `,` counts as several groups. Envoy (and HTTP in
//! general) may join repeated headers with commas, so `X-Remote-Group: a, b` is read as groups
//! `a` and `b` (each trimmed, empty pieces dropped). kube-apiserver would read one group `a, b`;
//! group names containing commas therefore cannot be expressed through headers here.
//! Header values that are not UTF-8 are ignored (never a panic).

use crate::digest::identity_error::{CidrError, CidrProblem, IdentityError};
use crate::digest::request_info::hex_byte;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::net::IpAddr;
use std::str::FromStr;

pub const ANONYMOUS: &str = "system:anonymous";
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
pub const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
pub const SA_PREFIX: &str = "system:serviceaccount:";
pub const ALL_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";

/// `"identity"` key of the plugin configuration.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IdentityConfig {
    #[serde(default)]
    pub sources: Vec<IdentitySource>,
    /// Act as kube-apiserver's authenticating front proxy: remove every client-supplied
    /// `X-Remote-*` header and write the identity derived here as `X-Remote-User`,
    /// `X-Remote-Group` (one header per group) and `X-Remote-Extra-*`, on every request.
    #[serde(default)]
    pub set_front_proxy_headers: bool,
}

/// A CIDR block (IPv4 or IPv6). A bare address means a single host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, CidrError> {
        let s = s.trim();
        let err = |problem| CidrError { input: s.to_string(), problem };
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr = IpAddr::from_str(a).map_err(|_| err(CidrProblem::BadAddress))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            // Digits only (no sign), at most three of them.
            Some(p) => p
                .parse()
                .ok()
                .filter(|_| p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| err(CidrProblem::BadPrefixLength))?,
        };
        if prefix > max {
            return Err(err(CidrProblem::PrefixAbove(max)));
        }
        Ok(Cidr { addr, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Cidr::from_str(&s).map_err(serde::de::Error::custom)
    }
}

impl Cidr {
    /// Whether `ip` is inside the block (IPv4-mapped IPv6 peers match IPv4 blocks).
    pub fn contains(&self, ip: IpAddr) -> bool {
        // The leading zeros of `block ^ ip` are the leading bits both share.
        let common_bits = match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(p)) => (u32::from(n) ^ u32::from(p)).leading_zeros(),
            (IpAddr::V6(n), IpAddr::V6(p)) => (u128::from(n) ^ u128::from(p)).leading_zeros(),
            _ => return false,
        };
        common_bits >= u32::from(self.prefix)
    }
}

fn default_user_header() -> String {
    "X-Remote-User".into()
}
fn default_group_header() -> String {
    "X-Remote-Group".into()
}
fn default_extra_prefix() -> String {
    "X-Remote-Extra-".into()
}
fn default_sub() -> String {
    "sub".into()
}
fn default_groups() -> String {
    "groups".into()
}

/// One identity source. Every kind accepts `trustedSourceCidrs`, `requireMtls`, `stripUntrusted`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
#[serde(rename_all_fields = "camelCase")]
pub enum IdentitySource {
    FrontProxy {
        #[serde(default = "default_user_header")]
        user_header: String,
        #[serde(default = "default_group_header")]
        group_header: String,
        #[serde(default = "default_extra_prefix")]
        extra_header_prefix: String,
        #[serde(default)]
        trusted_source_cidrs: Vec<Cidr>,
        #[serde(default)]
        require_mtls: bool,
        #[serde(default)]
        strip_untrusted: bool,
    },
    Impersonation {
        #[serde(default)]
        trusted_source_cidrs: Vec<Cidr>,
        #[serde(default)]
        require_mtls: bool,
        #[serde(default)]
        strip_untrusted: bool,
    },
    ClientCertificate {
        #[serde(default)]
        trusted_source_cidrs: Vec<Cidr>,
        /// Always effectively true (a certificate is only used when verified).
        #[serde(default)]
        require_mtls: bool,
        #[serde(default)]
        strip_untrusted: bool,
    },
    Jwt {
        /// The `payload_in_metadata` name configured in Envoy's jwt_authn filter.
        #[serde(default = "default_jwt_metadata_key")]
        metadata_key: String,
        #[serde(default = "default_sub")]
        user_claim: String,
        #[serde(default = "default_groups")]
        groups_claim: String,
        /// Prepended to the user claim (like `--oidc-username-prefix`).
        #[serde(default)]
        user_prefix: String,
        /// Prepended to each group (like `--oidc-groups-prefix`).
        #[serde(default)]
        groups_prefix: String,
        #[serde(default)]
        trusted_source_cidrs: Vec<Cidr>,
        #[serde(default)]
        require_mtls: bool,
        #[serde(default)]
        strip_untrusted: bool,
    },
}

fn default_jwt_metadata_key() -> String {
    "jwt_payload".to_string()
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

impl IdentitySource {
    /// The source's trust rules: (`trustedSourceCidrs`, `requireMtls`, `stripUntrusted`).
    pub fn trust(&self) -> (&[Cidr], bool, bool) {
        match self {
            IdentitySource::FrontProxy { trusted_source_cidrs, require_mtls, strip_untrusted, .. }
            | IdentitySource::Impersonation { trusted_source_cidrs, require_mtls, strip_untrusted }
            | IdentitySource::ClientCertificate { trusted_source_cidrs, require_mtls, strip_untrusted }
            | IdentitySource::Jwt { trusted_source_cidrs, require_mtls, strip_untrusted, .. } => {
                (trusted_source_cidrs, *require_mtls, *strip_untrusted)
            }
        }
    }

    /// Whether this source may be used for a request from this peer.
    pub fn trusted(&self, input: &IdentityInput) -> bool {
        let (cidrs, mtls, _) = self.trust();
        (!mtls || input.mtls) && (cidrs.is_empty() || input.peer.is_some_and(|ip| cidrs.iter().any(|c| c.contains(ip))))
    }

    /// The exact header names this source reads and the header-name prefix it reads, as
    /// configured (any case; compare without case).
    fn headers_read(&self) -> ([Option<&str>; 3], Option<&str>) {
        match self {
            IdentitySource::FrontProxy { user_header, group_header, extra_header_prefix, .. } => {
                ([Some(user_header), Some(group_header), None], Some(extra_header_prefix.as_str()).filter(|p| !p.is_empty()))
            }
            IdentitySource::Impersonation { .. } => {
                ([Some(IMPERSONATE_USER), Some(IMPERSONATE_GROUP), Some(IMPERSONATE_UID)], Some(IMPERSONATE_EXTRA))
            }
            _ => ([None; 3], None),
        }
    }

    /// Whether this source reads the header `lname` (lowercase); allocates nothing (it runs
    /// for every header of a request whose identity headers are stripped).
    fn reads(&self, lname: &str) -> bool {
        debug_assert!(!lname.bytes().any(|b| b.is_ascii_uppercase()), "{lname:?} is not lowercase");
        let (names, prefix) = self.headers_read();
        let starts_with = |p: &str| lname.as_bytes().get(..p.len()).is_some_and(|head| head.eq_ignore_ascii_case(p.as_bytes()));
        names.into_iter().flatten().any(|n| n.eq_ignore_ascii_case(lname)) || prefix.is_some_and(starts_with)
    }
}

/// What the host tells us about one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityInput<'a> {
    /// Lowercase names, repeated headers as separate entries, in order.
    pub headers: &'a [(&'a str, &'a [u8])],
    pub peer: Option<IpAddr>,
    /// The peer presented a verified client certificate.
    pub mtls: bool,
    /// RFC 2253-ish subject, e.g. `CN=alice,O=dev,O=ops`.
    pub cert_subject: Option<&'a str>,
    pub jwt_claims: Option<&'a serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo { name: ANONYMOUS.into(), groups: vec![ALL_UNAUTHENTICATED.into()] }
    }

    /// An already-authenticated user: `groups` plus `system:authenticated` (and the service
    /// account groups for `system:serviceaccount:<ns>:<name>`), as the authenticators do.
    pub fn authenticated(name: &str, groups: &[String]) -> Self {
        let mut user = UserInfo::default();
        finalize_into(&mut user, name, &StatedGroups::Owned(groups.to_vec()), true);
        user
    }
}

/// `system:serviceaccount:<ns>:<name>` → `<ns>` (upstream `SplitUsername`: both parts
/// non-empty, no further `:`).
pub fn service_account_namespace(user: &str) -> Option<&str> {
    let (ns, name) = user.strip_prefix(SA_PREFIX)?.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some(ns)
}

/// Writes a group list into a vector whose strings' buffers are reused (`done`: the rest is
/// dropped).
struct GroupsWriter<'v> {
    groups: &'v mut Vec<String>,
    len: usize,
}

impl GroupsWriter<'_> {
    fn written(&self) -> &[String] {
        self.groups.get(..self.len).unwrap_or_default()
    }
    fn contains(&self, g: &str) -> bool {
        self.written().iter().any(|x| x == g)
    }
    /// Appends the concatenation of `parts`.
    fn push(&mut self, parts: &[&str]) {
        match self.groups.get_mut(self.len) {
            Some(slot) => slot.clear(),
            None => self.groups.push(String::new()),
        }
        if let Some(slot) = self.groups.get_mut(self.len) {
            parts.iter().for_each(|p| slot.push_str(p));
        }
        self.len += 1;
    }
    fn push_unique(&mut self, g: &str) {
        if !self.contains(g) {
            self.push(&[g]);
        }
    }
    fn done(self) {
        self.groups.truncate(self.len);
    }
}

/// The user `name` in `groups`, completed as the authenticators do, written into `out` (its
/// buffers reused).
fn finalize_into(out: &mut UserInfo, name: &str, groups: &StatedGroups, add_sa_groups: bool) {
    out.name.clear();
    out.name.push_str(name);
    let mut w = GroupsWriter { groups: &mut out.groups, len: 0 };
    groups.each(|g| {
        w.push(&[g]);
        true
    });
    if add_sa_groups {
        if let Some(ns) = service_account_namespace(name) {
            w.push_unique(ALL_SERVICE_ACCOUNTS);
            const NS_GROUP: &str = "system:serviceaccounts:";
            if !w.written().iter().any(|g| g.strip_prefix(NS_GROUP) == Some(ns)) {
                w.push(&[NS_GROUP, ns]);
            }
        }
    }
    if name == ANONYMOUS {
        w.push_unique(ALL_UNAUTHENTICATED);
    } else if !w.written().iter().any(|g| g == ALL_AUTHENTICATED || g == ALL_UNAUTHENTICATED) {
        w.push(&[ALL_AUTHENTICATED]);
    }
    w.done();
}

fn header_values<'a>(input: &IdentityInput<'a>, lname: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    input.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(lname)).filter_map(|(_, v)| std::str::from_utf8(v).ok()).map(trim)
}

/// `str::trim` (Unicode white space), with a shortcut for the common value that starts and ends
/// with a visible ASCII character (none of which is white space).
fn trim(s: &str) -> &str {
    match (s.as_bytes().first(), s.as_bytes().last()) {
        (Some(first), Some(last)) if first.is_ascii_graphic() && last.is_ascii_graphic() => s,
        _ => s.trim(),
    }
}

fn first_non_empty<'a>(input: &IdentityInput<'a>, lname: &'a str) -> Option<&'a str> {
    header_values(input, lname).find(|v| !v.is_empty())
}

/// The groups a source states.
enum StatedGroups<'a> {
    /// The comma-separated pieces of every value of the header `lname` (any case), each trimmed,
    /// empty ones dropped; read from the request's headers when needed, never copied.
    Headers {
        input: IdentityInput<'a>,
        lname: &'a str,
    },
    Owned(Vec<String>),
}

impl StatedGroups<'_> {
    /// Calls `f` with each group, in order, until it returns `false`.
    fn each<'s>(&'s self, mut f: impl FnMut(&'s str) -> bool) {
        // Plain loops: a `flat_map` chain here costs measurably more on the request path.
        match self {
            StatedGroups::Headers { input, lname } => {
                for v in header_values(input, lname) {
                    for g in v.split(',').map(trim).filter(|g| !g.is_empty()) {
                        if !f(g) {
                            return;
                        }
                    }
                }
            }
            StatedGroups::Owned(groups) => {
                for g in groups {
                    if !f(g) {
                        return;
                    }
                }
            }
        }
    }
    fn to_vec(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.each(|g| {
            out.push(g);
            true
        });
        out
    }
    fn is_empty(&self) -> bool {
        let mut empty = true;
        self.each(|_| {
            empty = false;
            false
        });
        empty
    }
}

/// Splits an RFC 2253 subject into (attribute, value) pairs, honouring `\` escapes
/// (`\,` and `\XX` hex). Multi-valued RDNs (`+`) are split too.
pub fn parse_subject(s: &str) -> Vec<(String, String)> {
    let b = s.as_bytes();
    let mut rdns = Vec::new();
    let mut cur = Vec::new();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        i += 1;
        match c {
            b'\\' => {
                let (byte, len) = match b.get(i..).and_then(hex_byte) {
                    Some(d) => (Some(d), 2),
                    None => (b.get(i).copied(), 1),
                };
                cur.extend(byte);
                i += len;
            }
            b',' | b'+' | b';' => rdns.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    rdns.push(cur);
    let pair = |t: &str| t.split_once('=').map(|(k, v)| (k.trim().to_string(), v.to_string()));
    rdns.iter().filter_map(|rdn| pair(&String::from_utf8_lossy(rdn))).collect()
}

/// What one source says about the caller, before group completion (borrowed from the request
/// where the source reads headers).
struct Stated<'a> {
    name: Cow<'a, str>,
    groups: StatedGroups<'a>,
    /// Service-account groups are added on completion (not for impersonation with groups).
    add_sa_groups: bool,
}

fn raw_from_source<'a>(src: &'a IdentitySource, input: &IdentityInput<'a>) -> Option<Stated<'a>> {
    match src {
        IdentitySource::FrontProxy { user_header, group_header, .. } => {
            // Header names are compared ignoring ASCII case: no need to lowercase them.
            let name = first_non_empty(input, user_header)?.into();
            let groups = StatedGroups::Headers { input: *input, lname: group_header };
            Some(Stated { name, groups, add_sa_groups: true })
        }
        IdentitySource::Impersonation { .. } => {
            let name = first_non_empty(input, IMPERSONATE_USER)?.into();
            let groups = StatedGroups::Headers { input: *input, lname: IMPERSONATE_GROUP };
            Some(Stated { add_sa_groups: groups.is_empty(), name, groups })
        }
        IdentitySource::ClientCertificate { .. } => {
            let subject = parse_subject(input.cert_subject.filter(|_| input.mtls)?);
            let is = |k: &str, a: &str, oid: &str| k.eq_ignore_ascii_case(a) || k == oid;
            let name = subject.iter().find(|(k, _)| is(k, "CN", "2.5.4.3")).map(|(_, v)| v.clone());
            let name = name.filter(|n| !n.is_empty())?;
            let groups = subject.iter().filter(|(k, _)| is(k, "O", "2.5.4.10")).map(|(_, v)| v.clone()).collect();
            Some(Stated { name: name.into(), groups: StatedGroups::Owned(groups), add_sa_groups: true })
        }
        IdentitySource::Jwt { user_claim, groups_claim, user_prefix, groups_prefix, .. } => {
            let claims = input.jwt_claims?;
            let user = claims.get(user_claim.as_str())?.as_str().filter(|u| !u.is_empty())?;
            let groups: Vec<&str> = match claims.get(groups_claim.as_str()) {
                Some(serde_json::Value::String(g)) => vec![g],
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
                _ => Vec::new(),
            };
            let groups = groups.into_iter().filter(|g| !g.is_empty());
            let groups = StatedGroups::Owned(groups.map(|g| format!("{groups_prefix}{g}")).collect());
            Some(Stated { name: format!("{user_prefix}{user}").into(), groups, add_sa_groups: true })
        }
    }
}

/// The first trusted source that yields a user, with what it said (before group completion).
fn first_source<'c>(cfg: &'c IdentityConfig, input: &IdentityInput<'c>) -> Option<(&'c IdentitySource, Stated<'c>)> {
    cfg.sources.iter().filter(|s| s.trusted(input)).find_map(|s| raw_from_source(s, input).map(|r| (s, r)))
}

/// The caller's identity: the first trusted source yielding a user wins; else anonymous.
pub fn identify(cfg: &IdentityConfig, input: &IdentityInput) -> UserInfo {
    cfg.identified(input).user()
}

/// One request's identity as its sources state it, derived once per request and used twice:
/// to classify the caller ([`Identified::user`]) and to forward the identity upstream
/// ([`Identified::front_proxy_headers`]). What header sources state stays borrowed from the
/// request.
pub struct Identified<'c> {
    cfg: &'c IdentityConfig,
    /// The first trusted source that yields a user, with what it said.
    winner: Option<(&'c IdentitySource, Stated<'c>)>,
}

impl Identified<'_> {
    /// The caller, groups completed (anonymous when no source yields a user).
    pub fn user(self) -> UserInfo {
        let mut user = UserInfo::default();
        self.user_into(&mut user);
        user
    }

    /// [`Identified::user`] written into `out`, its buffers reused (a caller like the previous
    /// one allocates nothing).
    pub fn user_into(&self, out: &mut UserInfo) {
        match &self.winner {
            Some((_, st)) => finalize_into(out, &st.name, &st.groups, st.add_sa_groups),
            None => {
                out.name.clear();
                out.name.push_str(ANONYMOUS);
                let mut w = GroupsWriter { groups: &mut out.groups, len: 0 };
                w.push(&[ALL_UNAUTHENTICATED]);
                w.done();
            }
        }
    }

    /// [`IdentityConfig::front_proxy_headers`] of this identity (`input`: the one it was
    /// derived from).
    pub fn front_proxy_headers<'n>(
        &self,
        input: &IdentityInput,
        request_headers: impl IntoIterator<Item = (&'n str, &'n [u8])>,
    ) -> FrontProxyHeaders {
        let mut out = FrontProxyHeaders::default();
        if !self.cfg.set_front_proxy_headers {
            return out;
        }
        let proxy_sources: Vec<&IdentitySource> =
            self.cfg.sources.iter().filter(|s| matches!(s, IdentitySource::FrontProxy { .. })).collect();
        let request_headers: Vec<(String, &[u8])> = request_headers.into_iter().map(|(n, v)| (n.to_ascii_lowercase(), v)).collect();
        out.remove = unique(
            request_headers
                .iter()
                .map(|(l, _)| l.clone())
                .filter(|l| l.starts_with(FORWARD_STRIP_PREFIX) || proxy_sources.iter().any(|s| s.reads(l))),
        );
        let Some((src, Stated { name, groups, .. })) = &self.winner else {
            if let Some(src) = self.cfg.sources.iter().find(|s| presented(s, input)) {
                out.refuse = Some(unforwardable(src));
                return out;
            }
            let named = |n: &str| request_headers.iter().any(|(l, _)| l == n);
            if named(AUTHORIZATION_HEADER) {
                out.remove.push(AUTHORIZATION_HEADER.to_string());
            }
            let protocols = request_headers.iter().filter(|(l, _)| l == WEBSOCKET_PROTOCOL_HEADER).map(|(_, v)| *v);
            if let Some(kept) = without_bearer_protocols(protocols) {
                out.remove.push(WEBSOCKET_PROTOCOL_HEADER.to_string());
                if !kept.is_empty() {
                    out.add.push((WEBSOCKET_PROTOCOL_HEADER.to_string(), kept));
                }
            }
            return out;
        };
        if !forwardable(name) {
            out.refuse = Some(unforwardable(src));
            return out;
        }
        out.add.push((FORWARD_USER_HEADER.to_string(), name.to_string()));
        let groups = unique(groups.to_vec().into_iter().filter(|g| forwardable(g)).map(str::to_string));
        out.add.extend(groups.into_iter().map(|g| (FORWARD_GROUP_HEADER.to_string(), g)));
        let prefix = match src {
            IdentitySource::FrontProxy { extra_header_prefix: p, .. } if !p.is_empty() => p.to_ascii_lowercase(),
            _ => return out,
        };
        for (n, v) in input.headers {
            let lname = n.to_ascii_lowercase();
            let Some(key) = lname.strip_prefix(prefix.as_str()) else { continue };
            let Ok(v) = std::str::from_utf8(v) else { continue };
            if is_token(key) && forwardable(v) {
                out.add.push((format!("{FORWARD_EXTRA_PREFIX}{key}"), v.to_string()));
            }
        }
        out
    }
}

/// The front-proxy header names `setFrontProxyHeaders` writes (kubeadm's
/// `--requestheader-username-headers`, `--requestheader-group-headers`,
/// `--requestheader-extra-headers-prefix`).
pub const FORWARD_USER_HEADER: &str = "x-remote-user";
pub const FORWARD_GROUP_HEADER: &str = "x-remote-group";
pub const FORWARD_EXTRA_PREFIX: &str = "x-remote-extra-";
/// Every client-supplied header with this prefix is removed by `setFrontProxyHeaders` (user,
/// group, extra, and `X-Remote-Uid`, which kube-apiserver reads with `--requestheader-uid-headers`).
pub const FORWARD_STRIP_PREFIX: &str = "x-remote-";

/// Credentials kube-apiserver authenticates when a request carries no front-proxy identity:
/// a bearer token in `Authorization` (`request/bearertoken/bearertoken.go: AuthenticateRequest`;
/// the header is removed whatever its scheme) and, on WebSocket requests, a subprotocol
/// `base64url.bearer.authorization.k8s.io.<token>` in `Sec-WebSocket-Protocol`
/// (`request/websocket/protocol.go: ProtocolAuthenticator`, which browsers and kubectl's
/// WebSocket executor use). kube-apiserver reads no token from the query (`access_token` only
/// names the attempted method in `endpoints/filters/authn_audit.go: getAuthMethods`).
pub const AUTHORIZATION_HEADER: &str = "authorization";
pub const WEBSOCKET_PROTOCOL_HEADER: &str = "sec-websocket-protocol";
pub const WEBSOCKET_BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Request-header changes that make the upstream see exactly the identity the filter derived
/// (see [`IdentityConfig::front_proxy_headers`]): remove first, then add — or, with `refuse`,
/// do not forward the request at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontProxyHeaders {
    /// Lowercase names of request headers to remove (every value of each).
    pub remove: Vec<String>,
    /// Headers to add, in order (one `x-remote-group` per group).
    pub add: Vec<(String, String)>,
    /// A verified credential names a user that cannot be forwarded: answer `403` with this
    /// message (see [`forbidden_status`]) and never forward the request.
    pub refuse: Option<String>,
}

/// kube-apiserver's `Status` body for a `403` (`responsewriters.ErrorNegotiated` of
/// `errors.NewForbidden`-like errors): `reason: Forbidden`, `code: 403`, the message as given.
pub fn forbidden_status(message: &str) -> String {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Forbidden", "details": {}, "code": 403,
    });
    status.to_string()
}

/// Why a source's verified user cannot be forwarded (the `403` message).
fn unforwardable(src: &IdentitySource) -> String {
    match src {
        IdentitySource::ClientCertificate { .. } => {
            "client certificate identity cannot be forwarded: empty or invalid common name".to_string()
        }
        IdentitySource::Jwt { user_claim, .. } => {
            format!("JWT identity cannot be forwarded: empty or invalid user claim {user_claim:?}")
        }
        IdentitySource::FrontProxy { user_header, .. } => {
            format!("front-proxy identity cannot be forwarded: invalid {user_header} value")
        }
        IdentitySource::Impersonation { .. } => "impersonated identity cannot be forwarded".to_string(),
    }
}

/// Whether `src` is trusted for this request and its verified credential is there, whether or
/// not it names a usable user: a verified client certificate (whatever its subject) or verified
/// JWT claims (whatever the user claim). Header sources present nothing beyond the user they
/// yield.
fn presented(src: &IdentitySource, input: &IdentityInput) -> bool {
    src.trusted(input)
        && match src {
            IdentitySource::ClientCertificate { .. } => input.mtls && input.cert_subject.is_some(),
            IdentitySource::Jwt { .. } => input.jwt_claims.is_some(),
            IdentitySource::FrontProxy { .. } | IdentitySource::Impersonation { .. } => false,
        }
}

/// `Sec-WebSocket-Protocol` values without the bearer-token subprotocols (each value split at
/// commas and trimmed, as `protocol.go` does); `None` when no value carries one.
fn without_bearer_protocols<'v>(values: impl IntoIterator<Item = &'v [u8]>) -> Option<String> {
    let mut kept = Vec::new();
    let mut dropped = false;
    for v in values {
        for p in String::from_utf8_lossy(v).split(',').map(str::trim) {
            if p.starts_with(WEBSOCKET_BEARER_PROTOCOL_PREFIX) {
                dropped = true;
            } else if !p.is_empty() {
                kept.push(p.to_string());
            }
        }
    }
    dropped.then(|| kept.join(", "))
}

/// Whether `v` can travel as one header value unchanged: not empty, no control character (CR, LF,
/// NUL, …) and no leading or trailing whitespace (which an HTTP parser would trim, turning e.g.
/// `" system:masters"` into `"system:masters"`).
fn forwardable(v: &str) -> bool {
    !v.is_empty() && !v.bytes().any(|b| b.is_ascii_control()) && v.trim_matches([' ', '\t']) == v
}

impl IdentityConfig {
    /// Lowercase exact header names the sources read (prefix-based ones: [`Self::header_prefixes`]).
    pub fn header_names(&self) -> Vec<String> {
        unique(self.sources.iter().flat_map(|s| s.headers_read().0).flatten().map(str::to_ascii_lowercase))
    }

    /// Lowercase header-name prefixes the sources read (`x-remote-extra-`, `impersonate-extra-`).
    pub fn header_prefixes(&self) -> Vec<String> {
        unique(self.sources.iter().filter_map(|s| s.headers_read().1).map(str::to_ascii_lowercase))
    }

    /// Names (lowercase, as present in `input`) of headers to remove before forwarding: those
    /// read by a `stripUntrusted` source that does not trust this peer, unless another source
    /// that does trust the peer reads the same header.
    pub fn headers_to_strip(&self, input: &IdentityInput) -> Vec<String> {
        let untrusted: Vec<&IdentitySource> = self.sources.iter().filter(|s| s.trust().2 && !s.trusted(input)).collect();
        if untrusted.is_empty() {
            return Vec::new();
        }
        let trusted: Vec<&IdentitySource> = self.sources.iter().filter(|s| s.trusted(input)).collect();
        let reads = |sources: &[&IdentitySource], l: &str| sources.iter().any(|s| s.reads(l));
        let strip = |l: &String| reads(&untrusted, l) && !reads(&trusted, l);
        unique(input.headers.iter().map(|(name, _)| name.to_ascii_lowercase()).filter(strip))
    }

    /// With `setFrontProxyHeaders`: the header changes for one request (`request_headers`: its
    /// headers, names in any case, repeated ones as separate entries). Removed: every header
    /// starting with `x-remote-`, and any header a `frontProxy` source reads under another name.
    /// Added: the identity of the first trusted source yielding a user (the one [`identify`]
    /// picks) as the source stated it, before group completion — the user as `x-remote-user`,
    /// each group once as its own `x-remote-group`, and, from a `frontProxy` source, its extra
    /// headers as `x-remote-extra-<key>` (key as received, so still escaped). Group completion is
    /// left to kube-apiserver, which adds `system:authenticated` itself, so it sees the same user
    /// and groups as if the client had presented the credential directly (upstream
    /// `x509.CommonNameUserConversion`, `headerrequest.requestHeaderAuthRequestHandler`,
    /// client-go `transport.SetAuthProxyHeaders`). A group or extra value that cannot travel as a
    /// header value unchanged is dropped.
    ///
    /// The apiserver must authenticate exactly the identity classified here, so:
    /// - the winning source's user name cannot travel unchanged (empty, control characters,
    ///   whitespace at the ends), or no source yields a user while a trusted source's verified
    ///   credential is there (a verified certificate without a usable CN, verified JWT claims
    ///   without a usable user claim): `refuse` — the request is answered `403`, never forwarded
    ///   (forwarding no identity would let the apiserver authenticate another credential of the
    ///   request, e.g. its bearer token, that the gateway did not classify);
    /// - no source yields a user and none presented a credential (anonymous): the credentials
    ///   kube-apiserver would authenticate instead are removed too — `Authorization` and the
    ///   bearer-token subprotocol of `Sec-WebSocket-Protocol` (the other subprotocols are
    ///   written back) — so it serves the request as anonymous, as classified.
    ///
    /// Without the option: nothing to do.
    pub fn front_proxy_headers<'n>(
        &self,
        input: &IdentityInput,
        request_headers: impl IntoIterator<Item = (&'n str, &'n [u8])>,
    ) -> FrontProxyHeaders {
        self.identified(input).front_proxy_headers(input, request_headers)
    }

    /// The identity `input` states, derived once (see [`Identified`]).
    pub fn identified<'a>(&'a self, input: &IdentityInput<'a>) -> Identified<'a> {
        Identified { cfg: self, winner: first_source(self, input) }
    }

    /// Configuration problems (CIDRs are already checked while deserializing).
    pub fn validate(&self) -> Vec<IdentityError> {
        let mut errs = Vec::new();
        let forwarding = self.set_front_proxy_headers;
        for (i, s) in self.sources.iter().enumerate() {
            match s {
                // Forwarding what Impersonate-* claims as the authenticated user would let any
                // client become anyone: kube-apiserver authorizes impersonation itself.
                IdentitySource::Impersonation { .. } if forwarding => errs.push(IdentityError::ImpersonationForwarded { source: i }),
                IdentitySource::FrontProxy { user_header, group_header, trusted_source_cidrs, .. } => {
                    if forwarding && trusted_source_cidrs.is_empty() {
                        errs.push(IdentityError::FrontProxyTrustsAnyone { source: i });
                    }
                    for (key, h) in [("userHeader", user_header), ("groupHeader", group_header)] {
                        if !is_token(h) {
                            errs.push(IdentityError::BadHeaderName { source: i, key, header: h.clone() });
                        }
                    }
                }
                IdentitySource::Jwt { user_claim, groups_claim, .. } => {
                    for (key, claim) in [("userClaim", user_claim), ("groupsClaim", groups_claim)] {
                        if claim.is_empty() {
                            errs.push(IdentityError::EmptyClaim { source: i, key });
                        }
                    }
                }
                _ => {}
            }
        }
        errs
    }
}

/// The items in first-seen order, without repeats.
fn unique<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// RFC 7230 token.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
