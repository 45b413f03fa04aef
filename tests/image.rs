//! The image `hack/image` builds (podman, from the Dockerfile), checked and
//! run for real:
//!
//! - what it holds: the operator, the pinned kubectl, `kustomize/` as in the
//!   repository, CA certificates, the non-root user, and no shell;
//! - `crd`, `render` and its kubectl run in it, offline, and give what the
//!   binary built from these sources gives (a stale image fails here);
//! - it runs as a kubelet runs the Deployment's Pod (`deploy/`): its user,
//!   read-only root, dropped capabilities, `/tmp` emptyDir (a tmpfs here) and
//!   environment from the manifest, the ServiceAccount's token, CA and
//!   namespace mounted at `/var/run/secrets/kubernetes.io/serviceaccount`,
//!   `KUBERNETES_SERVICE_HOST`/`_PORT`, no kubeconfig; it becomes ready,
//!   leads, serves metrics, reconciles a Sample with the kubectl inside it,
//!   and stops cleanly on SIGTERM within the grace period.
//!
//! `.ci/run` builds the image with `hack/image` before `hack/test`. Without
//! podman or the image these tests skip loudly, and fail under CI (`CI`
//! set to `true`, `1`, `yes` or anything but empty, `0`, `false`, `no`, `off`).

use ko_test_support as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;

use common::deploy::{NAMESPACE, ServiceAccountFiles, install};

/// The image `hack/image` builds and `deploy/` runs.
const IMAGE: &str = "kustomize-operator:dev";
const TIMEOUT: Duration = Duration::from_secs(60);

/// `hack/podman <args>`: podman with the project's configuration (the
/// storage `hack/image` builds into).
fn podman(args: &[&str]) -> Output {
    Command::new(common::repo().join("hack/podman"))
        .args(args)
        .output()
        .expect("run hack/podman")
}

/// Like [`podman`]; panics unless it succeeds; returns stdout.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// True when podman runs and the image exists. Otherwise the running test
/// skips, saying why (false), or fails under CI ([`common::skip`]).
fn image_available() -> bool {
    let out = podman(&["image", "exists", IMAGE]);
    if out.status.success() {
        return true;
    }
    let msg = match out.status.code() {
        Some(1) => format!("the image {IMAGE} does not exist; build it with `hack/image`"),
        _ => format!(
            "podman does not work ({}); `hack/image` installs podman and builds the image",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    };
    common::skip(&msg);
    false
}

/// The skips above fail in CI whatever a runner sets `CI` to, and name
/// their test.
#[test]
fn ci_is_any_value_of_ci_but_an_empty_or_false_one_and_a_skip_names_its_test() {
    for yes in ["true", "1", "yes", "TRUE", "on", "woodpecker"] {
        assert!(common::ci_value(Some(yes)), "CI={yes}");
    }
    for no in [
        None,
        Some(""),
        Some("0"),
        Some("false"),
        Some("No"),
        Some("off"),
    ] {
        assert!(!common::ci_value(no), "CI={no:?}");
    }
    assert_eq!(
        common::current_test(),
        "install::image::ci_is_any_value_of_ci_but_an_empty_or_false_one_and_a_skip_names_its_test"
    );
    let in_async = async { common::current_test() };
    assert_eq!(
        futures::executor::block_on(in_async),
        "install::image::ci_is_any_value_of_ci_but_an_empty_or_false_one_and_a_skip_names_its_test"
    );
}

/// Writes to the real stderr: not captured by the test harness, so the
/// measurements show in CI logs.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// `podman run --rm` of the image, offline, as the image's user with a
/// read-only root and a tmpfs at /tmp; `options` go before the image,
/// `args` after it. Panics unless it succeeds; returns stdout.
fn run_in_image(options: &[&str], args: &[&str]) -> String {
    let mut argv = vec![
        "run",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs",
        "/tmp",
    ];
    argv.extend_from_slice(options);
    argv.push(IMAGE);
    argv.extend_from_slice(args);
    podman_ok(&argv)
}

/// A container removed (with its storage) when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        // SIGTERM first: a running operator hands its Lease over.
        let _ = podman(&["rm", "--force", "--time", "10", &self.0]);
    }
}

/// A fresh container name.
fn container_name(prefix: &str) -> String {
    format!("ko-{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// The image's filesystem, exported from a container created from it.
fn export_filesystem() -> tempfile::TempDir {
    let container = Container(container_name("export"));
    podman_ok(&["create", "--name", &container.0, IMAGE]);
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("image.tar");
    podman_ok(&[
        "export",
        "--output",
        &tar.display().to_string(),
        &container.0,
    ]);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-xf")
        .arg(&tar)
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -xf the exported image");
    std::fs::remove_file(&tar).unwrap();
    dir
}

/// Every path under `root` (relative, sorted), without following links.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            found.push(path.strip_prefix(root).unwrap().to_path_buf());
            if path.symlink_metadata().unwrap().is_dir() {
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The files under `dir` with their contents.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    walk(dir)
        .into_iter()
        .filter(|p| dir.join(p).is_file())
        .map(|p| {
            let content = std::fs::read(dir.join(&p)).unwrap();
            (p, content)
        })
        .collect()
}

#[test]
fn the_image_holds_the_operator_kubectl_kustomize_certificates_and_no_shell() {
    use std::os::unix::fs::PermissionsExt;
    if !image_available() {
        return;
    }
    let inspect: Value = serde_json::from_str(&podman_ok(&["image", "inspect", IMAGE])).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/kustomize-operator"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["run"]));
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for var in [
        "KUSTOMIZE_DIR=/etc/kustomize-operator/kustomize",
        "KUBECTL=/usr/local/bin/kubectl",
        "WORK_DIR=/tmp/kustomize-operator",
        "HOME=/tmp",
    ] {
        assert!(env.contains(&var), "{var} in {env:?}");
    }
    say(&format!(
        "[image] {IMAGE}: {:.1} MB",
        inspect[0]["Size"].as_f64().unwrap() / 1e6
    ));

    let dir = export_filesystem();
    let root = dir.path().join("root");
    // kustomize/, byte for byte.
    assert_eq!(
        tree(&root.join("etc/kustomize-operator/kustomize")),
        tree(&common::repo().join("kustomize")),
        "the image's kustomize/ differs from the repository's: rebuild it with hack/image"
    );
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    assert!(
        bundle.matches("-----BEGIN CERTIFICATE-----").count() > 100,
        "a CA bundle"
    );
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains(":65532:65532:"), "{passwd}");

    // The only programs: the operator and kubectl (besides the dynamic
    // loader and shared libraries); no shell, nor anything to start one.
    let paths = walk(&root);
    let programs: Vec<String> = paths
        .iter()
        .filter(|p| {
            let meta = root.join(p).symlink_metadata().unwrap();
            meta.is_file()
                && meta.permissions().mode() & 0o111 != 0
                && !p.to_string_lossy().contains(".so")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        programs,
        ["usr/local/bin/kubectl", "usr/local/bin/kustomize-operator"]
    );
    for shell in ["sh", "bash", "dash", "ash", "busybox"] {
        assert!(
            !paths.iter().any(|p| p.file_name() == Some(shell.as_ref())),
            "{shell} in the image"
        );
    }
    let out = podman(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "sh",
        IMAGE,
        "-c",
        "true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#""sh": executable file not found"#), "{err}");
}

#[test]
fn crd_render_and_kubectl_run_in_the_image_as_built_from_these_sources() {
    use std::os::unix::fs::PermissionsExt;
    if !image_available() {
        return;
    }
    let user = ["--user", "65532:65532"];
    // The CRDs the image's operator generates are this checkout's.
    let host = Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(host.status.success());
    assert!(
        run_in_image(&user, &["crd"]) == String::from_utf8_lossy(&host.stdout),
        "`crd` in the image differs from this checkout's: rebuild it with hack/image"
    );

    // The pinned kubectl.
    let gomod = std::fs::read_to_string(
        common::repo()
            .join(common::newest_kubernetes_module())
            .join("go.mod"),
    )
    .unwrap();
    let version = gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
        .or_else(|| {
            gomod
                .lines()
                .find_map(|l| l.strip_prefix("require k8s.io/kubernetes "))
        })
        .expect("k8s.io/kubernetes in go.mod")
        .trim();
    let kubectl = [
        "--user",
        "65532:65532",
        "--entrypoint",
        "/usr/local/bin/kubectl",
    ];
    let client = run_in_image(&kubectl, &["version", "--client"]);
    assert!(
        client.contains(&format!("Client Version: {version}")),
        "{client}"
    );

    // `render` a fixture into a directory of the host, then build it with
    // the image's kubectl: the fixture's expected manifests.
    let fixture = common::repo().join("tests/fixtures/sample/web.yaml");
    let out = tempfile::tempdir().unwrap();
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let input = format!("{}:/in/web.yaml:ro", fixture.display());
    let output = format!("{}:/out", out.path().display());
    let rendered = run_in_image(
        &["--user", "65532:65532", "-v", &input, "-v", &output],
        &["render", "-f", "/in/web.yaml", "--out", "/out/web"],
    );
    let overlays: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.strip_prefix("apply: "))
        .collect();
    assert!(!overlays.is_empty(), "{rendered}");
    let read_only = format!("{}:/out:ro", out.path().display());
    let options = [&kubectl[..], &["-v", &read_only]].concat();
    let mut built = String::new();
    for overlay in overlays {
        built.push_str(&run_in_image(&options, &["kustomize", overlay]));
    }
    let expected =
        std::fs::read_to_string(common::repo().join("tests/fixtures/sample/web.expected.yaml"))
            .unwrap();
    assert_eq!(built, expected);
}

/// `podman run` options giving a container what a kubelet gives the
/// Deployment's Pod (from `deploy/` as `kubectl kustomize` builds it): the
/// security context, `/tmp` (an emptyDir, a tmpfs of its size limit here),
/// the environment (downward-API fields filled in), the ServiceAccount's
/// files and the API server's address. Returns them with the manifest's
/// image, its args and its termination grace period.
fn kubelet_options(
    name: &str,
    credentials: &ServiceAccountFiles,
) -> (Vec<String>, String, Vec<String>, u64) {
    let docs = common::kustomize_documents("deploy");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut options: Vec<String> = vec![
        "--name".into(),
        name.into(),
        "--network".into(),
        "host".into(),
    ];
    let mut push = |words: &[&str]| options.extend(words.iter().map(|w| w.to_string()));

    let pod_security = &pod["securityContext"];
    let security = &container["securityContext"];
    let user = format!(
        "{}:{}",
        pod_security["runAsUser"].as_u64().expect("runAsUser"),
        pod_security["runAsGroup"].as_u64().expect("runAsGroup")
    );
    push(&["--user", &user]);
    assert_eq!(pod_security["seccompProfile"]["type"], "RuntimeDefault");
    // (podman applies its default seccomp profile, as RuntimeDefault does.)
    if security["readOnlyRootFilesystem"] == true {
        // Only what the Pod mounts is writable: no tmpfs podman would add.
        push(&["--read-only", "--read-only-tmpfs=false"]);
    }
    if security["allowPrivilegeEscalation"] == false {
        push(&["--security-opt", "no-new-privileges"]);
    }
    for cap in security["capabilities"]["drop"]
        .as_array()
        .into_iter()
        .flatten()
    {
        push(&["--cap-drop", cap.as_str().unwrap()]);
    }
    for mount in container["volumeMounts"].as_array().expect("volumeMounts") {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the mount's volume");
        let limit = volume["emptyDir"]["sizeLimit"]
            .as_str()
            .and_then(|s| s.strip_suffix("Mi"))
            .unwrap_or_else(|| panic!("an emptyDir with a sizeLimit in Mi: {volume}"));
        let path = mount["mountPath"].as_str().unwrap();
        push(&["--tmpfs", &format!("{path}:rw,nosuid,nodev,size={limit}m")]);
    }
    let files = format!(
        "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
        credentials.dir().display()
    );
    push(&["-v", &files]);
    push(&[
        "-e",
        &format!("KUBERNETES_SERVICE_HOST={}", credentials.host),
    ]);
    push(&[
        "-e",
        &format!("KUBERNETES_SERVICE_PORT={}", credentials.port),
    ]);
    for var in container["env"].as_array().expect("env") {
        let value = match (
            &var["value"],
            var["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Value::String(v), _) => v.clone(),
            (_, Some("metadata.namespace")) => NAMESPACE.to_string(),
            (_, Some("metadata.name")) => name.to_string(),
            _ => panic!("an env var a kubelet would fill in another way: {var}"),
        };
        push(&["-e", &format!("{}={value}", var["name"].as_str().unwrap())]);
    }
    let image = container["image"].as_str().unwrap().to_string();
    let args = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    (options, image, args, grace)
}

/// The container's state: (running, exit code).
fn state(name: &str) -> (bool, i64) {
    let inspect: Value = serde_json::from_str(&podman_ok(&["container", "inspect", name])).unwrap();
    let state = &inspect[0]["State"];
    (
        state["Running"].as_bool().unwrap(),
        state["ExitCode"].as_i64().unwrap(),
    )
}

fn logs(name: &str) -> String {
    let out = podman(&["logs", name]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("kustomize-operator")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn the_image_runs_as_a_kubelet_runs_the_deployments_pod() {
    if !image_available() {
        return;
    }
    let client = common::cluster().await;
    install().await;
    let ns = common::TestNamespace::new(&client, "image").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let credentials = ServiceAccountFiles::create(&client).await;
    let name = container_name("image");
    let (options, image, args, grace) = kubelet_options(&name, &credentials);
    assert_eq!(image, IMAGE, "the image deploy/ runs");
    // The operator watches only the test's namespace (others run tests
    // too) and serves its probes and metrics on a free port of the host.
    let port = common::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let mut argv: Vec<&str> = vec!["run", "--detach"];
    argv.extend(options.iter().map(String::as_str));
    argv.push(&image);
    argv.extend(args.iter().map(String::as_str));
    argv.extend([
        "--namespace",
        &ns.name,
        "--kinds",
        "sample",
        "--metrics-addr",
        &metrics,
    ]);

    let started = Instant::now();
    podman_ok(&argv);
    let container = Container(name.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let scenario = async {
        // The readiness probe: 200 once it leads (or stands by).
        common::wait_until(TIMEOUT, "/readyz to answer 200", || async {
            common::http_get(port, "/readyz")
                .await
                .is_some_and(|(code, _)| code == 200)
        })
        .await;
        let ready = started.elapsed();
        // It leads once the Lease is free (at once, unless an earlier run's
        // container was killed while holding it: then after its duration).
        common::wait_until(
            TIMEOUT,
            "/readyz to answer 200 with \"ready: leading\"",
            || async {
                common::http_get(port, "/readyz")
                    .await
                    .is_some_and(|(code, body)| code == 200 && body.contains("ready: leading"))
            },
        )
        .await;
        say(&format!(
            "[image] podman run to /readyz 200: {:.2}s; leading after {:.2}s",
            ready.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ));
        assert_eq!(holder(&leases).await.as_deref(), Some(name.as_str()));

        // A Sample, reconciled by the kubectl in the image, with the token.
        let sample = common::deploy::sample_created_and_ready(&client, &ns.name).await;
        let status = serde_json::to_value(sample.status.as_ref().unwrap()).unwrap();
        let last = &status["lastCommand"];
        // The image's kubectl applied it (server-side), its cache in the
        // container's WORK_DIR (its /tmp).
        assert!(
            last["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("kubectl ")
                    && c.contains("--cache-dir=/tmp/kustomize-operator/")
                    && c.contains(" apply --server-side ")),
            "{status}"
        );
        assert_eq!(last["exitCode"], 0, "{status}");
        assert!(
            last["stdout"]
                .as_str()
                .is_some_and(|s| s.contains("deployment.apps/web serverside-applied")),
            "{status}"
        );
        common::deploy::sample_scaled_and_deleted(&client, &ns.name).await;

        let (code, text) = common::http_get(port, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(
            common::metric_sum(&text, "kustomize_operator_leader", &[]),
            1.0
        );
        assert!(
            common::metric_sum(
                &text,
                "kustomize_operator_kubectl_runs_total",
                &[r#"verb="apply""#, r#"exit_code="0""#]
            ) >= 2.0,
            "{text}"
        );
        assert!(state(&name).0, "the container exited");
    };
    if let Err(panic) = std::panic::AssertUnwindSafe(scenario).catch_unwind().await {
        eprintln!("the container's log:\n{}", logs(&name));
        std::panic::resume_unwind(panic);
    }

    // SIGTERM, as a kubelet sends it, and SIGKILL after the Pod's grace
    // period: the operator must exit on its own, cleanly, well before.
    let stopping = Instant::now();
    podman_ok(&["stop", "--time", &grace.to_string(), &name]);
    let stopped = stopping.elapsed();
    say(&format!(
        "[image] podman stop (SIGTERM): exited in {:.2}s (grace period {grace}s)",
        stopped.as_secs_f64()
    ));
    let (running, exit_code) = state(&name);
    let log = logs(&name);
    assert!(!running);
    assert_eq!(exit_code, 0, "exit code after SIGTERM; log:\n{log}");
    assert!(stopped < Duration::from_secs(grace), "{stopped:?}");
    assert!(log.contains("shutting down"), "{log}");
    // It handed over its Lease on the way out.
    assert_ne!(holder(&leases).await.as_deref(), Some(name.as_str()));
    drop(container);
}
