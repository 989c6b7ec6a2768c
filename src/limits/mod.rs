//! Concurrency limits, lending and borrowing (reference §7) and the Retry-After tracker (§9.2).
//!
//! - `static_limits`: NominalCL / LendableCL / BorrowingCL / MinCL / MaxCL and per-level max
//!   seats, recomputed on every configuration change (§7.2, §6.3).
//! - `integrator`: the seat-demand integrator (§7.3).
//! - `conc_alloc`: `computeConcurrencyAllocation` (§7.5).
//! - `borrowing`: the periodic CurrentCL adjustment with smoothing (§7.3, §7.4).
//! - `retry_after`: the per-level dropped-requests tracker behind `Retry-After` (§9.2).
pub mod borrowing;
pub mod conc_alloc;
pub mod integrator;
pub mod retry_after;
pub mod static_limits;
