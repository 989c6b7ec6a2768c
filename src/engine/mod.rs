//! The APF engine over an injected clock and shared store (stub).
