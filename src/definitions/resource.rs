//! The `KindDefinition` resource (`kustomize-operator.io/v1alpha1`,
//! cluster-scoped): its CRD, its names, and its status.
//!
//! The spec is a kind file's spec (`kind pack` prints one) with the
//! folder's files in `spec.files`. The CRD is derived from the kind file's
//! Rust types ([`KindDefinitionSpec`]), so the API server checks the shape
//! of every field but the kind's own OpenAPI schema: unknown fields, types,
//! enums, patterns, bounds. The operator checks the rest as it does a kind
//! folder at start, and says what is wrong in the status.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ApiResource;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::conditions::{Condition, ConditionType, Reason};
use crate::kind::ConditionStatus;
use crate::kinds::declared::file::KindSpec;
use crate::kinds::declared::rollout::{KEPT_MAX, RolloutSpec};

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

/// A kind file's spec (see docs/kind-file.md) and the kind folder's
/// files; `kustomize-operator kind pack DIR` prints one.
//
// The CRD of `KindDefinition` is derived from this type (its doc comments
// are the CRD's descriptions), so the API server checks every field of the
// recipe: types, unknown fields, enums, patterns. The OpenAPI schema in
// `schema` it keeps whole; the operator checks that, and the rest, when it
// unpacks a generation.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kustomize-operator.io",
    version = "v1alpha1",
    kind = "KindDefinition",
    plural = "kinddefinitions",
    shortname = "kinddef",
    status = "Status",
    doc = "A kind the operator serves while it runs: its API, schema, overlay recipe and files.",
    printcolumn = r#"{"name": "Kind", "type": "string", "jsonPath": ".spec.names.kind"}"#,
    printcolumn = r#"{"name": "Group", "type": "string", "jsonPath": ".spec.group"}"#,
    printcolumn = r#"{"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name": "RightsGranted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"RightsGranted\")].status"}"#,
    printcolumn = r#"{"name": "Serving", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Serving\")].status"}"#,
    printcolumn = r#"{"name": "Resources", "type": "integer", "jsonPath": ".status.resources"}"#,
    printcolumn = r#"{"name": "Revision", "type": "integer", "jsonPath": ".status.revision"}"#,
    printcolumn = r#"{"name": "Stable", "type": "integer", "jsonPath": ".status.stableRevision"}"#,
    printcolumn = r#"{"name": "On Revisions", "type": "string", "jsonPath": ".status.onRevisions"}"#,
    printcolumn = r#"{"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.progress"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[schemars(transform = without_defaults)]
pub struct KindDefinitionSpec {
    /// The kind file's spec.
    #[serde(flatten)]
    pub kind: KindSpec,
    /// The kind folder's files: path (`base/…`, `patches/…`,
    /// `resources/…`) to text.
    #[schemars(extend("maxProperties" = MAX_FILES))]
    pub files: BTreeMap<String, String>,
    /// Which revision serves which resources: `stable` (an older one rolls
    /// back), `canary` labels that try the latest first, how many to `keep`,
    /// and `steps` that roll the latest out by themselves.
    /// Not part of the kind: changing it makes no revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
}

/// The most files a definition may carry.
pub const MAX_FILES: usize = 256;

/// Removes every `default` from a schema. The API server would write
/// the defaults serde knows into each stored definition; the operator
/// applies them itself when it reads one, and a definition stays what
/// its author wrote (so that `kind unpack` gives back `kind.yaml`'s own
/// text).
fn without_defaults(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut() {
        object.remove("default");
    }
    schemars::transform::transform_subschemas(&mut without_defaults, schema);
}

/// The CRD of `KindDefinition`, derived from [`KindDefinitionSpec`].
pub fn crd() -> CustomResourceDefinition {
    KindDefinition::crd()
}

/// A definition's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The latest revision: the last accepted change of the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    /// The revision serving every resource neither pinned nor in the canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<u32>,
    /// The revisions kept, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<RevisionStatus>,
    /// The revisions a resource may pin now (the label
    /// `kustomize-operator.io/revision`): the stable, the latest and those
    /// `spec.rollout.pinnable` names, none withdrawn. The admission guard
    /// reads it; the operator decides from the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = KEPT_MAX))]
    pub pinnable: Vec<u32>,
    /// How many resources each revision serves (`1:99 2:1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_revisions: Option<String>,
    /// Where the automatic rollout (`spec.rollout.steps`) is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The plan of the latest change of the files against every resource
    /// of the kind, summed up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// `Accepted`, `CRDEstablished`, `RightsGranted`, `Serving`,
    /// `StorageMigrated`, `RevisionsVerified`, `RolledOut`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The plan of a change of a definition's files, summed up (`kustomize-operator
/// plan` gives the same plan in full).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// The generation planned.
    pub generation: i64,
    /// Resources planned.
    pub resources: u64,
    /// Resources whose objects would change.
    pub would_change: u64,
    /// Resources the change would fail on.
    pub would_fail: u64,
    /// Resources whose stored fields a change of versions would lose.
    pub would_lose_fields: u64,
    /// The first failures: `namespace/name: Reason: message`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = PLAN_FAILURES_SHOWN))]
    pub failures: Vec<String>,
    /// Why no plan was made, when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many failures a definition's plan status names.
pub const PLAN_FAILURES_SHOWN: usize = 5;

/// Where a definition's automatic rollout is: a copy, for people and
/// tools, of what the operator keeps in the definition's annotation
/// `kustomize-operator.io/rollout` (never read back from here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The revision rolling out (the latest).
    pub revision: u32,
    /// The step under way, or the one it ended at (from 1; 0 before the first).
    pub step: u32,
    /// How many steps.
    pub steps: u32,
    /// Where it is.
    pub phase: RolloutPhase,
    /// Resources of the kind the rollout moves (all but the pinned), when
    /// counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<u64>,
    /// Of them, on `revision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<u64>,
    /// Of the step's, failing (`Ready=False`) or `Stalled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<u64>,
    /// One line: `step 2 of 4: 37 of 120 resources on revision 5, 0 failed`.
    pub progress: String,
}

/// Where an automatic rollout is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    /// Its first step has not started (paused before it).
    #[default]
    Waiting,
    /// A step is under way.
    Progressing,
    /// Held at its step by `spec.rollout.paused`.
    Paused,
    /// A gate failed: every resource is back on the stable revision.
    RolledBack,
    /// The latest revision is stable.
    Complete,
    /// `spec.rollout.stable` was set by hand: the rollout ended there.
    Stopped,
    /// It cannot start: the stable revision cannot serve, or the latest
    /// is withdrawn.
    Refused,
}

/// One kept revision of a definition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionStatus {
    /// Its number, from 1.
    pub revision: u32,
    /// The sha256 of its kind and files (hex, whole): a restarted
    /// operator serves a kept revision only if it is recorded here.
    pub digest: String,
    /// The definition's generation it was accepted at.
    pub generation: i64,
    /// How many resources it served at their last reconcile.
    #[serde(default)]
    pub resources: u64,
}

impl Status {
    /// Sets a condition (`Condition::set_in`, as for every status).
    pub fn set(
        &mut self,
        type_: ConditionType,
        ok: bool,
        reason: Reason,
        message: &str,
        generation: Option<i64>,
    ) {
        let status = ConditionStatus::from(ok);
        Condition::new(
            type_,
            status,
            reason,
            message,
            generation,
            jiff::Timestamp::now(),
        )
        .set_in(&mut self.conditions, super::conditions::MESSAGE_LIMIT);
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

    use serde_json::{Value, json};

    /// The schema of the definition's spec, as the CRD carries it.
    fn spec_schema() -> Value {
        let crd = serde_json::to_value(crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    /// Every `(path, node)` of a schema, depth first.
    fn nodes(at: &str, schema: &Value, out: &mut Vec<(String, Value)>) {
        out.push((at.to_string(), schema.clone()));
        for (name, child) in schema["properties"].as_object().into_iter().flatten() {
            nodes(&format!("{at}.{name}"), child, out);
        }
        if schema["items"].is_object() {
            nodes(&format!("{at}[]"), &schema["items"], out);
        }
        if schema["additionalProperties"].is_object() {
            nodes(&format!("{at}{{}}"), &schema["additionalProperties"], out);
        }
    }

    #[test]
    fn the_crd_is_cluster_scoped_with_a_status_and_columns() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("kinddefinitions.kustomize-operator.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["kinddef".into()]));
        assert_eq!(
            ApiResource::erase::<KindDefinition>(&()),
            api_resource(),
            "the derived names are the constants"
        );
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
                "Revision",
                "Stable",
                "On Revisions",
                "Rollout",
                "Age"
            ]
        );
    }

    #[test]
    fn the_spec_schema_is_the_kind_files_types_with_their_bounds() {
        let spec = spec_schema();
        let p = &spec["properties"];
        assert_eq!(
            spec["required"],
            json!(["files", "group", "names", "schema", "version"])
        );
        assert_eq!(p["version"]["pattern"], "^v[0-9]+((alpha|beta)[0-9]+)?$");
        assert_eq!(
            (
                p["group"]["minLength"].clone(),
                p["group"]["maxLength"].clone()
            ),
            (json!(1), json!(253))
        );
        let names = &p["names"]["properties"];
        assert_eq!(names["kind"]["pattern"], "^[A-Z][A-Za-z0-9]*$");
        for name in ["kind", "plural", "singular"] {
            assert_eq!(names[name]["maxLength"], 63, "{name}");
        }
        assert_eq!(names["plural"]["pattern"], "^[a-z][a-z0-9]*$");
        assert_eq!(names["shortNames"]["maxItems"], 16);
        assert_eq!(p["scope"]["enum"], json!(["Namespaced", "Cluster"]));
        assert_eq!(p["onDelete"]["enum"], json!(["Refuse", "Orphan"]));
        assert_eq!(p["files"]["maxProperties"], 256);
        assert_eq!(p["files"]["additionalProperties"]["type"], "string");
        assert_eq!(p["printerColumns"]["maxItems"], 32);
        assert_eq!(
            p["schema"],
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                   "description": "OpenAPI v3 schema of `.spec`."})
        );
        // The recipe is typed, no longer kept whole.
        for field in [
            "overlay",
            "status",
            "readiness",
            "reconcile",
            "printerColumns",
        ] {
            let node = if p[field]["type"] == "array" {
                &p[field]["items"]
            } else {
                &p[field]
            };
            assert!(
                node["x-kubernetes-preserve-unknown-fields"].is_null(),
                "{field}"
            );
            assert!(node["properties"].is_object(), "{field}");
        }
        assert_eq!(
            p["reconcile"]["properties"]["deletionPolicy"]["enum"],
            json!(["Delete", "Retain"])
        );
    }

    #[test]
    fn the_spec_schema_is_structural_and_defaults_nothing() {
        let mut all = Vec::new();
        nodes("spec", &spec_schema(), &mut all);
        assert!(all.len() > 50, "{} nodes", all.len());
        for (at, node) in all {
            let open = node["x-kubernetes-preserve-unknown-fields"] == true;
            assert!(node["type"].is_string(), "{at}: no type");
            assert!(
                node["properties"].is_null() || node["additionalProperties"].is_null(),
                "{at}: properties beside additionalProperties"
            );
            for key in ["default", "$ref", "anyOf", "oneOf", "allOf"] {
                assert!(node[key].is_null(), "{at}: {key}");
            }
            if node["type"] == "object" && !open {
                assert!(
                    node["properties"].is_object() || node["additionalProperties"].is_object(),
                    "{at}: an object of unknown shape"
                );
            }
        }
    }

    #[test]
    fn every_packed_kind_folder_is_a_kind_definition() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut folders = vec![
            repo.join("kustomize/sample"),
            repo.join("training/06-your-own-kind/greeting"),
        ];
        for entry in std::fs::read_dir(repo.join("tests/fixtures/kinds")).unwrap() {
            let path = entry.unwrap().path();
            if path.join(crate::kinds::declared::file::FILE_NAME).is_file() {
                folders.push(path);
            }
        }
        assert!(folders.len() >= 5, "{folders:?}");
        for folder in folders {
            let packed = crate::kinds::declared::pack::pack(&folder).unwrap();
            let value: Value = serde_saphyr::from_str(&packed).unwrap();
            let definition: KindDefinition = serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
            assert!(!definition.spec.files.is_empty(), "{}", folder.display());
            assert_eq!(
                definition.spec.kind.names.kind,
                value["spec"]["names"]["kind"]
            );
            assert_eq!(definition.spec.kind.group, value["spec"]["group"]);
        }
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
