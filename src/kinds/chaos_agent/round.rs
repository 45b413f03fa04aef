//! One chaos round, planned: draw the victims with a seeded RNG, cap them,
//! and turn them into kubectl steps, events and status. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::{
    ActionCounts, ChaosAgentStatus, FIELD_MANAGER, MAX_REPLICAS, RoundError, RoundInput,
    RoundReport, lorem,
};
use crate::handler::{HandlerError, Plan, PlannedEvent, Step};
use crate::overlay::Overlay;
use crate::status::{READY, truncate};

/// Lorem Ipsum written into one ConfigMap, all keys together, in bytes.
const IPSUM_BUDGET: usize = 64 * 1024;
/// Pod names per `kubectl delete pod` command.
const KILLS_PER_COMMAND: usize = 50;
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
    fn event(&self, reason: &str) -> PlannedEvent {
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
        PlannedEvent {
            warning: false,
            reason: reason.into(),
            note,
            related: Some(ObjectReference {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            }),
        }
    }
}

/// Twice `replicas`, at least 1, at most [`MAX_REPLICAS`].
pub fn doubled(replicas: i32) -> i32 {
    replicas.max(0).saturating_mul(2).clamp(1, MAX_REPLICAS)
}

/// Plans one round of `input`, touching only namespaces that pass `eligible`.
pub fn plan(input: &RoundInput, eligible: impl Fn(&str) -> bool) -> Result<Plan, HandlerError> {
    let spec = &input.agent.spec;
    let previous = input.agent.status.clone().unwrap_or_default();
    let round = previous.round.unwrap_or(0).saturating_add(1);
    // Spread the rounds apart, so agents with neighbouring seeds do not
    // replay each other's rounds shifted by one.
    let seed = input
        .seed
        .wrapping_add(round.cast_unsigned().wrapping_mul(ROUND_STRIDE));
    let mut rng = StdRng::seed_from_u64(seed);
    let eagerness = spec.eagerness.clamp(0, 100).unsigned_abs();
    let draw = |rng: &mut StdRng| rng.random_range(0..100u32) < eagerness;

    let mut chosen = Vec::new();
    let mut pods: Vec<_> = input
        .targets
        .pods
        .iter()
        .filter(|p| !p.terminating && eligible(&p.namespace))
        .collect();
    pods.sort();
    let tolerance = usize::try_from(spec.pod_tolerance.max(0)).unwrap_or(usize::MAX);
    let tantrum_held = spec.tantrum_mode && pods.len() < tolerance;
    if spec.tantrum_mode && !tantrum_held {
        for p in &pods {
            if draw(&mut rng) {
                chosen.push(Action::Kill {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                });
            }
        }
    }
    if spec.cancer_mode {
        let mut deployments: Vec<_> = input
            .targets
            .deployments
            .iter()
            .filter(|d| !d.terminating && d.replicas < MAX_REPLICAS && eligible(&d.namespace))
            .collect();
        deployments.sort();
        for d in deployments {
            if draw(&mut rng) {
                chosen.push(Action::Scale {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                    from: d.replicas,
                    to: doubled(d.replicas),
                });
            }
        }
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
        for c in config_maps {
            if draw(&mut rng) {
                chosen.push(Action::Ipsum {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    keys: c.keys.clone(),
                });
            }
        }
    }
    let cap = usize::try_from(spec.max_actions_per_round.max(1)).unwrap_or(1);
    let capped = chosen.len().saturating_sub(cap);
    if capped > 0 {
        chosen.shuffle(&mut rng);
        chosen.truncate(cap);
    }
    chosen.sort();

    let dry_run = spec.dry_run;
    let mut plan = Plan {
        always_run: true,
        ..Default::default()
    };
    let mut counts = ActionCounts::default();
    let mut kills: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut resources = Vec::new();
    let mut lines = Vec::new();
    for action in &chosen {
        let (reason, line) = action.describe(dry_run);
        if lines.len() < REPORTED_ACTIONS {
            lines.push(format!("{reason} {line}"));
        }
        plan.events.push(action.event(reason));
        match action {
            Action::Kill { namespace, name } => {
                counts.tantrum += 1;
                kills.entry(namespace).or_default().push(name);
            }
            Action::Scale {
                namespace,
                name,
                to,
                ..
            } => {
                counts.cancer += 1;
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
                counts.ipsum += 1;
                let budget = (IPSUM_BUDGET / keys.len().max(1)).max(80);
                let data: BTreeMap<&str, String> = keys
                    .iter()
                    .map(|k| (k.as_str(), lorem::text(&mut rng, budget)))
                    .collect();
                resources.push(json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace},
                    "data": data,
                }));
            }
        }
    }
    if !dry_run {
        for (namespace, names) in &kills {
            for chunk in names.chunks(KILLS_PER_COMMAND) {
                // Names after `--`: never read as flags.
                let mut args = vec![
                    "delete".to_string(),
                    "pod".into(),
                    format!("--namespace={namespace}"),
                    "--ignore-not-found=true".into(),
                    "--wait=false".into(),
                    "--".into(),
                ];
                args.extend(chunk.iter().map(|n| n.to_string()));
                plan.steps.push(Step::Run { args });
            }
        }
        if !resources.is_empty() {
            plan.steps.push(Step::Apply {
                overlay: Overlay {
                    resources,
                    ..Default::default()
                },
                extra_args: vec![
                    "--server-side".into(),
                    "--force-conflicts".into(),
                    format!("--field-manager={FIELD_MANAGER}"),
                ],
            });
        }
    }

    let mut total = previous.total.clone();
    if !dry_run {
        total.tantrum += counts.tantrum;
        total.cancer += counts.cancer;
        total.ipsum += counts.ipsum;
    }
    let summary = summary(&counts, dry_run, tantrum_held, capped);
    let report = RoundReport {
        dry_run,
        seed: seed.cast_signed(),
        counts,
        eligible_pods: i64::try_from(pods.len()).unwrap_or(i64::MAX),
        tantrum_held,
        capped: i64::try_from(capped).unwrap_or(i64::MAX),
        actions: lines,
        summary,
    };
    let status = [
        ("round", json!(round)),
        ("lastRoundAt", json!(input.now.to_string())),
        ("lastRound", to_json(&report)?),
        ("total", to_json(&total)?),
        ("lastErrors", to_json(&errors_seen(&previous))?),
    ];
    plan.status = status
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Ok(plan)
}

fn to_json(value: &impl serde::Serialize) -> Result<serde_json::Value, HandlerError> {
    serde_json::to_value(value).map_err(|e| HandlerError::transient("StatusFailed", e))
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
    let mut errors = previous.last_errors.clone();
    if let Some(c) = previous
        .common
        .condition(READY)
        .filter(|c| c.status == "False")
    {
        let error = RoundError {
            round: previous.round.unwrap_or(0),
            at: c.last_transition_time.clone(),
            reason: c.reason.clone(),
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
