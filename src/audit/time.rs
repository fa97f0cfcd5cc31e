//! Times in the audit log: stored as Unix milliseconds, shown as RFC 3339 (UTC), and
//! taken by `--since`/`--until` (and `since`/`until` over HTTP) as RFC 3339, a date, or a
//! duration back from now.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unix milliseconds.
pub fn millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// RFC 3339 with milliseconds, UTC.
pub fn show(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `2026-11-26T05:00:00Z` (RFC 3339; an offset, or a space for the `T`, work too),
/// `2026-11-26` (midnight UTC), or a duration back from now: `24h`, `7d`, `30m`, `90s`.
pub fn parse(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "{text:?} is not a time: give RFC 3339 (2026-11-26T05:00:00Z), a date (2026-11-26), or a duration back from now (24h, 7d, 30m)"
        )
    };
    if let Ok(ago) = humantime::parse_duration(text) {
        return now.checked_sub(ago).ok_or_else(bad);
    }
    if text.len() == 10 {
        return humantime::parse_rfc3339(&format!("{text}T00:00:00Z")).map_err(|_| bad());
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(t);
    }
    // An offset other than Z: humantime takes only UTC.
    let (body, offset) = split_offset(text).ok_or_else(bad)?;
    let t = humantime::parse_rfc3339_weak(body).map_err(|_| bad())?;
    let shifted = if offset >= 0 {
        t.checked_sub(Duration::from_secs(offset as u64))
    } else {
        t.checked_add(Duration::from_secs((-offset) as u64))
    };
    shifted.ok_or_else(bad)
}

/// `...+05:30` -> (`...`, 19800).
fn split_offset(text: &str) -> Option<(&str, i64)> {
    if text.len() < 6 {
        return None;
    }
    let (body, tail) = text.split_at(text.len() - 6);
    let sign = match tail.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = tail[1..].split_once(':')?;
    let seconds = h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60;
    Some((body, sign * seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_documented() {
        let now = humantime::parse_rfc3339("2026-11-26T12:00:00Z").unwrap();
        let at = |s: &str| show(millis(parse(s, now).unwrap()));
        assert_eq!(at("24h"), "2026-11-25T12:00:00.000Z");
        assert_eq!(at("7d"), "2026-11-19T12:00:00.000Z");
        assert_eq!(at("30m"), "2026-11-26T11:30:00.000Z");
        assert_eq!(at("2026-11-01"), "2026-11-01T00:00:00.000Z");
        assert_eq!(at("2026-11-01T05:06:07Z"), "2026-11-01T05:06:07.000Z");
        assert_eq!(at("2026-11-01 05:06:07"), "2026-11-01T05:06:07.000Z");
        assert_eq!(at("2026-11-01T05:06:07+01:00"), "2026-11-01T04:06:07.000Z");
        assert_eq!(at("2026-11-01T05:06:07-00:30"), "2026-11-01T05:36:07.000Z");
        for bad in ["yesterday", "", "2026-13-01", "12:00"] {
            assert!(parse(bad, now).unwrap_err().contains("not a time"), "{bad}");
        }
    }
}
