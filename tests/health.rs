//! Ready means healthy, on the local plane with kwok's nodes: a Sample is
//! Ready only once its Deployment's Pods are available; it shows progress
//! while they are not, stalls after the health timeout, recovers when they
//! come; none of that spawns kubectl. One healthy at its controller's first
//! look is Ready in the very status that records the apply. Pod creation is
//! held back with a ResourceQuota on Pods, which makes each state last as
//! long as the test needs it.

use ko_test_support as common;

use std::time::Duration;

use common::sample::{Sample, SampleSpec, available};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kind::{CommonStatus, ConditionStatus, ConditionType, Reason};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

async fn status(samples: &Api<Sample>, name: &str) -> CommonStatus {
    samples.get(name).await.unwrap().status.unwrap_or_default()
}

fn condition(s: &CommonStatus, type_: ConditionType) -> Option<(ConditionStatus, Reason)> {
    s.condition(type_).map(|c| (c.status, c.reason))
}

/// Waits until `check` holds for the Sample's status; fails showing it.
async fn wait_status(
    samples: &Api<Sample>,
    name: &str,
    what: &str,
    check: impl Fn(&CommonStatus) -> bool,
) -> CommonStatus {
    common::wait_for(TIMEOUT, format!("{name} {what}"), || async {
        let s = status(samples, name).await;
        if check(&s) { Ok(s) } else { Err(s) }
    })
    .await
}

fn ready(s: &CommonStatus) -> bool {
    s.is_ready()
}

/// At most `pods` Pods in `ns` (the ReplicaSet cannot create more).
async fn set_pod_quota(client: &Client, ns: &str, pods: u32) {
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": pods.to_string()}},
    }))
    .unwrap();
    quotas
        .patch(
            "pods",
            &PatchParams::apply("health-test").force(),
            &Patch::Apply(&quota),
        )
        .await
        .unwrap();
    // The quota admission plugin needs the quota's status before it counts.
    common::wait_until(
        TIMEOUT,
        format!("the quota of {pods} Pods in the quota's status"),
        || async {
            quotas
                .get("pods")
                .await
                .unwrap()
                .status
                .and_then(|s| s.hard)
                .is_some_and(|h| {
                    h.get("pods").map(|q| q.0.as_str()) == Some(pods.to_string().as_str())
                })
        },
    )
    .await;
}

async fn running_pods(client: &Client, ns: &str, sample: &str) -> usize {
    let selector = format!("app.kubernetes.io/instance={sample}");
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .count()
}

#[tokio::test]
async fn ready_waits_for_running_pods_stalls_after_the_timeout_and_recovers() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "health").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    set_pod_quota(&client, &ns.name, 0).await;
    let operator = common::start_operator(&ns.name, &["--health-timeout", "5s"]).await;
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 2 }),
        )
        .await
        .unwrap();

    // Applied, but no Pod can run: Reconciling, with what it waits for.
    let waiting = wait_status(&samples, "web", "waiting for its Pods", |s| {
        s.applied_digest.is_some()
            && condition(s, ConditionType::Reconciling)
                == Some((ConditionStatus::True, Reason::Progressing))
    })
    .await;
    assert_eq!(
        condition(&waiting, ConditionType::Ready),
        Some((ConditionStatus::Unknown, Reason::Progressing))
    );
    let message = waiting.message.clone().unwrap_or_default();
    assert!(message.starts_with("deployment/web: "), "{message}");
    let spawned = operator.kubectl_stats().spawned();

    // Still no Pod after the timeout: Stalled, Ready=False, a warning.
    let stalled = wait_status(&samples, "web", "stalled", |s| {
        condition(s, ConditionType::Stalled).is_some()
    })
    .await;
    assert_eq!(
        condition(&stalled, ConditionType::Ready),
        Some((ConditionStatus::False, Reason::Unhealthy))
    );
    assert_eq!(
        condition(&stalled, ConditionType::Stalled),
        Some((ConditionStatus::True, Reason::Unhealthy))
    );
    let message = stalled.message.clone().unwrap_or_default();
    assert!(message.starts_with("not healthy after 5s"), "{message}");
    common::wait_until(TIMEOUT, "an Unhealthy event about web", || {
        common::has_event(&client, &ns.name, "web", "Unhealthy")
    })
    .await;
    assert_eq!(running_pods(&client, &ns.name, "web").await, 0);

    // The quota goes: the Pods run, and only then is the Sample Ready.
    set_pod_quota(&client, &ns.name, 10).await;
    let healthy = wait_status(&samples, "web", "ready", ready).await;
    assert!(condition(&healthy, ConditionType::Stalled).is_none());
    assert_eq!(running_pods(&client, &ns.name, "web").await, 2);
    common::wait_until(TIMEOUT, "2 available replicas of web", || async {
        available(&samples, "web").await == Some(2)
    })
    .await;
    common::wait_until(TIMEOUT, "a Healthy event about web", || {
        common::has_event(&client, &ns.name, "web", "Healthy")
    })
    .await;
    assert_eq!(
        operator.kubectl_stats().spawned(),
        spawned,
        "a health change spawned kubectl"
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_sample_healthy_at_the_first_look_gets_one_status_ready_at_once() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "first-look").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(&ns.name, &[]).await;
    let seen = common::sample::record_statuses(&samples, "web").await;
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 0 }),
        )
        .await
        .unwrap();
    wait_status(&samples, "web", "ready", ready).await;
    common::wait_until(
        TIMEOUT,
        "a Ready status of web among those seen",
        || async { seen.all().iter().any(CommonStatus::is_ready) },
    )
    .await;

    // Its Deployment needed the Deployment controller's first look to be
    // healthy: the engine waited for it, so the status that recorded the
    // apply said Ready already, and no `Healthy` event followed a wait
    // nobody was shown (events go out before the status they explain).
    let statuses = seen.all();
    let applied: Vec<&CommonStatus> = statuses
        .iter()
        .filter(|s| s.applied_digest.is_some())
        .collect();
    assert!(
        applied.iter().all(|s| s.is_ready()),
        "a status recorded the apply before Ready: {statuses:#?}"
    );
    assert!(common::has_event(&client, &ns.name, "web", "Applied").await);
    assert!(!common::has_event(&client, &ns.name, "web", "Healthy").await);
    operator.stop().await;
}

#[tokio::test]
async fn scaling_up_shows_progress_then_ready() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "scale").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    set_pod_quota(&client, &ns.name, 1).await;
    let operator = common::start_operator(&ns.name, &[]).await;
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
    wait_status(&samples, "web", "ready", ready).await;

    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 3}})),
        )
        .await
        .unwrap();
    let progress = wait_status(&samples, "web", "showing progress at generation 2", |s| {
        s.observed_generation == Some(2)
            && condition(s, ConditionType::Reconciling)
                .is_some_and(|c| c.0 == ConditionStatus::True)
            && s.message.as_deref().is_some_and(|m| m.contains("1/3"))
    })
    .await;
    assert!(!progress.is_ready());

    set_pod_quota(&client, &ns.name, 3).await;
    wait_status(&samples, "web", "ready at generation 2", |s| {
        s.is_ready() && s.observed_generation == Some(2)
    })
    .await;
    assert_eq!(running_pods(&client, &ns.name, "web").await, 3);
    operator.stop().await;
}

/// A deleted Pod is the Deployment controller's to replace: the operator
/// sees its Deployment lose an available replica (its status says so),
/// spawns no kubectl for it, and never calls it failed. The replacement
/// is held back by the Pod quota until the operator has shown that it saw
/// the loss, so the test cannot pass by looking before anything happened.
#[tokio::test]
async fn a_deleted_pod_is_replaced_without_a_reapply_or_a_stall() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "pod-gone").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(&ns.name, &[]).await;
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 2 }),
        )
        .await
        .unwrap();
    wait_status(&samples, "web", "ready", ready).await;
    common::wait_until(TIMEOUT, "2 running Pods of web", || async {
        running_pods(&client, &ns.name, "web").await == 2
    })
    .await;
    // The two Pods stay; no third may be created while the quota is 1.
    set_pod_quota(&client, &ns.name, 1).await;
    let spawned = operator.kubectl_stats().spawned();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let selector = ListParams::default().labels("app.kubernetes.io/instance=web");
    let before: Vec<String> = pods
        .list(&selector)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let victim = before[0].clone();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();

    // Until a replacement runs, Ready is never False: Unknown while the
    // Deployment really has fewer available replicas.
    let never_false = |s: &CommonStatus| {
        let ready = condition(s, ConditionType::Ready).map(|c| c.0);
        assert_ne!(ready, Some(ConditionStatus::False), "flapped: {s:#?}");
    };
    // The positive marker: the operator saw the loss (through its
    // Deployment's status) and says so.
    let seen = wait_status(&samples, "web", "showing 1/2 replicas available", |s| {
        never_false(s);
        condition(s, ConditionType::Ready) == Some((ConditionStatus::Unknown, Reason::Progressing))
            && s.message.as_deref().is_some_and(|m| m.contains("1/2"))
    })
    .await;
    assert_eq!(
        condition(&seen, ConditionType::Reconciling),
        Some((ConditionStatus::True, Reason::Progressing)),
        "{seen:#?}"
    );
    assert_eq!(running_pods(&client, &ns.name, "web").await, 1);

    // The quota lifted, the Deployment controller replaces the Pod.
    set_pod_quota(&client, &ns.name, 10).await;
    common::wait_for(
        TIMEOUT,
        format!("a Pod running in place of {victim}, and web Ready"),
        || async {
            let s = status(&samples, "web").await;
            never_false(&s);
            let replaced = pods.list(&selector).await.unwrap().items.iter().any(|p| {
                p.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| !before.contains(n))
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            }) && running_pods(&client, &ns.name, "web").await == 2;
            if replaced && s.is_ready() {
                Ok(())
            } else {
                Err(s)
            }
        },
    )
    .await;
    assert_eq!(
        operator.kubectl_stats().spawned(),
        spawned,
        "a Pod's deletion spawned kubectl"
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_deployment_deleted_behind_the_operators_back_is_applied_again_at_once() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "drift").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    // The resync is an hour away: only the watch can bring it back.
    let operator = common::start_operator(&ns.name, &["--resync-interval", "1h"]).await;
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
    wait_status(&samples, "web", "ready", ready).await;
    let before = deployments.get("web").await.unwrap().metadata.uid;
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        "a new Deployment web in place of the deleted one",
        || async {
            deployments.get_opt("web").await.unwrap().is_some_and(|d| {
                d.metadata.uid != before && d.metadata.deletion_timestamp.is_none()
            })
        },
    )
    .await;
    wait_status(&samples, "web", "ready again", ready).await;
    operator.stop().await;
}
