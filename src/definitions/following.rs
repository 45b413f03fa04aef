//! Definitions under automatic sharding. Each definition is written by
//! one replica, the one whose share holds the definition's UID: it checks
//! each generation, applies the CRD, keeps the revisions, moves the
//! rollout, migrates storage, and writes status and events, as a replica
//! alone does. Every other replica *follows* it: it serves the kind for
//! its own share of the resources from what the writer serves, as the
//! definition says it (its status and rollout record), with the
//! revisions loaded from the cluster and checked as a restart checks them
//! (signed, recorded), and writes nothing of the definition's.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::context::DefinitionContext;
use super::resource::{self, Status};
use super::rollout::{recorded_step, restore_quietly, spec_of};
use super::serving::ServedFrom;
use super::writes::status_of;

/// How soon a followed definition is looked at again when in step (a
/// change of it brings a look at once).
const RECHECK: Duration = Duration::from_secs(120);
/// … and when what it says cannot be served yet (a revision the writer
/// kept but has not recorded yet).
const RECHECK_SOON: Duration = Duration::from_secs(2);

/// Under automatic sharding, how long the writer waits, after a
/// definition orphaning its resources was deleted, before it takes its
/// marker and finalizer off them: every replica stops serving the kind as
/// soon as it sees the deletion, and none may put a finalizer back.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// Serves the kind of `def` as its writer serves it; once `def` is being
/// deleted and orphans its resources, stops at once.
pub async fn follow(def: &DynamicObject, ctx: &DefinitionContext) -> Action {
    let name = def.name_any();
    if def.metadata.deletion_timestamp.is_some() && orphans(def) {
        ctx.serving.stop(&name).await;
        return Action::await_change();
    }
    let status = status_of(def);
    let Some(generation) = status.serving_generation else {
        // The writer serves nothing yet.
        return Action::requeue(RECHECK);
    };
    if in_step(ctx, def, &status) {
        return Action::requeue(RECHECK);
    }
    let history = restore_quietly(ctx, def).await;
    let served = history
        .revisions()
        .iter()
        .rev()
        .find(|r| r.generation.number == generation)
        .map(|r| r.generation.clone());
    let Some(served) = served else {
        tracing::debug!(definition = %name, generation, "the generation served is not among the kept revisions yet");
        return Action::requeue(RECHECK_SOON);
    };
    let spec = spec_of(def);
    let latest = history.latest().map_or(0, |r| r.number);
    let step = recorded_step(def, latest, &spec);
    let following = ServedFrom {
        generation: served,
        history,
        spec,
        step,
    };
    match ctx.serving.follow(&name, following).await {
        Ok(()) => {
            tracing::info!(definition = %name, generation, revision = latest, "serving as its writer serves it");
            Action::requeue(RECHECK)
        }
        Err(e) => {
            tracing::warn!(definition = %name, error = %e, "cannot serve as its writer serves it");
            Action::requeue(RECHECK_SOON)
        }
    }
}

/// True when what this replica serves for `def` is what its writer
/// serves: the generation, the revisions kept, the rollout asked for and
/// its step.
fn in_step(ctx: &DefinitionContext, def: &DynamicObject, status: &Status) -> bool {
    let name = def.name_any();
    let (Some(current), Some(revisions)) =
        (ctx.serving.current(&name), ctx.serving.revisions(&name))
    else {
        return false;
    };
    let kept: Vec<u32> = revisions
        .history
        .revisions()
        .iter()
        .map(|r| r.number)
        .collect();
    let recorded: Vec<u32> = status.revisions.iter().map(|r| r.revision).collect();
    let spec = spec_of(def);
    let latest = kept.last().copied().unwrap_or_default();
    status.serving_generation == Some(current.number)
        && kept == recorded
        && revisions.spec == spec
        && revisions.rollout.step() == recorded_step(def, latest, &spec)
}

/// True when `def` leaves its resources behind when deleted.
pub fn orphans(def: &DynamicObject) -> bool {
    def.data["spec"]["onDelete"].as_str() == Some("Orphan")
}

/// True while `def` was deleted less than [`ORPHAN_GRACE`] ago.
pub fn within_orphan_grace(def: &DynamicObject) -> bool {
    def.metadata.deletion_timestamp.as_ref().is_some_and(|at| {
        let since = jiff::Timestamp::now().duration_since(at.0);
        since < jiff::SignedDuration::try_from(ORPHAN_GRACE).unwrap_or_default()
    })
}

/// Stops serving the kind of each definition that is gone (its writer
/// removed its finalizer, and the API server the object), until
/// `shutdown` is cancelled: a follower's controller is never told of it.
pub async fn forget_deleted(
    ctx: std::sync::Arc<DefinitionContext>,
    selector: Option<String>,
    shutdown: CancellationToken,
) {
    let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(
        ctx.client.clone(),
        &resource::api_resource(),
    );
    let mut config = watcher::Config::default();
    if let Some(selector) = &selector {
        config = config.labels(selector);
    }
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut listed = std::collections::HashSet::new();
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(event)) => event,
                Some(Err(_)) => continue,
                None => return,
            },
        };
        let gone: Vec<String> = match event {
            watcher::Event::Init => {
                listed.clear();
                Vec::new()
            }
            watcher::Event::InitApply(def) => {
                listed.insert(def.name_any());
                Vec::new()
            }
            watcher::Event::InitDone => (ctx.serving.names().into_iter())
                .filter(|name| !listed.contains(name))
                .collect(),
            watcher::Event::Apply(_) => Vec::new(),
            watcher::Event::Delete(def) => vec![def.name_any()],
        };
        for name in gone {
            ctx.serving.stop(&name).await;
            // One of the same name made since is served again.
            ctx.serving.nudge_now(&name);
        }
    }
}
