//! Overlay tests: every fixture resource is rendered with `render` and built
//! with the real `kubectl kustomize`; the output must equal the expected
//! manifests checked in beside it. No cluster needed, only kubectl.

use ko_test_support as common;

use std::path::Path;

use kustomize_operator::kind::{KustomizeDir, Labels, Overlay, PatchTarget, PatchTemplate};
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
            values: serde_json::json!({"name": "renamed"}),
            patches: vec![PatchTemplate {
                template: "p.yaml".into(),
                target: Some(PatchTarget {
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

/// What the docs show: the files of their examples (a fenced YAML block
/// whose first line, or a line after `---`, is a `# /tmp/...` path
/// comment) and what they say an example renders (a block whose first
/// line is `# rendered from /tmp/<resource>.yaml`).
#[derive(Default)]
struct DocExamples {
    /// Path under `/tmp/` → text.
    files: Vec<(String, String)>,
    /// The resource, and the documents it renders (excerpts), with the
    /// doc they are in.
    rendered: Vec<(String, String, Vec<serde_json::Value>)>,
}

/// The path a `# /tmp/...` comment line names, under `/tmp/`.
fn path_comment(line: &str) -> Option<String> {
    let rest = line.strip_prefix("# /tmp/")?;
    let path = rest.split_whitespace().next()?.trim_end_matches(':');
    Some(path.to_string())
}

impl DocExamples {
    fn read(&mut self, doc: &Path) {
        let text = std::fs::read_to_string(doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        let mut block: Option<Vec<&str>> = None;
        for line in text.lines() {
            match (&mut block, line.trim_start().starts_with("```")) {
                (None, true) if line.trim_start() == "```yaml" => block = Some(Vec::new()),
                (Some(lines), true) => {
                    let lines = std::mem::take(lines);
                    self.block(&name, &lines);
                    block = None;
                }
                (Some(lines), false) => lines.push(line),
                _ => {}
            }
        }
    }

    fn block(&mut self, doc: &str, lines: &[&str]) {
        let Some(first) = lines.first() else { return };
        if let Some(resource) = first.strip_prefix("# rendered from /tmp/") {
            let resource = resource.split_whitespace().next().unwrap().to_string();
            let docs = serde_saphyr::from_multiple(&lines[1..].join("\n"))
                .unwrap_or_else(|e| panic!("{doc}: {first}: {e}"));
            self.rendered.push((doc.to_string(), resource, docs));
            return;
        }
        let mut current: Option<(String, Vec<&str>)> = None;
        for (i, line) in lines.iter().enumerate() {
            let starts = i == 0 || lines[i - 1] == "---";
            match path_comment(line).filter(|_| starts) {
                Some(path) => {
                    if let Some((done, mut text)) = current.take() {
                        text.pop(); // the `---` before this file
                        self.files.push((done, text.join("\n") + "\n"));
                    }
                    current = Some((path, Vec::new()));
                }
                None => {
                    if let Some((_, text)) = &mut current {
                        text.push(line);
                    }
                }
            }
        }
        if let Some((path, text)) = current {
            self.files.push((path, text.join("\n") + "\n"));
        }
    }
}

/// True when `actual` has every field `shown` has, with the same value (a
/// list: the items shown, in order, each a part of the item there).
fn shows_part_of(shown: &serde_json::Value, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (shown, actual) {
        (Value::Object(shown), Value::Object(actual)) => shown
            .iter()
            .all(|(k, v)| actual.get(k).is_some_and(|a| shows_part_of(v, a))),
        (Value::Array(shown), Value::Array(actual)) => {
            shown.len() <= actual.len()
                && shown.iter().zip(actual).all(|(s, a)| shows_part_of(s, a))
        }
        _ => shown == actual,
    }
}

/// Every template example of README.md and docs/ (kind folders written as
/// `# /tmp/kinds/<kind>/...` blocks) renders as the docs say: each
/// `# rendered from` block is a part of what `render` and `kubectl
/// kustomize` give for that resource, and every kind folder shown is
/// rendered by one.
#[test]
fn every_template_example_in_the_docs_renders_as_it_says() {
    let repo = common::repo();
    let mut docs = vec![repo.join("README.md"), repo.join("docs/kind-file.md")];
    let mut kind_docs: Vec<_> = std::fs::read_dir(repo.join("docs/kinds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    kind_docs.sort();
    docs.extend(kind_docs);
    let mut examples = DocExamples::default();
    for doc in &docs {
        examples.read(doc);
    }
    let tmp = tempfile::tempdir().unwrap();
    for (path, text) in &examples.files {
        let file = tmp.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, text).unwrap();
    }
    let kinds: Vec<String> = examples
        .files
        .iter()
        .filter_map(|(p, _)| p.strip_prefix("kinds/")?.strip_suffix("/kind.yaml"))
        .map(str::to_string)
        .collect();
    assert!(
        kinds.contains(&"website".to_string()) && kinds.len() >= 2,
        "the docs' kind folders: {kinds:?}"
    );
    let dirs = format!(
        "{},{}",
        repo.join("kustomize").display(),
        tmp.path().join("kinds").display()
    );
    let mut rendered_kinds = Vec::new();
    for (doc, resource, shown) in &examples.rendered {
        let out = tmp.path().join(format!("out-{resource}"));
        let summary = render_file(
            &tmp.path().join(resource),
            &out,
            &common::render_args_with(&dirs),
        )
        .unwrap_or_else(|e| panic!("{doc}: rendering /tmp/{resource}: {e}"));
        let mut built: Vec<serde_json::Value> = Vec::new();
        for (_, dir) in &summary.overlays {
            built
                .extend(serde_saphyr::from_multiple::<serde_json::Value>(&kustomize(dir)).unwrap());
        }
        for document in shown {
            let same = |b: &&serde_json::Value| {
                b["kind"] == document["kind"]
                    && b["metadata"]["name"] == document["metadata"]["name"]
            };
            let actual = built.iter().find(same).unwrap_or_else(|| {
                panic!("{doc}: /tmp/{resource} renders no such object: {document}")
            });
            assert!(
                shows_part_of(document, actual),
                "{doc}: /tmp/{resource} renders\n{actual:#}\nnot\n{document:#}"
            );
        }
        let text = std::fs::read_to_string(tmp.path().join(resource)).unwrap();
        let kind: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        rendered_kinds.push(kind["kind"].as_str().unwrap().to_lowercase());
    }
    for kind in &kinds {
        assert!(
            rendered_kinds.contains(kind),
            "the docs show the kind folder {kind} but render none of its resources"
        );
    }
}
