//! The one-command install (`kubectl apply -k deploy`) and its RBAC, for real:
//! the operator binary runs with a kubeconfig that holds nothing but a token
//! minted for its ServiceAccount, and each kind's scenario must pass through
//! it; the same token is denied everything outside the grants.
//!
//! A kind's scenario is one async function (`sample_scenario`,
//! `copyrator_scenario`) and one test that runs it through
//! [`run_with_service_account`]; a new kind adds both.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kinds::copyrator::{CopyratorRule, CopyratorRuleSpec, RuleType};
use kustomize_operator::kinds::sample::{Sample, SampleSpec};
use serde_json::json;
use tokio::sync::OnceCell;

const NAMESPACE: &str = "kustomize-operator-system";
const SERVICE_ACCOUNT: &str = "kustomize-operator";
const TIMEOUT: Duration = Duration::from_secs(60);

static INSTALLED: OnceCell<()> = OnceCell::const_new();

/// `kubectl apply -k deploy`, once per test binary: a server-side dry run
/// first, then the real apply. The install stays (re-applying is idempotent);
/// its Pods stay Pending on a control plane without kubelet.
async fn install() {
    INSTALLED
        .get_or_init(|| async {
            let deploy = common::repo().join("deploy").display().to_string();
            // A server-side dry run checks namespaced objects against their
            // namespace, which the same apply would create: create it first.
            let namespace_file = common::repo().join("deploy/namespace.yaml");
            let (ok, _, err) =
                common::kubectl(&["apply", "-f", &namespace_file.display().to_string()]);
            assert!(ok, "creating the namespace failed: {err}");
            let (ok, out, err) = common::kubectl(&["apply", "-k", &deploy, "--dry-run=server"]);
            assert!(ok, "server-side dry run failed: {err}");
            assert!(
                out.contains("deployment.apps/kustomize-operator")
                    && out.contains("(server dry run)"),
                "{out}"
            );
            let (ok, out, err) = common::kubectl(&["apply", "-k", &deploy]);
            assert!(ok, "kubectl apply -k deploy failed: {err}");
            assert!(!out.contains("(server dry run)"), "{out}");
        })
        .await;
}

#[tokio::test]
async fn apply_k_deploy_installs_a_hardened_operator_whose_pods_stay_pending() {
    let client = cluster_or_skip!();
    install().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deployment = deployments.get("kustomize-operator").await.unwrap();
    let pod_spec = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod_spec.service_account_name.as_deref(),
        Some(SERVICE_ACCOUNT)
    );
    let container = &pod_spec.containers[0];
    let env = container.env.clone().unwrap_or_default();
    let namespace_env = env.iter().find(|e| e.name == "NAMESPACE").unwrap();
    let field = namespace_env
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(field, Some("metadata.namespace"));
    assert!(container.liveness_probe.is_some() && container.readiness_probe.is_some());
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));

    // The namespace enforces Pod Security "restricted": the ReplicaSet's Pods
    // exist only if the API server admitted them. No kubelet: they stay Pending.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/name=kustomize-operator");
    common::wait_until(TIMEOUT, || async {
        let list = pods.list(&selector).await.unwrap();
        !list.items.is_empty()
            && list
                .items
                .iter()
                .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
    })
    .await;
}

/// A token minted (TokenRequest) for `account` in the operator's namespace.
async fn mint_token(client: &Client, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let minted: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest for the ServiceAccount");
    minted.status.expect("a token").token
}

/// The API server's URL and CA (PEM) from the admin kubeconfig's current context.
fn admin_cluster() -> (String, Vec<u8>) {
    let admin = kube::config::Kubeconfig::read().expect("read KUBECONFIG");
    let context = admin
        .contexts
        .iter()
        .find(|c| Some(&c.name) == admin.current_context.as_ref())
        .and_then(|c| c.context.clone())
        .expect("a current context");
    let cluster = admin
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.clone())
        .expect("the context's cluster");
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => base64_decode(data),
        (None, Some(file)) => std::fs::read(file).expect("read the CA file"),
        (None, None) => panic!("the cluster in KUBECONFIG has no CA"),
    };
    (cluster.server.expect("a server URL"), ca)
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        let value = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// A kubeconfig holding only the API server's address, its CA and a token
/// minted for a ServiceAccount (the operator's, unless a test makes another).
struct TokenKubeconfig {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TokenKubeconfig {
    async fn mint(client: &Client, account: &str) -> Self {
        let token = mint_token(client, account).await;
        let (server, ca) = admin_cluster();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, ca).unwrap();
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "cluster", "cluster": {
                "server": server,
                "certificate-authority": ca_file.display().to_string(),
            }}],
            "users": [{ "name": account, "user": { "token": token } }],
            "contexts": [{ "name": "operator", "context": { "cluster": "cluster", "user": account } }],
            "current-context": "operator",
        });
        let path = dir.path().join("kubeconfig");
        // JSON is YAML: kubectl and kube read it as is.
        std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig).unwrap()).unwrap();
        Self { _dir: dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// `kubectl auth can-i <args>` with the token: true for "yes".
    fn can_i(&self, args: &[&str]) -> bool {
        let kubeconfig = self.path.display().to_string();
        let mut argv = vec!["--kubeconfig", &kubeconfig, "auth", "can-i"];
        argv.extend_from_slice(args);
        let (_, out, err) = common::kubectl(&argv);
        match out.trim() {
            "yes" => true,
            "no" => false,
            other => panic!("kubectl auth can-i {args:?}: {other:?} {err}"),
        }
    }
}

/// The files a kubelet mounts into a Pod for its ServiceAccount, under
/// `<dir>/run/secrets/kubernetes.io/serviceaccount/`, and the environment a
/// Pod gets: `KUBERNETES_SERVICE_HOST` and `_PORT`.
struct ServiceAccountMount {
    dir: tempfile::TempDir,
    host: String,
    port: String,
}

impl ServiceAccountMount {
    async fn create(client: &Client) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let files = dir.path().join("run/secrets/kubernetes.io/serviceaccount");
        std::fs::create_dir_all(&files).unwrap();
        let (server, ca) = admin_cluster();
        std::fs::write(
            files.join("token"),
            mint_token(client, SERVICE_ACCOUNT).await,
        )
        .unwrap();
        std::fs::write(files.join("ca.crt"), ca).unwrap();
        std::fs::write(files.join("namespace"), NAMESPACE).unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
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
        Self { dir, host, port }
    }
}

/// True when this process may run a command in a private mount namespace
/// (root with CAP_SYS_ADMIN, as on the development machines and in CI).
fn private_mounts_work() -> bool {
    std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

/// How the operator process authenticates.
enum Auth {
    /// A kubeconfig with only a token for its ServiceAccount.
    TokenKubeconfig,
    /// No kubeconfig: the in-cluster files at /var/run/secrets (bind-mounted
    /// in a private mount namespace) and KUBERNETES_SERVICE_HOST/_PORT.
    InCluster,
}

/// Installs deploy/, gives the operator binary the ServiceAccount's identity
/// (and nothing else, for it and for the kubectl it runs), lets it watch a
/// fresh namespace with `kinds`, then runs `scenario` against that namespace
/// with the admin client.
async fn run_with_service_account<F, Fut>(prefix: &str, kinds: &str, auth: Auth, scenario: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = match common::cluster().await {
        Some(c) => c,
        None => return,
    };
    if matches!(auth, Auth::InCluster) && !private_mounts_work() {
        eprintln!("\n*** SKIPPING in-cluster test: `unshare --mount` is not permitted here.\n");
        return;
    }
    install().await;
    let ns = common::TestNamespace::new(&client, prefix).await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let extra = ["--kinds", kinds, "--metrics-addr", ""];
    // The credentials live as long as the operator: kubectl reads them at every run.
    let mut token_kubeconfig = None;
    let mut service_account_mount = None;
    let operator = match auth {
        Auth::TokenKubeconfig => {
            let token = TokenKubeconfig::mint(&client, SERVICE_ACCOUNT).await;
            let kubeconfig = token.path().display().to_string();
            token_kubeconfig = Some(token);
            common::OperatorProcess::spawn(&ns.name, &[("KUBECONFIG", kubeconfig.as_str())], &extra)
        }
        Auth::InCluster => {
            let mount = ServiceAccountMount::create(&client).await;
            let run = mount.dir.path().join("run").display().to_string();
            let home = mount.dir.path().join("home").display().to_string();
            let process = common::OperatorProcess::spawn_with(
                &ns.name,
                &common::Launch {
                    env: &[
                        ("KUBERNETES_SERVICE_HOST", mount.host.as_str()),
                        ("KUBERNETES_SERVICE_PORT", mount.port.as_str()),
                        ("HOME", home.as_str()),
                    ],
                    unset: &["KUBECONFIG"],
                    wrapper: &[
                        "unshare",
                        "--mount",
                        "--propagation",
                        "private",
                        "sh",
                        "-c",
                        r#"mount --bind "$0" /var/run && exec "$@""#,
                        &run,
                    ],
                },
                &extra,
            );
            service_account_mount = Some(mount);
            process
        }
    };
    supervise(operator, scenario(client, ns.name.clone())).await;
    drop((token_kubeconfig, service_account_mount));
}

/// Runs `scenario` while `operator` runs: on failure prints the operator's
/// log; the operator must still be running at the end. Stops it.
async fn supervise(mut operator: common::OperatorProcess, scenario: impl Future<Output = ()>) {
    let run = std::panic::AssertUnwindSafe(scenario).catch_unwind();
    if let Err(panic) = run.await {
        eprintln!("the operator's log (tail):\n{}", operator.log_tail());
        std::panic::resume_unwind(panic);
    }
    assert!(
        operator.running(),
        "the operator exited; its log:\n{}",
        operator.log_tail()
    );
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

/// Sample: create, scale, delete; Ready status and an event on the way.
async fn sample_scenario(client: Client, ns: String) {
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 2 }),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
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
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    common::wait_until(TIMEOUT, || async {
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

    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 3}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        replicas(&deployments, "web").await == Some(3)
    })
    .await;

    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert!(deployments.get_opt("web").await.unwrap().is_none());
}

#[tokio::test]
async fn sample_scenario_passes_with_only_the_service_account_token() {
    run_with_service_account(
        "rbac-sample",
        "sample",
        Auth::TokenKubeconfig,
        sample_scenario,
    )
    .await;
}

/// CopyratorRule: a Secret and a ConfigMap rule copy into a target namespace;
/// a changed source reaches the copy; deleting the rules deletes the copies
/// (the finalizer is removed: the token may patch rules).
async fn copyrator_scenario(client: Client, ns: String) {
    let target = common::TestNamespace::new(&client, "rbac-copy-target").await;
    copy_follow_and_delete(&client, &ns, &target.name).await;
}

/// Two rules (Secret, ConfigMap) in `ns` copy into `target`; a changed
/// source reaches its copy; deleting the rules deletes the copies.
async fn copy_follow_and_delete(client: &Client, ns: &str, target: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "pull", "labels": {"copy": "yes"}},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "e30="},
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    create_config_map(
        client,
        ns,
        "settings",
        ("copy", "yes"),
        json!({"color": "blue"}),
    )
    .await;
    let rules: Api<CopyratorRule> = Api::namespaced(client.clone(), ns);
    for (name, rule_type) in [
        ("secrets", RuleType::Secret),
        ("configmaps", RuleType::Configmap),
    ] {
        let into = Some(vec![target.to_string()]);
        create_rule(&rules, name, rule_type, ("copy", "yes"), into).await;
    }
    let target_secrets: Api<Secret> = Api::namespaced(client.clone(), target);
    let target_config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), target);
    common::wait_until(TIMEOUT, || async {
        target_secrets.get_opt("pull").await.unwrap().is_some()
            && target_config_maps
                .get_opt("settings")
                .await
                .unwrap()
                .is_some()
    })
    .await;
    for name in ["secrets", "configmaps"] {
        common::wait_until(TIMEOUT, || async {
            rules
                .get(name)
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.common.is_ready())
        })
        .await;
    }
    assert_eq!(
        target_secrets.get("pull").await.unwrap().data,
        secret.data,
        "the Secret copy's data"
    );

    secrets
        .patch(
            "pull",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {".dockerconfigjson": "eyJhdXRocyI6e319"}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, || async {
        target_secrets
            .get("pull")
            .await
            .unwrap()
            .data
            .is_some_and(|d| d[".dockerconfigjson"] == ByteString(br#"{"auths":{}}"#.to_vec()))
    })
    .await;

    delete_rules(&rules, &["secrets", "configmaps"]).await;
    assert!(target_secrets.get_opt("pull").await.unwrap().is_none());
    assert!(
        target_config_maps
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
}

/// Creates, in `ns`, a ConfigMap labelled `label` holding `data`.
async fn create_config_map(
    client: &Client,
    ns: &str,
    name: &str,
    label: (&str, &str),
    data: serde_json::Value,
) -> ConfigMap {
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {(label.0): label.1}},
        "data": data,
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap()
}

/// Creates a rule copying the objects of `rule_type` labelled `label` into
/// `namespaces` (`None`: every namespace it may).
async fn create_rule(
    rules: &Api<CopyratorRule>,
    name: &str,
    rule_type: RuleType,
    label: (&str, &str),
    namespaces: Option<Vec<String>>,
) {
    let rule = CopyratorRule::new(
        name,
        CopyratorRuleSpec {
            rule_type: Some(rule_type),
            selector: Some([(label.0.to_string(), label.1.to_string())].into()),
            namespaces,
            deletion_policy: None,
        },
    );
    rules.create(&PostParams::default(), &rule).await.unwrap();
}

/// Deletes these rules and waits until their finalizer (the cleanup) is done
/// and no rule is left in their namespace.
async fn delete_rules(rules: &Api<CopyratorRule>, names: &[&str]) {
    for name in names {
        rules.delete(name, &DeleteParams::default()).await.unwrap();
    }
    common::wait_until(TIMEOUT, || async {
        rules
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
}

#[tokio::test]
async fn copyrator_scenario_passes_with_only_the_service_account_token() {
    run_with_service_account(
        "rbac-copyrator",
        "copyrator",
        Auth::TokenKubeconfig,
        copyrator_scenario,
    )
    .await;
}

/// No KUBECONFIG: the operator (kube's in-cluster config) and every kubectl
/// it runs (kubectl's in-cluster fallback) use the ServiceAccount files a
/// kubelet would mount, as in the Pod.
#[tokio::test]
async fn in_cluster_the_operator_and_its_kubectl_use_the_pods_service_account() {
    run_with_service_account("in-cluster", "sample", Auth::InCluster, sample_scenario).await;
}

#[tokio::test]
async fn the_service_account_token_is_denied_outside_its_grants() {
    let client = cluster_or_skip!();
    install().await;
    let token = TokenKubeconfig::mint(&client, SERVICE_ACCOUNT).await;
    // What the grants allow (the token works, so a "no" below means RBAC said no).
    for allowed in [
        &["watch", "samples.nuvolaris.org", "--all-namespaces"][..],
        &[
            "patch",
            "samples.nuvolaris.org",
            "--subresource=status",
            "-n",
            "default",
        ],
        &["create", "deployments.apps", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &[
            "update",
            "leases.coordination.k8s.io/kustomize-operator",
            "-n",
            NAMESPACE,
        ],
    ] {
        assert!(token.can_i(allowed), "should be allowed: {allowed:?}");
    }
    for denied in [
        &["delete", "namespaces"][..],
        // (deploy/ grants Secrets cluster-wide for CopyratorRule, whose rules
        // may target any namespace; overlays/copyrator-namespaces narrows
        // that: copyrator_namespaces_overlay_confines_secrets_to_its_namespaces.)
        // (ConfigMaps and Deployments are granted cluster-wide: ExchangeRate
        // and ChaosAgent act in any namespace.)
        &["patch", "nodes"],
        &["delete", "services", "-n", "default"],
        &["create", "pods", "-n", "default"],
        &["delete", "samples.nuvolaris.org", "-n", "default"],
        &["update", "samples.nuvolaris.org", "-n", "default"],
        &[
            "update",
            "leases.coordination.k8s.io/other",
            "-n",
            NAMESPACE,
        ],
        &["get", "leases.coordination.k8s.io", "-n", "kube-system"],
        &["create", "clusterrolebindings"],
        &["escalate", "clusterroles"],
        &["create", "serviceaccounts/token", "-n", NAMESPACE],
        &["impersonate", "users"],
        &["delete", "customresourcedefinitions.apiextensions.k8s.io"],
    ] {
        assert!(!token.can_i(denied), "should be denied: {denied:?}");
    }
}

/// The ServiceAccount the `overlays/copyrator-namespaces` test gives the
/// overlay's grants (the install's own account keeps the default ones).
const SCOPED_ACCOUNT: &str = "kustomize-operator-scoped";

/// The overlay's roles and bindings, moved onto [`SCOPED_ACCOUNT`] (bindings
/// renamed so the install's stay as they are) and from the overlay's example
/// namespaces to the test's (`rename`), plus the ServiceAccount. Roles are
/// kept as they are: shared with the install, or the overlay's own.
fn scoped_rbac(
    docs: &[serde_json::Value],
    rename: &BTreeMap<String, String>,
) -> Vec<serde_json::Value> {
    let mut manifest = vec![json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SCOPED_ACCOUNT, "namespace": NAMESPACE},
    })];
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        match kind {
            "ClusterRole" | "Role" => manifest.push(doc.clone()),
            "ClusterRoleBinding" | "RoleBinding" => {
                let mut binding = doc.clone();
                let name = binding["metadata"]["name"].as_str().unwrap().to_string();
                binding["metadata"]["name"] =
                    json!(name.replacen(SERVICE_ACCOUNT, SCOPED_ACCOUNT, 1));
                if let Some(ns) = binding["metadata"]["namespace"].as_str() {
                    let ns = rename.get(ns).cloned().unwrap_or_else(|| ns.to_string());
                    binding["metadata"]["namespace"] = json!(ns);
                }
                for subject in binding["subjects"].as_array_mut().expect("subjects") {
                    assert_eq!(subject["name"], SERVICE_ACCOUNT, "{kind}/{name}");
                    subject["name"] = json!(SCOPED_ACCOUNT);
                }
                manifest.push(binding);
            }
            _ => {}
        }
    }
    manifest
}

/// Deletes the objects a test created from a manifest when dropped.
struct DeleteOnDrop(tempfile::NamedTempFile);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let file = self.0.path().display().to_string();
        let _ = common::kubectl(&["delete", "-f", &file, "--ignore-not-found", "--wait=false"]);
    }
}

fn write_manifest(objects: &[serde_json::Value]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(file.path(), serde_json::to_vec(&list).unwrap()).unwrap();
    file
}

/// `overlays/copyrator-namespaces` for real: its grants, given to a
/// ServiceAccount of the test's own in the test's namespaces, let an operator
/// run with `--copyrator-namespaces` pass the CopyratorRule scenario and copy
/// into exactly those namespaces, while the token is denied Secrets
/// everywhere else.
#[tokio::test]
async fn copyrator_namespaces_overlay_confines_secrets_to_its_namespaces() {
    let client = cluster_or_skip!();
    install().await;
    let docs = common::kustomize_documents("overlays/copyrator-namespaces");
    let example = common::copyrator_namespaces_env(&docs);
    assert_eq!(
        example.len(),
        3,
        "the overlay's example lists three namespaces"
    );
    let src = common::TestNamespace::new(&client, "scoped-src").await;
    let team_a = common::TestNamespace::new(&client, "scoped-a").await;
    let team_b = common::TestNamespace::new(&client, "scoped-b").await;
    let outside = common::TestNamespace::new(&client, "scoped-out").await;
    let _cleanup = common::StripFinalizersOnDrop(src.name.clone());
    let ours = [&src.name, &team_a.name, &team_b.name];
    let rename: BTreeMap<String, String> = example
        .iter()
        .cloned()
        .zip(ours.iter().map(|n| n.to_string()))
        .collect();

    let manifest = scoped_rbac(&docs, &rename);
    let shared_roles: Vec<serde_json::Value> = manifest
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .cloned()
        .collect();
    let owned: Vec<serde_json::Value> = manifest
        .iter()
        .filter(|d| d["kind"] != "ClusterRole" && d["kind"] != "Role")
        .cloned()
        .collect();
    for objects in [&shared_roles, &owned] {
        let file = write_manifest(objects);
        let (ok, _, err) = common::kubectl(&["apply", "-f", &file.path().display().to_string()]);
        assert!(ok, "applying the overlay's RBAC: {err}");
    }
    let _owned = DeleteOnDrop(write_manifest(&owned));

    let token = TokenKubeconfig::mint(&client, SCOPED_ACCOUNT).await;
    for ns in ours {
        assert!(
            token.can_i(&["get", "secrets", "-n", ns]),
            "secrets in {ns}"
        );
        assert!(
            token.can_i(&["delete", "secrets", "-n", ns]),
            "secrets in {ns}"
        );
    }
    assert!(token.can_i(&["watch", "copyrators.flant.com", "--all-namespaces"]));
    for denied in [
        &["get", "secrets", "-n", &outside.name][..],
        &["list", "secrets", "-n", "kube-system"],
        &["list", "secrets", "--all-namespaces"],
        &["watch", "secrets", "--all-namespaces"],
        &["create", "secrets", "-n", "default"],
    ] {
        assert!(!token.can_i(denied), "should be denied: {denied:?}");
    }

    let scope = ours.map(String::as_str).join(",");
    let kubeconfig = token.path().display().to_string();
    // One operator watching a listed namespace, one watching another.
    let spawn = |watched: &str| {
        common::OperatorProcess::spawn(
            watched,
            &[("KUBECONFIG", kubeconfig.as_str())],
            &[
                "--kinds",
                "copyrator",
                "--copyrator-namespaces",
                &scope,
                "--metrics-addr",
                "",
            ],
        )
    };
    supervise(spawn(&src.name), async {
        copy_follow_and_delete(&client, &src.name, &team_a.name).await;
        every_namespace_means_every_listed_one(
            &client,
            &src.name,
            &[&team_a.name, &team_b.name],
            &outside.name,
        )
        .await;
    })
    .await;
    supervise(
        spawn(&outside.name),
        a_rule_outside_the_list_is_not_served(&client, &outside.name, &team_a.name),
    )
    .await;
}

/// A rule in a namespace outside `--copyrator-namespaces` reports
/// `NamespaceNotServed` and copies nothing (its sources are never read); it
/// can still be deleted.
async fn a_rule_outside_the_list_is_not_served(client: &Client, ns: &str, listed: &str) {
    create_config_map(client, ns, "unserved", ("copy", "yes"), json!({"a": "b"})).await;
    let rules: Api<CopyratorRule> = Api::namespaced(client.clone(), ns);
    let into = Some(vec![listed.to_string()]);
    create_rule(
        &rules,
        "unserved",
        RuleType::Configmap,
        ("copy", "yes"),
        into,
    )
    .await;
    common::wait_until(TIMEOUT, || async {
        rules
            .get("unserved")
            .await
            .unwrap()
            .status
            .is_some_and(|s| {
                s.common.condition("Ready").is_some_and(|c| {
                    c.status == "False"
                        && c.reason == "NamespaceNotServed"
                        && c.message.contains("--copyrator-namespaces")
                })
            })
    })
    .await;
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), listed);
    assert!(copies.get_opt("unserved").await.unwrap().is_none());
    delete_rules(&rules, &["unserved"]).await;
}

/// With `--copyrator-namespaces`, a rule without `namespaces` copies into
/// each listed namespace but its own (`targets`) and nowhere else; a rule
/// naming a namespace outside the list reports it Excluded; deleting the
/// rules deletes the copies in each.
async fn every_namespace_means_every_listed_one(
    client: &Client,
    ns: &str,
    targets: &[&str],
    outside: &str,
) {
    let label = ("share", "all");
    let source = create_config_map(client, ns, "shared", label, json!({"greeting": "hello"})).await;
    let rules: Api<CopyratorRule> = Api::namespaced(client.clone(), ns);
    for (name, namespaces) in [
        ("everywhere", None),
        ("outside", Some(vec![outside.to_string()])),
    ] {
        create_rule(&rules, name, RuleType::Configmap, label, namespaces).await;
    }
    let target_status = |rule: CopyratorRule| -> Vec<(String, String)> {
        rule.status
            .map(|s| {
                s.copies
                    .targets
                    .into_iter()
                    .map(|t| (t.namespace, t.result))
                    .collect()
            })
            .unwrap_or_default()
    };
    common::wait_until(TIMEOUT, || async {
        let rule = rules.get("everywhere").await.unwrap();
        rule.status.as_ref().is_some_and(|s| s.common.is_ready())
            && target_status(rule).len() == targets.len()
    })
    .await;
    let mut expected: Vec<(String, String)> = targets
        .iter()
        .map(|t| (t.to_string(), "Copied".to_string()))
        .collect();
    expected.sort();
    assert_eq!(
        target_status(rules.get("everywhere").await.unwrap()),
        expected
    );
    for target in targets {
        let copies: Api<ConfigMap> = Api::namespaced(client.clone(), target);
        let copy = copies.get("shared").await.unwrap();
        assert_eq!(copy.data, source.data, "the copy in {target}");
    }
    let outside_config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), outside);
    assert!(
        outside_config_maps
            .get_opt("shared")
            .await
            .unwrap()
            .is_none()
    );

    common::wait_until(TIMEOUT, || async {
        rules.get("outside").await.unwrap().status.is_some_and(|s| {
            s.copies.targets.iter().any(|t| {
                t.namespace == outside
                    && t.result == "Excluded"
                    && t.message.as_deref()
                        == Some("not among the operator's --copyrator-namespaces")
            })
        })
    })
    .await;
    assert!(
        outside_config_maps
            .get_opt("shared")
            .await
            .unwrap()
            .is_none()
    );

    delete_rules(&rules, &["everywhere", "outside"]).await;
    for target in targets {
        let copies: Api<ConfigMap> = Api::namespaced(client.clone(), target);
        assert!(
            copies.get_opt("shared").await.unwrap().is_none(),
            "{target}"
        );
    }
}
