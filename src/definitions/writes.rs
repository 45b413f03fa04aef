//! The definition's own writes: its status (only when it changed, by the
//! engine's status writer), its events; and the resources of its kind,
//! listed.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, Resource, ResourceExt};

use super::context::DefinitionContext;
use super::resource::{self, Status};
use crate::kind::PlannedEvent;

/// The resources of `kind`, as `namespace/name` (or `name`), in every namespace.
pub(super) async fn count(client: &Client, kind: &ApiResource) -> Result<Vec<String>, kube::Error> {
    let api = Api::<DynamicObject>::all_with(client.clone(), kind);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|o| match o.namespace() {
            Some(ns) => format!("{ns}/{}", o.name_any()),
            None => o.name_any(),
        })
        .collect())
}

/// A list of a kind whose CRD is gone: no resources.
pub(super) fn not_found_is_empty(e: kube::Error) -> Result<Vec<String>, kube::Error> {
    match e {
        kube::Error::Api(ref s) if s.code == 404 => Ok(Vec::new()),
        e => Err(e),
    }
}

/// The definition's status as it reads (default when it has none).
pub(super) fn status_of(def: &DynamicObject) -> Status {
    serde_json::from_value(def.data["status"].clone()).unwrap_or_default()
}

/// Writes the status when it changed, as the engine writes every status.
pub(super) async fn write_status(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    before: &Status,
    status: &Status,
) -> Result<(), kube::Error> {
    if before == status {
        return Ok(());
    }
    let kind = resource::api_resource();
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &kind);
    let status = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    (ctx.engine)
        .apply_status(&api, &kind, &def.name_any(), &status)
        .await?;
    Ok(())
}

/// Publishes an event about the definition.
pub(super) async fn event(ctx: &DefinitionContext, def: &DynamicObject, event: PlannedEvent) {
    let regarding = ObjectReference {
        api_version: Some(DynamicObject::api_version(&resource::api_resource()).into_owned()),
        kind: Some(resource::KIND.into()),
        name: def.metadata.name.clone(),
        uid: def.metadata.uid.clone(),
        ..Default::default()
    };
    ctx.engine.publish_event(&regarding, &event).await;
}
