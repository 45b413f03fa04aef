//! Breaking changes between two CRDs built from small schemas of `spec`:
//! one test per rule, changes that break nothing, and nested fields.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use super::*;

/// A CRD as a declared kind's: one version, `spec` as given, a status.
fn crd(spec: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "greetings.hello.example.com"},
        "spec": {
            "group": "hello.example.com",
            "names": {"kind": "Greeting", "plural": "greetings", "singular": "greeting"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": spec,
                        "status": {"type": "object", "properties": {"url": {"type": "string"}}},
                    },
                }},
                "additionalPrinterColumns": [
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }))
    .expect("a CRD")
}

/// An object schema with these properties.
fn object(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

/// The changes from `old` to `new` (schemas of spec), as displayed.
fn changes(old: Value, new: Value) -> Vec<String> {
    breaking_changes(&crd(old), &crd(new))
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The fields and kinds of the changes from `old` to `new`.
fn kinds(old: Value, new: Value) -> Vec<(String, Breaking)> {
    breaking_changes(&crd(old), &crd(new))
        .into_iter()
        .map(|c| (c.field, c.kind))
        .collect()
}

fn one(field: &str, kind: Breaking) -> Vec<(String, Breaking)> {
    vec![(field.to_string(), kind)]
}

#[test]
fn the_same_crd_breaks_nothing() {
    let spec = object(json!({"message": {"type": "string", "enum": ["hi"], "maxLength": 9}}));
    assert_eq!(changes(spec.clone(), spec), Vec::<String>::new());
}

#[test]
fn a_new_group_kind_plural_or_scope_changes_the_identity_and_a_version_gone_is_named() {
    let old = crd(object(json!({})));
    let mut new = old.clone();
    new.spec.group = "hi.example.com".into();
    new.spec.versions[0].name = "v2".into();
    new.spec.names.kind = "Hello".into();
    new.spec.names.plural = "hellos".into();
    new.spec.names.singular = Some("hello".into());
    new.spec.scope = "Cluster".into();
    let found: Vec<String> = breaking_changes(&old, &new)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            r#"spec.group: identity changed: was "hello.example.com", is now "hi.example.com""#,
            r#"spec.names.kind: identity changed: was "Greeting", is now "Hello""#,
            r#"spec.names.plural: identity changed: was "greetings", is now "hellos""#,
            r#"spec.scope: identity changed: was "Namespaced", is now "Cluster""#,
            r#"spec.version: version removed: was "v1", is now "v2": the resources are stored at v1; keep v1 under spec.versions with its conversion to v2"#,
        ]
    );
}

#[test]
fn the_storage_version_is_the_one_compared() {
    let old = crd(object(json!({"size": {"type": "integer"}})));
    let mut new = old.clone();
    let mut served_only = new.spec.versions[0].clone();
    served_only.name = "v1beta1".into();
    served_only.storage = false;
    served_only.schema = None;
    new.spec.versions.insert(0, served_only);
    assert_eq!(breaking_changes(&old, &new), []);
}

#[test]
fn a_new_storage_version_that_keeps_the_old_one_breaks_nothing_but_its_schema_is_compared() {
    let old = crd(object(json!({"size": {"type": "integer"}})));
    let mut new = old.clone();
    let mut v2 = new.spec.versions[0].clone();
    v2.name = "v2".into();
    new.spec.versions[0].storage = false;
    new.spec.versions.insert(0, v2);
    assert_eq!(breaking_changes(&old, &new), []);
    let v1 = &mut new.spec.versions[1];
    let schema = v1
        .schema
        .as_mut()
        .unwrap()
        .open_api_v3_schema
        .as_mut()
        .unwrap();
    let spec = schema.properties.as_mut().unwrap().get_mut("spec").unwrap();
    spec.properties = Some(Default::default());
    let found: Vec<String> = breaking_changes(&old, &new)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "spec.size: field removed: it is no longer declared: the API server drops its values (in v1)"
        ]
    );
}

#[test]
fn an_older_version_no_longer_served_is_named() {
    let mut old = crd(object(json!({})));
    let mut v1beta1 = old.spec.versions[0].clone();
    v1beta1.name = "v1beta1".into();
    v1beta1.storage = false;
    old.spec.versions.push(v1beta1);
    let new = crd(object(json!({})));
    let found: Vec<String> = breaking_changes(&old, &new)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "spec.versions: version removed: v1beta1 is no longer served; keep it under spec.versions"
        ]
    );
}

#[test]
fn a_property_removed_is_reported() {
    let old = object(json!({"message": {"type": "string"}, "size": {"type": "integer"}}));
    let new = object(json!({"size": {"type": "integer"}}));
    assert_eq!(
        changes(old, new),
        ["spec.message: field removed: it is no longer declared: the API server drops its values"]
    );
}

#[test]
fn a_property_removed_where_unknown_fields_are_kept_is_not() {
    let old = object(json!({"message": {"type": "string"}}));
    let new = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    assert_eq!(kinds(old, new), []);
}

#[test]
fn a_type_changed_is_reported_once_without_what_is_under_it() {
    let old = object(json!({"style": object(json!({"color": {"type": "string"}}))}));
    let new = object(json!({"style": {"type": "string", "pattern": "^a"}}));
    assert_eq!(
        changes(old, new),
        ["spec.style: type changed: was object, is now string"]
    );
}

#[test]
fn a_field_newly_required_without_a_default_is_reported() {
    let old = object(json!({"size": {"type": "integer"}, "name": {"type": "string"}}));
    let mut new = object(json!({
        "size": {"type": "integer"},
        "name": {"type": "string", "default": "web"},
        "zone": {"type": "string"},
    }));
    new["required"] = json!(["name", "size", "zone"]);
    assert_eq!(
        changes(old.clone(), new.clone())[0],
        "spec.size: required without default: it is now required and has no default: \
         a resource stored without it fails validation when next updated"
    );
    assert_eq!(
        kinds(old, new),
        [
            ("spec.size".to_string(), Breaking::RequiredWithoutDefault),
            ("spec.zone".to_string(), Breaking::RequiredWithoutDefault),
        ]
    );
}

#[test]
fn a_field_required_before_is_not_reported_again() {
    let mut old = object(json!({"size": {"type": "integer"}}));
    old["required"] = json!(["size"]);
    assert_eq!(kinds(old.clone(), old), []);
}

#[test]
fn an_enum_losing_values_is_narrowed() {
    let old = object(json!({"language": {"type": "string", "enum": ["en", "fr", "de"]}}));
    let new = object(json!({"language": {"type": "string", "enum": ["en"]}}));
    let one_gone = object(json!({"language": {"type": "string", "enum": ["en", "de"]}}));
    assert_eq!(
        changes(old.clone(), one_gone),
        [r#"spec.language: enum narrowed: "fr" is no longer allowed"#]
    );
    assert_eq!(
        changes(old, new),
        [r#"spec.language: enum narrowed: "fr", "de" are no longer allowed"#]
    );
}

#[test]
fn an_enum_added_is_narrowed() {
    let old = object(json!({"replicas": {"type": "integer"}}));
    let new = object(json!({"replicas": {"type": "integer", "enum": [1, 3]}}));
    assert_eq!(
        changes(old, new),
        ["spec.replicas: enum narrowed: now only 1, 3 are allowed"]
    );
}

#[test]
fn a_pattern_added_or_changed_is_reported_and_removed_is_not() {
    let plain = object(json!({"name": {"type": "string"}}));
    let lower = object(json!({"name": {"type": "string", "pattern": "^[a-z]+$"}}));
    let short = object(json!({"name": {"type": "string", "pattern": "^[a-z]{1,5}$"}}));
    assert_eq!(
        changes(plain.clone(), lower.clone()),
        [r#"spec.name: pattern changed: a pattern was added: "^[a-z]+$""#]
    );
    assert_eq!(
        changes(lower.clone(), short),
        [r#"spec.name: pattern changed: the pattern was "^[a-z]+$", is now "^[a-z]{1,5}$""#]
    );
    assert_eq!(kinds(lower, plain), []);
}

#[test]
fn bounds_raised_lowered_or_added_are_tightened() {
    let old = object(json!({
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "name": {"type": "string", "maxLength": 63},
        "hosts": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    }));
    let new = object(json!({
        "port": {"type": "integer", "minimum": 1024, "maximum": 65535, "exclusiveMaximum": true},
        "name": {"type": "string", "minLength": 1, "maxLength": 63},
        "hosts": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 8},
    }));
    assert_eq!(
        changes(old, new),
        [
            "spec.hosts: bound tightened: minItems 1 added (there was none)",
            "spec.hosts: bound tightened: maxItems lowered from 10 to 5",
            "spec.labels: bound tightened: maxProperties 8 added (there was none)",
            "spec.name: bound tightened: minLength 1 added (there was none)",
            "spec.port: bound tightened: minimum raised from 1 to 1024",
            "spec.port: bound tightened: maximum lowered from 65535 to 65535 (exclusive)",
        ]
    );
}

#[test]
fn nullable_dropped_is_reported() {
    let old = object(json!({"note": {"type": "string", "nullable": true}}));
    let new = object(json!({"note": {"type": "string", "nullable": false}}));
    assert_eq!(
        changes(old, new),
        ["spec.note: nullable removed: null is no longer allowed"]
    );
}

#[test]
fn unknown_fields_no_longer_kept_are_reported() {
    let old = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let new = object(json!({"size": {"type": "integer"}}));
    assert_eq!(
        kinds(old, new),
        one("spec", Breaking::PreserveUnknownFieldsRemoved)
    );
}

#[test]
fn a_format_added_or_changed_is_reported() {
    let plain = object(json!({"since": {"type": "string"}}));
    let date = object(json!({"since": {"type": "string", "format": "date"}}));
    let date_time = object(json!({"since": {"type": "string", "format": "date-time"}}));
    assert_eq!(
        kinds(plain, date.clone()),
        one("spec.since", Breaking::FormatChanged)
    );
    assert_eq!(
        changes(date, date_time),
        [r#"spec.since: format changed: the format was "date", is now "date-time""#]
    );
}

#[test]
fn additive_changes_break_nothing() {
    let old = object(json!({
        "language": {"type": "string", "enum": ["en"], "description": "Which."},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
        "name": {"type": "string", "maxLength": 10, "pattern": "^a"},
        "color": {"type": "string"},
    }));
    let new = object(json!({
        "language": {"type": "string", "enum": ["en", "fr"], "description": "Which one."},
        "replicas": {"type": "integer", "minimum": 0, "maximum": 9},
        "name": {"type": "string", "maxLength": 20, "nullable": true},
        "color": {"type": "string", "default": "blue"},
        "style": object(json!({"size": {"type": "integer"}})),
    }));
    assert_eq!(changes(old, new), Vec::<String>::new());
}

#[test]
fn the_status_schema_and_printer_columns_are_ignored() {
    let old = crd(object(json!({})));
    let mut new = old.clone();
    let version = &mut new.spec.versions[0];
    version.additional_printer_columns = None;
    let schema = version
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut());
    let schema = schema.expect("a schema");
    schema.description = Some("changed".into());
    let properties = schema.properties.as_mut().expect("properties");
    assert!(properties.remove("status").is_some());
    assert_eq!(breaking_changes(&old, &new), []);
}

#[test]
fn fields_in_lists_of_objects_and_map_values_are_compared() {
    let old = object(json!({
        "ports": {"type": "array", "items": object(json!({
            "name": {"type": "string"},
            "port": {"type": "integer"},
        }))},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "env": {"type": "object", "additionalProperties": object(json!({"value": {"type": "string"}}))},
    }));
    let mut item = object(json!({"port": {"type": "integer", "maximum": 1024}}));
    item["required"] = json!(["port"]);
    let new = object(json!({
        "ports": {"type": "array", "items": item},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "env": {"type": "object", "additionalProperties": object(json!({"value": {"type": "string", "enum": ["a"]}}))},
    }));
    assert_eq!(
        kinds(old, new),
        [
            ("spec.env{}.value".to_string(), Breaking::EnumNarrowed),
            ("spec.labels{}".to_string(), Breaking::TypeChanged),
            ("spec.ports[].name".to_string(), Breaking::FieldRemoved),
            (
                "spec.ports[].port".to_string(),
                Breaking::RequiredWithoutDefault
            ),
            ("spec.ports[].port".to_string(), Breaking::BoundTightened),
        ]
    );
}

#[test]
fn map_values_no_longer_declared_are_removed() {
    let old =
        object(json!({"labels": {"type": "object", "additionalProperties": {"type": "string"}}}));
    let new = object(json!({"labels": object(json!({"app": {"type": "string"}}))}));
    assert_eq!(
        kinds(old, new),
        one("spec.labels{}", Breaking::FieldRemoved)
    );
}
