//! Go-style durations (`time.ParseDuration` / `Duration.String`): `"60s"`, `"1.5h"`, `"-1ns"`,
//! `"999999999ns"`, `"2h45m"`, `"0"`. Units: ns, us, µs, μs, ms, s, m, h (no days, as Go).
//! Used by the plugin configuration (`requestTimeout`), the simulator's scenarios and the
//! `?timeout=` query parameter.

use std::fmt;

use crate::Nanos;

/// Why a string is not a Go duration, with Go's messages (`time/format.go: ParseDuration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// `time: invalid duration "<input>"` (bad syntax or out of range).
    Invalid { input: String },
    /// `time: missing unit in duration "<input>"`.
    MissingUnit { input: String },
    /// `time: unknown unit "<unit>" in duration "<input>"`.
    UnknownUnit { unit: String, input: String },
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Invalid { input } => write!(f, "time: invalid duration {input:?}"),
            DurationError::MissingUnit { input } => write!(f, "time: missing unit in duration {input:?}"),
            DurationError::UnknownUnit { unit, input } => write!(f, "time: unknown unit {unit:?} in duration {input:?}"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses a Go duration string into nanoseconds. Errors name the offending input like Go does.
pub fn parse_go_duration(s: &str) -> Result<Nanos, DurationError> {
    let err = || DurationError::Invalid { input: s.to_string() };
    let neg = s.starts_with('-');
    let mut rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let digits = |r: &str| r.bytes().take_while(u8::is_ascii_digit).count();
    // Checked arithmetic; any sum above 2^63 is an error.
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let (int_s, r) = rest.split_at(digits(rest));
        let (frac_s, r) = match r.strip_prefix('.') {
            Some(r) => r.split_at(digits(r)),
            None => ("", r),
        };
        if int_s.is_empty() && frac_s.is_empty() {
            return Err(err());
        }
        let unit_end = r.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(r.len());
        let (unit, r) = r.split_at(unit_end);
        rest = r;
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(DurationError::MissingUnit { input: s.to_string() }),
            _ => return Err(DurationError::UnknownUnit { unit: unit.to_string(), input: s.to_string() }),
        };
        let int_v: Option<i128> = if int_s.is_empty() { Some(0) } else { int_s.parse().ok() };
        let mut v = int_v.and_then(|i| i.checked_mul(scale)).ok_or_else(err)?;
        // fraction: Go truncates toward zero at nanosecond precision
        let mut place = scale;
        for b in frac_s.bytes() {
            place /= 10;
            v = v.checked_add(i128::from(b - b'0') * place).ok_or_else(err)?;
        }
        total = total.checked_add(v).filter(|&t| t <= 1 << 63).ok_or_else(err)?;
    }
    i64::try_from(if neg { -total } else { total }).map_err(|_| err())
}

/// Formats nanoseconds like Go's `Duration.String()` (e.g. `1m0s`, `1.5s`, `300ms`, `0s`).
pub fn format_go_duration(d: Nanos) -> String {
    if d == 0 {
        return "0s".to_string();
    }
    let sign = if d < 0 { "-" } else { "" };
    let u = d.unsigned_abs();
    if u < 1_000_000_000 {
        let (unit, div) = match u {
            0..1_000 => ("ns", 1),
            1_000..1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{sign}{}{unit}", fmt_frac(u, div));
    }
    let (h, m) = (u / 3_600_000_000_000, u / 60_000_000_000 % 60);
    let secs = fmt_frac(u % 60_000_000_000, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{secs}s"),
        (0, _) => format!("{sign}{m}m{secs}s"),
        _ => format!("{sign}{h}h{m}m{secs}s"),
    }
}

/// `v / div` with the fraction's trailing zeros dropped (`div` a power of ten).
fn fmt_frac(v: u64, div: u64) -> String {
    let (int, frac) = (v / div, v % div);
    if frac == 0 {
        return int.to_string();
    }
    let width = div.ilog10() as usize;
    format!("{int}.{}", format!("{frac:0width$}").trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_go_duration("60s").unwrap(), 60_000_000_000);
        assert_eq!(parse_go_duration("0").unwrap(), 0);
        assert_eq!(parse_go_duration("-1ns").unwrap(), -1);
        assert_eq!(parse_go_duration("999999999ns").unwrap(), 999_999_999);
        assert_eq!(parse_go_duration("1.5h").unwrap(), 5_400_000_000_000);
        assert_eq!(parse_go_duration("2h45m").unwrap(), 9_900_000_000_000);
        assert_eq!(parse_go_duration("2184h").unwrap(), 2184 * 3_600_000_000_000);
        assert_eq!(parse_go_duration("1µs").unwrap(), 1_000);
        assert_eq!(parse_go_duration(".5s").unwrap(), 500_000_000);
        assert_eq!(parse_go_duration("-9223372036854775808ns").unwrap(), i64::MIN);
        for bad in ["", "1", "s", "1d", "--1s", "1.s.", "9223372036854775808ns", "99999999999999h", "."] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go_duration(60_000_000_000), "1m0s");
        assert_eq!(format_go_duration(1_500_000_000), "1.5s");
        assert_eq!(format_go_duration(300_000_000), "300ms");
        assert_eq!(format_go_duration(-1), "-1ns");
        assert_eq!(format_go_duration(0), "0s");
        assert_eq!(format_go_duration(3_723_000_000_000), "1h2m3s");
    }
}
