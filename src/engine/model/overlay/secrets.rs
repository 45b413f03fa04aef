//! Whether an overlay may hold Secret data, decided from what it holds, not
//! from how its kind built it: a Secret may come from a base file, a
//! resource template, a patch, a generator (the overlay's own or one its
//! base declares) or a patch that turns another object into a Secret.
//!
//! The look is conservative: a file that does not read as YAML could be
//! anything, so it counts as holding a Secret. What this misses, a Secret
//! the build produces, is caught on the built objects ([`is_secret`]).

use std::collections::BTreeMap;

use serde_json::Value;

/// Kinds whose objects hold Secret data or make objects that do (a
/// kustomize builtin generator configured in a base's `generators`).
const SECRET_KINDS: [&str; 2] = ["Secret", "SecretGenerator"];

/// kustomization fields whose string entries are inline YAML (a builtin
/// plugin's configuration) rather than file paths.
const INLINE_LISTS: [&str; 3] = ["generators", "transformers", "validators"];

/// True when any of the overlay's `files` holds, generates or patches in
/// a Secret, or cannot be read as YAML.
pub(super) fn holds_secret(files: &BTreeMap<String, Vec<u8>>) -> bool {
    files.values().any(|bytes| file_holds_secret(bytes))
}

/// True for a built object of kind Secret.
pub fn is_secret(object: &Value) -> bool {
    object["kind"].as_str() == Some("Secret")
}

fn file_holds_secret(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        // Not text, so not a manifest kustomize reads: data a generator
        // reads, and the generator is what tells whether it is secret.
        return false;
    };
    yaml_holds_secret(text)
}

/// True for YAML text any of whose documents holds a Secret, or for text
/// that does not parse.
fn yaml_holds_secret(text: &str) -> bool {
    match serde_saphyr::from_multiple::<Value>(text) {
        Ok(documents) => documents.iter().any(value_holds_secret),
        Err(_) => true,
    }
}

fn value_holds_secret(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            let secret_kind = map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| SECRET_KINDS.contains(&k));
            let generator = map.contains_key("secretGenerator");
            // A JSON 6902 operation that sets an object's kind.
            let kind_patch =
                map.contains_key("op") && map.get("path").and_then(Value::as_str) == Some("/kind");
            secret_kind
                || generator
                || kind_patch
                || map
                    .iter()
                    .any(|(key, child)| child_holds_secret(key, child))
        }
        Value::Array(items) => items.iter().any(value_holds_secret),
        _ => false,
    }
}

/// A field's value, reading inline YAML where kustomize does (`patch`, and
/// the string entries of `generators`, `transformers`, `validators`).
fn child_holds_secret(key: &str, child: &Value) -> bool {
    match (key, child) {
        ("patch", Value::String(inline)) => yaml_holds_secret(inline),
        (list, Value::Array(items)) if INLINE_LISTS.contains(&list) => {
            items.iter().any(|item| match item {
                Value::String(inline) => yaml_holds_secret(inline),
                other => value_holds_secret(other),
            })
        }
        _ => value_holds_secret(child),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(text: &str) -> bool {
        holds_secret(&BTreeMap::from([(
            "f.yaml".to_string(),
            text.as_bytes().to_vec(),
        )]))
    }

    #[test]
    fn a_secret_in_any_document_is_found() {
        assert!(holds("apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n"));
        assert!(holds(
            "kind: ConfigMap\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Secret\"}\n"
        ));
        assert!(holds("kind: \"Secret\"\n"));
        assert!(holds(
            "apiVersion: v1\nkind: List\nitems:\n  - {kind: Secret}\n"
        ));
    }

    #[test]
    fn generators_and_kind_changes_are_found() {
        assert!(holds(
            "secretGenerator:\n  - name: s\n    literals: [a=b]\n"
        ));
        assert!(holds(
            "generators:\n  - |\n    apiVersion: builtin\n    kind: SecretGenerator\n    metadata: {name: s}\n"
        ));
        assert!(holds("- op: replace\n  path: /kind\n  value: Secret\n"));
        assert!(holds(
            "patches:\n  - patch: |\n      apiVersion: v1\n      kind: Secret\n      metadata: {name: s}\n"
        ));
        assert!(holds(
            "patches:\n  - path: p.yaml\n    target: {kind: Secret, name: s}\n"
        ));
    }

    #[test]
    fn other_objects_and_data_are_not_secret() {
        assert!(!holds(
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  note: \"kind: Secret\"\n"
        ));
        assert!(!holds(
            "- op: replace\n  path: /spec/kind\n  value: Secret\n"
        ));
        assert!(!holds(
            "configMapGenerator:\n  - name: c\n    files: [a=x]\n"
        ));
        assert!(!holds("just some text\n"));
        assert!(!holds_secret(&BTreeMap::from([(
            "logo.png".to_string(),
            vec![0x89, 0x50, 0xff, 0xfe]
        )])));
    }

    #[test]
    fn text_that_is_not_yaml_counts_as_secret() {
        assert!(holds("a: [unclosed\n"));
    }

    #[test]
    fn a_built_secret_is_secret() {
        assert!(is_secret(
            &serde_json::json!({"apiVersion": "v1", "kind": "Secret"})
        ));
        assert!(!is_secret(
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"})
        ));
    }
}
