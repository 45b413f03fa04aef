//! Carrying out the plan's steps (kubectl runs), showing `Reconciling`
//! while a run takes long, and pruning after them.

use kube::Resource;
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::prune::{prune, prune_candidates};
use super::record::keep;
use super::render::Rendered;
use crate::engine::contract::Handler;
use crate::engine::contract::Plan;
use crate::engine::contract::Step;
use crate::engine::model::inventory::Inventory;
use crate::engine::model::inventory::ObjectId;
use crate::engine::model::inventory::Owner;
use crate::engine::model::outcome;
use crate::engine::model::outcome::Failure;
use crate::engine::model::outcome::Outcome;
use crate::engine::model::status::CommonStatus;
use crate::engine::model::status::Reason;
use crate::engine::reconcile::context::Context;
use crate::engine::reconcile::status_writer;
use crate::engine::reconcile::status_writer::Current;
use crate::engine::reconcile::steps;
use crate::engine::reconcile::steps::Actor;
use crate::engine::reconcile::steps::Done;

/// A run that takes longer than this shows `Reconciling=True` meanwhile.
pub(super) const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// The same for a resource without conditions yet (its first run): an
/// empty status already says nothing was applied, so only a long first run
/// is worth the extra write. In a burst of new resources, runs take
/// seconds waiting for their batch, and this write was one of every two.
pub(super) const FIRST_PROGRESS_AFTER: Duration = Duration::from_secs(10);

/// How long after its start a resource's first run may park the status
/// of an apply whose objects wait for their controllers' first look (later
/// runs: [`PROGRESS_AFTER`]). Parking holds no reconcile slot, and in a
/// burst the Deployment controller's first look comes seconds late.
pub(super) const FIRST_LOOK_WAIT: Duration = Duration::from_secs(30);

/// How long a run goes before the status shows it (`Reconciling=True`).
pub(super) fn progress_after(status: &CommonStatus) -> Duration {
    if status.conditions.is_empty() {
        FIRST_PROGRESS_AFTER
    } else {
        PROGRESS_AFTER
    }
}

/// How long a run may park the status of an apply waiting for a first look.
pub(super) fn first_look_wait(status: &CommonStatus) -> Duration {
    if status.conditions.is_empty() {
        FIRST_LOOK_WAIT
    } else {
        PROGRESS_AFTER
    }
}

/// Runs the steps; if they take a while, shows `Reconciling=True` meanwhile.
pub(super) async fn run_showing_progress<H: Handler>(
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
pub(super) async fn run_steps<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    plan: &Plan<H::Status>,
    rendered: &Rendered,
    owner: &Owner,
) -> Result<(Done, BTreeSet<ObjectId>), Failure> {
    let engine = &ctx.engine;
    let identity = ctx.identity(owner)?;
    let adopts = |meta: &ObjectMeta| ctx.handler.adopts(&current.object, meta);
    let reaches = |id: &ObjectId| ctx.handler.reaches(&current.object, id);
    let actor = Actor {
        owner,
        takes_back: ctx.handler.info().takes_back,
        adopts: &adopts,
        reaches: &reaches,
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

/// What a successful run did.
pub(super) struct Ran {
    /// The steps' output and what they applied.
    pub(super) done: Done,
    /// What the resource owns now.
    pub(super) after: BTreeSet<ObjectId>,
    /// The digest of what was applied.
    pub(super) digest: String,
    /// Until when the status of an apply waiting for its objects' first
    /// look may stay parked.
    pub(super) park_until: tokio::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::outcome::{self, HealthState, Outcome};

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
