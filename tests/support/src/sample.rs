//! A typed view of the Sample, for tests: the kind itself is declared by
//! `kustomize/sample/kind.yaml` and served as dynamic objects; tests read
//! and write it through this type (kube derives the client side). Its
//! status is read as the engine's fields; [`available`] reads the one the
//! kind file maps.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher;
use kube::{Api, CustomResource};
use kustomize_operator::kind::CommonStatus;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Sample asks for a Deployment of nginx with `count` replicas.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nuvolaris.org",
    version = "v1",
    kind = "Sample",
    plural = "samples",
    namespaced,
    status = "CommonStatus"
)]
pub struct SampleSpec {
    /// Replicas of the Deployment.
    pub count: i32,
}

/// `.status.available` of the Sample `name` (its Deployment's available
/// replicas, as the kind file maps them), if set.
pub async fn available(samples: &Api<Sample>, name: &str) -> Option<i64> {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        samples.clone().into_client(),
        samples.namespace()?,
        &kube::api::ApiResource::erase::<Sample>(&()),
    );
    let object = api.get_opt(name).await.ok()??;
    object.data["status"]["available"].as_i64()
}

/// The replicas of Deployment `name` (a Sample's), if it exists.
pub async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

/// Every status a Sample is seen with, by a watch, and every error of that
/// watch: after an error the watch lists again, and the statuses written
/// meanwhile are never seen, so a test reading them fails instead.
#[derive(Clone, Default)]
pub struct Statuses {
    seen: Arc<Mutex<Vec<CommonStatus>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Statuses {
    /// The statuses seen so far, in order; fails the test if the watch
    /// failed (some may be missing), naming the errors.
    pub fn all(&self) -> Vec<CommonStatus> {
        let errors = self.errors.lock().unwrap().clone();
        assert!(
            errors.is_empty(),
            "the watch recording the Sample's statuses failed, so some may be missing: {}",
            errors.join("; ")
        );
        self.seen.lock().unwrap().clone()
    }
}

/// Every status the Sample `name` in `samples` is seen with from now on,
/// collected by a watch that is running when this returns.
pub async fn record_statuses(samples: &Api<Sample>, name: &str) -> Statuses {
    let record = Statuses::default();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(samples.clone(), config);
    let (listed, ready) = tokio::sync::oneshot::channel();
    let recorded = record.clone();
    tokio::spawn(async move {
        futures::pin_mut!(events);
        let mut listed = Some(listed);
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    listed.take().map(|l| l.send(()));
                }
                Ok(watcher::Event::Apply(sample) | watcher::Event::InitApply(sample)) => {
                    let status = sample.status.unwrap_or_default();
                    recorded.seen.lock().unwrap().push(status);
                }
                Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {}
                Err(error) => recorded.errors.lock().unwrap().push(error.to_string()),
            }
        }
    });
    ready.await.expect("the watch of the Sample listed");
    record
}
