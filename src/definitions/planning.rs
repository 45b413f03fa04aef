//! A change of a definition's files planned against every resource of its
//! kind before it is served: [`crate::plan`]'s fleet plan (each resource
//! rendered under the revision serving it and under the change, the
//! difference, a server-side dry run as the identity that would write),
//! summed up in the status (`status.plan`) and the `Planned` condition.
//! With `spec.rollout.plan: Wait`, a change whose plan fails is not
//! served, and is planned again until it passes.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::context::DefinitionContext;
use super::generation::Generation;
use super::planned::{Made, recent};
use super::resource::{ConditionType, PLAN_FAILURES_SHOWN, PlanStatus, Reason, Status};
use super::rollout::spec_of;
use super::writes::event;
use crate::kind::PlannedEvent;
use crate::kinds::declared::rollout::PlanGate;
use crate::kinds::{KindContext, KindOptions};
use crate::plan::report::{Outcome, Report};
use crate::plan::{Current, Loaded, Setup};

/// The longest a plan may take.
pub const PLAN_DEADLINE: Duration = Duration::from_secs(120);
/// Resources planned at once.
const CONCURRENCY: usize = 8;

/// Whether the change may be served.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It may (its plan passed, or only reports).
    Serve,
    /// It waits: its plan fails (why, in words).
    Wait(String),
}

/// Plans `generation`, a change of the files of the kind `def` serves,
/// unless it was planned lately; sets `status.plan` and `Planned`; says
/// whether it may be served. The first generation of a kind, and a
/// generation that changes no file (its rollout alone), are not planned.
pub(super) async fn plan(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    generation: &Generation,
    status: &mut Status,
) -> Verdict {
    let name = def.name_any();
    let Some(revisions) = ctx.serving.revisions(&name) else {
        return Verdict::Serve;
    };
    let latest = revisions.history.latest();
    if latest.is_some_and(|r| r.generation.digest == generation.digest) {
        return Verdict::Serve;
    }
    let made = recent(&ctx.plans, &name, &generation.digest);
    let made = match made {
        Some(made) => made,
        None => {
            let current = Current::Definition {
                name: name.clone(),
                rollout: revisions.rollout.clone(),
                notes: Vec::new(),
            };
            let made = make(ctx, &current, def, generation).await;
            tell(ctx, def, &made).await;
            ctx.plans.keep(name, made.clone());
            made
        }
    };
    let message = say(status, &made, def.metadata.generation);
    match spec_of(def).plan.unwrap_or_default() {
        PlanGate::Wait if !made.passed => Verdict::Wait(message),
        _ => Verdict::Serve,
    }
}

/// Says again what the plan of the generation served found, if one was
/// made: a reconcile may be given the definition as it was before the
/// status that told it, and the status written replaces the conditions.
pub(super) fn restate(
    ctx: &DefinitionContext,
    def: &DynamicObject,
    generation: &Generation,
    status: &mut Status,
) {
    if let Some(made) = ctx.plans.made(&def.name_any(), &generation.digest) {
        say(status, &made, def.metadata.generation);
    }
}

/// `status.plan` and `Planned` from `made`; the message.
fn say(status: &mut Status, made: &Made, number: Option<i64>) -> String {
    let message = in_words(&made.summary);
    let reason = match (&made.summary.error, made.passed) {
        (Some(_), _) => Reason::PlanNotMade,
        (None, true) => Reason::PlanPassed,
        (None, false) => Reason::PlanFailed,
    };
    status.set(
        ConditionType::Planned,
        made.passed,
        reason,
        &message,
        number,
    );
    status.plan = Some(made.summary.clone());
    message
}

/// Makes the plan of `generation` against what `current` serves, within
/// [`PLAN_DEADLINE`].
async fn make(
    ctx: &DefinitionContext,
    current: &Current,
    def: &DynamicObject,
    generation: &Generation,
) -> Made {
    let change = Loaded {
        kind: generation.kind.clone(),
        definition: def.clone(),
        what: format!("generation {}", generation.number),
    };
    let setup = setup(ctx);
    let planned = crate::plan::fleet(&ctx.client, &setup, current, &change);
    let summary = match tokio::time::timeout(PLAN_DEADLINE, planned).await {
        Ok(Ok(report)) => summary(generation.number, &report),
        Ok(Err(e)) => not_made(generation.number, e.to_string()),
        Err(_) => not_made(
            generation.number,
            format!(
                "the plan did not finish within {} s",
                PLAN_DEADLINE.as_secs()
            ),
        ),
    };
    let passed = summary.error.is_none() && summary.would_fail == 0;
    Made {
        digest: generation.digest.clone(),
        at: Instant::now(),
        summary,
        passed,
    }
}

/// What the operator's plans need: its build queue, and the identities
/// its writes use.
fn setup(ctx: &DefinitionContext) -> Setup {
    let settings = ctx.engine.settings();
    Setup {
        engine: ctx.engine.clone(),
        options: KindOptions {
            context: KindContext {
                operator_namespace: settings.operator_namespace.clone(),
                watch_namespace: settings.namespace.clone(),
            },
            ..KindOptions::default()
        },
        concurrency: CONCURRENCY,
    }
}

/// The report summed up for the status: the counts and the first
/// failures, each `namespace/name: Reason: message`.
fn summary(generation: i64, report: &Report) -> PlanStatus {
    let counts = &report.summary;
    let failures = (report.resources.iter())
        .filter(|r| r.outcome == Outcome::Fails)
        .filter_map(|r| {
            let failure = r.failures.first()?;
            Some(format!(
                "{}: {}: {}",
                r.key(),
                failure.reason,
                failure.message
            ))
        })
        .take(PLAN_FAILURES_SHOWN)
        .collect();
    PlanStatus {
        generation,
        resources: counts.resources as u64,
        would_change: counts.would_change as u64,
        would_fail: counts.would_fail as u64,
        would_lose_fields: counts.would_lose_fields as u64,
        failures,
        error: None,
    }
}

/// A plan that could not be made, and why.
fn not_made(generation: i64, why: String) -> PlanStatus {
    PlanStatus {
        generation,
        error: Some(why),
        ..PlanStatus::default()
    }
}

/// The plan in one sentence: `generation 3, planned against 20
/// resources: 19 would change, 1 would fail (ns/g07: Invalid: ...)`.
pub(super) fn in_words(plan: &PlanStatus) -> String {
    let head = format!("generation {}", plan.generation);
    if let Some(why) = &plan.error {
        return format!("{head} could not be planned: {why}");
    }
    let mut words = format!(
        "{head}, planned against {} resources: {} would change, {} would fail",
        plan.resources, plan.would_change, plan.would_fail
    );
    if plan.would_lose_fields > 0 {
        words.push_str(&format!(
            ", {} would lose stored fields",
            plan.would_lose_fields
        ));
    }
    if !plan.failures.is_empty() {
        words.push_str(&format!(" ({})", plan.failures.join("; ")));
    }
    words
}

/// An event for a plan just made: `Planned`, or a warning when it fails.
async fn tell(ctx: &DefinitionContext, def: &DynamicObject, made: &Made) {
    let note = in_words(&made.summary);
    let said = if made.passed {
        PlannedEvent::normal("Planned", note)
    } else {
        PlannedEvent::warning("PlanFailed", note)
    };
    event(ctx, def, said).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_in_words_gives_the_counts_then_the_failures() {
        let plan = PlanStatus {
            generation: 3,
            resources: 20,
            would_change: 19,
            would_fail: 1,
            failures: vec!["ns/g07: Invalid: a label value".into()],
            ..PlanStatus::default()
        };
        assert_eq!(
            in_words(&plan),
            "generation 3, planned against 20 resources: 19 would change, 1 would fail (ns/g07: Invalid: a label value)"
        );
        let unmade = not_made(4, "the plan did not finish within 120 s".into());
        assert_eq!(
            in_words(&unmade),
            "generation 4 could not be planned: the plan did not finish within 120 s"
        );
    }
}
