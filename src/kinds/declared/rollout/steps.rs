//! The steps of an automatic rollout (`spec.rollout.steps`): which
//! resources each step moves to the latest revision, and the gate each
//! step must pass before the next one starts.
//!
//! A step takes the resources carrying the canary labels (`canary:
//! true`) or a share of every resource (`percent: 10`). A share is chosen
//! by a stable hash of the resource's `namespace/name` ([`bucket`]), not
//! by counting: a resource lands in the same step every time, on every
//! replica, whatever else exists, and a share includes the shares of the
//! steps before it. With few resources a share's count is near, not
//! exactly, its percentage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::kinds::declared::expressions::{Expression, ExpressionError};

/// The most steps a rollout may have.
pub const MAX_STEPS: usize = 10;
/// How long a step's resources have to become `Ready` unless its gate says.
pub const WINDOW_DEFAULT: Duration = Duration::from_secs(5 * 60);
/// The shortest window.
pub const WINDOW_MIN: Duration = Duration::from_secs(1);
/// The longest window.
pub const WINDOW_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// How many buckets the hash space is cut into: a share of `percent`
/// takes `percent * 100` of them.
pub const BUCKETS: u32 = 10_000;
/// The name a gate's expression reads: the step's resources.
pub const RESOURCES: &str = "resources";
/// The pattern of a window in the CRD (as [`parse_duration`] reads).
const DURATION_PATTERN: &str = "^([0-9]+(ms|h|m|s))+$";

/// One step of a rollout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    /// The resources carrying every label of `spec.rollout.canary`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub canary: bool,
    /// This share of every resource (1 to 100), chosen by a stable hash of
    /// its namespace and name; it includes the shares of the steps before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub percent: Option<u8>,
    /// What the step's resources must show before the next step (default:
    /// `spec.rollout.gate`, else every one `Ready` within 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Gate>,
}

/// What a step's resources must show before the next step starts: every
/// one on the latest revision and `Ready` within `window`, none `Stalled`,
/// and `expression`, if given, true.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gate {
    /// How long after the step starts its resources have to pass (`30s`,
    /// `5m`, `1h`; from 1s to 24h; default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DURATION_PATTERN), length(max = 32))]
    pub window: Option<String>,
    /// CEL over `resources`, the step's resources (each its `metadata`:
    /// name, namespace, labels; and its `status`), that must be true once
    /// they are all `Ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::kinds::declared::expressions::MAX_SOURCE))]
    pub expression: Option<String>,
}

/// Which resources a step takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Selection {
    /// Those carrying every canary label.
    Canary,
    /// A share of all, in percent.
    Percent(u8),
}

/// A step, checked: what it takes and its gate.
#[derive(Debug, Clone)]
pub struct CompiledStep {
    /// What it takes.
    pub selection: Selection,
    /// How long its resources have to pass.
    pub window: Duration,
    /// The gate's expression, compiled.
    pub expression: Option<Arc<Expression>>,
}

/// The steps of a rollout, checked.
#[derive(Debug, Clone)]
pub struct Steps {
    steps: Vec<CompiledStep>,
    canary: BTreeMap<String, String>,
    digest: String,
}

/// Why the steps cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.rollout.{field}: {reason}")]
pub struct StepsError {
    /// Where (`steps[1].percent`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> StepsError {
    StepsError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Steps {
    /// Checks `steps`: each takes the canary or a share (not both), the
    /// shares do not shrink, a canary step has canary labels to select
    /// by, every window is a duration in range and every expression CEL
    /// over `resources`; `gate` is the gate of a step without its own.
    pub fn compile(
        steps: &[Step],
        gate: Option<&Gate>,
        canary: &BTreeMap<String, String>,
    ) -> Result<Self, StepsError> {
        if steps.is_empty() || steps.len() > MAX_STEPS {
            return Err(invalid(
                "steps",
                format!("from 1 to {MAX_STEPS} steps, not {}", steps.len()),
            ));
        }
        let mut compiled = Vec::with_capacity(steps.len());
        let mut share = 0;
        for (i, step) in steps.iter().enumerate() {
            let at = format!("steps[{i}]");
            let selection = match (step.canary, step.percent) {
                (true, None) if canary.is_empty() => {
                    return Err(invalid(
                        format!("{at}.canary"),
                        "a canary step needs the labels of spec.rollout.canary",
                    ));
                }
                (true, None) => Selection::Canary,
                (false, Some(percent)) if (1..=100).contains(&percent) && percent >= share => {
                    share = percent;
                    Selection::Percent(percent)
                }
                (false, Some(percent)) if (1..=100).contains(&percent) => {
                    return Err(invalid(
                        format!("{at}.percent"),
                        format!(
                            "{percent} is below the {share} of a step before: each share includes the ones before it"
                        ),
                    ));
                }
                (false, Some(percent)) => {
                    return Err(invalid(
                        format!("{at}.percent"),
                        format!("{percent} is not from 1 to 100"),
                    ));
                }
                _ => {
                    return Err(invalid(
                        at,
                        "a step takes either the canary (canary: true) or a share (percent), one of them",
                    ));
                }
            };
            let (gate, field) = match (&step.gate, gate) {
                (Some(own), _) => (own.clone(), format!("{at}.gate")),
                (None, Some(shared)) => (shared.clone(), "gate".to_string()),
                (None, None) => (Gate::default(), "gate".to_string()),
            };
            let (window, expression) = compile_gate(&gate, &field)?;
            compiled.push(CompiledStep {
                selection,
                window,
                expression,
            });
        }
        Ok(Self {
            digest: digest(steps, canary),
            steps: compiled,
            canary: canary.clone(),
        })
    }

    /// How many steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True without steps (never, once compiled).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Step `i` (from 0).
    pub fn step(&self, i: usize) -> Option<&CompiledStep> {
        self.steps.get(i)
    }

    /// What identifies the steps' selection: a change of it starts a
    /// rollout over.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The first step (from 0) that takes the resource `namespace/name`
    /// with `labels`; `None` when none does (it moves when the latest is
    /// promoted).
    pub fn first_step(
        &self,
        namespace: Option<&str>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<usize> {
        let bucket = bucket(namespace, name);
        let canary =
            || !self.canary.is_empty() && self.canary.iter().all(|(k, v)| labels.get(k) == Some(v));
        self.steps.iter().position(|step| match step.selection {
            Selection::Canary => canary(),
            Selection::Percent(percent) => bucket < u32::from(percent) * (BUCKETS / 100),
        })
    }

    /// True when a rollout at step `step` (from 0) serves the resource the
    /// latest revision.
    pub fn reached(
        &self,
        step: usize,
        namespace: Option<&str>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        self.first_step(namespace, name, labels)
            .is_some_and(|first| first <= step)
    }
}

/// A gate's window and expression, checked; `field` names it in errors.
fn compile_gate(
    gate: &Gate,
    field: &str,
) -> Result<(Duration, Option<Arc<Expression>>), StepsError> {
    let window = match &gate.window {
        Some(text) => {
            let window = parse_duration(text)
                .map_err(|e| invalid(format!("{field}.window"), e.to_string()))?;
            if !(WINDOW_MIN..=WINDOW_MAX).contains(&window) {
                return Err(invalid(
                    format!("{field}.window"),
                    format!("{text} is not from 1s to 24h"),
                ));
            }
            window
        }
        None => WINDOW_DEFAULT,
    };
    let known = [RESOURCES.to_string()].into_iter().collect();
    let expression = match &gate.expression {
        Some(source) => Some(Arc::new(Expression::compile(source, &known).map_err(
            |e: ExpressionError| invalid(format!("{field}.expression"), e.to_string()),
        )?)),
        None => None,
    };
    Ok((window, expression))
}

/// Where the resource `namespace/name` (`name` when cluster-scoped) falls
/// in `[0, BUCKETS)`: the first 8 bytes of the sha256 of that text, as a
/// number, modulo [`BUCKETS`]. The same on every replica and every start.
pub fn bucket(namespace: Option<&str>, name: &str) -> u32 {
    use sha2::{Digest, Sha256};
    let key = match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    };
    let hash = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    let bucket = u64::from_be_bytes(first) % u64::from(BUCKETS);
    u32::try_from(bucket).unwrap_or_default()
}

/// True when the resource `namespace/name` is in a share of `percent`.
pub fn in_share(namespace: Option<&str>, name: &str, percent: u8) -> bool {
    bucket(namespace, name) < u32::from(percent.min(100)) * (BUCKETS / 100)
}

/// What identifies the selection of `steps` over `canary` (not their
/// gates): the first 16 hex digits of a sha256.
pub fn digest(steps: &[Step], canary: &BTreeMap<String, String>) -> String {
    use sha2::{Digest, Sha256};
    let selections: Vec<(bool, Option<u8>)> = steps.iter().map(|s| (s.canary, s.percent)).collect();
    let text = serde_json::json!({"canary": canary, "steps": selections}).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
        .chars()
        .take(16)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(percent: u8) -> Step {
        Step {
            percent: Some(percent),
            ..Step::default()
        }
    }

    fn canary_step() -> Step {
        Step {
            canary: true,
            ..Step::default()
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_hash_is_stable_and_spreads_evenly() {
        // Fixed values: a change of the hash would move resources between
        // steps of rollouts under way.
        assert_eq!(bucket(Some("team-a"), "web"), bucket(Some("team-a"), "web"));
        assert_ne!(bucket(Some("team-a"), "web"), bucket(Some("team-b"), "web"));
        assert_eq!(bucket(None, "web"), bucket(None, "web"));
        let known = bucket(Some("ns"), "g-00");
        use sha2::{Digest, Sha256};
        let hash = Sha256::digest(b"ns/g-00");
        let expected = u64::from_be_bytes(hash[..8].try_into().unwrap()) % 10_000;
        assert_eq!(u64::from(known), expected);
        // 10,000 names: each tenth of the space holds about a tenth.
        let mut tenths = [0u32; 10];
        for i in 0..10_000 {
            tenths[(bucket(Some("ns"), &format!("r-{i}")) / 1_000) as usize] += 1;
        }
        assert!(tenths.iter().all(|n| (900..1100).contains(n)), "{tenths:?}");
    }

    #[test]
    fn a_share_includes_the_smaller_ones_and_all_is_everyone() {
        for i in 0..500 {
            let name = format!("r-{i}");
            let (ten, fifty) = (
                in_share(Some("ns"), &name, 10),
                in_share(Some("ns"), &name, 50),
            );
            assert!(!ten || fifty, "{name} in 10% but not in 50%");
            assert!(in_share(Some("ns"), &name, 100));
        }
        let in_ten = (0..1000)
            .filter(|i| in_share(Some("ns"), &format!("r-{i}"), 10))
            .count();
        assert!((70..130).contains(&in_ten), "{in_ten} of 1000 in 10%");
    }

    #[test]
    fn each_resource_has_a_first_step_the_canary_first() {
        let canary = labels(&[("track", "canary")]);
        let steps = [canary_step(), share(10), share(50), share(100)];
        let steps = Steps::compile(&steps, None, &canary).unwrap();
        assert_eq!(steps.len(), 4);
        let on_canary = labels(&[("track", "canary")]);
        let none = BTreeMap::new();
        for i in 0..200 {
            let name = format!("r-{i}");
            let ns = Some("ns");
            assert_eq!(steps.first_step(ns, &name, &on_canary), Some(0));
            let expected = if in_share(ns, &name, 10) {
                1
            } else if in_share(ns, &name, 50) {
                2
            } else {
                3
            };
            assert_eq!(steps.first_step(ns, &name, &none), Some(expected), "{name}");
            assert!(steps.reached(3, ns, &name, &none));
            assert!(!steps.reached(0, ns, &name, &none));
        }
        // Without a step of 100, the last share's outside waits for the promotion.
        let partial = Steps::compile(&[share(1)], None, &BTreeMap::new()).unwrap();
        let outside = (0..100)
            .map(|i| format!("r-{i}"))
            .find(|n| !in_share(Some("ns"), n, 1))
            .unwrap();
        assert_eq!(partial.first_step(Some("ns"), &outside, &none), None);
    }

    #[test]
    fn the_digest_follows_the_selection_not_the_gates() {
        let canary = labels(&[("track", "canary")]);
        let plain = [canary_step(), share(50)];
        let gated = [
            canary_step(),
            Step {
                gate: Some(Gate {
                    window: Some("1m".into()),
                    expression: None,
                }),
                ..share(50)
            },
        ];
        assert_eq!(digest(&plain, &canary), digest(&gated, &canary));
        assert_ne!(
            digest(&plain, &canary),
            digest(&[canary_step(), share(60)], &canary)
        );
        assert_ne!(
            digest(&plain, &canary),
            digest(&plain, &labels(&[("t", "c")]))
        );
        assert_eq!(digest(&plain, &canary).len(), 16);
    }

    #[test]
    fn steps_are_checked_naming_the_field() {
        let err = |steps: &[Step], gate: Option<&Gate>, canary: &BTreeMap<String, String>| {
            Steps::compile(steps, gate, canary).unwrap_err().to_string()
        };
        let none = BTreeMap::new();
        assert_eq!(
            err(&[canary_step()], None, &none),
            "spec.rollout.steps[0].canary: a canary step needs the labels of spec.rollout.canary"
        );
        assert_eq!(
            err(&[share(50), share(10)], None, &none),
            "spec.rollout.steps[1].percent: 10 is below the 50 of a step before: each share includes the ones before it"
        );
        assert!(err(&[share(0)], None, &none).contains("0 is not from 1 to 100"));
        let both = Step {
            canary: true,
            percent: Some(5),
            gate: None,
        };
        assert!(err(&[both], None, &none).contains("either the canary"));
        assert!(err(&[Step::default()], None, &none).contains("either the canary"));
        assert!(err(&[], None, &none).contains("from 1 to 10 steps"));
        assert!(err(&vec![share(1); 11], None, &none).contains("not 11"));
        let slow = Gate {
            window: Some("25h".into()),
            expression: None,
        };
        assert_eq!(
            err(&[share(10)], Some(&slow), &none),
            "spec.rollout.gate.window: 25h is not from 1s to 24h"
        );
        let odd = Step {
            gate: Some(Gate {
                window: Some("1 hour".into()),
                expression: None,
            }),
            ..share(10)
        };
        assert!(
            err(&[odd], None, &none)
                .starts_with("spec.rollout.steps[0].gate.window: invalid duration")
        );
        let unknown = Gate {
            window: None,
            expression: Some("spec.x == 1".into()),
        };
        let message = err(&[share(10)], Some(&unknown), &none);
        assert!(
            message.starts_with("spec.rollout.gate.expression: reads \"spec\""),
            "{message}"
        );
        let nested = Gate {
            window: None,
            expression: Some(
                "resources.all(r, resources.all(s, r.metadata.name != s.metadata.name))".into(),
            ),
        };
        let message = err(&[share(10)], Some(&nested), &none);
        assert!(message.contains("may not nest"), "{message}");
    }

    #[test]
    fn a_step_without_a_gate_takes_the_shared_one_or_the_default() {
        let shared = Gate {
            window: Some("30s".into()),
            expression: Some("resources.all(r, r.status.revision > 0)".into()),
        };
        let own = Step {
            gate: Some(Gate {
                window: Some("2m".into()),
                expression: None,
            }),
            ..share(100)
        };
        let steps = Steps::compile(&[share(10), own], Some(&shared), &BTreeMap::new()).unwrap();
        let first = steps.step(0).unwrap();
        assert_eq!(first.window, Duration::from_secs(30));
        assert!(first.expression.is_some());
        let second = steps.step(1).unwrap();
        assert_eq!(second.window, Duration::from_secs(120));
        assert!(second.expression.is_none());
        let plain = Steps::compile(&[share(10)], None, &BTreeMap::new()).unwrap();
        assert_eq!(plain.step(0).unwrap().window, WINDOW_DEFAULT);
    }
}
