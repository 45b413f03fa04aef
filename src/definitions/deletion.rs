//! Deleting a definition: refused by the guard while its count is above
//! 0; held by its finalizer while resources of its kind exist (unless it
//! orphans them); then the kind's controller stops, the CRD goes (only
//! with its marker, only when no resource is left), and the finalizer.

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};

use super::context::{DefinitionContext, DefinitionError, NAMES_SHOWN};
use super::resource::{ConditionType, Reason};
use super::writes::{count, event, not_found_is_empty, status_of, write_status};
use super::{crds, following};
use crate::kind::PlannedEvent;

/// How often a deletion waiting for resources looks again.
pub(super) const DELETION_RECHECK: Duration = Duration::from_secs(5);

/// How often a deletion waiting for its CRD to go looks again (the API
/// server removes a CRD with no resources left within a second or two).
pub(super) const CRD_RECHECK: Duration = Duration::from_secs(1);

/// Deletion: waits while resources of the kind exist (unless the
/// definition orphans them: `Err(Waiting)` keeps the finalizer), then
/// stops the kind's controller and removes the CRD (only with its marker,
/// only when no resource is left; `Err(CrdTerminating)` keeps the
/// finalizer until the API server has removed it); the finalizer state
/// machine then removes the finalizer.
pub(super) async fn remove(
    def: &DynamicObject,
    ctx: &DefinitionContext,
) -> Result<Action, DefinitionError> {
    let name = def.name_any();
    tracing::debug!(definition = name, "deleting");
    let served = ctx.serving.current(&name);
    let kind = match served.as_ref() {
        Some(generation) => Some(generation.kind.resource.clone()),
        None => own_kind(&ctx.client, def).await?,
    };
    let remaining = match &kind {
        Some(kind) => count(&ctx.client, kind).await.or_else(not_found_is_empty)?,
        None => Vec::new(),
    };
    let orphan = following::orphans(def);
    if let Some(kind) = kind.as_ref().filter(|_| !remaining.is_empty()) {
        if !orphan {
            return wait_for_resources(def, ctx, kind, &remaining, served.is_some()).await;
        }
        ctx.serving.stop(&name).await;
        if ctx.engine.settings().share.is_some() && following::within_orphan_grace(def) {
            // The other replicas stop serving the kind first.
            return Err(DefinitionError::Orphaning);
        }
        orphan_resources(ctx, kind, &remaining).await?;
    } else {
        ctx.serving.stop(&name).await;
        if let Some(kind) = &kind {
            let crd = format!("{}.{}", kind.plural, kind.group);
            ctx.applied_crds.forget(&crd);
            if crds::delete_owned(&ctx.client, &crd, &name).await? {
                return wait_for_crd(def, ctx, crd).await;
            }
        }
    }
    crate::sync::lock(&ctx.rejected).remove(&name);
    ctx.plans.forget(&name);
    Ok(Action::await_change())
}

/// Says, in status and an event, which resources a deletion waits for.
async fn wait_for_resources(
    def: &DynamicObject,
    ctx: &DefinitionContext,
    kind: &ApiResource,
    remaining: &[String],
    serving: bool,
) -> Result<Action, DefinitionError> {
    let before = status_of(def);
    let mut status = before.clone();
    status.resources = Some(remaining.len() as u64);
    let mut message = format!(
        "the deletion waits for {} {} resource(s): {}; delete them, or set spec.onDelete: Orphan to leave them",
        remaining.len(),
        kind.kind,
        crate::text::first_names(remaining, NAMES_SHOWN, ", ")
    );
    if !serving {
        message.push_str(" (the kind is not served: their finalizers stay until a valid generation is accepted, or Orphan is set)");
    }
    status.set(
        ConditionType::Serving,
        serving,
        Reason::WaitingForResources,
        &message,
        def.metadata.generation,
    );
    write_status(ctx, def, &before, &status).await?;
    event(
        ctx,
        def,
        PlannedEvent::warning("DeletionWaits", message.clone()),
    )
    .await;
    Err(DefinitionError::Waiting)
}

/// Says in status that the deletion waits for the API server to remove
/// the CRD (within a second or two; longer if an object of the kind
/// created meanwhile holds a finalizer of another controller).
async fn wait_for_crd(
    def: &DynamicObject,
    ctx: &DefinitionContext,
    crd: String,
) -> Result<Action, DefinitionError> {
    let before = status_of(def);
    let mut status = before.clone();
    let message = format!(
        "the deletion waits for the API server to remove the CRD {crd} (its conditions say why it is still there)"
    );
    status.set(
        ConditionType::Serving,
        false,
        Reason::WaitingForResources,
        &message,
        def.metadata.generation,
    );
    write_status(ctx, def, &before, &status).await?;
    Err(DefinitionError::CrdTerminating(crd))
}

/// Takes the kind's finalizer off each remaining resource: no controller
/// serves them any more, and their deletion must not wait for one.
async fn orphan_resources(
    ctx: &DefinitionContext,
    kind: &ApiResource,
    remaining: &[String],
) -> Result<(), kube::Error> {
    let finalizer = crate::kinds::declared::finalizer(&kind.group);
    for key in remaining {
        let (namespace, name) = match key.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, key.as_str()),
        };
        let api = match namespace {
            Some(ns) => Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, kind),
            None => Api::<DynamicObject>::all_with(ctx.client.clone(), kind),
        };
        let Some(object) = api.get_opt(name).await? else {
            continue;
        };
        (ctx.engine)
            .release_finalizer(&api, &finalizer, &object)
            .await?;
    }
    Ok(())
}

/// The kind a definition that is not served now served once: the kind its
/// spec names, only if the CRD of that kind carries the definition's
/// marker. A definition that never served (rejected from the first,
/// naming any kind at all, `apps/deployments` say) has none: its deletion
/// reads, orphans and deletes nothing of that kind.
async fn own_kind(
    client: &Client,
    def: &DynamicObject,
) -> Result<Option<ApiResource>, kube::Error> {
    let Some(kind) = declared_resource(def) else {
        return Ok(None);
    };
    let Some(crd) = crds::live(client, &format!("{}.{}", kind.plural, kind.group)).await? else {
        return Ok(None);
    };
    if crds::marker(&crd) != Some(def.name_any().as_str()) {
        return Ok(None);
    }
    // As the CRD serves it (the spec may name a version never accepted).
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map_or(kind.version, |v| v.name.clone());
    Ok(Some(ApiResource {
        api_version: format!("{}/{version}", crd.spec.group),
        group: crd.spec.group,
        version,
        kind: crd.spec.names.kind,
        plural: crd.spec.names.plural,
    }))
}

/// The kind a definition declares, read from its spec as it is.
fn declared_resource(def: &DynamicObject) -> Option<ApiResource> {
    let spec = &def.data["spec"];
    let group = spec["group"].as_str()?;
    let version = spec["version"].as_str()?;
    Some(ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: spec["names"]["kind"].as_str()?.into(),
        plural: spec["names"]["plural"].as_str()?.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_declared_kind_is_read_from_the_spec() {
        let mut object = DynamicObject::new("greeting", &super::super::resource::api_resource());
        object.data = json!({"spec": {"group": "hello.io", "version": "v1", "names": {"kind": "Greeting", "plural": "greetings"}}});
        let kind = declared_resource(&object).unwrap();
        assert_eq!(
            (kind.api_version.as_str(), kind.plural.as_str()),
            ("hello.io/v1", "greetings")
        );
        object.data = json!({"spec": {}});
        assert!(declared_resource(&object).is_none());
    }
}
