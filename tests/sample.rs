//! Sample (nuvolaris.org/v1) against the real control plane.

use ko_test_support as common;

use std::time::Duration;

use common::sample::{Sample, SampleSpec, replicas};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kustomize_operator::kind::{CommonStatus, ConditionStatus, ConditionType, Owner, Reason};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

fn sample(name: &str, count: i32) -> Sample {
    Sample::new(name, SampleSpec { count })
}

async fn status(samples: &Api<Sample>, name: &str) -> CommonStatus {
    samples.get(name).await.unwrap().status.unwrap_or_default()
}

async fn wait_ready(samples: &Api<Sample>, name: &str, generation: i64) -> CommonStatus {
    common::wait_until(
        TIMEOUT,
        format!("the Sample {name} Ready at generation {generation}"),
        || async {
            let s = status(samples, name).await;
            s.is_ready() && s.observed_generation == Some(generation)
        },
    )
    .await;
    status(samples, name).await
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

fn ready_reason(s: &CommonStatus) -> Option<(ConditionStatus, Reason)> {
    s.condition(ConditionType::Ready)
        .map(|c| (c.status, c.reason))
}

async fn wait_reason(samples: &Api<Sample>, name: &str, reason: Reason) -> CommonStatus {
    common::wait_until(
        TIMEOUT,
        format!("the Sample {name} Ready=False with reason {reason:?}"),
        || async {
            ready_reason(&status(samples, name).await) == Some((ConditionStatus::False, reason))
        },
    )
    .await;
    status(samples, name).await
}

async fn wait_event(client: &Client, ns: &str, name: &str, reason: &str, type_: &str) {
    common::wait_until(
        TIMEOUT,
        format!("a {type_} event {reason} about {name}"),
        || async {
            events_for(client, ns, name)
                .await
                .iter()
                .any(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some(type_))
        },
    )
    .await;
}

/// A kubectl stand-in that runs the real kubectl, except that `verb` fails
/// while `marker` exists (and, with `only_for`, only when the objects on
/// its standard input name that object).
fn failing_kubectl(
    dir: &std::path::Path,
    verb: &str,
    only_for: Option<&str>,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let marker = dir.join(format!("fail-{verb}"));
    let wrapper = dir.join("kubectl");
    let input = dir.join("stdin");
    let condition = match only_for {
        Some(name) => format!("grep -q '\"name\":\"{name}\"' {}", input.display()),
        None => "true".to_string(),
    };
    common::write_script(
        &wrapper,
        &format!(
            r#"verb=""
for a in "$@"; do case "$a" in -*) ;; *) verb="$a"; break;; esac; done
if [ "$verb" = apply ]; then cat > {input}; else : > {input}; fi
if [ "$verb" = {verb} ] && [ -e {marker} ] && {condition}; then echo "error: injected {verb} failure" >&2; exit 1; fi
exec {real} "$@" < {input}"#,
            input = input.display(),
            marker = marker.display(),
            real = common::kubectl_path().display()
        ),
    );
    (wrapper, marker)
}

#[tokio::test]
async fn create_update_second_sample_and_delete() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sample").await;
    let operator = common::start_operator(&ns.name, &[]).await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    let created = samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment web at 2 replicas", || async {
        replicas(&deployments, "web").await == Some(2)
    })
    .await;
    let s = wait_ready(&samples, "web", 1).await;
    let cmd = s.last_command.expect("last command recorded");
    assert_eq!(cmd.exit_code, Some(0));
    assert!(
        cmd.command.starts_with("kubectl") && cmd.command.contains("apply --server-side"),
        "{}",
        cmd.command
    );
    assert!(
        cmd.stdout
            .contains("deployment.apps/web serverside-applied"),
        "{}",
        cmd.stdout
    );
    assert_eq!(
        s.message.as_deref(),
        Some("deployment.apps/web serverside-applied")
    );
    assert!(s.applied_digest.unwrap().starts_with("sha256:"));
    // The Sample owns its Deployment: inventory, marker, ownerReference,
    // and no client-side last-applied annotation.
    let inventory = s.inventory.expect("inventory");
    assert_eq!(inventory.count, 1);
    assert_eq!(
        (
            inventory.objects[0].kind.as_str(),
            inventory.objects[0].names.as_slice()
        ),
        ("Deployment", &["web".to_string()][..])
    );
    let d = deployments.get("web").await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(d.metadata.labels.as_ref().unwrap()[Owner::LABEL], uid);
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[Owner::ANNOTATION],
        format!("Sample.nuvolaris.org/{}/web", ns.name)
    );
    assert!(
        !d.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Sample", uid.as_str())
    );

    // Update: the Deployment follows.
    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 5}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment web at 5 replicas", || async {
        replicas(&deployments, "web").await == Some(5)
    })
    .await;
    wait_ready(&samples, "web", 2).await;

    // A second Sample gets its own Deployment and leaves the first alone.
    samples
        .create(&PostParams::default(), &sample("api", 1))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment api at 1 replica", || async {
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
    wait_event(&client, &ns.name, "web", "Applied", "Normal").await;

    // Delete: the Deployment goes, then the Sample.
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment web gone", || async {
        deployments.get_opt("web").await.unwrap().is_none()
    })
    .await;
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert_eq!(replicas(&deployments, "api").await, Some(1));

    operator.stop().await;
}

/// What the operator could have changed on a Deployment: its marker, its
/// field managers, its replicas and selector.
fn untouched(d: &Deployment) {
    let labels = d.metadata.labels.clone().unwrap_or_default();
    assert!(!labels.contains_key(Owner::LABEL), "marked: {labels:?}");
    let managers: Vec<String> = d
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m == "kustomize-operator"),
        "the operator wrote fields: {managers:?}"
    );
    let spec = d.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.selector.match_labels.unwrap()["app"], "victim");
}

/// The reproduction of the data-loss bug: a Sample named like a Deployment
/// it did not create must neither take it over nor delete it.
#[tokio::test]
async fn a_deployment_the_sample_did_not_create_is_never_touched() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "victim").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let (ok, _, err) = common::kubectl(&[
        "-n",
        &ns.name,
        "create",
        "deployment",
        "victim",
        "--image=nginx",
    ]);
    assert!(ok, "{err}");

    let operator = common::start_operator(&ns.name, &[]).await;
    samples
        .create(&PostParams::default(), &sample("victim", 2))
        .await
        .unwrap();
    let s = wait_reason(&samples, "victim", Reason::OwnershipConflict).await;
    let message = &s.condition(ConditionType::Ready).unwrap().message;
    assert!(
        message.contains(&format!("deployment.apps/victim in {} exists", ns.name))
            && message.contains("kubectl-create"),
        "{message}"
    );
    assert!(
        s.inventory.is_none(),
        "nothing was applied: {:?}",
        s.inventory
    );
    wait_event(&client, &ns.name, "victim", "OwnershipConflict", "Warning").await;
    untouched(&deployments.get("victim").await.unwrap());

    samples
        .delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample victim gone", || async {
        samples.get_opt("victim").await.unwrap().is_none()
    })
    .await;
    let survivor = deployments.get_opt("victim").await.unwrap();
    untouched(&survivor.expect("the user's Deployment was deleted"));
    operator.stop().await;
}

#[tokio::test]
async fn restart_with_nothing_changed_spawns_no_kubectl_and_writes_nothing() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "restart").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let first = common::start_operator(&ns.name, &[]).await;
    // Many, so that reconciles after the first meet the Deployment watch
    // while it is still listing.
    let names: Vec<String> = (0..24).map(|i| format!("web-{i}")).collect();
    for name in &names {
        samples
            .create(&PostParams::default(), &sample(name, 0))
            .await
            .unwrap();
    }
    for name in &names {
        wait_ready(&samples, name, 1).await;
    }
    assert!(first.kubectl_stats().spawned() >= 1);
    first.stop().await;
    let mut versions = Vec::new();
    for name in &names {
        versions.push(samples.get(name).await.unwrap().resource_version());
    }

    let second = common::start_operator(&ns.name, &[]).await;
    // Starting, it built the declared Sample's base (a start-up check) in
    // memory: the base lists plain files, in the subset the engine builds.
    let at_start = second.kubectl_stats().spawned();
    assert_eq!(at_start, 0, "the start-up check ran kubectl for the base");
    // The positive marker: the restarted operator reconciled every Sample
    // and found nothing to do.
    common::wait_until(
        TIMEOUT,
        format!(
            "{} skipped reconciles in the restarted operator",
            names.len()
        ),
        || async { second.metrics().skipped_count("sample") >= names.len() as u64 },
    )
    .await;
    assert_eq!(
        second.kubectl_stats().spawned(),
        at_start,
        "a reconcile spawned kubectl"
    );
    for (name, before) in names.iter().zip(&versions) {
        assert_eq!(
            &samples.get(name).await.unwrap().resource_version(),
            before,
            "the status of {name} was rewritten though nothing changed"
        );
    }
    second.stop().await;
}

#[tokio::test]
async fn failed_apply_is_reported_and_recovers() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "fail").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let dir = tempfile::tempdir().unwrap();
    let (wrapper, marker) = failing_kubectl(dir.path(), "apply", None);
    std::fs::write(&marker, "").unwrap();
    let operator =
        common::start_operator(&ns.name, &["--kubectl", &wrapper.display().to_string()]).await;
    samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    let s = wait_reason(&samples, "web", Reason::ApplyFailed).await;
    let cmd = s.last_command.clone().unwrap();
    assert_eq!(cmd.exit_code, Some(1));
    assert!(
        cmd.stderr.contains("injected apply failure"),
        "{}",
        cmd.stderr
    );
    assert_eq!(s.message.as_deref(), Some("error: injected apply failure"));
    assert_eq!(
        s.condition(ConditionType::Reconciling).map(|c| c.status),
        Some(ConditionStatus::False)
    );
    wait_event(&client, &ns.name, "web", "ApplyFailed", "Warning").await;

    // Fix the cause: the retry (with backoff) succeeds.
    std::fs::remove_file(&marker).unwrap();
    common::wait_until(
        Duration::from_secs(90),
        "the Sample web Ready after the retry",
        || async { status(&samples, "web").await.is_ready() },
    )
    .await;
    assert_eq!(replicas(&deployments, "web").await, Some(2));
    operator.stop().await;
}

#[tokio::test]
async fn a_manual_scale_is_taken_back_on_resync() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "drift").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(&ns.name, &["--resync-interval", "2s"]).await;
    samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    wait_ready(&samples, "web", 1).await;
    let (ok, _, err) =
        common::kubectl(&["-n", &ns.name, "scale", "deployment/web", "--replicas=5"]);
    assert!(ok, "{err}");
    assert_eq!(replicas(&deployments, "web").await, Some(5));
    // The Sample's count is the truth about its Deployment.
    common::wait_until(
        TIMEOUT,
        "the resync to take the Deployment web back to 2 replicas",
        || async { replicas(&deployments, "web").await == Some(2) },
    )
    .await;
    // Ready again once the Deployment settled (the re-apply may first
    // find it still scaling down, Ready=Unknown).
    wait_ready(&samples, "web", 1).await;
    operator.stop().await;
}

#[tokio::test]
async fn failing_delete_keeps_the_sample_until_it_succeeds() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "delfail").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let dir = tempfile::tempdir().unwrap();
    let (wrapper, marker) = failing_kubectl(dir.path(), "delete", None);
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
    let s = wait_reason(&samples, "web", Reason::DeleteFailed).await;
    assert!(
        s.last_command
            .unwrap()
            .stderr
            .contains("injected delete failure")
    );
    // The positive marker: the delete was retried and failed again.
    common::wait_until(
        TIMEOUT,
        "2 failed kubectl runs (the delete retried)",
        || async { operator.kubectl_stats().failed() >= 2 },
    )
    .await;
    assert!(
        samples.get_opt("web").await.unwrap().is_some(),
        "the Sample must stay while delete fails"
    );
    assert!(deployments.get_opt("web").await.unwrap().is_some());

    std::fs::remove_file(&marker).unwrap();
    common::wait_until(
        Duration::from_secs(90),
        "the Sample web gone after the retry",
        || async { samples.get_opt("web").await.unwrap().is_none() },
    )
    .await;
    assert!(deployments.get_opt("web").await.unwrap().is_none());
    operator.stop().await;
}

#[tokio::test]
async fn keep_overlays_leaves_a_replayable_overlay() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "keep").await;
    let keep = tempfile::tempdir().unwrap();
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(
        &ns.name,
        &["--keep-overlays", &keep.path().display().to_string()],
    )
    .await;
    let created = samples
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
    // What was applied, marker included.
    assert!(out.contains(&created.metadata.uid.unwrap()), "{out}");
    operator.stop().await;
}

#[tokio::test]
async fn api_server_rejects_bad_counts() {
    let client = common::cluster().await;
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
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "batch").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    // One Sample whose apply must fail, wherever it is batched.
    let dir = tempfile::tempdir().unwrap();
    let (wrapper, marker) = failing_kubectl(dir.path(), "apply", Some("s-bad"));
    std::fs::write(&marker, "").unwrap();

    let names: Vec<String> = (0..20).map(|i| format!("s-{i:02}")).collect();
    for name in names.iter().chain(std::iter::once(&"s-bad".to_string())) {
        samples
            .create(&PostParams::default(), &sample(name, 1))
            .await
            .unwrap();
    }
    let operator = common::start_operator(
        &ns.name,
        &[
            "--max-concurrent-kubectl",
            "1",
            "--kubectl",
            &wrapper.display().to_string(),
        ],
    )
    .await;
    let mut largest_batch = 0;
    let mut runs = std::collections::BTreeSet::new();
    for name in &names {
        let s = wait_ready(&samples, name, 1).await;
        let cmd = s.last_command.unwrap();
        largest_batch = largest_batch.max(cmd.batch_size.unwrap_or(1));
        runs.insert(cmd.started_at);
        let out = cmd.stdout;
        assert_eq!(
            out,
            format!("deployment.apps/{name} serverside-applied\n"),
            "{name}"
        );
        assert_eq!(replicas(&deployments, name).await, Some(1));
    }
    // (The failing Sample's retries spawn kubectl too: count the good ones' runs.)
    assert!(
        runs.len() < names.len(),
        "{} apply runs for {} Samples: not batched",
        runs.len(),
        names.len()
    );
    assert!(largest_batch >= 2, "no Sample was applied in a batch");
    let bad = wait_reason(&samples, "s-bad", Reason::ApplyFailed)
        .await
        .last_command
        .unwrap();
    assert!(
        bad.stderr.contains("injected apply failure"),
        "{}",
        bad.stderr
    );
    assert_eq!(
        bad.batch_size, None,
        "the failing Sample is reported from its own run"
    );
    operator.stop().await;
}
