//! Deterministic discrete-event simulator (stub: owned by the fair-queuing work).
