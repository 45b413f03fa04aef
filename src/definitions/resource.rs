//! The `KindDefinition` resource (`kustomize-operator.io/v1alpha1`,
//! cluster-scoped): its CRD, its names, and its status.
//!
//! The spec is a kind file's spec (`kind pack` prints one) with the
//! folder's files in `spec.files`. The API server checks the shape of the
//! fields it can; the operator checks the rest as it does a kind folder
//! at start, and says what is wrong in the status.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ApiResource;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::kind::ConditionStatus;

/// The API group.
pub const GROUP: &str = "kustomize-operator.io";
/// The version.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "KindDefinition";
/// The plural.
pub const PLURAL: &str = "kinddefinitions";
/// The finalizer the operator keeps on a definition until the kind it
/// declares is no longer served.
pub const FINALIZER: &str = "kustomize-operator.io/kind-definition";
/// The label on a CRD the operator applied for a definition: the
/// definition's name. The operator changes and deletes no CRD without it.
pub const MARKER_LABEL: &str = "kustomize-operator.io/kind-definition";
/// The annotation that lets a definition change its kind's schema or
/// identity in a way stored resources break on (value `"true"`).
pub const ALLOW_BREAKING_ANNOTATION: &str = "kustomize-operator.io/allow-breaking-changes";

/// Where the API serves definitions.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// The CRD of `KindDefinition`.
pub fn crd() -> CustomResourceDefinition {
    let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let spec = json!({
        "type": "object",
        "description": "A kind file's spec (see docs/kind-file.md) and the kind folder's files; `kustomize-operator kind pack DIR` prints one.",
        "required": ["group", "version", "names", "schema"],
        "properties": {
            "group": {"type": "string", "minLength": 1, "maxLength": 253},
            "version": {"type": "string", "pattern": "^v[0-9]+((alpha|beta)[0-9]+)?$"},
            "names": {
                "type": "object",
                "required": ["kind", "plural"],
                "properties": {
                    "kind": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$", "maxLength": 63},
                    "plural": {"type": "string", "pattern": "^[a-z][a-z0-9]*$", "maxLength": 63},
                    "singular": {"type": "string", "pattern": "^[a-z][a-z0-9]*$", "maxLength": 63},
                    "shortNames": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
                },
            },
            "scope": {"type": "string", "enum": ["Namespaced", "Cluster"]},
            "schema": open,
            "printerColumns": {"type": "array", "maxItems": 32, "items": open},
            "overlay": open,
            "status": {"type": "array", "items": open},
            "readiness": {"type": "array", "items": open},
            "reconcile": open,
            "onDelete": {
                "type": "string",
                "enum": ["Refuse", "Orphan"],
                "description": "While resources of the kind exist, deleting the definition waits (Refuse, the default) or leaves them, their objects and the CRD in place (Orphan).",
            },
            "files": {
                "type": "object",
                "description": "The kind folder's files: path (base/…, patches/…, resources/…) to text.",
                "additionalProperties": {"type": "string"},
                "maxProperties": 256,
            },
        },
    });
    let condition = json!({
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64"},
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64"},
            "servingGeneration": {"type": "integer", "format": "int64"},
            "resources": {"type": "integer", "format": "int64"},
            "crd": {"type": "string"},
            "reach": {"type": "array", "items": {"type": "string"}},
            "conditions": {"type": "array", "items": condition},
        },
    });
    let column = |name: &str, type_: &str, path: &str| json!({"name": name, "type": type_, "jsonPath": path});
    let condition_column = |name: &str| {
        column(
            name,
            "string",
            &format!(".status.conditions[?(@.type==\"{name}\")].status"),
        )
    };
    let value = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{PLURAL}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "plural": PLURAL, "singular": "kinddefinition", "shortNames": ["kinddef"]},
            "scope": "Cluster",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A kind the operator serves while it runs: its API, schema, overlay recipe and files.",
                    "required": ["spec"],
                    "properties": {"spec": spec, "status": status},
                }},
                "additionalPrinterColumns": [
                    column("Kind", "string", ".spec.names.kind"),
                    column("Group", "string", ".spec.group"),
                    condition_column("Accepted"),
                    condition_column("RightsGranted"),
                    condition_column("Serving"),
                    column("Resources", "integer", ".status.resources"),
                    column("Age", "date", ".metadata.creationTimestamp"),
                ],
            }],
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

/// The conditions of a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionType {
    /// Its current generation is valid and may replace the one served.
    Accepted,
    /// The CRD it declares is applied and established.
    #[serde(rename = "CRDEstablished")]
    CrdEstablished,
    /// The identity writing the kind's objects may do everything the
    /// overlays need.
    RightsGranted,
    /// A controller serves the kind.
    Serving,
}

/// Why a condition is as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// Every check passed.
    Valid,
    /// A file or a field is wrong (the message names it).
    Invalid,
    /// The kind's name, CRD or API belongs to another kind.
    Clash,
    /// The schema or identity changed in a way stored resources break on.
    BreakingChange,
    /// The kind's base does not build.
    BaseFailed,
    /// The definitions served would be larger than the operator's budget.
    TooLarge,
    /// The CRD is established.
    Established,
    /// The CRD is applied but not (yet) established.
    NotEstablished,
    /// A CRD of that name exists without this definition's marker.
    CrdNotOwned,
    /// Applying the CRD failed.
    CrdApplyFailed,
    /// Every right is granted.
    Granted,
    /// Some rights are missing (the message lists them).
    MissingRights,
    /// The access reviews could not be made.
    ReviewFailed,
    /// The kind's controller runs.
    Running,
    /// No generation was ever accepted since the operator started.
    NoValidGeneration,
    /// The definition is being deleted and resources of the kind remain.
    WaitingForResources,
}

/// One condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Which.
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Why.
    pub reason: Reason,
    /// Detail: what is wrong, where.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: jiff::Timestamp,
    /// The generation it describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A definition's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The generation last looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The generation whose kind is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_generation: Option<i64>,
    /// How many resources of the kind exist (all namespaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<u64>,
    /// The CRD's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd: Option<String>,
    /// What the identity writing the kind's objects could reach beyond a
    /// resource's own namespace, one line per object type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reach: Option<Vec<String>>,
    /// `Accepted`, `CRDEstablished`, `RightsGranted`, `Serving`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The longest condition message kept, in bytes.
const MESSAGE_LIMIT: usize = 4096;

impl Status {
    /// Sets a condition; its transition time changes only with its status.
    pub fn set(
        &mut self,
        type_: ConditionType,
        ok: bool,
        reason: Reason,
        message: &str,
        generation: Option<i64>,
    ) {
        let status = ConditionStatus::from(ok);
        let message = crate::kind::truncate(message, MESSAGE_LIMIT);
        let now = jiff::Timestamp::now();
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason;
                c.message = message;
                c.observed_generation = generation;
            }
            None => self.conditions.push(Condition {
                type_,
                status,
                reason,
                message,
                last_transition_time: now,
                observed_generation: generation,
            }),
        }
    }

    /// The condition of type `type_`, if set.
    pub fn condition(&self, type_: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// True when the condition `type_` is `True`.
    pub fn is_true(&self, type_: ConditionType) -> bool {
        self.condition(type_)
            .is_some_and(|c| c.status == ConditionStatus::True)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_is_cluster_scoped_with_a_status_and_columns() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("kinddefinitions.kustomize-operator.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Kind",
                "Group",
                "Accepted",
                "RightsGranted",
                "Serving",
                "Resources",
                "Age"
            ]
        );
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let mut status = Status::default();
        status.set(ConditionType::Accepted, true, Reason::Valid, "", Some(1));
        let first = status.conditions[0].last_transition_time;
        status.set(ConditionType::Accepted, true, Reason::Valid, "", Some(2));
        assert_eq!(status.conditions[0].last_transition_time, first);
        assert_eq!(status.conditions[0].observed_generation, Some(2));
        status.set(
            ConditionType::Accepted,
            false,
            Reason::Invalid,
            "x",
            Some(3),
        );
        assert!(!status.is_true(ConditionType::Accepted));
        let text = serde_json::to_value(&status).unwrap();
        assert_eq!(text["conditions"][0]["type"], "Accepted");
        assert_eq!(text["conditions"][0]["reason"], "Invalid");
    }
}
