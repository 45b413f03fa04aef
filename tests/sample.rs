//! Sample (nuvolaris.org/v1) against the real control plane.

mod common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kinds::sample::{Sample, SampleSpec};
use kustomize_operator::status::CommonStatus;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

fn sample(name: &str, count: i32) -> Sample {
    Sample::new(name, SampleSpec { count })
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

async fn status(samples: &Api<Sample>, name: &str) -> CommonStatus {
    samples.get(name).await.unwrap().status.unwrap_or_default()
}

async fn wait_ready(samples: &Api<Sample>, name: &str, generation: i64) -> CommonStatus {
    common::wait_until(TIMEOUT, || async {
        let s = status(samples, name).await;
        s.is_ready() && s.observed_generation == Some(generation)
    })
    .await;
    status(samples, name).await
}

/// A Deployment the operator did not make, holding `name` with another
/// (immutable) selector, so applying a Sample of that name fails.
async fn create_foreign_deployment(deployments: &Api<Deployment>, name: &str) {
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "foreign"}},
            "template": {
                "metadata": {"labels": {"app": "foreign"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
}

async fn events_for(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

#[tokio::test]
async fn create_update_second_sample_and_delete() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "sample").await;
    let operator = common::start_operator(&ns.name, &[]).await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        replicas(&deployments, "web").await == Some(2)
    })
    .await;
    let s = wait_ready(&samples, "web", 1).await;
    let cmd = s.last_command.expect("last command recorded");
    assert_eq!(cmd.exit_code, Some(0));
    assert!(
        cmd.command.starts_with("kubectl") && cmd.command.contains("apply -k"),
        "{}",
        cmd.command
    );
    assert!(cmd.stdout.contains("deployment.apps/web"), "{}", cmd.stdout);
    assert!(s.message.unwrap().contains("deployment.apps/web"));
    assert!(s.applied_digest.unwrap().starts_with("sha256:"));

    // Update: the Deployment follows.
    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 5}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        replicas(&deployments, "web").await == Some(5)
    })
    .await;
    wait_ready(&samples, "web", 2).await;

    // A second Sample gets its own Deployment and leaves the first alone.
    samples
        .create(&PostParams::default(), &sample("api", 1))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        replicas(&deployments, "api").await == Some(1)
    })
    .await;
    wait_ready(&samples, "api", 1).await;
    assert_eq!(replicas(&deployments, "web").await, Some(5));
    let api_selector = deployments.get("api").await.unwrap().spec.unwrap().selector;
    assert_eq!(
        api_selector.match_labels.unwrap()["app.kubernetes.io/instance"],
        "api"
    );

    // Events were recorded on the Sample.
    common::wait_until(TIMEOUT, || async {
        events_for(&client, &ns.name, "web")
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("Applied"))
    })
    .await;

    // Delete: the Deployment goes, then the Sample.
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        deployments.get_opt("web").await.unwrap().is_none()
    })
    .await;
    common::wait_until(TIMEOUT, || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert_eq!(replicas(&deployments, "api").await, Some(1));

    operator.stop().await;
}

#[tokio::test]
async fn restart_with_nothing_changed_spawns_no_kubectl() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "restart").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let first = common::start_operator(&ns.name, &[]).await;
    samples
        .create(&PostParams::default(), &sample("web", 1))
        .await
        .unwrap();
    wait_ready(&samples, "web", 1).await;
    assert!(first.engine.kubectl.stats().spawned() >= 1);
    first.stop().await;

    let second = common::start_operator(&ns.name, &[]).await;
    common::wait_until(TIMEOUT, || async {
        second.engine.metrics.skipped_count("sample") >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        second.engine.kubectl.stats().spawned(),
        0,
        "kubectl was spawned"
    );
    second.stop().await;
}

#[tokio::test]
async fn failed_apply_is_reported_and_recovers() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "fail").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    // A foreign Deployment with the Sample's name and another (immutable) selector.
    create_foreign_deployment(&deployments, "web").await;

    let operator = common::start_operator(&ns.name, &[]).await;
    samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        let s = status(&samples, "web").await;
        s.condition("Ready")
            .is_some_and(|c| c.status == "False" && c.reason == "ApplyFailed")
    })
    .await;
    let s = status(&samples, "web").await;
    let cmd = s.last_command.clone().unwrap();
    assert_ne!(cmd.exit_code, Some(0));
    assert!(cmd.stderr.contains("immutable"), "{}", cmd.stderr);
    assert!(s.condition("Ready").unwrap().message.contains("immutable"));
    common::wait_until(TIMEOUT, || async {
        events_for(&client, &ns.name, "web").await.iter().any(|e| {
            e.reason.as_deref() == Some("ApplyFailed") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;

    // Fix the cause: the retry (with backoff) succeeds.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(Duration::from_secs(90), || async {
        status(&samples, "web").await.is_ready()
    })
    .await;
    assert_eq!(replicas(&deployments, "web").await, Some(2));
    operator.stop().await;
}

#[tokio::test]
async fn failing_delete_keeps_the_sample_until_it_succeeds() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "delfail").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    // A kubectl stand-in that fails `delete` while a marker file exists and
    // otherwise runs the real kubectl against the real cluster.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("fail-deletes");
    let wrapper = dir.path().join("kubectl");
    common::write_script(
        &wrapper,
        &format!(
            r#"for a in "$@"; do
  if [ "$a" = delete ] && [ -e {marker} ]; then echo "error: injected delete failure" >&2; exit 1; fi
done
exec {real} "$@""#,
            marker = marker.display(),
            real = common::kubectl_path().display()
        ),
    );
    let operator =
        common::start_operator(&ns.name, &["--kubectl", &wrapper.display().to_string()]).await;
    samples
        .create(&PostParams::default(), &sample("web", 1))
        .await
        .unwrap();
    wait_ready(&samples, "web", 1).await;

    std::fs::write(&marker, "").unwrap();
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        let s = status(&samples, "web").await;
        s.condition("Ready")
            .is_some_and(|c| c.reason == "DeleteFailed")
    })
    .await;
    let s = status(&samples, "web").await;
    assert!(
        s.last_command
            .unwrap()
            .stderr
            .contains("injected delete failure")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        samples.get_opt("web").await.unwrap().is_some(),
        "the Sample must stay while delete fails"
    );
    assert!(deployments.get_opt("web").await.unwrap().is_some());

    std::fs::remove_file(&marker).unwrap();
    common::wait_until(Duration::from_secs(90), || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(deployments.get_opt("web").await.unwrap().is_none());
    operator.stop().await;
}

#[tokio::test]
async fn keep_overlays_leaves_a_replayable_overlay() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "keep").await;
    let keep = tempfile::tempdir().unwrap();
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(
        &ns.name,
        &["--keep-overlays", &keep.path().display().to_string()],
    )
    .await;
    samples
        .create(&PostParams::default(), &sample("web", 3))
        .await
        .unwrap();
    wait_ready(&samples, "web", 1).await;
    let dir = keep.path().join("sample").join(&ns.name).join("web");
    let (ok, out, err) = common::kubectl(&["kustomize", &dir.display().to_string()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("replicas: 3") && out.contains("name: web"),
        "{out}"
    );
    operator.stop().await;
}

#[tokio::test]
async fn api_server_rejects_bad_counts() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "bad").await;
    for bad in ["-1", "\"abc\"", "1000000"] {
        let manifest = format!(
            "apiVersion: nuvolaris.org/v1\nkind: Sample\nmetadata:\n  name: bad\n  namespace: {}\nspec:\n  count: {bad}\n",
            ns.name
        );
        let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &manifest);
        assert!(!ok, "count {bad} was accepted");
        assert!(err.contains("spec.count"), "count {bad}: {err}");
    }
}

#[tokio::test]
async fn a_burst_is_batched_and_each_status_names_only_its_objects() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "batch").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    // One Sample whose apply must fail: a foreign Deployment holds its name
    // with another (immutable) selector.
    create_foreign_deployment(&deployments, "s-bad").await;

    let names: Vec<String> = (0..20).map(|i| format!("s-{i:02}")).collect();
    for name in names.iter().chain(std::iter::once(&"s-bad".to_string())) {
        samples
            .create(&PostParams::default(), &sample(name, 1))
            .await
            .unwrap();
    }
    let operator = common::start_operator(&ns.name, &["--max-concurrent-kubectl", "1"]).await;
    let mut largest_batch = 0;
    for name in &names {
        let s = wait_ready(&samples, name, 1).await;
        let cmd = s.last_command.unwrap();
        largest_batch = largest_batch.max(cmd.batch_size.unwrap_or(1));
        let out = cmd.stdout;
        // "created", or "unchanged" when its batch failed (because of s-bad)
        // and it was applied again alone.
        let own = format!("deployment.apps/{name} ");
        assert!(out.starts_with(&own), "{name}: {out}");
        assert_eq!(
            out.lines().count(),
            1,
            "{name} got other objects' lines: {out}"
        );
        assert_eq!(replicas(&deployments, name).await, Some(1));
    }
    let spawned = operator.engine.kubectl.stats().spawned();
    assert!(
        spawned < 21,
        "{spawned} kubectl runs for 21 Samples: not batched"
    );
    assert!(largest_batch >= 2, "no Sample was applied in a batch");
    common::wait_until(TIMEOUT, || async {
        let s = status(&samples, "s-bad").await;
        s.condition("Ready")
            .is_some_and(|c| c.reason == "ApplyFailed")
    })
    .await;
    let bad = status(&samples, "s-bad").await.last_command.unwrap();
    assert!(bad.stderr.contains("immutable"), "{}", bad.stderr);
    assert_eq!(
        bad.batch_size, None,
        "the failing Sample is reported from its own run"
    );
    operator.stop().await;
}
