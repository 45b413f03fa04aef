//! Looking at what a resource applied: how healthy its objects are (by the
//! rules in [`crate::engine::live::health`], on the state the watches keep or a fresh
//! read), whether one went missing, and the kind's status fields read from
//! them. The verdict over time (still waiting, or stalled after the health
//! timeout) is one pure function, [`verdict`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Map, Value};

use super::context::Context;
use super::parked::Waiting;
use crate::engine::contract::Handler;
use crate::engine::live::health::{self, Health};
use crate::engine::live::watch::Seen;
use crate::engine::model::inventory::ObjectId;
use crate::engine::model::outcome::HealthState;
use crate::engine::model::status::{CommonStatus, ConditionStatus, ConditionType, Reason};

/// Objects named in a health message.
const NAMED: usize = 5;
/// The longest wait between two looks at objects still becoming healthy.
pub(crate) const POLL: Duration = Duration::from_secs(30);

/// Where the states come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source<'a> {
    /// Right after an apply: what it `created`, from the watches once they
    /// show it; the rest read from the API server now.
    AfterApply {
        /// The objects the apply created.
        created: &'a BTreeSet<ObjectId>,
    },
    /// What the watches know.
    Watched,
}

/// What a look at a resource's objects found (by default: nothing to
/// wait for, nothing failed).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Checkup {
    /// The objects not current, and what each waits for.
    pub waiting: Vec<String>,
    /// The objects that failed, and why.
    pub failed: Vec<String>,
    /// Watched objects the watches saw deleted.
    pub missing: Vec<ObjectId>,
    /// The kind's status fields read from the objects.
    pub fields: Option<Map<String, Value>>,
    /// True when all the objects wait for is their controllers' first look
    /// at what was applied (nothing failed, nothing else is missing).
    pub first_look_pending: bool,
    /// What the kind could not read within its budget.
    pub over_budget: Vec<String>,
}

/// Looks at the objects in `ids`, which `obj` owns.
pub(crate) async fn look<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
    ids: &BTreeSet<ObjectId>,
    source: Source<'_>,
) -> Checkup {
    let engine = &ctx.engine;
    let states = match source {
        Source::AfterApply { created } => {
            let objects = &engine.objects;
            objects.after_apply(ids, created).await
        }
        Source::Watched => engine.objects.states(ids).await,
    };
    let mut assessed = Vec::with_capacity(states.len());
    let mut missing = Vec::new();
    let mut objects = BTreeMap::new();
    for (id, seen) in states {
        let health = match &seen {
            Seen::Object(state) => health::assess(&id, Some(state)),
            Seen::Absent => Health::InProgress("not found".into()),
            Seen::Deleted => {
                missing.push(id.clone());
                Health::InProgress("deleted".into())
            }
            Seen::Unreadable(why) => Health::InProgress(why.clone()),
        };
        if let Seen::Object(state) = seen {
            objects.insert(id.clone(), state);
        }
        assessed.push((id, health));
    }
    tracing::debug!(?assessed, "health checkup");
    let (mut waiting, failed) = health::summary(&assessed);
    let read = ctx.handler.read_objects(obj, &objects).await;
    let first_look_pending =
        read.not_ready.is_empty() && read.over_budget.is_empty() && only_first_looks(&assessed);
    waiting.extend(read.not_ready);
    Checkup {
        waiting,
        failed,
        missing,
        fields: read.status,
        first_look_pending,
        over_budget: read.over_budget,
    }
}

/// True when some object waits for its controller's first look and every
/// other one is current.
fn only_first_looks(assessed: &[(ObjectId, Health)]) -> bool {
    let unobserved = |h: &Health| matches!(h, Health::Unobserved(_));
    assessed.iter().any(|(_, h)| unobserved(h))
        && assessed
            .iter()
            .all(|(_, h)| unobserved(h) || *h == Health::Current)
}

/// How long the objects of `before` have been waiting, for a look at `now`
/// after an apply (`applied`: a new desired state went in) or without one.
pub(crate) fn waiting(before: &CommonStatus, applied_new: bool, now: jiff::Timestamp) -> Waiting {
    if applied_new {
        return Waiting::Since(now);
    }
    if before
        .condition(ConditionType::Stalled)
        .is_some_and(|c| c.status == ConditionStatus::True && c.reason == Reason::Unhealthy)
    {
        return Waiting::Stalled;
    }
    match before.condition(ConditionType::Ready) {
        Some(c) if c.status == ConditionStatus::Unknown => Waiting::Since(c.last_transition_time),
        _ => Waiting::Since(now),
    }
}

/// The health of a resource's objects: healthy, still waiting (for at most
/// `timeout` since `waiting`), or stalled.
pub(crate) fn verdict(
    checkup: &Checkup,
    waiting: Waiting,
    now: jiff::Timestamp,
    timeout: Duration,
) -> HealthState {
    if !checkup.failed.is_empty() {
        return HealthState::Stalled(named(checkup.failed.iter().chain(&checkup.waiting)));
    }
    if !checkup.over_budget.is_empty() {
        return HealthState::OverBudget(named(checkup.over_budget.iter()));
    }
    if checkup.waiting.is_empty() {
        return HealthState::Healthy;
    }
    let overdue = match waiting {
        Waiting::Stalled => true,
        Waiting::Since(since) => now.duration_since(since).unsigned_abs() >= timeout,
    };
    let what = named(checkup.waiting.iter());
    if overdue {
        let after = jiff::SignedDuration::try_from(timeout).unwrap_or_default();
        let mut lines = vec![format!("not healthy after {after:#}")];
        lines.extend(what);
        HealthState::Stalled(lines)
    } else {
        HealthState::Waiting(what)
    }
}

/// When to look again while waiting: when the timeout runs out, and at
/// least every [`POLL`] (changes of the objects wake the resource at once;
/// this only covers a change the watches missed).
pub(crate) fn deadline(
    waiting: Waiting,
    now: jiff::Timestamp,
    timeout: Duration,
) -> Option<Duration> {
    match waiting {
        Waiting::Stalled => None,
        Waiting::Since(since) => {
            let spent = now.duration_since(since).unsigned_abs();
            Some(
                timeout
                    .saturating_sub(spent)
                    .clamp(Duration::from_secs(1), POLL),
            )
        }
    }
}

fn named<'a>(lines: impl Iterator<Item = &'a String>) -> Vec<String> {
    let lines: Vec<&String> = lines.collect();
    let mut shown: Vec<String> = lines.iter().take(NAMED).map(|l| (*l).clone()).collect();
    if lines.len() > NAMED {
        shown.push(crate::text::and_more(lines.len() - NAMED));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::outcome::{self, Outcome};

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn checkup(waiting: &[&str], failed: &[&str]) -> Checkup {
        Checkup {
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
            failed: failed.iter().map(|s| s.to_string()).collect(),
            missing: Vec::new(),
            fields: None,
            first_look_pending: false,
            over_budget: Vec::new(),
        }
    }

    const FIVE_MINUTES: Duration = Duration::from_secs(300);

    #[test]
    fn waiting_turns_stalled_when_the_timeout_runs_out() {
        let since = t("2026-01-01T00:00:00Z");
        let slow = checkup(&["deployment/web: 1/3 replicas available"], &[]);
        assert_eq!(
            verdict(
                &slow,
                Waiting::Since(since),
                t("2026-01-01T00:04:59Z"),
                FIVE_MINUTES
            ),
            HealthState::Waiting(vec!["deployment/web: 1/3 replicas available".into()])
        );
        assert_eq!(
            verdict(
                &slow,
                Waiting::Since(since),
                t("2026-01-01T00:05:00Z"),
                FIVE_MINUTES
            ),
            HealthState::Stalled(vec![
                "not healthy after 5m".into(),
                "deployment/web: 1/3 replicas available".into()
            ])
        );
        assert_eq!(
            deadline(
                Waiting::Since(since),
                t("2026-01-01T00:04:50Z"),
                FIVE_MINUTES
            ),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            deadline(
                Waiting::Since(since),
                t("2026-01-01T00:01:00Z"),
                FIVE_MINUTES
            ),
            Some(POLL)
        );
        assert!(matches!(
            verdict(&slow, Waiting::Stalled, since, FIVE_MINUTES),
            HealthState::Stalled(_)
        ));
    }

    #[test]
    fn a_failure_stalls_at_once_and_health_clears_everything() {
        let now = t("2026-01-01T00:00:00Z");
        let failed = checkup(&[], &["job/migrate: failed (BackoffLimitExceeded)"]);
        assert!(matches!(
            verdict(&failed, Waiting::Since(now), now, FIVE_MINUTES),
            HealthState::Stalled(_)
        ));
        assert_eq!(
            verdict(&checkup(&[], &[]), Waiting::Stalled, now, FIVE_MINUTES),
            HealthState::Healthy
        );
    }

    #[test]
    fn long_lists_are_cut_short() {
        let many: Vec<String> = (0..8).map(|i| format!("pod/p{i}: pending")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let HealthState::Waiting(lines) = verdict(
            &checkup(&refs, &[]),
            Waiting::Since(t("2026-01-01T00:00:00Z")),
            t("2026-01-01T00:00:01Z"),
            FIVE_MINUTES,
        ) else {
            panic!("waiting")
        };
        assert_eq!(lines.len(), NAMED + 1);
        assert_eq!(lines[NAMED], "and 3 more");
    }

    #[test]
    fn the_clock_starts_when_ready_left_true_and_survives_re_applies() {
        let start = t("2026-01-01T00:00:00Z");
        let later = t("2026-01-01T00:02:00Z");
        let applied = outcome::status_after(
            &CommonStatus::default(),
            &Outcome::Checked(HealthState::Waiting(vec!["x".into()])),
            Some(1),
            start,
        );
        assert_eq!(waiting(&applied, false, later), Waiting::Since(start));
        assert_eq!(waiting(&applied, true, later), Waiting::Since(later));
        let stalled = outcome::status_after(
            &applied,
            &Outcome::Checked(HealthState::Stalled(vec!["x".into()])),
            Some(1),
            later,
        );
        assert_eq!(waiting(&stalled, false, later), Waiting::Stalled);
        let healthy = outcome::status_after(
            &stalled,
            &Outcome::Checked(HealthState::Healthy),
            Some(1),
            later,
        );
        assert_eq!(waiting(&healthy, false, later), Waiting::Since(later));
    }

    #[test]
    fn only_a_missing_first_look_is_waited_for_after_an_apply() {
        let id = |kind: &str| ObjectId {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: "web".into(),
        };
        let unseen = (id("Deployment"), Health::Unobserved(1));
        let current = (id("StatefulSet"), Health::Current);
        let scaling = (
            id("DaemonSet"),
            Health::InProgress("0/1 pods available".into()),
        );
        let failed = (id("ReplicaSet"), Health::Failed("gone".into()));
        assert!(only_first_looks(std::slice::from_ref(&unseen)));
        assert!(only_first_looks(&[unseen.clone(), current.clone()]));
        assert!(!only_first_looks(&[current]), "nothing to wait for");
        assert!(!only_first_looks(&[unseen.clone(), scaling]));
        assert!(!only_first_looks(&[unseen, failed]));
        assert!(!only_first_looks(&[]));
    }
}
