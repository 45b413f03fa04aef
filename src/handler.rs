//! What a kind provides to the engine: its resource type and a handler that
//! turns a resource into a [`Plan`] (overlays and kubectl steps, as data).
//!
//! A handler never spawns processes, writes files or patches status: the
//! engine in [`crate::controller`] does that, the same way for every kind.

use std::future::Future;
use std::time::Duration;

use kube::runtime::Controller;
use kube::runtime::events::EventType;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::overlay::{Overlay, OverlayError, RenderedOverlay};
use crate::status::CommonStatus;
use crate::templates::KustomizeDir;

/// A custom resource type the engine can reconcile.
pub trait Kind:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Short name: the `--kinds` value and the `kustomize/<name>` folder.
    const NAME: &'static str;
    /// The finalizer the engine puts on each resource.
    const FINALIZER: &'static str;
    /// The shared part of the resource's status, if it has one yet.
    fn common_status(&self) -> Option<&CommonStatus>;
    /// The API for these resources: in `namespace` if given (namespaced
    /// kinds), else across the cluster.
    fn api(client: kube::Client, namespace: Option<&str>) -> kube::Api<Self>;
    /// A label selector narrowing which resources the controller watches
    /// when the operator runs for `namespace` (`--namespace`); `None` (the
    /// default) watches every resource [`Kind::api`] lists. Cluster-scoped
    /// kinds use it to pick the resources meant for that namespace.
    fn watch_selector(_namespace: Option<&str>) -> Option<String> {
        None
    }
}

/// [`Kind::api`] for a namespaced kind.
pub fn namespaced_api<K>(client: kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    }
}

/// Why a handler could not produce a plan.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// The resource's spec cannot be acted on; retrying will not help until
    /// it changes. Reported as `Ready=False` with reason `InvalidSpec`.
    #[error("{0}")]
    Invalid(String),
    /// Something outside the resource failed (an API read, an HTTP fetch);
    /// retried with backoff. `reason` becomes the condition reason.
    #[error("{message}")]
    Transient {
        /// CamelCase condition reason, e.g. `FetchFailed`.
        reason: String,
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A transient error with the given reason.
    pub fn transient(reason: &str, message: impl std::fmt::Display) -> Self {
        Self::Transient {
            reason: reason.to_string(),
            message: message.to_string(),
        }
    }

    /// The condition reason for this error.
    pub fn reason(&self) -> &str {
        match self {
            Self::Invalid(_) => "InvalidSpec",
            Self::Transient { reason, .. } => reason,
        }
    }
}

impl From<kube::Error> for HandlerError {
    fn from(e: kube::Error) -> Self {
        Self::transient("ApiError", e)
    }
}

/// One kubectl invocation the engine performs for a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `kubectl apply -k <dir> <extra_args>`.
    Apply {
        /// What to apply.
        overlay: Overlay,
        /// Additional flags (e.g. `--prune -l ...`), never user-supplied values as flags.
        extra_args: Vec<String>,
    },
    /// `kubectl delete -k <dir> --ignore-not-found=true`.
    Delete {
        /// What to delete.
        overlay: Overlay,
    },
    /// `kubectl <args>` (for work that is not an overlay, e.g. deleting a Pod).
    Run {
        /// The arguments after `kubectl`.
        args: Vec<String>,
    },
}

/// A Kubernetes event the plan asks the engine to publish on the resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlannedEvent {
    /// Normal or Warning.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Detail (trimmed to 1 KiB by the engine).
    pub note: String,
    /// The other object the event is about (the Event's `related`), e.g.
    /// the Pod a chaos agent killed. Events about different related objects
    /// are never folded into one event series.
    pub related: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

/// What a handler wants done for one resource, as data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// kubectl steps, run in order; the first failure stops the rest.
    pub steps: Vec<Step>,
    /// Kind-specific status fields, merged into `.status` after the run.
    pub status: serde_json::Map<String, serde_json::Value>,
    /// Kind-specific status fields merged instead of `status` when a step
    /// fails (default: `status` either way).
    pub status_on_failure: Option<serde_json::Map<String, serde_json::Value>>,
    /// Events to publish after the run.
    pub events: Vec<PlannedEvent>,
    /// Reconcile again after this long (otherwise the resync interval).
    pub requeue_after: Option<Duration>,
    /// Run even when nothing changed since the last successful run.
    pub always_run: bool,
    /// For a plan that is exactly one [`Step::Apply`] without extra flags: the
    /// objects it applies, as kubectl prints them (`deployment.apps/web`).
    /// When given, the engine may apply the overlay together with others in
    /// one kubectl run and attribute kubectl's output lines by these names.
    pub batch_names: Vec<String>,
    /// Nothing is due yet (a periodic kind between two runs): the engine
    /// runs no step, patches no status and publishes no event; it only
    /// reconciles again after `requeue_after`.
    pub idle: bool,
    /// What "nothing changed" compares and `appliedDigest` records, when the
    /// steps are not the whole desired state (e.g. only what differs from
    /// it); default: the digest of the rendered steps.
    pub digest: Option<String>,
}

impl Plan {
    /// A plan that applies one overlay.
    pub fn apply(overlay: Overlay) -> Self {
        Self {
            steps: vec![Step::Apply {
                overlay,
                extra_args: Vec::new(),
            }],
            ..Default::default()
        }
    }

    /// A plan that deletes what one overlay describes.
    pub fn delete(overlay: Overlay) -> Self {
        Self {
            steps: vec![Step::Delete { overlay }],
            ..Default::default()
        }
    }
}

/// A plan with every overlay rendered, and a digest over all of it.
#[derive(Debug, Clone)]
pub struct RenderedPlan {
    /// The rendered overlay of each step (`None` for [`Step::Run`]).
    pub overlays: Vec<Option<RenderedOverlay>>,
    /// sha256 over every step.
    pub digest: String,
}

impl Plan {
    /// Renders every overlay in memory and computes the plan's digest.
    pub fn render(&self, dir: &KustomizeDir) -> Result<RenderedPlan, OverlayError> {
        let mut hasher = Sha256::new();
        let mut overlays = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let (verb, overlay, args) = match step {
                Step::Apply {
                    overlay,
                    extra_args,
                } => ("apply", Some(overlay), extra_args.as_slice()),
                Step::Delete { overlay } => ("delete", Some(overlay), &[][..]),
                Step::Run { args } => ("run", None, args.as_slice()),
            };
            hasher.update(verb.as_bytes());
            for a in args {
                hasher.update((a.len() as u64).to_le_bytes());
                hasher.update(a.as_bytes());
            }
            let rendered = overlay.map(|o| o.render(dir)).transpose()?;
            if let Some(r) = &rendered {
                hasher.update(r.digest().as_bytes());
            }
            overlays.push(rendered);
        }
        Ok(RenderedPlan {
            overlays,
            digest: format!("sha256:{}", hex::encode(hasher.finalize())),
        })
    }
}

/// A kind's logic: resource in, plan out.
pub trait Handler: Send + Sync + 'static {
    /// The custom resource.
    type Resource: Kind;
    /// What the plan depends on besides the resource (cluster reads, external data).
    type Observed: Send + Sync + 'static;

    /// Gathers what [`Handler::plan`] needs from the world.
    fn observe(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send;

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
    ) -> Result<Plan, HandlerError>;

    /// The plan for a resource being deleted; the finalizer is removed only
    /// after every step succeeded.
    fn cleanup(&self, resource: &Self::Resource) -> Result<Plan, HandlerError>;

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

/// Converts a planned event's type for kube-runtime.
pub(crate) fn event_type(warning: bool) -> EventType {
    if warning {
        EventType::Warning
    } else {
        EventType::Normal
    }
}
