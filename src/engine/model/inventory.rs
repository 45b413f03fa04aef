//! What a resource owns: the ownership marker on every object the engine
//! applies, the inventory of those objects recorded in status, and the set
//! of objects to prune.
//!
//! The marker is a label holding the owner's UID (selectable, and unique to
//! one resource: a resource deleted and created again under the same name is
//! another owner) and an annotation naming the owner for people
//! (`Sample.nuvolaris.org/h2/web`). An object is the resource's own when the
//! label holds its UID.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The resource that owns what it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its apiVersion (`nuvolaris.org/v1`).
    pub api_version: String,
    /// Its kind (`Sample`).
    pub kind: String,
    /// Its namespace; `None` for a cluster-scoped resource.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl Owner {
    /// The label naming an object's owner by UID.
    pub const LABEL: &str = "kustomize-operator.io/owner";
    /// The annotation naming an object's owner as `Kind.group/namespace/name`.
    pub const ANNOTATION: &str = "kustomize-operator.io/owner";

    /// A Sample `web` (UID `u`) in `namespace`, for tests.
    #[cfg(test)]
    pub fn sample_web(namespace: Option<&str>) -> Self {
        Self {
            api_version: "nuvolaris.org/v1".into(),
            kind: "Sample".into(),
            namespace: namespace.map(str::to_string),
            name: "web".into(),
            uid: "u".into(),
        }
    }

    /// The value of [`Owner::ANNOTATION`]: `Kind.group/namespace/name`
    /// (`Kind.group/name` when cluster-scoped).
    pub fn annotation(&self) -> String {
        let group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = if group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{group}", self.kind)
        };
        match &self.namespace {
            Some(ns) => format!("{kind}/{ns}/{}", self.name),
            None => format!("{kind}/{}", self.name),
        }
    }

    /// True when `meta` carries this owner's marker.
    pub fn marks(&self, meta: &ObjectMeta) -> bool {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(Owner::LABEL))
            .is_some_and(|v| *v == self.uid)
    }

    /// True when a built manifest carries this owner's marker.
    pub fn marks_manifest(&self, manifest: &Value) -> bool {
        manifest["metadata"]["labels"][Owner::LABEL].as_str() == Some(self.uid.as_str())
    }

    /// The ownerReference namespaced objects in the owner's namespace get.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }
}

/// Who else owns an object, in words, for a conflict message: another
/// resource's marker, a controller's ownerReference, or the field managers
/// that wrote it.
pub fn describe_owner(meta: &ObjectMeta) -> String {
    if let Some(owner) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(Owner::ANNOTATION))
    {
        return format!("owned by {owner}");
    }
    if let Some(controller) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
    {
        return format!("controlled by {} {}", controller.kind, controller.name);
    }
    let managers: BTreeSet<&str> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    if managers.is_empty() {
        "not created by this resource".into()
    } else {
        format!(
            "not created by this resource (written by {})",
            managers.into_iter().collect::<Vec<_>>().join(", ")
        )
    }
}

/// One object, identified.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectId {
    /// `apps/v1`, `v1`.
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
    /// Its namespace; `None` when cluster-scoped.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl ObjectId {
    /// True when objects of this group and kind are current once they exist
    /// (they have no status worth watching).
    pub(crate) fn always_current_kind(group: &str, kind: &str) -> bool {
        ALWAYS_CURRENT.contains(&(group, kind))
    }

    /// The identity of a manifest; `None` when it lacks apiVersion, kind or name.
    pub fn of_manifest(manifest: &Value) -> Option<Self> {
        Some(Self {
            api_version: manifest["apiVersion"].as_str()?.to_string(),
            kind: manifest["kind"].as_str()?.to_string(),
            namespace: manifest["metadata"]["namespace"]
                .as_str()
                .filter(|ns| !ns.is_empty())
                .map(str::to_string),
            name: manifest["metadata"]["name"].as_str()?.to_string(),
        })
    }

    /// The API group (empty for the core group).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }

    /// The version (`v1`).
    pub fn version(&self) -> &str {
        self.api_version
            .rsplit_once('/')
            .map_or(self.api_version.as_str(), |(_, v)| v)
    }

    /// How kubectl names the object in its output: `deployment.apps/web`.
    pub fn kubectl_name(&self) -> String {
        let kind = self.kind.to_lowercase();
        match self.group() {
            "" => format!("{kind}/{}", self.name),
            group => format!("{kind}.{group}/{}", self.name),
        }
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} in {ns}", self.kubectl_name()),
            None => f.write_str(&self.kubectl_name()),
        }
    }
}

/// The objects a resource owns, as recorded in its status: grouped by API
/// version, kind and namespace, names sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// How many objects.
    pub count: u32,
    /// The objects.
    #[serde(default)]
    pub objects: Vec<InventoryGroup>,
}

/// Objects of one kind in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryGroup {
    /// `apps/v1`.
    pub api_version: String,
    /// `Deployment`.
    pub kind: String,
    /// Absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Their names.
    pub names: Vec<String>,
}

impl Inventory {
    /// The inventory of these objects.
    pub fn of(ids: &BTreeSet<ObjectId>) -> Self {
        let mut objects: Vec<InventoryGroup> = Vec::new();
        for id in ids {
            match objects.last_mut() {
                Some(g)
                    if g.api_version == id.api_version
                        && g.kind == id.kind
                        && g.namespace == id.namespace =>
                {
                    g.names.push(id.name.clone());
                }
                _ => objects.push(InventoryGroup {
                    api_version: id.api_version.clone(),
                    kind: id.kind.clone(),
                    namespace: id.namespace.clone(),
                    names: vec![id.name.clone()],
                }),
            }
        }
        Self {
            count: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            objects,
        }
    }

    /// Every object listed.
    pub fn ids(&self) -> BTreeSet<ObjectId> {
        self.objects
            .iter()
            .flat_map(|g| {
                g.names.iter().map(|name| ObjectId {
                    api_version: g.api_version.clone(),
                    kind: g.kind.clone(),
                    namespace: g.namespace.clone(),
                    name: name.clone(),
                })
            })
            .collect()
    }
}

/// Kinds whose objects are current as soon as they exist: not watched.
const ALWAYS_CURRENT: [(&str, &str); 14] = [
    ("", "ConfigMap"),
    ("", "Secret"),
    ("", "ServiceAccount"),
    ("", "Endpoints"),
    ("", "LimitRange"),
    ("", "ResourceQuota"),
    ("", "Namespace"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("networking.k8s.io", "NetworkPolicy"),
    ("networking.k8s.io", "IngressClass"),
    ("scheduling.k8s.io", "PriorityClass"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(kind: &str, ns: Option<&str>, name: &str) -> ObjectId {
        ObjectId {
            api_version: if kind == "Deployment" {
                "apps/v1"
            } else {
                "v1"
            }
            .into(),
            kind: kind.into(),
            namespace: ns.map(str::to_string),
            name: name.into(),
        }
    }

    fn owner() -> Owner {
        Owner {
            api_version: "nuvolaris.org/v1".into(),
            kind: "Sample".into(),
            namespace: Some("h2".into()),
            name: "web".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn the_marker_names_the_owner_by_uid() {
        let o = owner();
        assert_eq!(o.annotation(), "Sample.nuvolaris.org/h2/web");
        let mut meta = ObjectMeta::default();
        assert!(!o.marks(&meta));
        meta.labels = Some([(Owner::LABEL.to_string(), "u-2".to_string())].into());
        assert!(!o.marks(&meta), "another resource's marker");
        meta.labels = Some([(Owner::LABEL.to_string(), "u-1".to_string())].into());
        assert!(o.marks(&meta));
        assert!(o.marks_manifest(&json!({"metadata": {"labels": {Owner::LABEL: "u-1"}}})));
        let cluster = Owner {
            namespace: None,
            api_version: "v1".into(),
            kind: "Thing".into(),
            ..owner()
        };
        assert_eq!(cluster.annotation(), "Thing/web");
    }

    #[test]
    fn a_foreign_object_is_described_by_who_wrote_it() {
        let mut meta = ObjectMeta::default();
        meta.managed_fields = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
                manager: Some("kubectl-create".into()),
                ..Default::default()
            },
        ]);
        assert_eq!(
            describe_owner(&meta),
            "not created by this resource (written by kubectl-create)"
        );
        meta.annotations = Some(
            [(
                Owner::ANNOTATION.into(),
                "Sample.nuvolaris.org/h2/other".into(),
            )]
            .into(),
        );
        assert_eq!(
            describe_owner(&meta),
            "owned by Sample.nuvolaris.org/h2/other"
        );
    }

    #[test]
    fn ids_come_from_manifests_and_print_as_kubectl_does() {
        let d = ObjectId::of_manifest(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "h2"}
        }))
        .unwrap();
        assert_eq!(d.kubectl_name(), "deployment.apps/web");
        assert_eq!((d.group(), d.version()), ("apps", "v1"));
        assert_eq!(d.to_string(), "deployment.apps/web in h2");
        let c = ObjectId::of_manifest(&json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}
        }))
        .unwrap();
        assert_eq!(c.kubectl_name(), "configmap/x");
        assert_eq!(c.namespace, None);
        assert!(ObjectId::of_manifest(&json!({"kind": "ConfigMap"})).is_none());
    }

    #[test]
    fn the_inventory_groups_and_round_trips() {
        let ids: BTreeSet<_> = [
            id("ConfigMap", Some("a"), "x"),
            id("ConfigMap", Some("a"), "y"),
            id("ConfigMap", Some("b"), "x"),
            id("Deployment", Some("a"), "web"),
        ]
        .into();
        let inv = Inventory::of(&ids);
        assert_eq!(inv.count, 4);
        assert_eq!(inv.objects.len(), 3);
        assert_eq!(inv.objects[0].names, ["web"]);
        assert_eq!(inv.objects[1].names, ["x", "y"]);
        assert_eq!(inv.ids(), ids);
    }
}
