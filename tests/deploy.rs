//! The one-command install (`kubectl apply -k deploy`) and its RBAC, for real:
//! the operator binary runs with a kubeconfig that holds nothing but a token
//! minted for its ServiceAccount, and each kind's scenario must pass through
//! it; the same token is denied everything outside the grants.
//!
//! A kind's scenario is one async function (`sample_scenario`,
//! `copyrator_scenario`, `exchange_rate_scenario`, `chaos_agent_scenario`)
//! and one test that runs it through [`run_with_service_account`]; a new
//! kind adds both.

use ko_test_support as common;

use kustomize_operator::kind::{ConditionStatus, ConditionType, Reason};

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use common::deploy::{NAMESPACE, SERVICE_ACCOUNT, install, sample_scenario};

const TIMEOUT: Duration = Duration::from_secs(60);
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kinds::chaos_agent::{ChaosAgent, ChaosAgentSpec, SCOPE_LABEL};
use kustomize_operator::kinds::copyrator::{CopyratorRule, CopyratorRuleSpec, RuleType};
use kustomize_operator::kinds::exchange_rate::{ExchangeRate, ExchangeRateSpec};
use serde_json::json;

#[tokio::test]
async fn apply_k_deploy_installs_a_hardened_operator_whose_pods_are_admitted() {
    let _area = common::area::enter().await;
    let client = common::cluster().await;
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
    // exist only if the API server admitted them. (What becomes of them
    // depends on the nodes: kwok's report Running, a real one needs the image.)
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/name=kustomize-operator");
    common::wait_until(TIMEOUT, "a Pod of the operator's Deployment", || async {
        !pods.list(&selector).await.unwrap().items.is_empty()
    })
    .await;
}

/// Installs deploy/, gives the operator binary the ServiceAccount's identity
/// (and nothing else, for it and for the kubectl it runs), lets it watch a
/// fresh namespace with `kinds`, then runs `scenario` against that namespace
/// with the admin client.
async fn run_with_service_account<F, Fut>(prefix: &str, kinds: &str, scenario: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    run_with_service_account_and(prefix, kinds, &[], scenario).await;
}

/// [`run_with_service_account`], the operator given `flags` too.
async fn run_with_service_account_and<F, Fut>(
    prefix: &str,
    kinds: &str,
    flags: &[&str],
    scenario: F,
) where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = common::cluster().await;
    install().await;
    let ns = common::TestNamespace::new(&client, prefix).await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let mut extra = vec!["--kinds", kinds, "--metrics-addr", ""];
    extra.extend_from_slice(flags);
    // The credentials live as long as the operator: kubectl reads them at every run.
    let token = common::TokenKubeconfig::mint(&client, NAMESPACE, SERVICE_ACCOUNT).await;
    let kubeconfig = token.path().display().to_string();
    let operator =
        common::OperatorProcess::spawn(&ns.name, &[("KUBECONFIG", kubeconfig.as_str())], &extra);
    supervise(operator, scenario(client, ns.name.clone())).await;
    drop(token);
}

/// Runs `scenario` while `operator` runs (on failure, dropping it prints
/// its log); the operator must still be running at the end. Stops it.
async fn supervise(mut operator: common::OperatorProcess, scenario: impl Future<Output = ()>) {
    scenario.await;
    assert!(
        operator.running(),
        "the operator exited; its log:\n{}",
        operator.log_tail()
    );
}

#[tokio::test]
async fn sample_scenario_passes_with_only_the_service_account_token() {
    run_with_service_account("rbac-sample", "sample", sample_scenario).await;
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
    common::wait_until(
        TIMEOUT,
        format!("the copies pull and settings in {target}"),
        || async {
            target_secrets.get_opt("pull").await.unwrap().is_some()
                && target_config_maps
                    .get_opt("settings")
                    .await
                    .unwrap()
                    .is_some()
        },
    )
    .await;
    for name in ["secrets", "configmaps"] {
        common::wait_until(TIMEOUT, format!("the rule {name} Ready"), || async {
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
    common::wait_until(
        TIMEOUT,
        format!("the copy pull in {target} with the source's new data"),
        || async {
            target_secrets
                .get("pull")
                .await
                .unwrap()
                .data
                .is_some_and(|d| d[".dockerconfigjson"] == ByteString(br#"{"auths":{}}"#.to_vec()))
        },
    )
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
    common::wait_until(TIMEOUT, "every rule gone", || async {
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
    run_with_service_account("rbac-copyrator", "copyrator", copyrator_scenario).await;
}

#[tokio::test]
async fn the_service_account_token_is_denied_outside_its_grants() {
    let _area = common::area::enter().await;
    let client = common::cluster().await;
    install().await;
    let token = common::TokenKubeconfig::mint(&client, NAMESPACE, SERVICE_ACCOUNT).await;
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
        // ChaosAgent's rounds.
        &["delete", "pods", "-n", "default"],
        &["patch", "deployments.apps", "-n", "default"],
        &[
            "update",
            "leases.coordination.k8s.io/kustomize-operator",
            "-n",
            NAMESPACE,
        ],
    ]
    .into_iter()
    // KindDefinitions, and the CRDs they declare.
    .chain(common::deploy::KIND_DEFINITION_RIGHTS)
    {
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
        &["update", "customresourcedefinitions.apiextensions.k8s.io"],
        &["create", "kinddefinitions.kustomize-operator.io"],
        &["delete", "kinddefinitions.kustomize-operator.io"],
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
    let client = common::cluster().await;
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

    let token = common::TokenKubeconfig::mint(&client, NAMESPACE, SCOPED_ACCOUNT).await;
    // The authorizer learns of new bindings through a watch: wait for
    // each grant (the denials below are checked once they all arrived).
    for ns in ours {
        for verb in ["get", "delete"] {
            common::wait_until(
                TIMEOUT,
                format!("{verb} secrets in {ns} granted"),
                || async { token.can_i(&[verb, "secrets", "-n", ns]) },
            )
            .await;
        }
    }
    common::wait_until(TIMEOUT, "watch copyrators granted", || async {
        token.can_i(&["watch", "copyrators.flant.com", "--all-namespaces"])
    })
    .await;
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
    common::wait_until(
        TIMEOUT,
        "the rule unserved NamespaceNotServed, naming --copyrator-namespaces",
        || async {
            rules
                .get("unserved")
                .await
                .unwrap()
                .status
                .is_some_and(|s| {
                    s.common.condition(ConditionType::Ready).is_some_and(|c| {
                        c.status == ConditionStatus::False
                            && c.reason == Reason::NamespaceNotServed
                            && c.message.contains("--copyrator-namespaces")
                    })
                })
        },
    )
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
    common::wait_until(
        TIMEOUT,
        format!("the rule everywhere Ready with {} targets", targets.len()),
        || async {
            let rule = rules.get("everywhere").await.unwrap();
            rule.status.as_ref().is_some_and(|s| s.common.is_ready())
                && target_status(rule).len() == targets.len()
        },
    )
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

    common::wait_until(
        TIMEOUT,
        format!("the rule outside reporting {outside} Excluded"),
        || async {
            rules.get("outside").await.unwrap().status.is_some_and(|s| {
                s.copies.targets.iter().any(|t| {
                    t.namespace == outside
                        && t.result == "Excluded"
                        && t.message.as_deref()
                            == Some("not among the operator's --copyrator-namespaces")
                })
            })
        },
    )
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

/// `kubectl delete -k deploy` then `kubectl apply -k deploy`, round after
/// round: every apply creates every object afresh ("created", never
/// "configured": nothing of the deleted install was left, or created again
/// meanwhile by the control plane's aggregation controller, which writes
/// the aggregating role's rules by a server-side apply). Each round waits
/// for the install's grants to be in effect before deleting it. The install
/// is deploy/ as built, renamed (see [`renamed_install`]) so that the
/// install the other tests share stays; `kubectl apply -f`/`delete -f` of
/// its documents does what `-k` does, in the same order. kubectl deletes
/// one object after the other in that order, the aggregating role before
/// the Sample's, so deploy/ did not race even while the Sample's role was
/// aggregated (0 leftovers in 40 rounds); Helm, deleting every ClusterRole
/// at once, did (`tests/helm.rs`, `uninstall_then_install_again_works_every_time`).
#[tokio::test]
async fn delete_then_apply_again_creates_everything_afresh() {
    const ROUNDS: usize = 3;
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "redeploy").await;
    let documents = renamed_install(&ns.name);
    let manifest = DeleteOnDrop(write_manifest(&documents));
    let file = manifest.0.path().display().to_string();
    let account = format!(
        "--as=system:serviceaccount:{0}:{0}-{SERVICE_ACCOUNT}",
        ns.name
    );
    for round in 1..=ROUNDS {
        let (ok, out, err) = common::kubectl(&["apply", "-f", &file]);
        assert!(ok, "round {round}: kubectl apply failed: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), documents.len(), "round {round}: {out}");
        for line in lines {
            assert!(
                line.ends_with(" created"),
                "round {round}: left from the deleted install: {line}"
            );
        }
        common::wait_until(
            TIMEOUT,
            format!("round {round}: the install's account may watch Samples"),
            || async {
                let (_, out, _) = common::kubectl(&[
                    "auth",
                    "can-i",
                    "watch",
                    "samples.nuvolaris.org",
                    "--all-namespaces",
                    &account,
                ]);
                out.trim() == "yes"
            },
        )
        .await;
        let (ok, _, err) = common::kubectl(&["delete", "-f", &file]);
        assert!(ok, "round {round}: kubectl delete failed: {err}");
    }
}

/// deploy/ as `kubectl kustomize` builds it, every object renamed
/// `<namespace>-<name>` and the namespaced ones moved into `namespace`
/// (bindings, their subjects and the Deployment's account following),
/// without what every test on the cluster shares: the Namespace
/// `kustomize-operator-system`, the CRDs and the admission policies.
fn renamed_install(namespace: &str) -> Vec<serde_json::Value> {
    let shared = [
        "Namespace",
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let renamed =
        |name: &serde_json::Value| json!(format!("{namespace}-{}", name.as_str().unwrap()));
    let mut documents = common::kustomize_documents("deploy");
    documents.retain(|d| !shared.contains(&d["kind"].as_str().unwrap_or_default()));
    for doc in &mut documents {
        doc["metadata"]["name"] = renamed(&doc["metadata"]["name"]);
        if doc["metadata"].get("namespace").is_some() {
            doc["metadata"]["namespace"] = json!(namespace);
        }
        if doc.get("roleRef").is_some() {
            doc["roleRef"]["name"] = renamed(&doc["roleRef"]["name"]);
        }
        for subject in doc["subjects"].as_array_mut().into_iter().flatten() {
            subject["name"] = renamed(&subject["name"]);
            subject["namespace"] = json!(namespace);
        }
        if doc["kind"] == "Deployment" {
            let pod = &mut doc["spec"]["template"]["spec"];
            pod["serviceAccountName"] = renamed(&pod["serviceAccountName"]);
        }
    }
    documents
}

/// A rate provider on loopback answering every `/rates/{base}/{currency}`
/// with `rate` (as tests/exchange_rate.rs's does); its address.
async fn serve_rate(rate: f64) -> std::net::SocketAddr {
    use axum::extract::Path;
    let answer = move |Path((base, currency)): Path<(String, String)>| async move {
        let body = json!({"base": base, "rates": {currency: rate}}).to_string();
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
    };
    let app = axum::Router::new().route("/rates/{base}/{currency}", axum::routing::get(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

#[tokio::test]
async fn exchange_rate_scenario_passes_with_only_the_service_account_token() {
    let provider = serve_rate(1.1901).await;
    let url = format!("http://{provider}/rates/{{base}}/{{currency}}");
    let flags = [
        "--exchange-rate-url",
        &url,
        "--exchange-rate-path",
        "rates.{currency}",
    ];
    run_with_service_account_and(
        "rbac-exchangerate",
        "exchangerate",
        &flags,
        exchange_rate_scenario,
    )
    .await;
}

/// ExchangeRate: the rate fetched into status and into its hashed
/// ConfigMap (owned by the ExchangeRate: the token may update its
/// finalizers); deleting it deletes the ConfigMap.
async fn exchange_rate_scenario(client: Client, ns: String) {
    let rates: Api<ExchangeRate> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let spec = ExchangeRateSpec {
        currency: "USD".into(),
        base: None,
        refresh_interval: Some("1h".into()),
    };
    rates
        .create(&PostParams::default(), &ExchangeRate::new("usd", spec))
        .await
        .unwrap();
    let status = common::wait_for(TIMEOUT, "the ExchangeRate usd Ready at 1.1901", || async {
        let status = rates.get("usd").await.unwrap().status.unwrap_or_default();
        if status.common.is_ready() && status.rate.rate.as_deref() == Some("1.1901") {
            Ok(status)
        } else {
            Err(status.common.conditions)
        }
    })
    .await;
    let name = status.rate.config_map_name.expect("the ConfigMap's name");
    let config_map = config_maps.get(&name).await.unwrap();
    assert_eq!(config_map.data.unwrap()["rate"], "1.1901");
    let owner = &config_map.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ExchangeRate", "usd")
    );

    rates.delete("usd", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the ExchangeRate usd gone", || async {
        rates.get_opt("usd").await.unwrap().is_none()
    })
    .await;
    assert!(config_maps.get_opt(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn chaos_agent_scenario_passes_with_only_the_service_account_token() {
    run_with_service_account("rbac-chaosagent", "chaosagent", chaos_agent_scenario).await;
}

/// Removes the ChaosAgent `name` (its finalizer too) when dropped.
struct AgentGuard(String);

impl Drop for AgentGuard {
    fn drop(&mut self) {
        let agent = format!("chaosagent/{}", self.0);
        let unfinalized = r#"{"metadata":{"finalizers":null}}"#;
        let _ = common::kubectl(&["patch", &agent, "--type=merge", "-p", unfinalized]);
        let _ = common::kubectl(&["delete", &agent, "--ignore-not-found", "--wait=false"]);
    }
}

/// ChaosAgent, in a dry run confined to `ns` (the agent labelled for it,
/// the operator watching it): its rounds list the Pods, Deployments and
/// ConfigMaps there and report what they would do, changing nothing; the
/// status and the finalizer are written, and deleting the agent removes
/// it. (A dry run, which harms nothing: the token's rights to delete Pods
/// and patch Deployments are asked of the API server by
/// `the_service_account_token_is_denied_outside_its_grants`.)
async fn chaos_agent_scenario(client: Client, ns: String) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let running = ListParams::default()
        .labels("app=web")
        .fields("status.phase=Running");
    common::wait_until(TIMEOUT, "two Pods of web running", || async {
        pods.list(&running).await.unwrap().items.len() == 2
    })
    .await;

    let spec = ChaosAgentSpec {
        tantrum_mode: true,
        pod_tolerance: 0,
        cancer_mode: true,
        ipsum_mode: false,
        eagerness: 100,
        pause_duration: 1,
        excluded_namespaces: Vec::new(),
        dry_run: true,
        max_actions_per_round: 10,
        seed: Some(1234),
    };
    let mut agent = ChaosAgent::new(&ns, spec);
    agent.metadata.labels = Some([(SCOPE_LABEL.to_string(), ns.clone())].into());
    let agents: Api<ChaosAgent> = Api::all(client.clone());
    agents.create(&PostParams::default(), &agent).await.unwrap();
    let _guard = AgentGuard(ns.clone());
    let status = common::wait_for(
        TIMEOUT,
        "the agent Ready after its second round",
        || async {
            let status = agents.get(&ns).await.unwrap().status.unwrap_or_default();
            if status.common.is_ready() && status.round.round.unwrap_or(0) >= 2 {
                Ok(status)
            } else {
                Err(status.common.conditions)
            }
        },
    )
    .await;
    let last = status.round.last_round.expect("the last round");
    assert!(last.dry_run);
    assert_eq!(last.counts.tantrum, 2, "{last:?}");
    assert_eq!(last.counts.cancer, 1, "{last:?}");
    assert_eq!(
        status.round.total,
        Default::default(),
        "a dry run did nothing"
    );
    let web = deployments.get("web").await.unwrap();
    assert_eq!(web.spec.unwrap().replicas, Some(2));

    agents.delete(&ns, &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the agent gone", || async {
        agents.get_opt(&ns).await.unwrap().is_none()
    })
    .await;
}
