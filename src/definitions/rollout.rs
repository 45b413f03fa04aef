//! Which revision of a definition serves whom. An accepted generation is
//! added to the definition's revisions (restored from the cluster first,
//! after a restart, each checked: only those the operator signed and
//! recorded are served) and served by the rule its `spec.rollout` gives;
//! the status says which revisions are kept, which may be pinned, how many
//! resources each serves, and which stored ones were refused.

use std::collections::BTreeMap;

use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};

use super::context::{DefinitionContext, NAMES_SHOWN};
use super::generation::{self, Generation, Rejection};
use super::resource::{ConditionType, Reason, Status};
use super::revisions::{self, History, Refused, Revision, Stored, Tampered};
use super::serving::Revisions;
use super::writes::{event, status_of};
use crate::kind::PlannedEvent;
use crate::kinds::declared::pack::ROLLOUT_FIELD;
use crate::kinds::declared::rollout::machine::{self, RECORD_ANNOTATION, Record};
use crate::kinds::declared::rollout::{RolloutError, RolloutSpec};

/// The rollout `def` asks for (none: every resource on the latest).
pub fn spec_of(def: &DynamicObject) -> RolloutSpec {
    (def.data["spec"].get(ROLLOUT_FIELD))
        .and_then(|rollout| serde_json::from_value(rollout.clone()).ok())
        .unwrap_or_default()
}

/// The record of `def`'s rollout, if it has a readable one.
pub fn record_of(def: &DynamicObject) -> Option<Record> {
    def.annotations()
        .get(RECORD_ANNOTATION)
        .and_then(|text| Record::parse(text))
}

/// The step (from 0) `def`'s record makes the kind serve the latest
/// revision `latest` to, under `spec`.
pub fn recorded_step(def: &DynamicObject, latest: u32, spec: &RolloutSpec) -> Option<usize> {
    let digest = spec.steps_digest()?;
    machine::serving_step(record_of(def).as_ref(), latest, spec.stable, &digest)
}

/// A rollout that cannot serve, and what serves meanwhile.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}; {}", meanwhile(*.stable_before))]
pub struct NotServed {
    /// Why.
    pub error: RolloutError,
    /// The stable revision of what goes on serving (`None`: nothing was
    /// served since the operator started).
    pub stable_before: Option<u32>,
}

fn meanwhile(stable_before: Option<u32>) -> String {
    match stable_before {
        Some(n) => format!("what served before keeps serving (stable revision {n})"),
        None => "the kind is not served until the rollout names a revision that may serve".into(),
    }
}

/// Adds `generation` to the revisions of `def` and serves them, each
/// resource by the revision its rollout chooses; keeps the new revision
/// and deletes those dropped. Changes nothing when the rollout's stable
/// revision is not kept, was refused at restore, or is withdrawn.
pub async fn serve(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    generation: Generation,
) -> Result<(), NotServed> {
    let name = def.name_any();
    let spec = spec_of(def);
    let before = ctx.serving.revisions(&name);
    let mut history = match &before {
        Some(served) => served.history.clone(),
        None => restore(ctx, def).await,
    };
    let dropped = history.add(generation.clone(), spec.keep(), spec.stable);
    let latest = history.latest().map_or(0, |r| r.number);
    let step = recorded_step(def, latest, &spec);
    let served = (ctx.serving)
        .serve(&name, generation, history.clone(), spec.clone(), step)
        .await;
    if let Err(error) = served {
        let stable_before = before.map(|b| b.rollout.stable());
        return Err(NotServed {
            error,
            stable_before,
        });
    }
    if let Some(before) = &before {
        tell_withdrawn(ctx, def, before, &spec).await;
    }
    keep(ctx, def, &history, dropped).await;
    Ok(())
}

/// Writes the latest revision of `history` to the cluster, signed, and
/// deletes those `dropped`.
async fn keep(ctx: &DefinitionContext, def: &DynamicObject, history: &History, dropped: Vec<u32>) {
    let Some(store) = &ctx.store else {
        return;
    };
    let name = def.name_any();
    if let Some(latest) = history.latest()
        && let Err(e) = store.save(def, latest, &def.data["spec"]).await
    {
        tracing::warn!(definition = %name, revision = latest.number, error = %crate::error_text::any(&e), "cannot keep the revision: a restart will not serve it");
    }
    for number in dropped {
        if let Err(e) = store.delete(&name, number).await {
            tracing::warn!(definition = %name, revision = number, error = %crate::error_text::kube(&e), "cannot delete a revision no longer kept");
        }
    }
}

/// Tells, on the definition, of each kept revision `spec` withdraws that
/// was not withdrawn `before`: how many resources it served move to the
/// stable one.
async fn tell_withdrawn(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    before: &Revisions,
    spec: &RolloutSpec,
) {
    let Some(now) = ctx.serving.revisions(&def.name_any()) else {
        return;
    };
    let counts = before.rollout.counts();
    let was = before.spec.withdrawn();
    let kept = now.history.kinds();
    for number in spec.withdrawn().difference(&was) {
        if !kept.contains_key(number) {
            continue;
        }
        let serving = counts.get(number).copied().unwrap_or_default();
        let note = format!(
            "revision {number} is withdrawn: the {serving} resource(s) it served move to the stable revision {}; it may no longer be pinned or made stable",
            now.rollout.stable()
        );
        event(ctx, def, PlannedEvent::normal("RevisionWithdrawn", note)).await;
    }
}

/// The revisions kept for `def` in the cluster, each checked again
/// ([`restore_quietly`]); each refused one (up to a few) said in an event.
async fn restore(ctx: &DefinitionContext, def: &DynamicObject) -> History {
    let history = restore_quietly(ctx, def).await;
    if let Some(store) = &ctx.store {
        // One event each, up to a few: whoever writes many forged ones
        // gets no flood (the condition counts them all).
        for refusal in history.refused().iter().take(NAMES_SHOWN) {
            let note = refused_note(store, refusal);
            event(ctx, def, PlannedEvent::warning("RevisionRefused", note)).await;
        }
    }
    history
}

/// The revisions kept for `def` in the cluster, each checked again: the
/// digest of its spec is the one it claims, the operator's key signed it,
/// the definition's status records it, and it loads. Any other is
/// refused: said in the log, and never served.
pub async fn restore_quietly(ctx: &DefinitionContext, def: &DynamicObject) -> History {
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
    let recorded = status_of(def).revisions;
    let uid = def.uid().unwrap_or_default();
    let signer = store.signer().await;
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for revision in stored {
        let checked = match &signer {
            Ok(signer) => revisions::verify(&revision, &uid, &recorded, signer),
            Err(e) => Err(Tampered::NoKey(e.to_string())),
        };
        let loaded = match checked {
            Ok(()) => (rebuild(ctx, def, &revision).await)
                .map_err(|e| Tampered::DoesNotLoad(e.to_string())),
            Err(why) => Err(why),
        };
        match loaded {
            Ok(generation) => kept.push(Revision {
                number: revision.number,
                generation,
            }),
            Err(why) => {
                let refusal = Refused {
                    name: revision.name,
                    number: revision.number,
                    why,
                };
                tracing::warn!(definition = %def.name_any(), revision = refusal.number, reason = %refusal.why, "a kept revision is refused: never served");
                refused.push(refusal);
            }
        }
    }
    let numbers: Vec<u32> = kept.iter().map(|r| r.number).collect();
    let refused_numbers: Vec<u32> = refused.iter().map(|r| r.number).collect();
    tracing::info!(definition = %def.name_any(), revisions = ?numbers, refused = ?refused_numbers, "restored the kept revisions");
    History::from_revisions(kept, refused)
}

/// `revision 7 (ControllerRevision ns/kinddefinition-x-7): why`.
fn refused_note(store: &revisions::Store, refused: &Refused) -> String {
    format!(
        "revision {} (ControllerRevision {}) is refused and never served: {}",
        refused.number,
        store.path(&refused.name),
        refused.why
    )
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

/// The revisions of `name` in its status: the latest, the stable, those a
/// resource may pin, each kept one with how many resources it serves;
/// and, where revisions are kept in the cluster, `RevisionsVerified`.
pub async fn status(ctx: &DefinitionContext, name: &str, status: &mut Status, number: Option<i64>) {
    let Some(served) = ctx.serving.revisions(name) else {
        return;
    };
    let counts = match ctx.engine.settings().share {
        // Each replica's rollout counts its own share only.
        Some(_) => match counted_by_revision(ctx, &served).await {
            Ok(counts) => counts,
            Err(e) => {
                tracing::debug!(definition = name, error = %crate::error_text::kube(&e), "cannot count the kind's resources by revision");
                return;
            }
        },
        None => served.rollout.counts(),
    };
    status.revision = served.history.latest().map(|r| r.number);
    status.stable_revision = Some(served.rollout.stable());
    status.revisions = served.history.status(&counts);
    status.pinnable = served.rollout.pinnable();
    status.on_revisions = Some(revisions::on_revisions(&counts)).filter(|s| !s.is_empty());
    if let Some(store) = &ctx.store {
        verified_condition(store, &served.history, status, number);
    }
}

/// The kind's resources in every share, by the revision their status
/// names (those without one left out), listed a page at a time.
async fn counted_by_revision(
    ctx: &DefinitionContext,
    served: &Revisions,
) -> Result<BTreeMap<u32, u64>, kube::Error> {
    let mut counts = BTreeMap::new();
    let Some(kind) = served.rollout.latest_kind() else {
        return Ok(counts);
    };
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &kind.resource);
    let mut params = ListParams::default().limit(COUNT_PAGE);
    loop {
        let page = api.list(&params).await?;
        for object in &page.items {
            let revision = object.data["status"]["revision"].as_u64();
            if let Some(revision) = revision.and_then(|r| u32::try_from(r).ok()) {
                *counts.entry(revision).or_default() += 1;
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(counts),
        }
    }
}

/// The resources read per list call when counting them by revision.
const COUNT_PAGE: u32 = 500;

/// `RevisionsVerified`: whether a stored revision was refused at restore.
fn verified_condition(
    store: &revisions::Store,
    history: &History,
    status: &mut Status,
    number: Option<i64>,
) {
    let refused = history.refused();
    if refused.is_empty() {
        let kept: Vec<String> = (history.revisions().iter())
            .map(|r| r.number.to_string())
            .collect();
        let message = format!(
            "every kept revision ({}) is one this operator signed and recorded",
            kept.join(", ")
        );
        status.set(
            ConditionType::RevisionsVerified,
            true,
            Reason::Verified,
            &message,
            number,
        );
        return;
    }
    let mut notes: Vec<String> = (refused.iter().take(NAMES_SHOWN))
        .map(|r| refused_note(store, r))
        .collect();
    if refused.len() > NAMES_SHOWN {
        notes.push(format!("and {} more", refused.len() - NAMES_SHOWN));
    }
    let message = format!(
        "{}; delete what this operator did not write (a refused revision stays unserved)",
        notes.join("; ")
    );
    status.set(
        ConditionType::RevisionsVerified,
        false,
        Reason::RevisionRefused,
        &message,
        number,
    );
}
