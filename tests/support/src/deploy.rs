//! The install (`kubectl apply -k deploy`), its ServiceAccount's credentials
//! and the Sample scenario, shared by the tests that run the operator with
//! nothing but that identity: `tests/deploy.rs` (the binary, with a token
//! kubeconfig) and `tests/image.rs` (the image, with the files a kubelet
//! mounts).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sample::{Sample, SampleSpec, replicas};
use super::tokens::{admin_cluster, mint_token};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::OnceCell;

/// The install's namespace.
pub const NAMESPACE: &str = "kustomize-operator-system";
/// The operator's ServiceAccount in [`NAMESPACE`].
pub const SERVICE_ACCOUNT: &str = "kustomize-operator";

/// What an installed operator may do to serve KindDefinitions: watch them,
/// write their status, create and delete the CRDs they declare.
pub const KIND_DEFINITION_RIGHTS: [&[&str]; 4] = [
    &["watch", "kinddefinitions.kustomize-operator.io"],
    &[
        "patch",
        "kinddefinitions.kustomize-operator.io",
        "--subresource=status",
    ],
    &["create", "customresourcedefinitions.apiextensions.k8s.io"],
    &["delete", "customresourcedefinitions.apiextensions.k8s.io"],
];
const TIMEOUT: Duration = Duration::from_secs(60);

static INSTALLED: OnceCell<()> = OnceCell::const_new();

/// `kubectl apply -k deploy`, once per test binary: a server-side dry run
/// first, then the real apply. The install stays (re-applying is
/// idempotent); on the local control plane kwok reports its Pods Running,
/// though no container runs the image.
pub async fn install() {
    INSTALLED.get_or_init(apply_install).await;
}

/// `kubectl apply -k deploy` (as [`install`] does once per test binary),
/// every time it is called: tests/real_node.rs installs afresh in each test.
pub async fn apply_install() {
    apply_install_from("deploy").await;
}

/// Like [`apply_install`], of the install in `folder` (`deploy` or an
/// overlay of it) of the repository.
pub async fn apply_install_from(folder: &str) {
    let deploy = super::repo().join(folder).display().to_string();
    // A server-side dry run checks namespaced objects against their
    // namespace, which the same apply would create: create it first.
    let namespace_file = super::repo().join("deploy/namespace.yaml");
    let (ok, _, err) = super::kubectl(&["apply", "-f", &namespace_file.display().to_string()]);
    assert!(ok, "creating the namespace failed: {err}");
    let (ok, out, err) = super::kubectl(&["apply", "-k", &deploy, "--dry-run=server"]);
    assert!(ok, "server-side dry run failed: {err}");
    assert!(
        out.contains("deployment.apps/kustomize-operator") && out.contains("(server dry run)"),
        "{out}"
    );
    let (ok, out, err) = super::kubectl(&["apply", "-k", &deploy]);
    assert!(ok, "kubectl apply -k {folder} failed: {err}");
    assert!(!out.contains("(server dry run)"), "{out}");
}

/// What a kubelet gives a Pod of the operator's ServiceAccount: the files it
/// mounts at `/var/run/secrets/kubernetes.io/serviceaccount` (`token`,
/// `ca.crt`, `namespace`; readable by any user, as with the projected
/// volume's default mode 0644) and `KUBERNETES_SERVICE_HOST` / `_PORT`.
pub struct ServiceAccountFiles {
    _dir: tempfile::TempDir,
    files: PathBuf,
    /// `KUBERNETES_SERVICE_HOST`.
    pub host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub port: String,
}

impl ServiceAccountFiles {
    /// Mints a token for [`SERVICE_ACCOUNT`] and writes the files.
    pub async fn create(client: &Client) -> Self {
        use std::os::unix::fs::PermissionsExt;
        // The temporary directory stays private (0700); the mounted one is
        // open, for the container's non-root user.
        let dir = tempfile::tempdir().unwrap();
        let files = dir.path().join("serviceaccount");
        std::fs::create_dir(&files).unwrap();
        std::fs::set_permissions(&files, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (server, ca) = admin_cluster();
        let token = mint_token(client, NAMESPACE, SERVICE_ACCOUNT).await;
        for (name, content) in [
            ("token", token.as_bytes()),
            ("ca.crt", ca.as_slice()),
            ("namespace", NAMESPACE.as_bytes()),
        ] {
            let path = files.join(name);
            std::fs::write(&path, content).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let authority = server
            .trim_start_matches("https://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let (host, port) = authority
            .rsplit_once(':')
            .map_or((authority.clone(), "443".to_string()), |(h, p)| {
                (h.to_string(), p.to_string())
            });
        Self {
            _dir: dir,
            files,
            host,
            port,
        }
    }

    /// The directory holding `token`, `ca.crt` and `namespace`.
    pub fn dir(&self) -> &Path {
        &self.files
    }
}

/// Sample: create, scale, delete; Ready status and an event on the way.
pub async fn sample_scenario(client: Client, ns: String) {
    sample_created_and_ready(&client, &ns).await;
    sample_scaled_and_deleted(&client, &ns).await;
}

/// Creates the Sample `web` (count 2) in `ns` and waits until it is Ready
/// with its Deployment at 2 replicas and an `Applied` event; returns it.
pub async fn sample_created_and_ready(client: &Client, ns: &str) -> Sample {
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 2 }),
        )
        .await
        .unwrap();
    super::wait_until(TIMEOUT, "the Sample web Ready at generation 1", || async {
        samples
            .get("web")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.is_ready() && s.observed_generation == Some(1))
    })
    .await;
    assert_eq!(replicas(&deployments, "web").await, Some(2));
    // The event proves the events grant: a refused event is only logged.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    super::wait_until(TIMEOUT, "an Applied event about the Sample web", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Applied")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
            })
    })
    .await;
    samples.get("web").await.unwrap()
}

/// Scales the Sample `web` in `ns` to 3, then deletes it: its Deployment
/// follows, then goes with it.
pub async fn sample_scaled_and_deleted(client: &Client, ns: &str) {
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 3}})),
        )
        .await
        .unwrap();
    super::wait_until(TIMEOUT, "the Deployment web at 3 replicas", || async {
        replicas(&deployments, "web").await == Some(3)
    })
    .await;

    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    super::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(deployments.get_opt("web").await.unwrap().is_none());
}
