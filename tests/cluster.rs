//! The foundation: the cluster in KUBECONFIG accepts `kubectl apply -k` of a
//! base from `kustomize/`, and the kube client reads the result back.

mod common;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::DeleteParams;

#[tokio::test]
async fn kubectl_apply_k_of_a_base_is_readable_with_the_client() {
    let client = cluster_or_skip!();
    let ns = common::TestNamespace::new(&client, "base").await;
    let base = common::repo().join("kustomize/sample/base");
    let (ok, out, err) =
        common::kubectl(&["apply", "-n", &ns.name, "-k", &base.display().to_string()]);
    assert!(ok, "kubectl apply -k failed: {err}");
    assert!(out.contains("deployment.apps/nginx created"), "{out}");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let d = deployments.get("nginx").await.expect("deployment exists");
    assert_eq!(d.spec.unwrap().replicas, Some(1));

    deployments
        .delete("nginx", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(std::time::Duration::from_secs(30), || async {
        deployments.get_opt("nginx").await.unwrap().is_none()
    })
    .await;
}
