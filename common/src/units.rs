//! Human-friendly sizes and durations, shared by the target daemon and the CLI.
//!
//! Sizes are whole numbers of bytes with an optional binary unit; every unit
//! is a power of 1024 (`4k` = `4KiB` = 4096). Durations are whole numbers
//! with an optional `us`, `ms`, `s`, `m` or `h` unit; a bare number means seconds.

use std::time::Duration;

/// Valid size syntax, quoted in every size error.
const SIZE_SYNTAX: &str = "a whole number of bytes with an optional binary unit \
     k/KiB, m/MiB, g/GiB or t/TiB (powers of 1024, case-insensitive), \
     e.g. 4096, 4KiB, 64MiB or 10GiB";

/// Valid duration syntax, quoted in every duration error.
const DURATION_SYNTAX: &str = "a whole number with an optional unit us, ms, s, m or h \
     (seconds if none), e.g. 50us, 500ms, 10s, 2m or 1h";

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Why a size or duration string was rejected.
///
/// Every message says what is wrong and shows valid syntax (`syntax`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The string is empty or only whitespace.
    #[error("empty value; expected {syntax}")]
    Empty {
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
    /// The string does not start with a digit.
    #[error("{input:?} does not start with a number; expected {syntax}")]
    MissingNumber {
        /// The rejected string.
        input: String,
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
    /// The number is negative.
    #[error("{input:?} is negative; expected {syntax}")]
    Negative {
        /// The rejected string.
        input: String,
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
    /// The number has a fractional part.
    #[error("{input:?} is not a whole number (use a smaller unit instead of a fraction); expected {syntax}")]
    Fractional {
        /// The rejected string.
        input: String,
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
    /// The unit after the number is not one of the accepted units.
    #[error("unknown unit {unit:?} in {input:?}; expected {syntax}")]
    UnknownUnit {
        /// The rejected string.
        input: String,
        /// The unit as written.
        unit: String,
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
    /// The value does not fit in 64 bits (bytes, or seconds for durations).
    #[error("{input:?} is too large to represent; expected {syntax}")]
    Overflow {
        /// The rejected string.
        input: String,
        /// Description and examples of valid syntax.
        syntax: &'static str,
    },
}

/// Parses a size such as `4096`, `4k`, `4KiB`, `256MiB`, `1G` or `10 GiB`.
///
/// Accepted units (case-insensitive, all powers of 1024): none (bytes),
/// `k`/`KiB`, `m`/`MiB`, `g`/`GiB`, `t`/`TiB`. Whitespace is allowed around
/// the value and between the number and the unit. Empty, negative,
/// fractional and overflowing values and unknown units (including SI-looking
/// ones such as `kb`) are rejected.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(s, SIZE_SYNTAX)?;
    let multiplier = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => TIB,
        _ => return Err(unknown_unit(s, unit, SIZE_SYNTAX)),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| overflow(s, SIZE_SYNTAX))
}

/// Parses a duration such as `50us`, `500ms`, `10s`, `2m` or `1h`; a bare
/// number means seconds.
///
/// Units are case-insensitive and may be separated from the number by
/// whitespace. Negative, fractional and overflowing values and unknown units
/// are rejected.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (number, unit) = split_number(s, DURATION_SYNTAX)?;
    let seconds_per_unit = match unit.to_ascii_lowercase().as_str() {
        "us" | "µs" => return Ok(Duration::from_micros(number)),
        "ms" => return Ok(Duration::from_millis(number)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(unknown_unit(s, unit, DURATION_SYNTAX)),
    };
    number
        .checked_mul(seconds_per_unit)
        .map(Duration::from_secs)
        .ok_or_else(|| overflow(s, DURATION_SYNTAX))
}

/// Formats a byte count with the largest binary unit that divides it
/// exactly: `1GiB`, `4KiB`, `1536MiB`; `1000` and `0` stay plain bytes.
///
/// The result always parses back to the same value with [`parse_size`].
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    if bytes != 0 {
        for (multiplier, unit) in UNITS {
            if bytes.is_multiple_of(multiplier) {
                return format!("{}{unit}", bytes / multiplier);
            }
        }
    }
    bytes.to_string()
}

/// Splits `s` into its leading whole number and the (trimmed) unit after it.
fn split_number<'a>(s: &'a str, syntax: &'static str) -> Result<(u64, &'a str), UnitError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(UnitError::Empty { syntax });
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, rest) = t.split_at(digits_end);
    if digits.is_empty() {
        let input = s.to_owned();
        return Err(if t.starts_with('-') {
            UnitError::Negative { input, syntax }
        } else if t.starts_with('.') && t[1..].starts_with(|c: char| c.is_ascii_digit()) {
            UnitError::Fractional { input, syntax }
        } else {
            UnitError::MissingNumber { input, syntax }
        });
    }
    if rest.starts_with('.') {
        return Err(UnitError::Fractional {
            input: s.to_owned(),
            syntax,
        });
    }
    // Only ASCII digits remain, so the parse can fail only by overflowing.
    let number = digits.parse::<u64>().map_err(|_| overflow(s, syntax))?;
    Ok((number, rest.trim_start()))
}

fn unknown_unit(input: &str, unit: &str, syntax: &'static str) -> UnitError {
    UnitError::UnknownUnit {
        input: input.to_owned(),
        unit: unit.to_owned(),
        syntax,
    }
}

fn overflow(input: &str, syntax: &'static str) -> UnitError {
    UnitError::Overflow {
        input: input.to_owned(),
        syntax,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_without_unit_is_bytes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("  512  "), Ok(512));
        assert_eq!(parse_size("0004"), Ok(4));
    }

    #[test]
    fn size_units_are_binary_and_case_insensitive() {
        for s in ["4k", "4K", "4KiB", "4kib", "4KIB", "4 KiB", "4\tk", " 4k "] {
            assert_eq!(parse_size(s), Ok(4096), "{s}");
        }
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("3m"), Ok(3 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("10gib"), Ok(10 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
    }

    #[test]
    fn size_rejects_empty() {
        for s in ["", "   "] {
            let err = parse_size(s).unwrap_err();
            assert!(matches!(err, UnitError::Empty { .. }), "{s:?}: {err}");
            assert!(err.to_string().contains("64MiB"), "shows an example: {err}");
        }
    }

    #[test]
    fn size_rejects_negative() {
        for s in ["-1", "-4k", " -0"] {
            let err = parse_size(s).unwrap_err();
            assert!(matches!(err, UnitError::Negative { .. }), "{s:?}: {err}");
            assert!(err.to_string().contains("negative"), "{err}");
        }
    }

    #[test]
    fn size_rejects_fractions() {
        for s in ["1.5G", "0.5", ".5k", "4.k"] {
            let err = parse_size(s).unwrap_err();
            assert!(matches!(err, UnitError::Fractional { .. }), "{s:?}: {err}");
            assert!(err.to_string().contains("whole number"), "{err}");
        }
    }

    #[test]
    fn size_rejects_missing_number() {
        for s in ["GiB", "k", "abc", "+4k", "0x10"] {
            let err = parse_size(s).unwrap_err();
            assert!(
                matches!(
                    err,
                    UnitError::MissingNumber { .. } | UnitError::UnknownUnit { .. }
                ),
                "{s:?}: {err}"
            );
        }
        assert!(matches!(
            parse_size("GiB"),
            Err(UnitError::MissingNumber { .. })
        ));
    }

    #[test]
    fn size_rejects_unknown_units() {
        for (s, unit) in [
            ("4kb", "kb"),
            ("4KB", "KB"),
            ("1MB", "MB"),
            ("1gb", "gb"),
            ("4096B", "B"),
            ("1PiB", "PiB"),
            ("1 k b", "k b"),
            ("1_000", "_000"),
        ] {
            match parse_size(s) {
                Err(err @ UnitError::UnknownUnit { .. }) => {
                    let msg = err.to_string();
                    assert!(msg.contains(&format!("{unit:?}")), "{msg}");
                    assert!(msg.contains("KiB"), "lists valid units: {msg}");
                }
                other => panic!("{s:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn size_rejects_overflow() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 << 40));
        for s in [
            "18446744073709551616",
            "99999999999999999999999",
            "16777216TiB",
            "17179869184g",
            "18014398509481984k",
        ] {
            let err = parse_size(s).unwrap_err();
            assert!(matches!(err, UnitError::Overflow { .. }), "{s:?}: {err}");
            assert!(err.to_string().contains("too large"), "{err}");
        }
    }

    #[test]
    fn format_uses_largest_exact_unit() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(1), "1");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(1536 << 20), "1536MiB");
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(10 << 30), "10GiB");
        assert_eq!(format_size(3 << 40), "3TiB");
        assert_eq!(format_size((1 << 40) + 4096), "1073741828KiB");
        assert_eq!(format_size(u64::MAX), "18446744073709551615");
    }

    #[test]
    fn format_then_parse_round_trips() {
        let mut values = vec![0, 1, 512, 1000, 4095, u64::MAX, u64::MAX - 1023];
        for shift in 0..64 {
            let v = 1u64 << shift;
            values.extend([v, v.wrapping_mul(3), v.wrapping_mul(1000), v - 1]);
        }
        for v in values {
            let text = format_size(v);
            assert_eq!(parse_size(&text), Ok(v), "{v} -> {text}");
        }
    }

    #[test]
    fn duration_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(parse_duration("7µs"), Ok(Duration::from_micros(7)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 5 S "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250MS"), Ok(Duration::from_millis(250)));
    }

    fn kind(err: &UnitError) -> &'static str {
        match err {
            UnitError::Empty { .. } => "empty",
            UnitError::MissingNumber { .. } => "missing number",
            UnitError::Negative { .. } => "negative",
            UnitError::Fractional { .. } => "fractional",
            UnitError::UnknownUnit { .. } => "unknown unit",
            UnitError::Overflow { .. } => "overflow",
        }
    }

    #[test]
    fn duration_rejects_bad_input() {
        for (s, expected) in [
            ("", "empty"),
            ("s", "missing number"),
            ("-1s", "negative"),
            ("1.5s", "fractional"),
            ("5d", "unknown unit"),
            ("10sec", "unknown unit"),
            ("1 kib", "unknown unit"),
            ("18446744073709551615h", "overflow"),
        ] {
            let err = parse_duration(s).unwrap_err();
            assert_eq!(kind(&err), expected, "{s:?}: {err}");
            assert!(err.to_string().contains("500ms"), "shows an example: {err}");
        }
    }

    #[test]
    fn duration_limits() {
        assert_eq!(
            parse_duration("18446744073709551615"),
            Ok(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse_duration("18446744073709551615ms"),
            Ok(Duration::from_millis(u64::MAX))
        );
        assert!(matches!(
            parse_duration("307445734561825861m"),
            Err(UnitError::Overflow { .. })
        ));
    }
}
