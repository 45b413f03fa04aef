//! An automatic rollout as a state machine: one pure function, [`decide`],
//! from what is observed — the latest and the stable revisions, the steps,
//! whether the rollout is paused, the [`Record`] of the rollout so far and
//! the verdict of the running step's gate — to the next [`Action`];
//! [`Action::write`] is what the operator writes for it, and
//! [`serving_step`] the step a record makes the kind serve.
//!
//! Each revision rolls out once: a rollout ends promoted (the latest
//! becomes `spec.rollout.stable`), rolled back (a gate failed: every
//! resource goes back to the stable revision, the latest is not
//! promoted) or stopped (someone set `stable` by hand meanwhile). A new
//! revision, or a change of the steps, starts over from the first step.

use serde::{Deserialize, Serialize};

use super::gate::{Cause, Failure, Verdict};
use crate::text::truncate;

/// The definition's annotation holding its [`Record`] (JSON).
pub const RECORD_ANNOTATION: &str = "kustomize-operator.io/rollout";
/// The longest record read, in bytes.
pub const RECORD_LIMIT: usize = 8 * 1024;
/// The longest failure message recorded, in bytes.
pub const MESSAGE_LIMIT: usize = 1024;

/// Where a rollout is: what the operator last wrote of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The revision rolling out.
    pub revision: u32,
    /// The stable revision it started from.
    pub from: u32,
    /// The digest of the steps it runs.
    pub steps: String,
    /// The step under way (from 0), or the one it ended at.
    pub step: usize,
    /// When that step began (or resumed).
    pub since: jiff::Timestamp,
    /// Where it is.
    pub phase: Phase,
    /// Why it was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<RecordedFailure>,
}

/// A failed gate, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedFailure {
    /// Why, typed.
    pub cause: Cause,
    /// In words.
    pub message: String,
}

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// A step is under way.
    Progressing,
    /// Held at its step by `spec.rollout.paused`.
    Paused,
    /// A gate failed: every resource is back on the stable revision.
    RolledBack,
    /// Every gate passed: the revision is stable.
    Promoted,
    /// `spec.rollout.stable` was changed by hand during the rollout.
    Stopped,
}

impl Record {
    /// The record in `text` (`None`: too long, or not one).
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > RECORD_LIMIT {
            return None;
        }
        serde_json::from_str(text).ok()
    }

    /// The record as the annotation holds it.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// True while it serves a step (progressing or paused).
    pub fn active(&self) -> bool {
        matches!(self.phase, Phase::Progressing | Phase::Paused)
    }
}

/// The stable revision, as the definition's spec names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    /// `spec.rollout.stable` is unset.
    Unset,
    /// It names a revision that may serve.
    Servable(u32),
    /// It names one not kept, refused at restore, or withdrawn.
    Gone,
}

/// What the machine looks at.
#[derive(Debug, Clone, Copy)]
pub struct Situation<'a> {
    /// The latest revision.
    pub latest: u32,
    /// True when the latest is withdrawn.
    pub latest_withdrawn: bool,
    /// The stable revision.
    pub stable: Stable,
    /// The digest of the steps.
    pub digest: &'a str,
    /// How many steps.
    pub steps: usize,
    /// `spec.rollout.paused`.
    pub paused: bool,
    /// The record of the rollout so far.
    pub record: Option<&'a Record>,
    /// The verdict of the running step's gate ([`gated_step`]), when looked at.
    pub verdict: Option<&'a Verdict>,
}

/// What the rollout does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `stable` is unset: it becomes the latest, which serves every
    /// resource now, so that the next revision rolls out from it.
    AdoptStable,
    /// The stable revision cannot serve: nothing starts.
    Refuse,
    /// Nothing to do.
    Settled(Settled),
    /// The first step of the latest revision begins.
    Start,
    /// Paused: nothing moves.
    Hold,
    /// Paused now: the step holds.
    Pause,
    /// Resumed: the step goes on, its window anew.
    Resume,
    /// The gate has not decided yet.
    Wait,
    /// The gate passed: the next step begins.
    Advance,
    /// The last gate passed: the latest becomes stable.
    Promote,
    /// The gate failed: back to the stable revision.
    RollBack(Failure),
    /// `stable` was changed by hand: the rollout ends where it is.
    Stop,
}

/// Why nothing is to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The latest is stable.
    Complete,
    /// The latest was rolled back.
    RolledBack,
    /// `stable` was set by hand during or after the rollout.
    ByHand,
    /// The latest is withdrawn: it rolls out to no one.
    LatestWithdrawn,
}

/// What to write for an action: the record, and `spec.rollout.stable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The record to write, if it changes.
    pub record: Option<Record>,
    /// The stable revision to write, if it changes.
    pub stable: Option<u32>,
}

/// The record of a rollout serving the latest revision now, from `stable`
/// through the steps of `digest`, if there is one.
fn running<'a>(s: &Situation<'a>, stable: u32) -> Option<&'a Record> {
    s.record.filter(|r| {
        r.active()
            && r.revision == s.latest
            && r.from == stable
            && r.steps == s.digest
            && r.step < s.steps
    })
}

/// The step (from 0) whose gate [`decide`] needs the verdict of, if a
/// rollout is progressing (not paused).
pub fn gated_step(s: &Situation) -> Option<usize> {
    let Stable::Servable(stable) = s.stable else {
        return None;
    };
    running(s, stable)
        .filter(|r| r.phase == Phase::Progressing && !s.paused)
        .map(|r| r.step)
}

/// The step (from 0) whose resources the kind serves the latest revision:
/// the record's, while it is active for the latest revision, from the
/// stable one `stable` (`None`: unset), through steps of `digest`.
pub fn serving_step(
    record: Option<&Record>,
    latest: u32,
    stable: Option<u32>,
    digest: &str,
) -> Option<usize> {
    let record = record?;
    let serves = record.active()
        && record.revision == latest
        && Some(record.from) == stable
        && record.steps == digest;
    serves.then_some(record.step)
}

/// The next action.
pub fn decide(s: &Situation) -> Action {
    let stable = match s.stable {
        Stable::Unset => return Action::AdoptStable,
        Stable::Gone => return Action::Refuse,
        Stable::Servable(n) => n,
    };
    if s.latest == stable {
        return Action::Settled(Settled::Complete);
    }
    if s.latest_withdrawn {
        return Action::Settled(Settled::LatestWithdrawn);
    }
    let start = if s.paused {
        Action::Hold
    } else {
        Action::Start
    };
    let Some(record) = s.record.filter(|r| r.revision == s.latest) else {
        return start;
    };
    match record.phase {
        Phase::RolledBack => return Action::Settled(Settled::RolledBack),
        Phase::Promoted | Phase::Stopped => return Action::Settled(Settled::ByHand),
        Phase::Progressing | Phase::Paused => {}
    }
    if record.from != stable {
        return Action::Stop;
    }
    if record.steps != s.digest || record.step >= s.steps {
        return start;
    }
    match (record.phase, s.paused) {
        (Phase::Paused, true) => return Action::Hold,
        (Phase::Paused, false) => return Action::Resume,
        (_, true) => return Action::Pause,
        _ => {}
    }
    match s.verdict {
        Some(Verdict::Passed) if record.step + 1 < s.steps => Action::Advance,
        Some(Verdict::Passed) => Action::Promote,
        Some(Verdict::Failed(failure)) => Action::RollBack(failure.clone()),
        Some(Verdict::Waiting { .. }) | None => Action::Wait,
    }
}

impl Action {
    /// What to write for this action in situation `s`, at `now`.
    pub fn write(&self, s: &Situation, now: jiff::Timestamp) -> Option<Write> {
        let record = |change: &dyn Fn(&mut Record)| {
            let mut record = s.record?.clone();
            change(&mut record);
            Some(record)
        };
        let only = |record: Option<Record>| {
            record.map(|r| Write {
                record: Some(r),
                stable: None,
            })
        };
        match self {
            Self::AdoptStable => Some(Write {
                record: None,
                stable: Some(s.latest),
            }),
            Self::Start => {
                let Stable::Servable(from) = s.stable else {
                    return None;
                };
                only(Some(Record {
                    revision: s.latest,
                    from,
                    steps: s.digest.to_string(),
                    step: 0,
                    since: now,
                    phase: Phase::Progressing,
                    failure: None,
                }))
            }
            Self::Pause => only(record(&|r| r.phase = Phase::Paused)),
            Self::Resume => only(record(&|r| {
                r.phase = Phase::Progressing;
                r.since = now;
            })),
            Self::Advance => only(record(&|r| {
                r.step += 1;
                r.since = now;
            })),
            Self::Promote => record(&|r| r.phase = Phase::Promoted).map(|r| Write {
                record: Some(r),
                stable: Some(s.latest),
            }),
            Self::RollBack(failure) => only(record(&|r| {
                r.phase = Phase::RolledBack;
                r.failure = Some(RecordedFailure {
                    cause: failure.cause,
                    message: truncate(&failure.message, MESSAGE_LIMIT),
                });
            })),
            Self::Stop => only(record(&|r| r.phase = Phase::Stopped)),
            Self::Refuse | Self::Settled(_) | Self::Hold | Self::Wait => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn record(step: usize, phase: Phase) -> Record {
        Record {
            revision: 5,
            from: 4,
            steps: "d".into(),
            step,
            since: at(0),
            phase,
            failure: None,
        }
    }

    /// Revision 5 rolling out over 4, in 4 steps of digest `d`.
    fn situation<'a>(record: Option<&'a Record>, verdict: Option<&'a Verdict>) -> Situation<'a> {
        Situation {
            latest: 5,
            latest_withdrawn: false,
            stable: Stable::Servable(4),
            digest: "d",
            steps: 4,
            paused: false,
            record,
            verdict,
        }
    }

    fn failed() -> Verdict {
        Verdict::Failed(Failure {
            cause: Cause::NotReady,
            message: "1 of 1 resource(s) not Ready".into(),
        })
    }

    #[test]
    fn a_new_revision_starts_at_the_first_step_from_the_stable_one() {
        let s = situation(None, None);
        assert_eq!(decide(&s), Action::Start);
        let written = Action::Start.write(&s, at(7)).unwrap();
        assert_eq!(written.stable, None);
        assert_eq!(
            written.record,
            Some(Record {
                since: at(7),
                ..record(0, Phase::Progressing)
            })
        );
        // A record of the revision before: a new revision starts over.
        let older = Record {
            revision: 3,
            ..record(2, Phase::Progressing)
        };
        assert_eq!(decide(&situation(Some(&older), None)), Action::Start);
        assert_eq!(serving_step(Some(&older), 5, Some(4), "d"), None);
        // So does a change of the steps.
        let other_steps = Record {
            steps: "e".into(),
            ..record(2, Phase::Progressing)
        };
        assert_eq!(decide(&situation(Some(&other_steps), None)), Action::Start);
        assert_eq!(serving_step(Some(&other_steps), 5, Some(4), "d"), None);
        // A step past the last (a record written by hand) too.
        let past = record(9, Phase::Progressing);
        assert_eq!(decide(&situation(Some(&past), None)), Action::Start);
    }

    #[test]
    fn a_passed_gate_advances_and_the_last_promotes() {
        let running = record(1, Phase::Progressing);
        let s = situation(Some(&running), Some(&Verdict::Passed));
        assert_eq!(gated_step(&s), Some(1));
        assert_eq!(decide(&s), Action::Advance);
        let advanced = Action::Advance.write(&s, at(9)).unwrap().record.unwrap();
        assert_eq!((advanced.step, advanced.since), (2, at(9)));
        assert_eq!(serving_step(Some(&advanced), 5, Some(4), "d"), Some(2));
        let last = record(3, Phase::Progressing);
        let s = situation(Some(&last), Some(&Verdict::Passed));
        assert_eq!(decide(&s), Action::Promote);
        let promoted = Action::Promote.write(&s, at(9)).unwrap();
        assert_eq!(promoted.stable, Some(5));
        assert_eq!(promoted.record.as_ref().unwrap().phase, Phase::Promoted);
        // Once stable, the latest serves all: complete.
        let done = promoted.record.unwrap();
        let after = Situation {
            stable: Stable::Servable(5),
            ..situation(Some(&done), None)
        };
        assert_eq!(decide(&after), Action::Settled(Settled::Complete));
        assert_eq!(
            Action::Settled(Settled::Complete).write(&after, at(9)),
            None
        );
    }

    #[test]
    fn a_waiting_gate_waits_and_a_failed_one_rolls_back_for_good() {
        let running = record(0, Phase::Progressing);
        let waiting = Verdict::Waiting {
            left: Duration::from_secs(3),
            why: "x".into(),
        };
        assert_eq!(
            decide(&situation(Some(&running), Some(&waiting))),
            Action::Wait
        );
        assert_eq!(decide(&situation(Some(&running), None)), Action::Wait);
        let failed = failed();
        let s = situation(Some(&running), Some(&failed));
        let Action::RollBack(failure) = decide(&s) else {
            panic!("{:?}", decide(&s));
        };
        let written = Action::RollBack(failure).write(&s, at(5)).unwrap();
        assert_eq!(written.stable, None, "the latest is not promoted");
        let rolled_back = written.record.unwrap();
        assert_eq!(rolled_back.phase, Phase::RolledBack);
        assert_eq!(rolled_back.failure.as_ref().unwrap().cause, Cause::NotReady);
        // Every resource back on the stable revision, and it stays so.
        assert_eq!(serving_step(Some(&rolled_back), 5, Some(4), "d"), None);
        let s = situation(Some(&rolled_back), Some(&Verdict::Passed));
        assert_eq!(decide(&s), Action::Settled(Settled::RolledBack));
        assert_eq!(gated_step(&s), None);
        // Even after the steps change; a new revision rolls out again.
        let s = Situation {
            digest: "e",
            ..situation(Some(&rolled_back), None)
        };
        assert_eq!(decide(&s), Action::Settled(Settled::RolledBack));
        let s = Situation {
            latest: 6,
            ..situation(Some(&rolled_back), None)
        };
        assert_eq!(decide(&s), Action::Start);
    }

    #[test]
    fn a_pause_holds_the_step_and_a_resume_gives_it_a_new_window() {
        let running = record(2, Phase::Progressing);
        let failed = failed();
        let paused = Situation {
            paused: true,
            ..situation(Some(&running), Some(&failed))
        };
        assert_eq!(gated_step(&paused), None, "no gate decides while paused");
        assert_eq!(decide(&paused), Action::Pause);
        let held = Action::Pause.write(&paused, at(4)).unwrap().record.unwrap();
        assert_eq!(
            (held.phase, held.step, held.since),
            (Phase::Paused, 2, at(0))
        );
        assert_eq!(
            serving_step(Some(&held), 5, Some(4), "d"),
            Some(2),
            "the step stays"
        );
        let still = Situation {
            paused: true,
            ..situation(Some(&held), None)
        };
        assert_eq!(decide(&still), Action::Hold);
        let resumed = situation(Some(&held), None);
        assert_eq!(decide(&resumed), Action::Resume);
        let going = Action::Resume
            .write(&resumed, at(60))
            .unwrap()
            .record
            .unwrap();
        assert_eq!(
            (going.phase, going.step, going.since),
            (Phase::Progressing, 2, at(60))
        );
        // Paused before it starts: nothing starts.
        let before = Situation {
            paused: true,
            ..situation(None, None)
        };
        assert_eq!(decide(&before), Action::Hold);
        assert_eq!(Action::Hold.write(&before, at(1)), None);
    }

    #[test]
    fn stable_unset_is_adopted_gone_is_refused_and_changed_by_hand_stops() {
        let unset = Situation {
            stable: Stable::Unset,
            ..situation(None, None)
        };
        assert_eq!(decide(&unset), Action::AdoptStable);
        let adopted = Action::AdoptStable.write(&unset, at(0)).unwrap();
        assert_eq!((adopted.stable, adopted.record), (Some(5), None));
        let gone = Situation {
            stable: Stable::Gone,
            ..situation(None, None)
        };
        assert_eq!(decide(&gone), Action::Refuse);
        assert_eq!(Action::Refuse.write(&gone, at(0)), None);
        // Stable set by hand to 3 during the rollout over 4: it stops there.
        let running = record(1, Phase::Progressing);
        let by_hand = Situation {
            stable: Stable::Servable(3),
            ..situation(Some(&running), Some(&Verdict::Passed))
        };
        assert_eq!(gated_step(&by_hand), None);
        assert_eq!(decide(&by_hand), Action::Stop);
        assert_eq!(serving_step(Some(&running), 5, Some(3), "d"), None);
        let stopped = Action::Stop.write(&by_hand, at(1)).unwrap().record.unwrap();
        let after = Situation {
            stable: Stable::Servable(3),
            ..situation(Some(&stopped), None)
        };
        assert_eq!(decide(&after), Action::Settled(Settled::ByHand));
        // And set back to 4 later: the stopped rollout does not come back.
        let back = situation(Some(&stopped), None);
        assert_eq!(decide(&back), Action::Settled(Settled::ByHand));
        // A latest withdrawn rolls out to no one.
        let withdrawn = Situation {
            latest_withdrawn: true,
            ..situation(None, None)
        };
        assert_eq!(
            decide(&withdrawn),
            Action::Settled(Settled::LatestWithdrawn)
        );
    }

    #[test]
    fn a_record_reads_back_and_a_bad_one_is_none() {
        let mut rolled_back = record(1, Phase::RolledBack);
        rolled_back.failure = Some(RecordedFailure {
            cause: Cause::Stalled,
            message: "ns/a is Stalled".into(),
        });
        let text = rolled_back.to_text();
        assert!(text.contains(r#""phase":"RolledBack""#), "{text}");
        assert!(text.contains(r#""cause":"Stalled""#), "{text}");
        assert_eq!(Record::parse(&text), Some(rolled_back));
        assert_eq!(Record::parse("{}"), None);
        assert_eq!(Record::parse(&"x".repeat(RECORD_LIMIT + 1)), None);
        let failure = Failure {
            cause: Cause::NotReady,
            message: "y".repeat(10_000),
        };
        let running = record(0, Phase::Progressing);
        let s = situation(Some(&running), None);
        let written = Action::RollBack(failure).write(&s, at(1)).unwrap();
        let message = written.record.unwrap().failure.unwrap().message;
        assert!(message.len() <= MESSAGE_LIMIT + 8, "{}", message.len());
    }
}
