//! What triggers a rule's reconcile besides the rule itself. All watches are
//! metadata-only: the operator never receives the data of Secrets it does
//! not copy.
//!
//! - ConfigMaps and Secrets where rules live (the watched namespace, or all):
//!   a change to any of them may add, change or remove a source of the rules
//!   of that kind in that namespace (a removed label, too: so every such rule
//!   is told, not only the ones whose selector still matches);
//! - copies, by their marker label, in every namespace: a copy changed or
//!   deleted by someone else is put back by its rule (named by the marker);
//! - objects a rule reported as foreign: when one goes, the copy can be made;
//! - Namespaces (those matching `--copyrator-namespace-selector`): created,
//!   relabelled or terminating; every rule that targets all namespaces or
//!   lists that one.
//!
//! With `--copyrator-namespaces`, ConfigMaps and Secrets are watched in each
//! of those namespaces instead (all of them there: sources, copies and
//! foreign objects alike), and nowhere else.

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

use super::marker;
use super::resource::{CopyratorRule, RuleType};
use super::scope::Scope;
use crate::kind::Watching;
use crate::kinds::namespaced_api;

/// The rule's triggers: a stream of the rules each watch's events concern.
pub fn nudges(
    watching: Watching<CopyratorRule>,
    namespace_selector: Option<&str>,
    scope: &Scope,
) -> Vec<BoxStream<'static, ObjectRef<CopyratorRule>>> {
    let client = watching.client.clone();
    let namespace = watching.namespace.as_deref();
    let mut nudges = Vec::new();
    for ns in scope.call_namespaces(namespace) {
        nudges.push(objects(
            namespaced_api::<PartialObjectMeta<ConfigMap>>(client.clone(), ns),
            watcher::Config::default(),
            watching.clone(),
            RuleType::Configmap,
        ));
        nudges.push(objects(
            namespaced_api::<PartialObjectMeta<Secret>>(client.clone(), ns),
            watcher::Config::default(),
            watching.clone(),
            RuleType::Secret,
        ));
    }
    if namespace.is_some() && *scope == Scope::All {
        // Copies live outside the watched namespace.
        let copies = watcher::Config::default().labels(marker::RULE);
        nudges.push(objects(
            Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
            copies.clone(),
            watching.clone(),
            RuleType::Configmap,
        ));
        nudges.push(objects(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            copies,
            watching.clone(),
            RuleType::Secret,
        ));
    }
    let config = match namespace_selector {
        Some(sel) => watcher::Config::default().labels(sel),
        None => watcher::Config::default(),
    };
    let namespaces = Api::<PartialObjectMeta<Namespace>>::all(client);
    let rules = watching.clone();
    nudges.push(touched(namespaces, config, move |ns| {
        rules_for_namespace(&rules.resources(), &ns.name_any())
    }));
    nudges
}

/// The rules each event on the ConfigMaps or Secrets of `api` concerns.
fn objects<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    rules: Watching<CopyratorRule>,
    kind: RuleType,
) -> BoxStream<'static, ObjectRef<CopyratorRule>>
where
    PartialObjectMeta<K>: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    touched(api, config, move |obj| {
        rules_for_object(&rules.resources(), kind, &obj.metadata)
    })
}

/// The resources `concerned` names for each object of `api` touched
/// (created, changed or deleted), as nudges.
fn touched<K>(
    api: Api<K>,
    config: watcher::Config,
    concerned: impl Fn(K) -> Vec<ObjectRef<CopyratorRule>> + Send + 'static,
) -> BoxStream<'static, ObjectRef<CopyratorRule>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    watcher::watcher(api, config)
        .default_backoff()
        .touched_objects()
        .filter_map(|obj| std::future::ready(obj.ok()))
        .flat_map(move |obj| stream::iter(concerned(obj)))
        .boxed()
}

/// The rules an event on a ConfigMap or Secret concerns.
pub fn rules_for_object(
    rules: &[Arc<CopyratorRule>],
    kind: RuleType,
    meta: &ObjectMeta,
) -> Vec<ObjectRef<CopyratorRule>> {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let copy_of = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(marker::RULE))
        .and_then(|r| r.split_once('/'));
    let is_copy = copy_of.is_some()
        || meta
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(marker::RULE));
    let mut refs = Vec::new();
    for rule in rules.iter().filter(|r| !is_deleting(r)) {
        let rule_ns = rule.namespace().unwrap_or_default();
        let rule_name = rule.name_any();
        let concerned = if is_copy {
            copy_of == Some((rule_ns.as_str(), rule_name.as_str()))
        } else {
            (rule_ns == namespace && rule.rule_type() == Some(kind))
                || reported_foreign(rule, namespace, name)
        };
        if concerned {
            refs.push(ObjectRef::from_obj(rule.as_ref()));
        }
    }
    refs
}

fn reported_foreign(rule: &CopyratorRule, namespace: &str, name: &str) -> bool {
    rule.status.as_ref().is_some_and(|s| {
        s.copies
            .targets
            .iter()
            .any(|t| t.namespace == namespace && t.foreign.iter().any(|f| f == name))
    })
}

/// A rule being deleted is reconciled by its own events only: its cleanup
/// deletes copies, and their events must not run the cleanup again.
fn is_deleting(rule: &CopyratorRule) -> bool {
    rule.metadata.deletion_timestamp.is_some()
}

/// The rules an event on a Namespace concerns: those targeting every
/// namespace and those listing it.
pub fn rules_for_namespace(
    rules: &[Arc<CopyratorRule>],
    namespace: &str,
) -> Vec<ObjectRef<CopyratorRule>> {
    rules
        .iter()
        .filter(|r| !is_deleting(r))
        .filter(|r| {
            let listed = r.listed_namespaces();
            listed.is_empty() || listed.iter().any(|n| n == namespace)
        })
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::copyrator::resource::{
        CopiesStatus, CopyratorRuleSpec, CopyratorRuleStatus, TargetStatus,
    };
    use std::collections::BTreeMap;

    fn rule(ns: &str, name: &str, kind: RuleType, namespaces: &[&str]) -> Arc<CopyratorRule> {
        let mut r = CopyratorRule::new(
            name,
            CopyratorRuleSpec {
                rule_type: Some(kind),
                selector: Some(BTreeMap::from([("copy".into(), "yes".into())])),
                namespaces: Some(namespaces.iter().map(|s| s.to_string()).collect()),
                deletion_policy: None,
            },
        );
        r.metadata.namespace = Some(ns.into());
        Arc::new(r)
    }

    fn meta(ns: &str, name: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn names(refs: Vec<ObjectRef<CopyratorRule>>) -> Vec<String> {
        refs.into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    #[test]
    fn a_source_event_concerns_the_rules_of_its_kind_in_its_namespace() {
        let rules = [
            rule("src", "cm", RuleType::Configmap, &[]),
            rule("src", "sec", RuleType::Secret, &[]),
            rule("other", "cm", RuleType::Configmap, &[]),
        ];
        let got = rules_for_object(&rules, RuleType::Configmap, &meta("src", "app", &[]));
        assert_eq!(names(got), ["src/cm"]);
    }

    #[test]
    fn a_copy_event_concerns_the_rule_its_marker_names() {
        let rules = [
            rule("src", "cm", RuleType::Configmap, &[]),
            rule("t1", "cm", RuleType::Configmap, &[]),
        ];
        let copy = meta("t1", "app", &[(marker::RULE, "src/cm")]);
        assert_eq!(
            names(rules_for_object(&rules, RuleType::Configmap, &copy)),
            ["src/cm"]
        );
        let unknown = meta("t1", "app", &[(marker::RULE, "gone/rule")]);
        assert!(rules_for_object(&rules, RuleType::Configmap, &unknown).is_empty());
    }

    #[test]
    fn events_do_not_concern_a_rule_being_deleted() {
        let mut deleting = (*rule("src", "cm", RuleType::Configmap, &[])).clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        let rules = [Arc::new(deleting)];
        let copy = meta("t1", "app", &[(marker::RULE, "src/cm")]);
        assert!(rules_for_object(&rules, RuleType::Configmap, &copy).is_empty());
        assert!(rules_for_object(&rules, RuleType::Configmap, &meta("src", "a", &[])).is_empty());
        assert!(rules_for_namespace(&rules, "t1").is_empty());
    }

    #[test]
    fn a_reported_foreign_object_concerns_its_rule() {
        let mut r = (*rule("src", "cm", RuleType::Configmap, &["t1"])).clone();
        r.status = Some(CopyratorRuleStatus {
            copies: CopiesStatus {
                targets: vec![TargetStatus {
                    namespace: "t1".into(),
                    result: "Conflict".into(),
                    foreign: vec!["app".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        });
        let rules = [Arc::new(r)];
        let got = rules_for_object(&rules, RuleType::Configmap, &meta("t1", "app", &[]));
        assert_eq!(names(got), ["src/cm"]);
        assert!(
            rules_for_object(&rules, RuleType::Configmap, &meta("t1", "other", &[])).is_empty()
        );
    }

    #[test]
    fn a_namespace_event_concerns_rules_targeting_all_or_listing_it() {
        let rules = [
            rule("src", "all", RuleType::Configmap, &[]),
            rule("src", "listed", RuleType::Configmap, &["t1", "t2"]),
            rule("src", "elsewhere", RuleType::Configmap, &["t3"]),
        ];
        assert_eq!(
            names(rules_for_namespace(&rules, "t2")),
            ["src/all", "src/listed"]
        );
    }
}
