//! `kind pack` and `kind unpack` through the binary, without a cluster: a
//! folder round-trips byte for byte, and `crd` and `render` given the
//! packed definition (`--kind-definition`) print what they print for the
//! folder.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the operator binary; its standard output, or a panic with stderr.
fn run(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
        .args(args)
        .current_dir(common::repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every file under `dir`, by relative path, with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                found.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

/// Packs `folder` (relative to the repository) into `work/packed.yaml`.
fn pack(folder: &str, work: &Path) -> PathBuf {
    let packed = work.join(format!("{}.yaml", folder.replace('/', "-")));
    std::fs::write(&packed, run(&["kind", "pack", folder])).unwrap();
    packed
}

#[test]
fn a_kind_folder_round_trips_byte_for_byte() {
    let work = tempfile::tempdir().unwrap();
    for folder in [
        "training/06-your-own-kind/greeting",
        "tests/fixtures/kinds/webapp",
    ] {
        let packed = pack(folder, work.path());
        let out = work.path().join("out");
        run(&[
            "kind",
            "unpack",
            packed.to_str().unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
        ]);
        let name = Path::new(folder).file_name().unwrap();
        assert_eq!(
            files(&common::repo().join(folder)),
            files(&out.join(name)),
            "{folder}"
        );
    }
}

#[test]
fn crd_and_render_take_a_packed_definition_as_they_take_its_folder() {
    let work = tempfile::tempdir().unwrap();
    let packed = pack("training/06-your-own-kind/greeting", work.path());
    let packed = packed.to_str().unwrap();
    let from_folder = run(&[
        "crd",
        "--kustomize-dir",
        "kustomize,training/06-your-own-kind",
        "--kinds",
        "greeting",
    ]);
    let from_packed = run(&[
        "crd",
        "--kustomize-dir",
        "kustomize",
        "--kind-definition",
        packed,
        "--kinds",
        "greeting",
    ]);
    assert!(String::from_utf8_lossy(&from_folder).contains("greetings.hello.nuvolaris.org"));
    assert_eq!(from_folder, from_packed);

    let (a, b) = (work.path().join("a"), work.path().join("b"));
    let resource = "training/06-your-own-kind/hello.yaml";
    run(&[
        "render",
        "-f",
        resource,
        "--kustomize-dir",
        "kustomize,training/06-your-own-kind",
        "--out",
        a.to_str().unwrap(),
    ]);
    run(&[
        "render",
        "-f",
        resource,
        "--kind-definition",
        packed,
        "--out",
        b.to_str().unwrap(),
    ]);
    let rendered = files(&a);
    assert!(
        rendered
            .iter()
            .any(|(_, text)| String::from_utf8_lossy(text).contains("Hello from lab 06"))
    );
    assert_eq!(rendered, files(&b));
}

#[test]
fn a_packed_definition_that_escapes_its_folder_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let evil = work.path().join("evil.yaml");
    std::fs::write(
        &evil,
        "apiVersion: kustomize-operator.io/v1alpha1\nkind: KindDefinition\nmetadata: {name: evil}\nspec: {files: {'base/../../../x': boom}}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
        .args(["crd", "--kind-definition", evil.to_str().unwrap()])
        .current_dir(common::repo())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("evil.yaml") && stderr.contains("not a file inside"),
        "{stderr}"
    );
    assert!(!work.path().join("x").exists());
}
