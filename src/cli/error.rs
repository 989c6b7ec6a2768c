//! The errors of the `apf` command's own steps (arguments, reading input, its HTTP client);
//! each subcommand prints them after its name (`apf classify: ...`).
use std::fmt;

/// Why an HTTP request of the CLI's client ([`super::http::request`]) gave no body.
#[derive(Debug)]
pub enum HttpError {
    /// Connecting, writing or reading failed.
    Io(std::io::Error),
    /// The reply has no complete header.
    NoHeader,
    /// The status is not `200` (the status text as received).
    Status(String),
    /// A chunked body that does not decode.
    BadChunking,
}

/// An error of the `apf` command.
#[derive(Debug)]
pub enum CliError {
    /// The arguments are wrong (the message says which).
    Usage(String),
    /// A file (`path`) or standard input (`None`) could not be read.
    Read { path: Option<String>, error: std::io::Error },
    /// A request of the CLI's HTTP client failed.
    Http(HttpError),
    /// `--metrics <source>` could not be read.
    Metrics { source: String, error: Box<CliError> },
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Io(e) => write!(f, "{e}"),
            HttpError::NoHeader => f.write_str("no HTTP response header"),
            HttpError::Status(status) => write!(f, "HTTP status {status}"),
            HttpError::BadChunking => f.write_str("bad chunked encoding"),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(msg) => f.write_str(msg),
            CliError::Read { path: None, error } => write!(f, "reading stdin: {error}"),
            CliError::Read { path: Some(p), error } => write!(f, "reading {p}: {error}"),
            CliError::Http(e) => write!(f, "{e}"),
            CliError::Metrics { source, error } => write!(f, "--metrics {source}: {error}"),
        }
    }
}

impl std::error::Error for HttpError {}
impl std::error::Error for CliError {}
