//! ChaosAgent (blackadder.io/v1beta1) against the real control plane.
//!
//! Safety on a shared cluster: every agent here is labelled
//! `blackadder.io/namespace=<its test namespace>` and every operator is
//! started with `--namespace <test namespace>`, so an agent can only ever act
//! inside its own test's namespace (even if someone else runs a cluster-wide
//! operator at the same time). Agents are named after their namespace, and a
//! guard removes them (finalizer included) if a test fails.

use ko_test_support as common;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kind::{ConditionStatus, ConditionType, Reason};
use kustomize_operator::kinds::chaos_agent::{
    ChaosAgent, ChaosAgentSpec, ChaosAgentStatus, SCOPE_LABEL,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// A spec with every mode off, eagerness 100, a round every second and a fixed seed.
fn spec() -> ChaosAgentSpec {
    ChaosAgentSpec {
        tantrum_mode: false,
        pod_tolerance: 0,
        cancer_mode: false,
        ipsum_mode: false,
        eagerness: 100,
        pause_duration: 1,
        excluded_namespaces: Vec::new(),
        dry_run: false,
        max_actions_per_round: 10,
        seed: Some(1234),
    }
}

/// Removes the agent (and its finalizer) when the test ends, even on failure.
struct AgentGuard {
    name: String,
}

impl Drop for AgentGuard {
    fn drop(&mut self) {
        let _ = common::kubectl(&[
            "patch",
            "chaosagent",
            &self.name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        let _ = common::kubectl(&[
            "delete",
            "chaosagent",
            &self.name,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
}

/// Creates an agent named after `ns` and confined to it.
async fn create_agent(client: &Client, ns: &str, spec: ChaosAgentSpec) -> AgentGuard {
    create_named_agent(client, ns, ns, spec).await
}

/// Creates an agent named `name`, confined to `ns`.
async fn create_named_agent(
    client: &Client,
    ns: &str,
    name: &str,
    spec: ChaosAgentSpec,
) -> AgentGuard {
    let mut agent = ChaosAgent::new(name, spec);
    agent.metadata.labels = Some([(SCOPE_LABEL.to_string(), ns.to_string())].into());
    Api::<ChaosAgent>::all(client.clone())
        .create(&PostParams::default(), &agent)
        .await
        .expect("create agent");
    AgentGuard { name: name.into() }
}

async fn status(client: &Client, name: &str) -> ChaosAgentStatus {
    Api::<ChaosAgent>::all(client.clone())
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Waits until the agent has completed round `n`, and returns its status.
async fn wait_round(client: &Client, name: &str, n: i64) -> ChaosAgentStatus {
    common::wait_until(
        TIMEOUT,
        format!("the agent {name} Ready after round {n}"),
        || async {
            let s = status(client, name).await;
            s.round.round.unwrap_or(0) >= n && s.common.is_ready()
        },
    )
    .await;
    status(client, name).await
}

/// Deletes the agent while its operator runs and waits until it is gone.
async fn delete_agent(client: &Client, name: &str) {
    let api = Api::<ChaosAgent>::all(client.clone());
    api.delete(name, &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, format!("the agent {name} gone"), || async {
        api.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

async fn start(ns: &str, extra: &[&str]) -> kustomize_operator::Operator {
    let mut args = vec!["--kinds", "chaosagent"];
    args.extend_from_slice(extra);
    common::start_operator(ns, &args).await
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": name, "team": "baldrick"},
            "annotations": {"plan": "cunning"}
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}
            }
        }
    }))
    .unwrap()
}

async fn create_deployment(client: &Client, ns: &str, name: &str, replicas: i32) {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment(name, replicas))
        .await
        .unwrap();
}

/// No Pods at all in `ns`: Deployments can grow without creating any.
async fn forbid_pods(client: &Client, ns: &str) {
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
}

async fn replicas(client: &Client, ns: &str, name: &str) -> i32 {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.replicas)
        .unwrap_or_default()
}

/// The live (not terminating) Pods of Deployment `app`.
async fn pods(client: &Client, ns: &str, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// UIDs of the live Pods of Deployment `app`.
async fn pod_uids(client: &Client, ns: &str, app: &str) -> BTreeSet<String> {
    pods(client, ns, app)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect()
}

/// UIDs of the Running Pods of Deployment `app`.
async fn running_uids(client: &Client, ns: &str, app: &str) -> BTreeSet<String> {
    pods(client, ns, app)
        .await
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.metadata.uid)
        .collect()
}

/// Waits until `n` Pods of `app` run (kwok's nodes run them); their UIDs.
async fn wait_running(client: &Client, ns: &str, app: &str, n: usize) -> BTreeSet<String> {
    common::wait_until(TIMEOUT, format!("{n} running Pods of {app}"), || async {
        running_uids(client, ns, app).await.len() == n
    })
    .await;
    running_uids(client, ns, app).await
}

async fn create_config_map(client: &Client, ns: &str, cm: serde_json::Value) {
    let cm: ConfigMap = serde_json::from_value(cm).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

async fn config_map(client: &Client, ns: &str, name: &str) -> ConfigMap {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

/// The events on agent `name` (events of cluster-scoped objects go to the
/// `default` namespace).
async fn events(client: &Client, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("ChaosAgent") && r.name.as_deref() == Some(name)
            })
        })
        .collect()
}

async fn event_reasons(client: &Client, name: &str) -> Vec<String> {
    events(client, name)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

/// Names of the objects the agent's `reason` events are related to.
async fn event_targets(client: &Client, name: &str, reason: &str) -> BTreeSet<String> {
    events(client, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.related.and_then(|r| r.name))
        .collect()
}

async fn wait_event(client: &Client, name: &str, reason: &str) {
    common::wait_until(
        TIMEOUT,
        format!("an event {reason} about {name}"),
        || async {
            event_reasons(client, name)
                .await
                .iter()
                .any(|r| r == reason)
        },
    )
    .await;
}

#[tokio::test]
async fn tantrum_kills_pods_only_when_their_number_reaches_the_tolerance() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-tantrum").await;
    create_deployment(&client, &ns.name, "web", 3).await;
    let original = wait_running(&client, &ns.name, "web", 3).await;
    let original_names: BTreeSet<String> = pods(&client, &ns.name, "web")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.tantrum_mode = true;
    s.pod_tolerance = 4;
    let _guard = create_agent(&client, &ns.name, s).await;

    // Three running Pods, tolerance four: rounds run and kill nothing.
    let st = wait_round(&client, &ns.name, 3).await;
    assert_eq!(pod_uids(&client, &ns.name, "web").await, original);
    let last = st.round.last_round.unwrap();
    assert!(last.tantrum_held, "{last:?}");
    assert_eq!(last.eligible_pods, 3);
    assert_eq!(st.round.total.tantrum, 0);

    // Tolerance three: the number is reached, every Pod goes (eagerness 100).
    Api::<ChaosAgent>::all(client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podTolerance": 3}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "every original Pod of web killed", || async {
        pod_uids(&client, &ns.name, "web")
            .await
            .is_disjoint(&original)
    })
    .await;
    // The round's status is written after its kubectl commands ran.
    common::wait_until(TIMEOUT, "3 tantrum kills in the status", || async {
        status(&client, &ns.name).await.round.total.tantrum >= 3
    })
    .await;
    // One event per kill, related to the Pod it killed.
    common::wait_until(
        TIMEOUT,
        "a KilledPod event for every original Pod",
        || async {
            event_targets(&client, &ns.name, "KilledPod")
                .await
                .is_superset(&original_names)
        },
    )
    .await;
    // The tantrum calms down; the ReplicaSet has brought the Pods back.
    Api::<ChaosAgent>::all(client.clone())
        .patch(
            &ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"podTolerance": 100}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "3 new Pods of web running", || async {
        let running = running_uids(&client, &ns.name, "web").await;
        running.len() == 3 && running.is_disjoint(&original)
    })
    .await;

    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}

#[tokio::test]
async fn cancer_doubles_replicas_and_stops_at_128() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-cancer").await;
    forbid_pods(&client, &ns.name).await;
    create_deployment(&client, &ns.name, "web", 3).await;
    create_deployment(&client, &ns.name, "idle", 0).await;
    create_deployment(&client, &ns.name, "big", 200).await;
    let before = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("web")
        .await
        .unwrap();
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.cancer_mode = true;
    let _guard = create_agent(&client, &ns.name, s).await;

    common::wait_until(TIMEOUT, "web and idle scaled to 128 replicas", || async {
        replicas(&client, &ns.name, "web").await == 128
            && replicas(&client, &ns.name, "idle").await == 128
    })
    .await;
    // Two more rounds change nothing.
    let now = status(&client, &ns.name).await.round.round.unwrap_or(0);
    let st = wait_round(&client, &ns.name, now + 2).await;
    assert_eq!(replicas(&client, &ns.name, "web").await, 128);
    assert_eq!(replicas(&client, &ns.name, "idle").await, 128);
    assert_eq!(replicas(&client, &ns.name, "big").await, 200);
    // 3 -> 6 -> 12 -> 24 -> 48 -> 96 -> 128 and 0 -> 1 -> 2 -> ... -> 128.
    assert_eq!(st.round.total.cancer, 6 + 8, "{st:?}");
    assert_eq!(st.round.last_round.unwrap().counts.cancer, 0);

    // Only the replicas changed, and the change is owned by the agent.
    let after = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("web")
        .await
        .unwrap();
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(
        after.metadata.annotations.as_ref().unwrap()["plan"],
        "cunning"
    );
    let (a, b) = (after.spec.unwrap(), before.spec.unwrap());
    assert_eq!(a.template, b.template);
    assert_eq!(a.selector, b.selector);
    let managers: Vec<_> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.iter().any(|m| m == "chaos-agent"), "{managers:?}");
    wait_event(&client, &ns.name, "ScaledDeployment").await;

    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}

#[tokio::test]
async fn ipsum_rewrites_a_config_map_but_not_an_immutable_one() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-ipsum").await;
    create_config_map(
        &client,
        &ns.name,
        json!({
            "metadata": {"name": "settings", "labels": {"keep": "me"}},
            "data": {"color": "blue", "app.properties": "a=1\nb=2\n"},
            "binaryData": {"logo": "AAEC"}
        }),
    )
    .await;
    create_config_map(
        &client,
        &ns.name,
        json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"color": "red"}}),
    )
    .await;
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.ipsum_mode = true;
    let _guard = create_agent(&client, &ns.name, s).await;

    common::wait_until(
        TIMEOUT,
        "the ConfigMap settings' color rewritten in Lorem ipsum",
        || async {
            let cm = config_map(&client, &ns.name, "settings").await;
            cm.data
                .unwrap_or_default()
                .get("color")
                .is_some_and(|v| v.starts_with("Lorem ipsum"))
        },
    )
    .await;
    let settings = config_map(&client, &ns.name, "settings").await;
    let data = settings.data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["app.properties", "color"]);
    assert!(data["app.properties"].starts_with("Lorem ipsum"));
    assert_eq!(settings.metadata.labels.unwrap()["keep"], "me");
    assert_eq!(settings.binary_data.unwrap()["logo"].0, vec![0, 1, 2]);

    let now = status(&client, &ns.name).await.round.round.unwrap_or(0);
    let st = wait_round(&client, &ns.name, now + 2).await;
    let frozen = config_map(&client, &ns.name, "frozen").await;
    assert_eq!(frozen.data.unwrap()["color"], "red");
    assert!(st.round.total.ipsum >= 1);
    wait_event(&client, &ns.name, "WroteIpsum").await;

    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}

/// Sets up a namespace with a Pod-running Deployment and a ConfigMap, and
/// an agent with every mode on.
async fn everything_agent_in(client: &Client, ns: &str, excluded: bool) -> AgentGuard {
    create_deployment(client, ns, "web", 1).await;
    wait_running(client, ns, "web", 1).await;
    create_config_map(
        client,
        ns,
        json!({"metadata": {"name": "settings"}, "data": {"color": "blue"}}),
    )
    .await;
    let mut s = spec();
    s.tantrum_mode = true;
    s.cancer_mode = true;
    s.ipsum_mode = true;
    if excluded {
        s.excluded_namespaces = vec!["elsewhere".into(), ns.to_string()];
    }
    create_agent(client, ns, s).await
}

async fn assert_untouched(client: &Client, ns: &str, pods: &BTreeSet<String>) {
    let st = wait_round(client, ns, 3).await;
    assert_eq!(&pod_uids(client, ns, "web").await, pods);
    assert_eq!(replicas(client, ns, "web").await, 1);
    let cm = config_map(client, ns, "settings").await;
    assert_eq!(cm.data.unwrap()["color"], "blue");
    let root_ca = config_map(client, ns, "kube-root-ca.crt").await;
    assert!(root_ca.data.unwrap()["ca.crt"].contains("BEGIN CERTIFICATE"));
    let last = st.round.last_round.unwrap();
    assert_eq!(last.counts, Default::default(), "{last:?}");
    assert_eq!(last.eligible_pods, 0);
    assert_eq!(st.round.total, Default::default());
}

#[tokio::test]
async fn excluded_and_protected_namespaces_are_untouched() {
    let client = common::cluster().await;
    // Excluded by the agent's spec.
    let excluded = common::TestNamespace::new(&client, "chaos-excluded").await;
    let _g1 = everything_agent_in(&client, &excluded.name, true).await;
    let pods1 = pod_uids(&client, &excluded.name, "web").await;
    let op1 = start(&excluded.name, &[]).await;
    // Protected: the operator's own namespace, whatever the agent says.
    let own = common::TestNamespace::new(&client, "chaos-own").await;
    let _g2 = everything_agent_in(&client, &own.name, false).await;
    let pods2 = pod_uids(&client, &own.name, "web").await;
    let op2 = start(&own.name, &["--operator-namespace", &own.name]).await;

    assert_untouched(&client, &excluded.name, &pods1).await;
    assert_untouched(&client, &own.name, &pods2).await;

    delete_agent(&client, &excluded.name).await;
    delete_agent(&client, &own.name).await;
    op1.stop().await;
    op2.stop().await;
}

#[tokio::test]
async fn max_actions_per_round_is_respected() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-cap").await;
    forbid_pods(&client, &ns.name).await;
    let names: Vec<String> = (0..6).map(|i| format!("d{i}")).collect();
    for name in &names {
        create_deployment(&client, &ns.name, name, 1).await;
    }
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.cancer_mode = true;
    s.max_actions_per_round = 2;
    s.pause_duration = 3600;
    let _guard = create_agent(&client, &ns.name, s).await;

    let st = wait_round(&client, &ns.name, 1).await;
    let last = st.round.last_round.clone().unwrap();
    assert_eq!(last.counts.cancer, 2, "{last:?}");
    assert_eq!(last.capped, 4);
    let mut scaled = 0;
    for name in &names {
        match replicas(&client, &ns.name, name).await {
            1 => {}
            2 => scaled += 1,
            n => panic!("{name} has {n} replicas"),
        }
    }
    assert_eq!(scaled, 2);
    // One round per pause: a reconcile before the pause is over (started
    // by a label; the positive marker: an idle plan, counted as skipped)
    // runs no round.
    let (ok, _, err) = common::kubectl(&["label", "chaosagent", &ns.name, "touched=1"]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "a skipped reconcile of the agent", || async {
        operator.metrics().skipped_count("chaosagent") >= 1
    })
    .await;
    assert_eq!(status(&client, &ns.name).await.round.round, Some(1));

    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}

#[tokio::test]
async fn dry_run_changes_nothing_and_reports() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-dry").await;
    create_deployment(&client, &ns.name, "web", 2).await;
    let pods = wait_running(&client, &ns.name, "web", 2).await;
    create_config_map(
        &client,
        &ns.name,
        json!({"metadata": {"name": "settings"}, "data": {"color": "blue"}}),
    )
    .await;
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.tantrum_mode = true;
    s.cancer_mode = true;
    s.ipsum_mode = true;
    s.dry_run = true;
    let _guard = create_agent(&client, &ns.name, s).await;

    let st = wait_round(&client, &ns.name, 2).await;
    assert_eq!(pod_uids(&client, &ns.name, "web").await, pods);
    assert_eq!(replicas(&client, &ns.name, "web").await, 2);
    let cm = config_map(&client, &ns.name, "settings").await;
    assert_eq!(cm.data.unwrap()["color"], "blue");
    let last = st.round.last_round.unwrap();
    assert!(last.dry_run);
    assert_eq!(last.counts.tantrum, 2, "{last:?}");
    assert_eq!(last.counts.cancer, 1);
    assert!(last.counts.ipsum >= 1, "settings and kube-root-ca.crt");
    assert!(
        last.actions.iter().any(|a| a
            == &format!(
                "WouldScaleDeployment deployment {}/web: 2 -> 4 replicas",
                ns.name
            )),
        "{:?}",
        last.actions
    );
    assert_eq!(st.round.total, Default::default());
    for reason in ["WouldKillPod", "WouldScaleDeployment", "WouldWriteIpsum"] {
        wait_event(&client, &ns.name, reason).await;
    }

    // The article's printer columns.
    let (ok, out, err) = common::kubectl(&["get", "chaosagent", &ns.name]);
    assert!(ok, "{err}");
    let header: Vec<_> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "TANTRUM",
            "TOLERANCE",
            "CANCER",
            "IPSUM",
            "EAGERNESS",
            "PAUSE",
            "EXCLUDED"
        ]
    );
    let (ok, out, _) = common::kubectl(&["get", "ca", &ns.name, "-o", "wide"]);
    assert!(
        ok && out.contains("DRYRUN") && out.contains("ROUND"),
        "{out}"
    );

    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}

#[tokio::test]
async fn deleting_the_agent_stops_the_rounds() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-stop").await;
    forbid_pods(&client, &ns.name).await;
    create_deployment(&client, &ns.name, "web", 1).await;
    let operator = start(&ns.name, &[]).await;
    let mut s = spec();
    s.cancer_mode = true;
    let guard = create_agent(&client, &ns.name, s).await;

    common::wait_until(TIMEOUT, "web scaled to 2 replicas or more", || async {
        replicas(&client, &ns.name, "web").await >= 2
    })
    .await;
    delete_agent(&client, &ns.name).await;
    drop(guard);
    let after = replicas(&client, &ns.name, "web").await;
    assert!(after < 128, "too late to tell: {after}");
    // The positive marker that rounds still happen: a second agent in the
    // same namespace (writing Lorem Ipsum, never scaling) completes two more.
    create_config_map(
        &client,
        &ns.name,
        json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}}),
    )
    .await;
    let mut control = spec();
    control.ipsum_mode = true;
    let name = format!("{}-control", ns.name);
    let _control = create_named_agent(&client, &ns.name, &name, control).await;
    let first = wait_round(&client, &name, 1).await.round.round.unwrap_or(0);
    wait_round(&client, &name, first + 2).await;
    assert_eq!(replicas(&client, &ns.name, "web").await, after);
    delete_agent(&client, &name).await;
    operator.stop().await;
}

#[tokio::test]
async fn api_server_rejects_out_of_range_values_and_takes_the_article_manifest() {
    let client = common::cluster().await;
    let _ = client;
    // Server-side dry runs: validated like real requests, never stored, so no
    // operator anywhere can act on them.
    let (ok, out, err) = common::kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        &common::repo()
            .join("deploy/examples/chaosagent.yaml")
            .display()
            .to_string(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("chaosagent.blackadder.io/princeedmund1"),
        "{out}"
    );

    for (field, bad) in [
        ("eagerness", "0"),
        ("eagerness", "200"),
        ("pauseDuration", "0"),
        ("podTolerance", "-1"),
        ("maxActionsPerRound", "0"),
        ("eagerness", "\"eager\""),
    ] {
        let mut fields = json!({"eagerness": 50, "pauseDuration": 30});
        fields[field] = serde_json::from_str(bad).unwrap();
        let manifest = json!({
            "apiVersion": "blackadder.io/v1beta1",
            "kind": "ChaosAgent",
            "metadata": {"name": "baldrick-rejected"},
            "spec": fields,
        })
        .to_string();
        let (ok, _, err) =
            common::kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], &manifest);
        assert!(!ok, "{field}: {bad} was accepted");
        assert!(err.contains(&format!("spec.{field}")), "{field}: {err}");
    }
}

/// The agent's Ready condition: (status, reason, message).
async fn ready_condition(client: &Client, name: &str) -> Option<(ConditionStatus, Reason, String)> {
    status(client, name)
        .await
        .common
        .condition(ConditionType::Ready)
        .map(|c| (c.status, c.reason, c.message.clone()))
}

/// Waits until the agent is `Ready=False`, reason `Forbidden`, with a
/// message containing `needle`; returns the message.
async fn wait_forbidden(client: &Client, name: &str, needle: &str) -> String {
    common::wait_for(
        TIMEOUT,
        format!("the agent {name} Forbidden, saying {needle:?}"),
        || async {
            match ready_condition(client, name).await {
                Some((ConditionStatus::False, Reason::Forbidden, message))
                    if message.contains(needle) =>
                {
                    Ok(message)
                }
                seen => Err(seen),
            }
        },
    )
    .await
}

/// In an install writing as tenants (`--default-service-account`), an
/// agent, cluster-scoped, has no namespace account: without
/// `--cluster-service-account` it is refused, naming the flag, and kills
/// nothing; with it, its kills run as that account (kubectl --as): refused
/// while the account may not delete Pods, carried out once it may.
#[tokio::test]
async fn writing_as_tenants_an_agent_acts_as_the_cluster_account_or_not_at_all() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "chaos-account").await;
    create_deployment(&client, &ns.name, "web", 2).await;
    let original = wait_running(&client, &ns.name, "web", 2).await;
    let (ok, _, err) = common::kubectl(&["-n", &ns.name, "create", "serviceaccount", "chaos"]);
    assert!(ok, "{err}");
    let tenant_writes = ["--default-service-account", "kustomize-writer"];
    let operator = start(&ns.name, &tenant_writes).await;
    let mut s = spec();
    s.tantrum_mode = true;
    let _guard = create_agent(&client, &ns.name, s).await;
    let message = wait_forbidden(&client, &ns.name, "--cluster-service-account").await;
    assert!(
        message.contains(&format!("ChaosAgent {} is cluster-scoped", ns.name)),
        "{message}"
    );
    assert_eq!(
        pod_uids(&client, &ns.name, "web").await,
        original,
        "no Pod killed"
    );
    operator.stop().await;

    let account = format!("{}/chaos", ns.name);
    let mut args = tenant_writes.to_vec();
    args.extend(["--cluster-service-account", &account]);
    let operator = start(&ns.name, &args).await;
    wait_forbidden(
        &client,
        &ns.name,
        &format!("acting as ServiceAccount {account}"),
    )
    .await;
    assert_eq!(
        pod_uids(&client, &ns.name, "web").await,
        original,
        "no Pod killed"
    );

    // The account may delete Pods in the namespace: the kills happen.
    let user = format!("system:serviceaccount:{}:chaos", ns.name);
    for (what, args) in [
        (
            "role",
            vec![
                "create",
                "role",
                "chaos",
                "--verb=delete",
                "--resource=pods",
            ],
        ),
        (
            "rolebinding",
            vec!["create", "rolebinding", "chaos", "--role=chaos", "--user"],
        ),
    ] {
        let mut argv = vec!["-n", ns.name.as_str()];
        argv.extend(args);
        if what == "rolebinding" {
            argv.push(&user);
        }
        let (ok, _, err) = common::kubectl(&argv);
        assert!(ok, "{what}: {err}");
    }
    common::wait_until(TIMEOUT, "every original Pod of web killed", || async {
        pod_uids(&client, &ns.name, "web")
            .await
            .is_disjoint(&original)
    })
    .await;
    delete_agent(&client, &ns.name).await;
    operator.stop().await;
}
