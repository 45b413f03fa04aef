//! What a reconcile records: its status (written only when it changed),
//! its events, and a failure.

use kube::Resource;
use kube::runtime::controller::Action;

use crate::engine::contract::EventType;
use crate::engine::contract::Handler;
use crate::engine::contract::Plan;
use crate::engine::contract::PlannedEvent;
use crate::engine::model::outcome;
use crate::engine::model::outcome::Failure;
use crate::engine::model::outcome::Outcome;
use crate::engine::model::overlay::RenderedOverlay;
use crate::engine::model::status::CommonStatus;
use crate::engine::model::status::ConditionStatus;
use crate::engine::model::status::ConditionType;
use crate::engine::reconcile::context::Context;
use crate::engine::reconcile::context::ReconcileError;
use crate::engine::reconcile::status_writer;
use crate::engine::reconcile::status_writer::Current;

pub(super) fn event(
    type_: EventType,
    reason: &'static str,
    what: &str,
    names: &[String],
) -> PlannedEvent {
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
pub(super) fn keep<K: Resource>(
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
pub(super) fn summarize(lines: &[String]) -> String {
    match lines {
        [] => "nothing to do".into(),
        [one] => one.clone(),
        lines => crate::text::first_names(lines, 1, ", "),
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
    let kind = plan.and_then(|p| p.failure_status.as_ref());
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
pub(super) fn next_common<K: Resource + Clone>(
    current: &Current<'_, K>,
    outcome: &Outcome,
) -> CommonStatus {
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
pub(super) async fn write<H: Handler>(
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
    let event = super::super::events::Publish {
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
}
