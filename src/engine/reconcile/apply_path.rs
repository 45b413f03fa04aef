//! The apply path of one reconcile: plan, render, skip when nothing
//! changed, carry out the steps, prune, and write the outcome.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::checkup::{self, Source};
use super::context::{Context, ReconcileError, marking};
use super::parked::{ApplyRecord, Parked};
use super::status_writer::{self, Current};
use super::steps::{self, Actor, Done};
use super::traced;
use crate::engine::contract::{EventType, Handler, OnFailure, Plan, PlannedEvent, Step};
use crate::engine::model::inventory::{Inventory, ObjectId, Owner};
use crate::engine::model::outcome::{self, Applied, Failure, HealthState, Outcome};
use crate::engine::model::overlay::{Marking, RenderedOverlay};
use crate::engine::model::status::{
    CommonStatus, ConditionStatus, ConditionType, Reason, StatusText,
};

/// A run that takes longer than this shows `Reconciling=True` meanwhile.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);
/// The same for a resource without conditions yet (its first run): an
/// empty status already says nothing was applied, so only a long first run
/// is worth the extra write. In a burst of new resources, runs take
/// seconds waiting for their batch, and this write was one of every two.
const FIRST_PROGRESS_AFTER: Duration = Duration::from_secs(10);
/// How long after its start a resource's first run may park the status
/// of an apply whose objects wait for their controllers' first look (later
/// runs: [`PROGRESS_AFTER`]). Parking holds no reconcile slot, and in a
/// burst the Deployment controller's first look comes seconds late.
const FIRST_LOOK_WAIT: Duration = Duration::from_secs(30);

/// The plan's steps, rendered in memory, and a digest over all of them.
pub(crate) struct Rendered {
    /// Each step's overlay (`None` for steps without one).
    pub overlays: Vec<Option<RenderedOverlay>>,
    /// sha256 over every step.
    pub digest: String,
}

/// Renders every overlay of `plan`; owned ones get `marking`.
pub(crate) fn render<S>(
    plan: &Plan<S>,
    templates: &crate::engine::model::templates::KustomizeDir,
    marking: &Marking,
) -> Result<Rendered, crate::engine::model::overlay::OverlayError> {
    let mut hasher = Sha256::new();
    let mut overlays = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        let (tag, overlay) = match step {
            Step::Apply {
                overlay,
                field_manager,
            } => {
                hasher.update(format!("apply {field_manager:?}\n"));
                ("apply", Some(overlay.render(templates, Some(marking))?))
            }
            Step::Patch {
                overlay,
                field_manager,
            } => {
                hasher.update(format!("patch {field_manager}\n"));
                ("patch", Some(overlay.render(templates, None)?))
            }
            Step::DeleteForeign { objects } => {
                for o in objects {
                    hasher.update(format!("delete {o}/{}\n", o.api_version));
                }
                ("delete", None)
            }
        };
        hasher.update(tag.as_bytes());
        if let Some(o) = &overlay {
            hasher.update(o.digest().as_bytes());
        }
        overlays.push(overlay);
    }
    Ok(Rendered {
        overlays,
        digest: format!("sha256:{}", hex::encode(hasher.finalize())),
    })
}

/// Reconciles a resource that exists.
pub(crate) async fn apply<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
) -> Result<Action, ReconcileError> {
    let current = status_writer::current(&ctx.engine, &*ctx.handler, obj);
    let generation = current.object.meta().generation;
    if let Some(parked) = current
        .parked
        .as_ref()
        .filter(|p| p.record.generation == generation)
    {
        // The desired state is the one just applied, as during a wait
        // inside the run: no need to plan and render it again.
        if let Recheck::Done(result) = look_again(ctx, &current, parked).await {
            return result;
        }
    }
    let plan = match planned(ctx, &current.object).await {
        Ok(plan) => plan,
        Err(e) => {
            let failure = Failure::new(e.reason(), e.to_string());
            return fail(ctx, &current, failure, None, e.is_permanent()).await;
        }
    };
    if plan.idle {
        ctx.engine.metrics.skipped(&ctx.handler.info().name);
        let next = plan
            .requeue_after
            .unwrap_or(ctx.engine.settings.resync_interval);
        return Ok(Action::requeue(next));
    }
    let Some(owner) = ctx.owner(obj) else {
        let failure = Failure::new(Reason::InvalidSpec, "the resource has no UID yet");
        return fail(ctx, &current, failure, Some(&plan), false).await;
    };
    let marking = marking(&*ctx.handler, owner);
    let revision = ctx.handler.revision_for(&current.object);
    if let Some(revision) = &revision {
        traced::record_revision(revision.number);
    }
    let revision = revision.and_then(|r| r.templates);
    let templates = revision.as_deref().unwrap_or_else(|| ctx.templates());
    let rendered = match render(&plan, templates, &marking) {
        Ok(r) => r,
        Err(e) => {
            let failure = Failure::new(Reason::RenderFailed, e.to_string());
            return fail(ctx, &current, failure, Some(&plan), false).await;
        }
    };
    let digest = plan
        .digest
        .clone()
        .unwrap_or_else(|| rendered.digest.clone());
    if let Some(next) = unchanged(ctx, &current, &plan, &digest) {
        match recheck(ctx, &current, next).await {
            Recheck::Done(result) => {
                ctx.engine.metrics.skipped(&ctx.handler.info().name);
                return result;
            }
            Recheck::Reapply => {}
        }
    }
    let park_until = tokio::time::Instant::now() + first_look_wait(&current.common);
    match run_showing_progress(ctx, &current, &plan, &rendered, &marking.owner).await {
        Ok((done, after)) => {
            let ran = Ran {
                done,
                after,
                digest,
                park_until,
            };
            succeed(ctx, &current, &plan, ran).await
        }
        Err(failure) => fail(ctx, &current, failure, Some(&plan), false).await,
    }
}

async fn planned<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
) -> Result<Plan<H::Status>, crate::engine::contract::HandlerError> {
    let reader = ctx.read_as(obj);
    let observed = ctx
        .handler
        .observe_as(obj, &ctx.engine.client, &reader)
        .await?;
    ctx.handler.plan(obj, &observed)
}

/// `Some(when to look again)` when the plan changes nothing since the last
/// successful run and no resync is due.
fn unchanged<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    digest: &str,
) -> Option<Duration> {
    let status = &current.common;
    let interval = ctx.engine.settings.resync_interval;
    let resync_in = status
        .last_applied_at
        .map(|last| {
            interval.saturating_sub(jiff::Timestamp::now().duration_since(last).unsigned_abs())
        })
        .unwrap_or(Duration::ZERO);
    let same = !plan.always_run
        && status.observed_generation == current.object.meta().generation
        && status.applied_digest.as_deref() == Some(digest)
        && status.ready_reason().is_some_and(Reason::applied)
        && !resync_in.is_zero();
    same.then(|| plan.requeue_after.map_or(resync_in, |r| r.min(resync_in)))
}

/// What a look at an unchanged resource's objects calls for.
enum Recheck {
    /// Nothing to apply: the reconcile is over.
    Done(Result<Action, ReconcileError>),
    /// A watched object went missing: apply again.
    Reapply,
}

/// A resource whose desired state is in place: how healthy its objects are
/// now, by the watches; the status follows (written only when it changed),
/// and an object deleted behind the operator's back is applied again.
async fn recheck<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    next: Duration,
) -> Recheck {
    if !ctx.handler.info().policy.health {
        return Recheck::Done(Ok(Action::requeue(next)));
    }
    let ids = current
        .common
        .inventory
        .as_ref()
        .map(Inventory::ids)
        .unwrap_or_default();
    let checkup = checkup::look(ctx, &current.object, &ids, Source::Watched).await;
    let now = jiff::Timestamp::now();
    if !checkup.missing.is_empty() {
        let missing: Vec<String> = checkup.missing.iter().map(ToString::to_string).collect();
        tracing::info!(object = %ctx.key(&current.object), missing = ?missing, "owned objects were deleted; applying again");
        return Recheck::Reapply;
    }
    let waiting = checkup::waiting(&current.common, false, now);
    let timeout = ctx.engine.settings.health_timeout;
    let health = checkup::verdict(&checkup, waiting, now, timeout);
    let next = match &health {
        HealthState::Waiting(_) => {
            checkup::deadline(waiting, now, timeout).map_or(next, |d| d.min(next))
        }
        _ => next,
    };
    let outcome = Outcome::Checked(health);
    let common = outcome::status_after(
        &current.common,
        &outcome,
        current.object.meta().generation,
        now,
    );
    let fields_changed = checkup
        .fields
        .as_ref()
        .is_some_and(|f| *f != status_writer::kind_fields(&current.status));
    if common != current.common || fields_changed {
        let kind = checkup.fields.clone().map(serde_json::Value::Object);
        health_events(ctx, &current.object, &current.common, &common).await;
        if let Err(e) = write(ctx, current, &common, kind).await {
            return Recheck::Done(Err(e));
        }
    }
    Recheck::Done(Ok(Action::requeue(next)))
}

/// How long a run goes before the status shows it (`Reconciling=True`).
fn progress_after(status: &CommonStatus) -> Duration {
    if status.conditions.is_empty() {
        FIRST_PROGRESS_AFTER
    } else {
        PROGRESS_AFTER
    }
}

/// How long a run may park the status of an apply waiting for a first look.
fn first_look_wait(status: &CommonStatus) -> Duration {
    if status.conditions.is_empty() {
        FIRST_LOOK_WAIT
    } else {
        PROGRESS_AFTER
    }
}

/// Runs the steps; if they take a while, shows `Reconciling=True` meanwhile.
async fn run_showing_progress<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    rendered: &Rendered,
    owner: &Owner,
) -> Result<(Done, BTreeSet<ObjectId>), Failure> {
    let run = run_steps(ctx, current, plan, rendered, owner);
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => return result,
        () = tokio::time::sleep(progress_after(&current.common)) => {}
    }
    let progressing = outcome::status_after(
        &current.common,
        &Outcome::Progressing,
        current.object.meta().generation,
        jiff::Timestamp::now(),
    );
    let status = status_writer::compose(&current.status, &progressing, None);
    if let Err(e) = status_writer::write(&ctx.engine, &*ctx.handler, &current.object, status).await
    {
        tracing::warn!(object = %ctx.key(&current.object), error = %crate::error_text::kube(&e), "could not mark the resource Reconciling");
    }
    run.await
}

/// The steps, then the prune; returns what ran and what the resource owns now.
async fn run_steps<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    rendered: &Rendered,
    owner: &Owner,
) -> Result<(Done, BTreeSet<ObjectId>), Failure> {
    let engine = &ctx.engine;
    let identity = ctx.identity(owner)?;
    let adopts = |meta: &ObjectMeta| ctx.handler.adopts(&current.object, meta);
    let actor = Actor {
        owner,
        conflicts: ctx.handler.info().policy.conflicts,
        adopts: &adopts,
        reach: &ctx.handler.info().policy.reach,
        identity: &identity,
    };
    let before = current
        .common
        .inventory
        .as_ref()
        .map(Inventory::ids)
        .unwrap_or_default();
    let mut done = Done::default();
    for (step, overlay) in plan.steps.iter().zip(&rendered.overlays) {
        let result = match (step, overlay) {
            (Step::Apply { field_manager, .. }, Some(overlay)) => {
                let built = steps::build_owned(engine, owner, overlay).await;
                keep(ctx, &*current.object, overlay, built.as_deref().ok());
                match built {
                    Ok(manifests) => {
                        let fm = field_manager.as_deref();
                        steps::apply_owned(engine, &actor, &manifests, fm, &mut done).await
                    }
                    Err(failure) => Err(failure),
                }
            }
            (Step::Patch { field_manager, .. }, Some(overlay)) => {
                steps::patch_foreign(engine, overlay, field_manager, &identity, &mut done).await
            }
            (Step::DeleteForeign { objects }, _) => {
                steps::delete_foreign(engine, objects, &identity, &mut done).await
            }
            _ => Err(Failure::new(
                Reason::RenderFailed,
                "a step lost its overlay",
            )),
        };
        if let Err(mut failure) = result {
            let widened: BTreeSet<ObjectId> = before.union(&done.attempted).cloned().collect();
            if widened != before {
                failure.inventory = Some(Inventory::of(&widened));
            }
            return Err(failure);
        }
    }
    let after: BTreeSet<ObjectId> = match &plan.inventory {
        Some(declared) => declared.iter().cloned().collect(),
        None => done.applied.clone(),
    };
    if plan.prune {
        let candidates = prune_candidates(current.common.inventory.as_ref(), &plan.stale);
        let gone: BTreeSet<ObjectId> = candidates.difference(&after).cloned().collect();
        prune(ctx, &actor, gone, &before, &after, &mut done).await?;
    }
    Ok((done, after))
}

/// What a run may prune: what the resource owned (its recorded
/// `inventory`) and what its kind says it no longer wants (`stale`). Of
/// these, what the run does not produce again goes, each only if it still
/// carries the resource's marker.
pub(crate) fn prune_candidates(
    inventory: Option<&Inventory>,
    stale: &[ObjectId],
) -> BTreeSet<ObjectId> {
    let mut candidates = inventory.map(Inventory::ids).unwrap_or_default();
    candidates.extend(stale.iter().cloned());
    candidates
}

/// Deletes what left the inventory (only objects still carrying the marker).
async fn prune<H: Handler>(
    ctx: &Context<H>,
    actor: &Actor<'_>,
    gone: BTreeSet<ObjectId>,
    before: &BTreeSet<ObjectId>,
    after: &BTreeSet<ObjectId>,
    done: &mut Done,
) -> Result<(), Failure> {
    if gone.is_empty() {
        return Ok(());
    }
    let gone: Vec<ObjectId> = gone.into_iter().collect();
    let report = steps::delete_owned(&ctx.engine, actor, gone, Reason::PruneFailed, done)
        .await
        .map_err(|mut f| {
            let kept: BTreeSet<ObjectId> = before.union(after).cloned().collect();
            f.inventory = Some(Inventory::of(&kept));
            f
        })?;
    let deleted: Vec<String> = report.deleted.iter().map(ToString::to_string).collect();
    if !deleted.is_empty() {
        done.events.push(event(
            EventType::Normal,
            "Pruned",
            "deleted what it no longer renders",
            &deleted,
        ));
    }
    if let Some(note) = steps::dropped_entries(&report) {
        done.events.push(PlannedEvent {
            type_: EventType::Warning,
            reason: "InventoryIgnored",
            note,
            related: None,
        });
    }
    Ok(())
}

fn event(type_: EventType, reason: &'static str, what: &str, names: &[String]) -> PlannedEvent {
    let shown = crate::text::first_names(names, crate::text::IN_EVENT, ", ");
    PlannedEvent {
        type_,
        reason,
        note: format!("{what}: {shown}"),
        related: None,
    }
}

/// Keeps the overlay for `--keep-overlays`, unless it (or what it `built`
/// to) holds Secret data.
fn keep<K: Resource>(
    ctx: &Context<impl Handler>,
    obj: &K,
    overlay: &RenderedOverlay,
    built: Option<&[serde_json::Value]>,
) {
    if let Some(dir) = ctx.kept_overlay(obj.meta()) {
        crate::engine::run::kept::keep(&dir, overlay, built);
    }
}

/// One short line for the status: kubectl's line, or the first and a count.
fn summarize(lines: &[String]) -> String {
    match lines {
        [] => "nothing to do".into(),
        [one] => one.clone(),
        lines => crate::text::first_names(lines, 1, ", "),
    }
}

/// What a successful run did.
struct Ran {
    /// The steps' output and what they applied.
    done: Done,
    /// What the resource owns now.
    after: BTreeSet<ObjectId>,
    /// The digest of what was applied.
    digest: String,
    /// Until when the status of an apply waiting for its objects' first
    /// look may stay parked.
    park_until: tokio::time::Instant,
}

/// Records a successful run: its events, then its status, once its health
/// is known. When all its objects wait for is their controllers' first
/// look, the status is parked (see [`super::parked`]) and the reconcile
/// ends; the look wakes the resource again and that run writes it.
async fn succeed<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    ran: Ran,
) -> Result<Action, ReconcileError> {
    // Looked at again by the resync at the latest: a status write starts
    // no reconcile (see `triggers`), so this requeue is the next look.
    let resync = ctx.engine.settings.resync_interval;
    let requeue = plan.requeue_after.map_or(resync, |r| r.min(resync));
    let checkup = if ctx.handler.info().policy.health {
        let source = Source::AfterApply {
            created: &ran.done.created,
        };
        checkup::look(ctx, &current.object, &ran.after, source).await
    } else {
        checkup::Checkup::default()
    };
    let summary = summarize(&ran.done.lines);
    publish_applied(ctx, &current.object, plan, &ran.done, &summary).await;
    let before = &current.common;
    let applied_new = before.applied_digest.as_deref() != Some(ran.digest.as_str())
        || before.observed_generation != current.object.meta().generation;
    let Ran {
        done,
        after,
        digest,
        park_until,
    } = ran;
    let record = ApplyRecord {
        written: before.clone(),
        applied: Applied {
            summary,
            record: done.record,
            digest,
            inventory: Inventory::of(&after),
            health: HealthState::Healthy,
        },
        kind: plan
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok()),
        waiting: checkup::waiting(before, applied_new, jiff::Timestamp::now()),
        generation: current.object.meta().generation,
        requeue,
    };
    let now = tokio::time::Instant::now();
    let parks = checkup.first_look_pending && !plan.always_run && now < park_until;
    if let Some(uid) = current.object.uid().filter(|_| parks) {
        let status = StatusText::of(&waiting_status(current, &record, &checkup));
        let parked = Parked {
            kind: ctx.handler.info().name.clone(),
            namespace: current.object.namespace(),
            name: current.object.name_any(),
            status,
            record,
            until: park_until,
        };
        ctx.engine.parked.park(uid, parked);
        return Ok(Action::requeue((park_until - now).min(requeue)));
    }
    settle(ctx, current, &record, &checkup).await
}

/// The `Applied` event (unless the kind runs every time), and the events
/// of the steps and the plan.
async fn publish_applied<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
    plan: &Plan<H::Status>,
    done: &Done,
    summary: &str,
) {
    if !plan.always_run {
        let note = if done.lines.len() > 1 {
            done.lines.join("\n")
        } else {
            summary.to_string()
        };
        let applied = Reason::Applied.as_str();
        publish(ctx, obj, EventType::Normal, applied, &note, None).await;
    }
    for e in done.events.iter().chain(&plan.events) {
        let related = e.related.as_ref();
        publish(ctx, obj, e.type_, e.reason, &e.note, related).await;
    }
}

/// The status of an apply whose objects wait for their first look, as it
/// would read if written now.
fn waiting_status<K: Resource + Clone>(
    current: &Current<'_, K>,
    record: &ApplyRecord,
    checkup: &checkup::Checkup,
) -> serde_json::Value {
    let waiting = Outcome::Applied(Applied {
        health: HealthState::Waiting(checkup.waiting.clone()),
        ..record.applied.clone()
    });
    let common = next_common(current, &waiting);
    let kind = status_writer::with_fields(record.kind.clone(), checkup.fields.clone());
    status_writer::compose(&current.status, &common, kind)
}

/// Writes the status of a successful apply with the health `checkup`
/// found; looks again by the record's `requeue` at the latest.
async fn settle<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    record: &ApplyRecord,
    checkup: &checkup::Checkup,
) -> Result<Action, ReconcileError> {
    let now = jiff::Timestamp::now();
    let timeout = ctx.engine.settings.health_timeout;
    let health = checkup::verdict(checkup, record.waiting, now, timeout);
    let next = match &health {
        HealthState::Waiting(_) => checkup::deadline(record.waiting, now, timeout),
        _ => None,
    };
    let applied = Outcome::Applied(Applied {
        health,
        ..record.applied.clone()
    });
    let generation = current.object.meta().generation;
    let common = outcome::status_after(&record.written, &applied, generation, now);
    let kind = status_writer::with_fields(record.kind.clone(), checkup.fields.clone());
    health_events(ctx, &current.object, &record.written, &common).await;
    write(ctx, current, &common, kind).await?;
    let requeue = record.requeue;
    Ok(Action::requeue(next.map_or(requeue, |n| n.min(requeue))))
}

/// A parked apply of the resource's generation: looks at its objects
/// again, and writes its status once their first look came (or its
/// deadline passed); an object deleted meanwhile is applied again.
async fn look_again<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    parked: &Parked,
) -> Recheck {
    let record = &parked.record;
    let ids = record.applied.inventory.ids();
    let checkup = checkup::look(ctx, &current.object, &ids, Source::Watched).await;
    if !checkup.missing.is_empty() {
        return Recheck::Reapply;
    }
    let now = tokio::time::Instant::now();
    if checkup.first_look_pending && now < parked.until {
        let next = (parked.until - now).min(record.requeue);
        return Recheck::Done(Ok(Action::requeue(next)));
    }
    Recheck::Done(settle(ctx, current, record, &checkup).await)
}

/// Events for changes of health: `Unhealthy` (or `OverBudget`) when the resource stalls,
/// `Healthy` when objects it waited for became healthy.
async fn health_events<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
    before: &CommonStatus,
    after: &CommonStatus,
) {
    let stalled = |s: &CommonStatus| {
        s.condition(ConditionType::Stalled)
            .filter(|c| c.status == ConditionStatus::True)
            .map(|c| (c.reason, c.message.clone()))
    };
    let waited = before.ready_reason().is_some_and(|r| {
        matches!(
            r,
            Reason::Progressing | Reason::Unhealthy | Reason::OverBudget
        )
    }) && !before.is_ready();
    if let (None, Some((reason, why))) = (stalled(before), stalled(after)) {
        publish(ctx, obj, EventType::Warning, reason.as_str(), &why, None).await;
    } else if waited && after.is_ready() {
        let note = "every object it applied is healthy";
        publish(ctx, obj, EventType::Normal, "Healthy", note, None).await;
    }
}

/// Records a failure: status, a warning event; the error for the backoff.
pub(crate) async fn fail<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    failure: Failure,
    plan: Option<&Plan<H::Status>>,
    permanent: bool,
) -> Result<Action, ReconcileError> {
    let kind = plan.and_then(|p| match &p.on_failure {
        OnFailure::Same => p.status.as_ref(),
        OnFailure::KeepPrevious => None,
        OnFailure::Write(s) => Some(s),
    });
    let kind = kind.and_then(|s| serde_json::to_value(s).ok());
    let common = next_common(current, &Outcome::Failed(failure.clone()));
    publish(
        ctx,
        &current.object,
        EventType::Warning,
        failure.reason.as_str(),
        &failure.message,
        None,
    )
    .await;
    write(ctx, current, &common, kind).await?;
    Err(ReconcileError::Failed {
        reason: failure.reason,
        message: failure.message,
        permanent,
    })
}

/// The engine's status fields after `outcome`.
fn next_common<K: Resource + Clone>(current: &Current<'_, K>, outcome: &Outcome) -> CommonStatus {
    let common = outcome::status_after(
        &current.common,
        outcome,
        current.object.meta().generation,
        jiff::Timestamp::now(),
    );
    debug_assert!(
        !(common.is_ready()
            && common
                .condition(ConditionType::Reconciling)
                .is_some_and(|c| c.status == ConditionStatus::True))
    );
    common
}

/// Writes `common` and the kind's fields. Events about the outcome are
/// published before, so whoever sees the status sees its events too.
async fn write<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    common: &CommonStatus,
    kind: Option<serde_json::Value>,
) -> Result<(), ReconcileError> {
    let status = status_writer::compose(&current.status, common, kind);
    status_writer::write(&ctx.engine, &*ctx.handler, &current.object, status).await?;
    Ok(())
}

/// Publishes an event about `obj`; a failure to publish is only logged.
pub(crate) async fn publish<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
    type_: EventType,
    reason: &str,
    note: &str,
    related: Option<&k8s_openapi::api::core::v1::ObjectReference>,
) {
    let regarding = obj.object_ref(&ctx.handler.info().dyn_type);
    let event = super::events::Publish {
        regarding: &regarding,
        type_,
        reason,
        action: "Reconcile",
        note,
        related,
    };
    if let Err(e) = ctx.engine.events.publish(&event).await {
        tracing::warn!(object = %ctx.key(obj), error = %crate::error_text::kube(&e), "cannot publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_one_line() {
        assert_eq!(summarize(&[]), "nothing to do");
        assert_eq!(summarize(&["a x".into()]), "a x");
        assert_eq!(
            summarize(&["a x".into(), "b y".into(), "c z".into()]),
            "a x (and 2 more)"
        );
    }

    #[test]
    fn a_first_run_shows_progress_only_when_long_and_waits_longer_for_a_first_look() {
        assert_eq!(
            progress_after(&CommonStatus::default()),
            FIRST_PROGRESS_AFTER
        );
        let applied = outcome::status_after(
            &CommonStatus::default(),
            &Outcome::Checked(HealthState::Healthy),
            Some(1),
            jiff::Timestamp::now(),
        );
        assert_eq!(progress_after(&applied), PROGRESS_AFTER);
        assert_eq!(first_look_wait(&CommonStatus::default()), FIRST_LOOK_WAIT);
        assert_eq!(first_look_wait(&applied), PROGRESS_AFTER);
    }
}
