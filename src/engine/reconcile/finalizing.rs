//! The finalizer of every resource the operator serves, a kind's or a
//! definition's: added by a tested JSON patch (a concurrent change of the
//! list fails it, and the reconcile retries), then kube-runtime's
//! `finalizer` state machine: `Apply` while the object lives, `Cleanup`
//! once it is being deleted, the finalizer removed (by a tested patch)
//! only after a cleanup that succeeded; and [`Engine::release_finalizer`],
//! the same tested removal for a resource no controller will serve again
//! (its definition deleted with `Orphan`). A reconciler plugged into the
//! runtime (a KindDefinition's) reaches both through the [`Engine`].

use std::future::Future;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Error, Event, finalizer};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::engine::reconcile::runtime::Engine;

impl Engine {
    /// Adds the finalizer `finalizer` to `obj` if it lacks it (going on
    /// with the object as the API server answered), then runs `reconcile`
    /// under kube-runtime's finalizer: the one finalizer state machine of
    /// the operator, for a kind's resources and a definition alike.
    pub(crate) async fn guarded<K, F, Fut, E>(
        &self,
        api: &kube::Api<K>,
        finalizer_name: &str,
        obj: Arc<K>,
        reconcile: F,
    ) -> Result<Action, Error<E>>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
        F: FnOnce(Event<K>) -> Fut,
        Fut: Future<Output = Result<Action, E>>,
        E: std::error::Error + 'static,
    {
        let obj = if needs_finalizer(&*obj, finalizer_name) {
            Arc::new(
                add_finalizer(api, &*obj, finalizer_name)
                    .await
                    .map_err(Error::AddFinalizer)?,
            )
        } else {
            obj
        };
        finalizer(api, finalizer_name, obj, reconcile).await
    }

    /// Takes the finalizer `finalizer` off `obj`, if it carries it, by a
    /// JSON patch that tests the entry first (a concurrent change of the
    /// list fails it): for a resource whose kind is no longer served, so
    /// that its deletion waits for no controller. Returns whether a patch
    /// was sent.
    pub(crate) async fn release_finalizer<K>(
        &self,
        api: &kube::Api<K>,
        finalizer: &str,
        obj: &K,
    ) -> Result<bool, kube::Error>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        let Some(operations) = removal(obj, finalizer) else {
            return Ok(false);
        };
        patch_json(api, obj, operations).await?;
        Ok(true)
    }
}

/// True when `obj` is not being deleted and lacks `finalizer`.
pub(crate) fn needs_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta().deletion_timestamp.is_none() && !obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds the finalizer with the JSON patch kube-runtime's `finalizer` uses:
/// a `test` of the current list first, so a concurrent change makes the
/// patch fail (and the reconcile retry) rather than duplicate or drop an
/// entry. Returns the updated object.
pub(crate) async fn add_finalizer<K>(
    api: &kube::Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let operations = if obj.finalizers().is_empty() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": obj.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    patch_json(api, obj, operations).await
}

/// Sends the JSON patch `operations` to `obj`; returns the object as the
/// API server answered.
async fn patch_json<K>(
    api: &kube::Api<K>,
    obj: &K,
    operations: serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let patch: Patch<()> =
        Patch::Json(serde_json::from_value(operations).map_err(kube::Error::SerdeError)?);
    api.patch(&obj.name_any(), &PatchParams::default(), &patch)
        .await
}

/// The JSON patch operations removing `finalizer` from `obj`, tested
/// first; `None` when it does not carry it.
fn removal<K: Resource>(obj: &K, finalizer: &str) -> Option<serde_json::Value> {
    let index = obj.finalizers().iter().position(|f| f == finalizer)?;
    let path = format!("/metadata/finalizers/{index}");
    Some(json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{ApiResource, DynamicObject};

    #[test]
    fn a_finalizer_is_released_by_a_tested_patch() {
        let kind = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut object = DynamicObject::new("x", &kind);
        object.metadata.finalizers = Some(vec!["a".into(), "b/kustomize-operator".into()]);
        let patch = removal(&object, "b/kustomize-operator").unwrap();
        assert_eq!(patch[0]["op"], "test");
        assert_eq!(patch[0]["value"], "b/kustomize-operator");
        assert_eq!(patch[1]["op"], "remove");
        assert_eq!(patch[1]["path"], "/metadata/finalizers/1");
        assert!(removal(&object, "other").is_none());
    }
}
