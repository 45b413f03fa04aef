//! A change of versions, seen from the objects stored: each one converted
//! to the change's stored version by the change's conversions (the API
//! server then drops what the schema does not declare), and back to the
//! version it is at, and what did not come back; and the breaking-change
//! guard's verdict between the kind served now and the change.

use serde_json::Value;

use super::change::Loaded;
use super::report::{Failure, Guard, Reason};
use crate::definitions::generation;
use crate::kinds::declared::DeclaredKind;
use crate::kinds::declared::breaking;
use crate::kinds::declared::conforms::prune;

/// The guard's verdict on the change from `current`, as the operator
/// would give it for a new generation.
pub fn guard(current: &DeclaredKind, change: &Loaded) -> Guard {
    let changes = breaking::breaking_changes(&current.crd(), &change.kind.crd());
    Guard {
        changes: changes.iter().map(ToString::to_string).collect(),
        allowed: generation::breaking_allowed(&change.definition),
    }
}

/// True when the change stores another version than `current`, or
/// serves older ones: stored objects go through its conversions.
pub fn converts(current: &DeclaredKind, change: &DeclaredKind) -> bool {
    current.file.spec.version != change.file.spec.version || !change.file.spec.versions.is_empty()
}

/// A stored object through the change's conversions.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundTrip {
    /// The object at the change's stored version, as the API server would
    /// keep it: what the change renders.
    pub object: Value,
    /// Fields of the stored object that would not come back.
    pub lost: Vec<String>,
    /// Computed fields that did not compute.
    pub failures: Vec<Failure>,
}

/// `stored` (one of the kind's, at the version it is served at now)
/// converted to the change's stored version and back.
pub fn round_trip(change: &DeclaredKind, stored: &Value) -> Result<RoundTrip, Failure> {
    let versions = change.versions();
    let spec = &change.file.spec;
    let failed = |message: String| Failure {
        object: None,
        reason: Reason::ConversionFailed,
        message,
    };
    let from = (stored["apiVersion"].as_str())
        .and_then(|v| v.rsplit_once('/'))
        .map(|(_, v)| v.to_string())
        .unwrap_or_default();
    let older = spec.versions.iter().find(|v| v.name == from);
    let mut hub = (versions.convert(stored.clone(), &spec.version))
        .map_err(|e| failed(format!("to {}: {e}", spec.version)))?;
    let mut failures = Vec::new();
    if let Some(older) = older {
        let up = older.conversion.up.keys();
        failures.extend(uncomputed(&hub, up, &from, &spec.version));
    }
    prune(&mut hub["spec"], &spec.schema);
    let mut back = (versions.convert(hub.clone(), &from))
        .map_err(|e| failed(format!("back to {from}: {e}")))?;
    if let Some(older) = older {
        let down = older.conversion.down.keys();
        failures.extend(uncomputed(&back, down, &spec.version, &from));
        prune(&mut back["spec"], &older.schema);
    } else {
        prune(&mut back["spec"], &spec.schema);
    }
    let mut lost = Vec::new();
    lost_paths(&stored["spec"], &back["spec"], "spec", &mut lost);
    Ok(RoundTrip {
        object: hub,
        lost,
        failures,
    })
}

/// The computed `fields` that `object` lacks after a conversion from
/// `from` to `to`.
fn uncomputed<'a>(
    object: &Value,
    fields: impl Iterator<Item = &'a String>,
    from: &str,
    to: &str,
) -> Vec<Failure> {
    fields
        .filter(|field| dotted(object, field).is_none())
        .map(|field| Failure {
            object: None,
            reason: Reason::ConversionFailed,
            message: format!(
                "{field} (computed converting {from} to {to}) did not compute: its expression failed, or read a field this resource lacks"
            ),
        })
        .collect()
}

fn dotted<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, key| v.as_object()?.get(key))
}

/// The paths under `path` where `before` had a value that `after` lacks
/// or holds otherwise.
fn lost_paths(before: &Value, after: &Value, path: &str, lost: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                let at = format!("{path}.{key}");
                match a.get(key) {
                    Some(kept) => lost_paths(value, kept, &at, lost),
                    None => lost.push(at),
                }
            }
        }
        _ if before != after => lost.push(path.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lost_paths_are_what_did_not_come_back() {
        let before = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        let after = json!({"a": 1, "b": {"c": 2}, "e": [2], "new": true});
        let mut lost = Vec::new();
        lost_paths(&before, &after, "spec", &mut lost);
        assert_eq!(lost, ["spec.b.d", "spec.e"]);
    }
}
