//! The one place status is written: a server-side apply of the whole status
//! (the engine's fields, from [`crate::engine::model::outcome::status_after`], beside the
//! kind's own fields), and the memory that hides the watch cache's lag
//! behind these writes.
//!
//! The watch may deliver an object older than the status the engine just
//! wrote; a reconcile of that stale object would think nothing was applied
//! yet. The engine remembers what it wrote (per UID, until the watch shows
//! it or a few minutes passed) and reconciles with that instead. Handlers
//! hold no such state.

use std::borrow::Cow;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::parked::Parked;
use crate::engine::contract::Handler;
use crate::engine::model::status::CommonStatus;
use crate::engine::reconcile::runtime::Engine;

/// A resource as the engine reconciles it: with the freshest status known.
pub(crate) struct Current<'a, K: Clone> {
    /// The resource (borrowed from the cache unless a fresher status was
    /// put in).
    pub object: Cow<'a, K>,
    /// Its whole status, as JSON (an object; empty when it has none).
    pub status: Value,
    /// The engine's part of it.
    pub common: CommonStatus,
    /// The apply whose status this is, when it is parked, not written yet.
    pub parked: Option<Arc<Parked>>,
}

/// `obj` with its freshest status: the one parked for it, or the one the
/// engine last wrote if the watch lags behind it.
pub(crate) fn current<'a, H: Handler>(
    engine: &Engine,
    handler: &H,
    obj: &'a H::Resource,
) -> Current<'a, H::Resource> {
    let uid = obj.uid();
    let parked = uid.as_deref().and_then(|uid| engine.parked.get(uid));
    let remembered = match &parked {
        Some(parked) => Some(parked.status.value()),
        None => uid
            .as_deref()
            .and_then(|uid| engine.memo.fresher(uid, obj.resource_version().as_deref())),
    };
    let object = remembered
        .as_ref()
        .and_then(|status| with_status(obj, status))
        .map_or(Cow::Borrowed(obj), Cow::Owned);
    let status = handler
        .status(&object)
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    // The engine writes its fields at the top of every kind's status
    // (`compose`), so they are read from the value already parsed.
    let common = CommonStatus::deserialize(&status).unwrap_or_default();
    Current {
        object,
        status,
        common,
        parked,
    }
}

fn with_status<K: Resource + serde::Serialize + serde::de::DeserializeOwned>(
    obj: &K,
    status: &Value,
) -> Option<K> {
    let mut value = serde_json::to_value(obj).ok()?;
    value["status"] = status.clone();
    serde_json::from_value(value).ok()
}

/// The whole status to write: the engine's fields, and the kind's own
/// (`kind`, or the previous ones when `None`).
pub(crate) fn compose(previous: &Value, common: &CommonStatus, kind: Option<Value>) -> Value {
    let mut status = serde_json::Map::new();
    match kind {
        Some(Value::Object(fields)) => status.extend(fields),
        Some(_) => {}
        None => {
            if let Some(previous) = previous.as_object() {
                status.extend(
                    previous
                        .iter()
                        .filter(|(k, _)| !CommonStatus::ENGINE_FIELDS.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone())),
                );
            }
        }
    }
    if let Ok(Value::Object(fields)) = serde_json::to_value(common) {
        status.extend(fields);
    }
    Value::Object(status)
}

/// The kind's own fields of a status (everything but the engine's).
pub(crate) fn kind_fields(status: &Value) -> serde_json::Map<String, Value> {
    status
        .as_object()
        .map(|fields| {
            fields
                .iter()
                .filter(|(k, _)| !CommonStatus::ENGINE_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The kind's fields to write: the plan's (`kind`) with `fields` read from
/// the objects on top.
pub(crate) fn with_fields(
    kind: Option<Value>,
    fields: Option<serde_json::Map<String, Value>>,
) -> Option<Value> {
    match (kind, fields) {
        (Some(Value::Object(mut own)), Some(read)) => {
            own.extend(read);
            Some(Value::Object(own))
        }
        (_, Some(read)) => Some(Value::Object(read)),
        (kind, None) => kind,
    }
}

/// Writes `status` as the resource's whole status (server-side apply, the
/// engine's field manager), remembers it, and releases a parked status
/// (`status` was composed over it).
pub(crate) async fn write<H: Handler>(
    engine: &Engine,
    handler: &H,
    obj: &H::Resource,
    status: Value,
) -> Result<(), kube::Error> {
    let api = handler.api(engine.client.clone(), obj.namespace().as_deref());
    let written = engine
        .apply_status(&api, &handler.info().dyn_type, &obj.name_any(), &status)
        .await?;
    if let Some(uid) = written.uid() {
        engine.parked.release(&uid);
        let stored = handler.status(&written).unwrap_or(status);
        engine
            .memo
            .remember(uid, written.resource_version(), &stored);
    }
    Ok(())
}

impl Engine {
    /// Writes `status` as the whole status of the object `name` of `api`:
    /// one server-side apply with the engine's field manager. Every status
    /// the operator writes, a resource's or a definition's, goes through
    /// here.
    pub(crate) async fn apply_status<K>(
        &self,
        api: &kube::Api<K>,
        dyn_type: &K::DynamicType,
        name: &str,
        status: &Value,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let body = json!({
            "apiVersion": K::api_version(dyn_type),
            "kind": K::kind(dyn_type),
            "status": status,
        });
        let params = PatchParams::apply(Self::FIELD_MANAGER).force();
        api.patch_status(name, &params, &Patch::Apply(&body)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_replaces_its_fields_and_keeps_or_replaces_the_kinds() {
        let previous = json!({
            "message": "old", "lastCommand": {"command": "x"}, "rate": "1.1", "stale": true
        });
        let common = CommonStatus {
            message: Some("new".into()),
            ..Default::default()
        };
        let kept = compose(&previous, &common, None);
        assert_eq!(kept["message"], "new");
        assert!(
            kept.get("lastCommand").is_none(),
            "an engine field unset is removed"
        );
        assert_eq!(kept["rate"], "1.1");
        assert_eq!(kept["stale"], true);
        let replaced = compose(&previous, &common, Some(json!({"rate": "1.2"})));
        assert_eq!(replaced["rate"], "1.2");
        assert!(
            replaced.get("stale").is_none(),
            "the kind's fields are replaced as a whole"
        );
    }
}
