//! (stub: owned by the fair-queuing work)
