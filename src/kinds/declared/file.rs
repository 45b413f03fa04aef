//! The kind file, `kustomize/<kind>/kind.yaml`: a kind declared as data.
//!
//! It reads like a CRD whose "controller" is a kustomize recipe:
//!
//! ```yaml
//! apiVersion: kustomize-operator.io/v1alpha1
//! kind: KindDefinition
//! metadata:
//!   name: greeting                 # the folder; --kinds greeting
//! spec:
//!   group: hello.nuvolaris.org
//!   version: v1
//!   names: {kind: Greeting, plural: greetings, shortNames: [greet]}
//!   scope: Namespaced              # or Cluster
//!   schema:                        # OpenAPI v3 schema of .spec
//!     type: object
//!     required: [message]
//!     properties:
//!       message: {type: string, maxLength: 200}
//!   printerColumns:
//!   - {name: Message, type: string, jsonPath: .spec.message}
//!   overlay:                       # how each resource's overlay is built
//!     labels:
//!     - pairs: {app.kubernetes.io/instance: "{{ metadata.name }}"}
//!     patches:
//!     - {template: deployment.yaml, target: {kind: Deployment, name: web}}
//!     resources:
//!     - {template: configmap.yaml}
//!     configMapGenerator:
//!     - name: "{{ metadata.name }}"
//!       literals: {message: "{{ spec.message }}"}
//!   status:                        # copied from the objects it applied
//!   - field: available
//!     type: integer
//!     from: {kind: Deployment, name: "{{ metadata.name }}"}
//!     path: .status.availableReplicas
//!   readiness:                     # Ready also waits for these
//!   - from: {kind: Deployment, name: "{{ metadata.name }}"}
//!     path: .status.readyReplicas
//!     atLeast: "{{ spec.replicas }}"
//!   reconcile: {deletionPolicy: Delete, fieldConflicts: Report, interval: 10m}
//! ```
//!
//! Unknown fields are errors; every error names the file and the field.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kind file's `apiVersion`.
pub const API_VERSION: &str = "kustomize-operator.io/v1alpha1";
/// The kind file's `kind`.
pub const KIND: &str = "KindDefinition";
/// The kind file's name in a kind folder.
pub const FILE_NAME: &str = "kind.yaml";
/// The most printer columns a kind may list.
pub const MAX_PRINTER_COLUMNS: usize = 32;
/// The most short names a kind may have.
pub const MAX_SHORT_NAMES: usize = 16;
/// A printer column's types.
pub const COLUMN_TYPES: [&str; 5] = ["string", "integer", "number", "boolean", "date"];
/// A status field's types (a list or an object only from an `expression`).
pub const STATUS_TYPES: [&str; 6] = ["string", "integer", "number", "boolean", "array", "object"];
/// The most older versions a kind may serve.
pub const MAX_OLDER_VERSIONS: usize = 8;
/// The most moves, defaults or lossy fields one conversion may list.
pub const MAX_CONVERSION_FIELDS: usize = 64;
/// A Kubernetes API version name.
const VERSION_PATTERN: &str = r"^v[0-9]+((alpha|beta)[0-9]+)?$";
/// A dotted path to a field of `spec`.
const FIELD_PATH_PATTERN: &str = r"^spec(\.[A-Za-z0-9_-]+)+$";
/// A DNS label (a short name).
const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";
/// An API group: a DNS subdomain with a dot.
const GROUP_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$";
/// A dotted path into an object's status (`.status.readyReplicas`).
const STATUS_PATH_PATTERN: &str = r"^\.status(\.[A-Za-z0-9_-]+)+$";

/// A kind file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindFile {
    /// `kustomize-operator.io/v1alpha1`.
    pub api_version: String,
    /// `KindDefinition`.
    pub kind: String,
    /// `name`: the kind's short name, the same as its folder.
    pub metadata: Metadata,
    /// The kind.
    pub spec: KindSpec,
}

/// The kind file's metadata.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The kind's short name (`--kinds` value, folder name).
    pub name: String,
}

/// Namespaced or cluster-scoped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, JsonSchema)]
pub enum Scope {
    /// Resources live in a namespace; so do the objects they make.
    #[default]
    Namespaced,
    /// Resources have no namespace.
    Cluster,
}

/// The kind: its API, schema and recipe.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindSpec {
    /// API group: a DNS subdomain with a dot (`apps.example.com`).
    #[schemars(length(min = 1, max = 253), pattern(GROUP_PATTERN))]
    pub group: String,
    /// The stored version, the one templates and expressions read.
    #[schemars(pattern(VERSION_PATTERN))]
    pub version: String,
    /// Versions older than `version`, still served: each with its schema
    /// and how its resources convert to and from `version`, which stores
    /// them and which templates and expressions read (the operator's
    /// conversion webhook answers for them; a kind definition only).
    #[serde(default)]
    #[schemars(length(max = MAX_OLDER_VERSIONS))]
    pub versions: Vec<OlderVersion>,
    /// Names, as in a CRD.
    pub names: Names,
    /// Namespaced (default) or Cluster.
    #[serde(default)]
    pub scope: Scope,
    /// OpenAPI v3 schema of `.spec`.
    #[schemars(schema_with = "any_object")]
    pub schema: Value,
    /// Printer columns (default: Ready, Message, Age).
    #[serde(default)]
    #[schemars(length(max = MAX_PRINTER_COLUMNS))]
    pub printer_columns: Option<Vec<PrinterColumn>>,
    /// How each resource's overlay is built.
    #[serde(default)]
    pub overlay: OverlaySpec,
    /// Names for the objects a resource applies, by which `expression`s
    /// (CEL) of `status` and `readiness` read them.
    #[serde(default)]
    pub children: BTreeMap<String, Child>,
    /// Objects a resource reads without owning them (a ConfigMap of
    /// settings, a Secret), by the name templates and expressions use:
    /// read with the rights of the identity its writes use, and a change
    /// to one reconciles the resources that read it.
    #[serde(default)]
    #[schemars(length(max = MAX_REFERENCES))]
    pub references: BTreeMap<String, Reference>,
    /// Status fields copied from the objects a resource applied, or
    /// computed over them (CEL).
    #[serde(default)]
    pub status: Vec<StatusField>,
    /// What `Ready` waits for besides the engine's health rules.
    #[serde(default)]
    pub readiness: Vec<ReadinessRule>,
    /// How the engine treats the kind's objects.
    #[serde(default)]
    pub reconcile: ReconcileSpec,
    /// What a namespaced kind's resources may make beyond their own
    /// namespace: cluster-scoped objects of a kind, or objects of a kind in
    /// other namespaces. Default: nothing (every object in the resource's
    /// namespace).
    #[serde(default)]
    pub reach: Vec<ReachRule>,
    /// What deleting a `KindDefinition` in the cluster does while
    /// resources of its kind exist: wait until they are gone (`Refuse`,
    /// the default), or leave them, their objects and the CRD in place
    /// (`Orphan`). A kind folder ignores it.
    #[serde(default)]
    pub on_delete: OnDelete,
}

/// A version older than the kind's `version`, still served.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OlderVersion {
    /// `v1`, `v1beta1`.
    #[schemars(pattern(VERSION_PATTERN))]
    pub name: String,
    /// OpenAPI v3 schema of `.spec` in this version.
    #[schemars(schema_with = "any_object")]
    pub schema: Value,
    /// How a resource of this version becomes one of the kind's `version`,
    /// and back.
    #[serde(default)]
    pub conversion: Conversion,
}

/// How a resource converts between an older version and the kind's
/// `version` (up), and back (down). Fields are dotted paths from the
/// resource: `spec.replicas`, `spec.database.name`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Conversion {
    /// Fields of the older version that are another field in `version`
    /// (renamed or moved, a whole object at once); converting down moves
    /// them back.
    #[serde(default)]
    #[schemars(length(max = MAX_CONVERSION_FIELDS))]
    pub moves: Vec<Move>,
    /// Values for fields of `version` the older version lacks, set when one
    /// of its resources converts up without them.
    #[serde(default)]
    #[schemars(schema_with = "defaults_schema")]
    pub defaults: BTreeMap<String, Value>,
    /// Fields (of either version) that one direction drops, accepted as
    /// lost: without it, a field with no place in the other version is
    /// refused when the kind is checked.
    #[serde(default)]
    #[schemars(length(max = MAX_CONVERSION_FIELDS))]
    pub lossy: Vec<String>,
    /// Fields of `version` computed when a resource of the older version
    /// converts up: dotted path to CEL over the older object (`self`).
    #[serde(default)]
    #[schemars(schema_with = "computed_schema")]
    pub up: BTreeMap<String, String>,
    /// Fields of the older version computed when a resource converts down:
    /// dotted path to CEL over the object of `version` (`self`).
    #[serde(default)]
    #[schemars(schema_with = "computed_schema")]
    pub down: BTreeMap<String, String>,
}

/// A field of the older version that is another field in `version`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Move {
    /// In the older version: `spec.message`.
    #[schemars(pattern(FIELD_PATH_PATTERN))]
    pub from: String,
    /// In `version`: `spec.greeting.text`.
    #[schemars(pattern(FIELD_PATH_PATTERN))]
    pub to: String,
}

/// What deleting a kind's definition does while resources of the kind exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, JsonSchema)]
pub enum OnDelete {
    /// The deletion waits until they are gone (and admission refuses it
    /// while the definition's status counts any).
    #[default]
    Refuse,
    /// The definition goes at once; the resources, their objects and the
    /// CRD stay, and the operator's finalizer is taken off each resource.
    Orphan,
}

/// A CRD's names.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Names {
    /// `Greeting`.
    #[schemars(pattern(r"^[A-Z][A-Za-z0-9]*$"), length(max = 63))]
    pub kind: String,
    /// `greetings`.
    #[schemars(pattern(r"^[a-z][a-z0-9]*$"), length(max = 63))]
    pub plural: String,
    /// `greeting` (default: the kind, lowercased).
    #[serde(default)]
    #[schemars(pattern(r"^[a-z][a-z0-9]*$"), length(max = 63))]
    pub singular: Option<String>,
    /// `[greet]`.
    #[serde(default)]
    #[schemars(length(max = MAX_SHORT_NAMES), inner(pattern(DNS_LABEL_PATTERN)))]
    pub short_names: Vec<String>,
}

/// An additional printer column, as in a CRD.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrinterColumn {
    /// Header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = COLUMN_TYPES))]
    pub type_: String,
    /// JSONPath into the resource, starting with `.`.
    #[schemars(pattern(r"^\."))]
    pub json_path: String,
    /// Shown only with `-o wide` when greater than 0.
    #[serde(default)]
    pub priority: Option<i32>,
    /// What the column means.
    #[serde(default)]
    pub description: Option<String>,
}

/// The overlay recipe, on top of the kind folder's `base/`. Strings marked
/// "templated" are Tera templates that
/// see the resource (`metadata.name`, `metadata.namespace`, `metadata.uid`,
/// `metadata.labels`, `spec`); their result is written as data, never
/// pasted into YAML.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OverlaySpec {
    /// kustomize `namePrefix` (templated).
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// kustomize `nameSuffix` (templated).
    #[serde(default)]
    pub name_suffix: Option<String>,
    /// kustomize `namespace` for a cluster-scoped kind (templated). A
    /// namespaced kind's objects always go to the resource's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// kustomize `labels` entries (values templated).
    #[serde(default)]
    pub labels: Vec<LabelsSpec>,
    /// Patches rendered from `patches/<template>`.
    #[serde(default)]
    pub patches: Vec<PatchSpec>,
    /// Whole objects rendered from `resources/<template>`.
    #[serde(default)]
    pub resources: Vec<ResourceSpec>,
    /// kustomize `configMapGenerator` entries (name and values templated).
    #[serde(default)]
    pub config_map_generator: Vec<GeneratorSpec>,
    /// kustomize `secretGenerator` entries (name and values templated).
    #[serde(default)]
    pub secret_generator: Vec<GeneratorSpec>,
}

/// A kustomize `labels` entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelsSpec {
    /// Label keys and (templated) values.
    pub pairs: BTreeMap<String, String>,
    /// Add them to selectors too.
    #[serde(default)]
    pub include_selectors: bool,
    /// Add them to Pod templates too.
    #[serde(default)]
    pub include_templates: bool,
}

/// A patch template and what it applies to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchSpec {
    /// File in `patches/`.
    pub template: String,
    /// kustomize target (`kind`, `name`, `group`, `version`).
    #[serde(default)]
    pub target: Option<TargetSpec>,
}

/// A kustomize patch target.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// API group.
    #[serde(default)]
    pub group: Option<String>,
    /// API version.
    #[serde(default)]
    pub version: Option<String>,
    /// Kind.
    #[serde(default)]
    pub kind: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
}

/// A whole object rendered from a template.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    /// File in `resources/`.
    pub template: String,
}

/// A kustomize generator (ConfigMap or Secret).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GeneratorSpec {
    /// Name (templated); kustomize appends a content hash unless
    /// `disableNameSuffixHash`.
    pub name: String,
    /// Keys and (templated) values, written as files.
    #[serde(default)]
    pub literals: BTreeMap<String, String>,
    /// Keep the name as it is.
    #[serde(default)]
    pub disable_name_suffix_hash: bool,
}

/// One of the objects a resource applies, or all of one kind, named for
/// the CEL `expression`s of the kind file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Child {
    /// apiVersion (default: any).
    #[serde(default)]
    pub api_version: Option<String>,
    /// Kind.
    pub kind: String,
    /// Name (templated). Without one, the child is every object of the
    /// kind the resource applied: a list.
    #[serde(default)]
    pub name: Option<String>,
    /// CEL over the object as `self` (and the resource's `spec` and
    /// `metadata`): `Ready` waits until it is true (for a list, for each).
    #[serde(default)]
    pub ready_when: Option<String>,
}

/// A status field: copied from an object the resource applied (`from` and
/// `path`), or computed by a CEL `expression` over the resource and its
/// `children`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusField {
    /// The field of the resource's status (`available`): lowerCamelCase.
    #[schemars(pattern(r"^[a-z][A-Za-z0-9]*$"))]
    pub field: String,
    /// Its OpenAPI type: `integer`, `number`, `string`, `boolean`, or
    /// (from an expression) `array` or `object`.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = STATUS_TYPES))]
    pub type_: String,
    /// Which applied object (kind and templated name; apiVersion optional).
    #[serde(default)]
    pub from: Option<ObjectSelector>,
    /// Where in it: a dotted path (`.status.availableReplicas`).
    #[serde(default)]
    #[schemars(pattern(STATUS_PATH_PATTERN))]
    pub path: Option<String>,
    /// CEL, instead of `from` and `path`: `web.status.availableReplicas`,
    /// `workers.filter(w, w.status.readyReplicas > 0).size()`.
    #[serde(default)]
    pub expression: Option<String>,
}

/// What `Ready` waits for besides the engine's health rules: a value on an
/// object the resource applied (`from`, `path` and exactly one of `equals`
/// and `atLeast`), or a CEL `expression` that must be true. The resource
/// stalls if it does not hold within the health timeout.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadinessRule {
    /// Which applied object (kind and templated name; apiVersion optional).
    #[serde(default)]
    pub from: Option<ObjectSelector>,
    /// A dotted path into its status (`.status.readyReplicas`).
    #[serde(default)]
    #[schemars(pattern(STATUS_PATH_PATTERN))]
    pub path: Option<String>,
    /// The value must equal this (templated; compared as text).
    #[serde(default)]
    pub equals: Option<String>,
    /// The value must be a number at least this (templated); an unset
    /// field reads as 0 (Kubernetes leaves zero counts out of a status).
    #[serde(default)]
    pub at_least: Option<String>,
    /// CEL that must be true, instead of the above:
    /// `web.status.availableReplicas >= spec.replicas`.
    #[serde(default)]
    pub expression: Option<String>,
}

/// One of the objects a resource applied.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectSelector {
    /// apiVersion (default: any).
    #[serde(default)]
    pub api_version: Option<String>,
    /// Kind.
    pub kind: String,
    /// Name (templated).
    pub name: String,
}

/// The most references a kind file may declare.
pub const MAX_REFERENCES: usize = 16;

/// An object, or the objects of a label selector, a resource reads without
/// owning: in the resource's namespace (a cluster-scoped kind names one).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reference {
    /// apiVersion (`v1`).
    pub api_version: String,
    /// Kind of a namespaced object (`ConfigMap`, `Secret`).
    pub kind: String,
    /// Name (templated): the object, or, without one, `selector` picks a list.
    #[serde(default)]
    pub name: Option<String>,
    /// Labels (values templated) the objects read as a list carry.
    #[serde(default)]
    pub selector: Option<BTreeMap<String, String>>,
    /// Namespace (templated): a cluster-scoped kind's resources have none
    /// of their own. A namespaced kind reads in the resource's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The resource waits (`Ready=False`, `ReferenceNotFound`) while the
    /// named object does not exist; `true`: it reads as `null` instead.
    #[serde(default)]
    pub optional: bool,
}

/// Objects of one kind a namespaced kind's resources may make outside
/// their own namespace.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReachRule {
    /// apiVersion (`v1`, `rbac.authorization.k8s.io/v1`): its group is
    /// what counts.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Absent: the kind is cluster-scoped (Namespace, ClusterRole). Else
    /// the namespaces its objects may be in: a name, `prefix-*`, or `*`.
    #[serde(default)]
    #[schemars(length(min = 1, max = 32), inner(pattern(NAMESPACE_PATTERN)))]
    pub namespaces: Option<Vec<String>>,
}

/// A namespace name, a prefix ending in `*`, or `*`.
const NAMESPACE_PATTERN: &str =
    r"^(\*|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?|[a-z0-9][-a-z0-9]{0,61}\*)$";

/// What the engine does when `kubectl apply` finds a field of one of the
/// resource's objects owned by another field manager (a kind file's
/// `reconcile.fieldConflicts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
pub enum FieldConflicts {
    /// Stop and report `FieldConflict` with kubectl's message: another
    /// controller's (or a person's) change is never overwritten silently.
    #[default]
    Report,
    /// Take the fields back (`--force-conflicts`) on objects the engine has
    /// just checked carry this resource's marker; objects being created are
    /// still applied without it, so one created meanwhile by someone else
    /// is never taken over.
    TakeBack,
}

/// What happens to a resource's objects when the resource is deleted (a
/// kind file's `reconcile.deletionPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
pub enum Deletion {
    /// Delete every object in its inventory that still carries its marker.
    #[default]
    Delete,
    /// Leave them (they keep the marker).
    Retain,
}

/// How the engine treats the kind's objects.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconcileSpec {
    /// What a deleted resource's objects become.
    #[serde(default)]
    pub deletion_policy: Deletion,
    /// Field conflicts on the resource's objects.
    #[serde(default)]
    pub field_conflicts: FieldConflicts,
    /// Namespaced objects get an ownerReference to the resource.
    #[serde(default = "yes")]
    pub owner_references: bool,
    /// Existing objects carrying all these labels (values templated) are the
    /// resource's own (objects made before it was declared). Default: none.
    #[serde(default)]
    pub adopt: BTreeMap<String, String>,
    /// Apply every resource again this often even when nothing changed
    /// (`30s`, `10m`; default: the operator's `--resync-interval`).
    #[serde(default)]
    pub interval: Option<String>,
    /// The ServiceAccount (of each resource's namespace) whose rights the
    /// kind's writes use, overriding the operator's
    /// `--default-service-account` (namespaced kinds only).
    #[serde(default)]
    pub service_account_name: Option<String>,
}

impl Default for ReconcileSpec {
    fn default() -> Self {
        Self {
            deletion_policy: Deletion::Delete,
            field_conflicts: FieldConflicts::Report,
            owner_references: true,
            adopt: BTreeMap::new(),
            interval: None,
            service_account_name: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// The schema of a field that holds any object: an OpenAPI schema, kept
/// whole by the API server (`x-kubernetes-preserve-unknown-fields`).
/// `conversion.defaults`: field paths to values of any shape.
fn defaults_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": MAX_CONVERSION_FIELDS,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn computed_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": MAX_CONVERSION_FIELDS,
        "additionalProperties": {"type": "string"},
    })
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
