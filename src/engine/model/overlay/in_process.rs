//! The overlays the engine writes, built in process instead of by
//! `kubectl kustomize`, for a narrow subset kustomize's semantics are exactly
//! known for: a base folder of plain files, whole objects, JSON 6902 patches
//! with a literal target, `namespace`, `labels`, and the owner's marker, over
//! Deployments, Services, ConfigMaps and ServiceAccounts. Anything else
//! (generators, strategic-merge patches, name prefixes, other kinds, a
//! selector label where kustomize would also touch affinity terms) yields
//! `None`, and kubectl builds the overlay as before.
//!
//! Building in process costs microseconds where a `kubectl kustomize` run
//! costs milliseconds of CPU per overlay; a Sample's overlay is in the
//! subset. `tests/properties.rs` builds every overlay of every kind both
//! ways, from generated specs, and `tests/overlays.rs` every combination of
//! the subset's fields; both require the same objects, in the same order.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Kustomization, KustomizePatch, Labels, Marking};

/// The kinds the subset covers, in the order `kubectl kustomize` prints
/// them (its legacy order): `(apiVersion, kind)`.
const KINDS: [(&str, &str); 4] = [
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
];

/// The base folder's `kustomization.yaml`, when it lists files only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BaseKustomization {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
}

/// The objects `kubectl kustomize` would build from `k` over `files`,
/// marked for `marking`; `None` when the overlay is outside the subset.
pub(super) fn build(
    k: &Kustomization,
    files: &BTreeMap<String, Vec<u8>>,
    marking: Option<&Marking>,
) -> Option<Vec<Value>> {
    let in_subset = k.name_prefix.is_none()
        && k.name_suffix.is_none()
        && k.config_map_generator.is_empty()
        && k.secret_generator.is_empty()
        && k.generator_options.is_none();
    if !in_subset {
        return None;
    }
    let mut objects = Vec::new();
    for path in &k.resources {
        objects.extend(load(path, files)?);
    }
    for patch in &k.patches {
        apply_patch(patch, files, &mut objects)?;
    }
    if let Some(namespace) = &k.namespace {
        for object in &mut objects {
            object["metadata"]["namespace"] = Value::String(namespace.clone());
        }
    }
    if let Some(namespace) = &k.namespace_if_unset {
        for object in &mut objects {
            if object["metadata"]["namespace"].as_str().is_none() {
                object["metadata"]["namespace"] = Value::String(namespace.clone());
            }
        }
    }
    for labels in &k.labels {
        for object in &mut objects {
            add_labels(labels, object)?;
        }
    }
    if let Some(marking) = marking {
        for object in &mut objects {
            // kustomize merges into existing ownerReferences, and matches an
            // object without a namespace to `default`: leave both to it.
            let meta = &object["metadata"];
            let unplaced = marking.owner_references && meta["namespace"].as_str().is_none();
            if meta.get("ownerReferences").is_some() || unplaced {
                return None;
            }
            marking.mark(object);
        }
    }
    in_print_order(objects)
}

/// The objects of one `resources` entry: the base folder or a file.
fn load(path: &str, files: &BTreeMap<String, Vec<u8>>) -> Option<Vec<Value>> {
    if path != "base" {
        return documents(files.get(path)?);
    }
    let base: BaseKustomization =
        serde_saphyr::from_slice(files.get("base/kustomization.yaml")?).ok()?;
    // A Component, or a version of its own: kustomize's to judge.
    let kustomization = base.kind.as_deref().is_none_or(|k| k == "Kustomization")
        && (base.api_version.as_deref()).is_none_or(|v| v == "kustomize.config.k8s.io/v1beta1");
    if !kustomization {
        return None;
    }
    let mut objects = Vec::new();
    for file in &base.resources {
        if file.contains('/') || file.starts_with('.') {
            return None;
        }
        objects.extend(documents(files.get(&format!("base/{file}"))?)?);
    }
    Some(objects)
}

/// The objects of a YAML stream, each of a kind in the subset.
fn documents(bytes: &[u8]) -> Option<Vec<Value>> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.contains("<<") || text.contains('&') {
        // Merge keys and anchors: leave their expansion to kustomize.
        return None;
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).ok()?;
    let objects: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    objects.iter().all(in_subset).then_some(objects)
}

/// True for an object of a kind the subset covers, with a name.
fn in_subset(object: &Value) -> bool {
    let named = object["metadata"]["name"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    named && rank(object).is_some()
}

/// The object's place in `kubectl kustomize`'s output order.
fn rank(object: &Value) -> Option<usize> {
    let api_version = object["apiVersion"].as_str()?;
    let kind = object["kind"].as_str()?;
    KINDS
        .iter()
        .position(|&(v, k)| v == api_version && k == kind)
}

/// Applies one `patches` entry: a JSON 6902 patch with a literal target.
fn apply_patch(
    patch: &KustomizePatch,
    files: &BTreeMap<String, Vec<u8>>,
    objects: &mut [Value],
) -> Option<()> {
    let target = patch.target.as_ref()?;
    let literal = |s: &Option<String>| {
        s.as_deref().is_none_or(|s| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    };
    if patch.options.is_some() || target.kind.is_none() || !literal(&target.kind) {
        return None;
    }
    if !literal(&target.name) || !literal(&target.group) || !literal(&target.version) {
        return None;
    }
    let ops: Value = serde_saphyr::from_slice(files.get(&patch.path)?).ok()?;
    if !ops.is_array() {
        // A strategic-merge patch.
        return None;
    }
    let ops: json_patch::Patch = serde_json::from_value(ops).ok()?;
    let mut matched = 0;
    for object in objects.iter_mut().filter(|o| targeted(target, o)) {
        json_patch::patch(object, &ops).ok()?;
        matched += 1;
    }
    (matched > 0 && objects.iter().all(in_subset)).then_some(())
}

/// True when `object` is one `target` selects.
fn targeted(target: &super::PatchTarget, object: &Value) -> bool {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    is(&target.kind, object["kind"].as_str().unwrap_or_default())
        && is(
            &target.name,
            object["metadata"]["name"].as_str().unwrap_or_default(),
        )
        && is(&target.group, group)
        && is(&target.version, version)
}

/// Adds one `labels` entry's pairs where kustomize puts them: metadata
/// always; with `includeSelectors` a Deployment's selector and Pod template
/// and a Service's selector; with `includeTemplates` a Deployment's Pod
/// template.
fn add_labels(labels: &Labels, object: &mut Value) -> Option<()> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let mut paths: Vec<&[&str]> = vec![&["metadata", "labels"]];
    match kind.as_str() {
        "Deployment" if labels.include_selectors => {
            let pod = &object["spec"]["template"]["spec"];
            if pod.get("affinity").is_some() || pod.get("topologySpreadConstraints").is_some() {
                // kustomize also edits the label selectors of these terms.
                return None;
            }
            paths.push(&["spec", "selector", "matchLabels"]);
            paths.push(&["spec", "template", "metadata", "labels"]);
        }
        "Deployment" if labels.include_templates => {
            paths.push(&["spec", "template", "metadata", "labels"]);
        }
        "Service" if labels.include_selectors => paths.push(&["spec", "selector"]),
        _ => {}
    }
    for path in paths {
        let map = map_at(object, path)?;
        for (key, value) in &labels.pairs {
            map.insert(key.clone(), Value::String(value.clone()));
        }
    }
    Some(())
}

/// The map at `path` in `object`, created (with its parents) when absent
/// or null; `None` when something else is there.
fn map_at<'a>(object: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut at = object;
    for key in path {
        let map = at.as_object_mut()?;
        let next = map.entry(key.to_string()).or_insert(Value::Null);
        if next.is_null() {
            *next = Value::Object(Map::new());
        }
        at = next;
    }
    at.as_object_mut()
}

/// The objects in `kubectl kustomize`'s order; `None` when two share a
/// kind (their order is left to kustomize).
fn in_print_order(mut objects: Vec<Value>) -> Option<Vec<Value>> {
    let kinds: BTreeSet<Option<usize>> = objects.iter().map(rank).collect();
    if kinds.len() != objects.len() {
        return None;
    }
    objects.sort_by_key(rank);
    Some(objects)
}

#[cfg(test)]
mod tests {
    use super::super::{Overlay, PatchTarget, PatchTemplate};
    use super::*;
    use crate::engine::model::inventory::Owner;
    use crate::engine::model::templates::KustomizeDir;
    use serde_json::json;

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: nginx\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: nginx}\n  template:\n    metadata:\n      labels: {app: nginx}\n    spec:\n      containers: [{name: nginx, image: nginx}]\n";

    fn kustomize_dir(patch: &str, deployment: &str) -> (tempfile::TempDir, KustomizeDir) {
        let kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deployment.yaml]\n";
        super::super::tests::kind_folder(
            "demo",
            &[
                ("base/kustomization.yaml", kustomization),
                ("base/deployment.yaml", deployment),
                ("patches/deployment.yaml", patch),
            ],
        )
    }

    const RENAME: &str = "- op: replace\n  path: /metadata/name\n  value: {{ name }}\n- op: replace\n  path: /spec/replicas\n  value: {{ count | json }}\n";

    fn overlay() -> Overlay {
        Overlay {
            base: Some("demo".into()),
            namespace: Some("team".into()),
            labels: vec![Labels {
                pairs: BTreeMap::from([("instance".into(), "web".into())]),
                include_selectors: true,
                include_templates: true,
            }],
            values: json!({"name": "web", "count": 3}),
            patches: vec![PatchTemplate {
                template: "deployment.yaml".into(),
                target: Some(PatchTarget {
                    kind: Some("Deployment".into()),
                    name: Some("nginx".into()),
                    ..Default::default()
                }),
                allow_name_change: false,
            }],
            ..Default::default()
        }
    }

    fn marking() -> Marking {
        Marking {
            owner: Owner {
                api_version: "example.com/v1".into(),
                kind: "Demo".into(),
                namespace: Some("team".into()),
                name: "web".into(),
                uid: "u-1".into(),
            },
            owner_references: true,
        }
    }

    #[test]
    fn a_based_overlay_is_built_renamed_labelled_and_marked() {
        let (_root, dir) = kustomize_dir(RENAME, DEPLOYMENT);
        let rendered = overlay().render(&dir, Some(&marking())).unwrap();
        let built = rendered.prebuilt().expect("in the subset");
        assert_eq!(built.len(), 1);
        let d = &built[0];
        assert_eq!(d["metadata"]["name"], "web");
        assert_eq!(d["metadata"]["namespace"], "team");
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(d["metadata"]["labels"]["instance"], "web");
        assert_eq!(d["spec"]["selector"]["matchLabels"]["instance"], "web");
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"]["instance"],
            "web"
        );
        assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert!(!rendered.is_plain());
    }

    #[test]
    fn what_is_outside_the_subset_is_left_to_kubectl() {
        let strategic = "metadata:\n  name: {{ name }}\n";
        let (_root, dir) = kustomize_dir(strategic, DEPLOYMENT);
        assert!(overlay().render(&dir, None).unwrap().prebuilt().is_none());

        let affinity = DEPLOYMENT.replace("containers:", "affinity: {}\n      containers:");
        let (_root, dir) = kustomize_dir(RENAME, &affinity);
        assert!(overlay().render(&dir, None).unwrap().prebuilt().is_none());

        let job = DEPLOYMENT.replace("kind: Deployment", "kind: StatefulSet");
        let (_root, dir) = kustomize_dir(RENAME, &job);
        assert!(overlay().render(&dir, None).unwrap().prebuilt().is_none());

        let (_root, dir) = kustomize_dir(RENAME, DEPLOYMENT);
        let mut regex_target = overlay();
        regex_target.patches[0].target.as_mut().unwrap().name = Some("ngin.".into());
        assert!(
            regex_target
                .render(&dir, None)
                .unwrap()
                .prebuilt()
                .is_none()
        );

        let mut prefixed = overlay();
        prefixed.name_prefix = Some("a-".into());
        assert!(prefixed.render(&dir, None).unwrap().prebuilt().is_none());
    }

    #[test]
    fn an_object_without_a_namespace_is_left_to_kubectl_to_own() {
        let (_root, dir) = kustomize_dir(RENAME, DEPLOYMENT);
        let mut unplaced = overlay();
        unplaced.namespace = None;
        assert!(unplaced.render(&dir, None).unwrap().prebuilt().is_some());
        let marked = unplaced.render(&dir, Some(&marking())).unwrap();
        assert!(marked.prebuilt().is_none());
    }

    #[test]
    fn a_namespace_set_only_where_unset_keeps_the_ones_objects_name() {
        let placed = DEPLOYMENT.replace("  name: nginx\n", "  name: nginx\n  namespace: other\n");
        for (deployment, expected) in [(DEPLOYMENT, "team"), (placed.as_str(), "other")] {
            let (_root, dir) = kustomize_dir(RENAME, deployment);
            let mut keeping = overlay();
            keeping.namespace_unset_only = true;
            let rendered = keeping.render(&dir, None).unwrap();
            let built = rendered.prebuilt().expect("in the subset");
            assert_eq!(built[0]["metadata"]["namespace"], expected);
            let kustomization = String::from_utf8_lossy(&rendered.files()["kustomization.yaml"]);
            assert!(kustomization.contains("unsetOnly: true"), "{kustomization}");
            assert!(
                !kustomization.contains("\nnamespace: team"),
                "{kustomization}"
            );
        }
    }

    #[test]
    fn a_base_alone_is_built_unless_it_is_a_component() {
        let (_root, dir) = kustomize_dir(RENAME, DEPLOYMENT);
        let base = Overlay {
            base: Some("demo".into()),
            ..Default::default()
        };
        let built = base.render(&dir, None).unwrap();
        assert_eq!(built.prebuilt().expect("in the subset").len(), 1);

        let component = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [deployment.yaml]\n";
        let (_root, dir) = super::super::tests::kind_folder(
            "demo",
            &[
                ("base/kustomization.yaml", component),
                ("base/deployment.yaml", DEPLOYMENT),
            ],
        );
        assert!(base.render(&dir, None).unwrap().prebuilt().is_none());
    }

    #[test]
    fn a_patch_that_fails_is_left_to_kubectl_to_report() {
        let missing = "- op: replace\n  path: /spec/nothing/here\n  value: 1\n";
        let (_root, dir) = kustomize_dir(missing, DEPLOYMENT);
        assert!(overlay().render(&dir, None).unwrap().prebuilt().is_none());
    }

    #[test]
    fn two_objects_print_in_kustomize_order() {
        let service =
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}});
        let deployment =
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}});
        let built = in_print_order(vec![deployment.clone(), service.clone()]).unwrap();
        assert_eq!(built, vec![service.clone(), deployment]);
        assert!(in_print_order(vec![service.clone(), service]).is_none());
    }
}
