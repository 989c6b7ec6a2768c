//! Concurrency limits, lending and borrowing (upstream `apf_controller.go`, `conc_alloc.go`) and
//! the Retry-After tracker (`dropped_requests_tracker.go`).
//!
//! - `static_limits`: NominalCL / LendableCL / BorrowingCL / MinCL / MaxCL and per-level max
//!   seats, recomputed on every configuration change (`apf_controller.go:
//!   finishQueueSetReconfigsLocked`).
//! - `integrator`: the seat-demand integrator (`fairqueuing/integrator.go`).
//! - `conc_alloc`: `computeConcurrencyAllocation` (`conc_alloc.go`).
//! - `borrowing`: the periodic CurrentCL adjustment with smoothing (`apf_controller.go`:
//!   `seatDemandStats.update`, `updateBorrowingLocked`).
//! - `retry_after`: the per-level dropped-requests tracker behind `Retry-After`
//!   (`dropped_requests_tracker.go`).
pub mod borrowing;
pub mod conc_alloc;
pub mod integrator;
pub mod retry_after;
pub mod static_limits;
