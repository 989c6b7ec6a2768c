//! The `apf` command: `check`, `classify`, `simulate`. Each subcommand module exposes
//! `pub fn run(args: &[String], out: &mut dyn std::io::Write, err: &mut dyn std::io::Write) -> i32`
//! (args exclude the subcommand name) so tests can drive it in-process.
use std::io::Write;

pub mod check;
pub mod classify;
pub mod simulate;

pub const USAGE: &str = "usage: apf <command> [options]

commands:
  check    [--config FILE]                         validate a plugin configuration and print the effective policy
  classify [--config FILE] --method M --path P [--user U] [--group G]... [--header 'N: v']...
                                                   classify one request and print the decision as JSON
  simulate [--workers N] SCENARIO.json             run the deterministic fair-queuing simulator
";

pub fn main_with(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => {
            let _ = err.write_all(USAGE.as_bytes());
            return 2;
        }
    };
    match cmd {
        "check" => check::run(rest, out, err),
        "classify" => classify::run(rest, out, err),
        "simulate" => simulate::run(rest, out, err),
        "help" | "--help" | "-h" => {
            let _ = out.write_all(USAGE.as_bytes());
            0
        }
        other => {
            let _ = writeln!(err, "apf: unknown command {other:?}\n{USAGE}");
            2
        }
    }
}
