//! The apply path of one reconcile, a step per module, read top to bottom:
//! plan ([`apply`]), render (`render`), skip when nothing changed (here),
//! carry out the steps (`run`), prune (`prune`), look at the objects'
//! health and write the outcome (`settle`), through what every step
//! records (`record`: the status, events, a failure).

use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;

use super::context::{Context, ReconcileError, marking};
use super::status_writer::{self, Current};
use super::traced;
use crate::engine::contract::{Handler, Plan};
use crate::engine::model::outcome::Failure;
use crate::engine::model::status::Reason;

mod prune;
mod record;
mod render;
mod run;
mod settle;

pub(crate) use prune::prune_candidates;
pub(crate) use record::{fail, publish};
pub(crate) use render::{Rendered, render};
use run::{Ran, first_look_wait, run_showing_progress};
use settle::{Recheck, look_again, recheck, succeed};

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
    if let Some(number) = ctx.handler.revision_for(&current.object) {
        traced::record_revision(number);
    }
    let revision = ctx.handler.templates_for(&current.object);
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
    let reader = ctx.reader(obj)?;
    let observed = ctx
        .handler
        .observe_as(obj, &ctx.engine.client, reader.as_deref())
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
