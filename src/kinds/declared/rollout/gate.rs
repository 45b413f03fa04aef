//! A step's gate: whether the resources a step moved to the latest
//! revision pass, are still on their way, or failed. One pure function,
//! [`judge`], over what each resource's status says ([`Seen::of`]) and the
//! time the step began.
//!
//! A resource passes when its status describes its current generation,
//! says it is on the latest revision, and `Ready=True`. The gate fails at
//! once when one is `Stalled` on the latest revision, and at the end of
//! the window when one has not passed by then (a resource `Ready=False` for
//! another reason, an apply refused, is given the rest of the window to
//! recover) or the gate's expression is not true.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::steps::{CompiledStep, RESOURCES};
use crate::kind::{CommonStatus, Condition, ConditionStatus, ConditionType};
use crate::text::first_names;

/// How many resources a message names.
const NAMED: usize = 5;
/// The engine's bookkeeping left out of what an expression reads: large,
/// and nothing a gate decides on.
const NOT_READ: [&str; 2] = ["lastCommand", "inventory"];

/// Where a resource of a step stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// On the latest revision and `Ready`, its status current.
    Ready,
    /// Not there yet: what its status says.
    Pending(String),
    /// `Ready=False`: why.
    Failing(String),
    /// `Stalled` on the latest revision: why.
    Stalled(String),
}

/// One resource of a step as the gate sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// `namespace/name` (or `name`).
    pub name: String,
    /// Where it stands.
    pub standing: Standing,
    /// What the gate's expression reads of it: its `metadata` (name,
    /// namespace, labels) and `status`.
    pub view: Value,
}

impl Seen {
    /// How `object` (a resource of the kind, as the API server returns it)
    /// stands against revision `latest`; its view only `with_view`.
    pub fn of(object: &Value, latest: u32, with_view: bool) -> Self {
        let metadata = &object["metadata"];
        let name = match (metadata["namespace"].as_str(), metadata["name"].as_str()) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.to_string(),
            _ => String::new(),
        };
        let status = &object["status"];
        let common = conditions_of(status);
        let revision = status["revision"].as_u64();
        let current = common.observed_generation.is_some()
            && common.observed_generation == metadata["generation"].as_i64();
        let standing = standing(
            &common,
            revision == Some(u64::from(latest)),
            current,
            revision,
        );
        let view = if with_view {
            view(metadata, status)
        } else {
            Value::Null
        };
        Self {
            name,
            standing,
            view,
        }
    }
}

/// The conditions and observed generation of a status (the rest left
/// out: a field of another shape does not hide them).
fn conditions_of(status: &Value) -> CommonStatus {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Conditions {
        observed_generation: Option<i64>,
        #[serde(default)]
        conditions: Vec<Condition>,
    }
    let read: Option<Conditions> = serde_json::from_value(status.clone()).ok();
    read.map_or_else(CommonStatus::default, |read| CommonStatus {
        observed_generation: read.observed_generation,
        conditions: read.conditions,
        ..CommonStatus::default()
    })
}

/// Where a resource stands, from its common status: `on_latest` (its
/// status says the latest revision), `current` (the status describes its
/// generation).
fn standing(
    common: &CommonStatus,
    on_latest: bool,
    current: bool,
    revision: Option<u64>,
) -> Standing {
    let ready = common.condition(ConditionType::Ready);
    let stalled = common
        .condition(ConditionType::Stalled)
        .filter(|c| c.status == ConditionStatus::True);
    if let (true, Some(stalled)) = (on_latest, stalled) {
        return Standing::Stalled(format!("{}: {}", stalled.reason, stalled.message));
    }
    match ready {
        Some(c) if on_latest && current && c.status == ConditionStatus::True => Standing::Ready,
        Some(c) if current && c.status == ConditionStatus::False => {
            Standing::Failing(format!("{}: {}", c.reason, c.message))
        }
        Some(c) => {
            let on = revision.map_or_else(
                || "no revision yet".to_string(),
                |r| format!("revision {r}"),
            );
            let status = match c.status {
                ConditionStatus::True => "True",
                ConditionStatus::False => "False",
                ConditionStatus::Unknown => "Unknown",
            };
            Standing::Pending(format!("{on}, Ready={status} ({})", c.reason))
        }
        None => Standing::Pending("not reconciled yet".into()),
    }
}

/// `{metadata: {name, namespace, labels}, status}` without the engine's
/// bookkeeping.
fn view(metadata: &Value, status: &Value) -> Value {
    let mut status = status.clone();
    if let Some(fields) = status.as_object_mut() {
        for key in NOT_READ {
            fields.remove(key);
        }
    }
    serde_json::json!({
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": metadata.get("labels").cloned().unwrap_or_else(|| serde_json::json!({})),
        },
        "status": status,
    })
}

/// Why a gate failed: the reason of the definition's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cause {
    /// A resource is `Stalled` on the latest revision.
    Stalled,
    /// Not every resource was `Ready` on the latest revision in time.
    NotReady,
    /// The gate's expression was not true in time.
    Expression,
}

/// A failed gate: the cause, and what happened in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Why, typed.
    pub cause: Cause,
    /// Which resources, and what they show.
    pub message: String,
}

/// A gate's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every resource passed: the next step may start.
    Passed,
    /// Not yet: looked at again within `left`.
    Waiting {
        /// What is left of the window.
        left: Duration,
        /// What it waits for.
        why: String,
    },
    /// The step failed: the rollout goes back to the stable revision.
    Failed(Failure),
}

/// How many resources of a step are where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// The step's resources.
    pub members: u64,
    /// Of them, `Ready` on the latest revision.
    pub ready: u64,
    /// Of them, failing or stalled.
    pub failed: u64,
}

/// The verdict of `step`'s gate on its resources `seen`, for revision
/// `latest`, the step having begun at `since`, at `now`.
pub fn judge(
    step: &CompiledStep,
    seen: &[Seen],
    latest: u32,
    since: jiff::Timestamp,
    now: jiff::Timestamp,
) -> (Verdict, Tally) {
    let count = |f: fn(&Standing) -> bool| seen.iter().filter(|s| f(&s.standing)).count() as u64;
    let tally = Tally {
        members: seen.len() as u64,
        ready: count(|s| matches!(s, Standing::Ready)),
        failed: count(|s| matches!(s, Standing::Failing(_) | Standing::Stalled(_))),
    };
    let elapsed = if now > since {
        now.duration_since(since).unsigned_abs()
    } else {
        Duration::ZERO
    };
    let over = elapsed >= step.window;
    let left = step.window.saturating_sub(elapsed);
    let window = jiff::SignedDuration::try_from(step.window).unwrap_or_default();
    let stalled: Vec<String> = (seen.iter())
        .filter_map(|s| match &s.standing {
            Standing::Stalled(why) => Some(format!("{} ({why})", s.name)),
            _ => None,
        })
        .collect();
    if !stalled.is_empty() {
        let message = format!(
            "{} of {} resource(s) Stalled on revision {latest}: {}",
            stalled.len(),
            seen.len(),
            first_names(&stalled, NAMED, "; ")
        );
        return (
            Verdict::Failed(Failure {
                cause: Cause::Stalled,
                message,
            }),
            tally,
        );
    }
    if tally.ready < tally.members {
        let unready: Vec<String> = (seen.iter())
            .filter_map(|s| match &s.standing {
                Standing::Ready => None,
                Standing::Pending(why) | Standing::Failing(why) | Standing::Stalled(why) => {
                    Some(format!("{} ({why})", s.name))
                }
            })
            .collect();
        let message = format!(
            "{} of {} resource(s) not Ready on revision {latest} within {window:#}: {}",
            unready.len(),
            seen.len(),
            first_names(&unready, NAMED, "; ")
        );
        if over {
            return (
                Verdict::Failed(Failure {
                    cause: Cause::NotReady,
                    message,
                }),
                tally,
            );
        }
        return (Verdict::Waiting { left, why: message }, tally);
    }
    let Some(expression) = &step.expression else {
        return (Verdict::Passed, tally);
    };
    let resources: Vec<Value> = seen.iter().map(|s| s.view.clone()).collect();
    let variables = BTreeMap::from([(RESOURCES, Value::Array(resources))]);
    let problem = match expression.eval(&variables) {
        Ok(Value::Bool(true)) => return (Verdict::Passed, tally),
        Ok(Value::Bool(false)) => "is false".to_string(),
        Ok(other) => format!("gives {other}, not a boolean"),
        Err(e) => format!("cannot be evaluated: {e}"),
    };
    let message = format!(
        "the gate's expression {:?} {problem} (every resource Ready on revision {latest}, after {window:#})",
        expression.source()
    );
    if over {
        let failure = Failure {
            cause: Cause::Expression,
            message,
        };
        return (Verdict::Failed(failure), tally);
    }
    (Verdict::Waiting { left, why: message }, tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use serde_json::json;

    use crate::kinds::declared::expressions::Expression;
    use crate::kinds::declared::rollout::steps::Selection;

    fn step(window: u64, expression: Option<&str>) -> CompiledStep {
        let known = [RESOURCES.to_string()].into_iter().collect();
        CompiledStep {
            selection: Selection::Percent(10),
            window: Duration::from_secs(window),
            expression: expression.map(|e| Arc::new(Expression::compile(e, &known).unwrap())),
        }
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    /// A resource's object: on `revision`, `Ready` as given (with its
    /// reason), `Stalled` when `stalled`, its status at `generation` of 1.
    fn object(name: &str, revision: u32, ready: &str, reason: &str, stalled: bool) -> Value {
        let mut conditions = vec![json!({
            "type": "Ready", "status": ready, "reason": reason, "message": "m",
            "lastTransitionTime": "2024-01-01T00:00:00Z",
        })];
        if stalled {
            conditions.push(json!({
                "type": "Stalled", "status": "True", "reason": "Unhealthy",
                "message": "configmap/x: failed", "lastTransitionTime": "2024-01-01T00:00:00Z",
            }));
        }
        json!({
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "labels": {"a": "b"}},
            "status": {
                "observedGeneration": 1, "revision": revision, "conditions": conditions,
                "lastCommand": {"command": "kubectl apply"}, "available": 3,
            },
        })
    }

    fn seen(objects: &[Value]) -> Vec<Seen> {
        objects.iter().map(|o| Seen::of(o, 2, true)).collect()
    }

    #[test]
    fn a_resource_stands_by_its_status_for_the_latest_revision() {
        let standing = |o: Value| Seen::of(&o, 2, false).standing;
        assert_eq!(
            standing(object("a", 2, "True", "Applied", false)),
            Standing::Ready
        );
        // Ready, but on the stable revision: not moved yet.
        assert!(matches!(
            standing(object("a", 1, "True", "Applied", false)),
            Standing::Pending(_)
        ));
        // An apply refused leaves the revision as it was: failing all the same.
        let failing = standing(object("a", 1, "False", "ApplyFailed", false));
        assert_eq!(failing, Standing::Failing("ApplyFailed: m".into()));
        // Stalled on the latest: failed; stalled on the stable: not yet moved.
        assert!(matches!(
            standing(object("a", 2, "False", "Unhealthy", true)),
            Standing::Stalled(_)
        ));
        assert!(matches!(
            standing(object("a", 1, "False", "Unhealthy", true)),
            Standing::Failing(_)
        ));
        // A status of an older generation says nothing of the current one.
        let mut old = object("a", 2, "True", "Applied", false);
        old["metadata"]["generation"] = json!(2);
        assert!(matches!(standing(old), Standing::Pending(_)));
        assert!(matches!(
            standing(json!({"metadata": {"name": "a"}})),
            Standing::Pending(_)
        ));
        // The view: its metadata and status, without the engine's bookkeeping.
        let view = Seen::of(&object("a", 2, "True", "Applied", false), 2, true).view;
        assert_eq!(
            view["metadata"],
            json!({"name": "a", "namespace": "ns", "labels": {"a": "b"}})
        );
        assert_eq!(view["status"]["available"], 3);
        assert!(view["status"]["lastCommand"].is_null());
    }

    #[test]
    fn a_gate_passes_when_every_resource_is_ready_on_the_latest() {
        let all = seen(&[
            object("a", 2, "True", "Applied", false),
            object("b", 2, "True", "Applied", false),
        ]);
        let (verdict, tally) = judge(&step(60, None), &all, 2, at(0), at(5));
        assert_eq!(verdict, Verdict::Passed);
        assert_eq!(
            tally,
            Tally {
                members: 2,
                ready: 2,
                failed: 0
            }
        );
        // A step without resources passes at once.
        assert_eq!(
            judge(&step(60, None), &[], 2, at(0), at(0)).0,
            Verdict::Passed
        );
    }

    #[test]
    fn it_waits_within_the_window_and_fails_after_it_naming_who() {
        let some = seen(&[
            object("a", 2, "True", "Applied", false),
            object("b", 1, "False", "ApplyFailed", false),
        ]);
        let (verdict, tally) = judge(&step(60, None), &some, 2, at(0), at(20));
        assert_eq!(
            tally,
            Tally {
                members: 2,
                ready: 1,
                failed: 1
            }
        );
        let Verdict::Waiting { left, why } = verdict else {
            panic!("{verdict:?}");
        };
        assert_eq!(left, Duration::from_secs(40));
        assert!(why.contains("ns/b (ApplyFailed: m)"), "{why}");
        let (verdict, _) = judge(&step(60, None), &some, 2, at(0), at(60));
        assert_eq!(
            verdict,
            Verdict::Failed(Failure {
                cause: Cause::NotReady,
                message:
                    "1 of 2 resource(s) not Ready on revision 2 within 1m: ns/b (ApplyFailed: m)"
                        .into(),
            })
        );
        // A clock behind the step's start counts no time.
        let (verdict, _) = judge(&step(60, None), &some, 2, at(10), at(0));
        assert!(
            matches!(verdict, Verdict::Waiting { left, .. } if left == Duration::from_secs(60))
        );
    }

    #[test]
    fn a_stalled_resource_fails_the_gate_at_once() {
        let some = seen(&[
            object("a", 2, "True", "Applied", false),
            object("b", 2, "False", "Unhealthy", true),
        ]);
        let (verdict, tally) = judge(&step(600, None), &some, 2, at(0), at(1));
        assert_eq!(tally.failed, 1);
        let Verdict::Failed(failure) = verdict else {
            panic!("{verdict:?}");
        };
        assert_eq!(failure.cause, Cause::Stalled);
        assert_eq!(
            failure.message,
            "1 of 2 resource(s) Stalled on revision 2: ns/b (Unhealthy: configmap/x: failed)"
        );
    }

    #[test]
    fn the_expression_decides_once_all_are_ready_and_fails_after_the_window() {
        let all = seen(&[
            object("a", 2, "True", "Applied", false),
            object("b", 2, "True", "Applied", false),
        ]);
        let holds = step(60, Some("resources.all(r, r.status.available >= 3)"));
        assert_eq!(judge(&holds, &all, 2, at(0), at(1)).0, Verdict::Passed);
        let never = step(60, Some("resources.all(r, r.status.available > 3)"));
        assert!(matches!(
            judge(&never, &all, 2, at(0), at(1)).0,
            Verdict::Waiting { .. }
        ));
        let (verdict, _) = judge(&never, &all, 2, at(0), at(61));
        let Verdict::Failed(failure) = verdict else {
            panic!("{verdict:?}");
        };
        assert_eq!(failure.cause, Cause::Expression);
        assert!(failure.message.contains("is false"), "{}", failure.message);
        let missing = step(1, Some("resources.all(r, r.status.nosuch > 0)"));
        let (verdict, _) = judge(&missing, &all, 2, at(0), at(2));
        assert!(
            matches!(&verdict, Verdict::Failed(f) if f.message.contains("cannot be evaluated")),
            "{verdict:?}"
        );
        let number = step(1, Some("size(resources)"));
        let (verdict, _) = judge(&number, &all, 2, at(0), at(2));
        assert!(
            matches!(&verdict, Verdict::Failed(f) if f.message.contains("gives 2, not a boolean")),
            "{verdict:?}"
        );
    }
}
