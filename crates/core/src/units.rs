//! Owns the parsing and display of the human units the CLI and config files
//! use: durations such as `250ms`, `10s`, `5m`, and byte sizes such as
//! `64MiB`. Everything past the edge of the program works with `Duration`
//! and `u64` bytes; nothing deeper parses strings.

use std::time::Duration;

/// A duration or size string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{input}`: {hint}")]
pub struct UnitError {
    what: &'static str,
    input: String,
    hint: &'static str,
}

const DURATION_HINT: &str = "use a number with a unit, such as 250ms, 10s, 5m or 1h";
const SIZE_HINT: &str = "use a number with a unit, such as 512KiB, 64MiB or 1GiB (or plain bytes)";

/// Parses a duration such as `250ms`, `1.5s`, `10s`, `5m`, `2h`, `7d` or `0`.
///
/// A bare `0` is accepted (it means "none" for timeouts); other numbers need
/// a unit so that `--timeout 5` is not silently read as 5 ms or 5 s.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let err = || UnitError {
        what: "duration",
        input: input.to_owned(),
        hint: DURATION_HINT,
    };
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(err)?;
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(err()),
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e10).contains(&secs) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size such as `64MiB`, `1GiB`, `512KiB`, `10MB` or `4096`.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    let err = || UnitError {
        what: "size",
        input: input.to_owned(),
        hint: SIZE_HINT,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" | "K" => 1024.0,
        "MiB" | "M" => 1024.0 * 1024.0,
        "GiB" | "G" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => return Err(err()),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Formats a duration for people: `850µs`, `12.3ms`, `4.20s`, `3m05s`.
pub fn format_duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros < 1_000 {
        format!("{micros}µs")
    } else if micros < 1_000_000 {
        format!("{:.1}ms", d.as_secs_f64() * 1e3)
    } else if d.as_secs() < 60 {
        format!("{:.2}s", d.as_secs_f64())
    } else {
        let secs = d.as_secs();
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

/// Formats a byte count for people: `512B`, `64MiB`, `1.5GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, scale) in UNITS {
        if bytes >= scale {
            return if bytes.is_multiple_of(scale) {
                format!("{}{name}", bytes / scale)
            } else {
                format!("{:.1}{name}", bytes as f64 / scale as f64)
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1e400s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("10MB"), Ok(10_000_000));
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1536), "1.5KiB");
    }
}
