//! The finalizer of every resource the operator serves, a kind's or a
//! definition's: added by a tested JSON patch (a concurrent change of the
//! list fails it, and the reconcile retries), then kube-runtime's
//! `finalizer` state machine: `Apply` while the object lives, `Cleanup`
//! once it is being deleted, the finalizer removed (by a tested patch)
//! only after a cleanup that succeeded.

use std::future::Future;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Error, Event, finalizer};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Adds `name` to `obj` if it lacks it (returning the object as the API
/// server answered), then runs `reconcile` under kube-runtime's finalizer:
/// the one finalizer state machine of the operator.
pub(crate) async fn guarded<K, F, Fut, E>(
    api: &kube::Api<K>,
    name: &str,
    obj: Arc<K>,
    reconcile: F,
) -> Result<Action, Error<E>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: std::error::Error + 'static,
{
    let obj = if needs_finalizer(&*obj, name) {
        Arc::new(
            add_finalizer(api, &*obj, name)
                .await
                .map_err(Error::AddFinalizer)?,
        )
    } else {
        obj
    };
    finalizer(api, name, obj, reconcile).await
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
    let patch: Patch<()> =
        Patch::Json(serde_json::from_value(operations).map_err(kube::Error::SerdeError)?);
    api.patch(&obj.name_any(), &PatchParams::default(), &patch)
        .await
}
