//! The facade kinds are written against: what a kind provides to the
//! engine, and the types it uses to say what it wants, as data.
//!
//! A kind never spawns processes, writes files, builds command lines or
//! patches status: it returns a [`Plan`] (overlays and typed [`Step`]s,
//! typed status fields, events) and the engine carries it out the same way
//! for every kind, picking every failure reason itself.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::Controller;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::engine::kubectl::CommandRecord;
pub use crate::engine::model::identity::check_account_name;
pub use crate::engine::model::inventory::{
    Inventory, OWNER_ANNOTATION, OWNER_LABEL, ObjectId, Owner,
};
pub use crate::engine::model::overlay::{
    ConfigMapGenerator, GeneratorOptions, Labels, Overlay, PatchTemplate, ResourceTemplate, Target,
    kustomize_refuses,
};
pub use crate::engine::model::shard::SHARD_LABEL;
pub use crate::engine::model::status::{
    CommonStatus, Condition, ConditionStatus, ConditionType, Reason, truncate,
};
pub use crate::engine::model::templates::{
    Isolation, KustomizeDir, TemplateError, TemplateFlavor, TemplateSources, checked, plain_tera,
    render_limited,
};
pub use crate::text::{IN_EVENT, first_names};

#[cfg(test)]
pub(crate) use crate::engine::model::status::ConditionUpdate;

/// A custom resource type the engine can serve: a typed one (derived with
/// `kube::CustomResource`) or `kube::api::DynamicObject` for declared kinds.
pub trait Object:
    Resource<DynamicType: Clone + Eq + Hash + Debug + Send + Sync + Unpin + 'static>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: Resource<DynamicType: Clone + Eq + Hash + Debug + Send + Sync + Unpin + 'static>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// What the engine does when `kubectl apply` finds a field of one of the
/// resource's objects owned by another field manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// How the engine treats a kind's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Field conflicts on the resource's objects.
    pub conflicts: FieldConflicts,
    /// Namespaced objects in the resource's own namespace get an
    /// ownerReference to it (garbage collection as a safety net).
    pub owner_references: bool,
    /// `Ready` waits until the objects the resource owns are healthy
    /// (Deployments available, Jobs complete, ...), not only applied.
    pub health: bool,
    /// Every namespaced object the resource owns must be in its own
    /// namespace (kinds whose templates come from outside the operator's
    /// code: a template cannot reach another namespace).
    pub confined_to_namespace: bool,
    /// The kind makes things for the user of a namespaced resource: with
    /// a ServiceAccount named (here or by `--default-service-account`),
    /// its writes (apply, prune, delete) run as that account of the
    /// resource's namespace, so the tenant's own RBAC bounds them.
    pub tenant_writes: bool,
    /// The ServiceAccount the kind's writes run as, overriding
    /// `--default-service-account` (only with [`Policy::tenant_writes`]).
    pub service_account: Option<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            conflicts: FieldConflicts::Report,
            owner_references: false,
            health: true,
            confined_to_namespace: false,
            tenant_writes: false,
            service_account: None,
        }
    }
}

/// A kind's identity and engine policy.
#[derive(Debug, Clone)]
pub struct KindInfo<D> {
    /// Short name: the `--kinds` value and the `kustomize/<name>` folder.
    pub name: String,
    /// The finalizer the engine puts on each resource.
    pub finalizer: String,
    /// What kube needs to address the resource (`()` for typed kinds).
    pub dyn_type: D,
    /// How the engine treats the kind's objects.
    pub policy: Policy,
    /// The kind's own templates and base, for a kind defined while the
    /// operator runs (a `KindDefinition`); `None`: the kustomize
    /// directories the operator started with.
    pub templates: Option<Arc<KustomizeDir>>,
}

/// What happens to a resource's objects when the resource is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deletion {
    /// Delete every object in its inventory that still carries its marker.
    #[default]
    Delete,
    /// Leave them (they keep the marker).
    Retain,
}

/// Why a handler could not produce a plan.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// The resource's spec cannot be acted on; retrying will not help until
    /// it changes. Reported as `Ready=False`, reason `InvalidSpec`.
    #[error("{0}")]
    Invalid(String),
    /// The resource asks for more than a configured limit allows; reported
    /// as `TooLarge` and, like an invalid spec, waits for a change.
    #[error("{0}")]
    TooLarge(String),
    /// Something outside the resource failed (an API read, an HTTP fetch);
    /// retried with backoff.
    #[error("{message}")]
    Transient {
        /// The condition reason.
        reason: Reason,
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A transient error with the given reason.
    pub fn transient(reason: Reason, message: impl std::fmt::Display) -> Self {
        Self::Transient {
            reason,
            message: message.to_string(),
        }
    }

    /// The condition reason for this error.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Invalid(_) => Reason::InvalidSpec,
            Self::TooLarge(_) => Reason::TooLarge,
            Self::Transient { reason, .. } => *reason,
        }
    }

    /// True when retrying cannot help until the resource changes.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Invalid(_) | Self::TooLarge(_))
    }
}

impl From<kube::Error> for HandlerError {
    fn from(e: kube::Error) -> Self {
        Self::transient(Reason::ApiError, api_message(&e))
    }
}

/// What an API error says, in one line: the API server's own message for a
/// refused request (`deployments.apps "web" is forbidden: ...`), else the
/// client's error.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// One thing the engine does for a plan, in order; the first failure stops
/// the rest.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Apply objects the resource owns: the engine marks them, refuses any
    /// that exists without the marker (`OwnershipConflict`), applies them
    /// with server-side apply and records them in the inventory.
    Apply {
        /// What to apply.
        overlay: Overlay,
        /// The server-side apply field manager; `None`: the engine's.
        field_manager: Option<String>,
    },
    /// Change fields of objects the resource acts on but does not own
    /// (ChaosAgent): a server-side apply of partial objects with this field
    /// manager, taking the fields it sets; no marker, no inventory.
    Patch {
        /// Partial objects (whole objects only as far as they are set).
        overlay: Overlay,
        /// The field manager.
        field_manager: String,
    },
    /// Delete objects the resource acts on but does not own (ChaosAgent's
    /// Pod kills). Objects already gone count as deleted.
    DeleteForeign {
        /// What to delete.
        objects: Vec<ObjectId>,
    },
}

impl Step {
    /// An [`Step::Apply`] with the engine's field manager.
    pub fn apply(overlay: Overlay) -> Self {
        Self::Apply {
            overlay,
            field_manager: None,
        }
    }
}

/// Whether a Kubernetes event is normal or a warning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventType {
    /// Something happened as it should.
    #[default]
    Normal,
    /// Something needs attention.
    Warning,
}

/// A Kubernetes event the plan asks the engine to publish on the resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlannedEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Detail (trimmed to 1 KiB by the engine).
    pub note: String,
    /// The other object the event is about (the Event's `related`).
    pub related: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

/// Which kind-specific status fields a failed run writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum OnFailure<S> {
    /// The same as on success.
    #[default]
    Same,
    /// None: the fields of the last success stay.
    KeepPrevious,
    /// These.
    Write(S),
}

/// What a handler wants done for one resource, as data. `S` is the kind's
/// own status fields, written beside the engine's.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<S> {
    /// Steps, run in order; the first failure stops the rest.
    pub steps: Vec<Step>,
    /// Kind-specific status fields written after the run (`None`: unchanged).
    pub status: Option<S>,
    /// What a failed run writes instead.
    pub on_failure: OnFailure<S>,
    /// Events to publish after a successful run.
    pub events: Vec<PlannedEvent>,
    /// Reconcile again after this long (otherwise the resync interval).
    pub requeue_after: Option<Duration>,
    /// Run even when nothing changed since the last successful run.
    pub always_run: bool,
    /// Nothing is due yet (a periodic kind between two runs): no step, no
    /// status write, no event; reconcile again after `requeue_after`.
    pub idle: bool,
    /// What "nothing changed" compares and `appliedDigest` records, when the
    /// steps are not the whole desired state (e.g. only what differs from
    /// it); default: the digest of the rendered steps.
    pub digest: Option<String>,
    /// The objects the resource owns once the plan ran, when that is not
    /// exactly what its `Apply` steps produce (a plan applying only what
    /// differs); default: what they produce.
    pub inventory: Option<Vec<ObjectId>>,
    /// Objects the kind found that it owned and no longer wants, beyond
    /// what left its recorded inventory; pruned with it (each still only if
    /// it carries the resource's marker or the kind adopts it).
    pub stale: Vec<ObjectId>,
    /// Prune objects that left the inventory (default true).
    pub prune: bool,
}

impl<S> Default for Plan<S> {
    fn default() -> Self {
        Self {
            steps: Vec::new(),
            status: None,
            on_failure: OnFailure::Same,
            events: Vec::new(),
            requeue_after: None,
            always_run: false,
            idle: false,
            digest: None,
            inventory: None,
            stale: Vec::new(),
            prune: true,
        }
    }
}

impl<S> Plan<S> {
    /// A plan that applies one overlay the resource owns.
    pub fn apply(overlay: Overlay) -> Self {
        Self {
            steps: vec![Step::apply(overlay)],
            ..Default::default()
        }
    }

    /// A plan with nothing due before `wait`.
    pub fn idle(wait: Duration) -> Self {
        Self {
            idle: true,
            requeue_after: Some(wait),
            ..Default::default()
        }
    }
}

/// What a kind reads from the objects a resource owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FromObjects {
    /// Kind-specific status fields (a declared kind's status mappings),
    /// written over the plan's.
    pub status: Option<serde_json::Map<String, serde_json::Value>>,
    /// What `Ready` still waits for besides the engine's health rules, one
    /// line each (`deployment/web: .status.readyReplicas is 1, not at least 3`).
    pub not_ready: Vec<String>,
}

/// The dynamic type of a kind's resources (`()` for typed kinds).
pub type DynType<K> = <K as Resource>::DynamicType;

/// A kind's logic: resource in, plan out.
pub trait Handler: Send + Sync + 'static {
    /// The custom resource.
    type Resource: Object;
    /// What the plan depends on besides the resource (cluster reads, external data).
    type Observed: Send + Sync + 'static;
    /// The kind's own status fields, written beside the engine's.
    type Status: Serialize + Clone + Debug + PartialEq + Send + Sync + 'static;

    /// The kind's identity and engine policy.
    fn info(&self) -> &KindInfo<DynType<Self::Resource>>;

    /// The API for these resources: in `namespace` if given (namespaced
    /// kinds), else across the cluster.
    fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<Self::Resource>;

    /// A label selector narrowing which resources the controller watches
    /// when the operator runs for `namespace` (`--namespace`).
    fn watch_selector(&self, _namespace: Option<&str>) -> Option<String> {
        None
    }

    /// The engine's status fields of a resource.
    fn common_status(&self, resource: &Self::Resource) -> Option<CommonStatus>;

    /// The objects a resource's status lists as its own. (Kinds whose
    /// status is untyped may read just this field.)
    fn inventory(&self, resource: &Self::Resource) -> Option<Inventory> {
        self.common_status(resource)?.inventory
    }

    /// A resource's whole status as JSON, if it has one. (Kinds that keep
    /// their resources as JSON text may read just this field.)
    fn status(&self, resource: &Self::Resource) -> Option<serde_json::Value> {
        serde_json::to_value(resource)
            .ok()?
            .get_mut("status")
            .map(serde_json::Value::take)
    }

    /// Gathers what [`Handler::plan`] needs from the world.
    fn observe(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send;

    /// The same inputs for `diff` and `render KIND/NAME`, read from the
    /// cluster without side effects: no write, no external fetch, no timer
    /// (what `run` would plan if it looked now). Default: [`Handler::observe`],
    /// for kinds whose observation only reads the cluster.
    fn observe_preview(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send {
        self.observe(resource, client)
    }

    /// The same inputs without a cluster, for `render`: taken from the
    /// documents that follow the resource in the file.
    fn observe_offline(
        &self,
        resource: &Self::Resource,
        documents: &[serde_json::Value],
    ) -> Result<Self::Observed, HandlerError>;

    /// The plan for a resource that exists (created or changed). Pure.
    fn plan(
        &self,
        resource: &Self::Resource,
        observed: &Self::Observed,
    ) -> Result<Plan<Self::Status>, HandlerError>;

    /// What happens to the resource's objects when it is deleted.
    fn deletion(&self, _resource: &Self::Resource) -> Deletion {
        Deletion::Delete
    }

    /// True when an existing object without the resource's marker is the
    /// resource's all the same and may be taken over (for example one made
    /// by an earlier version of this operator). Default: never.
    fn adopts(&self, _resource: &Self::Resource, _live: &ObjectMeta) -> bool {
        false
    }

    /// What the kind reads from the live state of the objects the resource
    /// owns (each cut down to its metadata, `spec.replicas` and `status`),
    /// whenever the engine looks at their health. Default: nothing.
    fn read_objects(
        &self,
        _resource: &Self::Resource,
        _objects: &BTreeMap<ObjectId, serde_json::Value>,
    ) -> FromObjects {
        FromObjects::default()
    }

    /// Adds watches that should trigger a reconcile (default: none).
    fn configure(
        &self,
        controller: Controller<Self::Resource>,
        _client: &kube::Client,
        _namespace: Option<&str>,
    ) -> Controller<Self::Resource> {
        controller
    }
}

/// [`Handler::api`] for a typed namespaced kind.
pub fn namespaced_api<K>(client: kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    }
}
