//! The check a kind's older version passes when the kind is loaded: every
//! field survives a round trip through the hub, both ways, unless the
//! conversion says it is lossy; what the conversion names exists; a field
//! moved keeps its type.
//!
//! It reads the two schemas only: an object's fields are its `properties`;
//! a list, a map, or an object that keeps unknown fields is one field
//! whose value travels whole.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::kinds::declared::file::{Conversion, OlderVersion};

/// A field of a schema: its type, and whether it is an object whose
/// properties are fields of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    type_: String,
    has_fields: bool,
    keeps_unknown: bool,
}

/// Every field of the `spec` schema `schema`, by dotted path (`spec.a.b`).
fn fields(schema: &Value) -> BTreeMap<String, Field> {
    let mut found = BTreeMap::new();
    walk(schema, "spec", &mut found);
    found
}

fn walk(schema: &Value, path: &str, found: &mut BTreeMap<String, Field>) {
    let properties = schema["properties"].as_object();
    let field = Field {
        type_: schema["type"].as_str().unwrap_or_default().to_string(),
        has_fields: properties.is_some_and(|p| !p.is_empty()),
        keeps_unknown: schema["x-kubernetes-preserve-unknown-fields"] == true,
    };
    found.insert(path.to_string(), field);
    for (name, child) in properties.into_iter().flatten() {
        walk(child, &format!("{path}.{name}"), found);
    }
}

/// `path` with its first segment `from` (itself or an ancestor) replaced
/// by `to`, for the first of `pairs` that matches.
fn mapped<'a>(path: &str, pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    for (from, to) in pairs {
        if path == from {
            return to.to_string();
        }
        if let Some(rest) = path.strip_prefix(from).filter(|r| r.starts_with('.')) {
            return format!("{to}{rest}");
        }
    }
    path.to_string()
}

/// True when `path` or an ancestor is in `listed`.
fn listed_at(path: &str, listed: &[String]) -> bool {
    listed.iter().any(|l| {
        path == l
            || path
                .strip_prefix(l.as_str())
                .is_some_and(|r| r.starts_with('.'))
    })
}

/// True when `fields` has a place for `path`: the field itself, or an
/// ancestor that keeps unknown fields.
fn has_place(fields: &BTreeMap<String, Field>, path: &str) -> bool {
    if fields.contains_key(path) {
        return true;
    }
    let mut at = path;
    while let Some((parent, _)) = at.rsplit_once('.') {
        if fields.get(parent).is_some_and(|f| f.keeps_unknown) {
            return true;
        }
        at = parent;
    }
    false
}

/// Checks the older version `older` (the `index`th of `spec.versions`)
/// against the hub's `spec` schema `hub` (version `hub_name`). The error
/// names the field of the kind file and what to declare.
pub fn check(
    hub: &Value,
    hub_name: &str,
    older: &OlderVersion,
    index: usize,
) -> Result<(), String> {
    let at = format!("spec.versions[{index}]");
    let (old, new) = (fields(&older.schema), fields(hub));
    let conversion = &older.conversion;
    check_named(&at, &old, &new, conversion)?;
    let up = || {
        conversion
            .moves
            .iter()
            .map(|m| (m.from.as_str(), m.to.as_str()))
    };
    let down = || {
        conversion
            .moves
            .iter()
            .map(|m| (m.to.as_str(), m.from.as_str()))
    };
    for (path, field) in old.iter().filter(|(_, f)| !f.has_fields) {
        let there = mapped(path, up());
        // Computed again on the way down: it comes back.
        if listed_at(path, &conversion.lossy) || conversion.down.contains_key(path) {
            continue;
        }
        if !has_place(&new, &there) {
            return Err(format!(
                "{at}: {path} of {} has no place in {hub_name}, so a {} object written at {} would lose it; move it (conversion.moves), compute it on the way back (conversion.down) or declare it lossy (conversion.lossy)",
                older.name, older.name, hub_name
            ));
        }
        if let Some(other) = new.get(&there).filter(|o| o.type_ != field.type_) {
            return Err(format!(
                "{at}: {path} is {:?} in {} but {there} is {:?} in {hub_name}",
                field.type_, older.name, other.type_
            ));
        }
    }
    for path in new.iter().filter(|(_, f)| !f.has_fields).map(|(p, _)| p) {
        let there = mapped(path, down());
        let computed = conversion.up.contains_key(path);
        if !listed_at(path, &conversion.lossy) && !computed && !has_place(&old, &there) {
            return Err(format!(
                "{at}: {path} of {hub_name} has no place in {}, so a {hub_name} object written at {} would lose it; move it (conversion.moves), compute it from {} (conversion.up) or declare it lossy (conversion.lossy)",
                older.name, older.name, older.name
            ));
        }
    }
    Ok(())
}

/// What the conversion names exists: a move's `from` in the older
/// version, its `to` in the hub, a default's field in the hub, a lossy
/// field in either.
fn check_named(
    at: &str,
    old: &BTreeMap<String, Field>,
    new: &BTreeMap<String, Field>,
    conversion: &Conversion,
) -> Result<(), String> {
    let missing = |field: String, path: &str, version: &str| {
        Err(format!(
            "{at}.conversion.{field}: {path} is not a field of the {version} version"
        ))
    };
    for (i, m) in conversion.moves.iter().enumerate() {
        if !old.contains_key(&m.from) {
            return missing(format!("moves[{i}].from"), &m.from, "older");
        }
        if !new.contains_key(&m.to) {
            return missing(format!("moves[{i}].to"), &m.to, "stored");
        }
    }
    for field in conversion.defaults.keys() {
        if !has_place(new, field) {
            return missing(format!("defaults.{field}"), field, "stored");
        }
    }
    for (field, source) in &conversion.up {
        if !has_place(new, field) {
            return missing(format!("up.{field}"), field, "stored");
        }
        compiles(at, "up", field, source)?;
    }
    for (field, source) in &conversion.down {
        if !has_place(old, field) {
            return missing(format!("down.{field}"), field, "older");
        }
        compiles(at, "down", field, source)?;
    }
    for (i, field) in conversion.lossy.iter().enumerate() {
        if !has_place(old, field) && !has_place(new, field) {
            return missing(format!("lossy[{i}]"), field, "older or the stored");
        }
    }
    Ok(())
}

/// The computed field `field` (going `direction`) is CEL that reads `self`
/// only.
fn compiles(at: &str, direction: &str, field: &str, source: &str) -> Result<(), String> {
    super::compile(source)
        .map(|_| ())
        .map_err(|e| format!("{at}.conversion.{direction}.{field}: {e}"))
}
