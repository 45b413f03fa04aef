//! Hostile strings cannot change the structure of any rendered document:
//! every value that reaches a template or a generated file arrives as one
//! scalar, byte for byte.

mod common;

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
    // them directly, in every place a value lands: a patch template value,
    // a generated label and the generated namespace.
    let shape = |value: &str| {
        let mut overlay = planned.clone();
        overlay.patches[0].values["metadata"]["name"] = value.into();
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
