//! Duration strings as Kubernetes users write them: `90s`, `10m`, `1h30m`,
//! `500ms`. jiff parses them (its "friendly" format); a thin check first
//! keeps the grammar to numbers with the units `h`, `m`, `s` and `ms`, so
//! that `1 hour`, `PT1H` or `1.5h` — which jiff would read — are refused
//! here as they are by the CRDs' patterns.

use std::time::Duration;

/// A duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a number with a unit (ms, s, m, h), e.g. 30s, 10m or 1h30m"
)]
pub struct DurationError {
    input: String,
}

/// Parses `1h30m`, `10m`, `45s`, `250ms` (units may be combined).
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_string(),
    };
    let s = input.trim();
    if !follows_grammar(s) {
        return Err(err());
    }
    let signed: jiff::SignedDuration = s.parse().map_err(|_| err())?;
    Duration::try_from(signed).map_err(|_| err())
}

/// One or more `<digits><unit>` with unit `h`, `m`, `s` or `ms`.
fn follows_grammar(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "h", "m", "s"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    }

    #[test]
    fn rejects_garbage_and_what_only_jiff_would_read() {
        for bad in [
            "",
            "10",
            "m",
            "1x",
            "-5s",
            "1.5h",
            "s10",
            "1 hour",
            "PT1H",
            "1h 30m",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
