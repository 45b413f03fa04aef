//! Which revision of a definition serves whom. An accepted generation is
//! added to the definition's revisions (restored from the cluster first,
//! after a restart) and served by the rule its `spec.rollout` gives; the
//! status says which revisions are kept and how many resources each
//! serves.

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::context::DefinitionContext;
use super::generation::{self, Generation, Rejection};
use super::resource::Status;
use super::revisions::{self, History, Revision, Stored};
use crate::kinds::declared::pack::ROLLOUT_FIELD;
use crate::kinds::declared::rollout::{NotKept, RolloutSpec};

/// The rollout `def` asks for (none: every resource on the latest).
pub fn spec_of(def: &DynamicObject) -> RolloutSpec {
    (def.data["spec"].get(ROLLOUT_FIELD))
        .and_then(|rollout| serde_json::from_value(rollout.clone()).ok())
        .unwrap_or_default()
}

/// Adds `generation` to the revisions of `def` and serves them, each
/// resource by the revision its rollout chooses; keeps the new revision
/// and deletes those dropped. Changes nothing when the rollout names a
/// revision that is not kept.
pub async fn serve(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    generation: Generation,
) -> Result<(), NotKept> {
    let name = def.name_any();
    let spec = spec_of(def);
    let mut history = match ctx.serving.revisions(&name) {
        Some(served) => served.history,
        None => restore(ctx, def).await,
    };
    let dropped = history.add(generation.clone(), spec.keep(), spec.stable);
    let latest = history.latest().cloned();
    ctx.serving.serve(&name, generation, history, spec).await?;
    let Some(store) = &ctx.store else {
        return Ok(());
    };
    if let Some(latest) = latest
        && let Err(e) = store.save(def, &latest, &def.data["spec"]).await
    {
        tracing::warn!(definition = %name, revision = latest.number, error = %crate::error_text::kube(&e), "cannot keep the revision: a restart will not serve it");
    }
    for number in dropped {
        if let Err(e) = store.delete(&name, number).await {
            tracing::warn!(definition = %name, revision = number, error = %crate::error_text::kube(&e), "cannot delete a revision no longer kept");
        }
    }
    Ok(())
}

/// The revisions kept for `def` in the cluster, each checked again (one
/// that no longer loads is left out, and said in the log).
async fn restore(ctx: &DefinitionContext, def: &DynamicObject) -> History {
    let Some(store) = &ctx.store else {
        return History::default();
    };
    let stored = match store.load(def).await {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(definition = %def.name_any(), error = %crate::error_text::kube(&e), "cannot read the kept revisions");
            return History::default();
        }
    };
    let mut kept = Vec::new();
    for revision in stored {
        match rebuild(ctx, def, &revision).await {
            Ok(generation) => kept.push(Revision {
                number: revision.number,
                generation,
            }),
            Err(e) => {
                tracing::warn!(definition = %def.name_any(), revision = revision.number, error = %e, "a kept revision does not load: left out");
            }
        }
    }
    let numbers: Vec<u32> = kept.iter().map(|r| r.number).collect();
    tracing::info!(definition = %def.name_any(), revisions = ?numbers, "restored the kept revisions");
    History::from_revisions(kept)
}

/// The generation of a kept revision, loaded as when it was accepted.
async fn rebuild(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    stored: &Stored,
) -> Result<Generation, Rejection> {
    let mut then = def.clone();
    then.data["spec"] = stored.spec.clone();
    then.metadata.generation = Some(stored.generation);
    let mut generation = generation::load(&then, &ctx.work_dir, ctx.isolation.clone())?;
    generation::attach_webhook(&mut generation, ctx.webhook.as_deref())?;
    generation::build_base(&ctx.engine, &mut generation).await?;
    Ok(generation)
}

/// The revisions of `name` in its status: the latest, the stable, each
/// kept one with how many resources it serves.
pub fn status(ctx: &DefinitionContext, name: &str, status: &mut Status) {
    let Some(served) = ctx.serving.revisions(name) else {
        return;
    };
    let counts = served.rollout.counts();
    status.revision = served.history.latest().map(|r| r.number);
    status.stable_revision = Some(served.rollout.stable());
    status.revisions = served.history.status(&counts);
    status.on_revisions = Some(revisions::on_revisions(&counts)).filter(|s| !s.is_empty());
}
