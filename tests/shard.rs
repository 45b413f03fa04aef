//! Sharding against the control plane: two operators on the same namespace,
//! one started with `--shard a`, one without (the default shard). Each
//! resource is reconciled by exactly one of them — by its label — and a
//! relabelled resource moves from one to the other.

use ko_test_support as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::sample::{Sample, SampleSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The label users give a resource to place it in a shard (its name is the
/// operator's contract with them, so the test spells it).
const SHARD_LABEL: &str = "kustomize-operator.io/shard";

const TIMEOUT: Duration = Duration::from_secs(120);
const SAMPLES: usize = 200;

fn sample(name: &str, shard: Option<&str>) -> Sample {
    let mut s = Sample::new(name, SampleSpec { count: 0 });
    if let Some(shard) = shard {
        s.metadata.labels = Some(BTreeMap::from([(
            SHARD_LABEL.to_string(),
            shard.to_string(),
        )]));
    }
    s
}

/// Which operator published each `reason` event, per Sample: the events'
/// `reportingController` (`kustomize-operator` or `kustomize-operator-<shard>`).
async fn reporters(client: &Client, ns: &str, reason: &str) -> BTreeMap<String, Vec<String>> {
    let mut by_sample: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    for e in events.items {
        let regarding = e.regarding.as_ref();
        if e.reason.as_deref() != Some(reason)
            || regarding.and_then(|r| r.kind.as_deref()) != Some("Sample")
        {
            continue;
        }
        let name = regarding.and_then(|r| r.name.clone()).unwrap_or_default();
        by_sample
            .entry(name)
            .or_default()
            .push(e.reporting_controller.unwrap_or_default());
    }
    by_sample
}

async fn ready_count(samples: &Api<Sample>) -> usize {
    samples
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.status.as_ref().is_some_and(|st| st.is_ready()))
        .count()
}

#[tokio::test]
async fn each_resource_is_reconciled_by_exactly_one_shard_and_moves_when_relabelled() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "shards").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let default_shard = common::start_operator(&ns.name, &[]).await;
    let shard_a = common::start_operator(&ns.name, &["--shard", "a"]).await;

    for i in 0..SAMPLES {
        let shard = (i.is_multiple_of(2)).then_some("a");
        samples
            .create(&PostParams::default(), &sample(&format!("s{i:03}"), shard))
            .await
            .unwrap();
    }
    common::wait_until(TIMEOUT, format!("all {SAMPLES} Samples Ready"), || async {
        ready_count(&samples).await == SAMPLES
    })
    .await;

    // Every Sample was applied once, by the operator of its shard.
    let applied = reporters(&client, &ns.name, "Applied").await;
    assert_eq!(applied.len(), SAMPLES);
    for (name, by) in &applied {
        let i: usize = name[1..].parse().unwrap();
        let expected = if i.is_multiple_of(2) {
            "kustomize-operator-a"
        } else {
            "kustomize-operator"
        };
        assert_eq!(by, &[expected.to_string()], "{name}");
    }
    let reconciles = |op: &kustomize_operator::Operator| op.metrics().reconcile_count("sample");
    let (a, default) = (reconciles(&shard_a), reconciles(&default_shard));
    assert!(
        a >= SAMPLES as u64 / 2 && default >= SAMPLES as u64 / 2,
        "reconciles: shard a {a}, default {default}"
    );

    // s001 (default shard) moves to shard a, with a change: shard a applies it.
    let moved = json!({"metadata": {"labels": {SHARD_LABEL: "a"}}, "spec": {"count": 1}});
    samples
        .patch("s001", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment s001 at 1 replica", || async {
        deployments
            .get("s001")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.replicas)
            == Some(1)
    })
    .await;
    common::wait_until(
        TIMEOUT,
        "an Applied event about s001 from kustomize-operator-a",
        || async {
            reporters(&client, &ns.name, "Applied").await["s001"]
                .contains(&"kustomize-operator-a".to_string())
        },
    )
    .await;
    common::wait_until(TIMEOUT, "the Sample s001 Ready at generation 2", || async {
        samples
            .get("s001")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.is_ready() && s.observed_generation == Some(2))
    })
    .await;
    // The default shard no longer touches it: a later change is shard a's
    // alone. Counted per process (each operator's own metrics): events
    // would not tell, since a repeated Applied event from the same
    // operator is folded into one series.
    let applies = |op: &kustomize_operator::Operator| {
        common::metric_sum(
            &op.metrics().encode(),
            "kustomize_operator_kubectl_runs_total",
            &["verb=\"apply\""],
        )
    };
    let default_before = (reconciles(&default_shard), applies(&default_shard));
    let a_before = applies(&shard_a);
    samples
        .patch(
            "s001",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 2}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample s001 Ready at generation 3", || async {
        samples
            .get("s001")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.is_ready() && s.observed_generation == Some(3))
    })
    .await;
    assert!(
        applies(&shard_a) > a_before,
        "shard a ran no kubectl apply for the change"
    );
    assert_eq!(
        (reconciles(&default_shard), applies(&default_shard)),
        default_before,
        "the default shard reconciled or applied (reconciles, kubectl applies) after s001 moved"
    );
    default_shard.stop().await;
    shard_a.stop().await;
}
