//! Work estimation (stub: owned by the digest work).
use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkEstimatorConfig {
    #[serde(default)]
    pub object_counts: serde_json::Map<String, serde_json::Value>,
}
