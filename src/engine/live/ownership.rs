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
pub(crate) struct Served {
    /// Group, version, plural.
    pub resource: ApiResource,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl Served {
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

/// Discovery, cached per group, version and kind for the life of the
/// process. Concurrent lookups of one kind share one request: an operator
/// starting with thousands of resources asks once, not once per resource.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    cache: Mutex<HashMap<Gvk, Arc<OnceCell<Arc<Served>>>>>,
}

impl Discovery {
    /// How the API serves `id`'s kind.
    pub async fn resolve(
        &self,
        client: &Client,
        id: &ObjectId,
    ) -> Result<Arc<Served>, kube::Error> {
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
}

/// Asks the API server how it serves `id`'s kind.
async fn ask(client: &Client, id: &ObjectId) -> Result<Arc<Served>, kube::Error> {
    let gvk = GroupVersionKind::gvk(id.group(), id.version(), &id.kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    Ok(Arc::new(Served {
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
    pub served: Arc<Served>,
    /// What it is to the resource.
    pub verdict: Verdict,
    /// The live object's UID (`None` when absent): a delete carries it as
    /// a precondition.
    pub uid: Option<String>,
}

/// Looks at each of `ids` (metadata only, in parallel).
pub(crate) async fn inspect(
    client: &Client,
    discovery: &Discovery,
    owner: &Owner,
    ids: impl IntoIterator<Item = ObjectId>,
    adopts: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<Vec<Inspected>, kube::Error> {
    futures::stream::iter(ids)
        .map(|id| inspect_one(client, discovery, owner, id, adopts))
        .buffered(CONCURRENCY)
        .try_collect()
        .await
}

async fn inspect_one(
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
        let ours = meta(&[(crate::engine::model::inventory::OWNER_LABEL, "u-1")]);
        assert_eq!(verdict(&o, &ours, &never), Verdict::Ours);
        let theirs = meta(&[("app", "victim")]);
        assert!(matches!(verdict(&o, &theirs, &never), Verdict::Foreign(_)));
        assert_eq!(
            verdict(&o, &meta(&[("legacy", "victim")]), &legacy),
            Verdict::Adopted
        );
        let other_owner = meta(&[(crate::engine::model::inventory::OWNER_LABEL, "u-2")]);
        assert!(matches!(
            verdict(&o, &other_owner, &never),
            Verdict::Foreign(_)
        ));
    }

    #[test]
    fn the_conflict_message_names_the_object_and_its_owner() {
        let served = Arc::new(Served {
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
}
