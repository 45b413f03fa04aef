//! The plan of a rule, as data (pure): one overlay holding, as whole objects,
//! the wanted copies that are missing or differ from their source, applied
//! with one `kubectl apply -k --server-side`, and, when copies are no longer
//! wanted, a label-selected `kubectl delete`.
//!
//! Which copies are wanted: every matching source, in every target namespace.
//! Targets are the listed namespaces, or (none listed) every Active namespace
//! except `kube-system`, `kube-public`, `kube-node-lease`; never the rule's
//! own namespace; with `--copyrator-namespace-selector`, only namespaces
//! matching it; with `--copyrator-namespaces`, only those. A wanted copy
//! whose name is held by an object the rule did not create (no marker naming
//! the rule) is skipped and reported.
//!
//! Each copy carries a digest of what it should hold (labels and content), so
//! a copy is up to date when it carries that digest and everything it names;
//! only copies that are not go into the overlay, so one changed source costs
//! one apply of its own copies, not of every copy of the rule. The plan's
//! digest (what the engine compares to skip unchanged rules) is taken over
//! every wanted copy, so it stands for the desired state, not for the delta.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::marker;
use super::observe::{NamespaceState, Object, Observed};
use super::resource::{
    CopiesStatus, CopyratorRule, DeletionPolicy, ResolvedRule, RuleType, TargetStatus,
};
use super::scope::Scope;
use crate::handler::{Plan, PlannedEvent, Step};
use crate::overlay::{Overlay, kustomize_refuses};
use crate::status;

/// Namespaces that are targets only when a rule lists them.
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];
/// The server-side apply field manager of the copies.
pub const FIELD_MANAGER: &str = "kustomize-operator-copyrator";
/// Names listed per status list (counts are always complete).
const LISTED: usize = 50;
/// Target namespaces listed in status.
const LISTED_TARGETS: usize = 100;
/// Objects named in one event.
const IN_EVENT: usize = 10;
/// Copies deleted per `kubectl delete` (each adds ~17 bytes to its selector).
const DELETE_CHUNK: usize = 200;
/// How soon a rule with foreign objects in the way looks again.
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);

/// Whether a namespace receives copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetState {
    /// It does.
    Target,
    /// Listed, but not an Active namespace the operator may copy into.
    NotFound(&'static str),
    /// Listed, but never a target.
    Excluded(&'static str),
}

/// A namespace the rule targets or lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetNamespace {
    /// Its name.
    pub name: String,
    /// Whether it receives copies.
    pub state: TargetState,
}

/// The namespaces a rule copies into (and those it lists but cannot), sorted.
pub fn targets(
    rule: &ResolvedRule,
    namespaces: &[NamespaceState],
    scope: &Scope,
) -> Vec<TargetNamespace> {
    let known: BTreeMap<&str, &NamespaceState> =
        namespaces.iter().map(|n| (n.name.as_str(), n)).collect();
    if rule.namespaces.is_empty() {
        return known
            .values()
            .filter(|n| {
                n.active
                    && n.eligible
                    && scope.contains(&n.name)
                    && n.name != rule.namespace
                    && !PROTECTED_NAMESPACES.contains(&n.name.as_str())
            })
            .map(|n| TargetNamespace {
                name: n.name.clone(),
                state: TargetState::Target,
            })
            .collect();
    }
    let listed: BTreeSet<&String> = rule.namespaces.iter().collect();
    listed
        .into_iter()
        .map(|name| {
            let state = if *name == rule.namespace {
                TargetState::Excluded("the rule's own namespace holds the sources")
            } else if !scope.contains(name) {
                TargetState::Excluded("not among the operator's --copyrator-namespaces")
            } else {
                match known.get(name.as_str()) {
                    Some(n) if n.active && n.eligible => TargetState::Target,
                    Some(n) if !n.eligible => TargetState::Excluded(
                        "not matched by the operator's --copyrator-namespace-selector",
                    ),
                    Some(_) => TargetState::NotFound("the namespace is terminating"),
                    None => TargetState::NotFound("no such namespace (yet)"),
                }
            };
            TargetNamespace {
                name: name.clone(),
                state,
            }
        })
        .collect()
}

/// True when `obj` is a copy made by `rule`: both marker label and
/// annotation name it.
pub fn is_ours(rule: &ResolvedRule, obj: &Object) -> bool {
    obj.annotations.get(marker::RULE) == Some(&marker::rule_annotation(&rule.namespace, &rule.name))
        && obj.labels.get(marker::RULE) == Some(&marker::rule_label(&rule.namespace, &rule.name))
}

type CopyKey = (RuleType, String, String);

fn our_copies<'a>(rule: &ResolvedRule, observed: &'a Observed) -> BTreeMap<CopyKey, &'a Object> {
    observed
        .copies
        .iter()
        .filter(|o| is_ours(rule, o))
        .map(|o| ((o.kind, o.namespace.clone(), o.name.clone()), o))
        .collect()
}

/// Target namespaces where some wanted copy is not among the rule's copies:
/// there, the names of existing objects must be looked up.
pub fn namespaces_with_unknown_names(
    rule: &ResolvedRule,
    observed: &Observed,
    scope: &Scope,
) -> Vec<String> {
    let ours = our_copies(rule, observed);
    targets(rule, &observed.namespaces, scope)
        .into_iter()
        .filter(|t| t.state == TargetState::Target)
        .filter(|t| {
            observed
                .sources
                .iter()
                .any(|s| !ours.contains_key(&(rule.rule_type, t.name.clone(), s.name.clone())))
        })
        .map(|t| t.name)
        .collect()
}

/// The copy of `source` that `rule` wants in `namespace`.
pub fn desired_copy(rule: &ResolvedRule, source: &Object, namespace: &str) -> Object {
    let mut labels = source.labels.clone();
    labels.insert(
        marker::RULE.into(),
        marker::rule_label(&rule.namespace, &rule.name),
    );
    labels.insert(marker::SOURCE.into(), marker::source_label(&source.name));
    labels.insert(
        marker::COPY.into(),
        marker::copy_id(source.kind, namespace, &source.name),
    );
    let mut annotations = BTreeMap::from([
        (
            marker::RULE.to_string(),
            marker::rule_annotation(&rule.namespace, &rule.name),
        ),
        (
            marker::SOURCE.to_string(),
            format!("{}/{}", source.namespace, source.name),
        ),
    ]);
    let mut copy = Object {
        kind: source.kind,
        namespace: namespace.to_string(),
        name: source.name.clone(),
        labels,
        annotations: BTreeMap::new(),
        content: source.content.clone(),
    };
    annotations.insert(marker::DIGEST.to_string(), content_digest(&copy));
    copy.annotations = annotations;
    copy
}

/// sha256 over a copy's labels and content. It reveals nothing the copy
/// itself does not: it sits on the copy, next to the data.
fn content_digest(copy: &Object) -> String {
    let manifest = manifest(copy);
    let mut hasher = Sha256::new();
    for part in [
        &manifest["metadata"]["labels"],
        &manifest["type"],
        &manifest["data"],
        &manifest["binaryData"],
    ] {
        hasher.update(part.to_string().as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// The object as a manifest for the overlay.
pub fn manifest(obj: &Object) -> Value {
    let mut m = json!({
        "apiVersion": "v1",
        "kind": obj.kind.kind(),
        "metadata": {
            "name": obj.name,
            "namespace": obj.namespace,
            "labels": obj.labels,
            "annotations": obj.annotations,
        },
    });
    if let Some(content) = &obj.content {
        if !content.data.is_empty() {
            m["data"] = json!(content.data);
        }
        if !content.binary_data.is_empty() {
            m["binaryData"] = json!(content.binary_data);
        }
        if let Some(t) = &content.type_ {
            m["type"] = json!(t);
        }
    }
    m
}

/// True when `existing` carries everything `desired` sets (server-side apply
/// leaves alone what others add, so extra keys are not drift).
fn satisfies(existing: &Object, desired: &Object) -> bool {
    let subset = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    let content = match (&existing.content, &desired.content) {
        (Some(have), Some(want)) => {
            subset(&want.data, &have.data)
                && subset(&want.binary_data, &have.binary_data)
                && (want.type_.is_none() || want.type_ == have.type_)
        }
        _ => false,
    };
    content
        && subset(&desired.labels, &existing.labels)
        && subset(&desired.annotations, &existing.annotations)
}

fn listed<T: Clone>(items: &[T], limit: usize) -> Vec<T> {
    items.iter().take(limit).cloned().collect()
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A label-selected `kubectl delete` of copies (of both kinds) in one
/// namespace, or in all when `namespace` is `None`.
fn delete_copies(namespace: Option<&str>, selector: String) -> Step {
    let where_ = match namespace {
        Some(ns) => format!("--namespace={ns}"),
        None => "--all-namespaces".into(),
    };
    Step::Run {
        args: vec![
            "delete".into(),
            "configmaps,secrets".into(),
            where_,
            "--ignore-not-found=true".into(),
            "--wait=false".into(),
            format!("--selector={selector}"),
        ],
    }
}

/// `kubectl delete` of these copies, in chunks: across all namespaces, or,
/// with `--copyrator-namespaces`, per namespace (the grants are per namespace).
fn delete_steps(rule: &ResolvedRule, stale: &[&Object], scope: &Scope) -> Vec<Step> {
    let rule_label = marker::rule_label(&rule.namespace, &rule.name);
    let mut ids: BTreeMap<Option<&str>, Vec<String>> = BTreeMap::new();
    for copy in stale {
        let namespace = scope.namespaces().map(|_| copy.namespace.as_str());
        ids.entry(namespace).or_default().push(marker::copy_id(
            copy.kind,
            &copy.namespace,
            &copy.name,
        ));
    }
    ids.into_iter()
        .flat_map(|(namespace, ids)| {
            ids.chunks(DELETE_CHUNK)
                .map(|chunk| {
                    let selector = format!(
                        "{}={rule_label},{} in ({})",
                        marker::RULE,
                        marker::COPY,
                        chunk.join(",")
                    );
                    delete_copies(namespace, selector)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn status_map(status: &CopiesStatus) -> serde_json::Map<String, Value> {
    match serde_json::to_value(status) {
        Ok(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// The plan for an existing rule. `last_digest` is the `appliedDigest` its
/// status recorded: copies that are missing or differ while the wanted
/// copies are those last applied (someone deleted or edited a copy) force a
/// run, since the plan's digest is then unchanged.
pub fn plan(
    rule: &ResolvedRule,
    observed: &Observed,
    last_digest: Option<&str>,
    scope: &Scope,
) -> Plan {
    let kind = rule.rule_type;
    let ours = our_copies(rule, observed);
    let taken: BTreeSet<(&str, &str)> = observed
        .existing
        .iter()
        .map(|(ns, n)| (ns.as_str(), n.as_str()))
        .chain(
            observed
                .copies
                .iter()
                .filter(|o| o.kind == kind && !is_ours(rule, o))
                .map(|o| (o.namespace.as_str(), o.name.as_str())),
        )
        .collect();
    let mut sources: Vec<&Object> = observed.sources.iter().filter(|s| s.kind == kind).collect();
    sources.sort_by(|a, b| a.name.cmp(&b.name));
    // Sources kustomize cannot carry are reported, not copied.
    let mut not_copyable = Vec::new();
    let mut skipped = BTreeSet::new();
    sources.retain(|s| match why_not_copyable(s) {
        Some(why) => {
            not_copyable.push(format!("{}: {why}", s.name));
            skipped.insert(s.name.as_str());
            false
        }
        None => true,
    });

    let mut outdated = Vec::new();
    let mut wanted: BTreeSet<CopyKey> = BTreeSet::new();
    let mut desired_state = Sha256::new();
    let mut target_status = Vec::new();
    let mut foreign_all = Vec::new();
    let mut target_count = 0;
    for target in targets(rule, &observed.namespaces, scope) {
        let (copied, foreign) = match &target.state {
            TargetState::Target => {
                target_count += 1;
                let mut copied = Vec::new();
                let mut foreign = Vec::new();
                for source in &sources {
                    let key = (kind, target.name.clone(), source.name.clone());
                    let desired = desired_copy(rule, source, &target.name);
                    let up_to_date = match ours.get(&key) {
                        Some(existing) => satisfies(existing, &desired),
                        None if taken.contains(&(target.name.as_str(), source.name.as_str())) => {
                            foreign.push(source.name.clone());
                            continue;
                        }
                        None => false,
                    };
                    if !up_to_date {
                        outdated.push(manifest(&desired));
                    }
                    desired_state.update(
                        format!(
                            "{kind}/{}/{}/{}\n",
                            desired.namespace,
                            desired.name,
                            desired.annotations[marker::DIGEST]
                        )
                        .as_bytes(),
                    );
                    wanted.insert(key);
                    copied.push(source.name.clone());
                }
                (copied, foreign)
            }
            _ => (Vec::new(), Vec::new()),
        };
        let (result, message) = match &target.state {
            TargetState::Target if foreign.is_empty() => ("Copied", None),
            TargetState::Target => (
                "Conflict",
                Some(format!(
                    "{} same-named object(s) not created by this rule were left alone",
                    foreign.len()
                )),
            ),
            TargetState::NotFound(why) => ("NotFound", Some(why.to_string())),
            TargetState::Excluded(why) => ("Excluded", Some(why.to_string())),
        };
        foreign_all.extend(foreign.iter().map(|f| format!("{}/{f}", target.name)));
        target_status.push(TargetStatus {
            namespace: target.name,
            result: result.into(),
            copied: listed(&copied, LISTED),
            foreign: listed(&foreign, LISTED),
            message,
        });
    }

    // The copies of a source that cannot be copied now stay as they are.
    wanted.extend(
        ours.keys()
            .filter(|key| skipped.contains(key.2.as_str()))
            .cloned(),
    );

    // Copies in a terminating namespace go with it.
    let terminating: BTreeSet<&str> = observed
        .namespaces
        .iter()
        .filter(|n| !n.active)
        .map(|n| n.name.as_str())
        .collect();
    let stale: Vec<&Object> = ours
        .iter()
        .filter(|(key, o)| !wanted.contains(*key) && !terminating.contains(o.namespace.as_str()))
        .map(|(_, o)| *o)
        .collect();
    let stale_names: Vec<String> = stale
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();

    let digest = format!("sha256:{}", hex::encode(desired_state.finalize()));
    let always_run = !outdated.is_empty() && last_digest == Some(digest.as_str());
    let mut steps = Vec::new();
    let copy_count = wanted.len();
    if !outdated.is_empty() {
        steps.push(Step::Apply {
            overlay: Overlay {
                // No base: the copies are the whole overlay.
                base: None,
                resources: outdated,
                sensitive: kind == RuleType::Secret,
                ..Default::default()
            },
            extra_args: vec![
                "--server-side".into(),
                format!("--field-manager={FIELD_MANAGER}"),
                "--force-conflicts".into(),
            ],
        });
    }
    let mut events = Vec::new();
    let deleting = rule.deletion_policy == DeletionPolicy::Delete && !stale.is_empty();
    if deleting {
        steps.extend(delete_steps(rule, &stale, scope));
        events.push(PlannedEvent {
            warning: false,
            reason: "CopiesRemoved".into(),
            note: format!(
                "deleted {} copies no longer wanted: {}",
                stale.len(),
                name_list(&stale_names)
            ),
            ..Default::default()
        });
    }
    if !foreign_all.is_empty() {
        events.push(PlannedEvent {
            warning: true,
            reason: "ForeignObject".into(),
            note: format!(
                "left alone {} same-named {}(s) not created by this rule: {}",
                foreign_all.len(),
                kind,
                name_list(&foreign_all)
            ),
            ..Default::default()
        });
    }

    if !not_copyable.is_empty() {
        events.push(PlannedEvent {
            warning: true,
            reason: "NotCopyable".into(),
            note: format!(
                "{} source(s) not copied (existing copies left as they are): {}",
                not_copyable.len(),
                name_list(&not_copyable)
            ),
            ..Default::default()
        });
    }

    let mut copies = CopiesStatus {
        rule_type: Some(kind),
        sources: sources
            .iter()
            .map(|s| s.name.as_str())
            .chain(skipped.iter().copied())
            .take(LISTED)
            .map(str::to_string)
            .collect(),
        source_count: count(sources.len() + skipped.len()),
        copy_count: count(copy_count),
        targets: listed(&target_status, LISTED_TARGETS),
        target_count,
        removed: if deleting {
            listed(&stale_names, LISTED)
        } else {
            Vec::new()
        },
        retained: if deleting {
            Vec::new()
        } else {
            listed(&stale_names, LISTED)
        },
        foreign_count: count(foreign_all.len()),
        not_copyable: listed(&not_copyable, LISTED),
    };
    let status = status_map(&copies);
    for t in &mut copies.targets {
        if t.result == "Copied" || t.result == "Conflict" {
            t.result = "ApplyFailed".into();
        }
    }
    copies.removed.clear();
    Plan {
        steps,
        status,
        status_on_failure: Some(status_map(&copies)),
        events,
        requeue_after: (!foreign_all.is_empty()).then_some(FOREIGN_RECHECK),
        always_run,
        digest: Some(digest),
        ..Default::default()
    }
}

/// Why `source` cannot be copied through kustomize, if it cannot: the first
/// data value holding a character kustomize refuses.
fn why_not_copyable(source: &Object) -> Option<String> {
    let content = source.content.as_ref()?;
    content.data.iter().find_map(|(key, value)| {
        value.chars().find(|c| kustomize_refuses(*c)).map(|c| {
            format!(
                "the value of {key:?} holds U+{:04X}, a character kustomize cannot process",
                u32::from(c)
            )
        })
    })
}

fn name_list(names: &[String]) -> String {
    let shown = names
        .iter()
        .take(IN_EVENT)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > IN_EVENT {
        status::truncate(&format!("{shown}, ... ({} in all)", names.len()), 900)
    } else {
        status::truncate(&shown, 900)
    }
}

/// The plan for a deleted rule: delete every copy carrying its marker label
/// (both kinds; all namespaces, or each of `--copyrator-namespaces`), unless
/// it retains its copies.
pub fn cleanup(rule: &CopyratorRule, scope: &Scope) -> Plan {
    if rule.cleanup_policy() == DeletionPolicy::Retain {
        return Plan::default();
    }
    let namespace = kube::ResourceExt::namespace(rule).unwrap_or_default();
    let name = kube::ResourceExt::name_any(rule);
    let selector = format!("{}={}", marker::RULE, marker::rule_label(&namespace, &name));
    Plan {
        steps: scope
            .call_namespaces(None)
            .into_iter()
            .map(|ns| delete_copies(ns, selector.clone()))
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::copyrator::observe::Content;

    fn rule(namespaces: &[&str]) -> ResolvedRule {
        ResolvedRule {
            namespace: "src".into(),
            name: "r".into(),
            rule_type: RuleType::Configmap,
            selector: BTreeMap::from([("copy".into(), "yes".into())]),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            deletion_policy: DeletionPolicy::Delete,
        }
    }

    fn ns(name: &str) -> NamespaceState {
        NamespaceState {
            name: name.into(),
            active: true,
            eligible: true,
        }
    }

    fn source(kind: RuleType, name: &str, value: &str) -> Object {
        Object {
            kind,
            namespace: "src".into(),
            name: name.into(),
            labels: BTreeMap::from([("copy".into(), "yes".into()), ("app".into(), "web".into())]),
            annotations: BTreeMap::new(),
            content: Some(Content {
                data: BTreeMap::from([("k".into(), value.into())]),
                binary_data: BTreeMap::from([("b".into(), "AAE=".into())]),
                type_: (kind == RuleType::Secret).then(|| "kubernetes.io/tls".into()),
            }),
        }
    }

    fn observed(sources: Vec<Object>, namespaces: &[&str]) -> Observed {
        let mut all: Vec<NamespaceState> = namespaces.iter().map(|n| ns(n)).collect();
        all.push(ns("src"));
        Observed {
            sources,
            namespaces: all,
            ..Default::default()
        }
    }

    fn applied(plan: &Plan) -> Vec<Value> {
        match plan.steps.first() {
            Some(Step::Apply { overlay, .. }) => overlay.resources.clone(),
            _ => Vec::new(),
        }
    }

    fn names(resources: &[Value]) -> Vec<String> {
        resources
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["metadata"]["namespace"].as_str().unwrap(),
                    r["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn all_mode_skips_own_protected_inactive_and_ineligible_namespaces() {
        let mut spaces: Vec<NamespaceState> = [
            "src",
            "a",
            "b",
            "kube-system",
            "kube-public",
            "kube-node-lease",
        ]
        .iter()
        .map(|n| ns(n))
        .collect();
        spaces.push(NamespaceState {
            name: "dying".into(),
            active: false,
            eligible: true,
        });
        spaces.push(NamespaceState {
            name: "other-team".into(),
            active: true,
            eligible: false,
        });
        let t: Vec<_> = targets(&rule(&[]), &spaces, &Scope::All)
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(t, ["a", "b"]);
    }

    #[test]
    fn listed_mode_reports_what_cannot_be_a_target() {
        let spaces = vec![ns("src"), ns("a"), ns("kube-system")];
        let t = targets(
            &rule(&["kube-system", "a", "src", "later", "a"]),
            &spaces,
            &Scope::All,
        );
        let states: Vec<_> = t.iter().map(|t| (t.name.as_str(), &t.state)).collect();
        assert_eq!(
            states,
            [
                ("a", &TargetState::Target),
                ("kube-system", &TargetState::Target),
                ("later", &TargetState::NotFound("no such namespace (yet)")),
                (
                    "src",
                    &TargetState::Excluded("the rule's own namespace holds the sources")
                ),
            ]
        );
    }

    #[test]
    fn a_source_kustomize_cannot_carry_is_reported_and_its_copies_kept() {
        let rule = rule(&[]);
        let bad = source(RuleType::Configmap, "bad", "c1\u{91}");
        let mut obs = observed(
            vec![bad.clone(), source(RuleType::Configmap, "good", "1")],
            &["t1"],
        );
        // A copy made before the value changed.
        obs.copies.push(desired_copy(
            &rule,
            &source(RuleType::Configmap, "bad", "old"),
            "t1",
        ));
        let plan = plan(&rule, &obs, None, &Scope::All);
        assert_eq!(names(&applied(&plan)), ["t1/good"]);
        assert!(
            !plan.steps.iter().any(|s| matches!(s, Step::Run { .. })),
            "the old copy must stay: {:?}",
            plan.steps
        );
        let reported = &plan.status["notCopyable"];
        assert_eq!(
            reported,
            &json!(["bad: the value of \"k\" holds U+0091, a character kustomize cannot process"])
        );
        let event = plan
            .events
            .iter()
            .find(|e| e.reason == "NotCopyable")
            .unwrap();
        assert!(
            event.warning && event.note.contains("bad: the value"),
            "{event:?}"
        );
        assert_eq!(plan.status["sourceCount"], json!(2));
    }

    #[test]
    fn one_server_side_apply_of_every_copy() {
        let obs = observed(
            vec![
                source(RuleType::Configmap, "b", "2"),
                source(RuleType::Configmap, "a", "1"),
            ],
            &["t1", "t2"],
        );
        let plan = plan(&rule(&[]), &obs, None, &Scope::All);
        assert_eq!(plan.steps.len(), 1);
        let Step::Apply {
            overlay,
            extra_args,
        } = &plan.steps[0]
        else {
            panic!("{:?}", plan.steps)
        };
        assert_eq!(
            extra_args,
            &[
                "--server-side",
                "--field-manager=kustomize-operator-copyrator",
                "--force-conflicts"
            ]
        );
        assert!(!overlay.sensitive);
        assert_eq!(overlay.base, None);
        assert_eq!(names(&overlay.resources), ["t1/a", "t1/b", "t2/a", "t2/b"]);
        let copy = &overlay.resources[0];
        assert_eq!(copy["kind"], "ConfigMap");
        assert_eq!(copy["data"]["k"], "1");
        assert_eq!(copy["binaryData"]["b"], "AAE=");
        let labels = &copy["metadata"]["labels"];
        assert_eq!(labels["app"], "web");
        assert_eq!(labels["copy"], "yes");
        assert_eq!(labels[marker::RULE], "src.r");
        assert_eq!(labels[marker::SOURCE], "a");
        assert_eq!(
            labels[marker::COPY],
            marker::copy_id(RuleType::Configmap, "t1", "a")
        );
        assert_eq!(copy["metadata"]["annotations"][marker::RULE], "src/r");
        assert_eq!(copy["metadata"]["annotations"][marker::SOURCE], "src/a");
        assert_eq!(
            copy["metadata"]["annotations"][marker::DIGEST]
                .as_str()
                .map(str::len),
            Some(64)
        );
        // The copies are missing, but the overlay is new: no need to force.
        assert!(!plan.always_run);
        assert_eq!(plan.status["copyCount"], 4);
        assert_eq!(plan.status["targetCount"], 2);
        assert_eq!(plan.status["sources"], json!(["a", "b"]));
        assert_eq!(plan.status["targets"][0]["result"], "Copied");
        assert_eq!(plan.status["targets"][0]["copied"], json!(["a", "b"]));
        let failed = plan.status_on_failure.as_ref().unwrap();
        assert_eq!(failed["targets"][0]["result"], "ApplyFailed");
    }

    #[test]
    fn secret_copies_keep_their_type_and_are_not_kept_on_disk() {
        let mut r = rule(&["t1"]);
        r.rule_type = RuleType::Secret;
        let plan = plan(
            &r,
            &observed(vec![source(RuleType::Secret, "tls", "a2V5")], &["t1"]),
            None,
            &Scope::All,
        );
        let Step::Apply { overlay, .. } = &plan.steps[0] else {
            panic!()
        };
        assert!(overlay.sensitive);
        let copy = &overlay.resources[0];
        assert_eq!(copy["kind"], "Secret");
        assert_eq!(copy["type"], "kubernetes.io/tls");
        assert_eq!(copy["data"]["k"], "a2V5");
        let status = serde_json::to_string(&plan.status).unwrap();
        let events = format!("{:?}", plan.events);
        for text in [status, events] {
            assert!(!text.contains("a2V5"), "{text}");
        }
    }

    #[test]
    fn only_missing_or_outdated_copies_are_applied() {
        let r = rule(&["t1", "t2"]);
        let (a, b) = (
            source(RuleType::Configmap, "a", "1"),
            source(RuleType::Configmap, "b", "1"),
        );
        let mut obs = observed(vec![a.clone(), b.clone()], &["t1", "t2"]);
        obs.copies = ["t1", "t2"]
            .iter()
            .flat_map(|ns| [desired_copy(&r, &a, ns), desired_copy(&r, &b, ns)])
            .collect();
        // Labels someone else added are theirs (server-side apply keeps them).
        obs.copies[0]
            .labels
            .insert("added-by-someone".into(), "x".into());
        let in_sync = plan(&r, &obs, None, &Scope::All);
        assert!(in_sync.steps.is_empty(), "{:?}", in_sync.steps);
        assert!(!in_sync.always_run);
        assert_eq!(in_sync.status["copyCount"], 4);
        let last = in_sync.digest.clone();
        assert!(last.as_deref().is_some_and(|d| d.starts_with("sha256:")));

        // A source changes: only its copies are applied, and the desired
        // state (the plan's digest) changed, so nothing needs forcing.
        obs.sources[0] = source(RuleType::Configmap, "a", "2");
        let changed = plan(&r, &obs, last.as_deref(), &Scope::All);
        assert_eq!(names(&applied(&changed)), ["t1/a", "t2/a"]);
        assert_ne!(changed.digest, last);
        assert!(!changed.always_run);
        obs.sources[0] = a.clone();

        // Someone edits one copy and deletes another: the same desired state,
        // so the run is forced, and only those two are applied.
        if let Some(c) = obs.copies[1].content.as_mut() {
            c.data.insert("k".into(), "edited".into());
        }
        obs.copies.remove(2);
        let drifted = plan(&r, &obs, last.as_deref(), &Scope::All);
        assert_eq!(drifted.digest, last);
        assert!(drifted.always_run);
        assert_eq!(names(&applied(&drifted)), ["t1/b", "t2/a"]);
    }

    #[test]
    fn a_copy_carries_the_digest_of_its_labels_and_content() {
        let r = rule(&["t1"]);
        let a = source(RuleType::Configmap, "a", "1");
        let digest = |s: &Object| desired_copy(&r, s, "t1").annotations[marker::DIGEST].clone();
        let mut relabelled = a.clone();
        relabelled.labels.insert("tier".into(), "gold".into());
        let mut key_removed = a.clone();
        if let Some(c) = key_removed.content.as_mut() {
            c.binary_data.clear();
        }
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_ne!(digest(&a), digest(&relabelled));
        assert_ne!(digest(&a), digest(&key_removed));
        assert_ne!(digest(&a), digest(&source(RuleType::Configmap, "a", "2")));
    }

    #[test]
    fn foreign_objects_are_skipped_and_reported() {
        let r = rule(&["t1", "t2"]);
        let mut obs = observed(vec![source(RuleType::Configmap, "a", "1")], &["t1", "t2"]);
        obs.existing.insert(("t1".into(), "a".into()));
        // Carries a marker, but another rule's.
        let mut other = desired_copy(&r, &obs.sources[0], "t2");
        other
            .annotations
            .insert(marker::RULE.into(), "src/other".into());
        obs.copies.push(other);
        let plan = plan(&r, &obs, None, &Scope::All);
        assert!(applied(&plan).is_empty());
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert_eq!(plan.status["foreignCount"], 2);
        assert_eq!(plan.status["targets"][0]["result"], "Conflict");
        assert_eq!(plan.status["targets"][0]["foreign"], json!(["a"]));
        let warning = &plan.events[0];
        assert!(warning.warning && warning.reason == "ForeignObject");
        assert!(
            warning.note.contains("t1/a") && warning.note.contains("t2/a"),
            "{}",
            warning.note
        );
        assert_eq!(plan.requeue_after, Some(FOREIGN_RECHECK));
    }

    #[test]
    fn copies_no_longer_wanted_are_deleted_by_marker_or_retained() {
        let r = rule(&["t1"]);
        let kept = source(RuleType::Configmap, "a", "1");
        let gone = source(RuleType::Configmap, "old", "1");
        let mut obs = observed(vec![kept.clone()], &["t1", "t9"]);
        obs.copies = vec![
            desired_copy(&r, &kept, "t1"),
            desired_copy(&r, &gone, "t1"),
            desired_copy(&r, &kept, "t9"),
            // Left over from when the rule copied Secrets.
            Object {
                kind: RuleType::Secret,
                content: None,
                ..desired_copy(&r, &kept, "t1")
            },
        ];
        let p = plan(&r, &obs, None, &Scope::All);
        // t1/a is up to date: only the delete runs.
        let [Step::Run { args }] = p.steps.as_slice() else {
            panic!("{:?}", p.steps)
        };
        let selector = args.last().unwrap();
        assert_eq!(
            &args[..5],
            [
                "delete",
                "configmaps,secrets",
                "--all-namespaces",
                "--ignore-not-found=true",
                "--wait=false"
            ]
        );
        assert!(
            selector.starts_with(
                "--selector=copyrator.flant.com/rule=src.r,copyrator.flant.com/copy in ("
            ),
            "{selector}"
        );
        for (kind, ns, name) in [
            (RuleType::Configmap, "t1", "old"),
            (RuleType::Configmap, "t9", "a"),
            (RuleType::Secret, "t1", "a"),
        ] {
            assert!(
                selector.contains(&marker::copy_id(kind, ns, name)),
                "{kind} {ns}/{name}"
            );
        }
        assert!(!selector.contains(&marker::copy_id(RuleType::Configmap, "t1", "a")));
        assert_eq!(p.status["removed"].as_array().unwrap().len(), 3);
        assert!(p.events.iter().any(|e| e.reason == "CopiesRemoved"));

        let mut retain = r.clone();
        retain.deletion_policy = DeletionPolicy::Retain;
        let p = plan(&retain, &obs, None, &Scope::All);
        assert!(p.steps.is_empty(), "{:?}", p.steps);
        assert_eq!(p.status["retained"].as_array().unwrap().len(), 3);
        assert_eq!(p.status["removed"], json!([]));
    }

    #[test]
    fn copies_in_a_terminating_namespace_go_with_it() {
        let r = rule(&[]);
        let src = source(RuleType::Configmap, "a", "1");
        let mut obs = observed(vec![src.clone()], &["t1"]);
        obs.namespaces.push(NamespaceState {
            name: "dying".into(),
            active: false,
            eligible: true,
        });
        obs.copies = vec![
            desired_copy(&r, &src, "t1"),
            desired_copy(&r, &src, "dying"),
        ];
        let p = plan(&r, &obs, None, &Scope::All);
        assert!(p.steps.is_empty(), "{:?}", p.steps);
        assert!(!p.always_run);
    }

    #[test]
    fn many_stale_copies_are_deleted_in_bounded_commands() {
        let r = rule(&["t1"]);
        let mut obs = observed(vec![], &["t1"]);
        obs.copies = (0..450)
            .map(|i| {
                desired_copy(
                    &r,
                    &source(RuleType::Configmap, &format!("s{i}"), "1"),
                    "t1",
                )
            })
            .collect();
        let p = plan(&r, &obs, None, &Scope::All);
        assert_eq!(p.steps.len(), 3);
        for step in &p.steps {
            let Step::Run { args } = step else { panic!() };
            assert!(args.last().unwrap().len() < 4 * 1024);
        }
        assert_eq!(p.status["removed"].as_array().unwrap().len(), LISTED);
    }

    #[test]
    fn nothing_to_copy_means_no_kubectl() {
        let p = plan(&rule(&[]), &observed(vec![], &["t1"]), None, &Scope::All);
        assert!(p.steps.is_empty());
        assert!(!p.always_run);
        assert_eq!(p.status["copyCount"], 0);
    }

    #[test]
    fn cleanup_deletes_by_marker_unless_retained() {
        let mut r = CopyratorRule::new("r", Default::default());
        r.metadata.namespace = Some("src".into());
        let p = cleanup(&r, &Scope::All);
        let [Step::Run { args }] = p.steps.as_slice() else {
            panic!("{:?}", p.steps)
        };
        assert_eq!(
            args,
            &[
                "delete",
                "configmaps,secrets",
                "--all-namespaces",
                "--ignore-not-found=true",
                "--wait=false",
                "--selector=copyrator.flant.com/rule=src.r"
            ]
        );
        r.top_level.deletion_policy = Some(DeletionPolicy::Retain);
        assert!(cleanup(&r, &Scope::All).steps.is_empty());
    }

    fn only(namespaces: &[&str]) -> Scope {
        Scope::Only(namespaces.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn with_copyrator_namespaces_only_those_are_targets() {
        let spaces = vec![ns("src"), ns("a"), ns("b"), ns("c")];
        let scope = only(&["src", "a", "c", "gone"]);
        let all: Vec<_> = targets(&rule(&[]), &spaces, &scope)
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(all, ["a", "c"]);
        let listed = targets(&rule(&["a", "b", "later"]), &spaces, &scope);
        let states: Vec<_> = listed.iter().map(|t| (t.name.as_str(), &t.state)).collect();
        let outside = TargetState::Excluded("not among the operator's --copyrator-namespaces");
        assert_eq!(
            states,
            [
                ("a", &TargetState::Target),
                ("b", &outside),
                ("later", &outside),
            ]
        );
    }

    #[test]
    fn with_copyrator_namespaces_stale_copies_are_deleted_per_namespace() {
        let r = rule(&["t1"]);
        let gone = source(RuleType::Configmap, "old", "1");
        let mut obs = observed(vec![], &["t1", "t2"]);
        obs.copies = vec![desired_copy(&r, &gone, "t1"), desired_copy(&r, &gone, "t2")];
        let p = plan(&r, &obs, None, &only(&["src", "t1", "t2"]));
        let namespaces: Vec<&str> = p
            .steps
            .iter()
            .map(|step| match step {
                Step::Run { args } => {
                    let id = marker::copy_id(RuleType::Configmap, "t1", "old");
                    let ns = args[2].as_str();
                    assert_eq!(args.last().unwrap().contains(&id), ns == "--namespace=t1");
                    ns
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(namespaces, ["--namespace=t1", "--namespace=t2"]);
    }

    #[test]
    fn with_copyrator_namespaces_cleanup_deletes_in_each() {
        let mut r = CopyratorRule::new("r", Default::default());
        r.metadata.namespace = Some("src".into());
        let p = cleanup(&r, &only(&["src", "t1"]));
        let wheres: Vec<&str> = p
            .steps
            .iter()
            .map(|step| match step {
                Step::Run { args } => {
                    assert_eq!(
                        args.last().unwrap(),
                        "--selector=copyrator.flant.com/rule=src.r"
                    );
                    args[2].as_str()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(wheres, ["--namespace=src", "--namespace=t1"]);
    }
}
