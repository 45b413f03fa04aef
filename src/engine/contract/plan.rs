//! What a handler wants done for one resource, as data.

use std::time::Duration;

use crate::engine::model::inventory::ObjectId;
use crate::engine::model::overlay::Overlay;

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

impl PlannedEvent {
    /// A Normal event: something happened as it should.
    pub fn normal(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason,
            note: note.into(),
            related: None,
        }
    }

    /// A Warning: something needs attention.
    pub fn warning(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            ..Self::normal(reason, note)
        }
    }

    /// This event, about `related` too (the Event's `related`).
    pub fn related_to(self, related: k8s_openapi::api::core::v1::ObjectReference) -> Self {
        Self {
            related: Some(related),
            ..self
        }
    }

    /// True for a Warning.
    pub fn is_warning(&self) -> bool {
        self.type_ == EventType::Warning
    }
}

/// What a handler wants done for one resource, as data. `S` is the kind's
/// own status fields, written beside the engine's.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan<S> {
    /// Steps, run in order; the first failure stops the rest.
    pub steps: Vec<Step>,
    /// Kind-specific status fields written after the run (`None`: unchanged).
    pub status: Option<S>,
    /// Kind-specific status fields a failed run writes instead (`None`:
    /// those of the last success stay).
    pub failure_status: Option<S>,
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
            failure_status: None,
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
    /// What could not be read within the kind's budget (its CEL over
    /// what it may cost, or past its deadline), one line each naming the
    /// kind file's field: the resource is `Stalled`, reason `OverBudget`.
    pub over_budget: Vec<String>,
}
