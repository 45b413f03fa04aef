//! One chaos round, planned: draw the victims with a seeded RNG, cap them,
//! and turn them into typed steps (Pod deletions, a server-side apply of
//! partial objects), events and status. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{
    ActionCounts, ChaosAgentStatus, FIELD_MANAGER, MAX_REPLICAS, RoundError, RoundInput,
    RoundReport, RoundStatus, lorem,
};
use crate::kind::{ConditionStatus, ConditionType, ObjectId, Overlay, Plan, PlannedEvent, Step};
use crate::text::truncate;

/// Lorem Ipsum written into one ConfigMap, all keys together, in bytes.
const IPSUM_BUDGET: usize = 64 * 1024;
/// Action lines kept in `status.lastRound.actions`.
const REPORTED_ACTIONS: usize = 20;
/// An odd constant (2^64 / golden ratio) mixing the round number into the seed.
const ROUND_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;
/// Errors kept in `status.lastErrors`.
const KEPT_ERRORS: usize = 5;
/// Longest error message kept.
const ERROR_MESSAGE_LIMIT: usize = 512;

/// One thing a round does. The derived order (type, namespace, name) is the
/// order of steps and events.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    Kill {
        namespace: String,
        name: String,
    },
    Scale {
        namespace: String,
        name: String,
        from: i32,
        to: i32,
    },
    Ipsum {
        namespace: String,
        name: String,
        keys: Vec<String>,
    },
}

impl Action {
    /// The event reason and a line for `status.lastRound.actions`.
    fn describe(&self, dry_run: bool) -> (&'static str, String) {
        let (reason, would) = match self {
            Self::Kill { .. } => ("KilledPod", "WouldKillPod"),
            Self::Scale { .. } => ("ScaledDeployment", "WouldScaleDeployment"),
            Self::Ipsum { .. } => ("WroteIpsum", "WouldWriteIpsum"),
        };
        let line = match self {
            Self::Kill { namespace, name } => format!("pod {namespace}/{name}"),
            Self::Scale {
                namespace,
                name,
                from,
                to,
            } => format!("deployment {namespace}/{name}: {from} -> {to} replicas"),
            Self::Ipsum {
                namespace,
                name,
                keys,
            } => format!("configmap {namespace}/{name}: {} keys", keys.len()),
        };
        (if dry_run { would } else { reason }, line)
    }

    /// The event: about the agent, related to the object acted on. Events
    /// about the same object fold into one series, so the note says nothing
    /// that changes from round to round.
    fn event(&self, reason: &'static str) -> PlannedEvent {
        let (api_version, kind, namespace, name, note) = match self {
            Self::Kill { namespace, name } => (
                "v1",
                "Pod",
                namespace,
                name,
                format!("pod {namespace}/{name}"),
            ),
            Self::Scale {
                namespace, name, ..
            } => (
                "apps/v1",
                "Deployment",
                namespace,
                name,
                format!("deployment {namespace}/{name}: replicas doubled (at most {MAX_REPLICAS})"),
            ),
            Self::Ipsum {
                namespace, name, ..
            } => (
                "v1",
                "ConfigMap",
                namespace,
                name,
                format!("configmap {namespace}/{name}: data replaced with Lorem Ipsum"),
            ),
        };
        PlannedEvent::normal(reason, note).related_to(ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            ..Default::default()
        })
    }
}

/// Twice `replicas`, at least 1, at most [`MAX_REPLICAS`].
pub fn doubled(replicas: i32) -> i32 {
    replicas.max(0).saturating_mul(2).clamp(1, MAX_REPLICAS)
}

/// Plans one round of `input`, touching only namespaces that pass `eligible`.
pub fn plan(input: &RoundInput, eligible: impl Fn(&str) -> bool) -> Plan<RoundStatus> {
    let previous = input.agent.status.clone().unwrap_or_default();
    let round = previous.round.round.unwrap_or(0).saturating_add(1);
    // Spread the rounds apart, so agents with neighbouring seeds do not
    // replay each other's rounds shifted by one.
    let seed = input
        .seed
        .wrapping_add(round.cast_unsigned().wrapping_mul(ROUND_STRIDE));
    let mut rng = StdRng::seed_from_u64(seed);
    let choice = choose(input, &eligible, &mut rng);
    let dry_run = input.agent.spec.dry_run;
    let acts = act(&choice.chosen, dry_run, &mut rng);
    let mut total = previous.round.total.clone();
    if !dry_run {
        total.tantrum += acts.counts.tantrum;
        total.cancer += acts.counts.cancer;
        total.ipsum += acts.counts.ipsum;
    }
    let report = RoundReport {
        dry_run,
        seed: seed.cast_signed(),
        summary: summary(&acts.counts, dry_run, choice.tantrum_held, choice.capped),
        counts: acts.counts,
        eligible_pods: i64::try_from(choice.eligible_pods).unwrap_or(i64::MAX),
        tantrum_held: choice.tantrum_held,
        capped: i64::try_from(choice.capped).unwrap_or(i64::MAX),
        actions: acts.lines,
    };
    let status = RoundStatus {
        round: Some(round),
        last_round_at: Some(input.now),
        last_round: Some(report),
        total,
        last_errors: errors_seen(&previous),
    };
    Plan {
        steps: acts.steps,
        // A failed round is a round too: counted and reported the same.
        failure_status: Some(status.clone()),
        status: Some(status),
        events: acts.events,
        always_run: true,
        ..Default::default()
    }
}

/// What a round drew.
struct Choice {
    chosen: Vec<Action>,
    eligible_pods: usize,
    tantrum_held: bool,
    capped: usize,
}

/// Draws the victims: each eligible object with probability `eagerness`%,
/// at most `maxActionsPerRound` in all (a seeded shuffle picks which).
fn choose(input: &RoundInput, eligible: &impl Fn(&str) -> bool, rng: &mut StdRng) -> Choice {
    let spec = &input.agent.spec;
    let eagerness = spec.eagerness.clamp(0, 100).unsigned_abs();
    let mut draw = || rng.random_range(0..100u32) < eagerness;
    let mut chosen = Vec::new();
    let mut pods: Vec<_> = input
        .targets
        .pods
        .iter()
        .filter(|p| p.running && !p.terminating && eligible(&p.namespace))
        .collect();
    pods.sort();
    let tolerance = usize::try_from(spec.pod_tolerance.max(0)).unwrap_or(usize::MAX);
    let tantrum_held = spec.tantrum_mode && pods.len() < tolerance;
    if spec.tantrum_mode && !tantrum_held {
        chosen.extend(pods.iter().filter(|_| draw()).map(|p| Action::Kill {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
        }));
    }
    if spec.cancer_mode {
        let mut deployments: Vec<_> = input
            .targets
            .deployments
            .iter()
            .filter(|d| !d.terminating && d.replicas < MAX_REPLICAS && eligible(&d.namespace))
            .collect();
        deployments.sort();
        chosen.extend(
            deployments
                .into_iter()
                .filter(|_| draw())
                .map(|d| Action::Scale {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                    from: d.replicas,
                    to: doubled(d.replicas),
                }),
        );
    }
    if spec.ipsum_mode {
        let mut config_maps: Vec<_> = input
            .targets
            .config_maps
            .iter()
            .filter(|c| {
                !c.terminating && !c.immutable && !c.keys.is_empty() && eligible(&c.namespace)
            })
            .collect();
        config_maps.sort();
        chosen.extend(
            config_maps
                .into_iter()
                .filter(|_| draw())
                .map(|c| Action::Ipsum {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    keys: c.keys.clone(),
                }),
        );
    }
    let cap = usize::try_from(spec.max_actions_per_round.max(1)).unwrap_or(1);
    let capped = chosen.len().saturating_sub(cap);
    if capped > 0 {
        chosen.shuffle(rng);
        chosen.truncate(cap);
    }
    chosen.sort();
    Choice {
        chosen,
        eligible_pods: pods.len(),
        tantrum_held,
        capped,
    }
}

/// What a round does about its choice.
struct Acts {
    steps: Vec<Step>,
    events: Vec<PlannedEvent>,
    lines: Vec<String>,
    counts: ActionCounts,
}

/// The steps (none in dry run), events and report lines for `chosen`.
fn act(chosen: &[Action], dry_run: bool, rng: &mut StdRng) -> Acts {
    let mut acts = Acts {
        steps: Vec::new(),
        events: Vec::new(),
        lines: Vec::new(),
        counts: ActionCounts::default(),
    };
    let mut kills = Vec::new();
    let mut resources = Vec::new();
    for action in chosen {
        let (reason, line) = action.describe(dry_run);
        if acts.lines.len() < REPORTED_ACTIONS {
            acts.lines.push(format!("{reason} {line}"));
        }
        acts.events.push(action.event(reason));
        match action {
            Action::Kill { namespace, name } => {
                acts.counts.tantrum += 1;
                kills.push(ObjectId {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    namespace: Some(namespace.clone()),
                    name: name.clone(),
                });
            }
            Action::Scale {
                namespace,
                name,
                to,
                ..
            } => {
                acts.counts.cancer += 1;
                resources.push(json!({
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"replicas": to},
                }));
            }
            Action::Ipsum {
                namespace,
                name,
                keys,
            } => {
                acts.counts.ipsum += 1;
                resources.push(ipsum(namespace, name, keys, rng));
            }
        }
    }
    if !dry_run {
        if !kills.is_empty() {
            acts.steps.push(Step::DeleteForeign { objects: kills });
        }
        if !resources.is_empty() {
            acts.steps.push(Step::Patch {
                overlay: Overlay {
                    resources,
                    ..Default::default()
                },
                field_manager: FIELD_MANAGER.into(),
            });
        }
    }
    acts
}

/// A partial ConfigMap replacing every value of `keys` with Lorem Ipsum.
fn ipsum(namespace: &str, name: &str, keys: &[String], rng: &mut StdRng) -> serde_json::Value {
    let budget = (IPSUM_BUDGET / keys.len().max(1)).max(80);
    let data: BTreeMap<&str, String> = keys
        .iter()
        .map(|k| (k.as_str(), lorem::text(rng, budget)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    })
}

fn summary(counts: &ActionCounts, dry_run: bool, tantrum_held: bool, capped: usize) -> String {
    let verbs = if dry_run {
        ["would kill", "would scale up", "would rewrite"]
    } else {
        ["killed", "scaled up", "rewrote"]
    };
    let mut s = format!(
        "{}{} {} pods, {} {} deployments, {} {} configmaps",
        if dry_run { "dry run: " } else { "" },
        verbs[0],
        counts.tantrum,
        verbs[1],
        counts.cancer,
        verbs[2],
        counts.ipsum
    );
    if tantrum_held {
        s.push_str("; tantrum held (fewer pods than podTolerance)");
    }
    if capped > 0 {
        s.push_str(&format!("; {capped} more dropped by maxActionsPerRound"));
    }
    s
}

/// `lastErrors`, with the failure the status reports now (if it is new)
/// appended: a failed round is only known at the next reconcile, from the
/// `Ready=False` condition the engine wrote.
pub fn errors_seen(previous: &ChaosAgentStatus) -> Vec<RoundError> {
    let mut errors = previous.round.last_errors.clone();
    if let Some(c) = previous
        .common
        .condition(ConditionType::Ready)
        .filter(|c| c.status == ConditionStatus::False)
    {
        let error = RoundError {
            round: previous.round.round.unwrap_or(0),
            at: c.last_transition_time,
            reason: c.reason,
            message: truncate(&c.message, ERROR_MESSAGE_LIMIT),
        };
        if !errors.contains(&error) {
            errors.push(error);
        }
    }
    let excess = errors.len().saturating_sub(KEPT_ERRORS);
    errors.drain(..excess);
    errors
}
