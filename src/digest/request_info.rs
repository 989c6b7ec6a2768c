//! RequestInfo parsing (stub: owned by the digest work).
