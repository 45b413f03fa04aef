//! A watched object as the engine keeps it: the few metadata fields it
//! reads, and the state health rules and status fields read
//! (`spec.replicas`, `spec.type`, `status`) as compact JSON text.
//!
//! The watches of owned objects hold one of these per object. As a
//! `DynamicObject` the same Deployment took about four times the memory
//! (every JSON map is a B-tree of its own), and the parts nobody reads (a
//! Pod template, most metadata) were parsed into it first.

use kube::ResourceExt;
use kube::api::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

use crate::dynamic_kind::dynamic_kind;
use crate::engine::model::inventory::Owner;

/// One watched object: its kind is the watch's [`ApiResource`].
#[derive(Clone, Debug)]
pub(crate) struct CompactObject {
    metadata: ObjectMeta,
    /// `{"spec": {...}, "status": ...}`, serialized.
    state: Box<str>,
}

/// The parts of an object the API sends that a [`CompactObject`] keeps.
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Value,
}

/// The fields of `spec` that health rules read; the rest is skipped unparsed.
#[derive(Deserialize, Serialize, Default)]
struct Spec {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    replicas: Value,
    #[serde(default, rename = "type", skip_serializing_if = "Value::is_null")]
    type_: Value,
}

/// What [`CompactObject::state`] holds.
#[derive(Serialize)]
struct State<'a> {
    spec: &'a Spec,
    status: &'a Value,
}

impl<'de> Deserialize<'de> for CompactObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(deserializer)?;
        let state = serde_json::to_string(&State {
            spec: &wire.spec,
            status: &wire.status,
        })
        .map_err(serde::de::Error::custom)?;
        Ok(Self {
            metadata: kept_metadata(wire.metadata),
            state: state.into_boxed_str(),
        })
    }
}

/// The metadata fields the engine reads: where the object is, its
/// versions, whether it is going, and its owner's annotation.
fn kept_metadata(meta: ObjectMeta) -> ObjectMeta {
    let owner = meta
        .annotations
        .and_then(|mut a| a.remove_entry(Owner::ANNOTATION))
        .map(|entry| [entry].into());
    ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        deletion_timestamp: meta.deletion_timestamp,
        annotations: owner,
        ..ObjectMeta::default()
    }
}

impl CompactObject {
    /// The object as JSON: `metadata`, `spec` (what was kept of it) and
    /// `status`.
    pub fn to_value(&self) -> Value {
        let mut value: Value = serde_json::from_str(&self.state).unwrap_or_else(|_| json!({}));
        value["metadata"] = serde_json::to_value(&self.metadata).unwrap_or_default();
        value
    }

    /// The owner annotation (`Kind.group/ns/name`), if it carries one.
    pub fn owner(&self) -> Option<&String> {
        self.annotations().get(Owner::ANNOTATION)
    }
}

dynamic_kind!(CompactObject);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use kube::api::ApiResource;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "a", "uid": "u", "generation": 3,
                "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {Owner::ANNOTATION: "Sample.nuvolaris.org/a/s", "other": "x"},
                "managedFields": [{"manager": "m"}]
            },
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"observedGeneration": 3, "readyReplicas": 2}
        })
    }

    #[test]
    fn keeps_what_health_and_status_fields_read_and_nothing_else() {
        let observed: CompactObject = serde_json::from_value(deployment()).unwrap();
        assert_eq!(
            observed.to_value(),
            json!({
                "metadata": {
                    "name": "web", "namespace": "a", "uid": "u", "generation": 3,
                    "resourceVersion": "7",
                    "annotations": {Owner::ANNOTATION: "Sample.nuvolaris.org/a/s"}
                },
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 3, "readyReplicas": 2}
            })
        );
        assert_eq!(
            observed.owner().map(String::as_str),
            Some("Sample.nuvolaris.org/a/s")
        );
    }

    #[test]
    fn an_object_without_spec_or_status_has_empty_ones() {
        let observed: CompactObject =
            serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
        let value = observed.to_value();
        assert_eq!(value["spec"], json!({}));
        assert_eq!(value["status"], Value::Null);
        assert_eq!(observed.owner(), None);
    }

    #[test]
    fn its_kind_is_the_watchs() {
        let resource = ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
        };
        assert_eq!(CompactObject::kind(&resource), "Deployment");
        assert_eq!(CompactObject::plural(&resource), "deployments");
        assert_eq!(CompactObject::api_version(&resource), "apps/v1");
    }
}
