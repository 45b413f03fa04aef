//! A definition's automatic rollout (`spec.rollout.steps`), one look per
//! reconcile: read where it is, judge the running step's gate on the
//! resources' statuses, decide ([`machine::decide`]), write the decision,
//! serve the step it records, and say where it is in the status, an event
//! and the metrics.
//!
//! Where a rollout is lives in the definition's annotation
//! [`RECORD_ANNOTATION`] ([`Record`]), written by the operator with the
//! definition's `resourceVersion` as a precondition: it survives a
//! restart, every replica (and every shard's leader) reads the same, two
//! replicas deciding at once cannot both write, and whoever may write
//! only `kinddefinitions/status` cannot change it (the API server ignores
//! metadata in a status write). The status holds a copy for people and
//! tools, never read back. The record is read fresh from the API server
//! at each look, never from the controller's cache, so a look never
//! serves a step older than one already written.

mod observe;
mod report;

use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::context::DefinitionContext;
use super::resource::{self, ConditionType, Status};
use super::rollout::{record_of, spec_of};
use super::serving::Revisions;
use crate::kinds::declared::pack::ROLLOUT_FIELD;
use crate::kinds::declared::rollout::gate::{self, Tally, Verdict};
use crate::kinds::declared::rollout::machine::{
    self, Action, RECORD_ANNOTATION, Record, Situation, Stable, Write,
};
use crate::kinds::declared::rollout::steps::Steps;
use crate::kinds::declared::rollout::{RolloutError, RolloutSpec, stable_revision};
use observe::{RolloutView, observe};
use report::{View, show, tell};

/// How soon a rollout under way is looked at again, at most.
const RECHECK_STEP: Duration = Duration::from_secs(5);
/// … at least: right after its step began, when its resources are
/// usually becoming Ready.
const RECHECK_FIRST: Duration = Duration::from_secs(1);
/// … right after a write (its watch event usually comes first).
const RECHECK_WRITTEN: Duration = Duration::from_secs(1);
/// The field manager of the operator's writes to a definition.
const MANAGER: &str = "kustomize-operator";

/// One look at the automatic rollout of `def`: decides, writes, serves and
/// sets `status.rollout` and `RolledOut`. When to look again, while it
/// runs.
pub async fn look(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    status: &mut Status,
) -> Option<Duration> {
    let name = def.name_any();
    let served = ctx.serving.revisions(&name);
    let Some((served, steps)) = served.and_then(|r| r.rollout.steps().cloned().map(|s| (r, s)))
    else {
        forget(ctx, &name, status);
        return None;
    };
    let fresh = match read_fresh(ctx, def).await {
        Ok(fresh) => fresh,
        Err(recheck) => return Some(recheck),
    };
    let spec = spec_of(&fresh);
    let record = record_of(&fresh);
    let (stable, gone) = stable_of(&spec, &served);
    let mut situation = Situation {
        latest: served.rollout.latest(),
        latest_withdrawn: spec.withdrawn().contains(&served.rollout.latest()),
        stable,
        digest: steps.digest(),
        steps: steps.len(),
        paused: spec.is_paused(),
        record: record.as_ref(),
        verdict: None,
    };
    let Ok((seen, judged)) = judge(ctx, &served, &steps, &situation, spec.stable).await else {
        return Some(RECHECK_STEP);
    };
    if machine::gated_step(&situation).is_some() {
        situation.verdict = judged.as_ref().map(|(verdict, _)| verdict);
    }
    let action = machine::decide(&situation);
    let Ok(record_now) =
        carry_out(ctx, def, &fresh, &action, &situation, &steps, seen.as_ref()).await
    else {
        return Some(RECHECK_WRITTEN);
    };
    let stable_now = match &action {
        Action::AdoptStable | Action::Promote => Some(situation.latest),
        _ => spec.stable,
    };
    // A new stable revision is served with the generation it makes; until
    // then (or while the spec served is not this one: refused, or not
    // looked at yet), what is served stays.
    if stable_now == spec.stable && served.spec == spec {
        let step = machine::serving_step(
            record_now.as_ref(),
            situation.latest,
            spec.stable,
            steps.digest(),
        );
        ctx.serving.serve_step(&name, step).await;
    }
    let view = View {
        action: &action,
        record: record_now.as_ref(),
        latest: situation.latest,
        stable: stable_now,
        steps: &steps,
        seen: seen.as_ref(),
        tally: judged.as_ref().map(|(_, tally)| *tally),
        verdict: judged.as_ref().map(|(verdict, _)| verdict),
        gone: gone.as_ref(),
    };
    show(ctx, &name, &view, status, def.metadata.generation);
    let written = record_now != record || stable_now != spec.stable;
    if written {
        return Some(RECHECK_WRITTEN);
    }
    let waited = record_now
        .as_ref()
        .map_or(Duration::ZERO, |r| waited_since(r.since));
    recheck_after(&action, judged.as_ref().map(|(verdict, _)| verdict), waited)
}

/// How long ago `since` was (none if it is to come).
fn waited_since(since: jiff::Timestamp) -> Duration {
    let waited = jiff::Timestamp::now().duration_since(since);
    Duration::try_from(waited).unwrap_or_default()
}

/// `def` as the API server has it now (not the controller's cache), when
/// it is the generation this reconcile accepted; else when to look again.
async fn read_fresh(
    ctx: &DefinitionContext,
    def: &DynamicObject,
) -> Result<DynamicObject, Duration> {
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource::api_resource());
    match api.get(&def.name_any()).await {
        Ok(fresh) if fresh.metadata.generation == def.metadata.generation => Ok(fresh),
        // A newer spec than this reconcile accepted: its own reconcile comes.
        Ok(_) => Err(RECHECK_WRITTEN),
        Err(e) => {
            tracing::warn!(definition = %def.name_any(), error = %e, "cannot read the definition for its rollout");
            Err(RECHECK_STEP)
        }
    }
}

/// The stable revision `spec` names among those `served` keeps, and why
/// it cannot serve when it cannot.
fn stable_of(spec: &RolloutSpec, served: &Revisions) -> (Stable, Option<RolloutError>) {
    let Some(stable) = spec.stable else {
        return (Stable::Unset, None);
    };
    let kept = served.history.kinds().keys().copied().collect();
    match stable_revision(&kept, spec, &served.history.refused_numbers()) {
        Ok(_) => (Stable::Servable(stable), None),
        Err(gone) => (Stable::Gone, Some(gone)),
    }
}

/// The verdict of the gate of the step the record serves (with what it
/// counted), when it serves one: judged to show it, and to decide while
/// no pause holds it. `Err`: the resources could not be listed.
async fn judge(
    ctx: &DefinitionContext,
    served: &Revisions,
    steps: &Steps,
    s: &Situation<'_>,
    stable: Option<u32>,
) -> Result<(Option<RolloutView>, Option<(Verdict, Tally)>), kube::Error> {
    let Some(step) = machine::serving_step(s.record, s.latest, stable, steps.digest()) else {
        return Ok((None, None));
    };
    let observed = observe(ctx, served, steps, step, s.latest)
        .await
        .inspect_err(
            |e| tracing::warn!(error = %e, "cannot list the kind's resources for the rollout"),
        )?;
    let now = jiff::Timestamp::now();
    let since = s.record.map_or(now, |r| r.since);
    let judged =
        (steps.step(step)).map(|gate| gate::judge(gate, &observed.members, s.latest, since, now));
    Ok((Some(observed), judged))
}

/// Writes what `action` changes on `fresh` (the definition as read) and
/// tells it in an event. The record as it is now; `Err` when the
/// definition changed meanwhile (nothing written: looked at again).
async fn carry_out(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    fresh: &DynamicObject,
    action: &Action,
    s: &Situation<'_>,
    steps: &Steps,
    seen: Option<&RolloutView>,
) -> Result<Option<Record>, kube::Error> {
    let Some(write) = action.write(s, jiff::Timestamp::now()) else {
        return Ok(s.record.cloned());
    };
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource::api_resource());
    persist(&api, fresh, &write).await.inspect_err(|e| {
        tracing::debug!(definition = %def.name_any(), error = %e, "the rollout's record was not written (the definition changed meanwhile): looked at again");
    })?;
    tell(ctx, def, action, s, steps, seen).await;
    Ok(write.record.or_else(|| s.record.cloned()))
}

/// When to look again after `action` (`None`: the usual recheck), its
/// step having `waited` so far: every second at first, then after a
/// quarter of the time waited, up to [`RECHECK_STEP`]; so a step whose
/// resources are Ready in a few seconds passes its gate within about one
/// more, and one that waits long is listed every few seconds only.
fn recheck_after(action: &Action, verdict: Option<&Verdict>, waited: Duration) -> Option<Duration> {
    let soon = (waited / 4).clamp(RECHECK_FIRST, RECHECK_STEP);
    match (action, verdict) {
        (Action::Wait, Some(Verdict::Waiting { left, .. })) => {
            Some((*left).clamp(RECHECK_FIRST, soon))
        }
        (Action::Wait | Action::Start | Action::Advance | Action::Resume, _) => Some(soon),
        // Held at a step: shown fresh.
        (Action::Hold | Action::Pause, Some(_)) => Some(RECHECK_STEP),
        _ => None,
    }
}

/// No steps (any more): no rollout status, condition or gauges.
fn forget(ctx: &DefinitionContext, name: &str, status: &mut Status) {
    status.rollout = None;
    status
        .conditions
        .retain(|c| c.type_ != ConditionType::RolledOut);
    ctx.metrics.rollout_gone(name);
}

/// Writes `write` on the definition `def` (a merge patch, on the
/// condition that it is still the object read).
async fn persist(
    api: &Api<DynamicObject>,
    def: &DynamicObject,
    write: &Write,
) -> Result<(), kube::Error> {
    let mut patch = json!({"metadata": {"resourceVersion": def.resource_version()}});
    if let Some(record) = &write.record {
        patch["metadata"]["annotations"] = json!({ RECORD_ANNOTATION: record.to_text() });
    }
    if let Some(stable) = write.stable {
        patch["spec"] = json!({ ROLLOUT_FIELD: {"stable": stable} });
    }
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&def.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(left: u64) -> Verdict {
        Verdict::Waiting {
            left: Duration::from_secs(left),
            why: "1 of 2 resource(s) not Ready".into(),
        }
    }

    #[test]
    fn a_waiting_gate_is_looked_at_every_second_at_first_then_less_often() {
        let after = |waited: u64, left: u64| {
            recheck_after(
                &Action::Wait,
                Some(&waiting(left)),
                Duration::from_secs(waited),
            )
        };
        assert_eq!(after(0, 300), Some(Duration::from_secs(1)));
        assert_eq!(after(3, 297), Some(Duration::from_secs(1)));
        assert_eq!(after(10, 290), Some(Duration::from_millis(2500)));
        assert_eq!(after(60, 240), Some(RECHECK_STEP), "at most");
        assert_eq!(
            after(298, 2),
            Some(Duration::from_secs(2)),
            "the window's end"
        );
        assert_eq!(after(299, 0), Some(RECHECK_FIRST), "at least");
    }

    #[test]
    fn a_held_rollout_is_shown_fresh_and_a_finished_one_is_not_looked_at_soon() {
        let held = recheck_after(&Action::Hold, Some(&waiting(100)), Duration::ZERO);
        assert_eq!(held, Some(RECHECK_STEP));
        assert_eq!(recheck_after(&Action::Promote, None, Duration::ZERO), None);
        let advanced = recheck_after(&Action::Advance, None, Duration::ZERO);
        assert_eq!(advanced, Some(RECHECK_FIRST));
    }
}
