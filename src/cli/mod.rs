//! The `apf` command: `check`, `classify`, `simulate`, `fleet`. Each subcommand returns its [`Outcome`]
//! for its arguments (without the subcommand name); [`main_with`] and `classify::run` print it,
//! so tests can drive the command in-process.
use std::io::{Read, Write};

pub mod check;
pub mod classify;
mod error;
pub mod fleet;
mod http;
pub mod simulate;

pub use error::{CliError, HttpError};

pub const USAGE: &str = "usage: apf <command> [options]

commands:
  check    [--config FILE]                         validate a plugin configuration and print the effective policy
  classify [--config FILE] --method M --path P [--user U] [--group G]... [--header 'N: v']...
                                                   classify one request and print the decision as JSON
  simulate [--workers N] SCENARIO.json             run the deterministic fair-queuing simulator
  fleet    --etcd http://HOST:PORT [--prefix P] [--name N]
                                                   print a fleet's replicas as etcd holds them (JSON)
";

/// What a command prints: on stdout with exit code 0, or on stderr with its exit code.
type Outcome = Result<String, (i32, String)>;

/// Prints `outcome` and returns its exit code.
fn report(outcome: Outcome, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match outcome {
        Ok(text) => {
            let _ = out.write_all(text.as_bytes());
            0
        }
        Err((code, text)) => {
            let _ = err.write_all(text.as_bytes());
            code
        }
    }
}

/// The bytes of a file, of standard input for `-`, none without a path.
fn read_input(path: Option<&str>) -> Result<Vec<u8>, CliError> {
    match path {
        None => Ok(Vec::new()),
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|error| CliError::Read { path: None, error })?;
            Ok(buf)
        }
        Some(p) => std::fs::read(p).map_err(|error| CliError::Read { path: Some(p.to_string()), error }),
    }
}

pub fn main_with(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let outcome = match args.split_first() {
        None => Err((2, USAGE.to_string())),
        Some((cmd, rest)) => match cmd.as_str() {
            "check" => check::check(rest),
            "classify" => classify::classify(rest),
            "simulate" => simulate::simulate(rest),
            "fleet" => fleet::fleet(rest),
            "help" | "--help" | "-h" => Ok(USAGE.to_string()),
            other => Err((2, format!("apf: unknown command {other:?}\n{USAGE}\n"))),
        },
    };
    report(outcome, out, err)
}
