//! The one offline path: what a reconcile of a resource would apply and
//! prune, computed as a reconcile computes it (the same owner, marking,
//! overlays and prune candidates), with nothing written. `render`, `diff`
//! and a kind's example render use it.
//!
//! A successful run deletes the objects that left the resource: those in
//! its recorded inventory, or that its kind no longer wants, that the run
//! did not produce again, each only if it still carries the resource's
//! marker. Rendering knows the candidates; for `diff`, a resource read from
//! the cluster has them looked at there too ([`Pruning::look`]); which of
//! them go depends on what the overlays build, which `diff` learns.

use std::collections::BTreeSet;
use std::path::Path;

use kube::Client;
use kube::api::ObjectMeta;

use super::apply_path::{Rendered, prune_candidates, render};
use super::context::{marking, owner_with_uid};
use crate::engine::contract::{Handler, HandlerError, Step};
use crate::engine::live::ownership::{self, Discovery, Inspected, Verdict};
use crate::engine::model::inventory::{ObjectId, Owner};
use crate::engine::model::overlay::RenderedOverlay;
use crate::engine::model::status::Reason;
use crate::engine::model::templates::KustomizeDir;
use crate::engine::run::build::Builds;
use crate::kubectl::Kubectl;

/// What a reconcile of a resource would do.
#[derive(Debug)]
pub struct Preview {
    /// The steps.
    pub steps: Vec<Step>,
    /// Each step's overlay, rendered (`None` for steps without one).
    pub overlays: Vec<Option<RenderedOverlay>>,
    /// The kind's own status fields the plan writes, as JSON.
    pub status: Option<serde_json::Value>,
    /// The engine takes back fields other managers changed on the
    /// resource's existing objects ([`KindInfo::takes_back`](crate::engine::contract::KindInfo::takes_back)).
    pub takes_back: bool,
    /// What a run would prune from.
    pub(crate) pruning: Pruning,
}

impl Preview {
    /// The UID the marker of a resource that has none carries (a file
    /// written by hand rather than read from the cluster).
    pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

    /// What a reconcile of `resource`, with `observed`, would apply and
    /// prune; or why not, as its reconcile would say it: the handler's
    /// refusal, or an overlay that does not render (`RenderFailed`).
    pub(crate) fn of<H: Handler>(
        handler: &H,
        resource: &H::Resource,
        observed: &H::Observed,
        dir: &KustomizeDir,
    ) -> Result<Self, HandlerError> {
        use kube::ResourceExt;
        let plan = handler.plan(resource, observed)?;
        let uid = resource
            .uid()
            .unwrap_or_else(|| Self::PLACEHOLDER_UID.to_string());
        let marking = marking(handler, owner_with_uid(handler, resource, uid));
        let Rendered { overlays, .. } = render(&plan, dir, &marking)
            .map_err(|e| HandlerError::transient(Reason::RenderFailed, e))?;
        let inventory = handler.common_status(resource).and_then(|s| s.inventory);
        let pruning = Pruning {
            prunes: plan.prune,
            owner: Some(marking.owner),
            declared: plan.inventory.map(|d| d.into_iter().collect()),
            candidates: prune_candidates(inventory.as_ref(), &plan.stale),
            looked: None,
        };
        Ok(Preview {
            pruning,
            status: plan
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok()),
            steps: plan.steps,
            overlays,
            takes_back: handler.info().takes_back,
        })
    }

    /// The objects its `Apply` steps build, each overlay on its own (in
    /// memory when the engine builds it itself, else one `kubectl
    /// kustomize` run in `work_dir`); or why one did not build.
    pub(crate) async fn applied_objects(
        &self,
        kubectl: &Kubectl,
        work_dir: &Path,
    ) -> Result<BTreeSet<ObjectId>, String> {
        let mut built = BTreeSet::new();
        for (step, overlay) in self.steps.iter().zip(&self.overlays) {
            if let (Step::Apply { .. }, Some(overlay)) = (step, overlay) {
                let manifests = Builds::build_one(kubectl, work_dir, overlay)
                    .await
                    .map_err(|f| f.to_string())?;
                built.extend(manifests.iter().filter_map(ObjectId::of_manifest));
            }
        }
        Ok(built)
    }

    /// What the base of the kind folder `kind` of `dir` builds to, as a
    /// reconcile would build it, offline (`rbac` reads from it the types
    /// of object the kind applies); or why it does not build.
    pub(crate) async fn base(
        kubectl: &Kubectl,
        work_dir: &Path,
        dir: &KustomizeDir,
        kind: &str,
    ) -> Result<Vec<serde_json::Value>, String> {
        (Builds::build_base(kubectl, work_dir, dir, kind).await).map_err(|f| f.to_string())
    }
}

/// What a run prunes from.
#[derive(Debug, Default)]
pub(crate) struct Pruning {
    /// The plan prunes at all.
    pub prunes: bool,
    /// The resource, whose marker the candidates must carry.
    pub owner: Option<Owner>,
    /// What the resource owns after the run, when its plan says so;
    /// `None`: what its `Apply` steps build.
    pub declared: Option<BTreeSet<ObjectId>>,
    /// What may leave it: its recorded inventory and what its kind no
    /// longer wants.
    pub candidates: BTreeSet<ObjectId>,
    /// The candidates as the cluster has them (for a resource read from
    /// the cluster), or why they could not be read.
    pub looked: Option<Result<Vec<Inspected>, String>>,
}

/// What a run would do with a candidate it no longer produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Delete it.
    Prune(ObjectId),
    /// Leave it: it no longer carries the marker (who owns it, in words).
    Leave(ObjectId, String),
}

impl Fate {
    /// True when the run deletes the object.
    pub fn prunes(&self) -> bool {
        matches!(self, Self::Prune(_))
    }
}

impl std::fmt::Display for Fate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Prune(id) => write!(f, "# would prune {id} (no longer rendered)"),
            Self::Leave(id, who) => write!(
                f,
                "# would leave {id} (no longer rendered, but no longer carries the marker: {who})"
            ),
        }
    }
}

impl Pruning {
    /// Looks at the candidates in the cluster, with `adopts` saying which
    /// unmarked objects the kind takes as its own.
    pub async fn look(&mut self, client: &Client, adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync)) {
        let Some(owner) = self.owner.as_ref().filter(|_| self.prunes) else {
            return;
        };
        let discovery = Discovery::default();
        let ids = self.candidates.iter().cloned();
        let looked = ownership::inspect(client, &discovery, owner, ids, adopts).await;
        self.looked = Some(looked.map_err(|e| e.to_string()));
    }

    /// True when a run could prune something: a candidate exists.
    pub fn has_live_candidates(&self) -> bool {
        match &self.looked {
            Some(Ok(looked)) => looked.iter().any(|i| i.verdict != Verdict::Absent),
            _ => false,
        }
    }

    /// What a run that leaves the resource owning `built` (what its
    /// `Apply` steps build) does with each live candidate.
    pub fn fates(&self, built: &BTreeSet<ObjectId>) -> Vec<Fate> {
        let after = self.declared.as_ref().unwrap_or(built);
        let Some(Ok(looked)) = self.looked.as_ref().filter(|_| self.prunes) else {
            return Vec::new();
        };
        looked
            .iter()
            .filter(|i| !built_again(i, after))
            .filter_map(|i| match &i.verdict {
                Verdict::Absent => None,
                Verdict::Ours => Some(Fate::Prune(i.id.clone())),
                Verdict::Adopted => Some(Fate::Leave(
                    i.id.clone(),
                    "not marked: only an apply adopts an object".into(),
                )),
                Verdict::Foreign(who) => Some(Fate::Leave(i.id.clone(), who.clone())),
            })
            .collect()
    }
}

/// True when `after` holds `looked`'s object. A cluster-scoped object
/// matches whatever namespace a build gave it (kustomize may set one on a
/// kind it does not know to be cluster-scoped; the API server ignores it).
fn built_again(looked: &Inspected, after: &BTreeSet<ObjectId>) -> bool {
    let id = &looked.id;
    after.contains(id)
        || !looked.served.namespaced
            && after
                .iter()
                .any(|a| a.api_version == id.api_version && a.kind == id.kind && a.name == id.name)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::api::ApiResource;

    use super::*;
    use crate::engine::live::ownership::ApiKind;

    fn id(name: &str) -> ObjectId {
        ObjectId {
            api_version: "v1".into(),
            kind: "Service".into(),
            namespace: Some("shop".into()),
            name: name.into(),
        }
    }

    fn looked(name: &str, verdict: Verdict) -> Inspected {
        Inspected {
            id: id(name),
            served: Arc::new(ApiKind {
                resource: ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
                namespaced: true,
            }),
            verdict,
            uid: None,
        }
    }

    fn pruning(prunes: bool) -> Pruning {
        Pruning {
            prunes,
            looked: Some(Ok(vec![
                looked("kept", Verdict::Ours),
                looked("gone", Verdict::Ours),
                looked("adopted", Verdict::Adopted),
                looked("taken", Verdict::Foreign("someone".into())),
                looked("deleted", Verdict::Absent),
            ])),
            ..Pruning::default()
        }
    }

    #[test]
    fn what_is_built_again_stays_and_only_marked_objects_are_pruned() {
        let built = BTreeSet::from([id("kept")]);
        assert_eq!(
            pruning(true).fates(&built),
            [
                Fate::Prune(id("gone")),
                Fate::Leave(
                    id("adopted"),
                    "not marked: only an apply adopts an object".into()
                ),
                Fate::Leave(id("taken"), "someone".into()),
            ]
        );
        assert!(pruning(true).has_live_candidates());
    }

    #[test]
    fn a_declared_inventory_is_what_stays() {
        let mut p = pruning(true);
        p.declared = Some(BTreeSet::from([id("gone"), id("adopted"), id("taken")]));
        assert_eq!(p.fates(&BTreeSet::new()), [Fate::Prune(id("kept"))]);
    }

    #[test]
    fn a_cluster_scoped_object_built_with_a_namespace_stays() {
        let mut tenant = looked("t", Verdict::Ours);
        tenant.id.namespace = None;
        Arc::get_mut(&mut tenant.served).unwrap().namespaced = false;
        let p = Pruning {
            prunes: true,
            looked: Some(Ok(vec![tenant])),
            ..Pruning::default()
        };
        assert!(p.fates(&BTreeSet::from([id("t")])).is_empty());
        assert_eq!(p.fates(&BTreeSet::new()).len(), 1);
    }

    #[test]
    fn a_plan_that_does_not_prune_prunes_nothing() {
        assert!(pruning(false).fates(&BTreeSet::new()).is_empty());
    }
}
