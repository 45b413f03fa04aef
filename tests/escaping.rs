//! Hostile strings cannot change the structure of any rendered document:
//! every value that reaches a template or a generated file arrives as one
//! scalar, byte for byte.

use ko_test_support as common;

use std::collections::BTreeSet;

use kustomize_operator::kind::{KustomizeDir, Step};
use kustomize_operator::kinds::KindOptions;
use serde_json::json;

fn hostile_strings() -> Vec<String> {
    vec![
        "x\nkind: Secret".into(),
        "\"quoted\" and 'single'".into(),
        "{{ name }} {% if true %}x{% endif %}".into(),
        "---\napiVersion: v1\nkind: Secret".into(),
        "a: b\n  c: [d]".into(),
        "# comment".into(),
        "&anchor *alias !!tag".into(),
        "tab\there, nul\u{0} del\u{7f} nel\u{85} bom\u{feff}".into(),
        "x".repeat(100 * 1024),
    ]
}

fn docs(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("not YAML: {e}\n{yaml:.300}"))
}

fn keys(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(items) = v.as_array() {
        for (i, child) in items.iter().enumerate() {
            let path = format!("{prefix}/{i}");
            out.insert(path.clone());
            keys(child, &path, out);
        }
    }
    if let Some(map) = v.as_object() {
        for (k, child) in map {
            let path = format!("{prefix}/{k}");
            out.insert(path.clone());
            keys(child, &path, out);
        }
    }
}

#[test]
fn hostile_names_stay_one_scalar_in_every_rendered_file() {
    let dir = KustomizeDir::load(&common::repo().join("kustomize")).unwrap();
    let benign_sample = json!({
        "apiVersion": "nuvolaris.org/v1", "kind": "Sample",
        "metadata": {"name": "benign", "namespace": "ns"}, "spec": {"count": 1},
    });
    let planned = common::kind_of(&benign_sample)
        .render(&benign_sample, &[], &KindOptions::default(), &dir)
        .unwrap();
    let Some(Step::Apply {
        overlay: planned, ..
    }) = planned.steps.first()
    else {
        panic!("the Sample's plan applies an overlay")
    };
    // The API server would refuse most of these as names; the overlay is fed
    // them directly, in every place a value lands: the templates' values,
    // a generated label and the generated namespace.
    let shape = |value: &str| {
        let mut overlay = planned.clone();
        overlay.values["metadata"]["name"] = value.into();
        overlay.labels[0]
            .pairs
            .insert("app.kubernetes.io/instance".into(), value.into());
        overlay.namespace = Some(value.into());
        overlay.render(&dir, None).unwrap()
    };
    let benign = shape("benign");
    for hostile in hostile_strings() {
        let rendered = shape(&hostile);
        assert_eq!(
            rendered.files().keys().collect::<Vec<_>>(),
            benign.files().keys().collect::<Vec<_>>(),
            "files changed"
        );
        for (path, bytes) in rendered.files() {
            if !path.ends_with(".yaml") {
                continue;
            }
            let text = String::from_utf8(bytes.clone()).unwrap();
            let got = docs(&text);
            let want = docs(std::str::from_utf8(&benign.files()[path]).unwrap());
            assert_eq!(
                got.len(),
                want.len(),
                "{path}: document count changed for {hostile:.40?}"
            );
            for (g, w) in got.iter().zip(&want) {
                let (mut gk, mut wk) = (BTreeSet::new(), BTreeSet::new());
                keys(g, "", &mut gk);
                keys(w, "", &mut wk);
                assert_eq!(gk, wk, "{path}: structure changed for {hostile:.40?}");
            }
            let as_text = serde_json::to_string(&got).unwrap();
            if path == "patches/00-deployment.yaml" {
                // The first JSON patch operation renames the Deployment.
                assert_eq!(
                    got[0][0]["value"],
                    serde_json::Value::String(hostile.clone())
                );
            }
            if path == "kustomization.yaml" {
                assert_eq!(
                    got[0]["namespace"],
                    serde_json::Value::String(hostile.clone())
                );
                assert!(as_text.contains("app.kubernetes.io/instance"));
            }
        }
    }
}

/// Pasted raw into a JSON patch, this closes the string and the operation and
/// adds a second one (`/data/injected`).
const JSON_INJECTION: &str = r#""x"}, {"op":"add","path":"/data/injected","value":"yes""#;

/// A declared kind whose patches are a JSON 6902 patch in a `.json` file and
/// a strategic-merge patch in an upper-case `.YAML` file, each pasting
/// `spec.text` into a ConfigMap's data.
fn json_and_upper_case_kind(root: &std::path::Path) {
    let kind = root.join("escaper");
    let files = [
        (
            "kind.yaml",
            r#"apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata:
  name: escaper
spec:
  group: escaping.example.com
  version: v1
  names: {kind: Escaper, plural: escapers}
  schema:
    type: object
    properties:
      text: {type: string}
  overlay:
    patches:
      - template: data.json
        target: {kind: ConfigMap, name: settings}
      - template: More.YAML
"#,
        ),
        (
            "base/kustomization.yaml",
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [settings.yaml]\n",
        ),
        (
            "base/settings.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  fixed: \"1\"\n",
        ),
        (
            "patches/data.json",
            r#"[{"op": "add", "path": "/data/fromJson", "value": {{ spec.text }}}]"#,
        ),
        (
            "patches/More.YAML",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  fromYaml: {{ spec.text }}\n",
        ),
    ];
    for (path, text) in files {
        let path = kind.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

/// The `render` flags, reading kinds from `dir` only.
fn render_args_for(dir: &std::path::Path) -> kustomize_operator::cli::CommonArgs {
    common::render_args_with(&dir.display().to_string())
}

/// A spec string meant to add a JSON-patch operation (or YAML keys) stays
/// one string value in a `.json` patch and in an upper-case `.YAML` one:
/// `render` then the real `kubectl kustomize`, as a user would replay it.
#[test]
fn values_stay_one_string_in_json_and_upper_case_yaml_patches() {
    let kinds = tempfile::tempdir().unwrap();
    json_and_upper_case_kind(kinds.path());
    let args = render_args_for(kinds.path());
    for text in [
        JSON_INJECTION.to_string(),
        "x\ninjected: yes".to_string(),
        "\"}] , {\"op\": \"remove\", \"path\": \"/data/fixed\"}, [{\"a\": \"".to_string(),
    ] {
        let cr = json!({
            "apiVersion": "escaping.example.com/v1", "kind": "Escaper",
            "metadata": {"name": "e", "namespace": "ns"}, "spec": {"text": text},
        });
        let file = kinds.path().join("cr.yaml");
        std::fs::write(&file, serde_json::to_string(&cr).unwrap()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let target = out.path().join("overlay");
        kustomize_operator::render::render_file(&file, &target, &args).unwrap();
        let (ok, built, err) = common::kubectl(&["kustomize", &target.display().to_string()]);
        assert!(ok, "kubectl kustomize: {err}");
        let objects = docs(&built);
        assert_eq!(objects.len(), 1, "{built}");
        let data = objects[0]["data"].as_object().unwrap();
        let keys: BTreeSet<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["fixed", "fromJson", "fromYaml"]),
            "{built}"
        );
        assert_eq!(data["fromJson"], json!(text), "{built}");
        assert_eq!(data["fromYaml"], json!(text), "{built}");
        assert_eq!(data["fixed"], json!("1"), "{built}");
    }
}

/// A template whose name says neither YAML nor JSON is refused when the
/// kinds load, with an error naming the file.
#[test]
fn a_template_named_neither_yaml_nor_json_is_refused_when_the_kind_loads() {
    let kinds = tempfile::tempdir().unwrap();
    json_and_upper_case_kind(kinds.path());
    let patches = kinds.path().join("escaper/patches");
    std::fs::rename(patches.join("data.json"), patches.join("data.json.tpl")).unwrap();
    let cr = kinds.path().join("cr.yaml");
    std::fs::write(
        &cr,
        "apiVersion: escaping.example.com/v1\nkind: Escaper\nmetadata: {name: e, namespace: ns}\nspec: {text: x}\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = kustomize_operator::render::render_file(
        &cr,
        &out.path().join("overlay"),
        &render_args_for(kinds.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("escaper/patches/data.json.tpl"), "{err}");
    assert!(err.contains(".yaml, .yml or .json"), "{err}");
}
