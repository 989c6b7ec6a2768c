//! `apf check [--config FILE]`: validate a plugin configuration and print the effective policy —
//! priority levels with their static limits and max seats
//! (`apf_controller.go: finishQueueSetReconfigsLocked`) and FlowSchemas in matching order
//! (`apf_controller.go: digestFlowSchemasLocked`) — plus warnings. Without `--config` the built-in
//! defaults (600 seats) are shown; `--config -` reads standard input. Exit 0 when valid, 1 with
//! every error on stderr otherwise, 2 on usage errors.
use std::io::{Read, Write};

use crate::policy::config::{parse_plugin_config, PluginConfig};
use crate::policy::model::{Distinguisher, LimitResponse, PriorityLevelSpec};

const USAGE: &str = "usage: apf check [--config FILE|-]\n";

pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut config_path: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" || a == "-c" {
            match it.next() {
                Some(p) => config_path = Some(p.clone()),
                None => {
                    let _ = write!(err, "apf check: --config needs a value\n{USAGE}");
                    return 2;
                }
            }
        } else if let Some(p) = a.strip_prefix("--config=") {
            config_path = Some(p.to_string());
        } else if a == "-h" || a == "--help" {
            let _ = out.write_all(USAGE.as_bytes());
            return 0;
        } else {
            let _ = write!(err, "apf check: unexpected argument {a:?}\n{USAGE}");
            return 2;
        }
    }
    let bytes = match config_path.as_deref() {
        None => Vec::new(),
        Some("-") => {
            let mut buf = Vec::new();
            if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
                let _ = writeln!(err, "apf check: reading stdin: {e}");
                return 1;
            }
            buf
        }
        Some(p) => match std::fs::read(p) {
            Ok(b) => b,
            Err(e) => {
                let _ = writeln!(err, "apf check: reading {p}: {e}");
                return 1;
            }
        },
    };
    match parse_plugin_config(&bytes) {
        Ok(cfg) => {
            let _ = out.write_all(render(&cfg).as_bytes());
            0
        }
        Err(errors) => {
            for e in &errors {
                let _ = writeln!(err, "{e}");
            }
            let _ = writeln!(err, "apf check: {} error(s)", errors.len());
            1
        }
    }
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            let w = widths.get(c).copied().unwrap_or(0);
            line.push_str(cell);
            if c + 1 < r.len() {
                line.push_str(&" ".repeat(w.saturating_sub(cell.chars().count()) + 2));
            }
        }
        s.push_str(line.trim_end());
        s.push('\n');
    }
    s
}

/// The full `apf check` report for a valid configuration.
pub fn render(cfg: &PluginConfig) -> String {
    let mut s = String::new();
    s.push_str(&format!("configuration OK: {}\n\n", cfg.describe()));
    s.push_str("Priority levels:\n");
    let mut rows = vec![[
        "NAME", "TYPE", "RESPONSE", "SHARES", "LENDABLE%", "BORROWING%", "NOMINAL", "LENDABLE", "BORROWING", "MIN",
        "MAX", "QUEUES", "HANDSIZE", "QUEUELENGTHLIMIT", "MAXSEATS",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect::<Vec<_>>()];
    let dash = || "-".to_string();
    for (pl, lim) in cfg.policy.priority_levels.iter().zip(cfg.limits.iter()) {
        let (typ, resp, borrow_pct, q) = match &pl.spec {
            PriorityLevelSpec::Exempt { .. } => ("Exempt", dash(), dash(), None),
            PriorityLevelSpec::Limited { borrowing_limit_percent, limit_response, .. } => (
                "Limited",
                match limit_response {
                    LimitResponse::Queue(_) => "Queue".to_string(),
                    LimitResponse::Reject => "Reject".to_string(),
                },
                borrowing_limit_percent.map_or_else(|| "unlimited".to_string(), |b| b.to_string()),
                pl.queuing(),
            ),
        };
        let name = if cfg.is_enforced(&pl.name) { pl.name.clone() } else { format!("{} (dry-run)", pl.name) };
        rows.push(vec![
            name,
            typ.to_string(),
            resp,
            pl.nominal_concurrency_shares().to_string(),
            pl.lendable_percent().to_string(),
            borrow_pct,
            lim.nominal.to_string(),
            lim.lendable.to_string(),
            lim.borrowing.to_string(),
            lim.min.to_string(),
            lim.max.to_string(),
            q.map_or_else(dash, |q| q.queues.to_string()),
            q.map_or_else(dash, |q| q.hand_size.to_string()),
            q.map_or_else(dash, |q| q.queue_length_limit.to_string()),
            lim.max_seats.map_or_else(dash, |m| m.to_string()),
        ]);
    }
    s.push_str(&table(&rows));
    s.push_str("\nFlowSchemas (matching order):\n");
    let mut rows = vec![["PRECEDENCE", "NAME", "PRIORITYLEVEL", "DISTINGUISHER", "RULES"]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()];
    for fs in &cfg.policy.flow_schemas {
        rows.push(vec![
            fs.matching_precedence.to_string(),
            fs.name.clone(),
            fs.priority_level.clone(),
            match fs.distinguisher {
                Some(Distinguisher::ByUser) => "ByUser".to_string(),
                Some(Distinguisher::ByNamespace) => "ByNamespace".to_string(),
                None => dash(),
            },
            fs.rules.len().to_string(),
        ]);
    }
    s.push_str(&table(&rows));
    if !cfg.policy.warnings.is_empty() {
        s.push_str("\nWarnings:\n");
        for w in &cfg.policy.warnings {
            s.push_str(&format!("  {w}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_cells(out: &str, name: &str) -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row {name} in\n{out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn defaults_show_600_row_of_7_6() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        assert_eq!(run(&[], &mut out, &mut err), 0);
        let out = String::from_utf8(out).unwrap();
        // name → (nominal, lendable, min, max, maxSeats)
        let want = [
            ("exempt", "0", "0", "0", "600", "-"),
            ("catch-all", "13", "0", "13", "613", "-"),
            ("system", "74", "24", "50", "674", "12"),
            ("node-high", "98", "25", "73", "698", "15"),
            ("leader-election", "25", "0", "25", "625", "4"),
            ("workload-high", "98", "49", "49", "698", "15"),
            ("workload-low", "245", "221", "24", "845", "37"),
            ("global-default", "49", "25", "24", "649", "8"),
        ];
        for (name, nominal, lendable, min, max, seats) in want {
            let c = row_cells(&out, name);
            assert_eq!(c[6], nominal, "{name}");
            assert_eq!(c[7], lendable, "{name}");
            assert_eq!(c[9], min, "{name}");
            assert_eq!(c[10], max, "{name}");
            assert_eq!(c[14], seats, "{name}");
        }
        assert!(out.contains("nominal sum 602"));
        // FlowSchemas in matching order.
        let fs_section = out.split("FlowSchemas").nth(1).unwrap();
        let order: Vec<&str> = fs_section
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        assert_eq!(
            order,
            [
                "exempt", "probes", "system-leader-election", "system-node-high", "system-nodes",
                "kube-controller-manager", "kube-scheduler", "kube-system-service-accounts",
                "service-accounts", "global-default", "catch-all"
            ]
        );
    }

    #[test]
    fn bad_config_file_exits_1_with_errors() {
        let dir = std::env::temp_dir().join(format!("apf-check-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.json");
        std::fs::write(&p, br#"{"serverConcurrencyLimt": 5, "enforce": "yes"}"#).unwrap();
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = run(&["--config".into(), p.to_string_lossy().into_owned()], &mut out, &mut err);
        assert_eq!(code, 1);
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("serverConcurrencyLimt"), "{err}");
        assert!(err.contains("enforce"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn usage_errors_exit_2() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        assert_eq!(run(&["--config".into()], &mut out, &mut err), 2);
        assert_eq!(run(&["bogus".into()], &mut out, &mut err), 2);
    }
}
