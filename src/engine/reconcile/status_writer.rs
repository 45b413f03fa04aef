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
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::{Duration, Instant};

use super::expiring::Expiring;
use super::parked::Parked;
use crate::engine::contract::Handler;
use crate::engine::model::status::COMMON_KEYS;
use crate::engine::model::status::{CommonStatus, StatusText};
use crate::engine::{Engine, FIELD_MANAGER};

/// How long a written status is remembered at most.
const MEMO_TTL: Duration = Duration::from_secs(300);
/// How long a written status is still remembered once the watch brought
/// it: longer than a reconcile takes from reading the cache to asking for
/// its freshest status.
const SEEN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Memo {
    resource_version: Option<String>,
    status: StatusText,
}

/// The statuses the engine wrote that the watch may not show yet.
#[derive(Debug, Default)]
pub(crate) struct StatusMemo {
    entries: Mutex<Expiring<String, Memo>>,
}

impl StatusMemo {
    /// The status last written for `uid`, if the cached object (at
    /// `cached_version`) may not show it yet.
    pub fn fresher(&self, uid: &str, cached_version: Option<&str>) -> Option<Value> {
        let mut entries = self.lock();
        let memo = entries.get(uid, Instant::now())?;
        if memo.resource_version.as_deref() == cached_version {
            // The watch caught up.
            entries.remove(uid);
            return None;
        }
        Some(memo.status.value())
    }

    /// The watch's cache holds the resource `meta` describes at its
    /// version: a status written at that version is forgotten soon (it is
    /// in the cache now). Without this, a status would be held until
    /// [`MEMO_TTL`], since its own write starts no reconcile to look.
    ///
    /// Soon, not at once: a reconcile may have taken the resource from
    /// the cache just before the watch brought the written version, and
    /// has yet to ask [`StatusMemo::fresher`]. Forgotten now, its
    /// status would be the one before the write (a resource whose spec
    /// changed during a reconcile would then be reconciled against the
    /// inventory before the last apply, and prune nothing).
    pub fn cached(&self, meta: &ObjectMeta) {
        let (Some(uid), Some(version)) = (meta.uid.as_deref(), meta.resource_version.as_deref())
        else {
            return;
        };
        let mut entries = self.lock();
        let now = Instant::now();
        let written_at = entries.get(uid, now);
        if written_at.is_some_and(|memo| memo.resource_version.as_deref() == Some(version)) {
            entries.renew(uid, now + SEEN_GRACE, now);
        }
    }

    /// Remembers a status written for `uid`.
    pub fn remember(&self, uid: String, resource_version: Option<String>, status: &Value) {
        let memo = Memo {
            resource_version,
            status: StatusText::of(status),
        };
        let now = Instant::now();
        self.lock().insert(uid, memo, now + MEMO_TTL, now);
    }

    /// Forgets the statuses written too long ago to matter (see
    /// [`Expiring::forget_expired`]).
    pub fn forget_expired(&self, now: Instant) {
        self.lock().forget_expired(now);
    }

    /// Forgets `uid` (its resource is gone).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Expiring<String, Memo>> {
        crate::sync::lock(&self.entries)
    }
}

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
                        .filter(|(k, _)| !COMMON_KEYS.contains(&k.as_str()))
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
                .filter(|(k, _)| !COMMON_KEYS.contains(&k.as_str()))
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
    let written = apply_status(&api, &handler.info().dyn_type, &obj.name_any(), &status).await?;
    if let Some(uid) = written.uid() {
        engine.parked.release(&uid);
        let stored = handler.status(&written).unwrap_or(status);
        engine
            .memo
            .remember(uid, written.resource_version(), &stored);
    }
    Ok(())
}

/// Writes `status` as the whole status of the object `name` of `api`: one
/// server-side apply with the engine's field manager. Every status the
/// operator writes, a resource's or a definition's, goes through here.
pub(crate) async fn apply_status<K>(
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
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(&body)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_showing_the_written_version_forgets_it_soon_without_a_reconcile() {
        let memo = StatusMemo::default();
        memo.remember("u".into(), Some("5".into()), &json!({"message": "new"}));
        let at = |version: &str| ObjectMeta {
            uid: Some("u".into()),
            resource_version: Some(version.into()),
            ..Default::default()
        };
        memo.cached(&at("4"));
        assert!(memo.lock().get("u", Instant::now()).is_some(), "not yet");
        memo.cached(&at("5"));
        assert_eq!(
            memo.fresher("u", Some("4")),
            Some(json!({"message": "new"})),
            "a reconcile that read the cache before the watch brought the write still gets it"
        );
        let later = Instant::now() + SEEN_GRACE + Duration::from_millis(1);
        assert!(
            memo.lock().get("u", later).is_none(),
            "forgotten once the grace is over"
        );
    }

    #[test]
    fn the_memo_answers_until_the_watch_catches_up() {
        let memo = StatusMemo::default();
        assert_eq!(memo.fresher("u", Some("1")), None);
        memo.remember("u".into(), Some("5".into()), &json!({"message": "new"}));
        assert_eq!(
            memo.fresher("u", Some("4")),
            Some(json!({"message": "new"}))
        );
        assert_eq!(memo.fresher("u", Some("5")), None, "caught up");
        assert_eq!(memo.fresher("u", Some("4")), None, "forgotten once seen");
        memo.remember("v".into(), Some("7".into()), &json!({}));
        memo.forget("v");
        assert_eq!(memo.fresher("v", Some("6")), None);
    }

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
