//! The operator as a real Pod, on the control plane's real node
//! (`KO_REAL_NODE=1 hack/control-plane/control-plane up`: containerd, a
//! kubelet and kube-proxy on this machine; docs/control-plane.md, "A real
//! node"):
//!
//! - `kubectl apply -k deploy`, unchanged, with the image `hack/image` built
//!   (loaded into the node without a registry): the rollout completes
//!   because the readiness probe passes; one replica leads; a Sample becomes
//!   Ready with its status and events written by the Pod; the leader's Pod
//!   deleted, the other carries on where it left off;
//! - `helm install` of the chart (one replica; three sharing the work
//!   by themselves), and the locked-down install
//!   (`overlays/locked-down`), the same way;
//! - `overlays/conversion-webhook`: a kind of two versions converted by the
//!   Pods' webhook through its Service, lists at the older version answered
//!   all through a leader change;
//! - bad input: a missing image, a missing RBAC grant and a wrong API
//!   address each show in the Pod's state, its events or its log, in words;
//! - `node-down` leaves the machine as it was before `node-up`: processes,
//!   mounts, network links and addresses, iptables rules, sysctls, cgroups,
//!   and the Node object.
//!
//! The node is tainted: only Pods of namespaces annotated for it run there
//! (the plane's PodNodeSelector and PodTolerationRestriction admission), so
//! the tests route `kustomize-operator-system` (and their Helm namespaces)
//! to it, and undo that when done: the installs of the other test files
//! stay on kwok's fake nodes. One test at a time uses the node.
//!
//! Without a real node (or without the image) these tests skip with a
//! message saying why, and fail under `CI=true`.

use ko_test_support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::deploy::{NAMESPACE, apply_install, apply_install_from};
use common::greeting::{GreetingKind, ReadsAt, config_map_field, wait_ready};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use common::sample::Sample;

/// The image `hack/image` builds and `deploy/` runs.
const IMAGE: &str = "kustomize-operator:dev";
/// A rollout on the real node: Pods start in seconds; the readiness probe
/// runs every 10 s.
const ROLLOUT: Duration = Duration::from_secs(180);
const TIMEOUT: Duration = Duration::from_secs(90);
/// The label the plane gives its real node.
const REAL_NODE_LABEL: &str = "kustomize-operator.io/real-node=true";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=kustomize-operator";

/// One test at a time on the node: they share the install's namespace, its
/// Deployment and the cluster-wide roles.
static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes to the real stderr (not captured): skip reasons and timings.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn control_plane() -> PathBuf {
    common::repo().join("hack/control-plane/control-plane")
}

/// `hack/control-plane/control-plane <args>`; panics unless it succeeds;
/// returns stdout and stderr.
fn control_plane_ok(args: &[&str]) -> String {
    let out = Command::new(control_plane())
        .args(args)
        .output()
        .expect("run hack/control-plane/control-plane");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "control-plane {args:?} failed:\n{text}"
    );
    text
}

/// `kubectl <args>`; panics unless it succeeds; returns stdout.
fn kubectl_ok(args: &[&str]) -> String {
    let (ok, out, err) = common::kubectl(args);
    assert!(ok, "kubectl {args:?} failed: {err}");
    out
}

/// Skips the test, saying why, or fails it under CI ([`common::skip`]).
fn skip(why: &str) {
    common::skip(why);
}

/// The plane's real node, Ready. Else None, saying why (not a failure
/// outside CI), or a failure under `CI=true`.
fn real_node() -> Option<String> {
    let why = || -> Result<String, String> {
        let (ok, out, err) = common::kubectl(&[
            "get",
            "nodes",
            "-l",
            REAL_NODE_LABEL,
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ]);
        if !ok {
            return Err(format!("kubectl get nodes: {err}"));
        }
        let Some((name, ready)) = out.lines().next().and_then(|l| l.split_once(' ')) else {
            return Err("the cluster has no real node: start the plane with \
                 `KO_REAL_NODE=1 hack/control-plane/control-plane up` (root; docs/control-plane.md)"
                .into());
        };
        if ready != "True" {
            return Err(format!("the real node {name} is not Ready ({ready})"));
        }
        Ok(name.to_string())
    };
    why().map_err(|why| skip(&why)).ok()
}

/// True when `hack/podman` has the image.
fn image_exists() -> bool {
    Command::new(common::repo().join("hack/podman"))
        .args(["image", "exists", IMAGE])
        .status()
        .is_ok_and(|s| s.success())
}

/// Copies the image into the node's containerd (`control-plane
/// load-image`): the Deployment's `imagePullPolicy: IfNotPresent` then runs
/// it with no registry. Cheap to repeat (a node-up starts with no images).
/// False (the test skips, saying why; fails under `CI=true`) without it.
fn load_image() -> bool {
    if !image_exists() {
        skip(&format!("no image {IMAGE}: build it with `hack/image`"));
        return false;
    }
    control_plane_ok(&["load-image", IMAGE]);
    true
}

/// The annotations that send a namespace's Pods to the real node: a node
/// selector and a toleration of its taint (the plane's PodNodeSelector and
/// PodTolerationRestriction admission plugins).
const ROUTE: [&str; 2] = [
    "scheduler.alpha.kubernetes.io/node-selector=type=real",
    r#"scheduler.alpha.kubernetes.io/defaultTolerations=[{"key":"type","operator":"Equal","value":"real","effect":"NoSchedule"}]"#,
];

fn route_to_real_node(namespace: &str) {
    let mut args = vec!["annotate", "namespace", namespace, "--overwrite"];
    args.extend(ROUTE);
    kubectl_ok(&args);
}

/// The operator's Pods in `namespace`.
async fn operator_pods(client: &Client, namespace: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(OPERATOR_PODS))
        .await
        .expect("list the operator's Pods")
        .items
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Deletes the operator's Deployments in `namespace` and waits until their
/// Pods are gone (on the real node: stopped by the kubelet).
async fn remove_operator(client: &Client, namespace: &str) {
    let _ = common::kubectl(&[
        "delete",
        "deployment",
        "-n",
        namespace,
        "-l",
        OPERATOR_PODS,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ]);
    common::wait_until(
        Duration::from_secs(120),
        format!("the operator's Pods in {namespace} gone"),
        || async { operator_pods(client, namespace).await.is_empty() },
    )
    .await;
}

/// The install's namespace routed to the real node, with no operator Pod
/// in it yet (earlier test files leave one on kwok). When dropped, the
/// operator's Deployment is deleted, the namespace's route removed and
/// `restore` applied: the next test file's install lands on kwok again.
struct OnRealNode {
    namespace: String,
    restore: Vec<Value>,
}

impl OnRealNode {
    async fn new(client: &Client, namespace: &str) -> Self {
        let _ = common::kubectl(&["create", "namespace", namespace]);
        route_to_real_node(namespace);
        remove_operator(client, namespace).await;
        Self {
            namespace: namespace.to_string(),
            restore: Vec::new(),
        }
    }
}

impl Drop for OnRealNode {
    fn drop(&mut self) {
        let _ = common::kubectl(&[
            "delete",
            "deployment",
            "-n",
            &self.namespace,
            "-l",
            OPERATOR_PODS,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ]);
        let _ = common::kubectl(&[
            "wait",
            "--for=delete",
            "pods",
            "-n",
            &self.namespace,
            "-l",
            OPERATOR_PODS,
            "--timeout=120s",
        ]);
        let keys: Vec<String> = ROUTE
            .iter()
            .map(|a| format!("{}-", a.split_once('=').map_or(*a, |(k, _)| k)))
            .collect();
        let mut args = vec!["annotate", "namespace", &self.namespace];
        args.extend(keys.iter().map(String::as_str));
        let _ = common::kubectl(&args);
        if !self.restore.is_empty() {
            let docs: Vec<String> = self
                .restore
                .iter()
                .map(|d| serde_json::to_string(d).unwrap())
                .collect();
            let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &docs.join("\n---\n"));
            if !ok {
                eprintln!("restoring the install's roles failed: {err}");
            }
        }
    }
}

/// `kubectl rollout status` of the operator's Deployment `name`.
fn rollout(namespace: &str, name: &str) {
    let timeout = format!("--timeout={}s", ROLLOUT.as_secs());
    let (ok, out, err) = common::kubectl(&[
        "rollout",
        "status",
        "deployment",
        name,
        "-n",
        namespace,
        &timeout,
    ]);
    if !ok {
        let (_, pods, _) = common::kubectl(&["get", "pods", "-n", namespace, "-o", "wide"]);
        let (_, events, _) = common::kubectl(&["events", "-n", namespace]);
        panic!("rollout of {namespace}/{name} failed: {out}{err}\n{pods}\n{events}");
    }
    assert!(out.contains("successfully rolled out"), "{out}");
}

/// What the Pod `pod` answers on its metrics port at `path`, through the API
/// server's proxy (which dials the Pod's address on the node's network).
fn pod_get(namespace: &str, pod: &str, path: &str) -> String {
    kubectl_ok(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{namespace}/pods/{pod}:8080/proxy{path}"),
    ])
}

/// Checks the rolled-out operator: every Pod on the real node, Ready (the
/// kubelet ran the readiness probe), one leading and the others standing
/// by; returns the leader's name.
async fn one_leader(client: &Client, namespace: &str, node: &str, replicas: usize) -> String {
    common::wait_for(TIMEOUT, "one leader among the operator's Pods", || async {
        let pods: Vec<Pod> = operator_pods(client, namespace)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let mut answers = BTreeMap::new();
        for pod in &pods {
            if node_of(pod) != node {
                return Err(format!(
                    "{} is on {:?}, not {node}",
                    name_of(pod),
                    node_of(pod)
                ));
            }
            let (ok, out, err) = common::kubectl(&[
                "get",
                "--raw",
                &format!(
                    "/api/v1/namespaces/{namespace}/pods/{}:8080/proxy/readyz",
                    name_of(pod)
                ),
            ]);
            answers.insert(name_of(pod), if ok { out } else { err });
        }
        let leaders: Vec<&String> = answers
            .iter()
            .filter(|(_, a)| a.trim() == "ready: leading")
            .map(|(n, _)| n)
            .collect();
        let standing_by = answers
            .values()
            .filter(|a| a.trim() == "ready: standing by for the leader lease")
            .count();
        if pods.len() == replicas && leaders.len() == 1 && standing_by == replicas - 1 {
            Ok(leaders[0].clone())
        } else {
            Err(format!("{answers:#?}"))
        }
    })
    .await
}

/// Deletes the leader's Pod `leader` of the install on `node`, waits for
/// another Pod to take the Lease and for the rollout to replace the Pod;
/// returns the new leader.
async fn leader_deleted(client: &Client, node: &str, leader: &str) -> String {
    kubectl_ok(&["delete", "pod", leader, "-n", NAMESPACE, "--wait=true"]);
    let new_leader = common::wait_for(TIMEOUT, "another Pod holding the Lease", || async {
        match lease_holder(client, NAMESPACE).await {
            Some(h) if h != leader => Ok(h),
            other => Err(other),
        }
    })
    .await;
    rollout(NAMESPACE, "kustomize-operator");
    assert_eq!(one_leader(client, NAMESPACE, node, 2).await, new_leader);
    new_leader
}

/// The holder of the operator's Lease in `namespace`.
async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    leases
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find_map(|l| l.spec.and_then(|s| s.holder_identity))
}

/// The `reportingInstance` of the events about `name` in `namespace`.
async fn event_reporters(client: &Client, namespace: &str, name: &str) -> BTreeSet<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|e| e.reporting_instance)
        .collect()
}

/// The kubectl command of the Sample's last run, and whether it is the
/// image's: the image's work directory (`WORK_DIR=/tmp/kustomize-operator`,
/// its `/tmp` an emptyDir) holds kubectl's cache.
fn written_by_the_image(sample: &Sample) -> bool {
    sample
        .status
        .as_ref()
        .and_then(|s| s.last_command.as_ref())
        .is_some_and(|c| {
            c.command
                .starts_with("kubectl --cache-dir=/tmp/kustomize-operator/kubectl-cache ")
                && c.exit_code == Some(0)
        })
}

#[tokio::test]
async fn apply_k_deploy_runs_on_the_real_node_and_its_pod_reconciles() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let started = std::time::Instant::now();
    let _route = OnRealNode::new(&client, NAMESPACE).await;
    apply_install().await;
    rollout(NAMESPACE, "kustomize-operator");
    let leader = one_leader(&client, NAMESPACE, &node, 2).await;
    say(&format!(
        "[real-node] deploy/ rolled out on {node} in {:.1}s; leader {leader}",
        started.elapsed().as_secs_f64()
    ));
    assert_eq!(
        lease_holder(&client, NAMESPACE).await.as_deref(),
        Some(leader.as_str())
    );
    let metrics = pod_get(NAMESPACE, &leader, "/metrics");
    assert!(metrics.contains("kustomize_operator"), "{metrics}");

    // A Sample anywhere (its nginx Pods land on kwok's nodes: no image for
    // them here) is reconciled by the Pod.
    let ns = common::TestNamespace::new(&client, "realnode").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let sample = common::deploy::sample_created_and_ready(&client, &ns.name).await;
    assert!(written_by_the_image(&sample), "{:#?}", sample.status);
    let reporters = event_reporters(&client, &ns.name, "web").await;
    assert_eq!(reporters, BTreeSet::from([leader.clone()]));

    // The leader's Pod deleted: the standby takes the Lease, and the Sample
    // it finds unchanged stays as it was (no kubectl run) until it changes.
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let before = samples.get("web").await.unwrap().status.unwrap_or_default();
    let new_leader = leader_deleted(&client, &node, &leader).await;
    let after = samples.get("web").await.unwrap().status.unwrap_or_default();
    assert_eq!(
        before.last_command.as_ref().map(|c| c.started_at),
        after.last_command.as_ref().map(|c| c.started_at),
        "the new leader ran kubectl for an unchanged Sample"
    );
    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 3}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web Ready at generation 2", || async {
        samples
            .get("web")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.is_ready() && s.observed_generation == Some(2))
    })
    .await;
    let sample = samples.get("web").await.unwrap();
    assert!(written_by_the_image(&sample), "{:#?}", sample.status);
    assert!(
        event_reporters(&client, &ns.name, "web")
            .await
            .contains(&new_leader)
    );
    common::deploy::sample_scaled_and_deleted(&client, &ns.name).await;
    say(&format!(
        "[real-node] deploy/ scenario in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
}

/// `overlays/conversion-webhook` on the real node: the API server reaches
/// the Pods' webhook through its Service (a ClusterIP that kube-proxy
/// routes), with the certificate the first Pod made and put in the CRD. A
/// kind of two versions reads and writes at either, before and after the
/// leader's Pod is deleted: every replica answers, leader or not.
#[tokio::test]
async fn the_pods_answer_conversions_through_their_service_across_a_leader_change() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let _route = OnRealNode::new(&client, NAMESPACE).await;
    let _webhook = WebhookInstall;
    apply_install_from("overlays/conversion-webhook").await;
    rollout(NAMESPACE, "kustomize-operator");
    let leader = one_leader(&client, NAMESPACE, &node, 2).await;

    let ns = common::TestNamespace::new(&client, "realnode-versions").await;
    let kind = GreetingKind::new(&ns);
    let _definition = DefinitionOnDrop {
        definition: kind.name.clone(),
        crd: kind.crd(),
        namespace: ns.name.clone(),
    };
    kind.to_v2();
    kind.apply();
    kind.grant_rights();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.wait_condition("RightsGranted", "True", "Granted")
        .await;
    let crd: Value = serde_json::from_str(&kubectl_ok(&["get", "crd", &kind.crd(), "-o", "json"]))
        .expect("the CRD");
    let service = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
    assert_eq!(service["name"], "kustomize-operator-webhook", "{crd}");
    assert_eq!(service["namespace"], NAMESPACE);

    // The first write at v1 is converted once the Service routes to a
    // Pod: kube-proxy refuses the connection until then.
    common::wait_for(
        TIMEOUT,
        "a write at v1 converted through the Service",
        || async { kind.try_write_at(&ns.name, "v1", "one", json!({"message": "before"})) },
    )
    .await;
    let one = kind.greeting_at(&ns.name, "v2", "one");
    assert_eq!(one["spec"]["text"], "before", "{one}");
    wait_ready(&kind, &ns.name, "one").await;
    assert_eq!(config_map_field(&ns.name, "one", "version"), "v2");

    // The leader's Pod deleted, while a client lists at v1 (each list a
    // review) all along: the Pod goes on answering while the Service drops
    // it, the other answers meanwhile and takes the lead.
    let reader = ReadsAt::start(format!("greetings.v1.{}", kind.group), ns.name.clone());
    leader_deleted(&client, &node, &leader).await;
    let (reads, failed) = reader.stop().await;
    say(&format!(
        "[real-node] {reads} lists at v1 through the leader change, {} failed",
        failed.len()
    ));
    assert!(
        reads > 0 && failed.is_empty(),
        "lists at v1 failed: {failed:#?}"
    );
    let one = kind.greeting_at(&ns.name, "v1", "one");
    assert_eq!(one["spec"]["message"], "before", "{one}");
    kind.write_at(&ns.name, "v1", "two", json!({"message": "after"}));
    assert_eq!(
        kind.greeting_at(&ns.name, "v2", "two")["spec"]["text"],
        "after"
    );
    wait_ready(&kind, &ns.name, "two").await;
    assert_eq!(config_map_field(&ns.name, "two", "message"), "after");
}

/// When dropped, deletes the Greetings of a namespace, then their
/// KindDefinition, and waits for its CRD to go, while the operator still
/// runs: a CRD whose webhook is gone keeps every namespace that holds its
/// resources from being deleted.
struct DefinitionOnDrop {
    definition: String,
    crd: String,
    namespace: String,
}

impl Drop for DefinitionOnDrop {
    fn drop(&mut self) {
        let timeout = "--timeout=120s";
        let _ = common::kubectl(&["delete", &self.crd, "--all", "-n", &self.namespace, timeout]);
        let definition = format!("kinddefinition/{}", self.definition);
        let _ = common::kubectl(&["delete", &definition, "--ignore-not-found", timeout]);
        let crd = format!("crd/{}", self.crd);
        let _ = common::kubectl(&["wait", "--for=delete", &crd, timeout]);
        let role = format!("clusterrole/kustomize-operator-{}", self.definition);
        let _ = common::kubectl(&["delete", &role, "--ignore-not-found"]);
    }
}

/// Removes what `overlays/conversion-webhook` adds to `deploy/` (its
/// Deployment goes with [`OnRealNode`]).
struct WebhookInstall;

impl Drop for WebhookInstall {
    fn drop(&mut self) {
        for what in [
            "service/kustomize-operator-webhook",
            "rolebinding/kustomize-operator-webhook",
            "role/kustomize-operator-webhook",
            "secret/kustomize-operator-webhook",
        ] {
            let _ = common::kubectl(&["delete", what, "-n", NAMESPACE, "--ignore-not-found"]);
        }
    }
}

#[tokio::test]
async fn helm_install_runs_the_chart_on_the_real_node() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let Some(helm) = common::helm_path() else {
        return;
    };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let release_ns = common::TestNamespace::new(&client, "helmnode").await;
    let _route = OnRealNode::new(&client, &release_ns.name).await;
    let watched = common::TestNamespace::new(&client, "helmwatched").await;
    let _cleanup = common::StripFinalizersOnDrop(watched.name.clone());
    let release = "ko-node";
    let _uninstall = Uninstall {
        helm: helm.clone(),
        release: release.into(),
        namespace: release_ns.name.clone(),
    };
    // One replica without leader election, the Sample kind, one watched
    // namespace: nothing else in the cluster is touched.
    let out = Command::new(&helm)
        .args(["install", release])
        .arg(common::repo().join("charts/kustomize-operator"))
        .args(["--namespace", &release_ns.name])
        .args(["--set", "replicas=1,leaderElection.enabled=false"])
        .args(["--set", &format!("watchNamespace={}", watched.name)])
        .args(["--set-json", r#"kinds=["sample"]"#])
        .args(["--wait", "--timeout", "180s"])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm install --wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    rollout(&release_ns.name, "ko-node-kustomize-operator");
    let leader = one_leader(&client, &release_ns.name, &node, 1).await;
    let sample = common::deploy::sample_created_and_ready(&client, &watched.name).await;
    assert!(written_by_the_image(&sample), "{:#?}", sample.status);
    assert_eq!(
        event_reporters(&client, &watched.name, "web").await,
        BTreeSet::from([leader])
    );
    common::deploy::sample_scaled_and_deleted(&client, &watched.name).await;
}

#[tokio::test]
async fn the_charts_three_replicas_share_the_work_as_pods_on_the_real_node() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let Some(helm) = common::helm_path() else {
        return;
    };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let release_ns = common::TestNamespace::new(&client, "shardnode").await;
    let _route = OnRealNode::new(&client, &release_ns.name).await;
    let watched = common::TestNamespace::new(&client, "shardwatched").await;
    let _cleanup = common::StripFinalizersOnDrop(watched.name.clone());
    let release = "ko-shards";
    let _uninstall = Uninstall {
        helm: helm.clone(),
        release: release.into(),
        namespace: release_ns.name.clone(),
    };
    let out = Command::new(&helm)
        .args(["install", release])
        .arg(common::repo().join("charts/kustomize-operator"))
        .args(["--namespace", &release_ns.name])
        .args([
            "--set",
            "replicas=3,leaderElection.enabled=false,autoSharding.enabled=true",
        ])
        .args(["--set", &format!("watchNamespace={}", watched.name)])
        .args(["--set-json", r#"kinds=["sample"]"#])
        .args(["--wait", "--timeout", "180s"])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm install --wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    rollout(&release_ns.name, "ko-shards-kustomize-operator");
    let pods: BTreeSet<String> = operator_pods(&client, &release_ns.name)
        .await
        .iter()
        .inspect(|p| assert_eq!(node_of(p), node, "{} off the real node", name_of(p)))
        .map(name_of)
        .collect();
    assert_eq!(pods.len(), 3, "{pods:?}");
    // The ring: the three Pods hold every slot between them.
    let tables: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &release_ns.name);
    let ring = common::wait_for(TIMEOUT, "the three Pods holding every slot", || async {
        let table = tables
            .get_opt("kustomize-operator-shards")
            .await
            .unwrap()
            .and_then(|cm| cm.data)
            .map(|data| kustomize_operator::sharding::table::Table::from_data(&data))
            .unwrap_or_default();
        let holders: BTreeSet<String> = table.owners.keys().cloned().collect();
        if holders == pods && table.free().is_empty() {
            Ok(table)
        } else {
            Err(table)
        }
    })
    .await;
    // Each Sample is reconciled by the Pod whose slots hold it, alone.
    let samples: Api<Sample> = Api::namespaced(client.clone(), &watched.name);
    for i in 0..12 {
        let sample = Sample::new(&format!("web-{i}"), common::sample::SampleSpec { count: 0 });
        samples
            .create(&kube::api::PostParams::default(), &sample)
            .await
            .unwrap();
    }
    common::wait_until(TIMEOUT, "12 Samples Ready", || async {
        let list = samples.list(&ListParams::default()).await.unwrap();
        list.items.len() == 12
            && list
                .items
                .iter()
                .all(|s| s.status.as_ref().is_some_and(|s| s.is_ready()))
    })
    .await;
    let mut owners = BTreeSet::new();
    for sample in samples.list(&ListParams::default()).await.unwrap() {
        let name = sample.metadata.name.clone().unwrap();
        let uid = sample.metadata.uid.clone().unwrap();
        let owner = ring
            .owner_of(kustomize_operator::sharding::slot_of(&uid))
            .unwrap()
            .to_string();
        assert_eq!(
            event_reporters(&client, &watched.name, &name).await,
            BTreeSet::from([owner.clone()]),
            "{name}"
        );
        owners.insert(owner);
    }
    assert!(owners.len() >= 2, "12 Samples all in one share: {owners:?}");
}

/// `helm uninstall` when dropped.
struct Uninstall {
    helm: PathBuf,
    release: String,
    namespace: String,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = Command::new(&self.helm)
            .args(["uninstall", &self.release, "--namespace", &self.namespace])
            .args(["--ignore-not-found", "--wait", "--timeout", "120s"])
            .output();
    }
}

/// The ClusterRoles and ClusterRoleBindings `deploy/` installs: what a test
/// that changes them puts back.
fn deploy_roles() -> Vec<Value> {
    common::kustomize_documents("deploy")
        .into_iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
        .collect()
}

/// `kubectl apply -f -` of `docs`.
fn apply_documents(docs: &[Value]) {
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).unwrap())
        .collect();
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &text.join("\n---\n"));
    assert!(ok, "kubectl apply: {err}");
}

#[tokio::test]
async fn the_locked_down_install_runs_on_the_real_node() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let mut route = OnRealNode::new(&client, NAMESPACE).await;
    route.restore = deploy_roles();
    let overlay = common::repo().join("overlays/locked-down");
    kubectl_ok(&["apply", "-k", &overlay.display().to_string()]);
    let _impersonation = common::DeleteOnDrop(vec![
        "clusterrolebinding/kustomize-operator-impersonate".into(),
        "clusterrole/kustomize-operator-impersonate".into(),
    ]);
    rollout(NAMESPACE, "kustomize-operator");
    let leader = one_leader(&client, NAMESPACE, &node, 2).await;

    // The operator's own account may not write Deployments; a tenant's
    // `kustomize-writer` may, in its namespace, and the Sample is applied as it.
    let as_operator = "--as=system:serviceaccount:kustomize-operator-system:kustomize-operator";
    let ns = common::TestNamespace::new(&client, "lockednode").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let (_, can, _) = common::kubectl(&[
        "auth",
        "can-i",
        "create",
        "deployments",
        "-n",
        &ns.name,
        as_operator,
    ]);
    assert_eq!(can.trim(), "no");
    kubectl_ok(&[
        "create",
        "serviceaccount",
        "kustomize-writer",
        "-n",
        &ns.name,
    ]);
    kubectl_ok(&[
        "create",
        "rolebinding",
        "kustomize-writer",
        "--clusterrole=edit",
        &format!("--serviceaccount={}:kustomize-writer", ns.name),
        "-n",
        &ns.name,
    ]);
    let sample = common::deploy::sample_created_and_ready(&client, &ns.name).await;
    assert!(written_by_the_image(&sample), "{:#?}", sample.status);
    assert_eq!(
        event_reporters(&client, &ns.name, "web").await,
        BTreeSet::from([leader])
    );
    common::deploy::sample_scaled_and_deleted(&client, &ns.name).await;
}

/// `deploy/` as built, with `change` made to its Deployment, applied.
fn install_changed(change: impl FnOnce(&mut Value)) {
    let mut docs = common::kustomize_documents("deploy");
    let deployment = docs
        .iter_mut()
        .find(|d| d["kind"] == "Deployment")
        .expect("deploy/ has a Deployment");
    change(deployment);
    apply_documents(&docs);
}

/// The first of the operator's Pods in `namespace` whose `check` gives a
/// value; waits for it.
async fn first_pod<T>(
    client: &Client,
    namespace: &str,
    what: &str,
    check: impl Fn(&Pod) -> Option<T>,
) -> T {
    common::wait_for(TIMEOUT, what, || async {
        let pods = operator_pods(client, namespace).await;
        pods.iter().find_map(&check).ok_or_else(|| {
            pods.iter()
                .map(|p| (name_of(p), p.status.clone()))
                .collect::<Vec<_>>()
        })
    })
    .await
}

/// The waiting reason and message of the Pod's container.
fn waiting(pod: &Pod) -> Option<(String, String)> {
    let state = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?;
    let waiting = state.waiting.as_ref()?;
    Some((
        waiting.reason.clone().unwrap_or_default(),
        waiting.message.clone().unwrap_or_default(),
    ))
}

/// The notes of the events about the Pod `pod`, with their reasons.
fn pod_events(namespace: &str, pod: &str) -> String {
    kubectl_ok(&["events", "-n", namespace, "--for", &format!("pod/{pod}")])
}

#[tokio::test]
async fn a_missing_image_is_named_in_the_pods_state_and_events() {
    let _area = common::area::enter().await;
    let _node = NODE.lock().await;
    let Some(_node) = real_node() else { return };
    let client = common::cluster().await;
    let _route = OnRealNode::new(&client, NAMESPACE).await;
    install_changed(|d| {
        d["spec"]["template"]["spec"]["containers"][0]["image"] =
            json!("kustomize-operator:missing");
    });
    let (pod, reason, message) = first_pod(
        &client,
        NAMESPACE,
        "an operator Pod waiting for its image",
        |p| {
            waiting(p)
                .filter(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
                .map(|(r, m)| (name_of(p), r, m))
        },
    )
    .await;
    assert!(
        message.contains("kustomize-operator:missing"),
        "{reason}: {message}"
    );
    let events = common::wait_for(TIMEOUT, "a Failed event naming the image", || async {
        let events = pod_events(NAMESPACE, &pod);
        if events.contains(r#"Failed to pull image "kustomize-operator:missing""#) {
            Ok(events)
        } else {
            Err(events)
        }
    })
    .await;
    say(&format!(
        "[real-node] missing image: {reason}: {message}\n{events}"
    ));
}

/// The log of the Pod's container, the current run's or the last one's.
fn pod_log(namespace: &str, pod: &str) -> String {
    let (_, current, _) = common::kubectl(&["logs", pod, "-n", namespace]);
    let (_, previous, _) = common::kubectl(&["logs", pod, "-n", namespace, "--previous"]);
    format!("{previous}{current}")
}

/// The state of a Pod's container that has crashed: `Error` (it exited
/// with an error) or `CrashLoopBackOff` (the kubelet waits to restart it).
fn crash_state(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let state = status.state.as_ref()?;
    if let Some(w) = &state.waiting
        && w.reason.as_deref() == Some("CrashLoopBackOff")
    {
        return Some("CrashLoopBackOff".into());
    }
    let terminated = state.terminated.as_ref()?;
    (terminated.exit_code != 0).then(|| terminated.reason.clone().unwrap_or_default())
}

/// Waits until an operator Pod has crashed and its log says `words`;
/// returns the Pod's name, its container's state and the log.
async fn crash_saying(client: &Client, words: &str) -> (String, String, String) {
    common::wait_for(
        TIMEOUT,
        format!("an operator Pod crashed, its log saying {words:?}"),
        || async {
            for pod in operator_pods(client, NAMESPACE).await {
                let Some(state) = crash_state(&pod) else {
                    continue;
                };
                let log = pod_log(NAMESPACE, &name_of(&pod));
                if log.contains(words) {
                    return Ok((name_of(&pod), state, log));
                }
            }
            Err(operator_pods(client, NAMESPACE)
                .await
                .iter()
                .map(|p| (name_of(p), p.status.clone()))
                .collect::<Vec<_>>())
        },
    )
    .await
}

/// The install's binding of the Sample's ClusterRole.
const SAMPLE_BINDING: &str = "kustomize-operator-sample";

#[tokio::test]
async fn a_missing_rbac_grant_is_named_in_the_pods_log() {
    let _area = common::area::enter().await;
    let _node = NODE.lock().await;
    let Some(_node) = real_node() else { return };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let mut route = OnRealNode::new(&client, NAMESPACE).await;
    route.restore = deploy_roles();
    // The install without the binding that grants the Sample's rules (its
    // own, since the install's declared kinds are bound, not aggregated):
    // the operator may not even list Samples.
    let _ = common::kubectl(&[
        "delete",
        "clusterrolebinding",
        SAMPLE_BINDING,
        "--ignore-not-found",
    ]);
    let docs: Vec<Value> = common::kustomize_documents("deploy")
        .into_iter()
        .filter(|d| !(d["kind"] == "ClusterRoleBinding" && d["metadata"]["name"] == SAMPLE_BINDING))
        .collect();
    apply_documents(&docs);
    let (pod, state, log) = crash_saying(
        &client,
        "the operator's account (system:serviceaccount:kustomize-operator-system:kustomize-operator) \
         may not list samples.nuvolaris.org",
    )
    .await;
    assert!(state == "Error" || state == "CrashLoopBackOff", "{state}");
    say(&format!("[real-node] missing grant: {pod} {state}\n{log}"));
}

#[tokio::test]
async fn a_wrong_api_address_is_named_in_the_pods_log() {
    let _area = common::area::enter().await;
    let _node = NODE.lock().await;
    let Some(_node) = real_node() else { return };
    let client = common::cluster().await;
    if !load_image() {
        return;
    }
    let _route = OnRealNode::new(&client, NAMESPACE).await;
    // The API server's address copied from a kubeconfig: 127.0.0.1 is the
    // Pod's own loopback, where nothing listens.
    install_changed(|d| {
        let env = d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .expect("env");
        env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
        env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}));
    });
    // The operator says it cannot connect (not which address: its log
    // names the error only), and exits: the Pod crashes and restarts.
    let (pod, state, log) = crash_saying(&client, "cannot reach the Kubernetes API server").await;
    assert!(state == "Error" || state == "CrashLoopBackOff", "{state}");
    assert!(log.contains("client error (Connect)"), "{log}");
    say(&format!("[real-node] wrong address: {pod} {state}\n{log}"));
}

/// What a real node changes on the machine, read from the machine: the
/// node's processes, mount points, network links, addresses and routes,
/// iptables rules, every sysctl, the top cgroups, and the host paths
/// containerd, CNI and the kubelet create.
#[derive(Debug, PartialEq)]
struct Machine {
    processes: BTreeSet<String>,
    mounts: BTreeSet<String>,
    links: BTreeSet<String>,
    addresses: BTreeSet<String>,
    routes: BTreeSet<String>,
    iptables: BTreeSet<String>,
    sysctls: BTreeMap<String, String>,
    cgroups: BTreeSet<String>,
    paths: BTreeSet<String>,
}

/// Sysctls that change by themselves (counters, random values).
const VOLATILE_SYSCTLS: [&str; 10] = [
    "/proc/sys/fs/dentry-state",
    "/proc/sys/fs/quota/",
    "/proc/sys/fs/file-nr",
    "/proc/sys/fs/inode-nr",
    "/proc/sys/fs/inode-state",
    "/proc/sys/fs/aio-nr",
    "/proc/sys/kernel/ns_last_pid",
    "/proc/sys/kernel/random/",
    "/proc/sys/kernel/pty/nr",
    "/proc/sys/net/netfilter/nf_conntrack_count",
];

/// The node's programs (any process running them is the node's).
const NODE_PROGRAMS: [&str; 6] = [
    "containerd",
    "containerd-shim-runc-v2",
    "kubelet",
    "kube-proxy",
    "runc",
    "pause",
];

fn lines_of(program: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn read_sysctls(dir: &std::path::Path, into: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.display().to_string();
        if VOLATILE_SYSCTLS.iter().any(|v| name.starts_with(v)) {
            continue;
        }
        if path.is_dir() {
            read_sysctls(&path, into);
        } else if let Ok(value) = std::fs::read_to_string(&path) {
            into.insert(name, value);
        }
    }
}

impl Machine {
    fn read() -> Self {
        let mut processes = BTreeSet::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
                continue;
            };
            let name = exe
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            // A container's program runs from its root filesystem under the node's state.
            if NODE_PROGRAMS.contains(&name.as_str())
                || exe.display().to_string().contains("/node/containerd/")
            {
                processes.insert(format!(
                    "{} ({})",
                    exe.display(),
                    entry.file_name().to_string_lossy()
                ));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            // podman's storage (the image tests) is not the node's.
            .filter(|m| {
                !m.contains("kustomize-operator-podman") && !m.contains("kustomize-operator/podman")
            })
            .collect();
        let links = lines_of("ip", &["-o", "link", "show"])
            .iter()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|n| n.split('@').next().unwrap_or(n).to_string())
            })
            .collect();
        let addresses = lines_of("ip", &["-o", "addr", "show"])
            .iter()
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
            .map(|l| {
                l.split_once(' ')
                    .map_or(l.clone(), |(_, rest)| rest.to_string())
            })
            .collect();
        let mut routes: BTreeSet<String> = lines_of("ip", &["-4", "route", "show", "table", "all"])
            .into_iter()
            .collect();
        routes.extend(lines_of("ip", &["-6", "route", "show", "table", "all"]));
        let mut iptables = BTreeSet::new();
        for program in ["iptables-save", "ip6tables-save"] {
            let mut table = String::new();
            for line in lines_of(program, &[]) {
                if line.starts_with('#') {
                    continue;
                }
                if let Some(t) = line.strip_prefix('*') {
                    table = t.to_string();
                    continue;
                }
                // Chain policies carry packet counters: keep the policy only.
                let line = match line.strip_prefix(':') {
                    Some(chain) => format!(":{}", chain.rsplit_once(' ').map_or(chain, |(c, _)| c)),
                    None => line,
                };
                iptables.insert(format!("{program} {table} {line}"));
            }
        }
        let mut sysctls = BTreeMap::new();
        read_sysctls(std::path::Path::new("/proc/sys"), &mut sysctls);
        let mut cgroups = BTreeSet::new();
        for controller in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let Ok(children) = std::fs::read_dir(controller.path()) else {
                continue;
            };
            for child in children.flatten() {
                if child.path().is_dir() {
                    cgroups.insert(child.path().display().to_string());
                }
            }
        }
        let paths = [
            "/run/containerd",
            "/var/lib/cni",
            "/var/log/containers",
            "/var/log/pods",
            "/run/netns",
            "/var/lib/kubelet",
            "/var/lib/containerd",
            "/opt/containerd",
            "/etc/cni",
            "/opt/cni",
            "/usr/libexec/kubernetes",
            "/etc/kubernetes",
        ]
        .iter()
        .filter(|p| std::path::Path::new(p).exists())
        .map(|p| p.to_string())
        .collect();
        Self {
            processes,
            mounts,
            links,
            addresses,
            routes,
            iptables,
            sysctls,
            cgroups,
            paths,
        }
    }

    /// What differs from `before`, one line each.
    fn changes_since(&self, before: &Machine) -> Vec<String> {
        fn sets(
            what: &str,
            before: &BTreeSet<String>,
            after: &BTreeSet<String>,
            out: &mut Vec<String>,
        ) {
            out.extend(
                after
                    .difference(before)
                    .map(|x| format!("{what}: added {x}")),
            );
            out.extend(
                before
                    .difference(after)
                    .map(|x| format!("{what}: removed {x}")),
            );
        }
        let mut out = Vec::new();
        sets("process", &before.processes, &self.processes, &mut out);
        sets("mount", &before.mounts, &self.mounts, &mut out);
        sets("link", &before.links, &self.links, &mut out);
        sets("address", &before.addresses, &self.addresses, &mut out);
        sets("route", &before.routes, &self.routes, &mut out);
        sets("iptables", &before.iptables, &self.iptables, &mut out);
        sets("cgroup", &before.cgroups, &self.cgroups, &mut out);
        sets("path", &before.paths, &self.paths, &mut out);
        for (key, value) in &self.sysctls {
            match before.sysctls.get(key) {
                Some(old) if old != value => {
                    out.push(format!("sysctl {key}: {} -> {}", old.trim(), value.trim()))
                }
                None => out.push(format!("sysctl {key}: added {}", value.trim())),
                _ => {}
            }
        }
        for key in before
            .sysctls
            .keys()
            .filter(|k| !self.sysctls.contains_key(*k))
        {
            out.push(format!("sysctl {key}: removed"));
        }
        out
    }
}

/// The name of the Pod sandbox image the node has (built by the plane).
fn pause_image(node: &str) -> String {
    let names = kubectl_ok(&[
        "get",
        "node",
        node,
        "-o",
        r#"jsonpath={range .status.images[*]}{.names[*]}{"\n"}{end}"#,
    ]);
    names
        .split_whitespace()
        .find(|n| n.contains("kustomize-operator-pause"))
        .unwrap_or_else(|| panic!("no pause image on {node}: {names}"))
        .to_string()
}

#[tokio::test]
async fn node_down_leaves_the_machine_as_it_was_before_node_up() {
    let _node = NODE.lock().await;
    let Some(node) = real_node() else { return };
    let client = common::cluster().await;
    let image = pause_image(&node);
    let started = std::time::Instant::now();
    control_plane_ok(&["node-down"]);
    let down = started.elapsed();
    let (ok, _, err) = common::kubectl(&["get", "node", &node]);
    assert!(
        !ok && err.contains("NotFound"),
        "the Node is still there: {err}"
    );
    let before = Machine::read();
    assert!(before.processes.is_empty(), "{:#?}", before.processes);

    let started = std::time::Instant::now();
    control_plane_ok(&["node-up"]);
    let up = started.elapsed();
    // A Pod with a memory emptyDir and its token volume: a sandbox, a
    // container, a veth on the bridge, mounts, cgroups.
    let ns = common::TestNamespace::new(&client, "nodedown").await;
    route_to_real_node(&ns.name);
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sandbox", "namespace": ns.name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "pause",
                "image": image,
                "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
        },
    });
    apply_documents(&[pod]);
    let (ok, out, err) = common::kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/sandbox",
        "-n",
        &ns.name,
        "--timeout=90s",
    ]);
    assert!(ok, "the Pod on the real node is not Ready: {out}{err}");
    let running = Machine::read();
    assert!(
        running.links.contains("ko-cni0") && !running.processes.is_empty(),
        "the node changed nothing? {running:#?}"
    );

    control_plane_ok(&["node-down"]);
    let after = Machine::read();
    let changes = after.changes_since(&before);
    // Put the node back for the other tests (and its image).
    control_plane_ok(&["node-up"]);
    if image_exists() {
        control_plane_ok(&["load-image", IMAGE]);
    }
    assert!(
        changes.is_empty(),
        "node-down left {} change(s) behind:\n{}",
        changes.len(),
        changes.join("\n")
    );
    let (ok, _, err) = common::kubectl(&["get", "node", &node]);
    assert!(ok, "the node is back: {err}");
    say(&format!(
        "[real-node] node-down {:.1}s, node-up {:.1}s",
        down.as_secs_f64(),
        up.as_secs_f64()
    ));
}
