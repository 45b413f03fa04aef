//! Overlay tests: every fixture resource is rendered with `render` and built
//! with the real `kubectl kustomize`; the output must equal the expected
//! manifests checked in beside it. No cluster needed, only kubectl.

mod common;

use std::path::Path;

use kustomize_operator::kinds::KindOptions;
use kustomize_operator::render::render_file;

fn fixtures() -> Vec<std::path::PathBuf> {
    let root = common::repo().join("tests/fixtures");
    let mut found = Vec::new();
    for kind in std::fs::read_dir(&root).unwrap().filter_map(Result::ok) {
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
        let summary = render_file(
            &fixture,
            out.path(),
            &common::repo().join("kustomize"),
            &KindOptions::default(),
        )
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

#[test]
fn render_refuses_a_non_empty_output_directory() {
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("keep.txt"), "mine").unwrap();
    let err = render_file(
        &common::repo().join("tests/fixtures/sample/web.yaml"),
        out.path(),
        &common::repo().join("kustomize"),
        &KindOptions::default(),
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
    let err = render_file(
        &file,
        &dir.path().join("out"),
        &common::repo().join("kustomize"),
        &KindOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("v1 Pod is not a kind this operator reconciles"),
        "{err}"
    );
}
