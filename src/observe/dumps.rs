//! Debug dump text formats (upstream `pkg/util/flowcontrol/apf_controller_debug.go`:
//! `dumpPriorityLevels`, `dumpQueues`, `dumpRequests`).
//!
//! Each row is `strings.Join(columns, ",\t")` followed by `"\n"`, written through
//! `tabwriter.NewWriter(w, 8, 0, 1, ' ', 0)` (minwidth 8, tabwidth 0, padding 1, pad char
//! space, no flags). [`tabwrite`] reimplements Go's tabwriter column-block algorithm for that
//! configuration, so the output is byte-identical to upstream for the same rows. The engine
//! fills the plain row structs; this module only formats.

use std::fmt::Display;

/// Aligns `text` like Go's `text/tabwriter` configured as upstream's. Cells are tab-terminated;
/// the last cell of a line is not part of any column. A column block is a run of consecutive
/// lines that all have a cell in that column; its width is `max(8, widest cell in chars + 1)`.
pub fn tabwrite(text: &str) -> String {
    let lines: Vec<Vec<&str>> = text.split('\n').map(|l| l.split('\t').collect()).collect();
    // Per line, the width of each of its tab-terminated cells (that of the cell's block).
    let mut widths = vec![Vec::new(); lines.len()];
    let columns = lines.iter().map(|l| l.len().saturating_sub(1)).max().unwrap_or(0);
    for j in 0..columns {
        let mut first = 0;
        for block in lines.chunk_by(|a, b| (a.len() > j + 1) == (b.len() > j + 1)) {
            if block.first().is_some_and(|l| l.len() > j + 1) {
                let cells = block.iter().filter_map(|l| l.get(j));
                let w = cells.fold(8, |w, c| w.max(c.chars().count() + 1));
                widths.iter_mut().skip(first).take(block.len()).for_each(|ws| ws.push(w));
            }
            first += block.len();
        }
    }
    let pad = |(line, ws): (&Vec<&str>, &Vec<usize>)| -> String {
        let ws = ws.iter().copied().chain(std::iter::repeat(0));
        line.iter().zip(ws).map(|(cell, w)| format!("{cell:<w$}")).collect()
    };
    lines.iter().zip(&widths).map(pad).collect::<Vec<_>>().join("\n")
}

/// One row of `dump_priority_levels`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PriorityLevelRow {
    pub name: String,
    /// Queues with at least one waiting request.
    pub active_queues: u64,
    pub is_idle: bool,
    pub is_quiescing: bool,
    pub waiting: u64,
    pub executing: u64,
    pub dispatched: u64,
    pub rejected: u64,
    /// Always 0 upstream (`queueset.go: request.wait` counts a timed-out wait as rejected and
    /// cancelled, never as timed out).
    pub timedout: u64,
    pub cancelled: u64,
}

/// One row of `dump_queues`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueRow {
    pub level: String,
    pub index: u64,
    pub pending: u64,
    pub executing: u64,
    pub seats_in_use: u64,
    /// R value as `%d.%08dss` (seat-seconds), preformatted by the engine.
    pub next_dispatch_r: String,
    pub initial_seats_sum: u64,
    pub max_seats_sum: u64,
    /// Preformatted like `next_dispatch_r`.
    pub total_work_sum: String,
}

/// Optional request details (columns 11–18 with `includeRequestDetails`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestDetails {
    pub user_name: String,
    pub verb: String,
    pub api_path: String,
    pub namespace: String,
    pub name: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
}

/// One row of `dump_requests`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestRow {
    pub level: String,
    pub flow_schema: String,
    /// Queue index, −1 for queue-less executing requests.
    pub queue_index: i64,
    /// Position in queue (0 = head), −1 for executing requests.
    pub index_in_queue: i64,
    pub flow_distinguisher: String,
    /// Arrival, Unix nanoseconds (wall clock).
    pub arrive_time_ns_unix: i64,
    pub initial_seats: u64,
    pub final_seats: u64,
    /// Go `Duration.String()` of the additional latency (e.g. `"0s"`, `"5ms"`).
    pub additional_latency: String,
    /// Start of execution, Unix nanoseconds; `None` (waiting) prints Go's zero time.
    pub start_time_ns_unix: Option<i64>,
    pub details: Option<RequestDetails>,
}

/// Upstream's `row(columns...)` (joined with `",\t"`) and a newline.
fn row(columns: &[&dyn Display]) -> String {
    columns.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",\t") + "\n"
}

/// `dump_priority_levels` body. Rows are sorted by name (as upstream).
pub fn dump_priority_levels(rows: &[PriorityLevelRow]) -> String {
    let mut sorted: Vec<&PriorityLevelRow> = rows.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let header = [
        "PriorityLevelName",
        "ActiveQueues",
        "IsIdle",
        "IsQuiescing",
        "WaitingRequests",
        "ExecutingRequests",
        "DispatchedRequests",
        "RejectedRequests",
        "TimedoutRequests",
        "CancelledRequests",
    ]
    .join(",\t")
        + "\n";
    let rows = sorted.iter().map(|r| {
        row(&[
            &r.name,
            &r.active_queues,
            &r.is_idle,
            &r.is_quiescing,
            &r.waiting,
            &r.executing,
            &r.dispatched,
            &r.rejected,
            &r.timedout,
            &r.cancelled,
        ])
    });
    tabwrite(&(header + &rows.collect::<String>()))
}

/// `dump_queues` body.
pub fn dump_queues(rows: &[QueueRow]) -> String {
    let header = [
        "PriorityLevelName",
        "Index",
        "PendingRequests",
        "ExecutingRequests",
        "SeatsInUse",
        "NextDispatchR",
        "InitialSeatsSum",
        "MaxSeatsSum",
        "TotalWorkSum",
    ]
    .join(",\t")
        + "\n";
    let rows = rows.iter().map(|r| {
        row(&[
            &r.level,
            &r.index,
            &r.pending,
            &r.executing,
            &r.seats_in_use,
            &r.next_dispatch_r,
            &r.initial_seats_sum,
            &r.max_seats_sum,
            &r.total_work_sum,
        ])
    });
    tabwrite(&(header + &rows.collect::<String>()))
}

/// Go `schema.GroupVersion{Group, Version}.String()`.
pub fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// `dump_requests` body; `include_details` = `includeRequestDetails` query parameter non-empty.
pub fn dump_requests(rows: &[RequestRow], include_details: bool) -> String {
    let mut header = vec![
        "PriorityLevelName",
        "FlowSchemaName",
        "QueueIndex",
        "RequestIndexInQueue",
        "FlowDistingsher",
        "ArriveTime",
        "InitialSeats",
        "FinalSeats",
        "AdditionalLatency",
        "StartTime",
    ];
    if include_details {
        header.extend(["UserName", "Verb", "APIPath", "Namespace", "Name", "APIVersion", "Resource", "SubResource"]);
    }
    let mut text = header.join(",\t") + "\n";
    let empty = RequestDetails::default();
    for r in rows {
        let arrive = format_rfc3339_nano(r.arrive_time_ns_unix);
        // Not started: Go's zero `time.Time`.
        let start = r.start_time_ns_unix.map_or("0001-01-01T00:00:00Z".into(), format_rfc3339_nano);
        let mut cells: Vec<&dyn Display> = vec![
            &r.level,
            &r.flow_schema,
            &r.queue_index,
            &r.index_in_queue,
            &r.flow_distinguisher,
            &arrive,
            &r.initial_seats,
            &r.final_seats,
            &r.additional_latency,
            &start,
        ];
        let d = r.details.as_ref().unwrap_or(&empty);
        let gv = group_version(&d.api_group, &d.api_version);
        if include_details {
            cells.extend([&d.user_name as &dyn Display, &d.verb, &d.api_path, &d.namespace, &d.name, &gv, &d.resource, &d.subresource]);
        }
        text.push_str(&row(&cells));
    }
    tabwrite(&text)
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian; H. Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `time.Unix(0, ns).UTC().Format(time.RFC3339Nano)`: fraction with trailing zeros removed
/// (no dot when zero), `Z` suffix.
pub fn format_rfc3339_nano(unix_nanos: i64) -> String {
    let secs = unix_nanos.div_euclid(1_000_000_000);
    let nanos = unix_nanos.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, mo, d) = civil_from_days(days);
    let year = if y < 0 { format!("-{:04}", -y) } else { format!("{y:04}") };
    let mut s = format!("{year}-{mo:02}-{d:02}T{:02}:{:02}:{:02}", sod / 3600, (sod / 60) % 60, sod % 60);
    if nanos != 0 {
        s.push_str(format!(".{nanos:09}").trim_end_matches('0'));
    }
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(format_rfc3339_nano(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339_nano(1_500_000_000), "1970-01-01T00:00:01.5Z");
        assert_eq!(format_rfc3339_nano(1_700_000_000_123_456_789), "2023-11-14T22:13:20.123456789Z");
        assert_eq!(format_rfc3339_nano(951_782_400_000_000_010), "2000-02-29T00:00:00.00000001Z");
        assert_eq!(format_rfc3339_nano(-1), "1969-12-31T23:59:59.999999999Z");
        let _ = format_rfc3339_nano(i64::MIN);
        let _ = format_rfc3339_nano(i64::MAX);
        assert_eq!(civil_from_days(-719_162), (1, 1, 1));
    }

    #[test]
    fn tabwriter_basics() {
        // Column width = max(8, widest + 1); last cell unaligned.
        assert_eq!(tabwrite("a,\tb\nccc,\td\n"), "a,      b\nccc,    d\n");
        assert_eq!(tabwrite("abcdefghij,\tx\ny,\tz\n"), "abcdefghij, x\ny,          z\n");
        // A line with fewer cells ends the column block.
        assert_eq!(tabwrite("a\tb\nlong-line\nabcdefghijk\tc\n"), "a       b\nlong-line\nabcdefghijk c\n");
        // Nested blocks: column 1 block only spans lines that have a 3rd cell.
        assert_eq!(tabwrite("a\tbb\tc\nd\te\n"), "a       bb      c\nd       e\n");
        assert_eq!(tabwrite(""), "");
        assert_eq!(tabwrite("é\tx\n"), "é       x\n");
    }
}
