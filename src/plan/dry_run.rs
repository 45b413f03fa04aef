//! The server-side dry run of a resource's new objects, as the identity
//! that would write them: a server-side apply (`dryRun=All`) of each
//! object, with the engine's field manager, as the operator's own account
//! or impersonating the tenant's ServiceAccount (`Impersonate-User`), so
//! `Forbidden`, `Invalid` and field conflicts are found before anything
//! is applied. Where each object's API is served is asked of discovery
//! once per kind.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Client, Resource};
use serde_json::Value;

use super::report::{Failure, Reason};
use crate::kind::ObjectId;
use crate::kind::Owner;

/// Where an API serves a kind: its resource, and whether it is namespaced.
type Resolved = Result<(ApiResource, bool), String>;

/// Dry runs against one cluster, discovery remembered.
pub struct DryRun {
    client: Client,
    served: Mutex<HashMap<(String, String), Resolved>>,
}

/// How an object would be written.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    /// The field manager.
    pub field_manager: &'a str,
    /// Fields other managers own are taken (the kind's `TakeBack`).
    pub force: bool,
    /// The user acted as (`None`: the caller).
    pub user: Option<&'a str>,
}

impl DryRun {
    /// Dry runs with `client` (the caller's identity).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            served: Mutex::default(),
        }
    }

    /// The dry run of applying `object` as `writer`; why it would fail.
    pub async fn apply(&self, object: &Value, writer: Writer<'_>) -> Result<(), Failure> {
        let id = ObjectId::of_manifest(object);
        let failure = |reason: Reason, message: String| Failure {
            object: id.clone().map(Box::new),
            reason,
            message,
        };
        let Some(id) = id.clone() else {
            return Err(failure(
                Reason::Invalid,
                "an object without apiVersion, kind or name".into(),
            ));
        };
        let (resource, namespaced) = self
            .served(&id)
            .await
            .map_err(|why| failure(Reason::NotFound, why))?;
        let namespace = id.namespace.as_deref().filter(|_| namespaced);
        let path = DynamicObject::url_path(&resource, namespace);
        let mut params = PatchParams::apply(writer.field_manager).dry_run();
        params.force = writer.force;
        let request = kube::core::Request::new(path)
            .patch(&id.name, &params, &Patch::Apply(object))
            .map_err(|e| failure(Reason::Invalid, e.to_string()))?;
        match send(&self.client, writer.user, request).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err(failure(
                Reason::of_api(&status.reason, status.code),
                status.message.clone(),
            )),
            Err(e) => Err(failure(Reason::Rejected, crate::error_text::kube(&e))),
        }
    }

    /// Why the operator would refuse to write `object` for the resource
    /// of `uid`: it exists without the resource's marker (the engine takes
    /// over no object it did not create). Read as the caller.
    pub async fn taken(&self, object: &Value, uid: &str) -> Option<Failure> {
        let id = ObjectId::of_manifest(object)?;
        let (resource, namespaced) = self.served(&id).await.ok()?;
        let api: Api<DynamicObject> = match (id.namespace.as_deref(), namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        let failure = |message: String| Failure {
            object: Some(Box::new(id.clone())),
            reason: Reason::OwnershipConflict,
            message,
        };
        match api.get_metadata_opt(&id.name).await {
            Ok(None) => None,
            Ok(Some(live)) => {
                let labels = live.metadata.labels.unwrap_or_default();
                let marker = labels.get(Owner::LABEL).map(String::as_str);
                (marker != Some(uid)).then(|| {
                    failure(
                        "exists, not created by this resource: the operator does not take over objects it did not create".into(),
                    )
                })
            }
            Err(e) => Some(Failure {
                reason: Reason::Forbidden,
                ..failure(format!(
                    "cannot tell whether it exists already: {}",
                    crate::error_text::kube(&e)
                ))
            }),
        }
    }

    /// Where `id`'s kind is served, asked once.
    async fn served(&self, id: &ObjectId) -> Resolved {
        let key = (id.api_version.clone(), id.kind.clone());
        if let Some(known) = crate::sync::lock(&self.served).get(&key) {
            return known.clone();
        }
        let gvk = GroupVersionKind::gvk(id.group(), id.version(), &id.kind);
        let found = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, capabilities)) => Ok((resource, capabilities.scope == Scope::Namespaced)),
            Err(e) => Err(format!(
                "the API server serves no {} {} ({})",
                id.api_version,
                id.kind,
                crate::error_text::kube(&e)
            )),
        };
        crate::sync::lock(&self.served).insert(key, found.clone());
        found
    }
}

/// Sends `request` as `user` (the client's own identity when `None`).
async fn send(
    client: &Client,
    user: Option<&str>,
    request: http::Request<Vec<u8>>,
) -> Result<Value, kube::Error> {
    let mut request = request;
    if let Some(user) = user {
        let header = http::HeaderValue::from_str(user).map_err(|e| {
            kube::Error::BuildRequest(kube::core::request::Error::Validation(e.to_string()))
        })?;
        request.headers_mut().insert("Impersonate-User", header);
    }
    client.request::<Value>(request).await
}
