//! Storage migration by the operator. When a kind's storage version
//! changes, the objects stored before stay at the old version until they
//! are written again, and the CRD's `status.storedVersions` keeps naming
//! it: the old version cannot be removed without orphaning them. Where
//! the API server has no StorageVersionMigration to do it (before
//! Kubernetes 1.37), or that migration failed ([`super::migrator`]
//! chooses), the operator writes each resource again (an empty patch: the
//! API server stores it at the storage version), one page per reconcile
//! of the definition, then trims `storedVersions` to the storage version.
//!
//! One resource that cannot be written again (its conversion fails, or
//! what it converts to is invalid) costs only itself: the walk writes
//! every other, keeps the names of those that failed and why (the first
//! [`KEPT`]), tries them again at the next steps, and trims
//! `storedVersions` only once none is left ([`Walk`], the accounting, is
//! pure). More failures than it keeps are found again by another walk.
//!
//! The walk is bounded (a page of [`PAGE`] names per step, a few written at
//! once; never in the reconcile that starts serving the generation, whose
//! status is written first) and resumable:
//! where it is lives in memory, and a walk cut short (a restart, an
//! expired list) starts over, which writes nothing twice that matters.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::engine::host::Engine;

/// How many resources one step writes again.
pub const PAGE: u32 = 100;
/// How many of them are written at once.
const WRITES_AT_ONCE: usize = 8;
/// How many resources that could not be written a walk keeps, by name, to
/// try again.
pub const KEPT: usize = PAGE as usize;
/// How many of them a condition names.
pub const NAMED: usize = 3;
/// How long a list of the kind's resources is waited for. The client
/// retries an API server that answers "too many requests" for minutes,
/// and it answers so while it cannot fill its cache of the kind: while a
/// resource stored at an older version does not convert.
pub const LIST_WAIT: Duration = Duration::from_secs(10);

/// Why a step of the walk could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The API server refused a request for the whole kind.
    #[error("{}", in_words(.0))]
    Api(#[from] kube::Error),
    /// It did not list the kind's resources in time.
    #[error(
        "the API server did not list them within {} s (it refuses every list of a kind while a resource stored at an older version does not convert: `kubectl get` of the kind says which)",
        LIST_WAIT.as_secs()
    )]
    NotListed,
}

/// Where each kind's walk is, by CRD name.
#[derive(Debug, Default)]
pub struct Walks(Mutex<HashMap<String, Walk>>);

/// A resource: its namespace (none for a cluster-scoped kind) and name.
pub type Key = (Option<String>, String);

/// One kind's walk through its resources, and those it could not write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// The storage version it writes at.
    storage: String,
    /// The list's continue token for the next page.
    next: Option<String>,
    /// True once the list was walked to its end.
    walked: bool,
    /// Resources written again so far.
    written: u64,
    /// Resources that could not be written, and why (the first [`KEPT`]).
    failed: BTreeMap<Key, String>,
    /// Resources that could not be written, past those kept.
    unkept: u64,
}

/// What a step of a walk does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Writes the page of the list that starts at this continue token.
    Page(Option<String>),
    /// Writes again the resources that could not be written.
    Retry(Vec<Key>),
    /// Trims `storedVersions`: every resource was written.
    Trim,
}

impl Walk {
    /// A walk writing at `storage`, from the start.
    fn new(storage: &str) -> Self {
        Self {
            storage: storage.to_string(),
            ..Self::default()
        }
    }

    /// What its next step does.
    pub fn plan(&self) -> Plan {
        if !self.walked {
            Plan::Page(self.next.clone())
        } else if !self.failed.is_empty() {
            Plan::Retry(self.failed.keys().cloned().collect())
        } else {
            Plan::Trim
        }
    }

    /// Notes the page written (each resource's outcome) and where the next
    /// one starts (`None`: the list's end).
    pub fn paged(&mut self, outcomes: Vec<(Key, Result<(), String>)>, next: Option<String>) {
        self.record(outcomes);
        self.next = next;
        self.walked = self.next.is_none();
    }

    /// Notes the resources written again; a new walk follows when more
    /// failed than were kept and every kept one is written.
    pub fn retried(&mut self, outcomes: Vec<(Key, Result<(), String>)>) {
        self.record(outcomes);
        if self.failed.is_empty() && self.unkept > 0 {
            self.unkept = 0;
            self.walked = false;
            self.next = None;
        }
    }

    /// Starts the list again (its continue token expired).
    fn restart(&mut self) {
        self.next = None;
        self.walked = false;
    }

    fn record(&mut self, outcomes: Vec<(Key, Result<(), String>)>) {
        for (key, outcome) in outcomes {
            match outcome {
                Ok(()) => {
                    self.failed.remove(&key);
                    self.written += 1;
                }
                Err(why) if self.failed.len() < KEPT || self.failed.contains_key(&key) => {
                    self.failed.insert(key, why);
                }
                Err(_) => self.unkept += 1,
            }
        }
    }

    /// How many could not be written.
    pub fn failures(&self) -> u64 {
        self.failed.len() as u64 + self.unkept
    }

    /// The first [`NAMED`] that could not be written, each with why
    /// (`team-a/q2: spec.replicas: Required value`).
    pub fn named(&self) -> Vec<String> {
        (self.failed.iter().take(NAMED))
            .map(|(key, why)| format!("{}: {why}", key_name(key)))
            .collect()
    }
}

/// `namespace/name`, or the name of a cluster-scoped resource.
fn key_name((namespace, name): &Key) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.clone(),
    }
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
        /// Those that could not be, so far.
        failures: Failures,
    },
    /// Every resource was tried, and some could not be written: they are
    /// tried again at the next steps, and `storedVersions` is left.
    Incomplete {
        /// The versions still listed as stored, besides `to`.
        from: Vec<String>,
        /// The storage version.
        to: String,
        /// Resources written again.
        written: u64,
        /// Those that could not be.
        failures: Failures,
    },
}

/// Resources that could not be written again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failures {
    /// How many.
    pub count: u64,
    /// The first few, each with why (`team-a/q2: spec.replicas: Required value`).
    pub named: Vec<String>,
}

impl Failures {
    fn of(walk: &Walk) -> Self {
        Self {
            count: walk.failures(),
            named: walk.named(),
        }
    }

    /// The first few, each with why, and how many more.
    pub fn described(&self) -> String {
        let named = self.named.join("; ");
        match self.count.saturating_sub(self.named.len() as u64) {
            0 => named,
            more => format!("{named}; and {more} more"),
        }
    }
}

/// The versions the live `crd` still lists as stored besides `storage`,
/// once it stores `storage`: `None` when there is nothing to migrate (no
/// CRD, no older version stored, or the new CRD not applied yet).
pub fn pending(crd: Option<&CustomResourceDefinition>, storage: &str) -> Option<Vec<String>> {
    let crd = crd.filter(|crd| stores(crd, storage))?;
    Some(older_stored(crd, storage)).filter(|from| !from.is_empty())
}

/// One step of the walk of the kind `resource` whose CRD is `crd`, while
/// it still lists `from` as stored besides `storage`.
pub async fn walk(
    client: &Client,
    walks: &Walks,
    crd: &str,
    resource: &ApiResource,
    storage: &str,
    from: Vec<String>,
) -> Result<Storage, StepError> {
    let mut walk = (crate::sync::lock(&walks.0).get(crd).cloned())
        .filter(|w| w.storage == storage)
        .unwrap_or_else(|| Walk::new(storage));
    match walk.plan() {
        Plan::Page(token) => {
            let mut params = ListParams::default().limit(PAGE);
            params.continue_token = token;
            let all = Api::<DynamicObject>::all_with(client.clone(), resource);
            let listed = tokio::time::timeout(LIST_WAIT, all.list_metadata(&params)).await;
            match listed.map_err(|_| StepError::NotListed)? {
                Ok(page) => {
                    let keys = (page.items.iter())
                        .map(|item| (item.metadata.namespace.clone(), item.name_any()))
                        .collect();
                    let outcomes = rewrite_all(client, resource, keys).await;
                    walk.paged(outcomes, page.metadata.continue_.filter(|t| !t.is_empty()));
                }
                Err(kube::Error::Api(e)) if e.code == 410 => walk.restart(),
                Err(e) => return Err(e.into()),
            }
        }
        Plan::Retry(keys) => {
            let outcomes = rewrite_all(client, resource, keys).await;
            walk.retried(outcomes);
        }
        Plan::Trim => {
            trim(client, crd, storage).await?;
            crate::sync::lock(&walks.0).remove(crd);
            return Ok(Storage::Migrated {
                version: storage.to_string(),
                written: walk.written,
            });
        }
    }
    let (to, written, failures) = (storage.to_string(), walk.written, Failures::of(&walk));
    let state = match walk.plan() {
        Plan::Retry(_) => Storage::Incomplete {
            from,
            to,
            written,
            failures,
        },
        Plan::Page(_) | Plan::Trim => Storage::Migrating {
            from,
            to,
            written,
            failures,
        },
    };
    crate::sync::lock(&walks.0).insert(crd.to_string(), walk);
    Ok(state)
}

/// `Migrated`: nothing is left to write again at `storage` (with how many
/// the walk that ends here wrote).
pub fn done(walks: &Walks, crd: &str, storage: &str) -> Storage {
    let written = crate::sync::lock(&walks.0)
        .remove(crd)
        .map_or(0, |w| w.written);
    Storage::Migrated {
        version: storage.to_string(),
        written,
    }
}

/// Writes each of `keys` again, a few at once: each one's outcome.
async fn rewrite_all(
    client: &Client,
    resource: &ApiResource,
    keys: Vec<Key>,
) -> Vec<(Key, Result<(), String>)> {
    let mut outcomes = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(WRITES_AT_ONCE) {
        let writes = (chunk.iter()).map(|(namespace, name)| {
            rewrite(
                client.clone(),
                resource.clone(),
                namespace.clone(),
                name.clone(),
            )
        });
        let written = futures::future::join_all(writes).await;
        for (key, outcome) in chunk.iter().zip(written) {
            let outcome = outcome.map_err(|e| {
                // The webhook names the object already.
                let why = in_words(&e);
                let own = format!("{}: ", key_name(key));
                why.strip_prefix(&own).map_or(why.clone(), str::to_string)
            });
            outcomes.push((key.clone(), outcome));
        }
    }
    outcomes
}

/// Why a request failed, in words a kubectl user reads: the API server's
/// own message without what it wraps it in (`spec.replicas: Required
/// value`, not `Greeting.g.io "q2" is invalid: spec.replicas: Required
/// value`, nor the conversion webhook's failure as the API server relays
/// it), never kube's debug form of it.
pub fn in_words(error: &kube::Error) -> String {
    let kube::Error::Api(status) = error else {
        return crate::error_text::kube(error);
    };
    let mut message = status.message.as_str();
    message = (message.strip_prefix("Internal error occurred: ")).unwrap_or(message);
    if let Some((_, rest)) = message.split_once(" is invalid: ") {
        message = rest;
    }
    // A conversion webhook's failure, as the API server relays it (its
    // cache of the kind, a list or a write): what the webhook said.
    if let Some((_, relayed)) = message.split_once("conversion webhook for ")
        && let Some((_, said)) =
            (relayed.split_once(" returned failure: ")).or_else(|| relayed.split_once(" failed: "))
    {
        message = said;
    }
    match (message, status.reason.as_str()) {
        ("", "") => format!("refused ({})", status.code),
        ("", reason) => format!("{reason} ({})", status.code),
        (message, _) => message.to_string(),
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
        field_manager: Some(Engine::FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(crd, &params, &patch).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        (Some("team-a".into()), name.into())
    }

    fn failed(name: &str) -> (Key, Result<(), String>) {
        (key(name), Err("spec.replicas: Required value".into()))
    }

    fn written(name: &str) -> (Key, Result<(), String>) {
        (key(name), Ok(()))
    }

    #[test]
    fn a_walk_writes_every_page_whatever_failed_and_trims_only_when_none_is_left() {
        let mut walk = Walk::new("v2");
        assert_eq!(walk.plan(), Plan::Page(None));
        walk.paged(vec![written("q1"), failed("q2")], Some("next".into()));
        assert_eq!(
            walk.plan(),
            Plan::Page(Some("next".into())),
            "the walk goes on"
        );
        walk.paged(vec![written("q3"), failed("q4")], None);
        assert_eq!(walk.plan(), Plan::Retry(vec![key("q2"), key("q4")]));
        assert_eq!(walk.failures(), 2);
        assert_eq!(walk.written, 2);
        assert_eq!(
            walk.named(),
            [
                "team-a/q2: spec.replicas: Required value",
                "team-a/q4: spec.replicas: Required value"
            ]
        );
        walk.retried(vec![written("q2"), failed("q4")]);
        assert_eq!(walk.plan(), Plan::Retry(vec![key("q4")]), "tried again");
        walk.retried(vec![written("q4")]);
        assert_eq!(walk.plan(), Plan::Trim);
        assert_eq!((walk.failures(), walk.written), (0, 4));
    }

    #[test]
    fn more_failures_than_kept_are_counted_and_found_again_by_another_walk() {
        let mut walk = Walk::new("v2");
        let page: Vec<_> = (0..KEPT + 5).map(|i| failed(&format!("q{i:03}"))).collect();
        walk.paged(page, None);
        assert_eq!(walk.failures(), (KEPT + 5) as u64);
        assert_eq!(walk.named().len(), NAMED, "the first few named");
        let described = Failures::of(&walk).described();
        assert!(described.ends_with("; and 102 more"), "{described}");
        let Plan::Retry(kept) = walk.plan() else {
            panic!("{:?}", walk.plan())
        };
        assert_eq!(kept.len(), KEPT);
        walk.retried(kept.into_iter().map(|k| (k, Ok(()))).collect());
        assert_eq!(walk.plan(), Plan::Page(None), "a new walk finds the rest");
        walk.paged(vec![written("q100")], None);
        assert_eq!(walk.plan(), Plan::Trim);
    }

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let status = kube::core::Status::failure(message, reason).with_code(code);
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn the_api_servers_refusal_is_said_in_its_own_words() {
        let invalid = api_error(
            422,
            "Invalid",
            r#"Greeting.g.kd.test "q2" is invalid: spec.replicas: Required value"#,
        );
        assert_eq!(in_words(&invalid), "spec.replicas: Required value");
        let relayed = api_error(
            500,
            "InternalError",
            "Internal error occurred: conversion webhook for g.kd.test/v1, Kind=Greeting returned failure: team-a/q2: spec.count: expected integer, got string",
        );
        assert_eq!(
            in_words(&relayed),
            "team-a/q2: spec.count: expected integer, got string"
        );
        assert_eq!(
            in_words(&api_error(403, "Forbidden", "")),
            "Forbidden (403)"
        );
        assert!(!in_words(&invalid).contains("Status {"));
    }
}
