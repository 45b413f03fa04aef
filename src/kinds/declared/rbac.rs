//! The RBAC a declared kind needs: a ClusterRole labelled
//! [`AGGREGATE_LABEL`], whose rules the API server aggregates into the
//! ClusterRole [`AGGREGATING_ROLE`] that an install binds to the operator's
//! ServiceAccount. Granting a kind to an installed operator is one `kubectl
//! apply` of this role; it carries no binding. An install grants its own
//! declared kinds (`deploy/rbac/sample.yaml`) with `rbac --bind` instead: a
//! role bound to its ServiceAccount, so that deleting the install changes
//! no source of the aggregating role (the control plane's aggregation
//! controller, rewriting that role's rules as its sources go, would create
//! it again while it is being deleted). The rules come from what the
//! kind's overlay can produce: the objects of its base (as `kubectl
//! kustomize` builds it), the kinds its resource templates declare, and its
//! generators.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{ApiResource, GroupVersionKind};
use serde::Serialize;
use serde_json::Value;

use super::DeclaredKind;
use crate::names::ServiceAccount;

/// Verbs on the kind's own resources: the watch, and the finalizer (patch).
const RESOURCE_VERBS: [&str; 4] = ["get", "list", "watch", "patch"];
/// Verbs on the objects its overlays produce: ownership checks (get), the
/// health watch (list, watch), server-side apply (create, patch), prune
/// and cleanup (delete).
const OBJECT_VERBS: [&str; 6] = ["get", "list", "watch", "create", "patch", "delete"];
/// Verbs on the objects its references read: reads (get, list) as the
/// writing identity, the operator's watch (list, watch).
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// The label (value `"true"`) that aggregates a ClusterRole's rules into
/// [`AGGREGATING_ROLE`], and so grants them to the operator.
pub const AGGREGATE_LABEL: &str = "kustomize-operator.io/aggregate-to-operator";

/// The ClusterRole of an install (`deploy/rbac/kind-definitions.yaml`) that
/// selects [`AGGREGATE_LABEL`] and is bound to the operator's ServiceAccount.
pub const AGGREGATING_ROLE: &str = "kustomize-operator-kinds";

/// An object type: apiVersion and kind.
pub type ObjectType = (String, String);

/// The object types `kind`'s overlays can produce, given what its base
/// builds to.
pub fn object_types(kind: &DeclaredKind, base: &[Value]) -> BTreeSet<ObjectType> {
    let mut types: BTreeSet<ObjectType> = base
        .iter()
        .filter_map(|o| {
            Some((
                o["apiVersion"].as_str()?.to_string(),
                o["kind"].as_str()?.to_string(),
            ))
        })
        .collect();
    types.extend(kind.resource_types.iter().cloned());
    let overlay = &kind.file.spec.overlay;
    if !overlay.config_map_generator.is_empty() {
        types.insert(("v1".into(), "ConfigMap".into()));
    }
    if !overlay.secret_generator.is_empty() {
        types.insert(("v1".into(), "Secret".into()));
    }
    types
}

/// One RBAC rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// API groups.
    pub api_groups: Vec<String>,
    /// Resources (plurals).
    pub resources: Vec<String>,
    /// Verbs.
    pub verbs: Vec<String>,
}

/// The rules a declared kind needs, by what they are on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindRules {
    /// On the kind's own resources and their status: the watch, the
    /// finalizer, the status. The operator's account always needs them.
    pub own: Vec<Rule>,
    /// On the objects its overlays produce, one rule per API group: what
    /// the identity writing them needs.
    pub objects: Vec<Rule>,
    /// On the objects its references read: the identity writing reads
    /// them (get, list), the operator watches them (list, watch).
    pub reads: Vec<Rule>,
}

impl KindRules {
    /// The rules the identity writing the objects needs: on them, and on
    /// what the references read.
    pub fn writer(&self) -> Vec<Rule> {
        self.objects.iter().chain(&self.reads).cloned().collect()
    }

    /// Every rule, the kind's own first: the ClusterRole's.
    pub fn all(&self) -> Vec<Rule> {
        self.own
            .iter()
            .chain(&self.objects)
            .chain(&self.reads)
            .cloned()
            .collect()
    }
}

/// The rules for `kind`, whose overlays produce `types`.
pub fn rules(kind: &DeclaredKind, types: &BTreeSet<ObjectType>) -> KindRules {
    rules_of_revisions([(kind, types)])
}

/// The rules for the revisions of one kind (each may serve a resource),
/// each with the object types its overlays produce: what any of them
/// writes or reads. Their own resources are the first revision's (every
/// revision serves the same group and plural).
pub fn rules_of_revisions<'a>(
    revisions: impl IntoIterator<Item = (&'a DeclaredKind, &'a BTreeSet<ObjectType>)>,
) -> KindRules {
    let (mut own, mut types, mut read_types) = (Vec::new(), BTreeSet::new(), BTreeSet::new());
    for (kind, produced) in revisions {
        if own.is_empty() {
            own = own_rules(&kind.resource);
        }
        types.extend(produced.iter().cloned());
        read_types.extend(
            (kind.file.spec.references.values()).map(|r| (r.api_version.clone(), r.kind.clone())),
        );
    }
    KindRules {
        own,
        objects: by_group(&types, &OBJECT_VERBS),
        reads: by_group(&read_types, &READ_VERBS),
    }
}

/// The rules on a kind's own resources and their status.
fn own_rules(resource: &ApiResource) -> Vec<Rule> {
    let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        Rule {
            api_groups: vec![resource.group.clone()],
            resources: vec![resource.plural.clone()],
            verbs: strings(&RESOURCE_VERBS),
        },
        Rule {
            api_groups: vec![resource.group.clone()],
            resources: vec![format!("{}/status", resource.plural)],
            verbs: strings(&["patch"]),
        },
    ]
}

/// One rule per API group of `types`, with `verbs`.
fn by_group(types: &BTreeSet<ObjectType>, verbs: &[&str]) -> Vec<Rule> {
    let mut plurals: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (api_version, object_kind) in types {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, object_kind));
        plurals
            .entry(group.to_string())
            .or_default()
            .insert(resource.plural);
    }
    plurals
        .into_iter()
        .map(|(group, plurals)| Rule {
            api_groups: vec![group],
            resources: plurals.into_iter().collect(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
        })
        .collect()
}

/// The ClusterRole as YAML, with a comment saying where it comes from and
/// how it reaches the operator: labelled [`AGGREGATE_LABEL`], or with
/// `bind`, unlabelled and followed by a ClusterRoleBinding of the same name
/// to that account.
pub fn manifests(
    kind: &DeclaredKind,
    rules: &KindRules,
    bind: Option<&ServiceAccount>,
) -> Result<String, String> {
    let name = format!("kustomize-operator-{}", kind.name());
    let mut labels = serde_json::json!({"app.kubernetes.io/name": "kustomize-operator"});
    if bind.is_none() {
        labels[AGGREGATE_LABEL] = "true".into();
    }
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": labels},
        "rules": rules.all(),
    });
    let mut yaml = serde_saphyr::to_string(&role).map_err(|e| e.to_string())?;
    if let Some(account) = bind {
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "kustomize-operator"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account.name, "namespace": account.namespace}],
        });
        yaml.push_str("---\n");
        yaml.push_str(&serde_saphyr::to_string(&binding).map_err(|e| e.to_string())?);
    }
    Ok(format!("{}{yaml}", header(kind, bind)))
}

/// The comment above a kind's ClusterRole.
fn header(kind: &DeclaredKind, bind: Option<&ServiceAccount>) -> String {
    let what = format!(
        "# {} ({}), declared by the kind folder {}/.\n",
        kind.resource.kind,
        kind.resource.api_version,
        kind.name(),
    );
    match bind {
        None => format!(
            "{what}# Generated by `kustomize-operator rbac --kinds {}`: the controller watches\n\
             # the resources, adds and removes its finalizer and writes their status; the\n\
             # engine reads, watches, applies and deletes the objects their overlays produce.\n\
             # No binding: the label {AGGREGATE_LABEL} adds these\n\
             # rules to every install's aggregating ClusterRole ({AGGREGATING_ROLE} in\n\
             # deploy/rbac/kind-definitions.yaml), which is bound to its ServiceAccount:\n\
             # `kubectl apply` of this file is the whole grant.\n",
            kind.name(),
        ),
        Some(account) => format!(
            "{what}# Generated by `kustomize-operator rbac --kinds {} --bind {}/{}`.\n\
             # The controller watches the resources, adds and removes its finalizer and\n\
             # writes their status; the engine reads, watches, applies and deletes the\n\
             # objects their overlays produce.\n\
             # Bound to that ServiceAccount, not labelled {AGGREGATE_LABEL}:\n\
             # deleting the install then changes no source of its aggregating ClusterRole\n\
             # ({AGGREGATING_ROLE}), which the control plane would otherwise create\n\
             # again, empty and unlabelled, while the install is being deleted.\n",
            kind.name(),
            account.namespace,
            account.name,
        ),
    }
}

/// The object types a resource template declares: the top-level
/// `apiVersion:` and `kind:` lines of each of its documents, which must be
/// literal (not templated).
pub fn declared_types(template: &str) -> Result<Vec<ObjectType>, String> {
    let mut types = Vec::new();
    for document in template.split("\n---") {
        let field = |key: &str| {
            document
                .lines()
                .filter_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
                .next()
        };
        let (api_version, kind) = (field("apiVersion:"), field("kind:"));
        match (api_version, kind) {
            (None, None) => continue,
            (Some(a), Some(k))
                if !a.contains("{{") && !k.contains("{{") && !a.is_empty() && !k.is_empty() =>
            {
                types.push((a, k));
            }
            _ => {
                return Err(
                    "each document needs literal top-level apiVersion: and kind: lines (they decide the operator's RBAC)"
                        .into(),
                );
            }
        }
    }
    Ok(types)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_templates_declare_their_types_literally() {
        let t = "{# a service #}\napiVersion: v1\nkind: Service\nmetadata:\n  name: {{ metadata.name }}\n---\napiVersion: \"networking.k8s.io/v1\"\nkind: Ingress\n";
        assert_eq!(
            declared_types(t).unwrap(),
            vec![
                ("v1".to_string(), "Service".to_string()),
                ("networking.k8s.io/v1".to_string(), "Ingress".to_string())
            ]
        );
        assert!(declared_types("apiVersion: v1\nkind: {{ spec.kind }}\n").is_err());
        assert!(declared_types("kind: Service\n").is_err());
        assert!(declared_types("# nothing\n").unwrap().is_empty());
    }
}
