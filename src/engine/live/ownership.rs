//! Looking at the live objects a resource is about to apply or delete: who
//! owns them. The engine never applies over, and never deletes, an object
//! that does not carry the resource's marker (unless the kind explicitly
//! adopts it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Api, Client};
use tokio::sync::OnceCell;

use crate::engine::model::inventory::{ObjectId, Owner, describe_owner};

/// Parallel reads when looking at live objects.
const CONCURRENCY: usize = 16;

/// How the API serves one kind of object.
#[derive(Debug, Clone)]
pub(crate) struct ApiKind {
    /// Group, version, plural.
    pub resource: ApiResource,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl ApiKind {
    /// How kubectl names an object of this kind in a command: `deployments.apps/web`.
    pub fn kubectl_arg(&self, name: &str) -> String {
        match self.resource.group.as_str() {
            "" => format!("{}/{name}", self.resource.plural),
            group => format!("{}.{group}/{name}", self.resource.plural),
        }
    }
}

/// A group, version and kind.
type Gvk = (String, String, String);

/// How the API serves each kind, once asked (an empty cell: being asked).
type Table = HashMap<Gvk, Arc<OnceCell<Arc<ApiKind>>>>;

/// Discovery, cached per group, version and kind until forgotten (a kind
/// served or stopped forgets its group; an API path found not served
/// forgets its kind). Concurrent lookups of one kind share one request:
/// an operator starting with thousands of resources asks once, not once
/// per resource. A clone shares the cache.
#[derive(Debug, Default, Clone)]
pub(crate) struct Discovery {
    cache: Arc<Mutex<Table>>,
}

impl Discovery {
    /// How the API serves `id`'s kind.
    pub async fn resolve(
        &self,
        client: &Client,
        id: &ObjectId,
    ) -> Result<Arc<ApiKind>, kube::Error> {
        let key = (
            id.group().to_string(),
            id.version().to_string(),
            id.kind.clone(),
        );
        let cell = crate::sync::lock(&self.cache)
            .entry(key)
            .or_default()
            .clone();
        // A failed lookup leaves the cell empty: the next one asks again.
        cell.get_or_try_init(|| ask(client, id))
            .await
            .map(Arc::clone)
    }

    /// Forgets how the API serves `id`'s kind: the next lookup asks again.
    pub fn forget(&self, id: &ObjectId) {
        self.forget_kind(id.group(), id.version(), &id.kind);
    }

    /// Forgets how the API serves the kind `kind` of `group`/`version`.
    pub fn forget_kind(&self, group: &str, version: &str, kind: &str) {
        crate::sync::lock(&self.cache)
            .retain(|(g, v, k), _| (g.as_str(), v.as_str(), k.as_str()) != (group, version, kind));
    }

    /// Forgets every kind of the API group `group` (a CRD of it changed).
    pub fn forget_group(&self, group: &str) {
        crate::sync::lock(&self.cache).retain(|(g, _, _), _| g != group);
    }
}

/// Asks the API server how it serves `id`'s kind.
async fn ask(client: &Client, id: &ObjectId) -> Result<Arc<ApiKind>, kube::Error> {
    let gvk = GroupVersionKind::gvk(id.group(), id.version(), &id.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    Ok(Arc::new(ApiKind {
        resource,
        namespaced: caps.scope == Scope::Namespaced,
    }))
}

/// What a live object is to the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It does not exist.
    Absent,
    /// It carries the resource's marker.
    Ours,
    /// It lacks the marker, but the kind adopts it (only ever in the
    /// owner's own namespace, and only on apply: the apply stamps the
    /// marker, and until then it is not the owner's to delete).
    Adopted,
    /// It belongs to someone else (who, in words).
    Foreign(String),
}

/// One object, looked at.
#[derive(Debug, Clone)]
pub(crate) struct Inspected {
    /// The object (namespace dropped when its kind is cluster-scoped).
    pub id: ObjectId,
    /// How the API serves it.
    pub served: Arc<ApiKind>,
    /// What it is to the resource.
    pub verdict: Verdict,
    /// The live object's UID (`None` when absent): a delete carries it as
    /// a precondition.
    pub uid: Option<String>,
}

/// An object that could not be looked at: which, and what the API server
/// said.
#[derive(Debug, thiserror::Error)]
#[error("{}", crate::error_text::about(.id, .source))]
pub(crate) struct Unreadable {
    /// The object.
    pub id: ObjectId,
    /// Why.
    pub source: kube::Error,
}

/// Looks at each of `ids` (metadata only, in parallel).
pub(crate) async fn inspect(
    client: &Client,
    discovery: &Discovery,
    owner: &Owner,
    ids: impl IntoIterator<Item = ObjectId>,
    adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<Vec<Inspected>, Unreadable> {
    futures::stream::iter(ids)
        .map(|id| inspect_one(client, discovery, owner, id, adopts))
        .buffered(CONCURRENCY)
        .try_collect()
        .await
}

/// Looks at one object; when the API server serves nothing at the path
/// discovery gave (the kind's CRD was created again with another scope,
/// or lost the version), asks discovery again and looks once more.
async fn inspect_one(
    client: &Client,
    discovery: &Discovery,
    owner: &Owner,
    id: ObjectId,
    adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<Inspected, Unreadable> {
    let looked = match look(client, discovery, owner, id.clone(), adopts).await {
        Err(e) if crate::error_text::path_not_served(&e) => {
            discovery.forget(&id);
            look(client, discovery, owner, id.clone(), adopts).await
        }
        looked => looked,
    };
    looked.map_err(|source| Unreadable { id, source })
}

async fn look(
    client: &Client,
    discovery: &Discovery,
    owner: &Owner,
    mut id: ObjectId,
    adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<Inspected, kube::Error> {
    let served = discovery.resolve(client, &id).await?;
    if !served.namespaced {
        id.namespace = None;
    }
    let api: Api<DynamicObject> = match (&id.namespace, served.namespaced) {
        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &served.resource),
        _ => Api::all_with(client.clone(), &served.resource),
    };
    let at_home = owner.namespace.is_some() && id.namespace == owner.namespace;
    let never = |_: &ObjectMeta| false;
    let adopts = if at_home { adopts } else { &never };
    let (verdict, uid) = match api.get_metadata_opt(&id.name).await? {
        None => (Verdict::Absent, None),
        Some(live) => (verdict(owner, &live.metadata, adopts), live.metadata.uid),
    };
    Ok(Inspected {
        id,
        served,
        verdict,
        uid,
    })
}

/// What a live object with `meta` is to `owner`.
pub(crate) fn verdict(
    owner: &Owner,
    meta: &ObjectMeta,
    adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Verdict {
    if owner.marks(meta) {
        Verdict::Ours
    } else if adopts(meta) {
        Verdict::Adopted
    } else {
        Verdict::Foreign(describe_owner(meta))
    }
}

/// The conflict message for the foreign objects among `inspected`, if any.
pub(crate) fn conflicts(inspected: &[Inspected], owner_kind: &str) -> Option<String> {
    let foreign: Vec<String> = inspected
        .iter()
        .filter_map(|i| match &i.verdict {
            Verdict::Foreign(who) => Some(format!("{} exists, {who}", i.id)),
            _ => None,
        })
        .collect();
    if foreign.is_empty() {
        return None;
    }
    let shown = crate::text::first_names(&foreign, 5, "; ");
    Some(format!(
        "{shown}: this {owner_kind} does not take over objects it did not create; nothing was applied"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            api_version: "nuvolaris.org/v1".into(),
            kind: "Sample".into(),
            namespace: Some("h2".into()),
            name: "victim".into(),
            uid: "u-1".into(),
        }
    }

    fn meta(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_marker_or_an_explicit_adoption_makes_an_object_ours() {
        let never = |_: &ObjectMeta| false;
        let legacy = |m: &ObjectMeta| {
            m.labels
                .as_ref()
                .is_some_and(|l| l.get("legacy").is_some_and(|v| v == "victim"))
        };
        let o = owner();
        let ours = meta(&[(crate::engine::model::inventory::Owner::LABEL, "u-1")]);
        assert_eq!(verdict(&o, &ours, &never), Verdict::Ours);
        let theirs = meta(&[("app", "victim")]);
        assert!(matches!(verdict(&o, &theirs, &never), Verdict::Foreign(_)));
        assert_eq!(
            verdict(&o, &meta(&[("legacy", "victim")]), &legacy),
            Verdict::Adopted
        );
        let other_owner = meta(&[(crate::engine::model::inventory::Owner::LABEL, "u-2")]);
        assert!(matches!(
            verdict(&o, &other_owner, &never),
            Verdict::Foreign(_)
        ));
    }

    #[test]
    fn the_conflict_message_names_the_object_and_its_owner() {
        let served = Arc::new(ApiKind {
            resource: ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
            namespaced: true,
        });
        let id = ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("h2".into()),
            name: "victim".into(),
        };
        let inspected = vec![Inspected {
            id,
            served: served.clone(),
            verdict: Verdict::Foreign(
                "not created by this resource (written by kubectl-create)".into(),
            ),
            uid: Some("u-9".into()),
        }];
        let message = conflicts(&inspected, "Sample").unwrap();
        assert!(message.starts_with("deployment.apps/victim in h2 exists, not created by this resource (written by kubectl-create)"), "{message}");
        assert_eq!(served.kubectl_arg("victim"), "deployments.apps/victim");
        assert!(conflicts(&[], "Sample").is_none());
    }

    /// A client whose API server answers every request with the `apps/v1`
    /// resource list after a moment, counting the requests.
    fn slow_discovery_server(asked: Arc<std::sync::atomic::AtomicUsize>) -> Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let list = serde_json::json!({
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": "apps/v1",
                    "resources": [{
                        "name": "deployments", "singularName": "deployment",
                        "namespaced": true, "kind": "Deployment", "verbs": ["get", "list"],
                    }],
                });
                let body = kube::client::Body::from(list.to_string().into_bytes());
                Ok::<_, std::convert::Infallible>(http::Response::new(body))
            }
        });
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn concurrent_lookups_of_one_kind_ask_the_api_server_once() {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = slow_discovery_server(asked.clone());
        let discovery = Discovery::default();
        let id = ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("default".into()),
            name: "web".into(),
        };
        let lookups = (0..50).map(|_| discovery.resolve(&client, &id));
        let served = futures::future::join_all(lookups).await;
        assert!(
            served
                .iter()
                .all(|s| s.as_ref().is_ok_and(|s| s.namespaced))
        );
        assert_eq!(served[0].as_ref().unwrap().resource.plural, "deployments");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_forgotten_kind_or_group_is_asked_again() {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = slow_discovery_server(asked.clone());
        let discovery = Discovery::default();
        let id = ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("default".into()),
            name: "web".into(),
        };
        let count = || asked.load(std::sync::atomic::Ordering::SeqCst);
        discovery.resolve(&client, &id).await.unwrap();
        discovery.forget_group("batch");
        discovery.resolve(&client, &id).await.unwrap();
        assert_eq!(count(), 1, "another group forgotten: still known");
        discovery.forget(&id);
        discovery.resolve(&client, &id).await.unwrap();
        assert_eq!(count(), 2);
        discovery.clone().forget_group("apps");
        discovery.resolve(&client, &id).await.unwrap();
        assert_eq!(count(), 3, "a clone shares the cache");
    }

    #[test]
    fn an_unreadable_object_is_named_with_its_kind() {
        let unreadable = Unreadable {
            id: ObjectId {
                api_version: "platform.example.com/v1".into(),
                kind: "TenantApplication".into(),
                namespace: Some("team-a".into()),
                name: "web".into(),
            },
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("404 page not found", "Failed to parse error data")
                    .with_code(404),
            )),
        };
        let message = unreadable.to_string();
        assert!(
            message.starts_with("tenantapplication.platform.example.com/web in team-a: the API server does not serve this kind at this path (404 page not found)"),
            "{message}"
        );
    }
}
