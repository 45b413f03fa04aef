//! Storage migration. When a kind's storage version changes, the objects
//! stored before stay at the old version until they are written again,
//! and the CRD's `status.storedVersions` keeps naming it: the old version
//! cannot be removed without orphaning them. The operator writes each
//! resource again (an empty patch: the API server stores it at the
//! storage version), one page per reconcile of the definition, then trims
//! `storedVersions` to the storage version.
//!
//! The walk is bounded (a page of [`PAGE`] names per step, a few written at
//! once; never in the reconcile that starts serving the generation, whose
//! status is written first) and resumable:
//! where it is lives in memory, and a walk cut short (a restart, an
//! expired list) starts over, which writes nothing twice that matters.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::crds;
use crate::engine::host::FIELD_MANAGER;

/// How many resources one step writes again.
pub const PAGE: u32 = 100;
/// How many of them are written at once.
const WRITES_AT_ONCE: usize = 8;

/// Where each kind's walk is, by CRD name.
#[derive(Debug, Default)]
pub struct Walks(Mutex<HashMap<String, Walk>>);

/// One kind's walk.
#[derive(Debug, Clone, Default)]
struct Walk {
    /// The list's continue token for the next page.
    next: Option<String>,
    /// Resources written again so far.
    written: u64,
}

/// Where a kind's storage stands after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// Every resource is stored at `version`, and the CRD says so.
    Migrated {
        /// The storage version.
        version: String,
        /// Resources this walk wrote again (0: there was nothing to do).
        written: u64,
    },
    /// Resources are being written again at `to`; more steps follow.
    Migrating {
        /// The versions still listed as stored, besides `to`.
        from: Vec<String>,
        /// The storage version.
        to: String,
        /// Resources written again so far.
        written: u64,
    },
}

/// One step of the walk of the kind `resource` whose CRD is `crd`, once
/// that CRD stores `storage`: a page of its resources written again, or
/// `storedVersions` trimmed when none is left.
pub async fn step(
    client: &Client,
    walks: &Walks,
    crd: &str,
    resource: &ApiResource,
    storage: &str,
) -> Result<Storage, kube::Error> {
    let Some(live) = crds::live(client, crd).await? else {
        return Ok(done(walks, crd, storage));
    };
    let from = older_stored(&live, storage);
    if from.is_empty() || !stores(&live, storage) {
        return Ok(done(walks, crd, storage));
    }
    let walk = crate::sync::lock(&walks.0)
        .get(crd)
        .cloned()
        .unwrap_or_default();
    let mut params = ListParams::default().limit(PAGE);
    params.continue_token = walk.next.clone();
    let all = Api::<DynamicObject>::all_with(client.clone(), resource);
    let page = match all.list_metadata(&params).await {
        Ok(page) => page,
        Err(kube::Error::Api(e)) if e.code == 410 => {
            crate::sync::lock(&walks.0).remove(crd);
            return Ok(migrating(from, storage, walk.written));
        }
        Err(e) => return Err(e),
    };
    let names: Vec<_> = (page.items.iter())
        .map(|item| (item.metadata.namespace.clone(), item.name_any()))
        .collect();
    for chunk in names.chunks(WRITES_AT_ONCE) {
        let writes = chunk
            .iter()
            .map(|(ns, name)| rewrite(client.clone(), resource.clone(), ns.clone(), name.clone()));
        futures::future::try_join_all(writes).await?;
    }
    let written = walk.written + page.items.len() as u64;
    let next = page.metadata.continue_.filter(|t| !t.is_empty());
    if next.is_some() {
        crate::sync::lock(&walks.0).insert(crd.to_string(), Walk { next, written });
        return Ok(migrating(from, storage, written));
    }
    trim(client, crd, storage).await?;
    crate::sync::lock(&walks.0).remove(crd);
    Ok(Storage::Migrated {
        version: storage.to_string(),
        written,
    })
}

fn done(walks: &Walks, crd: &str, storage: &str) -> Storage {
    let written = crate::sync::lock(&walks.0)
        .remove(crd)
        .map_or(0, |w| w.written);
    Storage::Migrated {
        version: storage.to_string(),
        written,
    }
}

fn migrating(from: Vec<String>, storage: &str, written: u64) -> Storage {
    Storage::Migrating {
        from,
        to: storage.to_string(),
        written,
    }
}

/// The versions `crd` lists as stored, but for `storage`.
fn older_stored(crd: &CustomResourceDefinition, storage: &str) -> Vec<String> {
    let stored = crd.status.as_ref().and_then(|s| s.stored_versions.as_ref());
    stored
        .into_iter()
        .flatten()
        .filter(|v| v.as_str() != storage)
        .cloned()
        .collect()
}

/// True when the live `crd` stores `storage` (the new CRD is applied).
fn stores(crd: &CustomResourceDefinition, storage: &str) -> bool {
    crd.spec
        .versions
        .iter()
        .any(|v| v.storage && v.name == storage)
}

/// Writes the resource `name` again, unchanged: stored anew at the storage
/// version. One gone or changed meanwhile needs nothing more. Only its
/// metadata comes back: a tenant's object nested deeper than the operator
/// decodes is written again like any other.
async fn rewrite(
    client: Client,
    resource: ApiResource,
    namespace: Option<String>,
    name: String,
) -> Result<(), kube::Error> {
    let api = match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client, &ns, &resource),
        None => Api::<DynamicObject>::all_with(client, &resource),
    };
    let patch = Patch::Merge(json!({}));
    match api
        .patch_metadata(&name, &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Trims the CRD's `status.storedVersions` to `storage`.
async fn trim(client: &Client, crd: &str, storage: &str) -> Result<(), kube::Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let patch = Patch::Merge(json!({"status": {"storedVersions": [storage]}}));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(crd, &params, &patch).await.map(|_| ())
}
