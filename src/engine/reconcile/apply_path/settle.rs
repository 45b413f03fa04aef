//! After a successful run, or with nothing to apply: the objects' health
//! looked at, the outcome written, and when to look again.

use kube::ResourceExt;
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;

use super::record::{next_common, publish, summarize, write};
use super::run::Ran;
use crate::engine::contract::EventType;
use crate::engine::contract::Handler;
use crate::engine::contract::Plan;
use crate::engine::model::inventory::Inventory;
use crate::engine::model::outcome;
use crate::engine::model::outcome::Applied;
use crate::engine::model::outcome::HealthState;
use crate::engine::model::outcome::Outcome;
use crate::engine::model::status::CommonStatus;
use crate::engine::model::status::ConditionStatus;
use crate::engine::model::status::ConditionType;
use crate::engine::model::status::Reason;
use crate::engine::model::status::StatusText;
use crate::engine::reconcile::checkup;
use crate::engine::reconcile::checkup::Source;
use crate::engine::reconcile::context::Context;
use crate::engine::reconcile::context::ReconcileError;
use crate::engine::reconcile::parked::ApplyRecord;
use crate::engine::reconcile::parked::Parked;
use crate::engine::reconcile::status_writer;
use crate::engine::reconcile::status_writer::Current;
use crate::engine::reconcile::steps::Done;

/// Records a successful run: its events, then its status, once its health
/// is known. When all its objects wait for is their controllers' first
/// look, the status is parked (see [`super::parked`]) and the reconcile
/// ends; the look wakes the resource again and that run writes it.
pub(super) async fn succeed<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    ran: Ran,
) -> Result<Action, ReconcileError> {
    // Looked at again by the resync at the latest: a status write starts
    // no reconcile (see `triggers`), so this requeue is the next look.
    let resync = ctx.engine.settings.resync_interval;
    let requeue = plan.requeue_after.map_or(resync, |r| r.min(resync));
    let checkup = if ctx.handler.info().health {
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
pub(super) async fn publish_applied<H: Handler>(
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
pub(super) fn waiting_status<K: Resource + Clone>(
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
pub(super) async fn settle<H: Handler>(
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
pub(super) async fn look_again<H: Handler>(
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
pub(super) async fn health_events<H: Handler>(
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

/// What a look at an unchanged resource's objects calls for.
pub(super) enum Recheck {
    /// Nothing to apply: the reconcile is over.
    Done(Result<Action, ReconcileError>),
    /// A watched object went missing: apply again.
    Reapply,
}

/// A resource whose desired state is in place: how healthy its objects are
/// now, by the watches; the status follows (written only when it changed),
/// and an object deleted behind the operator's back is applied again.
pub(super) async fn recheck<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    next: Duration,
) -> Recheck {
    if !ctx.handler.info().health {
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
