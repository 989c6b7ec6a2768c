//! The replica's lease and the auth token its calls carry, kept together as etcd's
//! `client/v3/concurrency` (`NewSession`) keeps a lease with its keep-alive: when the lease was
//! last proved alive, and so until when it is trusted.

use crate::fleet::config::FleetConfig;
use crate::Nanos;

/// etcd's auth token (not printed).
#[derive(Clone, Default)]
pub(super) struct Token(pub(super) String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct Lease {
    ttl: Nanos,
    period: Nanos,
    pub(super) token: Option<Token>,
    pub(super) id: Option<i64>,
    /// `k`: when the last keepalive (or grant) that proved the lease alive was sent.
    pub(super) alive_at: Option<Nanos>,
    pub(super) last_keepalive: Option<Nanos>,
    pub(super) last_grant: Option<Nanos>,
    pub(super) last_auth: Option<Nanos>,
}

impl Lease {
    pub(super) fn new(config: &FleetConfig) -> Lease {
        Lease { ttl: config.lease_ttl, period: config.period, ..Lease::default() }
    }

    /// Until when the lease is trusted (`k + leaseTtl − period`).
    pub(super) fn deadline(&self) -> Option<Nanos> {
        Some(self.alive_at?.saturating_add(self.ttl).saturating_sub(self.period))
    }

    pub(super) fn trusted(&self, now: Nanos) -> bool {
        self.deadline().is_some_and(|d| now < d)
    }

    /// A grant sent at `sent` succeeded.
    pub(super) fn granted(&mut self, id: i64, sent: Nanos) {
        self.id = Some(id);
        self.alive_at = Some(sent);
        self.last_keepalive = Some(sent);
    }

    /// A keepalive sent at `sent` found the lease alive.
    pub(super) fn renewed(&mut self, sent: Nanos) {
        self.alive_at = Some(self.alive_at.map_or(sent, |k| k.max(sent)));
    }

    /// etcd no longer has the lease: a new one at once.
    pub(super) fn gone(&mut self) {
        self.id = None;
        self.alive_at = None;
        self.last_grant = None;
    }

    /// Whether `last` is a period or more before `now` (or never).
    pub(super) fn due(&self, last: Option<Nanos>, now: Nanos) -> bool {
        last.is_none_or(|t| now.saturating_sub(t) >= self.period)
    }
}
