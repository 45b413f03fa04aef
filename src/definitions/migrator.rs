//! Which path migrates a kind's storage, and the API server's own.
//!
//! Kubernetes 1.37 serves `storagemigration.k8s.io/v1`: a
//! `StorageVersionMigration` names a resource, and kube-controller-manager
//! writes every object of it again at the storage version, then trims the
//! CRD's `storedVersions` itself. Where the API server serves it
//! (discovered once per start), the operator makes one for the kind, named
//! after the CRD and the storage version, carrying the definition's marker
//! and owned by the definition (the garbage collector deletes it with the
//! definition), and follows its conditions. Where it does not, or the
//! migration failed, did not start, or left `storedVersions` as it was,
//! the operator walks the resources itself ([`super::migration`]), which
//! names each one it cannot write.
//!
//! A failed migration: kube-controller-manager 1.37 trims `storedVersions`
//! when a migration ends, failed or not (`finishCRDMigration` in
//! pkg/controller/storageversionmigrator/migrationrunner.go), though what
//! it could not write is still stored at the older version. The operator
//! records those versions on the migration when it makes it, lists them
//! as stored again once its controller is done with the CRD (once, marked
//! on the migration), and its walk trims them only when every resource is
//! written.
//!
//! [`choose`], [`progress`] and [`restored`] are pure; [`step`] reads and
//! writes.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::sync::OnceCell;

use super::crds;
use super::migration::{self, StepError, Storage, Walks};
use super::resource::{self, MARKER_LABEL};

/// The API group of storage version migrations.
pub const GROUP: &str = "storagemigration.k8s.io";
/// Its version the operator uses: GA, served by default from Kubernetes
/// 1.37 (1.35 and 1.36 serve `v1beta1` only when enabled).
pub const VERSION: &str = "v1";
/// How long a migration may wait for kube-controller-manager to start it
/// before the operator walks the resources itself.
pub const START_WAIT: Duration = Duration::from_secs(120);
/// How much of what the API server says of its migration a condition
/// quotes.
const SAID_MAX: usize = 512;
/// The annotation on a migration the operator made: the versions the CRD
/// listed as stored besides the storage version when it was made
/// (comma-separated).
pub const STORED_ANNOTATION: &str = "kustomize-operator.io/stored-versions";
/// The annotation on a failed migration once the operator listed those
/// versions as stored again (`"true"`).
pub const RESTORED_ANNOTATION: &str = "kustomize-operator.io/stored-versions-restored";

/// Where the API serves storage version migrations.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "StorageVersionMigration".into(),
        plural: "storageversionmigrations".into(),
    }
}

/// Whether the API server serves `storagemigration.k8s.io/v1`, asked of
/// discovery once per start (a server that gains it later is used after
/// the operator's next start).
#[derive(Debug, Default)]
pub struct Migrator {
    served: OnceCell<bool>,
}

impl Migrator {
    /// True when the API server serves storage version migrations. A
    /// failed discovery is asked again at the next step (no path is
    /// chosen on a guess).
    pub async fn served(&self, client: &Client) -> Result<bool, kube::Error> {
        let asked = self.served.get_or_try_init(|| discover(client)).await;
        asked.copied()
    }
}

async fn discover(client: &Client) -> Result<bool, kube::Error> {
    let plural = api_resource().plural;
    match client
        .list_api_group_resources(&api_resource().api_version)
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The name of the migration of the CRD `crd` to `storage`
/// (`greetings.g.example-v2`); a CRD's name near the limit is cut and a
/// digest of it keeps the name its own.
pub fn name_of(crd: &str, storage: &str) -> String {
    const MAX: usize = 253;
    let name = format!("{crd}-{storage}");
    if name.len() <= MAX {
        return name;
    }
    let digest = hex::encode(&sha2::Sha256::digest(name.as_bytes())[..6]);
    let keep = MAX - storage.len() - digest.len() - 2;
    let mut end = keep.min(crd.len());
    while !crd.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}-{digest}-{storage}",
        crd[..end].trim_end_matches(['.', '-'])
    )
}

/// Where the API server's migration stands, read from its conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// kube-controller-manager has not started it yet.
    Waiting,
    /// … and did not within [`START_WAIT`].
    NotStarted,
    /// It runs; what it says (`The migration is running, 3/107 objects
    /// not yet migrated`).
    Running(String),
    /// It wrote every resource again.
    Succeeded {
        /// Its controller is done with the CRD: it trims `storedVersions`,
        /// then marks the migration no longer running.
        settled: bool,
    },
    /// It failed (its message names at most the first resource it could
    /// not write).
    Failed {
        /// Its controller is done with the CRD (and trimmed
        /// `storedVersions` all the same).
        settled: bool,
    },
}

/// One condition of a migration, as much as the operator reads.
#[derive(Debug, Deserialize)]
struct MigrationCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    message: String,
}

/// Where the migration whose `status` this is stands, `age` after it was
/// made. A status of the wrong shape reads as no condition.
pub fn progress(status: &Value, age: Duration) -> Progress {
    let conditions: Vec<MigrationCondition> =
        serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
    let condition = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
    let is_true = |type_: &str| condition(type_).is_some_and(|c| c.status == "True");
    let settled = !is_true("Running");
    if is_true("Failed") {
        Progress::Failed { settled }
    } else if is_true("Succeeded") {
        Progress::Succeeded { settled }
    } else if let Some(running) = condition("Running").filter(|c| c.status == "True") {
        Progress::Running(crate::text::truncate(&running.message, SAID_MAX))
    } else if age > START_WAIT {
        Progress::NotStarted
    } else {
        Progress::Waiting
    }
}

/// What the operator found of the migration it would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// None of that name.
    Absent,
    /// Its own, for this kind, and where it stands.
    Ours(Progress),
    /// One of that name without the definition's marker, or for another
    /// resource: the operator leaves it alone.
    NotOurs,
    /// The operator may not read or make migrations (what the API server
    /// said).
    Forbidden(String),
}

/// Why the operator walks the resources itself where the API server
/// serves migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The migration's name.
    pub name: String,
    /// Why.
    pub why: FallbackReason,
}

/// Why the operator walks the resources itself, in [`Fallback`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FallbackReason {
    /// The migration failed.
    Failed,
    /// kube-controller-manager did not start it within [`START_WAIT`].
    NotStarted,
    /// It succeeded but left `storedVersions` (the CRD changed while it
    /// ran: its controller then trims nothing).
    NotTrimmed,
    /// A migration of that name exists that the operator did not make.
    NotOurs,
    /// The operator may not read or make migrations.
    Forbidden(String),
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = &self.name;
        match &self.why {
            FallbackReason::Failed => {
                write!(f, "the API server's StorageVersionMigration {name} failed")
            }
            FallbackReason::NotStarted => write!(
                f,
                "the API server's StorageVersionMigration {name} did not start within {} s: kube-controller-manager runs no storage-version-migrator-controller, or another migration of the kind holds it",
                START_WAIT.as_secs()
            ),
            FallbackReason::NotTrimmed => write!(
                f,
                "the API server's StorageVersionMigration {name} succeeded but left storedVersions (the CRD changed while it ran)"
            ),
            FallbackReason::NotOurs => write!(
                f,
                "a StorageVersionMigration {name} exists that the operator did not make"
            ),
            FallbackReason::Forbidden(why) => write!(
                f,
                "the operator may not make the StorageVersionMigration {name}: {why}"
            ),
        }
    }
}

/// Which path a step of the migration takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Make the API server's migration, then follow it.
    Make,
    /// Follow the API server's migration.
    Follow(Progress),
    /// Walk the resources (after the API server's migration, if it was
    /// tried).
    Walk(Option<Fallback>),
}

/// The path for the migration `name`: the API server's where it serves
/// migrations (`served`) and the one `found` can still do the work, the
/// operator's walk otherwise.
pub fn choose(served: bool, name: &str, found: &Found) -> Choice {
    let fallback = |why| {
        Choice::Walk(Some(Fallback {
            name: name.to_string(),
            why,
        }))
    };
    if !served {
        return Choice::Walk(None);
    }
    match found {
        Found::Absent => Choice::Make,
        Found::NotOurs => fallback(FallbackReason::NotOurs),
        Found::Forbidden(why) => fallback(FallbackReason::Forbidden(why.clone())),
        Found::Ours(Progress::Failed { settled: true }) => fallback(FallbackReason::Failed),
        Found::Ours(Progress::NotStarted) => fallback(FallbackReason::NotStarted),
        Found::Ours(Progress::Succeeded { settled: true }) => fallback(FallbackReason::NotTrimmed),
        Found::Ours(progress) => Choice::Follow(progress.clone()),
    }
}

/// Where a kind's storage stands after a step, and who writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A step of the operator's walk, taken after `after` where the API
    /// server's migration was tried.
    Walked {
        /// Where the walk stands.
        storage: Storage,
        /// Why the API server's migration does not do it.
        after: Option<Fallback>,
    },
    /// The API server's migration `name` wrote every resource again at
    /// `version`, and `storedVersions` says so.
    Migrated {
        /// The migration.
        name: String,
        /// The storage version.
        version: String,
    },
    /// The API server's migration `name` runs or is about to.
    Migrating {
        /// The migration.
        name: String,
        /// The versions still listed as stored, besides `to`.
        from: Vec<String>,
        /// The storage version.
        to: String,
        /// Where it stands.
        progress: Progress,
    },
}

/// What a step of a definition's storage migration reads and keeps.
pub struct Subject<'a> {
    /// The definition.
    pub definition: &'a DynamicObject,
    /// Its kind's CRD.
    pub crd: &'a str,
    /// Its kind's resource.
    pub resource: &'a ApiResource,
    /// The storage version.
    pub storage: &'a str,
}

/// One step of the storage migration of `subject`'s kind: the API
/// server's migration made or followed where it serves them, else (or
/// once it cannot do the work) one step of the operator's walk.
pub async fn step(
    client: &Client,
    migrator: &Migrator,
    walks: &Walks,
    subject: &Subject<'_>,
) -> Result<Outcome, StepError> {
    let Subject {
        crd,
        resource,
        storage,
        ..
    } = *subject;
    let name = name_of(crd, storage);
    let served = migrator.served(client).await?;
    // The migration before the CRD: its controller trims storedVersions
    // before it marks it no longer running.
    let (found, lost) = match served {
        true => find(client, &name, subject).await?,
        false => (Found::Absent, None),
    };
    if let Some(lost) = lost {
        restore(client, crd, &lost).await?;
        mark_restored(client, &name).await?;
    }
    let live: Option<CustomResourceDefinition> = crds::live(client, crd).await?;
    let Some(from) = migration::pending(live.as_ref(), storage) else {
        if let Found::Ours(Progress::Succeeded { .. }) = found {
            let version = storage.to_string();
            return Ok(Outcome::Migrated { name, version });
        }
        let storage = migration::done(walks, crd, storage);
        return Ok(Outcome::Walked {
            storage,
            after: None,
        });
    };
    let path = match choose(served, &name, &found) {
        Choice::Make => make(client, &name, subject, &from).await?,
        Choice::Follow(progress) => Ok(progress),
        Choice::Walk(after) => Err(after),
    };
    match path {
        Ok(progress) => Ok(Outcome::Migrating {
            name,
            from,
            to: storage.to_string(),
            progress,
        }),
        Err(after) => {
            let storage = migration::walk(client, walks, crd, resource, storage, from).await?;
            Ok(Outcome::Walked { storage, after })
        }
    }
}

/// The migration `name`, if it exists, and whether it is the operator's
/// for `subject`'s kind; with the versions to list as stored again once
/// it failed (those it recorded, unless listed again already).
async fn find(
    client: &Client,
    name: &str,
    subject: &Subject<'_>,
) -> Result<(Found, Option<Vec<String>>), StepError> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &api_resource());
    let found = match api.get_opt(name).await {
        Ok(found) => found,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok((Found::Forbidden(e.message), None));
        }
        Err(e) => return Err(e.into()),
    };
    let Some(migration) = found else {
        return Ok((Found::Absent, None));
    };
    let marked = migration.labels().get(MARKER_LABEL) == Some(&subject.definition.name_any());
    if !marked || !migrates(&migration, subject.resource) {
        return Ok((Found::NotOurs, None));
    }
    let made = migration.creation_timestamp().map(|t| t.0);
    let age = made.map_or(Duration::ZERO, |made| {
        let age = jiff::Timestamp::now().duration_since(made);
        Duration::try_from(age).unwrap_or(Duration::ZERO)
    });
    let progress = progress(&migration.data["status"], age);
    let lost = lost(&migration, &progress);
    Ok((Found::Ours(progress), lost))
}

/// The versions `migration` (where `progress` says it stands) recorded as
/// stored, to list as stored again: once it failed and its controller
/// trimmed them, unless the operator did so already.
fn lost(migration: &DynamicObject, progress: &Progress) -> Option<Vec<String>> {
    let annotations = migration.annotations();
    let restored = annotations
        .get(RESTORED_ANNOTATION)
        .is_some_and(|v| v == "true");
    (*progress == Progress::Failed { settled: true } && !restored).then(|| {
        let recorded = annotations.get(STORED_ANNOTATION);
        (recorded.into_iter().flat_map(|v| v.split(',')))
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect()
    })
}

/// The CRD's `storedVersions` (`stored`) with the versions `recorded`
/// listed again, those it still declares (`declared`) and lacks: `None`
/// when none is missing.
pub fn restored(
    stored: &[String],
    recorded: &[String],
    declared: &[String],
) -> Option<Vec<String>> {
    let missing = (recorded.iter())
        .filter(|v| declared.contains(v) && !stored.contains(v))
        .cloned();
    let listed: Vec<String> = missing.chain(stored.iter().cloned()).collect();
    (listed.len() > stored.len()).then_some(listed)
}

/// Lists the versions `lost` as stored again in the CRD `crd` (a failed
/// migration's controller trimmed them), unless the CRD changed meanwhile.
async fn restore(client: &Client, crd: &str, lost: &[String]) -> Result<(), kube::Error> {
    let Some(live) = crds::live(client, crd).await? else {
        return Ok(());
    };
    let stored = (live.status.as_ref().and_then(|s| s.stored_versions.clone())).unwrap_or_default();
    let declared: Vec<String> = live.spec.versions.iter().map(|v| v.name.clone()).collect();
    let Some(listed) = restored(&stored, lost, &declared) else {
        return Ok(());
    };
    tracing::info!(crd, versions = %lost.join(", "), "the API server's storage version migration failed and trimmed storedVersions: listed as stored again");
    let patch = Patch::Merge(json!({
        "metadata": {"resourceVersion": live.resource_version()},
        "status": {"storedVersions": listed},
    }));
    let params = PatchParams {
        field_manager: Some(crate::engine::host::Engine::FIELD_MANAGER.into()),
        ..Default::default()
    };
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch_status(crd, &params, &patch).await.map(|_| ())
}

/// Marks the migration `name`: what it trimmed is listed as stored again.
async fn mark_restored(client: &Client, name: &str) -> Result<(), kube::Error> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &api_resource());
    let patch = Patch::Merge(json!({"metadata": {"annotations": {RESTORED_ANNOTATION: "true"}}}));
    api.patch_metadata(name, &PatchParams::default(), &patch)
        .await
        .map(|_| ())
}

/// True when `migration` migrates `resource`.
fn migrates(migration: &DynamicObject, resource: &ApiResource) -> bool {
    let migrated = &migration.data["spec"]["resource"];
    migrated["group"] == resource.group.as_str() && migrated["resource"] == resource.plural.as_str()
}

/// Makes the migration `name` of `subject`'s kind, after deleting the
/// definition's finished migrations of it to other versions: where it
/// stands, or why the operator walks instead.
async fn make(
    client: &Client,
    name: &str,
    subject: &Subject<'_>,
    from: &[String],
) -> Result<Result<Progress, Option<Fallback>>, StepError> {
    clear_finished(client, name, subject).await;
    let api = Api::<DynamicObject>::all_with(client.clone(), &api_resource());
    let migration = migration_object(name, subject, from);
    match api.create(&PostParams::default(), &migration).await {
        Ok(_) => Ok(Ok(Progress::Waiting)),
        // Made meanwhile (by another replica): read at the next step.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Ok(Progress::Waiting)),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(Err(Some(Fallback {
            name: name.to_string(),
            why: FallbackReason::Forbidden(e.message),
        }))),
        Err(e) => Err(e.into()),
    }
}

/// The migration `name` of `subject`'s kind: the definition's marker,
/// owned by it, and the versions stored `from`.
fn migration_object(name: &str, subject: &Subject<'_>, from: &[String]) -> DynamicObject {
    let definition = subject.definition;
    let owner = json!({
        "apiVersion": resource::api_resource().api_version,
        "kind": resource::KIND,
        "name": definition.name_any(),
        "uid": definition.uid().unwrap_or_default(),
    });
    let mut migration = DynamicObject::new(name, &api_resource()).data(json!({
        "spec": {"resource": {
            "group": subject.resource.group,
            "resource": subject.resource.plural,
        }},
    }));
    migration
        .labels_mut()
        .insert(MARKER_LABEL.into(), definition.name_any());
    migration
        .annotations_mut()
        .insert(STORED_ANNOTATION.into(), from.join(","));
    migration.metadata.owner_references = serde_json::from_value(json!([owner])).ok();
    migration
}

/// Deletes the definition's finished migrations of `subject`'s kind but
/// `name`: they were for another storage version, and one left would read
/// as done when the kind comes back to it. What a failed one trimmed is
/// listed as stored again first. Best effort.
async fn clear_finished(client: &Client, name: &str, subject: &Subject<'_>) {
    let api = Api::<DynamicObject>::all_with(client.clone(), &api_resource());
    let selector = format!("{MARKER_LABEL}={}", subject.definition.name_any());
    let listed = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed,
        Err(e) => {
            let error = crate::error_text::kube(&e);
            tracing::debug!(%error, "cannot list the definition's storage version migrations");
            return;
        }
    };
    for migration in listed.items {
        let progress = progress(&migration.data["status"], Duration::ZERO);
        let finished = matches!(
            progress,
            Progress::Failed { settled: true } | Progress::Succeeded { settled: true }
        );
        let finished_name = migration.name_any();
        if !migrates(&migration, subject.resource) || !finished || finished_name == name {
            continue;
        }
        let restored = match lost(&migration, &progress) {
            Some(lost) => restore(client, subject.crd, &lost).await,
            None => Ok(()),
        };
        let deleted = match restored {
            Ok(()) => api
                .delete(&finished_name, &DeleteParams::default())
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = deleted {
            let error = crate::error_text::kube(&e);
            tracing::debug!(migration = %finished_name, %error, "cannot clear a finished storage version migration");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(conditions: Value) -> Value {
        json!({"conditions": conditions})
    }

    fn condition(type_: &str, status: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": "R", "message": message})
    }

    const YOUNG: Duration = Duration::from_secs(5);

    #[test]
    fn the_migrations_conditions_say_where_it_stands() {
        assert_eq!(progress(&json!({}), YOUNG), Progress::Waiting);
        assert_eq!(
            progress(&json!({}), START_WAIT + YOUNG),
            Progress::NotStarted
        );
        let running = condition(
            "Running",
            "True",
            "The migration is running, 3/107 objects not yet migrated",
        );
        assert_eq!(
            progress(&status(json!([running])), START_WAIT + YOUNG),
            Progress::Running("The migration is running, 3/107 objects not yet migrated".into()),
            "running, however long"
        );
        let succeeded = condition("Succeeded", "True", "Migration completed");
        assert_eq!(
            progress(&status(json!([running, succeeded])), YOUNG),
            Progress::Succeeded { settled: false },
            "its controller is not done with the CRD yet"
        );
        let completed = condition("Running", "False", "Migration completed");
        assert_eq!(
            progress(&status(json!([completed, succeeded])), YOUNG),
            Progress::Succeeded { settled: true }
        );
        let failed = condition("Failed", "True", "1/2 not yet migrated");
        assert_eq!(
            progress(&status(json!([running, failed])), YOUNG),
            Progress::Failed { settled: false }
        );
        assert_eq!(
            progress(&status(json!([completed, failed])), YOUNG),
            Progress::Failed { settled: true }
        );
        assert_eq!(
            progress(&status(json!("not a list")), YOUNG),
            Progress::Waiting,
            "a status of the wrong shape reads as none"
        );
        let long = condition("Running", "True", &"x".repeat(10_000));
        let Progress::Running(said) = progress(&status(json!([long])), YOUNG) else {
            panic!("running")
        };
        assert!(said.len() <= SAID_MAX, "{}", said.len());
    }

    #[test]
    fn the_api_servers_migration_is_used_where_it_is_served_and_can_do_the_work() {
        let name = "greetings.g.example-v2";
        let walk = |why| {
            Choice::Walk(Some(Fallback {
                name: name.into(),
                why,
            }))
        };
        for found in [
            Found::Absent,
            Found::Ours(Progress::Waiting),
            Found::NotOurs,
        ] {
            assert_eq!(
                choose(false, name, &found),
                Choice::Walk(None),
                "not served"
            );
        }
        assert_eq!(choose(true, name, &Found::Absent), Choice::Make);
        for progress in [
            Progress::Waiting,
            Progress::Running("running".into()),
            Progress::Succeeded { settled: false },
            Progress::Failed { settled: false },
        ] {
            let found = Found::Ours(progress.clone());
            assert_eq!(choose(true, name, &found), Choice::Follow(progress));
        }
        let cases = [
            (
                Found::Ours(Progress::Failed { settled: true }),
                FallbackReason::Failed,
            ),
            (
                Found::Ours(Progress::NotStarted),
                FallbackReason::NotStarted,
            ),
            (
                Found::Ours(Progress::Succeeded { settled: true }),
                FallbackReason::NotTrimmed,
            ),
            (Found::NotOurs, FallbackReason::NotOurs),
            (
                Found::Forbidden("no".into()),
                FallbackReason::Forbidden("no".into()),
            ),
        ];
        for (found, why) in cases {
            assert_eq!(choose(true, name, &found), walk(why), "{found:?}");
        }
    }

    fn versions(names: &[&str]) -> Vec<String> {
        names.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn what_a_failed_migration_trimmed_is_listed_as_stored_again() {
        let declared = versions(&["v2", "v1", "v0"]);
        assert_eq!(
            restored(&versions(&["v2"]), &versions(&["v1"]), &declared),
            Some(versions(&["v1", "v2"]))
        );
        assert_eq!(
            restored(&versions(&["v1", "v2"]), &versions(&["v1"]), &declared),
            None,
            "nothing missing"
        );
        assert_eq!(
            restored(&versions(&["v2"]), &versions(&["v1", "gone"]), &declared),
            Some(versions(&["v1", "v2"])),
            "a version no longer declared cannot be listed"
        );
        assert_eq!(restored(&versions(&["v2"]), &[], &declared), None);
    }

    #[test]
    fn a_migration_is_named_after_the_crd_and_the_storage_version() {
        assert_eq!(
            name_of("greetings.g.example", "v2"),
            "greetings.g.example-v2"
        );
        let crd = format!("greetings.{}.example", "g".repeat(240));
        let name = name_of(&crd, "v2beta1");
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.starts_with("greetings.ggg") && name.ends_with("-v2beta1"));
        assert_ne!(name, name_of(&format!("{crd}x"), "v2beta1"));
    }
}
