//! Bounds tightened: a minimum raised or added, a maximum lowered or added,
//! of a number (`minimum`/`exclusiveMinimum`, `maximum`/`exclusiveMaximum`),
//! a length, a count of items or of properties. Loosening one is fine.

use std::cmp::Ordering;
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

use super::{Breaking, Found};

/// Which end of the range a bound limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// A minimum: raising it tightens.
    Lower,
    /// A maximum: lowering it tightens.
    Upper,
}

/// One bound: its value, and whether the value itself is excluded.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Limit {
    value: f64,
    exclusive: bool,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value)?;
        if self.exclusive {
            f.write_str(" (exclusive)")?;
        }
        Ok(())
    }
}

/// Every bound of one field's schema before and after.
pub(super) fn compare(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    for ((name, side, was), (_, _, is)) in bounds(old).into_iter().zip(bounds(new)) {
        if let Some(detail) = tightened(name, side, was, is) {
            found.push(path, Breaking::BoundTightened, detail);
        }
    }
}

/// The bounds of one schema, named, in the order they are compared.
fn bounds(s: &JSONSchemaProps) -> [(&'static str, Side, Option<Limit>); 8] {
    [
        (
            "minimum",
            Side::Lower,
            number(s.minimum, s.exclusive_minimum),
        ),
        (
            "maximum",
            Side::Upper,
            number(s.maximum, s.exclusive_maximum),
        ),
        ("minLength", Side::Lower, count(s.min_length)),
        ("maxLength", Side::Upper, count(s.max_length)),
        ("minItems", Side::Lower, count(s.min_items)),
        ("maxItems", Side::Upper, count(s.max_items)),
        ("minProperties", Side::Lower, count(s.min_properties)),
        ("maxProperties", Side::Upper, count(s.max_properties)),
    ]
}

/// A numeric bound, exclusive or not.
fn number(value: Option<f64>, exclusive: Option<bool>) -> Option<Limit> {
    value.map(|value| Limit {
        value,
        exclusive: exclusive == Some(true),
    })
}

/// A bound on a length or a count (always inclusive).
fn count(value: Option<i64>) -> Option<Limit> {
    value.map(|value| Limit {
        value: value as f64,
        exclusive: false,
    })
}

/// How the bound `name` on `side` was tightened from `was` to `is`, if it
/// was: `minLength raised from 1 to 3`, `maximum 10 added (there was none)`.
fn tightened(name: &str, side: Side, was: Option<Limit>, is: Option<Limit>) -> Option<String> {
    let is = is?;
    let Some(was) = was else {
        return Some(format!("{name} {is} added (there was none)"));
    };
    let (tighter, verb) = match side {
        Side::Lower => (Ordering::Greater, "raised"),
        Side::Upper => (Ordering::Less, "lowered"),
    };
    let tightens = match is.value.partial_cmp(&was.value) {
        Some(Ordering::Equal) => is.exclusive && !was.exclusive,
        order => order == Some(tighter),
    };
    tightens.then(|| format!("{name} {verb} from {was} to {is}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inclusive(value: f64) -> Option<Limit> {
        Some(Limit {
            value,
            exclusive: false,
        })
    }

    fn exclusive(value: f64) -> Option<Limit> {
        Some(Limit {
            value,
            exclusive: true,
        })
    }

    #[test]
    fn a_minimum_raised_made_exclusive_or_added_tightens() {
        let raised = tightened("minimum", Side::Lower, inclusive(1.0), inclusive(2.5));
        assert_eq!(raised.as_deref(), Some("minimum raised from 1 to 2.5"));
        let made_exclusive = tightened("minimum", Side::Lower, inclusive(1.0), exclusive(1.0));
        assert_eq!(
            made_exclusive.as_deref(),
            Some("minimum raised from 1 to 1 (exclusive)")
        );
        let added = tightened("minimum", Side::Lower, None, exclusive(0.0));
        assert_eq!(
            added.as_deref(),
            Some("minimum 0 (exclusive) added (there was none)")
        );
    }

    #[test]
    fn a_bound_loosened_kept_or_removed_does_not() {
        let cases = [
            (Side::Lower, inclusive(2.0), inclusive(1.0)),
            (Side::Lower, exclusive(1.0), inclusive(1.0)),
            (Side::Lower, inclusive(1.0), None),
            (Side::Upper, inclusive(5.0), inclusive(9.0)),
            (Side::Upper, exclusive(5.0), exclusive(5.0)),
            (Side::Upper, None, None),
        ];
        for (side, was, is) in cases {
            assert_eq!(
                tightened("x", side, was, is),
                None,
                "{side:?} {was:?} {is:?}"
            );
        }
    }

    #[test]
    fn a_maximum_lowered_tightens() {
        let lowered = tightened("maxItems", Side::Upper, count(Some(10)), count(Some(3)));
        assert_eq!(lowered.as_deref(), Some("maxItems lowered from 10 to 3"));
    }
}
