//! `KindDefinition`s as a kind of the engine's one runtime: their own
//! reconcile, finalizer and status, plugged in as a `Reconciler`. One
//! reconcile of a definition:
//!
//! 1. its finalizer, so its kind is never left unserved while resources
//!    carry the kind's finalizer;
//! 2. a new generation is checked ([`super::generation`]); if it passes,
//!    its CRD is applied and waited for, and its handler replaces the
//!    one serving the generation before; if not, the generation before
//!    keeps serving and `Accepted=False` says why;
//! 3. the rights the kind needs are reviewed (`RightsGranted`), the
//!    resources of the kind counted, and the status written once.
//!
//! Every failure stays inside its definition: it is a condition and an
//! event, never an error that stops another kind or the operator.

use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::{Checked, DefinitionContext, DefinitionError, NAMES_SHOWN};
use super::crds::{self, CrdError};
use super::generation::{self, Generation, Rejection};
use super::migration::{self, Storage};
use super::migrator::{self, Fallback, Outcome, Progress};
use super::resource::{self, ConditionType, Reason, Status};
use super::writes::{count, event, status_of, write_status};
use super::{deletion, following, planning, progress, rights, rollout};
use crate::engine::host::{Reconciler, Runtime};
use crate::kind::{PlannedEvent, Watching};
use crate::kinds::declared::{DeclaredObject, rbac};
use kube::runtime::finalizer::Event as FinalizerEvent;

/// How soon a definition is looked at again when all is well (rights
/// revoked since, the count of new resources, a CRD changed by hand; a
/// deleted resource is counted at once).
const RECHECK: Duration = Duration::from_secs(120);
/// … and when something is not right yet.
const RECHECK_SOON: Duration = Duration::from_secs(10);
/// How soon the next page of a storage migration is written.
const MIGRATION_STEP: Duration = Duration::from_millis(200);
/// How soon the API server's storage migration is looked at again.
const MIGRATION_FOLLOW: Duration = Duration::from_secs(2);
/// At most this many definitions are reconciled at once. Each reconcile
/// in flight holds its CRD, its checks and the API's answers; hundreds of
/// definitions applied together, all in flight, leave the allocator's
/// pages pinned by the few objects that stay (200 definitions: 80 KiB
/// each idle when all ran at once, 59 KiB with 32 at a time, as soon
/// Serving: the API server establishing their CRDs is the bound).
const DEFINITIONS_AT_ONCE: usize = 32;

/// The name the runtime serves KindDefinitions under: no kind is named
/// so (a kind's name is lowercase).
const KIND: &str = "KindDefinition";

/// The KindDefinitions as the runtime serves them: one more kind, its
/// reconcile this module's. The runtime's store holds each definition as
/// compact JSON text beside its metadata (a `DeclaredObject`: about the
/// size of its JSON, where a `DynamicObject` takes several times that); a
/// reconcile reads it whole.
struct Definitions {
    ctx: Arc<DefinitionContext>,
    selector: Option<String>,
    /// Names of definitions to reconcile now, until the runtime takes them.
    nudged: Mutex<Option<mpsc::Receiver<String>>>,
}

/// Serves the definitions matching `selector` in `runtime` (which stops
/// their kinds when it stops); a name received on `nudged` reconciles
/// that definition. Under automatic sharding, a follower stops serving
/// the kind of a definition that is gone, until `shutdown` is cancelled.
pub(super) async fn run(
    ctx: Arc<DefinitionContext>,
    runtime: &Runtime,
    selector: Option<String>,
    nudged: mpsc::Receiver<String>,
    shutdown: CancellationToken,
) {
    tracing::info!(
        selector = selector.as_deref().unwrap_or("<all>"),
        "serving KindDefinitions"
    );
    if ctx.engine.settings().share.is_some() {
        tokio::spawn(following::forget_deleted(
            ctx.clone(),
            selector.clone(),
            shutdown,
        ));
    }
    let definitions = Definitions {
        ctx,
        selector,
        nudged: Mutex::new(Some(nudged)),
    };
    runtime.serve(KIND, definitions, None).await;
}

impl Reconciler for Definitions {
    type Resource = DeclaredObject;

    fn watched(&self) -> (Api<DeclaredObject>, watcher::Config) {
        let api =
            Api::<DeclaredObject>::all_with(self.ctx.client.clone(), &resource::api_resource());
        let config = watcher::Config::default();
        match &self.selector {
            Some(selector) => (api, config.labels(selector)),
            None => (api, config),
        }
    }

    fn whole_on_every_replica(&self) -> bool {
        // Which replica writes a definition is chosen per reconcile; every
        // other follows it.
        true
    }

    fn at_once(&self) -> Option<usize> {
        Some(DEFINITIONS_AT_ONCE)
    }

    async fn reconcile(&self, held: Arc<DeclaredObject>) -> Action {
        let def = Arc::new(held.to_dynamic());
        match reconcile(def.clone(), self.ctx.clone()).await {
            Ok(action) => action,
            Err(e) => error_policy(&def, &e),
        }
    }

    fn nudges(
        &self,
        watching: Watching<DeclaredObject>,
    ) -> Vec<BoxStream<'static, ObjectRef<DeclaredObject>>> {
        let mut nudges = Vec::new();
        if let Some(nudged) = crate::sync::lock(&self.nudged).take() {
            let named = futures::stream::unfold(nudged, |mut nudged| async move {
                let name = nudged.recv().await?;
                let def = ObjectRef::new_with(&name, resource::api_resource());
                Some((def, nudged))
            });
            nudges.push(named.boxed());
        }
        if let Some(share) = self.ctx.engine.settings().share.clone() {
            // Which definitions this replica writes changes with its share:
            // each change reconciles every definition held.
            let changes = futures::stream::unfold(share.subscribe(), |mut held| async move {
                held.changed().await.ok()?;
                Some(((), held))
            });
            let every = changes.flat_map(move |()| {
                let held = watching.resources().into_iter();
                let refs =
                    held.map(|def| ObjectRef::new_with(&def.name_any(), resource::api_resource()));
                futures::stream::iter(refs.collect::<Vec<_>>())
            });
            nudges.push(every.boxed());
        }
        nudges
    }

    async fn finish(&self, _: Vec<Arc<DeclaredObject>>) {
        // The kinds served from definitions stop with them.
        self.ctx.serving.stop_all().await;
    }
}

type FinalizerError = kube::runtime::finalizer::Error<DefinitionError>;

/// What follows a reconcile that failed.
fn error_policy(def: &DynamicObject, error: &FinalizerError) -> Action {
    if let kube::runtime::finalizer::Error::CleanupFailed(DefinitionError::Waiting) = error {
        // Said in its status and an event: resources of the kind remain.
        return Action::requeue(deletion::DELETION_RECHECK);
    }
    if let kube::runtime::finalizer::Error::CleanupFailed(DefinitionError::Orphaning) = error {
        return Action::requeue(deletion::CRD_RECHECK);
    }
    if let kube::runtime::finalizer::Error::CleanupFailed(DefinitionError::CrdTerminating(crd)) =
        error
    {
        tracing::debug!(definition = %def.name_any(), crd, "waiting for the CRD to be removed");
        return Action::requeue(deletion::CRD_RECHECK);
    }
    let error = crate::error_text::finalizer(error);
    tracing::warn!(definition = %def.name_any(), %error, "reconciling a KindDefinition failed");
    Action::requeue(RECHECK_SOON)
}

/// One reconcile, under the engine's finalizer state machine (as every
/// resource's): serve the definition, or, once it is being deleted,
/// remove what it served; the finalizer goes only after that succeeded.
async fn reconcile(
    def: Arc<DynamicObject>,
    ctx: Arc<DefinitionContext>,
) -> Result<Action, FinalizerError> {
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource::api_resource());
    let span = tracing::info_span!(
        "definition",
        name = %def.name_any(),
        generation = def.metadata.generation
    );
    let share = ctx.engine.settings().share.clone();
    let uid = def.uid().unwrap_or_default();
    let _writing = match &share {
        Some(share) => match share.enter(&uid) {
            Some(entered) => Some(entered),
            None => return Ok(following::follow(&def, &ctx).instrument(span).await),
        },
        None => None,
    };
    (ctx.engine)
        .guarded(&api, resource::FINALIZER, def, |event| async {
            match event {
                FinalizerEvent::Apply(def) => serve(&def, &ctx).await,
                FinalizerEvent::Cleanup(def) => deletion::remove(&def, &ctx).await,
            }
        })
        .instrument(span)
        .await
}

/// Checks and serves the definition, reviews its rights, counts its
/// resources, and writes its status once.
async fn serve(def: &DynamicObject, ctx: &DefinitionContext) -> Result<Action, DefinitionError> {
    let before = status_of(def);
    let mut status = before.clone();
    status.observed_generation = def.metadata.generation;
    accept(def, ctx, &mut status).await;
    let served = ctx.serving.current(&def.name_any());
    serving_condition(ctx, def, served.as_ref(), &mut status);
    let mut migrating = Next::Nothing;
    let mut stepping = None;
    if let Some(generation) = &served {
        rights_condition(ctx, &def.name_any(), generation, &mut status).await;
        // Not in the reconcile that starts serving a generation: its
        // status is written first, and the walk goes on from the next.
        let settled = before.serving_generation == Some(generation.number);
        if settled && status.is_true(ConditionType::CrdEstablished) {
            migrating = storage_condition(ctx, def, generation, &mut status).await;
        } else if !settled {
            migrating = Next::Step;
        }
        stepping = progress::look(ctx, def, &mut status).await;
        rollout::status(ctx, &def.name_any(), &mut status, def.metadata.generation).await;
        status.resources = match ctx.serving.resources(&def.name_any()) {
            Some(counted) => Some(counted),
            None => {
                let counted = count(&ctx.client, &generation.kind.resource);
                (tokio::time::timeout(migration::LIST_WAIT, counted).await)
                    .ok()
                    .and_then(Result::ok)
                    .map(|names| names.len() as u64)
            }
        };
    }
    let all_well = [
        ConditionType::Accepted,
        ConditionType::CrdEstablished,
        ConditionType::RightsGranted,
        ConditionType::Serving,
    ]
    .iter()
    .all(|&c| status.is_true(c));
    write_status(ctx, def, &before, &status).await?;
    match migrating {
        Next::Step => return Ok(Action::requeue(MIGRATION_STEP)),
        Next::Follow => return Ok(Action::requeue(MIGRATION_FOLLOW)),
        Next::Retry => return Ok(Action::requeue(RECHECK_SOON)),
        Next::Nothing => {}
    }
    let recheck = if all_well { RECHECK } else { RECHECK_SOON };
    Ok(Action::requeue(
        stepping.map_or(recheck, |s| s.min(recheck)),
    ))
}

/// Checks the definition's generation, unless it is the one served, and
/// serves it if it passes; keeps the CRD of what is served applied.
async fn accept(def: &DynamicObject, ctx: &DefinitionContext, status: &mut Status) {
    let name = def.name_any();
    let number = def.metadata.generation;
    let served = ctx.serving.current(&name);
    if let Some(generation) = served.as_ref().filter(|g| Some(g.number) == number) {
        // Said again on every reconcile: the definition a reconcile is
        // given may be older than the status the one before wrote (its
        // own finalizer patch, seen before its status write), and the
        // status written replaces the conditions as a whole.
        accepted(status, generation, number);
        planning::restate(ctx, def, generation, status);
        // Served as another replica wrote it, until this one writes it.
        let again = !ctx.serving.running(&name) || ctx.serving.follows(&name);
        if ensure_crd(ctx, &name, generation, status).await && again {
            ctx.serving.serve_again(&name).await;
        }
        return;
    }
    match check_once(def, ctx, served.as_ref()).await {
        Err(rejection) => {
            let message = match &served {
                Some(g) => format!("{rejection} (generation {} keeps serving)", g.number),
                None => rejection.to_string(),
            };
            let told = status
                .condition(ConditionType::Accepted)
                .is_some_and(|c| c.message == message && c.observed_generation == number);
            status.set(
                ConditionType::Accepted,
                false,
                rejection.reason(),
                &message,
                number,
            );
            if !told {
                event(ctx, def, PlannedEvent::warning("Rejected", message.clone())).await;
            }
            if let Some(generation) = &served {
                ensure_crd(ctx, &name, generation, status).await;
            }
        }
        Ok(generation) => {
            let verdict = planning::plan(ctx, def, &generation, status).await;
            if let planning::Verdict::Wait(why) = verdict {
                waits(status, served.as_ref(), &why, number);
                if let Some(generation) = &served {
                    ensure_crd(ctx, &name, generation, status).await;
                }
                return;
            }
            accepted(status, &generation, number);
            if ensure_crd(ctx, &name, &generation, status).await {
                let note = format!(
                    "serving {} ({}) from generation {}",
                    generation.kind.resource.kind,
                    generation.kind.resource.api_version,
                    generation.number
                );
                match rollout::serve(ctx, def, generation).await {
                    Ok(()) => event(ctx, def, PlannedEvent::normal("Serving", note)).await,
                    Err(refused) => not_served(ctx, def, status, &refused, number).await,
                }
            }
        }
    }
}

/// `Accepted=False`: the generation is valid but its rollout's stable
/// revision cannot serve (not kept, refused at restore, withdrawn); what
/// served before goes on serving.
async fn not_served(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    status: &mut Status,
    refused: &rollout::NotServed,
    number: Option<i64>,
) {
    let message = refused.to_string();
    let told = status
        .condition(ConditionType::Accepted)
        .is_some_and(|c| c.message == message && c.observed_generation == number);
    let reason = Reason::of_rollout(&refused.error);
    status.set(ConditionType::Accepted, false, reason, &message, number);
    if !told {
        event(ctx, def, PlannedEvent::warning("Rejected", message.clone())).await;
    }
}

/// `Accepted=False`, `PlanFailed`: the generation is valid, but its plan
/// fails and `spec.rollout.plan` is `Wait`; what served goes on serving.
fn waits(status: &mut Status, served: Option<&Generation>, why: &str, number: Option<i64>) {
    let keeps = match served {
        Some(g) => format!("; generation {} keeps serving", g.number),
        None => String::new(),
    };
    let message = format!("{why}: it waits (spec.rollout.plan: Wait){keeps}");
    status.set(
        ConditionType::Accepted,
        false,
        Reason::PlanFailed,
        &message,
        number,
    );
}

/// `Accepted=True`: `generation` passed every check.
fn accepted(status: &mut Status, generation: &Generation, number: Option<i64>) {
    let message = format!("generation {} is valid", generation.number);
    status.set(
        ConditionType::Accepted,
        true,
        Reason::Valid,
        &message,
        number,
    );
}

/// [`check`], unless this generation was rejected already for a reason
/// only a change of the definition lifts (a clash or a base that failed
/// to build may pass on a later look).
async fn check_once(
    def: &DynamicObject,
    ctx: &DefinitionContext,
    served: Option<&Generation>,
) -> Result<Generation, Rejection> {
    let name = def.name_any();
    let checked = Checked::of(def);
    let remembered = crate::sync::lock(&ctx.rejected).get(&name).cloned();
    if let Some((_, rejection)) = remembered.filter(|(at, _)| *at == checked) {
        return Err(rejection);
    }
    let result = check(def, ctx, served).await;
    let mut rejected = crate::sync::lock(&ctx.rejected);
    match &result {
        Err(r @ (Rejection::Invalid(_) | Rejection::Breaking(_))) => {
            rejected.insert(name, (checked, r.clone()));
        }
        _ => {
            rejected.remove(&name);
        }
    }
    result
}

/// Every check a generation must pass before it is served.
async fn check(
    def: &DynamicObject,
    ctx: &DefinitionContext,
    served: Option<&Generation>,
) -> Result<Generation, Rejection> {
    let name = def.name_any();
    let mut generation = generation::load(def, &ctx.work_dir, ctx.isolation.clone())?;
    generation::attach_webhook(&mut generation, ctx.webhook.as_deref())?;
    let mut taken = ctx.taken.clone();
    taken.extend(ctx.serving.taken_by_others(&name));
    generation::check_clash(&generation, &taken)?;
    let others = ctx.serving.bytes_of_others(&name);
    let kept = (ctx.serving).bytes_kept_with(&name, &generation, &rollout::spec_of(def));
    generation::check_budget(&generation, kept, others, ctx.budget)?;
    let baseline = match served {
        Some(g) => g.crd().ok(),
        None => crds::live(&ctx.client, &generation.crd_name())
            .await
            .ok()
            .flatten()
            .filter(|crd| crds::marker(crd) == Some(name.as_str())),
    };
    if let Some(baseline) = &baseline {
        generation::check_compatible(def, baseline, &generation)?;
    }
    generation::build_base(&ctx.engine, &mut generation).await?;
    Ok(generation)
}

/// Applies the CRD `declared` of the definition `name` (with the CAs the
/// webhook trusts now) and waits until it is established.
async fn apply_crd(
    ctx: &DefinitionContext,
    mut declared: CustomResourceDefinition,
    name: &str,
    crd: &str,
) -> Result<(), (Reason, String)> {
    if let Some(webhook) = ctx.webhook.as_ref() {
        // The CAs trusted now: the webhook's certificate may have been
        // renewed since the generation was checked.
        webhook.refresh(&mut declared);
    }
    match crds::apply(&ctx.client, &declared, name, &ctx.applied_crds).await {
        Err(e @ CrdError::NotOwned { .. }) => Err((Reason::CrdNotOwned, e.to_string())),
        Err(e) => Err((Reason::CrdApplyFailed, e.to_string())),
        Ok(crds::Outcome::Unchanged) => Ok(()),
        Ok(crds::Outcome::Applied(applied)) => match ctx.engine.wait_established(crd).await {
            Ok(Some(established)) => {
                ctx.applied_crds.established(crd, applied, &established);
                Ok(())
            }
            Ok(None) => Err((
                Reason::NotEstablished,
                format!("the CRD {crd} is not established yet"),
            )),
            Err(e) => Err((
                Reason::CrdApplyFailed,
                format!("the CRD {crd}: {}", crate::error_text::kube(&e)),
            )),
        },
    }
}

/// Applies the generation's CRD and waits until it is established; sets
/// `CRDEstablished`. True when it is.
async fn ensure_crd(
    ctx: &DefinitionContext,
    name: &str,
    generation: &Generation,
    status: &mut Status,
) -> bool {
    let crd = generation.crd_name();
    status.crd = Some(crd.clone());
    let number = Some(generation.number);
    if let (Some(webhook), Some(filed)) = (ctx.webhook.as_ref(), &generation.conversions) {
        // Before the CRD: the API server calls the webhook as soon as it
        // serves the versions. Read from the CRD as every replica's
        // follower reads it: the same conversions whoever files them last.
        webhook.conversions.file(filed.clone());
    }
    let reason = match generation.crd() {
        Ok(declared) => apply_crd(ctx, declared, name, &crd).await,
        Err(e) => Err((
            Reason::CrdApplyFailed,
            format!("the CRD {crd} kept for the generation does not read back: {e}"),
        )),
    };
    match reason {
        Ok(()) => {
            let message = format!("the CRD {crd} is established");
            status.set(
                ConditionType::CrdEstablished,
                true,
                Reason::Established,
                &message,
                number,
            );
            true
        }
        Err((reason, message)) => {
            status.set(
                ConditionType::CrdEstablished,
                false,
                reason,
                &message,
                number,
            );
            false
        }
    }
}

/// What follows a step of the storage migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Nothing: the migration is done, or failed for the whole kind
    /// (the definition's next check tries again).
    Nothing,
    /// The next step, soon.
    Step,
    /// Those that could not be written, tried again a little later.
    Retry,
    /// The API server's migration, looked at again.
    Follow,
}

/// `StorageMigrated`: one step of the migration of the kind's resources to
/// its storage version (the API server's, or the operator's walk); what
/// follows.
async fn storage_condition(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    generation: &Generation,
    status: &mut Status,
) -> Next {
    let number = Some(generation.number);
    let crd = generation.crd_name();
    let storage = &generation.kind.file.spec.version;
    let subject = migrator::Subject {
        definition: def,
        crd: &crd,
        resource: &generation.kind.resource,
        storage,
    };
    let step = migrator::step(&ctx.client, &ctx.migrator, &ctx.walks, &subject).await;
    // A kind of one version that never migrated has nothing to say.
    let nothing = Storage::Migrated {
        version: storage.clone(),
        written: 0,
    };
    let quiet = matches!(&step, Ok(Outcome::Walked { storage, .. }) if *storage == nothing)
        && !generation.kind.versions().several()
        && status.condition(ConditionType::StorageMigrated).is_none();
    if quiet {
        return Next::Nothing;
    }
    let (ok, reason, message, next) = storage_outcome(step, storage);
    status.set(ConditionType::StorageMigrated, ok, reason, &message, number);
    next
}

/// The `StorageMigrated` condition a step of the migration to `storage`
/// ends in (status, reason, message), and what follows.
fn storage_outcome(
    step: Result<Outcome, migration::StepError>,
    storage: &str,
) -> (bool, Reason, String, Next) {
    match step {
        Ok(Outcome::Walked { storage, after }) => walk_outcome(storage, after.as_ref()),
        Ok(Outcome::Migrated { name, version }) => {
            let message = format!(
                "every resource is stored at {version} (written again by the API server's StorageVersionMigration {name})"
            );
            (true, Reason::Migrated, message, Next::Nothing)
        }
        Ok(Outcome::Migrating {
            name,
            from,
            to,
            progress,
        }) => {
            let stands = match progress {
                Progress::Running(said) => format!("it says: {said}"),
                Progress::Succeeded { .. } => {
                    "it succeeded, and its controller trims storedVersions next".to_string()
                }
                Progress::Failed { .. } => {
                    "it failed; the operator writes them itself once kube-controller-manager is done with the CRD".to_string()
                }
                Progress::Waiting | Progress::NotStarted => {
                    "waiting for kube-controller-manager to start it".to_string()
                }
            };
            let message = format!(
                "writing the resources stored at {} again at {to} by the API server's StorageVersionMigration {name}: {stands}",
                from.join(", "),
            );
            (false, Reason::Migrating, message, Next::Follow)
        }
        Err(e) => {
            let message = format!("writing the resources again at {storage}: {e}");
            (false, Reason::MigrationFailed, message, Next::Nothing)
        }
    }
}

/// The `StorageMigrated` condition a step of the operator's walk ends in,
/// taken after `after` where the API server's migration was tried.
fn walk_outcome(step: Storage, after: Option<&Fallback>) -> (bool, Reason, String, Next) {
    let by = match after {
        Some(fallback) => format!("by the operator ({fallback})"),
        None => "by the operator".to_string(),
    };
    match step {
        Storage::Migrated { version, written } => {
            let message = format!(
                "every resource is stored at {version}{}",
                match written {
                    0 => String::new(),
                    n => format!(" ({n} written again {by})"),
                }
            );
            (true, Reason::Migrated, message, Next::Nothing)
        }
        Storage::Migrating {
            from,
            to,
            written,
            failures,
        } => {
            let failed = match failures.count {
                0 => String::new(),
                n => format!("; {n} could not be (tried again): {}", failures.described()),
            };
            let message = format!(
                "writing the resources stored at {} again at {to} {by}: {written} so far{failed}",
                from.join(", "),
            );
            (false, Reason::Migrating, message, Next::Step)
        }
        Storage::Incomplete {
            from, to, failures, ..
        } => {
            let from = from.join(", ");
            let message = format!(
                "{} of the resources stored at {from} could not be written again at {to} {by}; tried again, and {from} stays stored until they are: {}",
                failures.count,
                failures.described()
            );
            (false, Reason::MigrationFailed, message, Next::Retry)
        }
    }
}

/// `Serving`: which generation's controller runs.
fn serving_condition(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    served: Option<&Generation>,
    status: &mut Status,
) {
    let number = def.metadata.generation;
    status.serving_generation = served.map(|g| g.number);
    match served {
        Some(g) if ctx.serving.running(&def.name_any()) => {
            let message = format!(
                "serving {} ({}) from generation {}",
                g.kind.resource.kind, g.kind.resource.api_version, g.number
            );
            status.set(
                ConditionType::Serving,
                true,
                Reason::Running,
                &message,
                number,
            );
        }
        Some(_) => {
            let message = "the kind's controller stopped; it is started again";
            status.set(
                ConditionType::Serving,
                false,
                Reason::Running,
                message,
                number,
            );
        }
        None => {
            let message =
                "no generation of this definition was accepted since the operator started";
            status.set(
                ConditionType::Serving,
                false,
                Reason::NoValidGeneration,
                message,
                number,
            );
        }
    }
}

/// `RightsGranted`: access reviews of what the overlays of every kept
/// revision need, for the identity that writes its objects;
/// `status.reach`: where that identity could write.
async fn rights_condition(
    ctx: &DefinitionContext,
    name: &str,
    generation: &Generation,
    status: &mut Status,
) {
    let kind = &generation.kind;
    let number = Some(generation.number);
    let named = kind
        .file
        .spec
        .reconcile
        .service_account_name
        .as_deref()
        .or(ctx.engine.settings().default_service_account.as_deref());
    let writer = match Writer::of(kind.namespaced(), named, ctx.engine.settings()) {
        Ok(writer) => writer,
        Err(message) => {
            status.reach = None;
            status.set(
                ConditionType::RightsGranted,
                false,
                Reason::MissingRights,
                &message,
                number,
            );
            return;
        }
    };
    let revisions = ctx.serving.revisions(name);
    let history = revisions.iter().flat_map(|r| r.history.revisions());
    // The latest first: the kind's own rules are its.
    let kept: Vec<&Generation> = std::iter::once(generation)
        .chain(history.map(|r| &r.generation))
        .collect();
    let rules = rbac::rules_of_revisions(kept.iter().map(|g| (&*g.kind, &g.object_types)));
    let object_types = kept
        .iter()
        .flat_map(|g| g.object_types.iter().cloned())
        .collect();
    let needed = rights::operator_rules(&rules, !matches!(writer, Writer::Operator));
    let found = match rights::missing(&ctx.client, &ctx.granted, &needed, None).await {
        Ok(mut missing) => match writer.cluster_user() {
            Some(user) => rights::missing(&ctx.client, &ctx.granted, &rules.writer(), Some(user))
                .await
                .map(|theirs| {
                    missing.extend(theirs.into_iter().map(|m| m.as_user(user)));
                    missing
                }),
            None => Ok(missing),
        },
        Err(e) => Err(e),
    };
    // The reach is asked after the rights: a grant that lands between
    // the two reviews then shows in both once the rights say Granted
    // (looked at again in 10 s while they do not), instead of a
    // Granted status keeping the reach from before it until the next
    // look, minutes later.
    let reach = rights::reach(
        &ctx.client,
        &ctx.granted,
        writer.cluster_user(),
        kind.namespaced(),
        &object_types,
        &kind.file.spec.reach,
    )
    .await
    .unwrap_or_else(|e| {
        vec![format!(
            "cannot review the reach: {}",
            crate::error_text::kube(&e)
        )]
    });
    let beyond = if kind.namespaced() && kind.file.spec.reach.is_empty() {
        String::new()
    } else {
        format!("; it reaches: {}", reach.join("; "))
    };
    status.reach = Some(reach);
    let by = writer.describe();
    let (granted, reason, message) = match found {
        Ok(missing) if missing.is_empty() => (
            true,
            Reason::Granted,
            format!("the operator's account may do what the kind needs{by}{beyond}"),
        ),
        Ok(missing) => (
            false,
            Reason::MissingRights,
            format!(
                "missing: {}{by}; `kustomize-operator rbac` prints the ClusterRole that grants the operator's part",
                crate::text::first_names(&missing, NAMES_SHOWN, ", ")
            ),
        ),
        Err(e) => (
            false,
            Reason::ReviewFailed,
            format!("cannot review the rights: {}", crate::error_text::kube(&e)),
        ),
    };
    status.set(
        ConditionType::RightsGranted,
        granted,
        reason,
        &message,
        number,
    );
}

/// Who writes a kind's objects.
enum Writer {
    /// The operator's own account.
    Operator,
    /// A ServiceAccount of each resource's namespace (checked at each
    /// reconcile: the namespaces are not known in advance).
    Tenant(String),
    /// The account cluster-scoped resources write as (a username).
    Cluster(String),
}

impl Writer {
    /// The writer of a kind (`namespaced` or not) whose writes name the
    /// account `named`, or why its resources will be refused.
    fn of(
        namespaced: bool,
        named: Option<&str>,
        settings: &crate::engine::host::Settings,
    ) -> Result<Self, String> {
        if namespaced {
            return Ok(named.map_or(Self::Operator, |n| Self::Tenant(n.to_string())));
        }
        match (&settings.cluster_service_account, named) {
            (Some(account), _) => Ok(Self::Cluster(account.username())),
            (None, Some(_)) => Err("the kind is cluster-scoped and the install writes as tenants' accounts: its resources are refused until --cluster-service-account names the account they write as".into()),
            (None, None) => Ok(Self::Operator),
        }
    }

    fn cluster_user(&self) -> Option<&str> {
        match self {
            Self::Cluster(user) => Some(user),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Operator => String::new(),
            Self::Tenant(a) => format!(
                "; the objects are written as the ServiceAccount {a} of each resource's namespace, whose rights each reconcile meets"
            ),
            Self::Cluster(user) => format!("; the objects are written as {user}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definitions::migration::Failures;
    use crate::definitions::migrator::FallbackReason;

    const NAME: &str = "greetings.g.example-v2";

    fn said(outcome: Outcome) -> (bool, Reason, String, Next) {
        storage_outcome(Ok(outcome), "v2")
    }

    #[test]
    fn the_api_servers_migration_is_said_as_the_condition_with_its_path() {
        let migrating = |progress| Outcome::Migrating {
            name: NAME.into(),
            from: vec!["v1".into()],
            to: "v2".into(),
            progress,
        };
        let running = "The migration is running, 3/107 objects not yet migrated";
        let (ok, reason, message, next) = said(migrating(Progress::Running(running.into())));
        assert_eq!((ok, reason, next), (false, Reason::Migrating, Next::Follow));
        assert_eq!(
            message,
            format!(
                "writing the resources stored at v1 again at v2 by the API server's StorageVersionMigration {NAME}: it says: {running}"
            )
        );
        let (_, _, message, _) = said(migrating(Progress::Waiting));
        assert!(
            message.ends_with("waiting for kube-controller-manager to start it"),
            "{message}"
        );
        let (_, reason, message, _) = said(migrating(Progress::Succeeded { settled: false }));
        assert_eq!(
            reason,
            Reason::Migrating,
            "not before storedVersions is trimmed"
        );
        assert!(message.contains("trims storedVersions next"), "{message}");
        let migrated = Outcome::Migrated {
            name: NAME.into(),
            version: "v2".into(),
        };
        let (ok, reason, message, next) = said(migrated);
        assert_eq!((ok, reason, next), (true, Reason::Migrated, Next::Nothing));
        assert_eq!(
            message,
            format!(
                "every resource is stored at v2 (written again by the API server's StorageVersionMigration {NAME})"
            )
        );
    }

    #[test]
    fn the_operators_walk_is_said_as_the_condition_with_why_it_walks() {
        let failures = Failures {
            count: 1,
            named: vec!["team-a/large: held by the test".into()],
        };
        let incomplete = Storage::Incomplete {
            from: vec!["v1".into()],
            to: "v2".into(),
            written: 1,
            failures,
        };
        let after = Fallback {
            name: NAME.into(),
            why: FallbackReason::Failed,
        };
        let walked = Outcome::Walked {
            storage: incomplete.clone(),
            after: Some(after),
        };
        let (ok, reason, message, next) = said(walked);
        assert_eq!(
            (ok, reason, next),
            (false, Reason::MigrationFailed, Next::Retry)
        );
        assert_eq!(
            message,
            format!(
                "1 of the resources stored at v1 could not be written again at v2 by the operator (the API server's StorageVersionMigration {NAME} failed); tried again, and v1 stays stored until they are: team-a/large: held by the test"
            )
        );
        let own = Outcome::Walked {
            storage: Storage::Migrating {
                from: vec!["v1".into()],
                to: "v2".into(),
                written: 100,
                failures: Failures::default(),
            },
            after: None,
        };
        let (_, reason, message, next) = said(own);
        assert_eq!((reason, next), (Reason::Migrating, Next::Step));
        assert_eq!(
            message,
            "writing the resources stored at v1 again at v2 by the operator: 100 so far"
        );
        let done = Outcome::Walked {
            storage: Storage::Migrated {
                version: "v2".into(),
                written: 107,
            },
            after: None,
        };
        let (ok, _, message, _) = said(done);
        assert!(ok);
        assert_eq!(
            message,
            "every resource is stored at v2 (107 written again by the operator)"
        );
    }
}
