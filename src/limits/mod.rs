//! Concurrency limits, lending and borrowing (upstream `apf_controller.go`, `conc_alloc.go`,
//! `fairqueuing/integrator.go`) and the Retry-After tracker (`dropped_requests_tracker.go`).
mod alloc_error;
pub mod borrowing;
pub mod conc_alloc;
pub mod integrator;
pub mod retry_after;
pub mod static_limits;
