//! What a rule's plan depends on, read from the cluster (or, for `render`,
//! from the documents that follow the rule in the file).
//!
//! Reads, per reconcile:
//! - the sources: ConfigMaps or Secrets in the rule's namespace matching the
//!   selector and carrying no copy marker (one list, label-selected);
//! - the namespaces (one list; a second, label-selected, when the operator
//!   restricts targets with `--copyrator-namespace-selector`);
//! - the rule's copies, by their marker label across all namespaces (or, with
//!   `--copyrator-namespaces`, in each of those): in full for the rule's kind
//!   (to detect drift), metadata only for the other kind (copies left from an
//!   earlier `ruleType`);
//! - only where a wanted copy is not among them: the names of the objects of
//!   that kind in that namespace, metadata only, to find same-named objects
//!   the rule did not create.
//!
//! Secret data is read only from the sources and from the rule's own copies.
//! The types here keep it out of `Debug` output.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, ObjectMeta};
use kube::core::PartialObjectMeta;
use kube::{Api, Client};

use super::marker;
use super::plan;
use super::resource::{ResolvedRule, RuleType};
use super::scope::Scope;
use crate::kind::{HandlerError, Reason, namespaced_api};

/// Parallel metadata lists when looking for same-named objects.
const LIST_CONCURRENCY: usize = 8;

/// A ConfigMap or Secret, reduced to what the plan needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    /// ConfigMap or Secret.
    pub kind: RuleType,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its copyrator marker annotations (other annotations are not kept).
    pub annotations: BTreeMap<String, String>,
    /// Its content; `None` when read as metadata only.
    pub content: Option<Content>,
}

/// The content of a ConfigMap or Secret. `Debug` shows key names only.
#[derive(Clone, Default, PartialEq)]
pub struct Content {
    /// ConfigMap `data` (text), or Secret `data` (base64, as in the API).
    pub data: BTreeMap<String, String>,
    /// ConfigMap `binaryData` (base64).
    pub binary_data: BTreeMap<String, String>,
    /// Secret `type`.
    pub type_: Option<String>,
}

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Content")
            .field("data_keys", &self.data.keys().collect::<Vec<_>>())
            .field(
                "binary_data_keys",
                &self.binary_data.keys().collect::<Vec<_>>(),
            )
            .field("type", &self.type_)
            .finish()
    }
}

/// A namespace as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceState {
    /// Its name.
    pub name: String,
    /// Phase `Active` (not `Terminating`).
    pub active: bool,
    /// It matches the operator's namespace selector (always true without one).
    pub eligible: bool,
}

/// Everything the plan of one rule depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Matching sources in the rule's namespace.
    pub sources: Vec<Object>,
    /// Every namespace.
    pub namespaces: Vec<NamespaceState>,
    /// Objects of either kind carrying the rule's marker label.
    pub copies: Vec<Object>,
    /// `(namespace, name)` of objects of the rule's kind found in target
    /// namespaces (looked up only where a wanted copy is missing).
    pub existing: BTreeSet<(String, String)>,
}

/// The label selector for a rule's sources: its labels, and no copy marker
/// (a copy is never a source, so rules cannot chain).
pub fn source_selector(selector: &BTreeMap<String, String>) -> String {
    let mut parts: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.push(format!("!{}", marker::RULE));
    parts.join(",")
}

/// True when `labels` match the rule's source selector.
pub fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !labels.contains_key(marker::RULE)
        && selector
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
}

fn marker_annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(marker::PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn object(kind: RuleType, meta: &ObjectMeta, content: Option<Content>) -> Object {
    Object {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: marker_annotations(meta),
        content,
    }
}

/// Base64 strings, as the API writes byte fields.
fn base64_map(bytes: Option<BTreeMap<String, ByteString>>) -> BTreeMap<String, String> {
    bytes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| match serde_json::to_value(v) {
            Ok(serde_json::Value::String(s)) => Some((k, s)),
            _ => None,
        })
        .collect()
}

impl From<ConfigMap> for Object {
    fn from(cm: ConfigMap) -> Self {
        let content = Content {
            data: cm.data.unwrap_or_default(),
            binary_data: base64_map(cm.binary_data),
            type_: None,
        };
        object(RuleType::Configmap, &cm.metadata, Some(content))
    }
}

impl From<Secret> for Object {
    fn from(secret: Secret) -> Self {
        let content = Content {
            data: base64_map(secret.data),
            binary_data: BTreeMap::new(),
            type_: secret.type_,
        };
        object(RuleType::Secret, &secret.metadata, Some(content))
    }
}

fn api_error(what: &str, e: kube::Error) -> HandlerError {
    HandlerError::transient(Reason::ApiError, format!("cannot list {what}: {e}"))
}

/// Lists `K` in `namespace` (all when `None`); `what` names them in errors.
async fn list<K>(
    client: &Client,
    namespace: Option<&str>,
    params: &ListParams,
    what: &str,
) -> Result<Vec<K>, HandlerError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = namespaced_api(client.clone(), namespace);
    let list = api.list(params).await.map_err(|e| api_error(what, e))?;
    Ok(list.items)
}

/// Lists with `params` in every namespace of `scope`: one cluster-wide call,
/// or one call per listed namespace (in parallel).
async fn list_in_scope<F, Fut>(scope: &Scope, list: F) -> Result<Vec<Object>, HandlerError>
where
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Object>, HandlerError>>,
{
    let calls: Vec<Option<String>> = scope
        .call_namespaces(None)
        .into_iter()
        .map(|ns| ns.map(str::to_string))
        .collect();
    let found: Vec<Vec<Object>> = futures::stream::iter(calls)
        .map(list)
        .buffer_unordered(LIST_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(found.into_iter().flatten().collect())
}

/// Lists objects of `kind` in full (sources, the rule's own copies).
async fn list_full(
    client: &Client,
    kind: RuleType,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<Vec<Object>, HandlerError> {
    Ok(match kind {
        RuleType::Configmap => list::<ConfigMap>(client, namespace, params, "configmaps")
            .await?
            .into_iter()
            .map(Object::from)
            .collect(),
        RuleType::Secret => list::<Secret>(client, namespace, params, "secrets")
            .await?
            .into_iter()
            .map(Object::from)
            .collect(),
    })
}

/// Lists objects of `kind` as metadata only.
async fn list_meta(
    client: &Client,
    kind: RuleType,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<Vec<Object>, HandlerError> {
    let metas: Vec<ObjectMeta> = match kind {
        RuleType::Configmap => {
            list::<PartialObjectMeta<ConfigMap>>(client, namespace, params, "configmaps")
                .await?
                .into_iter()
                .map(|m| m.metadata)
                .collect()
        }
        RuleType::Secret => list::<PartialObjectMeta<Secret>>(client, namespace, params, "secrets")
            .await?
            .into_iter()
            .map(|m| m.metadata)
            .collect(),
    };
    Ok(metas.iter().map(|m| object(kind, m, None)).collect())
}

async fn namespaces(
    client: &Client,
    selector: Option<&str>,
) -> Result<Vec<NamespaceState>, HandlerError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let all = api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error("namespaces", e))?;
    let eligible: Option<BTreeSet<String>> = match selector {
        Some(sel) => {
            let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
            let list = api
                .list(&ListParams::default().labels(sel))
                .await
                .map_err(|e| api_error("namespaces", e))?;
            Some(
                list.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect(),
            )
        }
        None => None,
    };
    Ok(all
        .items
        .into_iter()
        .filter_map(|ns| {
            let name = ns.metadata.name?;
            let active = ns.status.and_then(|s| s.phase).as_deref() == Some("Active");
            let eligible = eligible.as_ref().is_none_or(|e| e.contains(&name));
            Some(NamespaceState {
                name,
                active,
                eligible,
            })
        })
        .collect())
}

/// Reads what the plan of `rule` needs from the cluster.
pub async fn observe(
    client: &Client,
    rule: &ResolvedRule,
    namespace_selector: Option<&str>,
    rails: &plan::Rails,
) -> Result<Observed, HandlerError> {
    let scope = &rails.scope;
    let kind = rule.rule_type;
    let sources_params = ListParams::default().labels(&source_selector(&rule.selector));
    let copies_params = ListParams::default().labels(&format!(
        "{}={}",
        marker::RULE,
        marker::rule_label(&rule.namespace, &rule.name)
    ));
    let (sources, namespaces, copies, other_copies) = futures::try_join!(
        list_full(client, kind, Some(&rule.namespace), &sources_params),
        namespaces(client, namespace_selector),
        list_in_scope(scope, |ns| {
            let params = &copies_params;
            async move { list_full(client, kind, ns.as_deref(), params).await }
        }),
        list_in_scope(scope, |ns| {
            let params = &copies_params;
            async move { list_meta(client, kind.other(), ns.as_deref(), params).await }
        }),
    )?;
    let mut observed = Observed {
        sources,
        namespaces,
        copies,
        existing: BTreeSet::new(),
    };
    // Where a wanted copy is not among the rule's copies, something else may
    // hold its name: look at that namespace's objects (names only).
    let unknown = plan::namespaces_with_unknown_names(rule, &observed, rails);
    let found: Vec<Vec<Object>> = futures::stream::iter(unknown)
        .map(|ns| async move { list_meta(client, kind, Some(&ns), &ListParams::default()).await })
        .buffer_unordered(LIST_CONCURRENCY)
        .try_collect()
        .await?;
    observed.existing = found
        .into_iter()
        .flatten()
        .map(|o| (o.namespace, o.name))
        .collect();
    observed.copies.extend(other_copies);
    Ok(observed)
}

/// The same inputs from the documents that follow the rule in a file:
/// ConfigMaps or Secrets in the rule's namespace (or without one) are the
/// candidate sources, those elsewhere are existing objects (copies when they
/// carry the rule's marker), Namespaces are the namespaces; namespaces the
/// rule lists explicitly are assumed to exist when no document describes them.
pub fn observe_offline(
    rule: &ResolvedRule,
    documents: &[serde_json::Value],
) -> Result<Observed, HandlerError> {
    let mut observed = Observed::default();
    for doc in documents {
        if doc["apiVersion"] != "v1" {
            continue;
        }
        let invalid = |e: serde_json::Error| {
            HandlerError::Invalid(format!(
                "document {} {}: {e}",
                doc["kind"].as_str().unwrap_or_default(),
                doc["metadata"]["name"].as_str().unwrap_or_default()
            ))
        };
        let mut obj = match doc["kind"].as_str() {
            Some("ConfigMap") => {
                Object::from(serde_json::from_value::<ConfigMap>(doc.clone()).map_err(invalid)?)
            }
            Some("Secret") => {
                Object::from(serde_json::from_value::<Secret>(doc.clone()).map_err(invalid)?)
            }
            Some("Namespace") => {
                let ns: Namespace = serde_json::from_value(doc.clone()).map_err(invalid)?;
                let phase = ns.status.and_then(|s| s.phase);
                observed.namespaces.push(NamespaceState {
                    name: ns.metadata.name.unwrap_or_default(),
                    active: phase.is_none_or(|p| p == "Active"),
                    eligible: true,
                });
                continue;
            }
            _ => continue,
        };
        if obj.namespace.is_empty() {
            obj.namespace = rule.namespace.clone();
        }
        if obj.kind != rule.rule_type {
            continue;
        }
        let ours = obj.annotations.get(marker::RULE)
            == Some(&marker::rule_annotation(&rule.namespace, &rule.name));
        if ours {
            observed.copies.push(obj);
        } else if obj.namespace == rule.namespace {
            if matches(&rule.selector, &obj.labels) {
                observed.sources.push(obj);
            }
        } else {
            observed
                .existing
                .insert((obj.namespace.clone(), obj.name.clone()));
        }
    }
    for listed in &rule.namespaces {
        if !observed.namespaces.iter().any(|n| &n.name == listed) {
            observed.namespaces.push(NamespaceState {
                name: listed.clone(),
                active: true,
                eligible: true,
            });
        }
    }
    Ok(observed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_selector_excludes_copies() {
        let sel = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".into(), "2".into())]);
        assert_eq!(source_selector(&sel), "a=1,b=2,!copyrator.flant.com/rule");
        let mut labels = sel.clone();
        assert!(matches(&sel, &labels));
        labels.insert(marker::RULE.into(), "x.y".into());
        assert!(!matches(&sel, &labels));
        assert!(!matches(&sel, &BTreeMap::from([("a".into(), "1".into())])));
    }

    #[test]
    fn content_debug_shows_keys_not_values() {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "n"},
            "type": "kubernetes.io/tls",
            "data": {"tls.key": "c3VwZXItc2VjcmV0"}
        }))
        .unwrap();
        let obj = Object::from(secret);
        let content = obj.content.as_ref().unwrap();
        assert_eq!(content.data["tls.key"], "c3VwZXItc2VjcmV0");
        let debug = format!("{obj:?}");
        assert!(debug.contains("tls.key"), "{debug}");
        assert!(!debug.contains("c3VwZXItc2VjcmV0"), "{debug}");
    }
}
