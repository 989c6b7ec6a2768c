//! Go-style durations (`time.ParseDuration` / `Duration.String`): `"60s"`, `"1.5h"`, `"-1ns"`,
//! `"999999999ns"`, `"2h45m"`, `"0"`. Units: ns, us, µs, μs, ms, s, m, h (no days, as Go).
//! Used by the plugin configuration (`requestTimeout`), the simulator's scenarios and the
//! `?timeout=` query parameter.

use crate::Nanos;

/// Parses a Go duration string into nanoseconds. Errors name the offending input like Go does.
pub fn parse_go_duration(s: &str) -> Result<Nanos, String> {
    let err = || format!("time: invalid duration {s:?}");
    let orig = s;
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        // integer part
        let int_len = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        let (int_s, r) = rest.split_at(int_len);
        rest = r;
        let mut frac_s = "";
        if let Some(r) = rest.strip_prefix('.') {
            let fl = r.bytes().take_while(|b| b.is_ascii_digit()).count();
            let (f, r2) = r.split_at(fl);
            frac_s = f;
            rest = r2;
            if int_s.is_empty() && frac_s.is_empty() {
                return Err(err());
            }
        } else if int_s.is_empty() {
            return Err(err());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let (unit, r) = rest.split_at(unit_len);
        rest = r;
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("time: missing unit in duration {orig:?}")),
            _ => return Err(format!("time: unknown unit {unit:?} in duration {orig:?}")),
        };
        let mut int_v: u128 = 0;
        for b in int_s.bytes() {
            int_v = int_v.checked_mul(10).and_then(|v| v.checked_add(u128::from(b - b'0'))).ok_or_else(err)?;
            if int_v > (1u128 << 63) {
                return Err(err());
            }
        }
        let mut v = int_v.checked_mul(scale).ok_or_else(err)?;
        // fraction: Go truncates toward zero at nanosecond precision
        let mut frac_scale = scale;
        for b in frac_s.bytes() {
            frac_scale /= 10;
            if frac_scale == 0 {
                break;
            }
            v = v.checked_add(u128::from(b - b'0') * frac_scale).ok_or_else(err)?;
        }
        total = total.checked_add(v).ok_or_else(err)?;
        if total > (1u128 << 63) {
            return Err(err());
        }
    }
    if neg {
        if total > (1u128 << 63) {
            return Err(err());
        }
        Ok((-(total as i128)) as i64)
    } else {
        i64::try_from(total).map_err(|_| err())
    }
}

/// Formats nanoseconds like Go's `Duration.String()` (e.g. `1m0s`, `1.5s`, `300ms`, `0s`).
pub fn format_go_duration(d: Nanos) -> String {
    if d == 0 {
        return "0s".to_string();
    }
    let neg = d < 0;
    let u = d.unsigned_abs();
    let sign = if neg { "-" } else { "" };
    if u < 1_000_000_000 {
        let (unit, div) = if u < 1_000 {
            ("ns", 1u64)
        } else if u < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", fmt_frac(u, div));
    }
    let h = u / 3_600_000_000_000;
    let rem = u % 3_600_000_000_000;
    let m = rem / 60_000_000_000;
    let s_ns = rem % 60_000_000_000;
    let secs = fmt_frac(s_ns, 1_000_000_000);
    if h > 0 {
        format!("{sign}{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{sign}{m}m{secs}s")
    } else {
        format!("{sign}{secs}s")
    }
}

fn fmt_frac(v: u64, div: u64) -> String {
    let int = v / div;
    let frac = v % div;
    if frac == 0 {
        return int.to_string();
    }
    let width = (div as f64).log10().round() as usize;
    let s = format!("{frac:0width$}");
    format!("{int}.{}", s.trim_end_matches('0'))
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
