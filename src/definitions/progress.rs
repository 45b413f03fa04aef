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

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::context::DefinitionContext;
use super::resource::{self, ConditionType, Reason, RolloutPhase, RolloutStatus, Status};
use super::rollout::{record_of, spec_of};
use super::serving::Revisions;
use super::writes::event;
use crate::kind::EventType;
use crate::kinds::declared::pack::ROLLOUT_FIELD;
use crate::kinds::declared::rollout::gate::{self, Cause, Seen, Tally, Verdict};
use crate::kinds::declared::rollout::machine::{
    self, Action, RECORD_ANNOTATION, Record, Settled, Situation, Stable, Write,
};
use crate::kinds::declared::rollout::steps::Steps;
use crate::kinds::declared::rollout::{PIN_LABEL, RolloutError, stable_revision};

/// How soon a rollout under way is looked at again, at most.
const RECHECK_STEP: Duration = Duration::from_secs(5);
/// … right after a write (its watch event usually comes first).
const RECHECK_WRITTEN: Duration = Duration::from_secs(1);
/// The resources of a kind read per list call.
const PAGE: u32 = 500;
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
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &resource::api_resource());
    let fresh = match api.get(&name).await {
        Ok(fresh) => fresh,
        Err(e) => {
            tracing::warn!(definition = %name, error = %e, "cannot read the definition for its rollout");
            return Some(RECHECK_STEP);
        }
    };
    if fresh.metadata.generation != def.metadata.generation {
        // A newer spec than this reconcile accepted: its own reconcile comes.
        return Some(RECHECK_WRITTEN);
    }
    let spec = spec_of(&fresh);
    let record = record_of(&fresh);
    let latest = served.rollout.latest();
    let gone = match spec.stable {
        None => None,
        Some(_) => stable_revision(
            &served.history.kinds().keys().copied().collect(),
            &spec,
            &served.history.refused_numbers(),
        )
        .err(),
    };
    let stable = match (spec.stable, &gone) {
        (None, _) => Stable::Unset,
        (Some(_), Some(_)) => Stable::Gone,
        (Some(n), None) => Stable::Servable(n),
    };
    let mut situation = Situation {
        latest,
        latest_withdrawn: spec.withdrawn().contains(&latest),
        stable,
        digest: steps.digest(),
        steps: steps.len(),
        paused: spec.is_paused(),
        record: record.as_ref(),
        verdict: None,
    };
    let shown = machine::serving_step(record.as_ref(), latest, spec.stable, steps.digest());
    let now = jiff::Timestamp::now();
    let mut seen = None;
    if let Some(step) = shown {
        match observe(ctx, &served, &steps, step, latest).await {
            Ok(observed) => seen = Some(observed),
            Err(e) => {
                tracing::warn!(definition = %name, error = %e, "cannot list the kind's resources for the rollout");
                return Some(RECHECK_STEP);
            }
        }
    }
    // Judged whenever a step is served, to show; decides only while no
    // pause holds it.
    let judged = match (shown, &seen) {
        (Some(step), Some(observed)) => {
            let since = record.as_ref().map_or(now, |r| r.since);
            steps
                .step(step)
                .map(|gate| gate::judge(gate, &observed.members, latest, since, now))
        }
        _ => None,
    };
    if machine::gated_step(&situation).is_some() {
        situation.verdict = judged.as_ref().map(|(verdict, _)| verdict);
    }
    let action = machine::decide(&situation);
    let write = action.write(&situation, now);
    let mut record_now = record.clone();
    let mut recheck = recheck_after(&action, judged.as_ref().map(|(v, _)| v));
    if let Some(write) = &write {
        match persist(&api, &fresh, write).await {
            Ok(()) => {
                tell(ctx, def, &action, &situation, &steps, seen.as_ref()).await;
                if let Some(written) = &write.record {
                    record_now = Some(written.clone());
                }
                recheck = Some(RECHECK_WRITTEN);
            }
            Err(e) => {
                tracing::debug!(definition = %name, error = %e, "the rollout's record was not written (changed meanwhile): looked at again");
                return Some(RECHECK_WRITTEN);
            }
        }
    }
    let changes_stable = write.as_ref().is_some_and(|w| w.stable.is_some());
    // A new stable revision is served with the generation it makes; until
    // then (or while the spec served is not this one: refused, or not
    // looked at yet), what is served stays.
    if !changes_stable && served.spec == spec {
        let step = machine::serving_step(record_now.as_ref(), latest, spec.stable, steps.digest());
        ctx.serving.serve_step(&name, step).await;
    }
    let view = View {
        action: &action,
        record: record_now.as_ref(),
        latest,
        stable: write.as_ref().and_then(|w| w.stable).or(spec.stable),
        steps: &steps,
        seen: seen.as_ref(),
        tally: judged.as_ref().map(|(_, tally)| *tally),
        verdict: judged.as_ref().map(|(verdict, _)| verdict),
        gone: gone.as_ref(),
    };
    show(ctx, &name, &view, status, def.metadata.generation);
    recheck
}

/// When to look again after `action` (`None`: the usual recheck).
fn recheck_after(action: &Action, verdict: Option<&Verdict>) -> Option<Duration> {
    match (action, verdict) {
        (Action::Wait, Some(Verdict::Waiting { left, .. })) => {
            Some((*left).clamp(Duration::from_secs(1), RECHECK_STEP))
        }
        (Action::Wait | Action::Start | Action::Advance | Action::Resume, _) => Some(RECHECK_STEP),
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
    ctx.engine.metrics().rollout_gone(name);
}

/// The kind's resources, as a rollout at `step` of `steps` to revision
/// `latest` sees them.
#[derive(Debug, Default)]
struct Observed {
    /// The resources the rollout moves (all but the pinned).
    resources: u64,
    /// Of them, those whose status says the latest revision.
    updated: u64,
    /// Those of the steps up to `step`, as the gate sees them.
    members: Vec<Seen>,
}

/// Lists the resources of the kind the operator serves (its namespace,
/// or all), a page at a time, keeping what the gate of `step` reads.
async fn observe(
    ctx: &DefinitionContext,
    served: &Revisions,
    steps: &Steps,
    step: usize,
    latest: u32,
) -> Result<Observed, kube::Error> {
    let Some(kind) = served.rollout.latest_kind() else {
        return Ok(Observed::default());
    };
    let api = match &ctx.engine.settings().namespace {
        Some(ns) if kind.namespaced() => {
            Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, &kind.resource)
        }
        _ => Api::<DynamicObject>::all_with(ctx.client.clone(), &kind.resource),
    };
    let with_view = steps.step(step).is_some_and(|s| s.expression.is_some());
    let mut observed = Observed::default();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        for object in &page.items {
            let labels: BTreeMap<String, String> = object.labels().clone();
            if labels.contains_key(PIN_LABEL) {
                continue;
            }
            let value = serde_json::to_value(object).unwrap_or(Value::Null);
            observed.resources += 1;
            if value["status"]["revision"].as_u64() == Some(u64::from(latest)) {
                observed.updated += 1;
            }
            let namespace = object.namespace();
            if steps.reached(step, namespace.as_deref(), &object.name_any(), &labels) {
                observed.members.push(Seen::of(&value, latest, with_view));
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(observed),
        }
    }
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

/// Publishes the event of a decision just written, and counts a rollback.
async fn tell(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    action: &Action,
    s: &Situation<'_>,
    steps: &Steps,
    seen: Option<&Observed>,
) {
    let n = steps.len();
    let step = s.record.map_or(0, |r| r.step) + 1;
    let from = match s.stable {
        Stable::Servable(from) => from,
        _ => s.latest,
    };
    let latest = s.latest;
    let (type_, reason, note) = match action {
        Action::AdoptStable => (
            EventType::Normal,
            "StableAdopted",
            format!(
                "spec.rollout.stable set to {latest}, the revision serving every resource: the next revision rolls out from it in {n} step(s)"
            ),
        ),
        Action::Start => (
            EventType::Normal,
            "RolloutStarted",
            format!("revision {latest} rolls out from revision {from}: step 1 of {n} begins"),
        ),
        Action::Advance => (
            EventType::Normal,
            "RolloutStep",
            format!(
                "step {step} of {n} passed its gate: step {} begins{}",
                step + 1,
                moved(seen, latest)
            ),
        ),
        Action::Promote => (
            EventType::Normal,
            "Promoted",
            format!(
                "every step passed its gate{}: revision {latest} is stable (spec.rollout.stable)",
                moved(seen, latest)
            ),
        ),
        Action::RollBack(failure) => {
            ctx.engine.metrics().rolled_back(&def.name_any());
            (
                EventType::Warning,
                "RolledBack",
                format!(
                    "revision {latest} rolled back at step {step} of {n}: {}; every resource goes back to revision {from}",
                    failure.message
                ),
            )
        }
        Action::Pause => (
            EventType::Normal,
            "RolloutPaused",
            format!(
                "the rollout of revision {latest} holds at step {step} of {n} (spec.rollout.paused)"
            ),
        ),
        Action::Resume => (
            EventType::Normal,
            "RolloutResumed",
            format!(
                "the rollout of revision {latest} goes on at step {step} of {n}, its gate's window anew"
            ),
        ),
        Action::Stop => (
            EventType::Normal,
            "RolloutStopped",
            format!(
                "spec.rollout.stable was set by hand during the rollout of revision {latest}: it ends at step {step} of {n}"
            ),
        ),
        Action::Refuse | Action::Settled(_) | Action::Hold | Action::Wait => return,
    };
    event(ctx, def, type_, reason, &note).await;
}

/// `: 37 of 120 resources on revision 5` (nothing when not counted).
fn moved(seen: Option<&Observed>, latest: u32) -> String {
    seen.map_or_else(String::new, |o| {
        format!(
            " ({} of {} resources on revision {latest})",
            o.updated, o.resources
        )
    })
}

/// What the status says of a rollout after a look.
struct View<'a> {
    action: &'a Action,
    record: Option<&'a Record>,
    latest: u32,
    stable: Option<u32>,
    steps: &'a Steps,
    seen: Option<&'a Observed>,
    tally: Option<Tally>,
    verdict: Option<&'a Verdict>,
    gone: Option<&'a RolloutError>,
}

/// Sets `status.rollout`, `RolledOut` and the gauges of `name`.
fn show(
    ctx: &DefinitionContext,
    name: &str,
    view: &View,
    status: &mut Status,
    generation: Option<i64>,
) {
    let (phase, ok, reason, message) = condition(view);
    let n = view.steps.len();
    let step = match (phase, view.record) {
        (RolloutPhase::Waiting | RolloutPhase::Refused, _) | (_, None) => 0,
        (_, Some(record)) => record.step + 1,
    };
    let counts = view.seen.map(|o| (o.resources, o.updated));
    let failed = view.tally.map(|t| t.failed);
    let progress = progress(phase, view, step, counts, failed);
    status.rollout = Some(RolloutStatus {
        revision: view.latest,
        step: u32::try_from(step).unwrap_or(u32::MAX),
        steps: u32::try_from(n).unwrap_or(u32::MAX),
        phase,
        resources: counts.map(|(all, _)| all),
        updated: counts.map(|(_, on)| on),
        failed,
        progress,
    });
    // Under way, the condition says the progress line, then what it waits for.
    let line = status.rollout.as_ref().map(|r| r.progress.clone());
    let message = match line {
        Some(line) if message.is_empty() || message.starts_with("; ") => format!("{line}{message}"),
        _ => message,
    };
    status.set(ConditionType::RolledOut, ok, reason, &message, generation);
    let under_way = matches!(phase, RolloutPhase::Progressing | RolloutPhase::Paused);
    let at = if under_way { step } else { 0 };
    let metrics = ctx.engine.metrics();
    metrics.rollout_at(
        name,
        u32::try_from(at).unwrap_or(u32::MAX),
        u32::try_from(n).unwrap_or(u32::MAX),
    );
}

/// The phase, and the `RolledOut` condition (a message empty, or starting
/// with `; `, follows the progress line).
fn condition(view: &View) -> (RolloutPhase, bool, Reason, String) {
    let latest = view.latest;
    let n = view.steps.len();
    let stable = view.stable.unwrap_or(latest);
    match view.action {
        Action::Refuse => {
            let why = view.gone.map_or_else(String::new, ToString::to_string);
            let reason = view
                .gone
                .map_or(Reason::RevisionNotKept, RolloutError::reason);
            (
                RolloutPhase::Refused,
                false,
                reason,
                format!("the rollout of revision {latest} does not start: {why}"),
            )
        }
        Action::AdoptStable | Action::Settled(Settled::Complete) => (
            RolloutPhase::Complete,
            true,
            Reason::Complete,
            format!("revision {latest} is stable: every resource not pinned is on it"),
        ),
        Action::Promote => (
            RolloutPhase::Complete,
            true,
            Reason::Complete,
            format!("every step passed its gate: revision {latest} is stable"),
        ),
        Action::Settled(Settled::LatestWithdrawn) => (
            RolloutPhase::Refused,
            false,
            Reason::RevisionWithdrawn,
            format!(
                "the latest revision {latest} is withdrawn (spec.rollout.withdrawn): it rolls out to no one"
            ),
        ),
        Action::Settled(Settled::ByHand) | Action::Stop => (
            RolloutPhase::Stopped,
            false,
            Reason::StableSetByHand,
            format!(
                "spec.rollout.stable was set to {stable} by hand during or after the rollout of revision {latest}, which ended there: every resource not pinned is on {stable}; a new revision rolls out again"
            ),
        ),
        Action::Settled(Settled::RolledBack) | Action::RollBack(_) => {
            let failure = match view.action {
                Action::RollBack(f) => Some((f.cause, f.message.clone())),
                _ => view
                    .record
                    .and_then(|r| r.failure.as_ref())
                    .map(|f| (f.cause, f.message.clone())),
            };
            let (cause, why) = failure.unwrap_or((Cause::NotReady, String::new()));
            let reason = match cause {
                Cause::Stalled => Reason::GateStalled,
                Cause::NotReady => Reason::GateTimedOut,
                Cause::Expression => Reason::GateConditionFailed,
            };
            let step = view.record.map_or(1, |r| r.step + 1);
            (
                RolloutPhase::RolledBack,
                false,
                reason,
                format!(
                    "revision {latest} rolled back at step {step} of {n}: {why}; every resource not pinned is back on revision {stable}; the next revision rolls out again (to try this one again, remove the annotation {RECORD_ANNOTATION})"
                ),
            )
        }
        Action::Hold
            if view
                .record
                .is_none_or(|r| r.revision != latest || !r.active()) =>
        {
            (
                RolloutPhase::Waiting,
                false,
                Reason::Paused,
                format!(
                    "revision {latest} waits to roll out: spec.rollout.paused holds it before step 1 of {n}"
                ),
            )
        }
        Action::Hold | Action::Pause => {
            let gate = match view.verdict {
                Some(Verdict::Passed) => "; its gate passed".to_string(),
                Some(Verdict::Waiting { why, .. }) => format!("; its gate waits: {why}"),
                Some(Verdict::Failed(failure)) => format!(
                    "; its gate fails: {} (nothing is rolled back while paused)",
                    failure.message
                ),
                None => String::new(),
            };
            let step = view.record.map_or(1, |r| r.step + 1);
            (
                RolloutPhase::Paused,
                false,
                Reason::Paused,
                format!(
                    "the rollout of revision {latest} holds at step {step} of {n} (spec.rollout.paused){gate}; set paused to false to go on"
                ),
            )
        }
        Action::Start | Action::Advance | Action::Resume | Action::Wait => {
            let waits = match view.verdict {
                Some(Verdict::Waiting { why, .. }) => format!("; waiting for {why}"),
                _ => String::new(),
            };
            (RolloutPhase::Progressing, false, Reason::Progressing, waits)
        }
    }
}

/// One line: `step 2 of 4: 37 of 120 resources on revision 5, 0 failed`.
fn progress(
    phase: RolloutPhase,
    view: &View,
    step: usize,
    counts: Option<(u64, u64)>,
    failed: Option<u64>,
) -> String {
    let latest = view.latest;
    let n = view.steps.len();
    let counted = match (counts, failed) {
        (Some((all, on)), Some(failed)) => {
            format!(": {on} of {all} resources on revision {latest}, {failed} failed")
        }
        (Some((all, on)), None) => format!(": {on} of {all} resources on revision {latest}"),
        _ => String::new(),
    };
    match phase {
        RolloutPhase::Progressing => format!("step {step} of {n}{counted}"),
        RolloutPhase::Paused => format!("paused at step {step} of {n}{counted}"),
        RolloutPhase::Waiting => format!("paused before step 1 of {n}"),
        RolloutPhase::RolledBack => format!("revision {latest} rolled back at step {step} of {n}"),
        RolloutPhase::Complete => format!(
            "complete: revision {} is stable",
            view.stable.unwrap_or(latest)
        ),
        RolloutPhase::Stopped => format!(
            "stopped: stable set to {} by hand",
            view.stable.unwrap_or(latest)
        ),
        RolloutPhase::Refused => format!("refused: revision {latest} does not roll out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kinds::declared::rollout::gate::Failure;
    use crate::kinds::declared::rollout::machine::Phase;
    use crate::kinds::declared::rollout::steps::Step;

    fn steps() -> Steps {
        let shares = [10, 50, 100].map(|p| Step {
            percent: Some(p),
            ..Step::default()
        });
        Steps::compile(&shares, None, &BTreeMap::new()).unwrap()
    }

    fn record(step: usize, phase: Phase) -> Record {
        Record {
            revision: 5,
            from: 4,
            steps: "d".into(),
            step,
            since: jiff::Timestamp::UNIX_EPOCH,
            phase,
            failure: None,
        }
    }

    fn view<'a>(
        action: &'a Action,
        record: Option<&'a Record>,
        steps: &'a Steps,
        seen: Option<&'a Observed>,
    ) -> View<'a> {
        View {
            action,
            record,
            latest: 5,
            stable: Some(4),
            steps,
            seen,
            tally: Some(Tally {
                members: 40,
                ready: 37,
                failed: 0,
            }),
            verdict: None,
            gone: None,
        }
    }

    #[test]
    fn the_progress_reads_as_one_line_per_phase() {
        let steps = steps();
        let observed = Observed {
            resources: 120,
            updated: 37,
            members: Vec::new(),
        };
        let running = record(1, Phase::Progressing);
        let v = view(&Action::Wait, Some(&running), &steps, Some(&observed));
        let (phase, ok, reason, _) = condition(&v);
        assert_eq!(
            (phase, ok, reason),
            (RolloutPhase::Progressing, false, Reason::Progressing)
        );
        assert_eq!(
            progress(phase, &v, 2, Some((120, 37)), Some(0)),
            "step 2 of 3: 37 of 120 resources on revision 5, 0 failed"
        );
        let paused = record(1, Phase::Paused);
        let v = view(&Action::Hold, Some(&paused), &steps, None);
        let (phase, _, reason, message) = condition(&v);
        assert_eq!((phase, reason), (RolloutPhase::Paused, Reason::Paused));
        assert!(message.contains("holds at step 2 of 3"), "{message}");
        let v = view(&Action::Hold, None, &steps, None);
        let (phase, _, _, message) = condition(&v);
        assert_eq!(phase, RolloutPhase::Waiting);
        assert!(message.contains("before step 1 of 3"), "{message}");
        assert_eq!(
            progress(phase, &v, 0, None, None),
            "paused before step 1 of 3"
        );
    }

    #[test]
    fn a_rollback_says_why_with_a_typed_reason() {
        let steps = steps();
        let failure = Failure {
            cause: Cause::Stalled,
            message: "1 of 1 resource(s) Stalled on revision 5: ns/a (x)".into(),
        };
        let running = record(0, Phase::Progressing);
        let action = Action::RollBack(failure);
        let v = view(&action, Some(&running), &steps, None);
        let (phase, ok, reason, message) = condition(&v);
        assert_eq!(
            (phase, ok, reason),
            (RolloutPhase::RolledBack, false, Reason::GateStalled)
        );
        assert!(
            message
                .starts_with("revision 5 rolled back at step 1 of 3: 1 of 1 resource(s) Stalled"),
            "{message}"
        );
        assert!(message.contains("back on revision 4"), "{message}");
        assert_eq!(
            progress(phase, &v, 1, None, None),
            "revision 5 rolled back at step 1 of 3"
        );
        // After a restart: from the record.
        let mut recorded = record(0, Phase::RolledBack);
        recorded.failure = Some(machine::RecordedFailure {
            cause: Cause::NotReady,
            message: "not Ready".into(),
        });
        let settled = Action::Settled(Settled::RolledBack);
        let v = view(&settled, Some(&recorded), &steps, None);
        let (_, _, reason, message) = condition(&v);
        assert_eq!(reason, Reason::GateTimedOut);
        assert!(message.contains(": not Ready;"), "{message}");
    }

    #[test]
    fn a_stable_revision_gone_refuses_before_it_starts() {
        let steps = steps();
        let gone = RolloutError::NotKept {
            what: "spec.rollout.stable 3".into(),
            kept: vec![4, 5],
        };
        let mut v = view(&Action::Refuse, None, &steps, None);
        v.gone = Some(&gone);
        let (phase, ok, reason, message) = condition(&v);
        assert_eq!(
            (phase, ok, reason),
            (RolloutPhase::Refused, false, Reason::RevisionNotKept)
        );
        assert_eq!(
            message,
            "the rollout of revision 5 does not start: spec.rollout.stable 3 is not a kept revision (kept: 4, 5)"
        );
    }
}
