//! Whether a value fits a kind's OpenAPI schema, as far as the conversion
//! webhook must know before it answers: every value of the type its schema
//! declares, every required field there.
//!
//! The API server does not check what a conversion webhook answers against
//! the version asked for: a wrong type there is stored, or read, as is. So
//! the webhook checks its own output ([`check`]) over the subset of OpenAPI
//! a kind file's schema uses for structure: `type`, `required`,
//! `properties`, `items`, `additionalProperties`, `nullable`,
//! `x-kubernetes-int-or-string` and `x-kubernetes-preserve-unknown-fields`
//! (whose values go unchecked). Formats, patterns, bounds, enums and CEL
//! rules are the API server's, on every write; a conversion cannot widen a
//! field into them without changing its type. The walk follows the schema,
//! so it goes no deeper than the schema does, however deep the value.
//! Messages name the field and what is wrong, never the value. [`prune`]
//! drops what a schema does not declare, as the API server prunes.

use serde_json::Value;

/// How many problems of one value are named.
pub const NAMED: usize = 3;

/// One place where a value does not fit its schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    /// A required field is missing.
    #[error("{0}: Required value")]
    Required(String),
    /// A value of another type than the schema's.
    #[error("{path}: expected {expected}, got {got}")]
    WrongType {
        /// The field (`spec.replicas`, `spec.ports[0].port`).
        path: String,
        /// The type the schema declares.
        expected: &'static str,
        /// The type of the value.
        got: &'static str,
    },
}

/// Checks `value`, the field `path` (`spec`), against its `schema`: the
/// first [`NAMED`] places where it does not fit, if any.
pub fn check(value: &Value, schema: &Value, path: &str) -> Result<(), Vec<Misfit>> {
    let mut found = Vec::new();
    walk(value, schema, path, &mut found);
    if found.is_empty() { Ok(()) } else { Err(found) }
}

fn walk(value: &Value, schema: &Value, path: &str, found: &mut Vec<Misfit>) {
    if found.len() >= NAMED {
        return;
    }
    if value.is_null() && schema["nullable"] == true {
        return;
    }
    if let Some(expected) = expected(schema) {
        let got = type_of(value);
        if !fits(expected, got) {
            found.push(Misfit::WrongType {
                path: path.to_string(),
                expected,
                got,
            });
            return;
        }
    }
    match value {
        Value::Object(fields) => {
            let required = schema["required"].as_array().into_iter().flatten();
            for name in required.filter_map(Value::as_str) {
                if !fields.contains_key(name) && found.len() < NAMED {
                    found.push(Misfit::Required(format!("{path}.{name}")));
                }
            }
            let properties = schema["properties"].as_object();
            let others = schema["additionalProperties"]
                .as_object()
                .map(|_| &schema["additionalProperties"]);
            for (name, field) in fields {
                let child = properties.and_then(|p| p.get(name)).or(others);
                if let Some(child) = child {
                    walk(field, child, &format!("{path}.{name}"), found);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
                for (i, value) in items.iter().enumerate() {
                    walk(value, item, &format!("{path}[{i}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// Drops from `value` what `schema` does not declare, as the API server
/// prunes unknown fields: an object keeps its `properties` (each pruned by
/// its own schema), or every key under `additionalProperties`, or all of
/// itself with `x-kubernetes-preserve-unknown-fields`; a list's items are
/// pruned by `items`.
pub fn prune(value: &mut Value, schema: &Value) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    match value {
        Value::Object(fields) => {
            if let Some(properties) = schema["properties"].as_object() {
                fields.retain(|key, _| properties.contains_key(key));
                for (key, field) in fields.iter_mut() {
                    prune(field, &properties[key]);
                }
            } else if let Some(each) = schema.get("additionalProperties").filter(|s| s.is_object())
            {
                for field in fields.values_mut() {
                    prune(field, each);
                }
            } else if schema["additionalProperties"] != true {
                fields.clear();
            }
        }
        Value::Array(items) => {
            for item in items {
                prune(item, &schema["items"]);
            }
        }
        _ => {}
    }
}

/// The type a schema node declares, if it declares one the walk checks.
fn expected(schema: &Value) -> Option<&'static str> {
    if schema["x-kubernetes-int-or-string"] == true {
        return Some("integer or string");
    }
    match schema["type"].as_str()? {
        "object" => Some("object"),
        "array" => Some("array"),
        "string" => Some("string"),
        "integer" => Some("integer"),
        "number" => Some("number"),
        "boolean" => Some("boolean"),
        _ => None,
    }
}

/// The type of `value`, as OpenAPI names it.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// True when a value of type `got` is one of type `expected` (an integer
/// is a number too).
fn fits(expected: &str, got: &str) -> bool {
    match expected {
        "integer or string" => got == "integer" || got == "string",
        "number" => got == "number" || got == "integer",
        _ => expected == got,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "required": ["replicas"], "properties": {
            "replicas": {"type": "integer"},
            "ratio": {"type": "number"},
            "name": {"type": "string", "nullable": true},
            "port": {"x-kubernetes-int-or-string": true},
            "ports": {"type": "array", "items": {"type": "object", "required": ["port"], "properties": {
                "port": {"type": "integer"},
            }}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "notes": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        }})
    }

    fn misfits(spec: Value) -> Vec<String> {
        match check(&spec, &schema(), "spec") {
            Ok(()) => Vec::new(),
            Err(found) => found.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn pruning_keeps_what_the_schema_declares() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string"},
            "m": {"type": "object", "additionalProperties": {"type": "object", "properties": {"x": {}}}},
            "l": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }});
        let mut value = json!({
            "a": "1", "gone": 2,
            "m": {"k": {"x": 1, "z": 2}},
            "l": [{"y": 1, "z": 2}],
            "free": {"anything": {"at": "all"}}
        });
        prune(&mut value, &schema);
        assert_eq!(
            value,
            json!({"a": "1", "m": {"k": {"x": 1}}, "l": [{"y": 1}], "free": {"anything": {"at": "all"}}})
        );
    }

    #[test]
    fn a_value_of_the_declared_types_with_its_required_fields_fits() {
        let spec = json!({"replicas": 3, "ratio": 2, "name": null, "port": "http",
            "ports": [{"port": 80}], "labels": {"a": "b"}, "notes": {"x": [1, {"y": true}]},
            "unknown": {"left": "to the API server's pruning"}});
        assert_eq!(misfits(spec), Vec::<String>::new());
        assert_eq!(
            misfits(json!({"replicas": 1, "port": 8080})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_wrong_type_or_a_missing_required_field_is_named_without_the_value() {
        assert_eq!(misfits(json!({})), ["spec.replicas: Required value"]);
        let spec = json!({"replicas": "secret words", "ratio": "x"});
        assert_eq!(
            misfits(spec),
            [
                "spec.ratio: expected number, got string",
                "spec.replicas: expected integer, got string",
            ]
        );
        assert_eq!(
            misfits(json!({"replicas": 1.5})),
            ["spec.replicas: expected integer, got number"]
        );
        let nested =
            json!({"replicas": 1, "ports": [{"port": 1}, {}], "labels": {"a": 1}, "port": true});
        assert_eq!(
            misfits(nested),
            [
                "spec.labels.a: expected string, got integer",
                "spec.port: expected integer or string, got boolean",
                "spec.ports[1].port: Required value",
            ]
        );
        assert_eq!(
            misfits(json!("spec")),
            ["spec: expected object, got string"]
        );
    }

    #[test]
    fn only_the_first_few_are_named() {
        let spec = json!({"ports": [{}, {}, {}, {}, {}]});
        assert_eq!(misfits(spec).len(), NAMED);
    }
}
