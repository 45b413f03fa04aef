use std::collections::BTreeMap;

use super::round::{doubled, errors_seen};
use super::targets::{ConfigMapTarget, DeploymentTarget, PodTarget};
use super::*;
use crate::kind::Step;

fn spec() -> ChaosAgentSpec {
    ChaosAgentSpec {
        tantrum_mode: false,
        pod_tolerance: 0,
        cancer_mode: false,
        ipsum_mode: false,
        eagerness: 100,
        pause_duration: 5,
        excluded_namespaces: Vec::new(),
        dry_run: false,
        max_actions_per_round: 100,
        seed: Some(42),
    }
}

fn agent(spec: ChaosAgentSpec, label: Option<&str>) -> ChaosAgent {
    let mut a = ChaosAgent::new("edmund", spec);
    if let Some(ns) = label {
        a.metadata.labels = Some(BTreeMap::from([(SCOPE_LABEL.to_string(), ns.to_string())]));
    }
    a
}

fn pod(ns: &str, name: &str) -> PodTarget {
    PodTarget {
        namespace: ns.into(),
        name: name.into(),
        terminating: false,
        running: true,
    }
}

fn deployment(ns: &str, name: &str, replicas: i32) -> DeploymentTarget {
    DeploymentTarget {
        namespace: ns.into(),
        name: name.into(),
        replicas,
        terminating: false,
    }
}

fn config_map(ns: &str, name: &str, immutable: bool, keys: &[&str]) -> ConfigMapTarget {
    ConfigMapTarget {
        namespace: ns.into(),
        name: name.into(),
        immutable,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        terminating: false,
    }
}

fn round_input(agent: ChaosAgent, targets: Targets) -> Observed {
    Observed::Round(Box::new(RoundInput {
        now: "2026-01-01T00:00:00Z".parse().unwrap(),
        seed: agent.spec.seed.unwrap_or(7).cast_unsigned(),
        agent,
        targets,
    }))
}

fn cluster_handler() -> ChaosAgentHandler {
    ChaosAgentHandler::new(Some("operator".into()), None)
}

type Plan = crate::kind::Plan<RoundStatus>;

fn plan_for(handler: &ChaosAgentHandler, agent: ChaosAgent, targets: Targets) -> Plan {
    handler
        .plan(&agent.clone(), &round_input(agent, targets))
        .unwrap()
}

fn status(plan: &Plan) -> serde_json::Value {
    serde_json::to_value(&plan.status).unwrap()
}

fn reasons(plan: &Plan) -> Vec<String> {
    plan.events.iter().map(|e| e.reason.to_string()).collect()
}

fn killed(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::DeleteForeign { objects } => Some(
                objects
                    .iter()
                    .map(|o| format!("{}/{}", o.namespace.as_deref().unwrap_or_default(), o.name))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

fn applied(plan: &Plan) -> Vec<serde_json::Value> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::Patch { overlay, .. } => Some(overlay.resources.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn crd_matches_the_article() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(ChaosAgent::crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "chaosagents.blackadder.io");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "ca");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1beta1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<_> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("priority").is_none())
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        columns,
        [
            "Tantrum",
            "Tolerance",
            "Cancer",
            "Ipsum",
            "Eagerness",
            "Pause",
            "Excluded"
        ]
    );
    let props = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(props["eagerness"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(props["eagerness"]["maximum"].as_f64(), Some(100.0));
    assert_eq!(props["pauseDuration"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(props["podTolerance"]["minimum"].as_f64(), Some(0.0));
    assert_eq!(props["maxActionsPerRound"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(props["maxActionsPerRound"]["default"], 10);
    assert_eq!(props["dryRun"]["default"], false);
}

#[test]
fn the_article_manifest_deserializes_with_defaults() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/chaosagent.yaml"),
    )
    .unwrap();
    let agent: ChaosAgent = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(agent.metadata.name.as_deref(), Some("princeedmund1"));
    assert!(agent.spec.tantrum_mode && agent.spec.cancer_mode && agent.spec.ipsum_mode);
    assert_eq!(agent.spec.pod_tolerance, 10);
    assert_eq!(agent.spec.eagerness, 20);
    assert_eq!(agent.spec.pause_duration, 30);
    assert_eq!(agent.spec.excluded_namespaces, ["kube-system"]);
    assert!(!agent.spec.dry_run);
    assert_eq!(agent.spec.max_actions_per_round, 10);
    assert_eq!(agent.spec.seed, None);
}

#[test]
fn scope_follows_the_label_and_the_operator_namespace() {
    let h = cluster_handler();
    assert_eq!(h.scope(&agent(spec(), None)).unwrap(), Scope::Cluster);
    assert_eq!(
        h.scope(&agent(spec(), Some("team"))).unwrap(),
        Scope::Namespace("team".into())
    );
    let confined = ChaosAgentHandler::new(None, Some("team".into()));
    assert_eq!(
        confined.scope(&agent(spec(), Some("team"))).unwrap(),
        Scope::Namespace("team".into())
    );
    assert!(matches!(
        confined.scope(&agent(spec(), None)),
        Err(HandlerError::Invalid(_))
    ));
    assert!(matches!(
        confined.scope(&agent(spec(), Some("other"))),
        Err(HandlerError::Invalid(_))
    ));
    assert_eq!(
        h.watch_selector(Some("team")).as_deref(),
        Some("blackadder.io/namespace=team")
    );
    assert_eq!(h.watch_selector(None), None);
}

#[test]
fn protected_operator_and_excluded_namespaces_are_never_touched() {
    let h = cluster_handler();
    let mut s = spec();
    s.excluded_namespaces = vec!["mine".into()];
    let a = agent(s, None);
    for ns in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "operator",
        "mine",
        "",
    ] {
        assert!(!h.may_touch(&a, &Scope::Cluster, ns), "{ns}");
    }
    assert!(h.may_touch(&a, &Scope::Cluster, "default"));
    assert!(!h.may_touch(&a, &Scope::Namespace("team".into()), "default"));
    assert!(h.may_touch(&a, &Scope::Namespace("team".into()), "team"));
    // Even an agent labelled for a protected namespace does nothing there.
    assert!(!h.may_touch(&a, &Scope::Namespace("kube-system".into()), "kube-system"));
}

#[test]
fn a_round_everywhere_spares_the_protected_namespaces() {
    let mut s = spec();
    s.tantrum_mode = true;
    s.cancer_mode = true;
    s.ipsum_mode = true;
    s.excluded_namespaces = vec!["mine".into()];
    let mut targets = Targets::default();
    for ns in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "operator",
        "mine",
        "app",
    ] {
        targets.pods.push(pod(ns, "p"));
        targets.deployments.push(deployment(ns, "d", 1));
        targets.config_maps.push(config_map(ns, "c", false, &["k"]));
    }
    let plan = plan_for(&cluster_handler(), agent(s, None), targets);
    assert_eq!(killed(&plan), ["app/p"]);
    let touched: Vec<_> = applied(&plan)
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(touched, ["app", "app"]);
    assert_eq!(plan.events.len(), 3);
}

#[test]
fn tantrum_waits_for_the_tolerance() {
    let mut s = spec();
    s.tantrum_mode = true;
    s.pod_tolerance = 3;
    let two = Targets {
        pods: vec![pod("app", "a"), pod("app", "b")],
        ..Default::default()
    };
    let plan = plan_for(&cluster_handler(), agent(s.clone(), None), two);
    assert!(plan.steps.is_empty());
    assert_eq!(status(&plan)["lastRound"]["tantrumHeld"], true);
    assert_eq!(status(&plan)["lastRound"]["eligiblePods"], 2);

    let three = Targets {
        pods: vec![
            pod("app", "c"),
            pod("app", "a"),
            pod("app", "b"),
            PodTarget {
                terminating: true,
                ..pod("app", "dying")
            },
            PodTarget {
                running: false,
                ..pod("app", "pending")
            },
        ],
        ..Default::default()
    };
    let plan = plan_for(&cluster_handler(), agent(s, None), three);
    assert_eq!(killed(&plan), ["app/a", "app/b", "app/c"]);
    let Step::DeleteForeign { objects } = &plan.steps[0] else {
        panic!("{plan:?}")
    };
    assert!(
        objects
            .iter()
            .all(|o| o.kind == "Pod" && o.api_version == "v1")
    );
    assert_eq!(reasons(&plan), ["KilledPod"; 3]);
    assert_eq!(status(&plan)["lastRound"]["counts"]["tantrum"], 3);
    assert_eq!(status(&plan)["total"]["tantrum"], 3);
}

#[test]
fn cancer_doubles_up_to_128() {
    assert_eq!(doubled(0), 1);
    assert_eq!(doubled(1), 2);
    assert_eq!(doubled(3), 6);
    assert_eq!(doubled(100), 128);
    assert_eq!(doubled(i32::MAX), 128);
    let mut s = spec();
    s.cancer_mode = true;
    let targets = Targets {
        deployments: vec![
            deployment("app", "zero", 0),
            deployment("app", "three", 3),
            deployment("app", "full", 128),
            deployment("app", "over", 200),
        ],
        ..Default::default()
    };
    let plan = plan_for(&cluster_handler(), agent(s, None), targets);
    let resources = applied(&plan);
    assert_eq!(
        resources,
        [
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "three", "namespace": "app"}, "spec": {"replicas": 6}}),
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "zero", "namespace": "app"}, "spec": {"replicas": 1}}),
        ]
    );
    let Step::Patch { field_manager, .. } = &plan.steps[0] else {
        panic!()
    };
    assert_eq!(field_manager, "chaos-agent");
    assert_eq!(
        status(&plan)["lastRound"]["actions"][0],
        "ScaledDeployment deployment app/three: 3 -> 6 replicas"
    );
    let related = plan.events[0].related.as_ref().unwrap();
    assert_eq!(
        (related.kind.as_deref(), related.name.as_deref()),
        (Some("Deployment"), Some("three"))
    );
}

#[test]
fn ipsum_rewrites_only_mutable_config_maps_with_data() {
    let mut s = spec();
    s.ipsum_mode = true;
    let targets = Targets {
        config_maps: vec![
            config_map("app", "plain", false, &["a", "b"]),
            config_map("app", "frozen", true, &["a"]),
            config_map("app", "empty", false, &[]),
        ],
        ..Default::default()
    };
    let plan = plan_for(&cluster_handler(), agent(s, None), targets);
    let resources = applied(&plan);
    assert_eq!(resources.len(), 1, "{resources:?}");
    let cm = &resources[0];
    assert_eq!(
        cm["metadata"],
        serde_json::json!({"name": "plain", "namespace": "app"})
    );
    let data = cm["data"].as_object().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["a", "b"]);
    for v in data.values() {
        assert!(v.as_str().unwrap().starts_with("Lorem ipsum"), "{v}");
    }
    assert_eq!(
        cm.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["apiVersion", "data", "kind", "metadata"]
    );
    assert_eq!(reasons(&plan), ["WroteIpsum"]);
}

#[test]
fn max_actions_per_round_caps_every_type_together() {
    let mut s = spec();
    s.tantrum_mode = true;
    s.cancer_mode = true;
    s.ipsum_mode = true;
    s.max_actions_per_round = 4;
    let mut targets = Targets::default();
    for i in 0..10 {
        targets.pods.push(pod("app", &format!("p{i}")));
        targets
            .deployments
            .push(deployment("app", &format!("d{i}"), 1));
        targets
            .config_maps
            .push(config_map("app", &format!("c{i}"), false, &["k"]));
    }
    let plan = plan_for(&cluster_handler(), agent(s, None), targets);
    assert_eq!(plan.events.len(), 4);
    assert_eq!(killed(&plan).len() + applied(&plan).len(), 4);
    let report = &status(&plan)["lastRound"];
    assert_eq!(report["capped"], 26);
    let c = &report["counts"];
    assert_eq!(
        c["tantrum"].as_i64().unwrap()
            + c["cancer"].as_i64().unwrap()
            + c["ipsum"].as_i64().unwrap(),
        4
    );
}

#[test]
fn dry_run_plans_no_step_and_reports() {
    let mut s = spec();
    s.tantrum_mode = true;
    s.cancer_mode = true;
    s.ipsum_mode = true;
    s.dry_run = true;
    let targets = Targets {
        pods: vec![pod("app", "p")],
        deployments: vec![deployment("app", "d", 2)],
        config_maps: vec![config_map("app", "c", false, &["k"])],
    };
    let mut a = agent(s, None);
    a.status = Some(ChaosAgentStatus {
        round: RoundStatus {
            total: ActionCounts {
                tantrum: 5,
                cancer: 0,
                ipsum: 1,
            },
            ..Default::default()
        },
        ..Default::default()
    });
    let plan = plan_for(&cluster_handler(), a, targets);
    assert!(plan.steps.is_empty());
    assert!(plan.always_run);
    assert_eq!(
        reasons(&plan),
        ["WouldKillPod", "WouldScaleDeployment", "WouldWriteIpsum"]
    );
    assert_eq!(status(&plan)["lastRound"]["dryRun"], true);
    assert_eq!(status(&plan)["lastRound"]["counts"]["tantrum"], 1);
    assert_eq!(
        status(&plan)["total"],
        serde_json::json!({"tantrum": 5, "cancer": 0, "ipsum": 1})
    );
    assert_eq!(
        status(&plan)["lastRound"]["actions"][0],
        "WouldKillPod pod app/p"
    );
}

#[test]
fn a_fixed_seed_gives_reproducible_rounds() {
    let mut s = spec();
    s.tantrum_mode = true;
    s.ipsum_mode = true;
    s.eagerness = 50;
    let targets = Targets {
        pods: (0..40).map(|i| pod("app", &format!("p{i:02}"))).collect(),
        config_maps: vec![config_map("app", "c", false, &["k"])],
        ..Default::default()
    };
    let h = cluster_handler();
    let a = plan_for(&h, agent(s.clone(), None), targets.clone());
    let b = plan_for(&h, agent(s.clone(), None), targets.clone());
    assert_eq!(a.steps, b.steps);
    let n = killed(&a).len();
    assert!(n > 5 && n < 35, "eagerness 50 killed {n} of 40");

    let mut other_seed = s.clone();
    other_seed.seed = Some(43);
    let c = plan_for(&h, agent(other_seed, None), targets.clone());
    assert_ne!(killed(&a), killed(&c));

    // The next round draws again.
    let mut later = agent(s, None);
    later.status = Some(ChaosAgentStatus {
        round: RoundStatus {
            round: Some(1),
            ..Default::default()
        },
        ..Default::default()
    });
    let d = plan_for(&h, later, targets);
    assert_ne!(killed(&a), killed(&d));
    assert_eq!(status(&d)["round"], 2);
}

#[test]
fn idle_plans_do_nothing_until_the_next_round() {
    let plan = cluster_handler()
        .plan(
            &agent(spec(), None),
            &Observed::Idle(Duration::from_secs(3)),
        )
        .unwrap();
    assert!(plan.idle);
    assert!(plan.steps.is_empty() && plan.status.is_none() && plan.events.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(3)));
}

#[test]
fn rounds_are_due_every_pause() {
    let now: jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
    let mut a = agent(spec(), None);
    assert_eq!(next_round_in(&a, now), None, "never ran: due");
    let at = |t: &str| ChaosAgentStatus {
        round: RoundStatus {
            last_round_at: Some(t.parse().unwrap()),
            ..Default::default()
        },
        ..Default::default()
    };
    a.status = Some(at("2026-01-01T00:00:08Z"));
    assert_eq!(next_round_in(&a, now), Some(Duration::from_secs(3)));
    a.status = Some(at("2026-01-01T00:00:05Z"));
    assert_eq!(next_round_in(&a, now), None);
    a.status = Some(at("2026-01-01T00:01:00Z"));
    assert_eq!(next_round_in(&a, now), Some(Duration::from_secs(5)));
    a.spec.pause_duration = i64::MAX;
    a.status = Some(at("2026-01-01T00:00:08Z"));
    assert_eq!(next_round_in(&a, now), Some(MAX_IDLE));
}

#[test]
fn a_round_plan_runs_and_requeues_after_the_pause() {
    let plan = plan_for(&cluster_handler(), agent(spec(), None), Targets::default());
    assert!(plan.always_run && !plan.idle);
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(5)));
    assert_eq!(status(&plan)["round"], 1);
    assert_eq!(status(&plan)["lastRoundAt"], "2026-01-01T00:00:00Z");
    assert_eq!(
        status(&plan)["lastRound"]["seed"],
        42_u64.wrapping_add(0x9E37_79B9_7F4A_7C15).cast_signed()
    );
}

#[test]
fn failures_are_kept_in_last_errors_once_and_bounded() {
    use crate::kind::{Condition, ConditionStatus, ConditionType, Reason};
    let at: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let ready = |status, reason, message| {
        Condition::new(ConditionType::Ready, status, reason, message, Some(1), at)
    };
    let mut status = ChaosAgentStatus {
        round: RoundStatus {
            round: Some(3),
            ..Default::default()
        },
        ..Default::default()
    };
    status.common.set_condition(ready(
        ConditionStatus::False,
        Reason::ActionFailed,
        "forbidden",
    ));
    let errors = errors_seen(&status);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].round, 3);
    assert_eq!(errors[0].reason, Reason::ActionFailed);
    status.round.last_errors = errors;
    assert_eq!(
        errors_seen(&status).len(),
        1,
        "the same failure is kept once"
    );
    for r in 4..20 {
        status.round.round = Some(r);
        status.round.last_errors = errors_seen(&status);
    }
    assert_eq!(status.round.last_errors.len(), 5);
    assert_eq!(status.round.last_errors[4].round, 19);
    status
        .common
        .set_condition(ready(ConditionStatus::True, Reason::Applied, "ok"));
    assert_eq!(errors_seen(&status), status.round.last_errors);
}

#[test]
fn a_confined_operator_refuses_an_unlabelled_agent() {
    let confined = ChaosAgentHandler::new(None, Some("team".into()));
    let mut s = spec();
    s.tantrum_mode = true;
    let a = agent(s, None);
    let targets = Targets {
        pods: vec![pod("team", "p")],
        ..Default::default()
    };
    let err = confined
        .plan(&a.clone(), &round_input(a, targets))
        .unwrap_err();
    assert!(matches!(err, HandlerError::Invalid(_)));
}
