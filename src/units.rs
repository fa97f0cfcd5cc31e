//! Durations and sizes as users write them: `30`, `30s`, `500ms`, `2m`; `268435456`, `256M`,
//! `1G`. Binary suffixes (K = 1024), as `docker run --memory` and tmpfs `size=` use them.
//! And text cut to a size in bytes.

use std::time::Duration;

/// Parses a duration: a bare number of seconds or a number with `ms`, `s`, `m` or `h`.
/// Fractions are allowed (`1.5s`); zero and negative values are not.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let form = "a positive number of seconds, or a number with ms, s, m or h (30, 30s, 500ms, 2m)";
    let t = text.trim();
    let (number, unit_ns): (&str, u128) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1_000_000_000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000_000_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000_000_000)
    } else {
        (t, 1_000_000_000)
    };
    let not_a_duration = || format!("{text:?} is not a duration: use {form}");
    let out_of_range = || format!("{text:?} is out of range: use {form}");
    // Decimal arithmetic on the digits, so that what format_duration writes reads back
    // exactly (floating point would turn 1.012s into 1.012000002s).
    let (whole, fraction) = number.trim().split_once('.').unwrap_or((number.trim(), ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(whole) || (whole.is_empty() && digits(fraction)))
        || !(fraction.is_empty() || digits(fraction))
    {
        return Err(not_a_duration());
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| out_of_range())?
    };
    let fraction = &fraction[..fraction.len().min(18)];
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| not_a_duration())?
    };
    let nanos = whole
        .checked_mul(unit_ns)
        .and_then(|n| n.checked_add(fraction * unit_ns / scale))
        .ok_or_else(out_of_range)?;
    if nanos == 0 || nanos > 1_000_000_000 * 1_000_000_000 {
        return Err(out_of_range());
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Parses a size in bytes: a bare number of bytes or a number with K, M, G or T (binary
/// multiples; an optional trailing `B` or `iB` is accepted). Zero is refused.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let form = "a positive number of bytes, or a number with K, M, G or T (268435456, 256M, 1G)";
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (number, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size: use {form}"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is out of range: use {form}"));
    }
    Ok(bytes as u64)
}

/// Formats a byte count the way [`parse_size`] reads it, for messages.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Formats a duration the way [`parse_duration`] reads it, for messages.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The longest head of `text` of at most `max` bytes that ends on a character boundary.
pub fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_on_a_character_boundary() {
        assert_eq!(head("short", 10), "short");
        assert_eq!(head("abcdef", 3), "abc");
        assert_eq!(head("aé", 2), "a");
        assert_eq!(head("é", 1), "");
    }

    #[test]
    fn durations_in_every_accepted_form() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    }

    #[test]
    fn bad_durations_name_the_accepted_form() {
        for bad in ["", "abc", "-1", "0", "0s", "10x", "nan"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("500ms"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn sizes_in_every_accepted_form() {
        assert_eq!(parse_size("268435456").unwrap(), 268435456);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
    }

    #[test]
    fn bad_sizes_name_the_accepted_form() {
        for bad in ["", "12Q", "-1", "0", "M", "0.1"] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains("256M"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn formats_read_back() {
        for n in [1u64, 1000, 1024, 64 << 20, 3 << 30] {
            assert_eq!(parse_size(&format_size(n)).unwrap(), n);
        }
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
}
