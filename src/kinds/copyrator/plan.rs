//! The plan of a rule, as data (pure): one overlay holding, as whole objects,
//! the wanted copies that are missing or differ from their source, applied
//! with the rule's own server-side apply field manager; the copies the rule
//! owns once it ran (its inventory: copies no longer wanted are pruned by the
//! engine, unless the rule retains them); status and events.
//!
//! Which copies are wanted: every matching source that may be copied, in
//! every target namespace. Targets are the listed namespaces, or (none
//! listed) every Active namespace; never the rule's own namespace; never
//! `kube-system`, `kube-public`, `kube-node-lease` or the operator's own
//! namespace unless the operator is started with
//! `--copyrator-allow-system-namespaces`; with
//! `--copyrator-namespace-selector`, only namespaces matching it; with
//! `--copyrator-namespaces`, only those. A wanted copy whose name is held by
//! an object the rule did not create is skipped and reported. Secrets that
//! are credentials of the cluster itself (ServiceAccount and bootstrap
//! tokens) are never copied.
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

use super::inputs::{NamespaceState, Object, Observed};
use super::marker;
use super::resource::{CopiesStatus, DeletionPolicy, ResolvedRule, RuleType, TargetStatus};
use super::scope::Scope;
use crate::kind::{HandlerError, ObjectId, Overlay, Plan, PlannedEvent, Step};
use crate::text::{IN_EVENT, first_names, truncate};

/// Namespaces holding the cluster's own machinery: never targets unless the
/// operator is started with `--copyrator-allow-system-namespaces`.
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];
/// Secret types that are credentials of the cluster itself: never copied.
pub const NEVER_COPIED_TYPES: [&str; 2] = [
    "kubernetes.io/service-account-token",
    "bootstrap.kubernetes.io/token",
];
/// The default of `--copyrator-max-bytes`.
pub const DEFAULT_MAX_BYTES: usize = 32 * 1024 * 1024;
/// Names listed per status list (counts are always complete).
const LISTED: usize = 50;
/// Target namespaces listed in status.
const LISTED_TARGETS: usize = 100;
/// The most bytes the rule-specific status takes (far below etcd's 1.5 MiB).
pub const STATUS_LIMIT: usize = 64 * 1024;
/// How soon a rule with foreign objects in the way looks again.
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);

/// The operator's rails around every rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rails {
    /// Which namespaces the operator touches ConfigMaps and Secrets in.
    pub scope: Scope,
    /// The operator's own namespace (protected like `kube-system`).
    pub operator_namespace: Option<String>,
    /// Protected namespaces may be targets (`--copyrator-allow-system-namespaces`).
    pub allow_system_namespaces: bool,
    /// The most bytes of copies one rule may want (`--copyrator-max-bytes`).
    pub max_bytes: usize,
}

impl Default for Rails {
    fn default() -> Self {
        Self {
            scope: Scope::All,
            operator_namespace: None,
            allow_system_namespaces: false,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl Rails {
    /// Why `namespace` is never a target, if it is protected.
    fn protected(&self, namespace: &str) -> Option<&'static str> {
        if self.allow_system_namespaces {
            return None;
        }
        if PROTECTED_NAMESPACES.contains(&namespace) {
            Some(
                "the cluster's own namespace: copies go there only when the operator runs with --copyrator-allow-system-namespaces",
            )
        } else if self.operator_namespace.as_deref() == Some(namespace) {
            Some(
                "the operator's own namespace: copies go there only when the operator runs with --copyrator-allow-system-namespaces",
            )
        } else {
            None
        }
    }
}

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
    rails: &Rails,
) -> Vec<TargetNamespace> {
    let known: BTreeMap<&str, &NamespaceState> =
        namespaces.iter().map(|n| (n.name.as_str(), n)).collect();
    if rule.namespaces.is_empty() {
        return known
            .values()
            .filter(|n| {
                n.active
                    && n.eligible
                    && rails.scope.contains(&n.name)
                    && n.name != rule.namespace
                    && rails.protected(&n.name).is_none()
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
        .map(|name| TargetNamespace {
            name: name.clone(),
            state: listed_state(rule, name, known.get(name.as_str()).copied(), rails),
        })
        .collect()
}

fn listed_state(
    rule: &ResolvedRule,
    name: &str,
    known: Option<&NamespaceState>,
    rails: &Rails,
) -> TargetState {
    if name == rule.namespace {
        return TargetState::Excluded("the rule's own namespace holds the sources");
    }
    if let Some(why) = rails.protected(name) {
        return TargetState::Excluded(why);
    }
    if !rails.scope.contains(name) {
        return TargetState::Excluded("not among the operator's --copyrator-namespaces");
    }
    match known {
        Some(n) if n.active && n.eligible => TargetState::Target,
        Some(n) if !n.eligible => {
            TargetState::Excluded("not matched by the operator's --copyrator-namespace-selector")
        }
        Some(_) => TargetState::NotFound("the namespace is terminating"),
        None => TargetState::NotFound("no such namespace (yet)"),
    }
}

/// How many namespaces receive the rule's copies.
pub fn target_count(rule: &ResolvedRule, namespaces: &[NamespaceState], rails: &Rails) -> usize {
    targets(rule, namespaces, rails)
        .iter()
        .filter(|t| t.state == TargetState::Target)
        .count()
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
    rails: &Rails,
) -> Vec<String> {
    let ours = our_copies(rule, observed);
    targets(rule, &observed.namespaces, rails)
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
    let mut copy = Object {
        labels,
        content: source.content.clone(),
        ..Object::new(source.kind, namespace, &source.name)
    };
    copy.annotations = BTreeMap::from([
        (
            marker::RULE.to_string(),
            marker::rule_annotation(&rule.namespace, &rule.name),
        ),
        (
            marker::SOURCE.to_string(),
            format!("{}/{}", source.namespace, source.name),
        ),
        (marker::DIGEST.to_string(), content_digest(&copy)),
    ]);
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

/// The identity of a copy, for the inventory.
pub fn object_id(kind: RuleType, namespace: &str, name: &str) -> ObjectId {
    ObjectId {
        api_version: "v1".into(),
        kind: kind.kind().into(),
        namespace: Some(namespace.into()),
        name: name.into(),
    }
}

/// The field manager of a rule's applies: its own, so two rules never
/// silently take each other's fields.
pub fn field_manager(rule: &ResolvedRule) -> String {
    let plain = format!("copyrator.{}.{}", rule.namespace, rule.name);
    if plain.len() <= 128 {
        plain
    } else {
        format!(
            "copyrator.{}",
            marker::rule_label(&rule.namespace, &rule.name)
        )
    }
}

/// True when `existing` carries everything `desired` sets (server-side apply
/// leaves alone what others add, so extra keys are not drift).
fn satisfies(existing: &Object, desired: &Object) -> bool {
    let subset = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    let content = match (existing.fingerprint(), &desired.content) {
        (Some(have), Some(want)) => have.holds(want),
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

/// The sources of the rule's kind, sorted, split into those it copies and
/// those it cannot (with why).
struct Sources<'a> {
    copied: Vec<&'a Object>,
    not_copyable: Vec<(String, String)>,
}

fn sources<'a>(rule: &ResolvedRule, observed: &'a Observed) -> Sources<'a> {
    let mut copied: Vec<&Object> = observed
        .sources
        .iter()
        .filter(|s| s.kind == rule.rule_type)
        .collect();
    copied.sort_by(|a, b| a.name.cmp(&b.name));
    let mut not_copyable = Vec::new();
    copied.retain(|s| match why_not_copyable(s) {
        Some(why) => {
            not_copyable.push((s.name.clone(), why));
            false
        }
        None => true,
    });
    Sources {
        copied,
        not_copyable,
    }
}

/// Why `source` is not copied, if it is not: a credential of the cluster
/// itself, or a data value holding a character kustomize refuses.
fn why_not_copyable(source: &Object) -> Option<String> {
    let content = source.content.as_ref()?;
    if let Some(t) = content
        .type_
        .as_deref()
        .filter(|t| NEVER_COPIED_TYPES.contains(t))
    {
        return Some(format!(
            "a Secret of type {t} is a credential of the cluster itself and is never copied"
        ));
    }
    content.data.iter().find_map(|(key, value)| {
        value
            .chars()
            .find(|c| Overlay::kustomize_refuses(*c))
            .map(|c| {
                format!(
                    "the value of {key:?} holds U+{:04X}, a character kustomize cannot process",
                    u32::from(c)
                )
            })
    })
}

/// What the rule wants, target by target.
#[derive(Default)]
struct CopiesWanted {
    outdated: Vec<Value>,
    keys: BTreeSet<CopyKey>,
    targets: Vec<TargetStatus>,
    target_count: usize,
    foreign: Vec<String>,
    digest: String,
}

fn wanted(
    rule: &ResolvedRule,
    observed: &Observed,
    sources: &[&Object],
    ours: &BTreeMap<CopyKey, &Object>,
    rails: &Rails,
) -> CopiesWanted {
    let kind = rule.rule_type;
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
    let mut w = CopiesWanted::default();
    let mut state = Sha256::new();
    for target in targets(rule, &observed.namespaces, rails) {
        let (mut copied, mut foreign) = (Vec::new(), Vec::new());
        if target.state == TargetState::Target {
            w.target_count += 1;
            for source in sources {
                let key = (kind, target.name.clone(), source.name.clone());
                let desired = desired_copy(rule, source, &target.name);
                match ours.get(&key) {
                    Some(existing) if satisfies(existing, &desired) => {}
                    Some(_) => w.outdated.push(manifest(&desired)),
                    None if taken.contains(&(target.name.as_str(), source.name.as_str())) => {
                        foreign.push(source.name.clone());
                        continue;
                    }
                    None => w.outdated.push(manifest(&desired)),
                }
                state.update(
                    format!(
                        "{kind}/{}/{}/{}\n",
                        desired.namespace,
                        desired.name,
                        desired.annotations[marker::DIGEST]
                    )
                    .as_bytes(),
                );
                w.keys.insert(key);
                copied.push(source.name.clone());
            }
        }
        w.foreign
            .extend(foreign.iter().map(|f| format!("{}/{f}", target.name)));
        w.targets.push(target_status(target, &copied, &foreign));
    }
    w.digest = format!("sha256:{}", hex::encode(state.finalize()));
    w
}

fn target_status(target: TargetNamespace, copied: &[String], foreign: &[String]) -> TargetStatus {
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
    TargetStatus {
        namespace: target.name,
        result: result.into(),
        copied: listed(copied, LISTED),
        foreign: listed(foreign, LISTED),
        message,
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
    rails: &Rails,
) -> Result<Plan<CopiesStatus>, HandlerError> {
    let ours = our_copies(rule, observed);
    let sources = sources(rule, observed);
    let wanted = wanted(rule, observed, &sources.copied, &ours, rails);
    let bytes: usize = sources
        .copied
        .iter()
        .map(|s| s.content_bytes())
        .sum::<usize>()
        * wanted.target_count;
    if bytes > rails.max_bytes {
        return Err(HandlerError::TooLarge(format!(
            "the rule would copy {bytes} bytes ({} sources into {} namespaces); the operator allows {} (--copyrator-max-bytes)",
            sources.copied.len(),
            wanted.target_count,
            rails.max_bytes
        )));
    }
    // The copies of a source that cannot be copied now stay as they are.
    let skipped: BTreeSet<&str> = sources
        .not_copyable
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    let mut kept = wanted.keys.clone();
    kept.extend(
        ours.keys()
            .filter(|k| skipped.contains(k.2.as_str()))
            .cloned(),
    );
    let stale = stale_copies(observed, &ours, &kept);
    let retain = rule.deletion_policy == DeletionPolicy::Retain;
    let status = copies_status(rule, &sources, &wanted, kept.len(), &stale, retain);
    let always_run = !wanted.outdated.is_empty() && last_digest == Some(wanted.digest.as_str());
    let mut steps = Vec::new();
    if !wanted.outdated.is_empty() {
        steps.push(Step::Apply {
            overlay: Overlay {
                // No base: the copies are the whole overlay.
                resources: wanted.outdated,
                sensitive: rule.rule_type == RuleType::Secret,
                ..Default::default()
            },
            field_manager: Some(field_manager(rule)),
        });
    }
    Ok(Plan {
        steps,
        failure_status: Some(failed(&status)),
        status: Some(status),
        events: events(&wanted.foreign, &sources.not_copyable, rule.rule_type),
        requeue_after: (!wanted.foreign.is_empty()).then_some(FOREIGN_RECHECK),
        always_run,
        digest: Some(wanted.digest),
        inventory: Some(kept.iter().map(|(k, ns, n)| object_id(*k, ns, n)).collect()),
        stale: stale
            .iter()
            .map(|o| object_id(o.kind, &o.namespace, &o.name))
            .collect(),
        prune: !retain,
        idle: false,
    })
}

/// The rule's copies it no longer wants (copies in a terminating namespace
/// go with it, so they are not counted).
fn stale_copies<'a>(
    observed: &Observed,
    ours: &BTreeMap<CopyKey, &'a Object>,
    kept: &BTreeSet<CopyKey>,
) -> Vec<&'a Object> {
    let terminating: BTreeSet<&str> = observed
        .namespaces
        .iter()
        .filter(|n| !n.active)
        .map(|n| n.name.as_str())
        .collect();
    ours.iter()
        .filter(|(key, o)| !kept.contains(*key) && !terminating.contains(o.namespace.as_str()))
        .map(|(_, o)| *o)
        .collect()
}

fn copies_status(
    rule: &ResolvedRule,
    sources: &Sources<'_>,
    wanted: &CopiesWanted,
    copies: usize,
    stale: &[&Object],
    retain: bool,
) -> CopiesStatus {
    let stale_names: Vec<String> = stale
        .iter()
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();
    let mut names: Vec<String> = sources.copied.iter().map(|s| s.name.clone()).collect();
    names.extend(sources.not_copyable.iter().map(|(n, _)| n.clone()));
    let mut status = CopiesStatus {
        rule_type: Some(rule.rule_type),
        sources: listed(&names, LISTED),
        source_count: count(names.len()),
        copy_count: count(copies),
        targets: listed(&wanted.targets, LISTED_TARGETS),
        target_count: count(wanted.target_count),
        removed: if retain {
            Vec::new()
        } else {
            listed(&stale_names, LISTED)
        },
        retained: if retain {
            listed(&stale_names, LISTED)
        } else {
            Vec::new()
        },
        foreign_count: count(wanted.foreign.len()),
        not_copyable: listed(
            &sources
                .not_copyable
                .iter()
                .map(|(n, why)| format!("{n}: {why}"))
                .collect::<Vec<_>>(),
            LISTED,
        ),
    };
    fit(&mut status, STATUS_LIMIT);
    status
}

/// Shortens the lists of `status` until it takes at most `limit` bytes
/// (names can be 253 characters long; the counts stay complete).
pub fn fit(status: &mut CopiesStatus, limit: usize) {
    let size = |s: &CopiesStatus| serde_json::to_string(s).map_or(0, |j| j.len());
    for keep in [20, 5, 1, 0] {
        if size(status) <= limit {
            return;
        }
        for t in &mut status.targets {
            t.copied.truncate(keep);
            t.foreign.truncate(keep);
            if let Some(m) = &mut t.message {
                *m = truncate(m, 200);
            }
        }
        status.targets.truncate(keep.max(1) * 5);
        for list in [
            &mut status.sources,
            &mut status.removed,
            &mut status.retained,
            &mut status.not_copyable,
        ] {
            list.truncate(keep);
        }
    }
}

/// The status written when the apply fails: no target got its copies.
fn failed(status: &CopiesStatus) -> CopiesStatus {
    let mut failed = status.clone();
    for t in &mut failed.targets {
        if t.result == "Copied" || t.result == "Conflict" {
            t.result = "ApplyFailed".into();
        }
    }
    failed.removed.clear();
    failed
}

fn events(
    foreign: &[String],
    not_copyable: &[(String, String)],
    kind: RuleType,
) -> Vec<PlannedEvent> {
    let mut events = Vec::new();
    if !foreign.is_empty() {
        events.push(PlannedEvent::warning(
            "ForeignObject",
            format!(
                "left alone {} same-named {}(s) not created by this rule: {}",
                foreign.len(),
                kind,
                name_list(foreign)
            ),
        ));
    }
    if !not_copyable.is_empty() {
        let lines: Vec<String> = not_copyable
            .iter()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect();
        events.push(PlannedEvent::warning(
            "NotCopyable",
            format!(
                "{} source(s) not copied (existing copies left as they are): {}",
                lines.len(),
                name_list(&lines)
            ),
        ));
    }
    events
}

fn name_list(names: &[String]) -> String {
    truncate(&first_names(names, IN_EVENT, ", "), 900)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::copyrator::inputs::Content;

    type P = Plan<CopiesStatus>;

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

    fn rails() -> Rails {
        Rails {
            operator_namespace: Some("ops".into()),
            ..Rails::default()
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
            labels: BTreeMap::from([("copy".into(), "yes".into()), ("app".into(), "web".into())]),
            content: Some(Content {
                data: BTreeMap::from([("k".into(), value.into())]),
                binary_data: BTreeMap::from([("b".into(), "AAE=".into())]),
                type_: (kind == RuleType::Secret).then(|| "kubernetes.io/tls".into()),
            }),
            ..Object::new(kind, "src", name)
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

    fn plan_of(rule: &ResolvedRule, observed: &Observed, last: Option<&str>) -> P {
        plan(rule, observed, last, &rails()).unwrap()
    }

    fn status(plan: &P) -> Value {
        serde_json::to_value(&plan.status).unwrap()
    }

    fn applied(plan: &P) -> Vec<Value> {
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

    fn ids(list: &[ObjectId]) -> Vec<String> {
        list.iter()
            .map(|o| format!("{}/{}", o.namespace.as_deref().unwrap_or_default(), o.name))
            .collect()
    }

    #[test]
    fn all_mode_skips_own_protected_inactive_and_ineligible_namespaces() {
        let mut spaces: Vec<NamespaceState> = [
            "src",
            "a",
            "b",
            "ops",
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
        let names = |rails: &Rails| -> Vec<String> {
            targets(&rule(&[]), &spaces, rails)
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        assert_eq!(names(&rails()), ["a", "b"]);
        let open = Rails {
            allow_system_namespaces: true,
            ..rails()
        };
        assert_eq!(
            names(&open),
            [
                "a",
                "b",
                "kube-node-lease",
                "kube-public",
                "kube-system",
                "ops"
            ]
        );
    }

    #[test]
    fn listed_mode_reports_what_cannot_be_a_target() {
        let spaces = vec![ns("src"), ns("a"), ns("kube-system"), ns("ops")];
        let t = targets(
            &rule(&["kube-system", "a", "src", "later", "a", "ops"]),
            &spaces,
            &rails(),
        );
        let states: Vec<_> = t
            .iter()
            .map(|t| (t.name.as_str(), t.state.clone()))
            .collect();
        let TargetState::Excluded(system) = &states[1].1 else {
            panic!("{states:?}")
        };
        assert!(
            system.contains("--copyrator-allow-system-namespaces"),
            "{system}"
        );
        assert_eq!(states[0], ("a", TargetState::Target));
        assert_eq!(
            states[2],
            ("later", TargetState::NotFound("no such namespace (yet)"))
        );
        assert!(
            matches!(states[3], ("ops", TargetState::Excluded(why)) if why.contains("operator's own"))
        );
        assert_eq!(
            states[4],
            (
                "src",
                TargetState::Excluded("the rule's own namespace holds the sources")
            )
        );
        let open = Rails {
            allow_system_namespaces: true,
            ..rails()
        };
        let t = targets(&rule(&["kube-system"]), &spaces, &open);
        assert_eq!(t[0].state, TargetState::Target);
    }

    #[test]
    fn cluster_credentials_are_never_copied_and_other_sources_still_are() {
        let mut r = rule(&["t1"]);
        r.rule_type = RuleType::Secret;
        let mut token = source(RuleType::Secret, "bootstrap-token-abcdef", "dG9r");
        if let Some(c) = token.content.as_mut() {
            c.type_ = Some("bootstrap.kubernetes.io/token".into());
        }
        let mut sa = source(RuleType::Secret, "sa", "dG9r");
        if let Some(c) = sa.content.as_mut() {
            c.type_ = Some("kubernetes.io/service-account-token".into());
        }
        let p = plan_of(
            &r,
            &observed(
                vec![token, sa, source(RuleType::Secret, "tls", "a2V5")],
                &["t1"],
            ),
            None,
        );
        assert_eq!(names(&applied(&p)), ["t1/tls"]);
        let reported = status(&p)["notCopyable"].clone();
        assert_eq!(reported.as_array().unwrap().len(), 2);
        assert!(
            reported[0]
                .as_str()
                .unwrap()
                .contains("bootstrap.kubernetes.io/token"),
            "{reported}"
        );
        let warning = p.events.iter().find(|e| e.reason == "NotCopyable").unwrap();
        assert!(warning.is_warning());
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
        let plan = plan_of(&rule, &obs, None);
        assert_eq!(names(&applied(&plan)), ["t1/good"]);
        assert!(
            plan.stale.is_empty(),
            "the old copy must stay: {:?}",
            plan.stale
        );
        assert_eq!(
            ids(plan.inventory.as_ref().unwrap()),
            ["t1/bad", "t1/good"],
            "the kept copy stays in the inventory"
        );
        assert_eq!(
            status(&plan)["notCopyable"],
            json!(["bad: the value of \"k\" holds U+0091, a character kustomize cannot process"])
        );
        assert_eq!(status(&plan)["sources"], json!(["good", "bad"]));
    }

    #[test]
    fn copies_are_whole_objects_with_the_marker_applied_by_the_rules_own_manager() {
        let plan = plan_of(
            &rule(&["t1", "t2"]),
            &observed(
                vec![
                    source(RuleType::Configmap, "b", "1"),
                    source(RuleType::Configmap, "a", "1"),
                ],
                &["t1", "t2"],
            ),
            None,
        );
        let [
            Step::Apply {
                overlay,
                field_manager,
            },
        ] = plan.steps.as_slice()
        else {
            panic!("{:?}", plan.steps)
        };
        assert_eq!(field_manager.as_deref(), Some("copyrator.src.r"));
        assert!(!overlay.sensitive);
        assert!(overlay.is_plain(), "built in memory, never written to disk");
        assert_eq!(names(&overlay.resources), ["t1/a", "t1/b", "t2/a", "t2/b"]);
        let copy = &overlay.resources[0];
        assert_eq!(copy["kind"], "ConfigMap");
        assert_eq!(copy["data"]["k"], "1");
        assert_eq!(copy["binaryData"]["b"], "AAE=");
        let labels = &copy["metadata"]["labels"];
        assert_eq!(labels["app"], "web");
        assert_eq!(labels[marker::RULE], "src.r");
        assert_eq!(labels[marker::SOURCE], "a");
        assert_eq!(copy["metadata"]["annotations"][marker::RULE], "src/r");
        assert_eq!(copy["metadata"]["annotations"][marker::SOURCE], "src/a");
        assert_eq!(
            copy["metadata"]["annotations"][marker::DIGEST]
                .as_str()
                .map(str::len),
            Some(64)
        );
        assert!(!plan.always_run);
        assert_eq!(
            ids(plan.inventory.as_ref().unwrap()),
            ["t1/a", "t1/b", "t2/a", "t2/b"]
        );
        let s = status(&plan);
        assert_eq!(s["copyCount"], 4);
        assert_eq!(s["targetCount"], 2);
        assert_eq!(s["sources"], json!(["a", "b"]));
        assert_eq!(s["targets"][0]["result"], "Copied");
        assert_eq!(s["targets"][0]["copied"], json!(["a", "b"]));
        let failed = plan.failure_status.as_ref().unwrap();
        assert_eq!(failed.targets[0].result, "ApplyFailed");
    }

    #[test]
    fn secret_copies_keep_their_type_and_are_sensitive() {
        let mut r = rule(&["t1"]);
        r.rule_type = RuleType::Secret;
        let plan = plan_of(
            &r,
            &observed(vec![source(RuleType::Secret, "tls", "a2V5")], &["t1"]),
            None,
        );
        let Step::Apply { overlay, .. } = &plan.steps[0] else {
            panic!()
        };
        assert!(overlay.sensitive);
        let copy = &overlay.resources[0];
        assert_eq!(copy["kind"], "Secret");
        assert_eq!(copy["type"], "kubernetes.io/tls");
        assert_eq!(copy["data"]["k"], "a2V5");
        for text in [status(&plan).to_string(), format!("{:?}", plan.events)] {
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
        let in_sync = plan_of(&r, &obs, None);
        assert!(in_sync.steps.is_empty(), "{:?}", in_sync.steps);
        assert!(!in_sync.always_run);
        assert_eq!(in_sync.inventory.as_ref().unwrap().len(), 4);
        let last = in_sync.digest.clone();
        assert!(last.as_deref().is_some_and(|d| d.starts_with("sha256:")));

        // A source changes: only its copies are applied, and the desired
        // state (the plan's digest) changed, so nothing needs forcing.
        obs.sources[0] = source(RuleType::Configmap, "a", "2");
        let changed = plan_of(&r, &obs, last.as_deref());
        assert_eq!(names(&applied(&changed)), ["t1/a", "t2/a"]);
        assert_ne!(changed.digest, last);
        assert!(!changed.always_run);
        assert_eq!(
            changed.inventory.as_ref().unwrap().len(),
            4,
            "the whole desired set"
        );
        obs.sources[0] = a.clone();

        // Someone edits one copy and deletes another: the same desired state,
        // so the run is forced, and only those two are applied.
        if let Some(c) = obs.copies[1].content.as_mut() {
            c.data.insert("k".into(), "edited".into());
        }
        obs.copies.remove(2);
        let drifted = plan_of(&r, &obs, last.as_deref());
        assert_eq!(drifted.digest, last);
        assert!(drifted.always_run);
        assert_eq!(names(&applied(&drifted)), ["t1/b", "t2/a"]);
    }

    #[test]
    fn copies_read_as_fingerprints_are_compared_like_whole_copies() {
        let r = rule(&["t1"]);
        let (a, b) = (
            source(RuleType::Configmap, "a", "1"),
            source(RuleType::Configmap, "b", "1"),
        );
        let mut obs = observed(vec![a.clone(), b.clone()], &["t1"]);
        obs.copies = vec![
            desired_copy(&r, &a, "t1").fingerprinted(),
            desired_copy(&r, &b, "t1").fingerprinted(),
        ];
        assert!(obs.copies.iter().all(|c| c.content.is_none()));
        let in_sync = plan_of(&r, &obs, None);
        assert!(in_sync.steps.is_empty(), "{:?}", in_sync.steps);
        obs.sources[1] = source(RuleType::Configmap, "b", "2");
        assert_eq!(names(&applied(&plan_of(&r, &obs, None))), ["t1/b"]);
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
        let plan = plan_of(&r, &obs, None);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        assert!(plan.inventory.as_ref().unwrap().is_empty());
        let s = status(&plan);
        assert_eq!(s["foreignCount"], 2);
        assert_eq!(s["targets"][0]["result"], "Conflict");
        assert_eq!(s["targets"][0]["foreign"], json!(["a"]));
        let warning = &plan.events[0];
        assert!(warning.is_warning() && warning.reason == "ForeignObject");
        assert!(
            warning.note.contains("t1/a") && warning.note.contains("t2/a"),
            "{}",
            warning.note
        );
        assert_eq!(plan.requeue_after, Some(FOREIGN_RECHECK));
    }

    #[test]
    fn copies_no_longer_wanted_are_pruned_or_retained() {
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
        let p = plan_of(&r, &obs, None);
        // t1/a is up to date: nothing to apply; the rest is pruned by the engine.
        assert!(p.steps.is_empty(), "{:?}", p.steps);
        assert!(p.prune);
        assert_eq!(ids(p.inventory.as_ref().unwrap()), ["t1/a"]);
        let mut stale = ids(&p.stale);
        stale.sort();
        assert_eq!(stale, ["t1/a", "t1/old", "t9/a"]);
        assert!(p.stale.iter().any(|o| o.kind == "Secret"));
        assert_eq!(status(&p)["removed"].as_array().unwrap().len(), 3);

        let mut retain = r.clone();
        retain.deletion_policy = DeletionPolicy::Retain;
        let p = plan_of(&retain, &obs, None);
        assert!(!p.prune);
        assert_eq!(status(&p)["retained"].as_array().unwrap().len(), 3);
        assert_eq!(status(&p)["removed"], json!([]));
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
        let p = plan_of(&r, &obs, None);
        assert!(p.steps.is_empty(), "{:?}", p.steps);
        assert!(p.stale.is_empty());
        assert!(!p.always_run);
    }

    #[test]
    fn nothing_to_copy_means_no_kubectl() {
        let p = plan_of(&rule(&[]), &observed(vec![], &["t1"]), None);
        assert!(p.steps.is_empty());
        assert!(!p.always_run);
        assert_eq!(status(&p)["copyCount"], 0);
    }

    #[test]
    fn a_rule_over_the_byte_cap_is_too_large() {
        let r = rule(&[]);
        let big = source(RuleType::Configmap, "big", &"x".repeat(1024 * 1024));
        let spaces: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
        let names: Vec<&str> = spaces.iter().map(String::as_str).collect();
        let err = plan(&r, &observed(vec![big], &names), None, &rails()).unwrap_err();
        assert!(matches!(err, HandlerError::TooLarge(_)), "{err}");
        assert!(err.to_string().contains("--copyrator-max-bytes"), "{err}");
    }

    #[test]
    fn the_status_is_fitted_under_its_byte_limit() {
        let long = "n".repeat(250);
        let mut status = CopiesStatus {
            targets: (0..100)
                .map(|i| TargetStatus {
                    namespace: format!("ns-{i}"),
                    result: "Copied".into(),
                    copied: (0..50).map(|j| format!("{long}{j}")).collect(),
                    ..Default::default()
                })
                .collect(),
            sources: (0..50).map(|j| format!("{long}{j}")).collect(),
            target_count: 100,
            ..Default::default()
        };
        assert!(serde_json::to_string(&status).unwrap().len() > 1_000_000);
        fit(&mut status, STATUS_LIMIT);
        assert!(serde_json::to_string(&status).unwrap().len() <= STATUS_LIMIT);
        assert_eq!(status.target_count, 100, "counts stay complete");
    }

    #[test]
    fn a_long_rule_name_gets_a_field_manager_within_the_limit() {
        let mut r = rule(&[]);
        r.name = "r".repeat(200);
        assert!(field_manager(&r).len() <= 128);
        assert_eq!(field_manager(&rule(&[])), "copyrator.src.r");
    }

    fn only(namespaces: &[&str]) -> Rails {
        Rails {
            scope: Scope::Only(namespaces.iter().map(|n| n.to_string()).collect()),
            ..rails()
        }
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
                ("later", &outside)
            ]
        );
    }
}
