//! Overlay tests: every fixture resource is rendered with `render` and built
//! with the real `kubectl kustomize`; the output must equal the expected
//! manifests checked in beside it. No cluster needed, only kubectl.

use ko_test_support as common;

use std::path::Path;

use kustomize_operator::kind::{KustomizeDir, Labels, Overlay, PatchTemplate, Target};
use kustomize_operator::render::render_file;

fn fixtures() -> Vec<std::path::PathBuf> {
    let root = common::repo().join("tests/fixtures");
    let mut found = Vec::new();
    for kind in std::fs::read_dir(&root).unwrap().filter_map(Result::ok) {
        // tests/fixtures/kinds declares kinds; the others hold resources.
        if kind.file_name() == "kinds" {
            continue;
        }
        for f in std::fs::read_dir(kind.path())
            .unwrap()
            .filter_map(Result::ok)
        {
            let p = f.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !name.ends_with(".expected.yaml") {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

fn kustomize(dir: &Path) -> String {
    let (ok, out, err) = common::kubectl(&["kustomize", &dir.display().to_string()]);
    assert!(ok, "kubectl kustomize {} failed: {err}", dir.display());
    out
}

#[test]
fn rendered_fixtures_build_to_the_expected_manifests() {
    let fixtures = fixtures();
    assert!(!fixtures.is_empty());
    for fixture in fixtures {
        let out = tempfile::tempdir().unwrap();
        let summary = render_file(&fixture, out.path(), &common::render_args())
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        let mut built = String::new();
        for (_, dir) in &summary.overlays {
            built.push_str(&kustomize(dir));
        }
        let expected_path = fixture.with_extension("expected.yaml");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        assert_eq!(
            built,
            expected,
            "{} differs from {}",
            fixture.display(),
            expected_path.display()
        );
    }
}

/// The engine builds overlays of whole objects (Copyrator's copies,
/// ChaosAgent's partial objects) in memory instead of running `kubectl
/// kustomize`, so that Secret data is never written to disk: for every such
/// fixture, what it builds must be what kustomize builds from the overlay
/// `render` writes.
#[test]
fn overlays_built_in_memory_equal_what_kustomize_builds() {
    let dir = common::kustomize_dirs();
    let mut compared = 0;
    for fixture in fixtures() {
        let text = std::fs::read_to_string(&fixture).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        let (resource, rest) = docs.split_first().unwrap();
        let mut resource = resource.clone();
        // As `render` does: a resource without a namespace is in `default`.
        if resource["metadata"]["namespace"].is_null() {
            resource["metadata"]["namespace"] = "default".into();
        }
        let kind = common::kind_of(&resource);
        let out = kind
            .render(
                &resource,
                rest,
                &common::render_args().kind_options(None),
                &dir,
            )
            .unwrap();
        for overlay in out.overlays.iter().flatten() {
            let Some(prebuilt) = overlay.prebuilt() else {
                continue;
            };
            let tmp = tempfile::tempdir().unwrap();
            overlay.write_to(tmp.path()).unwrap();
            let built: Vec<serde_json::Value> =
                serde_saphyr::from_multiple(&kustomize(tmp.path())).unwrap();
            let key = |v: &serde_json::Value| v.to_string();
            let mut want: Vec<_> = built.iter().map(key).collect();
            let mut got: Vec<_> = prebuilt.iter().map(key).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "{}", fixture.display());
            compared += 1;
        }
    }
    assert!(compared >= 3, "only {compared} in-memory overlays compared");
}

/// A base of every kind the engine builds in process (Deployment, Service,
/// ConfigMap, ServiceAccount), with label fields kustomize edits or leaves.
const SUBSET_BASE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: "nginx:1.27", args: ["on", "yes", "0x1F", "1e3"]}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web}
data: {enabled: "true", count: "007", text: "a: b"}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web}
"#;

fn subset_kind_dir(patch: &str) -> (tempfile::TempDir, KustomizeDir) {
    let root = tempfile::tempdir().unwrap();
    let kind = root.path().join("demo");
    std::fs::create_dir_all(kind.join("base")).unwrap();
    std::fs::create_dir_all(kind.join("patches")).unwrap();
    let kustomization =
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [all.yaml]\n";
    std::fs::write(kind.join("base/kustomization.yaml"), kustomization).unwrap();
    std::fs::write(kind.join("base/all.yaml"), SUBSET_BASE).unwrap();
    std::fs::write(kind.join("patches/p.yaml"), patch).unwrap();
    let dir = KustomizeDir::load(root.path()).unwrap();
    (root, dir)
}

/// Every combination of the fields the in-process build covers (labels
/// with and without selectors and templates, a namespace, a JSON patch on
/// one kind) builds to exactly what `kubectl kustomize` prints, in its order.
#[test]
fn overlays_in_the_in_process_subset_build_as_kustomize_builds_them() {
    let patch = "- op: replace\n  path: /metadata/name\n  value: {{ name }}\n- op: add\n  path: /spec/type\n  value: ClusterIP\n";
    let (_root, dir) = subset_kind_dir(patch);
    let mut compared = 0;
    for (selectors, templates, namespace) in [
        (true, true, Some("team")),
        (false, true, None),
        (false, false, Some("team")),
        (true, false, None),
    ] {
        let overlay = Overlay {
            base: Some("demo".into()),
            namespace: namespace.map(str::to_string),
            labels: vec![
                Labels {
                    pairs: [("app.kubernetes.io/instance".to_string(), "1e3".to_string())].into(),
                    include_selectors: selectors,
                    include_templates: templates,
                },
                Labels {
                    pairs: [("tier".to_string(), "true".to_string())].into(),
                    include_selectors: false,
                    include_templates: false,
                },
            ],
            patches: vec![PatchTemplate {
                template: "p.yaml".into(),
                values: serde_json::json!({"name": "renamed"}),
                target: Some(Target {
                    kind: Some("Service".into()),
                    name: Some("web".into()),
                    ..Default::default()
                }),
                allow_name_change: false,
            }],
            ..Default::default()
        };
        let rendered = overlay.render(&dir, None).unwrap();
        let native = rendered.prebuilt().expect("in the in-process subset");
        let tmp = tempfile::tempdir().unwrap();
        rendered.write_to(tmp.path()).unwrap();
        let printed: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&kustomize(tmp.path())).unwrap();
        assert_eq!(
            native,
            printed.as_slice(),
            "selectors {selectors}, templates {templates}"
        );
        compared += 1;
    }
    assert_eq!(compared, 4);
}

#[test]
fn render_refuses_a_non_empty_output_directory() {
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("keep.txt"), "mine").unwrap();
    let err = render_file(
        &common::repo().join("tests/fixtures/sample/web.yaml"),
        out.path(),
        &common::render_args(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn render_names_an_unknown_kind() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n").unwrap();
    let err = render_file(&file, &dir.path().join("out"), &common::render_args())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("v1 Pod is not a kind this operator reconciles"),
        "{err}"
    );
}
