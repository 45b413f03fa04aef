//! What a look at a rollout says: the event of a decision, the
//! `RolledOut` condition and its typed reason, `status.rollout` with its
//! progress line, and the gauges.

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::super::context::DefinitionContext;
use super::super::resource::{ConditionType, Reason, RolloutPhase, RolloutStatus, Status};
use super::super::writes::event;
use super::observe::RolloutView;
use crate::kind::PlannedEvent;
use crate::kinds::declared::rollout::RolloutError;
use crate::kinds::declared::rollout::gate::{Cause, Tally, Verdict};
use crate::kinds::declared::rollout::machine::{
    Action, RECORD_ANNOTATION, Record, Settled, Situation, Stable,
};
use crate::kinds::declared::rollout::steps::Steps;

/// Publishes the event of a decision just written, and counts a rollback.
pub async fn tell(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    action: &Action,
    s: &Situation<'_>,
    steps: &Steps,
    seen: Option<&RolloutView>,
) {
    let n = steps.len();
    let step = s.record.map_or(0, |r| r.step) + 1;
    let from = match s.stable {
        Stable::Servable(from) => from,
        _ => s.latest,
    };
    let latest = s.latest;
    let said = match action {
        Action::AdoptStable => PlannedEvent::normal(
            "StableAdopted",
            format!(
                "spec.rollout.stable set to {latest}, the revision serving every resource: the next revision rolls out from it in {n} step(s)"
            ),
        ),
        Action::Start => PlannedEvent::normal(
            "RolloutStarted",
            format!("revision {latest} rolls out from revision {from}: step 1 of {n} begins"),
        ),
        Action::Advance => PlannedEvent::normal(
            "RolloutStep",
            format!(
                "step {step} of {n} passed its gate: step {} begins{}",
                step + 1,
                moved(seen, latest)
            ),
        ),
        Action::Promote => PlannedEvent::normal(
            "Promoted",
            format!(
                "every step passed its gate{}: revision {latest} is stable (spec.rollout.stable)",
                moved(seen, latest)
            ),
        ),
        Action::RollBack(failure) => {
            ctx.metrics.rolled_back(&def.name_any());
            PlannedEvent::warning(
                "RolledBack",
                format!(
                    "revision {latest} rolled back at step {step} of {n}: {}; every resource goes back to revision {from}",
                    failure.message
                ),
            )
        }
        Action::Pause => PlannedEvent::normal(
            "RolloutPaused",
            format!(
                "the rollout of revision {latest} holds at step {step} of {n} (spec.rollout.paused)"
            ),
        ),
        Action::Resume => PlannedEvent::normal(
            "RolloutResumed",
            format!(
                "the rollout of revision {latest} goes on at step {step} of {n}, its gate's window anew"
            ),
        ),
        Action::Stop => PlannedEvent::normal(
            "RolloutStopped",
            format!(
                "spec.rollout.stable was set by hand during the rollout of revision {latest}: it ends at step {step} of {n}"
            ),
        ),
        Action::Refuse | Action::Settled(_) | Action::Hold | Action::Wait => return,
    };
    event(ctx, def, said).await;
}

/// `: 37 of 120 resources on revision 5` (nothing when not counted).
fn moved(seen: Option<&RolloutView>, latest: u32) -> String {
    seen.map_or_else(String::new, |o| {
        format!(
            " ({} of {} resources on revision {latest})",
            o.updated, o.resources
        )
    })
}

/// What the status says of a rollout after a look.
pub struct View<'a> {
    pub action: &'a Action,
    pub record: Option<&'a Record>,
    pub latest: u32,
    pub stable: Option<u32>,
    pub steps: &'a Steps,
    pub seen: Option<&'a RolloutView>,
    pub tally: Option<Tally>,
    pub verdict: Option<&'a Verdict>,
    pub gone: Option<&'a RolloutError>,
}

/// Sets `status.rollout`, `RolledOut` and the gauges of `name`.
pub fn show(
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
    let metrics = &ctx.metrics;
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
                .map_or(Reason::RevisionNotKept, Reason::of_rollout);
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

    use std::collections::BTreeMap;

    use crate::kinds::declared::rollout::gate::Failure;
    use crate::kinds::declared::rollout::machine::{self, Phase};
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
        seen: Option<&'a RolloutView>,
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
        let observed = RolloutView {
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
