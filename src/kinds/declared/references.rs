//! A declared kind's references (`spec.references`): objects a resource
//! reads without owning them. Each is read, at every reconcile, with the
//! rights of the identity the resource's writes use (impersonated, so a
//! tenant's ServiceAccount reads only what it may read); what was read is
//! visible to templates and CEL under the reference's name, and the
//! handler remembers who read what, so a change to a read object
//! reconciles its readers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::{StreamExt, stream};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{ApiResource, DynamicObject, GetParams, ListParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::object::DeclaredObject;
use crate::kind::{HandlerError, Reason, Watching};

/// The most bytes (as JSON) one resource's references may read in all.
pub const MAX_READ_BYTES: usize = 1024 * 1024;
/// The most objects one selector reference reads.
pub const MAX_LISTED: usize = 100;

/// One reference, rendered for one resource: what to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The reference's name in the kind file.
    pub name: String,
    /// The type of the object(s).
    pub resource: ApiResource,
    /// Where they are.
    pub namespace: String,
    /// Which.
    pub by: By,
    /// Read as `null` when missing, instead of waiting.
    pub optional: bool,
}

/// How a reference picks its object(s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum By {
    /// One object, by name.
    Name(String),
    /// Every object carrying these labels, as a list.
    Labels(BTreeMap<String, String>),
}

/// The type `api_version`/`kind` names.
pub fn api_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Lookup {
    /// True when the object `meta` of type `resource` is (one of) what it reads.
    fn reads(&self, resource: &ApiResource, meta: &ObjectMeta) -> bool {
        if self.resource.group != resource.group
            || self.resource.kind != resource.kind
            || meta.namespace.as_deref() != Some(self.namespace.as_str())
        {
            return false;
        }
        match &self.by {
            By::Name(name) => meta.name.as_deref() == Some(name.as_str()),
            // A label removed concerns the readers too: any object of the
            // type there may have joined or left the selection.
            By::Labels(_) => true,
        }
    }

    /// What the resource's status says it reads (`configmap/settings`).
    fn describe(&self) -> String {
        let kind = self.resource.kind.to_lowercase();
        match &self.by {
            By::Name(name) => format!("{kind}/{name} in namespace {}", self.namespace),
            By::Labels(labels) => {
                format!(
                    "{kind}s labelled {} in namespace {}",
                    selector(labels),
                    self.namespace
                )
            }
        }
    }
}

fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads every reference of `wanted` as `user` (the client's own identity
/// when `None`): the objects by reference name, a selector's as a list.
pub async fn read(
    client: &kube::Client,
    user: Option<&str>,
    wanted: &[Lookup],
) -> Result<BTreeMap<String, Value>, HandlerError> {
    let mut read = BTreeMap::new();
    let mut bytes = 0;
    for w in wanted {
        let mut value = read_one(client, user, w).await?;
        slim(&mut value);
        bytes += serde_json::to_vec(&value).map_or(0, |v| v.len());
        if bytes > MAX_READ_BYTES {
            return Err(HandlerError::TooLarge(format!(
                "the references read more than {MAX_READ_BYTES} bytes (at {})",
                w.name
            )));
        }
        read.insert(w.name.clone(), value);
    }
    Ok(read)
}

/// Reads one reference; a refusal or a missing object in words.
async fn read_one(
    client: &kube::Client,
    user: Option<&str>,
    w: &Lookup,
) -> Result<Value, HandlerError> {
    let path = DynamicObject::url_path(&w.resource, Some(&w.namespace));
    let labels = match &w.by {
        By::Name(name) => {
            let request = kube::core::Request::new(path).get(name, &GetParams::default());
            return match send(client, user, request).await {
                Ok(value) => Ok(value),
                Err(kube::Error::Api(e)) if e.code == 404 && w.optional => Ok(Value::Null),
                Err(e) => Err(refused(w, user, &e)),
            };
        }
        By::Labels(labels) => selector(labels),
    };
    // Paged, so that a few large objects cannot make one answer of any size.
    let mut items = Vec::new();
    let mut bytes = 0;
    let mut next: Option<String> = None;
    loop {
        let mut params = ListParams::default().labels(&labels).limit(PAGE);
        if let Some(token) = next.take() {
            params = params.continue_token(&token);
        }
        let request = kube::core::Request::new(&path).list(&params);
        let page = send(client, user, request)
            .await
            .map_err(|e| refused(w, user, &e))?;
        bytes += serde_json::to_vec(&page).map_or(0, |v| v.len());
        if bytes > MAX_READ_BYTES {
            return Err(HandlerError::TooLarge(format!(
                "reference {}: the objects of {} are more than {MAX_READ_BYTES} bytes",
                w.name,
                w.describe()
            )));
        }
        items.extend(page["items"].as_array().into_iter().flatten().cloned());
        next = page["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        if next.is_none() || items.len() >= MAX_LISTED {
            items.truncate(MAX_LISTED);
            return Ok(Value::Array(items));
        }
    }
}

/// Objects per page of a selector's list.
const PAGE: u32 = 10;

/// Sends `request` as `user` (the client's own identity when `None`).
async fn send(
    client: &kube::Client,
    user: Option<&str>,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<Value, kube::Error> {
    let mut http = request.map_err(kube::Error::BuildRequest)?;
    if let Some(user) = user {
        let header = http::HeaderValue::from_str(user).map_err(|e| {
            kube::Error::BuildRequest(kube::core::request::Error::Validation(e.to_string()))
        })?;
        http.headers_mut().insert("Impersonate-User", header);
    }
    client.request::<Value>(http).await
}

/// A failed read in words: missing, refused, or another API error.
fn refused(w: &Lookup, user: Option<&str>, error: &kube::Error) -> HandlerError {
    match error {
        kube::Error::Api(e) if e.code == 404 => HandlerError::transient(
            Reason::ReferenceNotFound,
            format!("reference {}: {} not found", w.name, w.describe()),
        ),
        kube::Error::Api(e) if e.code == 403 => HandlerError::transient(
            Reason::Forbidden,
            format!(
                "reference {}: {} may not read {} (grant it get and list on {})",
                w.name,
                user.unwrap_or("the operator"),
                w.describe(),
                w.resource.plural
            ),
        ),
        other => HandlerError::transient(
            Reason::ApiError,
            format!(
                "reference {}: cannot read {}: {}",
                w.name,
                w.describe(),
                crate::error_text::kube(other)
            ),
        ),
    }
}

/// What each reference reads among `documents` (`render -f`: the objects
/// after the resource in its file); a missing one reads as `null`.
pub fn from_documents(wanted: &[Lookup], documents: &[Value]) -> BTreeMap<String, Value> {
    let of_type = |w: &Lookup, d: &&Value| {
        let api_version = d["apiVersion"].as_str().unwrap_or_default();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        group == w.resource.group && d["kind"].as_str() == Some(w.resource.kind.as_str())
    };
    wanted
        .iter()
        .map(|w| {
            let value = match &w.by {
                By::Name(name) => documents
                    .iter()
                    .find(|d| of_type(w, d) && d["metadata"]["name"].as_str() == Some(name))
                    .cloned()
                    .unwrap_or(Value::Null),
                By::Labels(labels) => Value::Array(
                    documents
                        .iter()
                        .filter(|d| of_type(w, d))
                        .filter(|d| {
                            labels
                                .iter()
                                .all(|(k, v)| d["metadata"]["labels"][k].as_str() == Some(v))
                        })
                        .cloned()
                        .collect(),
                ),
            };
            (w.name.clone(), value)
        })
        .collect()
}

/// Drops what no template needs and what would only weigh: managedFields
/// and kubectl's last-applied annotation.
fn slim(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(slim),
        Value::Object(object) => {
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
                if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    a.remove("kubectl.kubernetes.io/last-applied-configuration");
                }
            }
        }
        _ => {}
    }
}

/// What CEL sees of what was read: Secrets without their data (a status
/// never carries Secret data).
pub fn for_expressions(read: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    fn redact(value: &mut Value) {
        match value {
            Value::Array(items) => items.iter_mut().for_each(redact),
            Value::Object(object) if object.get("kind") == Some(&Value::from("Secret")) => {
                object.remove("data");
                object.remove("stringData");
            }
            _ => {}
        }
    }
    let mut seen = read.clone();
    seen.values_mut().for_each(redact);
    seen
}

/// A resource of the kind: (namespace, name).
pub type Key = (Option<String>, String);

/// Who read what at their last reconcile, and what their expressions saw.
#[derive(Debug, Default)]
pub struct Readers {
    by_resource: Mutex<HashMap<Key, Reading>>,
}

#[derive(Debug, Default)]
struct Reading {
    wanted: Vec<Lookup>,
    seen: BTreeMap<String, Value>,
}

impl Readers {
    /// `key` reads `wanted` (what it saw is kept until [`Readers::saw`]).
    pub fn reads(&self, key: Key, wanted: Vec<Lookup>) {
        let mut all = crate::sync::lock(&self.by_resource);
        all.entry(key).or_default().wanted = wanted;
    }

    /// `key`'s expressions see `seen`.
    pub fn saw(&self, key: &Key, seen: BTreeMap<String, Value>) {
        if let Some(reading) = crate::sync::lock(&self.by_resource).get_mut(key) {
            reading.seen = seen;
        }
    }

    /// What `key`'s expressions saw at its last reconcile.
    pub fn seen(&self, key: &Key) -> BTreeMap<String, Value> {
        crate::sync::lock(&self.by_resource)
            .get(key)
            .map(|r| r.seen.clone())
            .unwrap_or_default()
    }

    /// Forgets `key` (gone).
    pub fn forget(&self, key: &Key) {
        crate::sync::lock(&self.by_resource).remove(key);
    }

    /// The resources that read the object `meta` of type `resource`.
    pub fn of(&self, resource: &ApiResource, meta: &ObjectMeta) -> Vec<Key> {
        crate::sync::lock(&self.by_resource)
            .iter()
            .filter(|(_, r)| r.wanted.iter().any(|w| w.reads(resource, meta)))
            .map(|(key, _)| key.clone())
            .collect()
    }
}

/// The resources of the kind `kind` to reconcile as the objects of type
/// `resource` they read change or go (a metadata watch of them, in the
/// watched namespace or all).
pub fn nudges(
    watching: &Watching<DeclaredObject>,
    resource: ApiResource,
    readers: Arc<Readers>,
    kind: ApiResource,
) -> BoxStream<'static, ObjectRef<DeclaredObject>> {
    let client = watching.client.clone();
    let api: kube::Api<PartialObjectMeta<DynamicObject>> = match watching.namespace.as_deref() {
        Some(ns) => kube::Api::namespaced_with(client, ns, &resource),
        None => kube::Api::all_with(client, &resource),
    };
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .filter_map(|meta| std::future::ready(meta.ok()))
        .flat_map(move |meta| {
            let read_by = readers.of(&resource, &meta.metadata).into_iter();
            let kind = kind.clone();
            stream::iter(read_by.map(move |(namespace, name)| {
                let reader = ObjectRef::new_with(&name, kind.clone());
                match namespace {
                    Some(namespace) => reader.within(&namespace),
                    None => reader,
                }
            }))
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wanted(by: By) -> Lookup {
        Lookup {
            name: "settings".into(),
            resource: api_resource("v1", "ConfigMap"),
            namespace: "team".into(),
            by,
            optional: false,
        }
    }

    fn meta(namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_change_reaches_the_resources_that_read_the_object() {
        let readers = Readers::default();
        let key = (Some("team".to_string()), "web".to_string());
        readers.reads(key.clone(), vec![wanted(By::Name("colors".into()))]);
        let labelled = (Some("team".to_string()), "all".to_string());
        readers.reads(labelled.clone(), vec![wanted(By::Labels(BTreeMap::new()))]);
        let config_map = api_resource("v1", "ConfigMap");
        let mut concerned = readers.of(&config_map, &meta("team", "colors"));
        concerned.sort();
        assert_eq!(concerned, vec![labelled.clone(), key.clone()]);
        assert_eq!(
            readers.of(&config_map, &meta("team", "other")),
            vec![labelled.clone()]
        );
        assert!(
            readers
                .of(&config_map, &meta("elsewhere", "colors"))
                .is_empty()
        );
        let secret = api_resource("v1", "Secret");
        assert!(readers.of(&secret, &meta("team", "colors")).is_empty());
        readers.forget(&key);
        readers.forget(&labelled);
        assert!(readers.of(&config_map, &meta("team", "colors")).is_empty());
    }

    #[test]
    fn expressions_never_see_a_secrets_data() {
        let read = BTreeMap::from([
            (
                "token".to_string(),
                json!({"kind": "Secret", "data": {"t": "c2VjcmV0"}, "type": "Opaque"}),
            ),
            (
                "all".to_string(),
                json!([{"kind": "Secret", "stringData": {"t": "x"}}]),
            ),
            (
                "colors".to_string(),
                json!({"kind": "ConfigMap", "data": {"c": "blue"}}),
            ),
        ]);
        let seen = for_expressions(&read);
        assert_eq!(seen["token"], json!({"kind": "Secret", "type": "Opaque"}));
        assert_eq!(seen["all"], json!([{"kind": "Secret"}]));
        assert_eq!(seen["colors"], read["colors"]);
    }

    #[test]
    fn what_nobody_needs_is_not_kept() {
        let mut object = json!({"metadata": {"name": "a", "managedFields": [{}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "1"}}});
        slim(&mut object);
        assert_eq!(
            object,
            json!({"metadata": {"name": "a", "annotations": {"keep": "1"}}})
        );
    }
}
