//! `apf check [--config FILE]`: validate a plugin configuration and print the effective policy —
//! priority levels with their static limits and max seats
//! (`apf_controller.go: finishQueueSetReconfigsLocked`) and FlowSchemas in matching order
//! (`apf_controller.go: digestFlowSchemasLocked`) — plus warnings. Without `--config` the built-in
//! defaults (600 seats) are shown; `--config -` reads standard input. Exit 0 when valid, 1 with
//! every error on stderr otherwise, 2 on usage errors.
use crate::config::{parse_plugin_config, PluginConfig};
use crate::policy::model::PriorityLevelSpec;

const USAGE: &str = "usage: apf check [--config FILE|-]\n";

pub(super) fn check(args: &[String]) -> super::Outcome {
    let usage = |e: String| (2, format!("apf check: {e}\n{USAGE}"));
    let mut config_path = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" || a == "-c" {
            config_path = Some(it.next().ok_or_else(|| usage("--config needs a value".into()))?.as_str());
        } else if let Some(p) = a.strip_prefix("--config=") {
            config_path = Some(p);
        } else if a == "-h" || a == "--help" {
            return Ok(USAGE.to_string());
        } else {
            return Err(usage(format!("unexpected argument {a:?}")));
        }
    }
    let bytes = super::read_input(config_path).map_err(|e| (1, format!("apf check: {e}\n")))?;
    let cfg = parse_plugin_config(&bytes).map_err(|errors| {
        let all: String = errors.iter().map(|e| format!("{e}\n")).collect();
        (1, format!("{all}apf check: {} error(s)\n", errors.len()))
    })?;
    Ok(render(&cfg))
}

/// `header` and `rows` in columns two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let rows: Vec<&Vec<String>> = std::iter::once(&header).chain(rows).collect();
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let line = |r: &Vec<String>| r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}  ")).collect::<String>();
    rows.into_iter().map(|r| format!("{}\n", line(r).trim_end())).collect()
}

/// The full `apf check` report for a valid configuration.
pub fn render(cfg: &PluginConfig) -> String {
    let mut s = format!("configuration OK: {}\n\nPriority levels:\n", cfg.describe());
    let dash = || "-".to_string();
    let mut rows = Vec::new();
    for (pl, lim) in cfg.policy.priority_levels.iter().zip(cfg.limits.iter()) {
        let q = pl.queuing();
        let (typ, resp, borrow_pct) = match &pl.spec {
            PriorityLevelSpec::Exempt { .. } => ("Exempt", dash(), dash()),
            PriorityLevelSpec::Limited { borrowing_limit_percent, .. } => (
                "Limited",
                if q.is_some() { "Queue" } else { "Reject" }.to_string(),
                borrowing_limit_percent.map_or_else(|| "unlimited".to_string(), |b| b.to_string()),
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
    s.push_str(&table(
        &[
            "NAME",
            "TYPE",
            "RESPONSE",
            "SHARES",
            "LENDABLE%",
            "BORROWING%",
            "NOMINAL",
            "LENDABLE",
            "BORROWING",
            "MIN",
            "MAX",
            "QUEUES",
            "HANDSIZE",
            "QUEUELENGTHLIMIT",
            "MAXSEATS",
        ],
        &rows,
    ));
    s.push_str("\nFlowSchemas (matching order):\n");
    let rows: Vec<Vec<String>> = cfg
        .policy
        .flow_schemas
        .iter()
        .map(|fs| {
            // The variant names are the API's (`ByUser`, `ByNamespace`).
            let distinguisher = fs.distinguisher.map_or_else(dash, |d| format!("{d:?}"));
            let rules = fs.rules.len().to_string();
            vec![fs.matching_precedence.to_string(), fs.name.clone(), fs.priority_level.clone(), distinguisher, rules]
        })
        .collect();
    s.push_str(&table(&["PRECEDENCE", "NAME", "PRIORITYLEVEL", "DISTINGUISHER", "RULES"], &rows));
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
    fn run(args: &[String], out: &mut Vec<u8>, err: &mut Vec<u8>) -> i32 {
        let args: Vec<String> = std::iter::once("check".to_string()).chain(args.iter().cloned()).collect();
        crate::cli::main_with(&args, out, err)
    }

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
        let order: Vec<&str> = fs_section.lines().skip(2).filter_map(|l| l.split_whitespace().nth(1)).collect();
        assert_eq!(
            order,
            [
                "exempt",
                "probes",
                "system-leader-election",
                "system-node-high",
                "system-nodes",
                "kube-controller-manager",
                "kube-scheduler",
                "kube-system-service-accounts",
                "service-accounts",
                "global-default",
                "catch-all"
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
