//! Debugging against the live cluster: `diff` and `render KIND/NAME` on a
//! Sample, and `--keep-overlays` following its resources. (`diff` of a
//! CopyratorRule, Secrets masked, is in tests/copyrator.rs.)

use ko_test_support as common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::sample::{Sample, SampleSpec, replicas};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const TIMEOUT: Duration = Duration::from_secs(60);

async fn ready_sample(client: &kube::Client, ns: &str, name: &str, count: i32) -> Api<Sample> {
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    samples
        .create(
            &PostParams::default(),
            &Sample::new(name, SampleSpec { count }),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, format!("the Sample {name} Ready"), || async {
        samples
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|s| s.status)
            .is_some_and(|s| s.is_ready())
    })
    .await;
    samples
}

#[tokio::test]
async fn diff_reports_a_scaled_deployment_until_the_operator_corrects_it() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "dbg-diff").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::start_operator(&ns.name, &[]).await;
    ready_sample(&client, &ns.name, "web", 2).await;
    // In sync: nothing to change (once the status the Deployment
    // controller writes has settled too: kubectl diff compares it).
    diff_is_clean(&ns.name).await;
    operator.stop().await;

    let (ok, _, err) =
        common::kubectl(&["-n", &ns.name, "scale", "deployment/web", "--replicas=5"]);
    assert!(ok, "{err}");
    let (code, out, err) =
        common::operator_command("diff", &["samples/web", "--namespace", &ns.name]);
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("-  replicas: 5"), "{out}");
    assert!(out.contains("+  replicas: 2"), "{out}");
    // diff changed nothing.
    assert_eq!(replicas(&deployments, "web").await, Some(5));

    // The operator's resync takes the field back; then diff is clean.
    let operator = common::start_operator(&ns.name, &["--resync-interval", "1s"]).await;
    common::wait_until(
        TIMEOUT,
        "the resync to take the Deployment web back to 2 replicas",
        || async { replicas(&deployments, "web").await == Some(2) },
    )
    .await;
    // With a real node the Deployment controller may still be settling
    // the status of the scale-down.
    diff_is_clean(&ns.name).await;
    operator.stop().await;
}

/// Waits until `diff` of the Sample `web` in `namespace` finds nothing to
/// change. `kubectl diff` compares whole objects, status included, so a
/// Deployment whose status its controller is still writing differs for a
/// moment after its spec is in sync.
async fn diff_is_clean(namespace: &str) {
    common::wait_for(TIMEOUT, "diff to find nothing to change", async || {
        let (code, out, err) = common::operator_command("diff", &["sample/web", "-n", namespace]);
        match code {
            Some(0) if out.trim().is_empty() => Ok(()),
            _ => Err(format!("exit {code:?}\nstdout:\n{out}\nstderr:\n{err}")),
        }
    })
    .await;
}

#[tokio::test]
async fn diff_fails_clearly_for_a_resource_that_is_not_there() {
    let _client = common::cluster().await;
    let (code, _, err) =
        common::operator_command("diff", &["sample/no-such-sample", "-n", "default"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = common::operator_command("diff", &["gizmo/x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown kind \"gizmo\""), "{err}");
}

/// Every file under `dir`, by relative path, with its content and mode.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            if path.is_dir() {
                assert_eq!(mode, 0o700, "{}", path.display());
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                files.push((rel, std::fs::read(&path).unwrap(), mode));
            }
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn render_by_reference_equals_render_of_the_same_object_from_a_file() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "dbg-render").await;
    let operator = common::start_operator(&ns.name, &[]).await;
    ready_sample(&client, &ns.name, "web", 1).await;
    operator.stop().await;

    let work = tempfile::tempdir().unwrap();
    let (ok, yaml, err) = common::kubectl(&["-n", &ns.name, "get", "sample", "web", "-o", "yaml"]);
    assert!(ok, "{err}");
    let file = work.path().join("web.yaml");
    std::fs::write(&file, yaml).unwrap();
    let by_file = work.path().join("by-file");
    let by_ref = work.path().join("by-ref");
    let (code, _, err) = common::operator_command(
        "render",
        &[
            "-f",
            file.to_str().unwrap(),
            "--out",
            by_file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = common::operator_command(
        "render",
        &[
            "sample/web",
            "-n",
            &ns.name,
            "--out",
            by_ref.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("apply:"), "{out}");
    assert!(!err.contains("no metadata.uid"), "{err}");
    let files = tree(&by_ref);
    assert!(
        files
            .iter()
            .any(|(p, _, _)| p == Path::new("kustomization.yaml"))
    );
    assert!(files.iter().all(|(_, _, mode)| *mode == 0o600), "{files:?}");
    assert_eq!(files, tree(&by_file));
    // What kubectl kustomize builds from it is what the operator applied.
    let (ok, built, err) = common::kubectl(&["kustomize", by_ref.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        built.contains("kind: Deployment") && built.contains("name: web"),
        "{built}"
    );
}

#[tokio::test]
async fn a_kept_overlay_is_private_and_goes_with_its_resource() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "dbg-keep").await;
    let keep = tempfile::tempdir().unwrap();
    let operator = common::start_operator(
        &ns.name,
        &["--keep-overlays", &keep.path().display().to_string()],
    )
    .await;
    let samples = ready_sample(&client, &ns.name, "web", 1).await;
    let kept = keep.path().join("sample").join(&ns.name).join("web");
    let files = tree(&kept);
    assert!(
        files
            .iter()
            .any(|(p, _, _)| p == Path::new("kustomization.yaml")),
        "{files:?}"
    );
    assert!(files.iter().all(|(_, _, mode)| *mode == 0o600), "{files:?}");

    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(!kept.exists(), "the kept overlay outlived its resource");
    operator.stop().await;
}

/// The value of the env var `name` of the first container of the
/// Deployment that `kubectl kustomize dir` builds.
fn deployment_env(dir: &Path, name: &str) -> String {
    let (ok, built, err) = common::kubectl(&["kustomize", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&built).unwrap();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let var = env.iter().find(|e| e["name"] == name).unwrap();
    var["value"].as_str().unwrap().to_string()
}

/// kro's cel-functions instance, as kro's example writes it (no uid), seeds
/// a string with `metadata.uid`: offline, `render` gives it the stand-in
/// UID, says so, and renders what the same file with that UID renders.
#[test]
fn render_gives_a_file_without_a_uid_a_stand_in_and_says_so() {
    let work = tempfile::tempdir().unwrap();
    let kro = common::repo().join("tests/fixtures/kro");
    let instance = "apiVersion: kro.run/v1alpha1\nkind: Something\n\
        metadata:\n  name: my-instance-will-cel-functions\n{uid}spec:\n  name: app\n";
    let stand_in = "00000000-0000-0000-0000-000000000000";
    let mut seeded = Vec::new();
    for (file, uid) in [
        ("no-uid", String::new()),
        ("stand-in", format!("  uid: {stand_in}\n")),
    ] {
        let path = work.path().join(format!("{file}.yaml"));
        std::fs::write(&path, instance.replace("{uid}", &uid)).unwrap();
        let out = work.path().join(file);
        let (code, _, err) = common::operator_command(
            "render",
            &[
                "--kustomize-dir",
                kro.to_str().unwrap(),
                "-f",
                path.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(code, Some(0), "{file}: {err}");
        let said = err.contains(&format!("saw the stand-in {stand_in}"));
        assert_eq!(said, uid.is_empty(), "{file}: {err}");
        seeded.push(deployment_env(&out, "RANDOM_SEEDED_STRING"));
    }
    assert_eq!(seeded[0].len(), 10, "{seeded:?}");
    assert_eq!(seeded[0], seeded[1], "the stand-in is the seed");
}

/// The JSON log lines of `log` whose message is `message`.
fn lines_saying(log: &str, message: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["fields"]["message"] == message)
        .collect()
}

#[tokio::test]
async fn a_reconciles_log_lines_carry_its_span_naming_the_kind_the_resource_and_its_generation() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "dbg-span").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let operator = common::OperatorProcess::spawn(&ns.name, &[("LOG_FORMAT", "json")], &[]);
    ready_sample(&client, &ns.name, "web", 1).await;
    // A deleted Deployment: the reconcile that applies it again says so.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let said = "owned objects were deleted; applying again";
    common::wait_until(
        TIMEOUT,
        format!("the operator's log saying {said:?}"),
        || async { !lines_saying(&operator.log(), said).is_empty() },
    )
    .await;
    let line = &lines_saying(&operator.log(), said)[0];
    let span = &line["span"];
    assert_eq!(span["name"], "reconcile", "{line}");
    assert_eq!(span["kind"], "Sample", "{line}");
    assert_eq!(span["object"], format!("{}/web", ns.name), "{line}");
    assert_eq!(span["generation"], 1, "{line}");
}
