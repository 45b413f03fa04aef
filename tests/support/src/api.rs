//! The cluster read and written through one kube client from synchronous
//! helpers, instead of a kubectl process per look: a kubectl costs about
//! 0.08 s of CPU before it sends a request (its start alone), and the
//! helpers were the largest user of the CPU in a test binary after the
//! API server.
//!
//! The client lives on a runtime of its own (one worker thread): a helper
//! called from a test's runtime hands it the work and blocks until done,
//! as waiting for a kubectl process blocked it. Tokio refuses to start a
//! runtime inside another, so the wait is `futures`' executor's.

use std::future::Future;
use std::sync::LazyLock;

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ko-test-api")
        .enable_all()
        .build()
        .expect("the helpers' runtime")
});

static CLIENT: LazyLock<Client> = LazyLock::new(|| {
    let made = futures::executor::block_on(RUNTIME.spawn(Client::try_default()));
    made.expect("the client task")
        .expect("a client from the kubeconfig")
});

/// Runs `work` with the helpers' client on their runtime; blocks until it
/// is done.
pub fn blocking<F, T>(work: impl FnOnce(Client) -> F) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let task = RUNTIME.spawn(work(CLIENT.clone()));
    futures::executor::block_on(task).expect("the API task")
}

/// The API of `resource` in `namespace` (`None`: cluster-scoped or all).
pub fn dynamic(
    client: Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client, ns, resource),
        None => Api::all_with(client, resource),
    }
}

/// The object `name` as JSON (`None` when there is none, or the read failed:
/// its error).
pub fn get(
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Value>, String> {
    let (resource, namespace, name) = owned(resource, namespace, name);
    blocking(move |client| async move {
        let api = dynamic(client, &resource, namespace.as_deref());
        let found = api.get_opt(&name).await.map_err(|e| e.to_string())?;
        Ok(found.map(|o| serde_json::to_value(o).unwrap_or_default()))
    })
}

/// Server-side apply of `object` as `manager`; `force` takes fields other
/// managers own (as `kubectl apply` of a changed manifest does).
pub fn apply(
    resource: &ApiResource,
    object: &Value,
    manager: &str,
    force: bool,
) -> Result<(), String> {
    let namespace = object["metadata"]["namespace"].as_str();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (resource, namespace, name) = owned(resource, namespace, name);
    let (object, mut params) = (object.clone(), PatchParams::apply(manager));
    params.force = force;
    blocking(move |client| async move {
        let api = dynamic(client, &resource, namespace.as_deref());
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// A JSON merge patch of the object `name`.
pub fn merge_patch(
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
    patch: Value,
) -> Result<(), String> {
    let (resource, namespace, name) = owned(resource, namespace, name);
    blocking(move |client| async move {
        let api = dynamic(client, &resource, namespace.as_deref());
        let params = PatchParams::default();
        api.patch(&name, &params, &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// Deletes the object `name` without waiting for it to go; true when the
/// deletion was accepted or there was no such object.
pub fn delete(resource: &ApiResource, namespace: Option<&str>, name: &str) -> Result<(), String> {
    let (resource, namespace, name) = owned(resource, namespace, name);
    blocking(move |client| async move {
        let api = dynamic(client, &resource, namespace.as_deref());
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// Every object of `resource` (in `namespace`, or everywhere), as JSON.
pub fn list(resource: &ApiResource, namespace: Option<&str>) -> Result<Vec<Value>, String> {
    let (resource, namespace, _) = owned(resource, namespace, "");
    blocking(move |client| async move {
        let api = dynamic(client, &resource, namespace.as_deref());
        let listed = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let items = listed.items.into_iter();
        Ok(items
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect())
    })
}

/// A core or named API group's resource, as `ApiResource`.
pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    let api_version = match group {
        "" => version.to_string(),
        _ => format!("{group}/{version}"),
    };
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version,
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

/// ConfigMaps (core/v1).
pub fn config_maps() -> ApiResource {
    resource("", "v1", "ConfigMap", "configmaps")
}

/// CustomResourceDefinitions.
pub fn crds() -> ApiResource {
    resource(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    )
}

fn owned(
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
) -> (ApiResource, Option<String>, String) {
    (
        resource.clone(),
        namespace.map(str::to_string),
        name.to_string(),
    )
}
