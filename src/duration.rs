//! Duration strings as Kubernetes users write them: `90s`, `10m`, `1h30m`, `500ms`.

use std::time::Duration;

/// A duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a number with a unit (ms, s, m, h), e.g. 30s, 10m or 1h30m"
)]
pub struct DurationError {
    input: String,
}

/// Parses `1h30m`, `10m`, `45s`, `250ms` (units may be combined, largest first or not).
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_string(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.checked_mul(60).ok_or_else(err)?),
            "h" => Duration::from_secs(value.checked_mul(3600).ok_or_else(err)?),
            _ => return Err(err()),
        };
        total = total.checked_add(part).ok_or_else(err)?;
    }
    Ok(total)
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
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "10", "m", "1x", "-5s", "1.5h", "s10"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
