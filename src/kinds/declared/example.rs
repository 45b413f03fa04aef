//! A made-up resource of a declared kind, every field of its schema
//! filled in, rendered once when a kind is defined in the cluster: a
//! template that cannot render (an unknown filter, a variable the schema
//! does not have) is refused then, naming the template, rather than at
//! each resource's reconcile.

use serde_json::{Map, Value, json};

use super::DeclaredKind;
use super::object::DeclaredObject;
use crate::kind::KustomizeDir;
use crate::kinds::Preview;

/// How deep the example follows nested schemas.
const MAX_DEPTH: usize = 16;

/// A value `schema` allows: its default, else its first enum value, else
/// one of its type (objects with every property, arrays with one item).
pub fn example(schema: &Value) -> Value {
    value(schema, 0)
}

fn value(schema: &Value, depth: usize) -> Value {
    if let Some(default) = schema.get("default") {
        return default.clone();
    }
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => Value::String("example".into()),
        Some("integer") => schema.get("minimum").cloned().unwrap_or(json!(1)),
        Some("number") => schema.get("minimum").cloned().unwrap_or(json!(1.5)),
        Some("boolean") => Value::Bool(true),
        Some("array") => match schema.get("items") {
            Some(items) => json!([value(items, depth + 1)]),
            None => json!([]),
        },
        _ => object(schema, depth),
    }
}

fn object(schema: &Value, depth: usize) -> Value {
    let mut map = Map::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            map.insert(name.clone(), value(property, depth + 1));
        }
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        map.insert("example".into(), value(values, depth + 1));
    }
    Value::Object(map)
}

impl DeclaredKind {
    /// Renders the overlay of a made-up resource with every field set,
    /// from `templates`: why it cannot be rendered, if it cannot.
    pub fn render_example(&self, templates: &KustomizeDir) -> Result<(), String> {
        let resource: DeclaredObject = serde_json::from_value(json!({
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": {
                "name": "example",
                "namespace": self.namespaced().then_some("default"),
                "uid": Preview::PLACEHOLDER_UID,
                "generation": 1,
            },
            "spec": example(&self.file.spec.schema),
        }))
        .map_err(|e| e.to_string())?;
        let read = (self.file.spec.references.iter())
            .map(|(name, r)| (name.clone(), example_reference(r)))
            .collect();
        let overlay = self
            .recipe
            .overlay(self.name(), &self.file.spec, &resource, &read)
            .map_err(|e| e.to_string())?;
        overlay
            .render(templates, None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What a reference reads in the example: an object of its type with
/// nothing in it (a list for a selector), so a template must give each
/// field it reads of it a default.
fn example_reference(reference: &super::file::Reference) -> Value {
    let object = json!({
        "apiVersion": reference.api_version,
        "kind": reference.kind,
        "metadata": {"name": "example", "namespace": "default", "labels": {}, "annotations": {}},
    });
    match reference.name {
        Some(_) => object,
        None => Value::Array(vec![object]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_filled_with_what_the_schema_allows() {
        let schema = json!({
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "language": {"type": "string", "enum": ["en", "it"]},
                "count": {"type": "integer", "minimum": 2},
                "shout": {"type": "boolean", "default": false},
                "ports": {"type": "array", "items": {"type": "object", "properties": {"port": {"type": "integer"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        });
        assert_eq!(
            example(&schema),
            json!({
                "message": "example",
                "language": "en",
                "count": 2,
                "shout": false,
                "ports": [{"port": 1}],
                "labels": {"example": "example"},
            })
        );
    }

    #[test]
    fn every_kind_folder_of_the_repository_renders_its_example() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let roots = [root.join("kustomize"), root.join("tests/fixtures/kinds")];
        let dir = KustomizeDir::load_all(&roots).unwrap();
        let kinds = super::super::load(&dir).unwrap();
        assert!(kinds.len() > 2);
        for kind in kinds {
            kind.render_example(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        }
    }
}
