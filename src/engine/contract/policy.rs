//! A kind's identity and how the engine treats its objects.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::engine::model::templates::KustomizeDir;

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
    /// Where the resource's objects may be: anywhere (kinds whose code is
    /// the operator's), or its own namespace and what the kind declares
    /// (kinds whose templates come from outside the operator's code).
    pub reach: Reach,
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
            reach: Reach::Anywhere,
            tenant_writes: false,
            service_account: None,
        }
    }
}

/// Where a resource's objects may be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reach {
    /// Anywhere its writer may write.
    #[default]
    Anywhere,
    /// In the resource's own namespace, and beyond it only where one of
    /// these says (a kind file's `reach`).
    Confined(Vec<Beyond>),
}

/// Objects of one kind a confined resource may have outside its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beyond {
    /// API group (`""` for the core group).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// `None`: cluster-scoped objects of the kind. Else the namespaces
    /// they may be in: a name, `prefix-*`, or `*` for any.
    pub namespaces: Option<Vec<String>>,
}

impl Reach {
    /// True when an object of `api_version`/`kind` in `namespace` (`None`:
    /// cluster-scoped) may be one of the objects of a resource in `home`.
    pub fn allows(
        &self,
        home: Option<&str>,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> bool {
        let Self::Confined(beyond) = self else {
            return true;
        };
        if namespace.is_some() && namespace == home {
            return true;
        }
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        beyond
            .iter()
            .filter(|b| b.group == group && b.kind == kind)
            .any(|b| match (&b.namespaces, namespace) {
                (None, None) => true,
                (Some(patterns), Some(ns)) => patterns.iter().any(|p| matches(p, ns)),
                _ => false,
            })
    }
}

/// A namespace pattern: a name, `prefix-*`, or `*`.
fn matches(pattern: &str, namespace: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => namespace.starts_with(prefix),
        None => pattern == namespace,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn confined() -> Reach {
        Reach::Confined(vec![
            Beyond {
                group: String::new(),
                kind: "Namespace".into(),
                namespaces: None,
            },
            Beyond {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespaces: Some(vec!["tenant-*".into(), "shared".into()]),
            },
        ])
    }

    #[test]
    fn a_confined_resource_reaches_only_what_its_kind_declares() {
        let reach = confined();
        let home = Some("team");
        assert!(reach.allows(home, "apps/v1", "Deployment", Some("team")));
        assert!(!reach.allows(home, "apps/v1", "Deployment", Some("other")));
        assert!(reach.allows(home, "v1", "Namespace", None));
        assert!(!reach.allows(home, "rbac.authorization.k8s.io/v1", "ClusterRole", None));
        assert!(reach.allows(home, "v1", "ConfigMap", Some("tenant-a")));
        assert!(reach.allows(home, "v1", "ConfigMap", Some("shared")));
        assert!(!reach.allows(home, "v1", "ConfigMap", Some("kube-system")));
        assert!(!reach.allows(home, "v1", "ConfigMap", None));
        // Same kind name, another group: not the declared one.
        assert!(!reach.allows(home, "example.com/v1", "Namespace", None));
    }

    #[test]
    fn an_unconfined_resource_reaches_anywhere() {
        assert!(Reach::Anywhere.allows(Some("team"), "v1", "ConfigMap", Some("kube-system")));
        assert!(Reach::Confined(vec![]).allows(Some("team"), "v1", "ConfigMap", Some("team")));
        assert!(!Reach::Confined(vec![]).allows(Some("team"), "v1", "Namespace", None));
    }
}
