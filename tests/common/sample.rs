//! A typed view of the Sample, for tests: the kind itself is declared by
//! `kustomize/sample/kind.yaml` and served as dynamic objects; tests read
//! and write it through this type (kube derives the client side). Its
//! status is read as the engine's fields; [`available`] reads the one the
//! kind file maps.

use k8s_openapi::api::apps::v1::Deployment;
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
