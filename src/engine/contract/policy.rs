//! A kind's identity and how the engine treats its objects.

use std::sync::Arc;

use crate::engine::model::templates::KustomizeDir;

/// A kind's identity, and how the engine treats its objects.
#[derive(Debug, Clone)]
pub struct KindInfo<D> {
    /// Short name: the `--kinds` value and the `kustomize/<name>` folder.
    pub name: String,
    /// The finalizer the engine puts on each resource.
    pub finalizer: String,
    /// What kube needs to address the resource (`()` for typed kinds).
    pub dyn_type: D,
    /// The kind's own templates and base, for a kind defined while the
    /// operator runs (a `KindDefinition`); `None`: the kustomize
    /// directories the operator started with.
    pub templates: Option<Arc<KustomizeDir>>,
    /// On a field conflict (a field the resource's objects set is owned by
    /// another field manager), take the fields back (`--force-conflicts`)
    /// on objects the engine has just checked carry this resource's
    /// marker; objects being created are still applied without it, so one
    /// created meanwhile by someone else is never taken over. Otherwise
    /// stop and report `FieldConflict` with kubectl's message: another
    /// controller's (or a person's) change is never overwritten silently.
    pub takes_back: bool,
    /// Namespaced objects in the resource's own namespace get an
    /// ownerReference to it (garbage collection as a safety net).
    pub owner_references: bool,
    /// `Ready` waits until the objects the resource owns are healthy
    /// (Deployments available, Jobs complete, ...), not only applied.
    pub health: bool,
    /// The kind makes things for the user of a namespaced resource: with
    /// a ServiceAccount named (here or by `--default-service-account`),
    /// its writes (apply, prune, delete) run as that account of the
    /// resource's namespace, so the tenant's own RBAC bounds them.
    pub tenant_writes: bool,
    /// The ServiceAccount the kind's writes run as, overriding
    /// `--default-service-account` (only with [`KindInfo::tenant_writes`]).
    pub service_account: Option<String>,
}

impl<D> KindInfo<D> {
    /// The kind `name`, whose resources carry `finalizer`, as the engine
    /// treats a kind unless it says otherwise: the operator's kind folders,
    /// field conflicts reported, no ownerReferences, `Ready` waiting for
    /// health, writes as the operator.
    pub fn new(name: impl Into<String>, finalizer: impl Into<String>, dyn_type: D) -> Self {
        Self {
            name: name.into(),
            finalizer: finalizer.into(),
            dyn_type,
            templates: None,
            takes_back: false,
            owner_references: false,
            health: true,
            tenant_writes: false,
            service_account: None,
        }
    }
}
