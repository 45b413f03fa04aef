//! Which changes between the CRD a kind definition served before and the
//! CRD its new generation generates would break what is already there: the
//! resources stored under the old schema, or the clients of the API.
//!
//! One pure function, [`breaking_changes`]. It compares the API's identity
//! (group, kind, plural, scope), the versions served (each one served
//! before must still be: a version kept with its declared conversion is
//! not a change, so a new storage version breaks nothing), and the schema
//! of `spec` in each version served before with the same version now,
//! recursively
//! through `properties`, `items` and `additionalProperties`. What cannot
//! break anything is not reported: descriptions, defaults added, new
//! optional fields, enums widened, bounds loosened, printer columns and the
//! status schema. A field whose `type` changed is reported once; what is
//! under it is not compared. A field removed from an object that now keeps
//! unknown fields (`x-kubernetes-preserve-unknown-fields`) is not reported:
//! the API server keeps its values.
//!
//! Fields are paths from the resource: `spec.replicas`, the items of a list
//! `spec.ports[].name`, the values of a map `spec.labels{}`; the identity in
//! the kind file's terms (`spec.group`, `spec.version`, `spec.names.kind`,
//! `spec.names.plural`, `spec.scope`). The changes come in a fixed order:
//! the identity first, then the schema as walked, properties by name.

mod bounds;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps,
    JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

/// What kind of breaking change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Breaking {
    /// The group, kind, plural or scope changed: the resources stored,
    /// and the clients, are under another API.
    IdentityChanged,
    /// A version served before is not served: what is stored at it, and
    /// its clients, would break (a version kept with a declared conversion
    /// is not a change).
    VersionRemoved,
    /// A field is no longer declared: the API server drops its values.
    FieldRemoved,
    /// A field's type changed: the values stored no longer validate.
    TypeChanged,
    /// A field is now required and has no default: a resource stored
    /// without it fails validation when next updated.
    RequiredWithoutDefault,
    /// Values a field allowed no longer are (or it now has an enum).
    EnumNarrowed,
    /// A string field's pattern was added or changed.
    PatternChanged,
    /// A minimum was raised or added, or a maximum lowered or added (of a
    /// number, a length, a count of items or of properties).
    BoundTightened,
    /// A string field's format was added or changed.
    FormatChanged,
    /// A field that allowed null no longer does.
    NullableRemoved,
    /// An object that kept unknown fields now drops them.
    PreserveUnknownFieldsRemoved,
}

impl fmt::Display for Breaking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::IdentityChanged => "identity changed",
            Self::VersionRemoved => "version removed",
            Self::FieldRemoved => "field removed",
            Self::TypeChanged => "type changed",
            Self::RequiredWithoutDefault => "required without default",
            Self::EnumNarrowed => "enum narrowed",
            Self::PatternChanged => "pattern changed",
            Self::BoundTightened => "bound tightened",
            Self::FormatChanged => "format changed",
            Self::NullableRemoved => "nullable removed",
            Self::PreserveUnknownFieldsRemoved => "unknown fields no longer preserved",
        })
    }
}

/// One breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakingChange {
    /// Where: `spec.replicas`, `spec.ports[].name`, `spec.labels{}`, or for
    /// the API's identity `spec.group`, `spec.version`, `spec.names.kind`,
    /// `spec.names.plural`, `spec.scope`.
    pub field: String,
    /// What changed.
    pub kind: Breaking,
    /// The same, as a sentence for people: `"fr" is no longer allowed`.
    pub detail: String,
}

impl fmt::Display for BreakingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.field, self.kind, self.detail)
    }
}

/// The changes from `old`, the CRD served before, to `new`, the CRD the
/// new generation of the kind definition generates, that would break
/// resources already stored or clients of the API; none when it is safe.
pub fn breaking_changes(
    old: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
) -> Vec<BreakingChange> {
    let mut found = Found::default();
    identity(old, new, &mut found);
    let stored = storage_version(new).map(|v| v.name.as_str());
    for before in old.spec.versions.iter().filter(|v| v.served) {
        let Some(after) = new.spec.versions.iter().find(|v| v.name == before.name) else {
            version_removed(old, new, &before.name, &mut found);
            continue;
        };
        let mut here = Found::default();
        match (spec_schema(before), spec_schema(after)) {
            (Some(before), Some(after)) => compare("spec", before, after, &mut here),
            (Some(_), None) => here.push("spec", Breaking::FieldRemoved, "its schema is gone"),
            (None, _) => {}
        }
        for mut change in here.0 {
            if stored != Some(after.name.as_str()) {
                change.detail = format!("{} (in {})", change.detail, after.name);
            }
            found.0.push(change);
        }
    }
    found.0
}

/// The version `name` of `old` is not in `new`: what it stored, or its
/// clients, would break. The message says what would keep it.
fn version_removed(
    old: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
    name: &str,
    found: &mut Found,
) {
    let was_stored = storage_version(old).is_some_and(|v| v.name == name);
    let stored = storage_version(new).map_or("", |v| v.name.as_str());
    if was_stored {
        let detail = format!(
            "was {name:?}, is now {stored:?}: the resources are stored at {name}; keep {name} under spec.versions with its conversion to {stored}"
        );
        found.push("spec.version", Breaking::VersionRemoved, detail);
    } else {
        let detail = format!("{name} is no longer served; keep it under spec.versions");
        found.push("spec.versions", Breaking::VersionRemoved, detail);
    }
}

/// The changes found so far, in order.
#[derive(Default)]
struct Found(Vec<BreakingChange>);

impl Found {
    fn push(&mut self, field: &str, kind: Breaking, detail: impl Into<String>) {
        self.0.push(BreakingChange {
            field: field.to_string(),
            kind,
            detail: detail.into(),
        });
    }
}

/// The version resources are stored as: the one marked, else the first.
fn storage_version(crd: &CustomResourceDefinition) -> Option<&CustomResourceDefinitionVersion> {
    let versions = &crd.spec.versions;
    versions.iter().find(|v| v.storage).or(versions.first())
}

/// The schema of `spec` in `version`.
fn spec_schema(version: &CustomResourceDefinitionVersion) -> Option<&JSONSchemaProps> {
    let schema = version.schema.as_ref()?;
    schema
        .open_api_v3_schema
        .as_ref()?
        .properties
        .as_ref()?
        .get("spec")
}

/// The group, kind, plural and scope, each compared.
fn identity(old: &CustomResourceDefinition, new: &CustomResourceDefinition, found: &mut Found) {
    let (before, after) = (&old.spec, &new.spec);
    let pairs = [
        ("spec.group", before.group.as_str(), after.group.as_str()),
        ("spec.names.kind", &before.names.kind, &after.names.kind),
        (
            "spec.names.plural",
            &before.names.plural,
            &after.names.plural,
        ),
        ("spec.scope", &before.scope, &after.scope),
    ];
    for (field, was, is) in pairs {
        if was != is {
            let detail = format!("was {was:?}, is now {is:?}");
            found.push(field, Breaking::IdentityChanged, detail);
        }
    }
}

/// One field's schema before and after, then what is under it.
fn compare(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    if let Some(is) = &new.type_
        && old.type_.as_ref() != Some(is)
    {
        let detail = match &old.type_ {
            Some(was) => format!("was {was}, is now {is}"),
            None => format!("had none, is now {is}"),
        };
        found.push(path, Breaking::TypeChanged, detail);
        return;
    }
    flags(path, old, new, found);
    enum_narrowed(path, old, new, found);
    let (pattern, format) = (Breaking::PatternChanged, Breaking::FormatChanged);
    added_or_changed(path, pattern, "pattern", &old.pattern, &new.pattern, found);
    added_or_changed(path, format, "format", &old.format, &new.format, found);
    bounds::compare(path, old, new, found);
    properties(path, old, new, found);
    if let (Some(was), Some(is)) = (list_items(old), list_items(new)) {
        compare(&format!("{path}[]"), was, is, found);
    }
    map_values(path, old, new, found);
}

/// `nullable` and `x-kubernetes-preserve-unknown-fields` no longer true.
fn flags(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    let dropped = |was: Option<bool>, is: Option<bool>| was == Some(true) && is != Some(true);
    if dropped(old.nullable, new.nullable) {
        found.push(path, Breaking::NullableRemoved, "null is no longer allowed");
    }
    let preserve = |s: &JSONSchemaProps| s.x_kubernetes_preserve_unknown_fields;
    if dropped(preserve(old), preserve(new)) {
        let detail = "unknown fields are no longer kept: the API server drops them";
        found.push(path, Breaking::PreserveUnknownFieldsRemoved, detail);
    }
}

/// Values of the enum removed, or an enum where there was none.
fn enum_narrowed(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    let Some(is) = &new.enum_ else { return };
    let allowed: Vec<&Value> = is.iter().map(|v| &v.0).collect();
    let detail = match &old.enum_ {
        None => format!(
            "now only {} {} allowed",
            listed(&allowed),
            be(allowed.len())
        ),
        Some(was) => {
            let gone: Vec<&Value> = was
                .iter()
                .map(|v| &v.0)
                .filter(|v| !allowed.contains(v))
                .collect();
            if gone.is_empty() {
                return;
            }
            format!("{} {} no longer allowed", listed(&gone), be(gone.len()))
        }
    };
    found.push(path, Breaking::EnumNarrowed, detail);
}

/// JSON values, `"a", "b"`.
fn listed(values: &[&Value]) -> String {
    let texts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    texts.join(", ")
}

/// `is` for one, `are` for more.
fn be(count: usize) -> &'static str {
    if count == 1 { "is" } else { "are" }
}

/// A text constraint (`pattern`, `format`) added or changed.
fn added_or_changed(
    path: &str,
    kind: Breaking,
    what: &str,
    was: &Option<String>,
    is: &Option<String>,
    found: &mut Found,
) {
    match (was, is) {
        (None, Some(is)) => found.push(path, kind, format!("a {what} was added: {is:?}")),
        (Some(was), Some(is)) if was != is => {
            found.push(path, kind, format!("the {what} was {was:?}, is now {is:?}"));
        }
        _ => {}
    }
}

/// Each property, by name: removed, newly required without a default, or
/// compared.
fn properties(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    let none = BTreeMap::new();
    let before = old.properties.as_ref().unwrap_or(&none);
    let after = new.properties.as_ref().unwrap_or(&none);
    let required = |s: &JSONSchemaProps| -> BTreeSet<String> {
        s.required.iter().flatten().cloned().collect()
    };
    let (was_required, is_required) = (required(old), required(new));
    let names: BTreeSet<&String> = before
        .keys()
        .chain(after.keys())
        .chain(&is_required)
        .collect();
    for name in names {
        let field = format!("{path}.{name}");
        let default = after.get(name).and_then(|s| s.default.as_ref());
        if is_required.contains(name) && !was_required.contains(name) && default.is_none() {
            let detail = "it is now required and has no default: a resource stored without it \
                          fails validation when next updated";
            found.push(&field, Breaking::RequiredWithoutDefault, detail);
        }
        match (before.get(name), after.get(name)) {
            (Some(was), Some(is)) => compare(&field, was, is, found),
            (Some(_), None) if !keeps_unknown(new) => {
                let detail = "it is no longer declared: the API server drops its values";
                found.push(&field, Breaking::FieldRemoved, detail);
            }
            _ => {}
        }
    }
}

/// The values of a map (`additionalProperties`) compared, or no longer
/// declared.
fn map_values(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, found: &mut Found) {
    let field = format!("{path}{{}}");
    match (map_schema(old), map_schema(new)) {
        (Some(was), Some(is)) => compare(&field, was, is, found),
        (Some(_), None) if !keeps_unknown(new) => {
            let detail = "the map's values are no longer declared: the API server drops them";
            found.push(&field, Breaking::FieldRemoved, detail);
        }
        _ => {}
    }
}

/// The schema of a list's items.
fn list_items(schema: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &schema.items {
        Some(JSONSchemaPropsOrArray::Schema(items)) => Some(items),
        _ => None,
    }
}

/// The schema of a map's values.
fn map_schema(schema: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &schema.additional_properties {
        Some(JSONSchemaPropsOrBool::Schema(values)) => Some(values),
        _ => None,
    }
}

/// True when the object keeps fields its schema does not declare.
fn keeps_unknown(schema: &JSONSchemaProps) -> bool {
    schema.x_kubernetes_preserve_unknown_fields == Some(true)
}

#[cfg(test)]
mod tests;
