//! The engine's errors: the store failed, a stored value is corrupt, or a configuration cannot apply.

use super::store::StoreError;
use crate::codec::CodecError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    Store(StoreError),
    Corrupt(CodecError),
    Config(String),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::Store(e)
    }
}
impl From<CodecError> for EngineError {
    fn from(e: CodecError) -> Self {
        EngineError::Corrupt(e)
    }
}
impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Store(e) => write!(f, "{e}"),
            EngineError::Corrupt(e) => write!(f, "{e}"),
            EngineError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Store(e) => Some(e),
            EngineError::Corrupt(e) => Some(e),
            EngineError::Config(_) => None,
        }
    }
}
