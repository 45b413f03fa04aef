//! `kind pack` and `kind unpack` through the binary, without a cluster: a
//! folder round-trips byte for byte, and `crd` and `render` given the
//! packed definition (`--kind-definition`) print what they print for the
//! folder.

use ko_test_support as common;

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

/// Every file, directory and symlink under `dir` (paths relative to it),
/// symlinks not followed.
fn everything(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            found.push(path.strip_prefix(dir).unwrap().to_path_buf());
            if path.is_dir() && !path.is_symlink() {
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Runs the operator binary in `cwd` with `TMPDIR=tmp`; its exit status and
/// standard error.
fn run_in(cwd: &Path, tmp: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
        .args(args)
        .current_dir(cwd)
        .env("TMPDIR", tmp)
        .env_remove("KUSTOMIZE_DIR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A packed definition whose carried files, or whose name, point outside
/// the folder it unpacks into: `../` climbing out of it (to each level
/// up to the test's sandbox), an absolute path, a name that climbs. Each
/// is refused, naming the file, by both commands that unpack one (`crd
/// --kind-definition`, which unpacks into `$TMPDIR`, and `kind unpack
/// --out-dir`), and nothing appears anywhere in the sandbox: not where
/// the climbing paths lead (`$TMPDIR/x`, the working directory, the
/// levels above), not at the absolute path, not in the output directory.
/// An output folder that is a symlink (to a directory elsewhere, or
/// dangling) is not written through.
#[test]
fn a_packed_definition_that_escapes_its_folder_writes_nothing_anywhere() {
    let sandbox = tempfile::tempdir().unwrap();
    let root = sandbox.path();
    // Deep enough that every climb below stays inside the sandbox: the
    // unpacked folder is tmp/kustomize-operator-kinds-XXXX/evil (crd) or
    // out/evil (unpack), four levels under the sandbox.
    let cwd = root.join("a/b");
    let (tmp, out) = (cwd.join("tmp"), cwd.join("out"));
    for dir in [&tmp, &out] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let absolute = root.join("abs/x");
    // The repository's kind folders, so that a refusal is the only reason
    // `crd` could fail.
    let kustomize = common::repo().join("kustomize").display().to_string();
    let mut cases: Vec<(String, String, &str)> = vec![
        ("../x".into(), "evil".into(), "not a relative path"),
        ("../../x".into(), "evil".into(), "not a relative path"),
        (
            absolute.display().to_string(),
            "evil".into(),
            "not a relative path",
        ),
        ("base/../../x".into(), "evil".into(), "not a file inside"),
        (
            "patches/../../../x".into(),
            "evil".into(),
            "not a file inside",
        ),
        (
            "base/../../../../x".into(),
            "evil".into(),
            "not a file inside",
        ),
        (
            "base/../../../../../x".into(),
            "evil".into(),
            "not a file inside",
        ),
        ("base/x".into(), "../evil".into(), "not a kind name"),
        ("base/x".into(), "../../evil".into(), "not a kind name"),
    ];
    // What each climb from the two places of the unpacked folder reaches.
    let reached = [
        tmp.join("x"),
        out.join("x"),
        cwd.join("x"),
        root.join("a/x"),
        root.join("x"),
        absolute.clone(),
    ];
    // What the test made: nothing else may appear.
    let made = ["a", "a/b", "a/b/tmp", "a/b/out"];
    for (i, (path, name, refusal)) in cases.drain(..).enumerate() {
        let file = cwd.join(format!("evil-{i}.yaml"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: kustomize-operator.io/v1alpha1\nkind: KindDefinition\nmetadata: {{name: '{name}'}}\nspec: {{files: {{'{path}': boom}}}}\n"
            ),
        )
        .unwrap();
        let file = file.to_str().unwrap();
        for args in [
            vec![
                "crd",
                "--kustomize-dir",
                &kustomize,
                "--kind-definition",
                file,
            ],
            vec!["kind", "unpack", file, "--out-dir", out.to_str().unwrap()],
        ] {
            let (ok, stderr) = run_in(&cwd, &tmp, &args);
            assert!(!ok, "{args:?} with {path:?} succeeded");
            assert!(
                stderr.contains(&format!("evil-{i}.yaml")) && stderr.contains(refusal),
                "{args:?} with {path:?} (name {name:?}): {stderr}"
            );
        }
        for place in &reached {
            assert!(!place.exists(), "{path:?} wrote {}", place.display());
        }
        let written: Vec<PathBuf> = everything(root)
            .into_iter()
            .filter(|p| !p.to_string_lossy().starts_with("a/b/evil-"))
            .filter(|p| !made.iter().any(|m| p == Path::new(m)))
            .collect();
        assert!(written.is_empty(), "{path:?} wrote {written:?}");
    }

    // A definition that is fine, unpacked where `out/evil` is a symlink.
    let good = cwd.join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: kustomize-operator.io/v1alpha1\nkind: KindDefinition\nmetadata: {name: evil}\nspec: {files: {'base/x': boom}}\n",
    )
    .unwrap();
    let elsewhere = root.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    for target in [elsewhere.clone(), root.join("dangling")] {
        let link = out.join("evil");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let args = [
            "kind",
            "unpack",
            good.to_str().unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
        ];
        let (ok, stderr) = run_in(&cwd, &tmp, &args);
        assert!(!ok, "unpacked through a symlink to {}", target.display());
        assert!(stderr.contains("out/evil"), "{stderr}");
        assert_eq!(
            everything(&elsewhere),
            Vec::<PathBuf>::new(),
            "written through the symlink"
        );
        assert!(
            !root.join("dangling").exists(),
            "created through the symlink"
        );
        std::fs::remove_file(&link).unwrap();
    }
    // The same definition unpacks where nothing is in the way: the refusals
    // above were not the command failing for another reason.
    let (ok, stderr) = run_in(
        &cwd,
        &tmp,
        &[
            "kind",
            "unpack",
            good.to_str().unwrap(),
            "--out-dir",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("evil/base/x")).unwrap(),
        "boom"
    );
}
