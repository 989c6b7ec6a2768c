//! One error of the plugin configuration: the field it is about (a key path such as
//! `watchLimits: perLevel.x`, empty while a value is checked on its own) and what is wrong.
//! Displayed as `<field>: <message>`, the text the filter logs and `apf check` prints.
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The key path, outermost first, joined by `: ` (empty: the value itself).
    pub field: String,
    pub message: String,
}

impl ConfigError {
    /// An error about the value being checked (its field is added by [`ConfigError::at`]).
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError { field: String::new(), message: message.into() }
    }

    /// The error as seen from the enclosing object: `key` is prepended to the field.
    pub fn at(self, key: &str) -> ConfigError {
        let field = match self.field.as_str() {
            "" => key.to_string(),
            inner => format!("{key}: {inner}"),
        };
        ConfigError { field, ..self }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.field.as_str() {
            "" => f.write_str(&self.message),
            field => write!(f, "{field}: {}", self.message),
        }
    }
}

impl std::error::Error for ConfigError {}
