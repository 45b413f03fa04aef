//! What a round may hit: the Pods, Deployments and ConfigMaps of the
//! namespaces an agent may touch, reduced to the few facts a round needs.
//! Listed from the cluster by `observe`, or read from documents by `render`.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::kind::HandlerError;
use crate::kinds::namespaced_api;

/// At most this many objects of each type are considered in one round.
pub const MAX_TARGETS: usize = 20_000;
/// Page size for list calls.
const PAGE: u32 = 500;

/// A Pod a tantrum may kill.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Already being deleted.
    pub terminating: bool,
    /// In phase `Running`: only those count toward `podTolerance`.
    pub running: bool,
}

/// A Deployment cancer may scale up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeploymentTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.replicas` (the API server defaults it to 1).
    pub replicas: i32,
    /// Already being deleted.
    pub terminating: bool,
}

/// A ConfigMap ipsum may rewrite.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigMapTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `immutable: true`: never rewritten.
    pub immutable: bool,
    /// The keys of `data` (their values are never read into a plan).
    pub keys: Vec<String>,
    /// Already being deleted.
    pub terminating: bool,
}

/// Everything a round may hit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Targets {
    /// Pods (only when tantrumMode is on).
    pub pods: Vec<PodTarget>,
    /// Deployments (only when cancerMode is on).
    pub deployments: Vec<DeploymentTarget>,
    /// ConfigMaps (only when ipsumMode is on).
    pub config_maps: Vec<ConfigMapTarget>,
}

/// Which kinds of objects to list, and where.
#[derive(Debug, Clone, Copy)]
pub struct ToList<'a> {
    /// List Pods.
    pub pods: bool,
    /// List Deployments.
    pub deployments: bool,
    /// List ConfigMaps.
    pub config_maps: bool,
    /// Only this namespace (else every namespace).
    pub namespace: Option<&'a str>,
}

fn namespace_and_name(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl PodTarget {
    fn from_meta(meta: &ObjectMeta, running: bool) -> Self {
        let (namespace, name) = namespace_and_name(meta);
        Self {
            namespace,
            name,
            terminating: meta.deletion_timestamp.is_some(),
            running,
        }
    }
}

impl From<&Deployment> for DeploymentTarget {
    fn from(d: &Deployment) -> Self {
        let (namespace, name) = namespace_and_name(&d.metadata);
        Self {
            namespace,
            name,
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            terminating: d.metadata.deletion_timestamp.is_some(),
        }
    }
}

impl From<&ConfigMap> for ConfigMapTarget {
    fn from(c: &ConfigMap) -> Self {
        let (namespace, name) = namespace_and_name(&c.metadata);
        Self {
            namespace,
            name,
            immutable: c.immutable == Some(true),
            keys: c
                .data
                .as_ref()
                .map(|d| d.keys().cloned().collect())
                .unwrap_or_default(),
            terminating: c.metadata.deletion_timestamp.is_some(),
        }
    }
}

impl Targets {
    /// Lists what `wanted` asks for, keeping objects whose namespace passes `keep`.
    pub async fn list(
        client: &Client,
        wanted: ToList<'_>,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Self, kube::Error> {
        let mut targets = Self::default();
        if wanted.pods {
            let api: Api<Pod> = namespaced_api(client.clone(), wanted.namespace);
            // Only Running Pods: the article's tolerance counts running ones.
            let mut params = ListParams::default()
                .fields("status.phase=Running")
                .limit(PAGE);
            'pages: loop {
                let page = api.list_metadata(&params).await?;
                for p in &page.items {
                    if keep(p.metadata.namespace.as_deref().unwrap_or_default()) {
                        targets.pods.push(PodTarget::from_meta(&p.metadata, true));
                        if targets.pods.len() >= MAX_TARGETS {
                            break 'pages;
                        }
                    }
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
        if wanted.deployments {
            targets.deployments = list_converted::<Deployment, _>(client, wanted.namespace, &keep)
                .await?
                .iter()
                .map(DeploymentTarget::from)
                .collect();
        }
        if wanted.config_maps {
            targets.config_maps = list_converted::<ConfigMap, _>(client, wanted.namespace, &keep)
                .await?
                .iter()
                .map(ConfigMapTarget::from)
                .collect();
        }
        Ok(targets)
    }

    /// Reads targets from the documents that follow an agent in a file
    /// (for `render`): Pods, Deployments and ConfigMaps.
    pub fn from_documents(documents: &[serde_json::Value]) -> Result<Self, HandlerError> {
        let mut targets = Self::default();
        for doc in documents {
            let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
            let invalid = |e: serde_json::Error| {
                HandlerError::Invalid(format!("invalid {kind} document: {e}"))
            };
            match kind {
                "Pod" => {
                    let pod: Pod = serde_json::from_value(doc.clone()).map_err(invalid)?;
                    let running =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    targets
                        .pods
                        .push(PodTarget::from_meta(&pod.metadata, running));
                }
                "Deployment" => {
                    let d: Deployment = serde_json::from_value(doc.clone()).map_err(invalid)?;
                    targets.deployments.push(DeploymentTarget::from(&d));
                }
                "ConfigMap" => {
                    let c: ConfigMap = serde_json::from_value(doc.clone()).map_err(invalid)?;
                    targets.config_maps.push(ConfigMapTarget::from(&c));
                }
                other => {
                    return Err(HandlerError::Invalid(format!(
                        "a ChaosAgent can be rendered with Pods, Deployments and ConfigMaps after it, not {other:?}"
                    )));
                }
            }
        }
        Ok(targets)
    }
}

/// Lists every `K` (page by page, at most [`MAX_TARGETS`]) whose namespace passes `keep`.
async fn list_converted<K, F>(
    client: &Client,
    namespace: Option<&str>,
    keep: &F,
) -> Result<Vec<K>, kube::Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
    F: Fn(&str) -> bool,
{
    let api: Api<K> = namespaced_api(client.clone(), namespace);
    let mut params = ListParams::default().limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&params).await?;
        for item in page.items {
            if keep(item.meta().namespace.as_deref().unwrap_or_default()) {
                out.push(item);
                if out.len() >= MAX_TARGETS {
                    return Ok(out);
                }
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_become_targets() {
        let docs = vec![
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "d", "namespace": "a"}, "spec": {"replicas": 3,
                   "selector": {}, "template": {}}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "a"},
                   "immutable": true, "data": {"k": "v"}}),
        ];
        let t = Targets::from_documents(&docs).unwrap();
        assert_eq!(t.pods[0].name, "p");
        assert_eq!(t.deployments[0].replicas, 3);
        assert!(t.config_maps[0].immutable);
        assert_eq!(t.config_maps[0].keys, ["k"]);
    }

    #[test]
    fn other_documents_are_refused() {
        let err = Targets::from_documents(&[json!({"apiVersion": "v1", "kind": "Secret"})])
            .unwrap_err()
            .to_string();
        assert!(err.contains("Secret"), "{err}");
    }
}
