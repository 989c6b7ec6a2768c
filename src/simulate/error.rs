//! The simulator's error: the scenario document is invalid (the user fixes the input), or the
//! run failed (the engine, a store or the fleet refused an operation: a bug to report). The text
//! is the message `apf simulate` and the playground print.
use std::fmt;

/// What went wrong, for a caller that treats a bad input and a failed run differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimErrorKind {
    /// The scenario is not valid: the field and the rule it breaks are in the message.
    Scenario,
    /// The scenario is valid but the simulation failed (engine, store or fleet error).
    Run,
}

/// A simulator error; displays as its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    pub kind: SimErrorKind,
    pub message: String,
}

impl SimError {
    /// The scenario is invalid: `message` names the field.
    pub fn scenario(message: impl Into<String>) -> SimError {
        SimError { kind: SimErrorKind::Scenario, message: message.into() }
    }

    /// The run failed: `message` is the failing part's error.
    pub fn run(message: impl fmt::Display) -> SimError {
        SimError { kind: SimErrorKind::Run, message: message.to_string() }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SimError {}
