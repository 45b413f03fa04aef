//! One pure function: how the outcome of a reconcile reads in the
//! resource's status. Every path of the engine that writes status goes
//! through [`status_after`], so the conditions always agree with each other:
//! `Ready=True` only after a success whose objects are all healthy,
//! `Reconciling=True` (with `Ready=Unknown`) while kubectl runs or the
//! objects are becoming healthy, `Stalled=True` (with `Ready=False`) when
//! they will not, and every outcome records the generation it describes.

use super::inventory::Inventory;
use super::status::{
    CommonStatus, Condition, ConditionStatus, ConditionType, Reason, SHORT_MESSAGE_LIMIT, one_line,
};
use crate::kubectl::CommandRecord;

/// What a reconcile came to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// kubectl is running for the resource.
    Progressing,
    /// Everything the plan asked for is done.
    Applied(Applied),
    /// Nothing needed applying; the health of what is in place was looked at.
    Checked(HealthState),
    /// Something failed; nothing after it ran.
    Failed(Failure),
}

/// How healthy the objects a resource owns are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum HealthState {
    /// Every one is current (or the kind does not check health).
    #[default]
    Healthy,
    /// Some are still becoming healthy: what each waits for.
    Waiting(Vec<String>),
    /// Some failed, or did not become healthy in time: which, and why.
    Stalled(Vec<String>),
    /// What the kind reads from them could not be read within its budget
    /// (a declared kind's CEL): which expression, and the budget.
    OverBudget(Vec<String>),
}

/// A successful run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applied {
    /// One short line: what kubectl did.
    pub summary: String,
    /// The last kubectl run, if any ran.
    pub record: Option<CommandRecord>,
    /// The digest of the desired state now in place.
    pub digest: String,
    /// What the resource owns now.
    pub inventory: Inventory,
    /// How healthy that is.
    pub health: HealthState,
}

/// A failed run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    /// Why.
    pub reason: Reason,
    /// What went wrong, in full (first line first: the printer column shows it).
    pub message: String,
    /// The kubectl run that failed, if one did.
    pub record: Option<Box<CommandRecord>>,
    /// What the resource may own now, when that changed (a failed apply may
    /// have created some of its objects); `None`: as before.
    pub inventory: Option<Inventory>,
}

impl Failure {
    /// A failure without a kubectl run.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            record: None,
            inventory: None,
        }
    }
}

/// The status after `outcome`, from the status before it, for the resource
/// at `generation`, at `now`.
pub(crate) fn status_after(
    before: &CommonStatus,
    outcome: &Outcome,
    generation: Option<i64>,
    now: jiff::Timestamp,
) -> CommonStatus {
    let mut status = before.clone();
    status.observed_generation = generation;
    let mut conditions = Conditions {
        status: &mut status,
        generation,
        now,
    };
    match outcome {
        Outcome::Progressing => {
            let message = match generation {
                Some(g) => format!("applying generation {g}"),
                None => "applying".to_string(),
            };
            conditions.progressing(Reason::Progressing, &message);
        }
        Outcome::Applied(applied) => {
            conditions.health(&applied.health, Reason::Applied, &applied.summary);
            status.applied_digest = Some(applied.digest.clone());
            status.last_applied_at = Some(now);
            status.inventory = Some(applied.inventory.clone());
            if let Some(record) = &applied.record {
                status.record_command(record);
            }
        }
        Outcome::Checked(HealthState::Healthy) if before.is_ready() => {}
        Outcome::Checked(health) => {
            let summary = before
                .last_command
                .as_ref()
                .map_or_else(|| "applied".to_string(), CommandRecord::summary);
            conditions.health(health, Reason::Applied, &summary);
        }
        Outcome::Failed(failure) => {
            conditions.settle(
                ConditionStatus::False,
                failure.reason,
                &failure.message,
                None,
            );
            if let Some(inventory) = &failure.inventory {
                status.inventory = Some(inventory.clone());
            }
            if let Some(record) = &failure.record {
                status.record_command(record);
            }
        }
    }
    status
}

/// Sets the conditions of one status, consistently.
struct Conditions<'a> {
    status: &'a mut CommonStatus,
    generation: Option<i64>,
    now: jiff::Timestamp,
}

impl Conditions<'_> {
    fn set(&mut self, type_: ConditionType, value: ConditionStatus, reason: Reason, message: &str) {
        let condition = Condition::new(type_, value, reason, message, self.generation, self.now);
        self.status.set_condition(condition);
    }

    /// `Ready=Unknown`, `Reconciling=True`: work is under way.
    fn progressing(&mut self, reason: Reason, message: &str) {
        self.set(
            ConditionType::Ready,
            ConditionStatus::Unknown,
            reason,
            message,
        );
        self.set(
            ConditionType::Reconciling,
            ConditionStatus::True,
            reason,
            message,
        );
        self.status
            .conditions
            .retain(|c| c.type_ != ConditionType::Stalled);
        self.status.message = Some(one_line(message, SHORT_MESSAGE_LIMIT));
    }

    /// `Ready` as given, `Reconciling=False`, and `Stalled` when `stalled`.
    fn settle(
        &mut self,
        ready: ConditionStatus,
        reason: Reason,
        message: &str,
        stalled: Option<&str>,
    ) {
        self.set(ConditionType::Ready, ready, reason, message);
        self.set(
            ConditionType::Reconciling,
            ConditionStatus::False,
            reason,
            "",
        );
        match stalled {
            Some(why) => self.set(ConditionType::Stalled, ConditionStatus::True, reason, why),
            None => self
                .status
                .conditions
                .retain(|c| c.type_ != ConditionType::Stalled),
        }
        self.status.message = Some(one_line(message, SHORT_MESSAGE_LIMIT));
    }

    /// The conditions of an apply that went through, by the objects' health.
    fn health(&mut self, health: &HealthState, reason: Reason, summary: &str) {
        match health {
            HealthState::Healthy => self.settle(ConditionStatus::True, reason, summary, None),
            HealthState::Waiting(what) => self.progressing(Reason::Progressing, &what.join("; ")),
            HealthState::Stalled(what) => {
                let message = what.join("; ");
                self.settle(
                    ConditionStatus::False,
                    Reason::Unhealthy,
                    &message,
                    Some(&message),
                );
            }
            HealthState::OverBudget(what) => {
                let message = what.join("; ");
                self.settle(
                    ConditionStatus::False,
                    Reason::OverBudget,
                    &message,
                    Some(&message),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn conditions(s: &CommonStatus) -> Vec<(ConditionType, ConditionStatus, Reason)> {
        s.conditions
            .iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect()
    }

    fn record(stdout: &str, stderr: &str, code: i32) -> CommandRecord {
        CommandRecord {
            command: "kubectl apply --server-side -f -".into(),
            exit_code: Some(code),
            stdout: stdout.into(),
            stderr: stderr.into(),
            ..Default::default()
        }
    }

    fn applied() -> Outcome {
        Outcome::Applied(Applied {
            summary: "deployment.apps/web serverside-applied".into(),
            record: Some(record("deployment.apps/web serverside-applied\n", "", 0)),
            digest: "sha256:1".into(),
            inventory: Inventory {
                count: 1,
                objects: Vec::new(),
            },
            health: HealthState::Healthy,
        })
    }

    fn failed(reason: Reason) -> Outcome {
        Outcome::Failed(Failure {
            reason,
            message: "error: boom\nmore detail".into(),
            record: Some(Box::new(record("", "Warning: x\nerror: boom\n", 1))),
            inventory: None,
        })
    }

    #[test]
    fn progressing_is_never_ready() {
        let s = status_after(
            &CommonStatus::default(),
            &Outcome::Progressing,
            Some(3),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(
            conditions(&s),
            [
                (
                    ConditionType::Ready,
                    ConditionStatus::Unknown,
                    Reason::Progressing
                ),
                (
                    ConditionType::Reconciling,
                    ConditionStatus::True,
                    Reason::Progressing
                ),
            ]
        );
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.message.as_deref(), Some("applying generation 3"));
    }

    #[test]
    fn success_records_everything_and_stops_reconciling() {
        let now = t("2026-01-01T00:00:00Z");
        let before = status_after(
            &CommonStatus::default(),
            &Outcome::Progressing,
            Some(1),
            now,
        );
        let s = status_after(&before, &applied(), Some(1), now);
        assert_eq!(
            conditions(&s),
            [
                (ConditionType::Ready, ConditionStatus::True, Reason::Applied),
                (
                    ConditionType::Reconciling,
                    ConditionStatus::False,
                    Reason::Applied
                ),
            ]
        );
        assert_eq!(
            s.message.as_deref(),
            Some("deployment.apps/web serverside-applied")
        );
        assert_eq!(s.applied_digest.as_deref(), Some("sha256:1"));
        assert_eq!(s.last_applied_at, Some(now));
        assert_eq!(s.inventory.as_ref().map(|i| i.count), Some(1));
        assert_eq!(s.last_command.as_ref().and_then(|r| r.exit_code), Some(0));
    }

    #[test]
    fn every_failure_reason_reads_the_same_way() {
        let now = t("2026-01-01T00:00:00Z");
        let good = status_after(&CommonStatus::default(), &applied(), Some(1), now);
        for reason in [
            Reason::InvalidSpec,
            Reason::TooLarge,
            Reason::RenderFailed,
            Reason::OwnershipConflict,
            Reason::ApplyFailed,
            Reason::FieldConflict,
            Reason::PruneFailed,
            Reason::DeleteFailed,
            Reason::ActionFailed,
            Reason::ApiError,
            Reason::FetchFailed,
            Reason::ListFailed,
            Reason::NamespaceNotServed,
            Reason::ReferenceNotFound,
            Reason::Forbidden,
        ] {
            for before in [&CommonStatus::default(), &good] {
                let s = status_after(before, &failed(reason), Some(2), now);
                assert_eq!(
                    conditions(&s),
                    [
                        (ConditionType::Ready, ConditionStatus::False, reason),
                        (ConditionType::Reconciling, ConditionStatus::False, reason),
                    ],
                    "{reason}"
                );
                assert_eq!(s.observed_generation, Some(2), "{reason}");
                assert_eq!(s.message.as_deref(), Some("error: boom"), "{reason}");
                // What the last success applied is still recorded.
                assert_eq!(s.applied_digest, before.applied_digest, "{reason}");
                assert_eq!(s.inventory, before.inventory, "{reason}");
            }
        }
    }

    #[test]
    fn a_failure_without_a_run_keeps_the_last_command() {
        let now = t("2026-01-01T00:00:00Z");
        let good = status_after(&CommonStatus::default(), &applied(), Some(1), now);
        let s = status_after(
            &good,
            &Outcome::Failed(Failure::new(Reason::FetchFailed, "provider down")),
            Some(1),
            now,
        );
        assert_eq!(s.last_command, good.last_command);
        assert_eq!(s.message.as_deref(), Some("provider down"));
    }

    #[test]
    fn a_failed_apply_may_widen_the_inventory() {
        let now = t("2026-01-01T00:00:00Z");
        let wider = Inventory {
            count: 2,
            objects: Vec::new(),
        };
        let s = status_after(
            &CommonStatus::default(),
            &Outcome::Failed(Failure {
                inventory: Some(wider.clone()),
                ..Failure::new(Reason::ApplyFailed, "x")
            }),
            None,
            now,
        );
        assert_eq!(s.inventory, Some(wider));
    }

    #[test]
    fn the_message_column_is_one_short_line() {
        let long = format!("error: {}\nsecond line", "x".repeat(500));
        let s = status_after(
            &CommonStatus::default(),
            &Outcome::Failed(Failure::new(Reason::ApplyFailed, long)),
            None,
            t("2026-01-01T00:00:00Z"),
        );
        let m = s.message.unwrap();
        assert!(m.len() <= SHORT_MESSAGE_LIMIT && !m.contains('\n'), "{m}");
    }

    #[test]
    fn health_decides_ready_after_an_apply() {
        let now = t("2026-01-01T00:00:00Z");
        let Outcome::Applied(base) = applied() else {
            unreachable!()
        };
        let with = |health: HealthState| {
            status_after(
                &CommonStatus::default(),
                &Outcome::Applied(Applied {
                    health,
                    ..base.clone()
                }),
                Some(1),
                now,
            )
        };
        let waiting = with(HealthState::Waiting(vec![
            "deployment/web: 1/3 replicas available".into(),
        ]));
        assert_eq!(
            conditions(&waiting),
            [
                (
                    ConditionType::Ready,
                    ConditionStatus::Unknown,
                    Reason::Progressing
                ),
                (
                    ConditionType::Reconciling,
                    ConditionStatus::True,
                    Reason::Progressing
                ),
            ]
        );
        assert_eq!(
            waiting.message.as_deref(),
            Some("deployment/web: 1/3 replicas available")
        );
        assert_eq!(
            waiting.applied_digest.as_deref(),
            Some("sha256:1"),
            "the apply itself went through"
        );
        let stalled = with(HealthState::Stalled(vec![
            "deployment/web: 0/3 replicas available".into(),
        ]));
        assert_eq!(
            conditions(&stalled),
            [
                (
                    ConditionType::Ready,
                    ConditionStatus::False,
                    Reason::Unhealthy
                ),
                (
                    ConditionType::Reconciling,
                    ConditionStatus::False,
                    Reason::Unhealthy
                ),
                (
                    ConditionType::Stalled,
                    ConditionStatus::True,
                    Reason::Unhealthy
                ),
            ]
        );
        // Healthy again: Stalled goes, Ready comes.
        let healthy = status_after(
            &stalled,
            &Outcome::Checked(HealthState::Healthy),
            Some(1),
            now,
        );
        assert_eq!(
            conditions(&healthy),
            [
                (ConditionType::Ready, ConditionStatus::True, Reason::Applied),
                (
                    ConditionType::Reconciling,
                    ConditionStatus::False,
                    Reason::Applied
                ),
            ]
        );
        assert_eq!(
            healthy.message.as_deref(),
            Some("deployment.apps/web serverside-applied")
        );
    }

    #[test]
    fn every_outcome_keeps_ready_and_reconciling_consistent() {
        let now = t("2026-01-01T00:00:00Z");
        let outcomes = [
            Outcome::Progressing,
            applied(),
            Outcome::Checked(HealthState::Waiting(vec!["x".into()])),
            Outcome::Checked(HealthState::Stalled(vec!["x".into()])),
            Outcome::Checked(HealthState::Healthy),
            failed(Reason::ApplyFailed),
        ];
        for before in &outcomes {
            let start = status_after(&CommonStatus::default(), before, Some(1), now);
            for outcome in &outcomes {
                let s = status_after(&start, outcome, Some(2), now);
                let get = |t| s.condition(t).map(|c| c.status);
                let ready = get(ConditionType::Ready);
                let reconciling = get(ConditionType::Reconciling);
                assert!(
                    !(ready == Some(ConditionStatus::True)
                        && reconciling == Some(ConditionStatus::True)),
                    "{outcome:?} after {before:?}"
                );
                if get(ConditionType::Stalled) == Some(ConditionStatus::True) {
                    assert_eq!(ready, Some(ConditionStatus::False), "{outcome:?}");
                }
                assert_eq!(s.observed_generation, Some(2));
            }
        }
    }
}
