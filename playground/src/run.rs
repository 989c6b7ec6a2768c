//! Classification and simulation: thin wrappers over the code behind `apf classify` and
//! `apf simulate`.
use serde_json::{json, Value};

/// `apf classify` for one request under a configuration.
pub fn classify_value(_config: &str, _request: &str) -> Value {
    json!({ "ok": false, "errors": ["classification is not available in this build yet"] })
}

/// `apf simulate` for one scenario, plus the seats-per-client time series.
pub fn simulate_value(_scenario: &str) -> Value {
    json!({ "ok": false, "errors": ["simulation is not available in this build yet"] })
}

/// An example scenario.
pub fn default_scenario_value() -> Value {
    json!({})
}
