//! The deletion path: a resource being deleted has its objects deleted
//! (those in its inventory whose live object carries its marker, each with
//! a UID precondition, as the identity its writes use) before its
//! finalizer goes. A failed delete keeps the resource, and says why.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::apply_path::{fail, publish, render};
use super::context::{Context, ReconcileError, marking};
use super::status_writer::{self, Current};
use super::steps::{self, Actor, Done};
use crate::engine::contract::{EventType, Handler, HandlerError, Step};
use crate::engine::model::identity::Identity;
use crate::engine::model::inventory::{ObjectId, Owner};
use crate::engine::model::outcome::Failure;
use crate::engine::model::overlay::OverlayError;
use crate::engine::model::status::Reason;

/// Reconciles a resource being deleted.
pub(crate) async fn cleanup<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
) -> Result<Action, ReconcileError> {
    let current = status_writer::current(&ctx.engine, &*ctx.handler, obj);
    if ctx.handler.retains(obj) {
        forget(ctx, obj);
        return Ok(Action::await_change());
    }
    let Some(owner) = ctx.owner(obj) else {
        return Ok(Action::await_change());
    };
    let ids = match to_delete(ctx, &current, &owner).await {
        Ok(ids) => ids,
        Err(failure) => return fail(ctx, &current, failure, None, false).await,
    };
    let identity = if ids.is_empty() {
        Identity::Operator
    } else {
        match ctx.identity(&owner) {
            Ok(identity) => identity,
            Err(failure) => return fail(ctx, &current, failure, None, false).await,
        }
    };
    let never = |_: &ObjectMeta| false;
    let reaches = |id: &ObjectId| ctx.handler.reaches(obj, id);
    let actor = Actor {
        owner: &owner,
        takes_back: ctx.handler.info().takes_back,
        adopts: &never,
        reaches: &reaches,
        identity: &identity,
    };
    let mut done = Done::default();
    match steps::delete_owned(&ctx.engine, &actor, ids, Reason::DeleteFailed, &mut done).await {
        Ok(report) => {
            let mut note = match report.deleted.len() {
                0 => "nothing to delete".to_string(),
                n => format!("deleted {n} object(s): {}", names(&report.deleted)),
            };
            if let Some(dropped) = steps::dropped_entries(&report) {
                note.push_str("; ");
                note.push_str(&dropped);
            }
            publish(ctx, obj, EventType::Normal, "Deleted", &note, None).await;
            forget(ctx, obj);
            Ok(Action::await_change())
        }
        Err(failure) => fail(ctx, &current, failure, None, false).await,
    }
}

/// Forgets a resource that is gone: its status memo, a parked status and
/// its kept overlay.
fn forget<H: Handler>(ctx: &Context<H>, obj: &H::Resource) {
    ctx.handler.forget(obj);
    if let Some(uid) = obj.uid() {
        ctx.engine.memo.forget(&uid);
        ctx.engine.parked.release(&uid);
    }
    if let Some(dir) = ctx.kept_overlay(obj.meta()) {
        crate::engine::run::kept::remove(&dir);
    }
}

fn names(ids: &[ObjectId]) -> String {
    crate::text::first_names(ids, crate::text::IN_EVENT, ", ")
}

/// What to delete: the inventory. A resource last applied by a version
/// without inventories (it has an applied digest, no inventory) gets the
/// objects its current plan renders, each still checked for the marker or
/// the kind's adoption rule before it is deleted; while its writes are
/// refused (`Forbidden`), nothing is rendered for it and it stays, as any
/// resource whose delete fails does.
async fn to_delete<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    owner: &Owner,
) -> Result<Vec<ObjectId>, Failure> {
    if let Some(inventory) = &current.common.inventory {
        return Ok(inventory.ids().into_iter().collect());
    }
    if current.common.applied_digest.is_none() {
        return Ok(Vec::new());
    }
    match rendered_objects(ctx, current, owner).await {
        Ok(ids) => Ok(ids.into_iter().collect()),
        Err(Unrendered::Refused(e)) => Err(Failure::new(e.reason(), e.to_string())),
        Err(e) => {
            tracing::warn!(object = %ctx.key(&current.object), error = %e, "cannot tell what a resource without an inventory applied; deleting nothing");
            Ok(Vec::new())
        }
    }
}

/// Why the objects a resource would produce now are not known.
#[derive(Debug, thiserror::Error)]
enum Unrendered {
    /// The resource's writes are refused, and so are its reads.
    #[error(transparent)]
    Refused(HandlerError),
    /// The handler could not observe or plan.
    #[error(transparent)]
    Handler(#[from] HandlerError),
    /// An overlay did not render.
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    /// An overlay did not build.
    #[error("{}", .0.message)]
    Build(Box<Failure>),
}

/// The objects the resource's owned applies would produce now.
async fn rendered_objects<H: Handler>(
    ctx: &Context<H>,
    current: &Current<'_, H::Resource>,
    owner: &Owner,
) -> Result<BTreeSet<ObjectId>, Unrendered> {
    let reader = ctx.reader(&current.object).map_err(Unrendered::Refused)?;
    let observed = ctx
        .handler
        .observe_as(&current.object, &ctx.engine.client, reader.as_deref())
        .await?;
    let plan = ctx.handler.plan(&current.object, &observed)?;
    let owned = crate::engine::contract::Plan::<H::Status> {
        steps: plan
            .steps
            .into_iter()
            .filter(|s| matches!(s, Step::Apply { .. }))
            .collect(),
        ..Default::default()
    };
    let marking = marking(&*ctx.handler, owner.clone());
    let rendered = render(&owned, ctx.templates(), &marking)?;
    let mut ids = BTreeSet::new();
    for overlay in rendered.overlays.iter().flatten() {
        let manifests = steps::build_owned(&ctx.engine, owner, overlay)
            .await
            .map_err(|f| Unrendered::Build(Box::new(f)))?;
        ids.extend(manifests.iter().filter_map(ObjectId::of_manifest));
    }
    Ok(ids)
}
