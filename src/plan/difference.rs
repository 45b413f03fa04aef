//! The difference of two renders of one resource: which objects the
//! change adds, changes (which fields, as paths) or prunes. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

use super::report::{Change, ObjectChange};
use crate::kind::ObjectId;

/// The objects of `new` that `old` lacks (added), has otherwise
/// (changed) or has alone (pruned), in the order of their identities;
/// objects equal in both are left out. An object without apiVersion,
/// kind or name is left out (the dry run names it).
pub fn objects(old: &[Value], new: &[Value]) -> Vec<ObjectChange> {
    let (old, new) = (by_id(old), by_id(new));
    let mut changes = Vec::new();
    for (id, after) in &new {
        match old.get(id) {
            None => changes.push(ObjectChange {
                object: id.clone(),
                change: Change::Added,
                fields: Vec::new(),
            }),
            Some(before) => {
                let fields = fields(before, after);
                if !fields.is_empty() {
                    changes.push(ObjectChange {
                        object: id.clone(),
                        change: Change::Changed,
                        fields,
                    });
                }
            }
        }
    }
    for id in old.keys().filter(|id| !new.contains_key(*id)) {
        changes.push(ObjectChange {
            object: id.clone(),
            change: Change::Pruned,
            fields: Vec::new(),
        });
    }
    changes.sort_by(|a, b| a.object.cmp(&b.object));
    changes
}

fn by_id(objects: &[Value]) -> BTreeMap<ObjectId, &Value> {
    (objects.iter())
        .filter_map(|o| Some((ObjectId::of_manifest(o)?, o)))
        .collect()
}

/// The paths where `old` and `new` differ: a field set, changed or
/// removed (`spec.replicas`, `metadata.labels["app.kubernetes.io/name"]`,
/// `spec.containers[0].image`); a list of another length is one path.
pub fn fields(old: &Value, new: &Value) -> Vec<String> {
    let mut found = Vec::new();
    walk(old, new, "", &mut found);
    found
}

fn walk(old: &Value, new: &Value, path: &str, found: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let at = child(path, key);
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => walk(x, y, &at, found),
                    _ => found.push(at),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                walk(x, y, &format!("{path}[{i}]"), found);
            }
        }
        _ if old != new => found.push(if path.is_empty() {
            ".".into()
        } else {
            path.into()
        }),
        _ => {}
    }
}

/// `path.key`, or `path["key"]` for a key that is not a plain name.
fn child(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (plain, path.is_empty()) {
        (true, true) => key.to_string(),
        (true, false) => format!("{path}.{key}"),
        (false, _) => format!("{path}[{}]", Value::String(key.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(name: &str, replicas: i64, image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "shop", "labels": {"app.kubernetes.io/name": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "web", "image": image}]}}}
        })
    }

    fn config_map(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "shop"}})
    }

    #[test]
    fn fields_are_paths_to_what_differs() {
        let old = deployment("web", 1, "nginx:1.27");
        let mut new = deployment("web", 2, "nginx:1.28");
        new["metadata"]["labels"]["app.kubernetes.io/name"] = "shop".into();
        new["spec"]["paused"] = true.into();
        assert_eq!(
            fields(&old, &new),
            [
                r#"metadata.labels["app.kubernetes.io/name"]"#,
                "spec.paused",
                "spec.replicas",
                "spec.template.spec.containers[0].image",
            ]
        );
        assert!(fields(&old, &old).is_empty());
        let mut longer = old.clone();
        longer["spec"]["template"]["spec"]["containers"] = json!([{}, {}]);
        assert_eq!(fields(&old, &longer), ["spec.template.spec.containers"]);
    }

    #[test]
    fn objects_are_added_changed_or_pruned_and_equal_ones_left_out() {
        let old = [
            deployment("web", 1, "a"),
            config_map("gone"),
            config_map("same"),
        ];
        let new = [
            config_map("same"),
            config_map("new"),
            deployment("web", 3, "a"),
        ];
        let changes = objects(&old, &new);
        let seen: Vec<(&str, Change, Vec<String>)> = (changes.iter())
            .map(|c| (c.object.name.as_str(), c.change, c.fields.clone()))
            .collect();
        assert_eq!(
            seen,
            [
                ("web", Change::Changed, vec!["spec.replicas".to_string()]),
                ("gone", Change::Pruned, vec![]),
                ("new", Change::Added, vec![]),
            ]
        );
        assert!(objects(&old, &old).is_empty());
    }
}
