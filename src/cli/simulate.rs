//! `apf simulate SCENARIO.json` (or `-` for stdin): runs the deterministic fair-queuing
//! simulator (`crate::simulate`) and prints its result as one line of JSON.
use std::io::{Read, Write};

pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let path = match args {
        [p] => p.as_str(),
        _ => {
            let _ = writeln!(err, "usage: apf simulate SCENARIO.json   (use - for stdin)");
            return 2;
        }
    };
    let data = if path == "-" {
        let mut v = Vec::new();
        match std::io::stdin().read_to_end(&mut v) {
            Ok(_) => v,
            Err(e) => {
                let _ = writeln!(err, "apf simulate: reading stdin: {e}");
                return 1;
            }
        }
    } else {
        match std::fs::read(path) {
            Ok(v) => v,
            Err(e) => {
                let _ = writeln!(err, "apf simulate: {path}: {e}");
                return 1;
            }
        }
    };
    match crate::simulate::run_scenario(&data) {
        Ok(r) => {
            let _ = writeln!(out, "{}", r.to_json());
            0
        }
        Err(e) => {
            let _ = writeln!(err, "apf simulate: {e}");
            1
        }
    }
}
