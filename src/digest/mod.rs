//! The request digest: everything APF learns from one HTTP request before classifying it —
//! RequestInfo (verb, group, resource, namespace …), the caller's identity, whether the request
//! is long-running, and its work estimate (seats).

pub mod identity;
pub mod identity_error;
pub mod initial_events;
pub mod list_size;
pub mod metrics_scan;
pub mod request_info;
pub mod selectors;
pub mod work_estimate;
