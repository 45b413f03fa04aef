//! What a rule's plan depends on, read from the cluster (or, for `render`,
//! from the documents that follow the rule in the file).
//!
//! Reads, per reconcile:
//! - the namespaces (one list; a second, label-selected, when the operator
//!   restricts targets with `--copyrator-namespace-selector`);
//! - the rule's copies, by their marker label across all namespaces (or, with
//!   `--copyrator-namespaces`, in each of those): for the rule's kind read
//!   in pages and kept as fingerprints (to detect drift without holding
//!   their data), metadata only for the other kind (copies left from an
//!   earlier `ruleType`);
//! - then the sources: ConfigMaps or Secrets in the rule's namespace matching
//!   the selector and carrying no copy marker (label-selected), measured
//!   page by page against the rule's share of `--copyrator-max-bytes` (the
//!   cap over the number of target namespaces) before they are held: a rule
//!   over it is `TooLarge` having held one page at a time
//!   ([`paging`], [`budget`](super::budget));
//! - only where a wanted copy is not among them: the names of the objects of
//!   that kind in that namespace, metadata only, to find same-named objects
//!   the rule did not create.
//!
//! Secret data is read only from the sources and from the rule's own copies
//! (and of those, only digests are kept). The types it fills
//! ([`inputs`](super::inputs)) keep it out of `Debug` output.

use std::collections::{BTreeMap, BTreeSet};

use futures::{AsyncReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ListParams, ObjectMeta};
use kube::core::{ObjectList, PartialObjectMeta};
use kube::{Api, Client};

use super::budget::{Budget, PAGE_BYTES};
use super::inputs::{NamespaceState, Object, Observed, object};
use super::marker;
use super::paging::{self, Page, PageError, ReadError};
use super::plan;
use super::resource::{ResolvedRule, RuleType};
use super::scope::Scope;
use crate::kind::{HandlerError, Reason};
use crate::kinds::namespaced_api;

/// Parallel metadata lists when looking for same-named objects.
const LIST_CONCURRENCY: usize = 8;

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

fn api_error(what: &str, e: kube::Error) -> HandlerError {
    HandlerError::transient(
        Reason::ApiError,
        format!("cannot list {what}: {}", crate::error_text::kube(&e)),
    )
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

/// Reads one page of `K` in `namespace` (all when `None`) matching
/// `selector`, its response capped at [`PAGE_BYTES`]; returns it with the
/// bytes the response took. `what` names them in errors, which never quote
/// the response (it may hold Secret data).
async fn fetch_page<K>(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    token: Option<String>,
    limit: u32,
    what: &str,
) -> Result<(ObjectList<K>, usize), PageError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let failed = |message: String| {
        PageError::Failed(HandlerError::transient(
            Reason::ApiError,
            format!("cannot list {what}: {message}"),
        ))
    };
    let api: Api<K> = namespaced_api(client.clone(), namespace);
    let mut params = ListParams::default().labels(selector).limit(limit);
    if let Some(token) = &token {
        params = params.continue_token(token);
    }
    let request = kube::core::Request::new(api.resource_url())
        .list(&params)
        .map_err(|e| failed(e.to_string()))?;
    let reader = client
        .request_stream(request)
        .await
        .map_err(|e| failed(crate::error_text::kube(&e)))?;
    let mut body = Vec::new();
    let cap = u64::try_from(PAGE_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    Box::pin(reader)
        .take(cap)
        .read_to_end(&mut body)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if body.len() > PAGE_BYTES {
        return Err(PageError::TooBig);
    }
    let list = serde_json::from_slice(&body).map_err(|e| {
        failed(format!(
            "unexpected response (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    Ok((list, body.len()))
}

fn page<K: Clone>(list: ObjectList<K>, bytes: usize) -> Page
where
    Object: From<K>,
{
    Page {
        objects: list.items.into_iter().map(Object::from).collect(),
        bytes,
        next: list.metadata.continue_.filter(|t| !t.is_empty()),
    }
}

/// One page of objects of `kind`, in full.
async fn page_of(
    client: &Client,
    kind: RuleType,
    namespace: Option<&str>,
    selector: &str,
    token: Option<String>,
    limit: u32,
) -> Result<Page, PageError> {
    Ok(match kind {
        RuleType::Configmap => {
            let (list, bytes) =
                fetch_page::<ConfigMap>(client, namespace, selector, token, limit, "configmaps")
                    .await?;
            page(list, bytes)
        }
        RuleType::Secret => {
            let (list, bytes) =
                fetch_page::<Secret>(client, namespace, selector, token, limit, "secrets").await?;
            page(list, bytes)
        }
    })
}

/// The rule's copies of `kind` in `namespace` (all when `None`), as
/// fingerprints.
async fn read_copies(
    client: &Client,
    budget: &Budget,
    kind: RuleType,
    namespace: Option<&str>,
    selector: &str,
) -> Result<Vec<Object>, HandlerError> {
    let fetch = |token, limit| page_of(client, kind, namespace, selector, token, limit);
    paging::read_copies(&fetch, budget)
        .await
        .map_err(|e| match e {
            ReadError::Failed(e) => e,
            other => HandlerError::transient(
                Reason::ApiError,
                format!("cannot read the rule's copies: {other}"),
            ),
        })
}

/// The most content bytes a rule's sources may hold: the cap shared by the
/// target namespaces (a rule with none yet gets the whole cap, as if it had
/// one).
pub fn source_limit(max_bytes: usize, targets: usize) -> usize {
    max_bytes / targets.max(1)
}

/// Why reading a rule's sources stopped, as the reconcile reports it.
fn sources_error(e: ReadError, targets: usize, max_bytes: usize) -> HandlerError {
    match e {
        ReadError::Over(tally) => HandlerError::TooLarge(too_large(&tally, targets, max_bytes)),
        ReadError::Budget(e @ super::budget::BudgetError::Exceeds { .. }) => {
            HandlerError::TooLarge(format!("the rule's sources, while read, take {e}"))
        }
        ReadError::ObjectTooBig => HandlerError::TooLarge(format!(
            "a source takes more than {PAGE_BYTES} bytes as JSON, more than the operator reads at once"
        )),
        ReadError::Failed(e) => e,
        other @ (ReadError::Changed | ReadError::Budget(_)) => HandlerError::transient(
            Reason::ApiError,
            format!("cannot read the sources: {other}"),
        ),
    }
}

/// The `TooLarge` message of a rule whose sources went over their limit.
pub fn too_large(tally: &paging::Tally, targets: usize, max_bytes: usize) -> String {
    let read = format!(
        "the rule's sources hold more than {} bytes (the first {} hold {} bytes already)",
        tally.limit, tally.objects, tally.bytes
    );
    if targets == 0 {
        format!(
            "{read}: more than the operator allows one rule to copy into even one namespace ({max_bytes} bytes, --copyrator-max-bytes)"
        )
    } else {
        format!(
            "{read} and it copies into {targets} namespace(s): more than the {max_bytes} bytes of copies the operator allows one rule (--copyrator-max-bytes)"
        )
    }
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

/// Reads what the plan of `rule` needs from the cluster, within the
/// operator's read `budget` (module docs).
pub async fn observe(
    client: &Client,
    rule: &ResolvedRule,
    namespace_selector: Option<&str>,
    rails: &plan::Rails,
    budget: &Budget,
) -> Result<Observed, HandlerError> {
    let scope = &rails.scope;
    let kind = rule.rule_type;
    let copies_selector = format!(
        "{}={}",
        marker::RULE,
        marker::rule_label(&rule.namespace, &rule.name)
    );
    let copies_params = ListParams::default().labels(&copies_selector);
    let (namespaces, copies, other_copies) = futures::try_join!(
        namespaces(client, namespace_selector),
        list_in_scope(scope, |ns| {
            let selector = copies_selector.as_str();
            async move { read_copies(client, budget, kind, ns.as_deref(), selector).await }
        }),
        list_in_scope(scope, |ns| {
            let params = &copies_params;
            async move { list_meta(client, kind.other(), ns.as_deref(), params).await }
        }),
    )?;
    let mut observed = Observed {
        namespaces,
        copies,
        ..Observed::default()
    };
    // The sources last, holding nothing else of the budget meanwhile.
    let targets = plan::target_count(rule, &observed.namespaces, rails);
    let sources_selector = source_selector(&rule.selector);
    let fetch = |token, limit| {
        page_of(
            client,
            kind,
            Some(&rule.namespace),
            &sources_selector,
            token,
            limit,
        )
    };
    let sources = paging::read_sources(&fetch, budget, source_limit(rails.max_bytes, targets))
        .await
        .map_err(|e| sources_error(e, targets, rails.max_bytes))?;
    observed.sources = sources.objects;
    observed.hold = Some(sources.hold);
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
            observed.copies.push(obj.fingerprinted());
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
    use crate::kinds::copyrator::inputs::{Content, Fingerprint};

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
    fn a_rules_share_of_the_cap_is_split_over_its_targets() {
        assert_eq!(source_limit(32, 4), 8);
        assert_eq!(source_limit(32, 0), 32, "no target yet: as if one");
        // The same decision as the plan's: sources × targets over the cap.
        for targets in 1..7 {
            for bytes in 0..40 {
                assert_eq!(
                    bytes > source_limit(32, targets),
                    bytes * targets > 32,
                    "{bytes} bytes x {targets} targets"
                );
            }
        }
    }

    #[test]
    fn the_too_large_message_names_the_flag_and_where_reading_stopped() {
        let tally = paging::Tally {
            limit: 1024,
            bytes: 4096,
            objects: 1,
        };
        let message = too_large(&tally, 3, 3072);
        for part in [
            "more than 1024 bytes",
            "the first 1 hold 4096 bytes already",
            "3 namespace(s)",
            "--copyrator-max-bytes",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
        assert!(too_large(&tally, 0, 1024).contains("even one namespace"));
    }

    #[test]
    fn a_fingerprint_tells_drift_without_the_data() {
        let content = |pairs: &[(&str, &str)], type_: Option<&str>| Content {
            data: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            binary_data: BTreeMap::new(),
            type_: type_.map(str::to_string),
        };
        let copy = Fingerprint::of(&content(&[("a", "1"), ("extra", "x")], Some("Opaque")));
        assert!(
            copy.holds(&content(&[("a", "1")], None)),
            "extra keys are not drift"
        );
        assert!(copy.holds(&content(&[("a", "1")], Some("Opaque"))));
        assert!(
            !copy.holds(&content(&[("a", "2")], None)),
            "a changed value"
        );
        assert!(!copy.holds(&content(&[("b", "1")], None)), "a missing key");
        assert!(!copy.holds(&content(&[("a", "1")], Some("kubernetes.io/tls"))));
        let debug = format!("{copy:?}");
        assert!(
            debug.contains("extra") && !debug.contains("\"x\""),
            "{debug}"
        );

        let mut obj = Object::new(RuleType::Configmap, "t1", "a");
        obj.content = Some(content(&[("a", "secret-value")], None));
        let read = obj.clone().fingerprinted();
        assert!(read.content.is_none(), "the data is not kept");
        assert_eq!(read.fingerprint(), obj.fingerprint());
        assert_eq!(obj.content_bytes(), "a".len() + "secret-value".len());
        assert_eq!(read.content_bytes(), 0);
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
