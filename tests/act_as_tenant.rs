//! Nothing a tenant writes is an authority, and writes can run as the
//! tenant (issue "act with the requester's rights").
//!
//! - A forged inventory in a resource's status (anyone with `/status` rights
//!   writes it) neither prunes nor deletes another tenant's object, and no
//!   event or status tells whether an object the resource does not own
//!   exists.
//! - With `--default-service-account`, a Sample's writes run as that
//!   ServiceAccount of its namespace: without the right they are
//!   `Forbidden` (nothing is created), and granting it makes the Sample
//!   Ready without touching it; a CopyratorRule's copies stop at the next
//!   reconcile once the right to write them is revoked.
//!
//! Tenants act through kubeconfigs holding nothing but their own
//! ServiceAccount tokens.

use ko_test_support as common;

use std::time::Duration;

use common::sample::{Sample, SampleSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kustomize_operator::kind::{CommonStatus, ConditionStatus, ConditionType, Reason};
use kustomize_operator::kinds::copyrator::{CopyratorRule, CopyratorRuleSpec, RuleType};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);

/// `kubectl apply` of `objects` as the admin.
fn apply(objects: &[Value]) {
    let text: String = objects.iter().map(|o| format!("---\n{o}\n")).collect();
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &text);
    assert!(ok, "kubectl apply: {err}");
}

/// A ServiceAccount, a Role of `rules` in `namespace` bound to it (with
/// `role` as the Role's and the binding's name).
fn account_with_role(home: &str, account: &str, namespace: &str, role: &str, rules: Value) {
    apply(&[
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": account, "namespace": home}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": role, "namespace": namespace}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": role, "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": home}]}),
    ]);
}

/// Every event in `namespace` about `name`, as "Reason: note" lines.
async fn event_notes(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

async fn wait_event(client: &Client, namespace: &str, name: &str, prefix: &str) -> String {
    common::wait_until(
        TIMEOUT,
        format!("an event about {name} whose note starts with {prefix:?}"),
        || async {
            event_notes(client, namespace, name)
                .await
                .iter()
                .any(|n| n.starts_with(prefix))
        },
    )
    .await;
    event_notes(client, namespace, name)
        .await
        .into_iter()
        .find(|n| n.starts_with(prefix))
        .unwrap_or_default()
}

async fn sample_status(samples: &Api<Sample>, name: &str) -> CommonStatus {
    samples.get(name).await.unwrap().status.unwrap_or_default()
}

fn ready(s: &CommonStatus) -> Option<(ConditionStatus, Reason, String)> {
    s.condition(ConditionType::Ready)
        .map(|c| (c.status, c.reason, c.message.clone()))
}

async fn wait_sample(samples: &Api<Sample>, name: &str, status: ConditionStatus, reason: Reason) {
    common::wait_until(
        TIMEOUT,
        format!("the Sample {name} Ready={status:?} with reason {reason:?}"),
        || async {
            ready(&sample_status(samples, name).await)
                .is_some_and(|(s, r, _)| s == status && r == reason)
        },
    )
    .await;
}

/// Patches the status of a resource through `api` (the tenant's token).
async fn forge_inventory<K>(api: &Api<K>, name: &str, objects: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let count = objects.as_array().map_or(0, Vec::len);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"inventory": {"count": count, "objects": objects}}})),
    )
    .await
    .expect("the tenant may write its resource's status");
}

/// A tenant of `home` with `edit` there plus the right to write Samples,
/// their status and CopyratorRules' status: wildcard roles often include
/// `/status`.
async fn status_writing_tenant(client: &Client, home: &str) -> common::TokenKubeconfig {
    account_with_role(
        home,
        "mallory",
        home,
        "mallory-status",
        json!([
            {"apiGroups": ["nuvolaris.org"], "resources": ["samples", "samples/status"],
             "verbs": ["get", "list", "create", "patch", "update", "delete"]},
            {"apiGroups": ["flant.com"], "resources": ["copyrators", "copyrators/status"],
             "verbs": ["get", "list", "patch", "update"]},
        ]),
    );
    let token = common::TokenKubeconfig::mint(client, home, "mallory").await;
    common::wait_until(
        TIMEOUT,
        format!("mallory's token allowed to patch samples/status in {home}"),
        || async {
            token.can_i(&[
                "patch",
                "samples.nuvolaris.org",
                "--subresource=status",
                "-n",
                home,
            ])
        },
    )
    .await;
    token
}

/// A Deployment in `namespace` named `web` that carries the labels the
/// Sample kind adopts (`managed-by`, `instance: web`), plus `labels`.
fn adoptable_deployment(namespace: &str, labels: Value) -> Value {
    let mut all = json!({
        "app.kubernetes.io/managed-by": "kustomize-operator",
        "app.kubernetes.io/instance": "web",
        "app": "victim",
    });
    if let (Some(all), Some(more)) = (all.as_object_mut(), labels.as_object()) {
        all.extend(more.clone());
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace, "labels": all},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "victim"}},
            "template": {"metadata": {"labels": {"app": "victim"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    })
}

async fn uid_of(deployments: &Api<Deployment>, name: &str) -> Option<String> {
    deployments
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|d| d.uid())
}

#[tokio::test]
async fn a_forged_inventory_neither_prunes_nor_deletes_another_tenants_deployment() {
    let client = common::cluster().await;
    let attacker = common::TestNamespace::new(&client, "forge-a").await;
    let victim = common::TestNamespace::new(&client, "forge-v").await;
    // The victim's Deployment is one the Sample kind would adopt, and one
    // in the attacker's own namespace belongs to another resource.
    apply(&[
        adoptable_deployment(&victim.name, json!({})),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "other", "namespace": attacker.name,
                         "labels": {"kustomize-operator.io/owner": "someone-else"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "o"}},
                     "template": {"metadata": {"labels": {"app": "o"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
        }),
    ]);
    let victims: Api<Deployment> = Api::namespaced(client.clone(), &victim.name);
    let neighbours: Api<Deployment> = Api::namespaced(client.clone(), &attacker.name);
    let victim_uid = uid_of(&victims, "web")
        .await
        .expect("the victim's Deployment");
    let other_uid = uid_of(&neighbours, "other")
        .await
        .expect("the other Deployment");
    let mallory = status_writing_tenant(&client, &attacker.name).await;
    let samples: Api<Sample> = Api::namespaced(mallory.client().await, &attacker.name);
    let operator = common::start_operator(&attacker.name, &["--kinds", "sample"]).await;

    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
    wait_sample(&samples, "web", ConditionStatus::True, Reason::Applied).await;
    let forged = json!([
        {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": attacker.name, "names": ["other", "web"]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": victim.name, "names": ["web"]},
    ]);

    // The forging happens while no operator runs, so that no status write
    // of its own can undo it before it reconciles: the next one is certain
    // to read the forged inventory.
    // By prune: the next apply no longer renders what the forged entries list.
    operator.stop().await;
    forge_inventory(&samples, "web", forged.clone()).await;
    samples
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 2}})),
        )
        .await
        .unwrap();
    let operator = common::start_operator(&attacker.name, &["--kinds", "sample"]).await;
    let note = wait_event(&client, &attacker.name, "web", "InventoryIgnored").await;
    assert!(note.contains("ignored 1 inventory entry"), "{note}");
    assert!(note.contains("forgot 1 listed object"), "{note}");
    assert!(
        !note.contains(&victim.name) && !note.contains("other"),
        "{note}"
    );
    wait_sample(&samples, "web", ConditionStatus::True, Reason::Applied).await;
    assert_eq!(uid_of(&victims, "web").await.as_ref(), Some(&victim_uid));
    assert_eq!(
        uid_of(&neighbours, "other").await.as_ref(),
        Some(&other_uid)
    );
    let victim_labels = victims.get("web").await.unwrap().labels().clone();
    assert!(
        !victim_labels.contains_key("kustomize-operator.io/owner"),
        "not adopted outside the owner's namespace: {victim_labels:?}"
    );

    // By delete: the engine deletes the Sample's own Deployment, and the
    // forged entries stay untouched. The test holds the Sample with a
    // finalizer of its own, so the garbage collector (the Deployment's
    // ownerReference) cannot be what deletes the Deployment.
    operator.stop().await;
    forge_inventory(&samples, "web", forged).await;
    common::hold(&attacker.name, "sample/web");
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let operator = common::start_operator(&attacker.name, &["--kinds", "sample"]).await;
    common::wait_for(
        TIMEOUT,
        "the Sample's own Deployment deleted, the Sample held by the test alone",
        || async {
            let own = uid_of(&neighbours, "web").await;
            let finalizers = common::finalizers(&attacker.name, "sample/web");
            if own.is_none() && finalizers.as_deref() == Some(&[common::TEST_HOLD.to_string()][..])
            {
                Ok(())
            } else {
                Err((own, finalizers))
            }
        },
    )
    .await;
    let note = wait_event(&client, &attacker.name, "web", "Deleted").await;
    assert!(note.contains("ignored 1 inventory entry"), "{note}");
    assert!(note.contains("deleted 1 object(s)"), "{note}");
    assert_eq!(uid_of(&victims, "web").await, Some(victim_uid));
    assert_eq!(uid_of(&neighbours, "other").await, Some(other_uid));
    for note in event_notes(&client, &attacker.name, "web").await {
        assert!(
            !note.contains(&victim.name),
            "an event names the victim: {note}"
        );
    }
    common::release(&attacker.name, "sample/web");
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    // One cleanup: a reconcile started by the Deployment's deletion, on a
    // cache that still shows the finalizer, does not run it again.
    let deletions: Vec<String> = event_notes(&client, &attacker.name, "web")
        .await
        .into_iter()
        .filter(|n| n.starts_with("Deleted"))
        .collect();
    assert_eq!(deletions.len(), 1, "{deletions:#?}");
    operator.stop().await;
}

#[tokio::test]
async fn a_forged_copyrator_inventory_tells_nothing_about_other_namespaces() {
    let client = common::cluster().await;
    let attacker = common::TestNamespace::new(&client, "oracle-a").await;
    let target = common::TestNamespace::new(&client, "oracle-t").await;
    let victim = common::TestNamespace::new(&client, "oracle-v").await;
    let _release = common::StripFinalizersOnDrop(attacker.name.clone());
    apply(&[json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "victim-secret", "namespace": victim.name},
        "stringData": {"password": "hunter2"},
    })]);
    let mallory = status_writing_tenant(&client, &attacker.name).await;
    let operator = common::start_operator(&attacker.name, &["--kinds", "copyrator"]).await;
    let admin_rules: Api<CopyratorRule> = Api::namespaced(client.clone(), &attacker.name);
    let rule = CopyratorRule::new(
        "r",
        CopyratorRuleSpec {
            rule_type: Some(RuleType::Configmap),
            selector: Some([("copy".to_string(), "yes".to_string())].into()),
            namespaces: Some(vec![target.name.clone()]),
            deletion_policy: None,
        },
    );
    admin_rules
        .create(&PostParams::default(), &rule)
        .await
        .unwrap();
    let rules: Api<CopyratorRule> = Api::namespaced(mallory.client().await, &attacker.name);
    common::wait_until(TIMEOUT, "the rule r Ready", || async {
        rules
            .get("r")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.common.is_ready())
    })
    .await;

    // Forged while no operator runs (see the Sample's test).
    operator.stop().await;
    forge_inventory(
        &rules,
        "r",
        json!([{"apiVersion": "v1", "kind": "Secret", "namespace": victim.name,
                "names": ["no-such-secret", "victim-secret"]}]),
    )
    .await;
    // A new source: the next reconcile applies its copy and prunes.
    apply(&[json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "src", "namespace": attacker.name, "labels": {"copy": "yes"}},
        "data": {"k": "v"},
    })]);
    let operator = common::start_operator(&attacker.name, &["--kinds", "copyrator"]).await;
    let note = wait_event(&client, &attacker.name, "r", "InventoryIgnored").await;
    assert!(note.contains("forgot 2 listed object(s)"), "{note}");
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), &target.name);
    common::wait_until(
        TIMEOUT,
        format!("the copy src in {}", target.name),
        || async { copies.get_opt("src").await.unwrap().is_some() },
    )
    .await;
    // The copy is made before the status is written: the status is read
    // once it counts the new source, not the forged inventory's.
    common::wait_until(TIMEOUT, "the rule r's status counting src", || async {
        admin_rules
            .get("r")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.copies.source_count == 1)
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &victim.name);
    assert!(secrets.get_opt("victim-secret").await.unwrap().is_some());
    let status = serde_json::to_string(&admin_rules.get("r").await.unwrap().status).unwrap();
    for text in event_notes(&client, &attacker.name, "r")
        .await
        .iter()
        .chain([&status])
    {
        for secret in ["victim-secret", "no-such-secret", "kubectl-create"] {
            assert!(!text.contains(secret), "{secret} revealed: {text}");
        }
    }
    operator.stop().await;
}

#[tokio::test]
async fn as_the_tenants_account_a_sample_is_forbidden_until_the_right_is_granted() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "as-tenant").await;
    let kubectl = common::RecordingKubectl::new();
    let operator = common::start_operator(
        &ns.name,
        &[
            "--kinds",
            "sample",
            "--default-service-account",
            "deployer",
            "--kubectl",
            kubectl.path.to_str().unwrap(),
        ],
    )
    .await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();

    // No account: Forbidden, and the message says it does not exist.
    wait_sample(&samples, "web", ConditionStatus::False, Reason::Forbidden).await;
    let (_, _, message) = ready(&sample_status(&samples, "web").await).unwrap();
    assert!(
        message.contains(&format!(
            "ServiceAccount {}/deployer does not exist",
            ns.name
        )),
        "{message}"
    );

    // An account without the right to write Deployments: still Forbidden,
    // naming the account, the verb, the resource and the namespace.
    account_with_role(
        &ns.name,
        "deployer",
        &ns.name,
        "deployer-configmaps",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
    );
    // Forbidden again, for another cause (a run in between may say
    // Progressing for a while).
    let message = common::wait_for(
        TIMEOUT,
        "the Sample web Forbidden without saying the account does not exist",
        || async {
            let (status, reason, message) = ready(&sample_status(&samples, "web").await).unwrap();
            let refused = (status, reason) == (ConditionStatus::False, Reason::Forbidden);
            if refused && !message.contains("does not exist") {
                Ok(message)
            } else {
                Err((status, reason, message))
            }
        },
    )
    .await;
    let user = format!("system:serviceaccount:{}:deployer", ns.name);
    assert!(
        message.contains(&format!("acting as ServiceAccount {}/deployer", ns.name)),
        "{message}"
    );
    assert!(
        message.contains(&user) && message.contains("deployments"),
        "{message}"
    );
    assert!(
        message.contains(&format!("in the namespace \"{}\"", ns.name)),
        "{message}"
    );
    assert!(
        deployments.get_opt("web").await.unwrap().is_none(),
        "nothing was created"
    );
    let (_, can, _) = common::kubectl(&[
        "auth",
        "can-i",
        "create",
        "deployments",
        "-n",
        &ns.name,
        "--as",
        &user,
    ]);
    assert_eq!(can.trim(), "no");

    // The right granted: Ready without touching the Sample.
    let generation = samples.get("web").await.unwrap().metadata.generation;
    account_with_role(
        &ns.name,
        "deployer",
        &ns.name,
        "deployer-deployments",
        json!([{"apiGroups": ["apps"], "resources": ["deployments"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]),
    );
    wait_sample(&samples, "web", ConditionStatus::True, Reason::Applied).await;
    assert_eq!(
        samples.get("web").await.unwrap().metadata.generation,
        generation
    );
    let last = sample_status(&samples, "web").await.last_command.unwrap();
    assert!(
        last.command.contains(&format!("--as={user}")),
        "{}",
        last.command
    );
    assert!(deployments.get_opt("web").await.unwrap().is_some());

    // Deleted as the account too, by the engine: the test holds the Sample
    // with a finalizer of its own, so the garbage collector (the
    // Deployment's ownerReference) cannot be what deletes the Deployment.
    common::hold(&ns.name, "sample/web");
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_for(
        TIMEOUT,
        "the Deployment web gone, the Sample held by the test alone",
        || async {
            let left = deployments.get_opt("web").await.unwrap().is_some();
            let finalizers = common::finalizers(&ns.name, "sample/web");
            if !left && finalizers.as_deref() == Some(&[common::TEST_HOLD.to_string()][..]) {
                Ok(())
            } else {
                Err((left, finalizers))
            }
        },
    )
    .await;
    let raw = format!(
        "delete --raw=/apis/apps/v1/namespaces/{}/deployments/web ",
        ns.name
    );
    let deletes: Vec<String> = kubectl
        .runs()
        .into_iter()
        .filter(|run| run.contains(&raw))
        .collect();
    assert!(
        !deletes.is_empty()
            && deletes
                .iter()
                .all(|run| run.contains(&format!("--as={user} "))),
        "the operator's deletes of the Deployment, which must act as {user}: {deletes:#?}"
    );
    common::release(&ns.name, "sample/web");
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn revoking_a_tenants_right_stops_its_copies_at_the_next_reconcile() {
    let client = common::cluster().await;
    let src = common::TestNamespace::new(&client, "revoke-s").await;
    let dst = common::TestNamespace::new(&client, "revoke-d").await;
    let _release = common::StripFinalizersOnDrop(src.name.clone());
    account_with_role(
        &src.name,
        "copier",
        &dst.name,
        "copier-configmaps",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]),
    );
    let operator = common::start_operator(
        &src.name,
        &[
            "--kinds",
            "copyrator",
            "--default-service-account",
            "copier",
        ],
    )
    .await;
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), &src.name);
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), &dst.name);
    let value = |cm: Option<ConfigMap>| cm.and_then(|c| c.data).and_then(|d| d.get("k").cloned());
    apply(&[json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "src", "namespace": src.name, "labels": {"copy": "yes"}},
        "data": {"k": "v1"},
    })]);
    let rules: Api<CopyratorRule> = Api::namespaced(client.clone(), &src.name);
    let rule = CopyratorRule::new(
        "r",
        CopyratorRuleSpec {
            rule_type: Some(RuleType::Configmap),
            selector: Some([("copy".to_string(), "yes".to_string())].into()),
            namespaces: Some(vec![dst.name.clone()]),
            deletion_policy: None,
        },
    );
    rules.create(&PostParams::default(), &rule).await.unwrap();
    common::wait_until(TIMEOUT, "the copy src with the value v1", || async {
        value(copies.get_opt("src").await.unwrap()).as_deref() == Some("v1")
    })
    .await;

    // Revoked: the next reconcile (a changed source) is Forbidden.
    let (ok, _, err) = common::kubectl(&[
        "-n",
        &dst.name,
        "delete",
        "rolebinding",
        "copier-configmaps",
    ]);
    assert!(ok, "{err}");
    let user = format!("system:serviceaccount:{}:copier", src.name);
    common::wait_until(
        TIMEOUT,
        format!(
            "{user} no longer allowed to patch configmaps in {}",
            dst.name
        ),
        || async {
            let (_, out, _) = common::kubectl(&[
                "auth",
                "can-i",
                "patch",
                "configmaps",
                "-n",
                &dst.name,
                "--as",
                &user,
            ]);
            out.trim() == "no"
        },
    )
    .await;
    sources
        .patch(
            "src",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        format!("the rule r Forbidden, naming {user}"),
        || async {
            rules.get("r").await.unwrap().status.is_some_and(|s| {
                s.common
                    .condition(ConditionType::Ready)
                    .is_some_and(|c| c.reason == Reason::Forbidden && c.message.contains(&user))
            })
        },
    )
    .await;
    assert_eq!(
        value(copies.get_opt("src").await.unwrap()).as_deref(),
        Some("v1")
    );
    operator.stop().await;
}

/// The ClusterRoles of `overlays/locked-down` that an operator serving
/// Samples holds, renamed `<prefix>-<name>` (the install's own names are
/// shared with other tests) and bound to `account`.
fn locked_down_roles(prefix: &str, account: (&str, &str)) -> Vec<Value> {
    let mut objects = Vec::new();
    for doc in common::kustomize_documents("overlays/locked-down") {
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let wanted = [
            "kustomize-operator-sample",
            "kustomize-operator-events",
            "kustomize-operator-impersonate",
        ];
        if doc["kind"] != "ClusterRole" || !wanted.contains(&name.as_str()) {
            continue;
        }
        let renamed = format!("{prefix}-{name}");
        let mut role = doc.clone();
        role["metadata"]["name"] = json!(renamed);
        // Bound below to `account` alone: not aggregated into the install's role too.
        if let Some(labels) = role["metadata"]["labels"].as_object_mut() {
            labels.remove(kustomize_operator::kinds::declared::rbac::AGGREGATE_LABEL);
        }
        objects.push(role);
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": renamed},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": renamed},
            "subjects": [{"kind": "ServiceAccount", "name": account.1, "namespace": account.0}],
        }));
    }
    assert_eq!(objects.len(), 6, "the overlay's three roles, bound");
    objects
}

/// Deletes cluster-scoped grants when dropped.
struct ClusterGrants(Vec<Value>);

impl Drop for ClusterGrants {
    fn drop(&mut self) {
        for o in &self.0 {
            let kind = o["kind"].as_str().unwrap_or_default().to_lowercase();
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let _ = common::kubectl(&[
                "delete",
                &format!("{kind}.rbac.authorization.k8s.io"),
                name,
                "--wait=false",
            ]);
        }
    }
}

#[tokio::test]
async fn the_locked_down_install_runs_a_sample_without_write_rights_of_its_own() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "locked-op").await;
    let tenant = common::TestNamespace::new(&client, "locked-t").await;
    let grants = locked_down_roles(&home.name, (&home.name, "operator"));
    apply(&[json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "operator", "namespace": home.name}})]);
    apply(&grants);
    let _grants = ClusterGrants(grants);
    let token = common::TokenKubeconfig::mint(&client, &home.name, "operator").await;
    let writer = format!("system:serviceaccount:{}:kustomize-writer", tenant.name);
    common::wait_until(
        TIMEOUT,
        format!(
            "the operator's token allowed to impersonate kustomize-writer in {}",
            tenant.name
        ),
        || async {
            token.can_i(&[
                "impersonate",
                "serviceaccounts/kustomize-writer",
                "-n",
                &tenant.name,
            ])
        },
    )
    .await;
    // The operator's own account may not write a Deployment anywhere.
    for verb in ["create", "patch", "delete"] {
        assert!(
            !token.can_i(&[verb, "deployments.apps", "-n", &tenant.name]),
            "{verb}"
        );
    }
    assert!(!token.can_i(&["impersonate", "serviceaccounts/default", "-n", &tenant.name]));
    // The tenant's account may, in its namespace.
    apply(&[
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "kustomize-writer", "namespace": tenant.name}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "kustomize-writer", "namespace": tenant.name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
               "subjects": [{"kind": "ServiceAccount", "name": "kustomize-writer", "namespace": tenant.name}]}),
    ]);
    common::wait_until(
        TIMEOUT,
        format!("{writer} allowed to create deployments in {}", tenant.name),
        || async {
            let (_, out, _) = common::kubectl(&[
                "auth",
                "can-i",
                "create",
                "deployments",
                "-n",
                &tenant.name,
                "--as",
                &writer,
            ]);
            out.trim() == "yes"
        },
    )
    .await;
    let kubeconfig = token.path().display().to_string();
    let mut operator = common::OperatorProcess::spawn(
        &tenant.name,
        &[("KUBECONFIG", kubeconfig.as_str())],
        &[
            "--kinds",
            "sample",
            "--default-service-account",
            "kustomize-writer",
            "--metrics-addr",
            "",
        ],
    );
    let samples: Api<Sample> = Api::namespaced(client.clone(), &tenant.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &tenant.name);
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web Ready", || async {
        ready(&sample_status(&samples, "web").await)
            .is_some_and(|(s, _, _)| s == ConditionStatus::True)
    })
    .await;
    assert!(operator.running(), "{}", operator.log_tail());
    let deployment = deployments.get("web").await.unwrap();
    assert_eq!(
        deployment.labels().get("kustomize-operator.io/owner"),
        samples.get("web").await.unwrap().uid().as_ref()
    );
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        "the Deployment web and the Sample web gone",
        || async {
            deployments.get_opt("web").await.unwrap().is_none()
                && samples.get_opt("web").await.unwrap().is_none()
        },
    )
    .await;
}

/// A kubectl that, before a raw delete, replaces the Deployment `web` of
/// `namespace` with another one carrying the same labels (the owner's
/// marker included), as if it had been deleted and created again between
/// the operator's read and its delete.
fn replacing_kubectl(dir: &std::path::Path, namespace: &str) -> std::path::PathBuf {
    let wrapper = dir.join("kubectl");
    let real = common::kubectl_path().display().to_string();
    common::write_script(
        &wrapper,
        &format!(
            r#"case "$*" in *--raw=*deployments/web*)
  {real} -n {namespace} get deployment web -o json > {dir}/web.json
  {real} -n {namespace} delete deployment web --wait=true >/dev/null
  python3 -c 'import json,sys; o=json.load(sys.stdin); o.pop("status",None); m=o["metadata"]; [m.pop(k,None) for k in ("uid","resourceVersion","creationTimestamp","managedFields","ownerReferences","generation")]; print(json.dumps(o))' < {dir}/web.json | {real} create -f - >/dev/null
  {real} -n {namespace} get deployment web -o jsonpath='{{.metadata.uid}}' > {dir}/replacement-uid;;
esac
exec {real} "$@""#,
            dir = dir.display(),
        ),
    );
    wrapper
}

#[tokio::test]
async fn an_object_replaced_between_the_read_and_the_delete_is_left() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "replaced").await;
    let dir = tempfile::tempdir().unwrap();
    let wrapper = replacing_kubectl(dir.path(), &ns.name);
    let operator = common::start_operator(
        &ns.name,
        &[
            "--kinds",
            "sample",
            "--kubectl",
            &wrapper.display().to_string(),
        ],
    )
    .await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    samples
        .create(
            &PostParams::default(),
            &Sample::new("web", SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
    wait_sample(&samples, "web", ConditionStatus::True, Reason::Applied).await;
    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    let replacement = std::fs::read_to_string(dir.path().join("replacement-uid"))
        .expect("the wrapper replaced the Deployment during the delete");
    assert_eq!(
        uid_of(&deployments, "web").await,
        Some(replacement),
        "the replacement is left"
    );
    let note = wait_event(&client, &ns.name, "web", "Deleted").await;
    assert!(note.contains("forgot 1 listed object"), "{note}");
    operator.stop().await;
}

/// Binds every ClusterRole `overlay` installs, renamed `<prefix>-<name>`
/// (not aggregated: the aggregating role is left out and the label
/// removed), to the ServiceAccount `account` of `home`, created here; returns
/// the grants (delete them with [`ClusterGrants`]).
fn overlay_roles(overlay: &str, prefix: &str, home: &str, account: &str) -> Vec<Value> {
    apply(&[json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": account, "namespace": home}})]);
    let mut objects = Vec::new();
    for doc in common::kustomize_documents(overlay) {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        if doc["kind"] != "ClusterRole" || doc.get("aggregationRule").is_some() {
            continue;
        }
        let renamed = format!("{prefix}-{name}");
        let mut role = doc.clone();
        role["metadata"]["name"] = json!(renamed);
        if let Some(labels) = role["metadata"]["labels"].as_object_mut() {
            labels.remove(kustomize_operator::kinds::declared::rbac::AGGREGATE_LABEL);
        }
        objects.push(role);
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": renamed},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": renamed},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": home}],
        }));
    }
    apply(&objects);
    objects
}

/// The locked-down install's account may create, patch and delete CRDs
/// (any CRD: RBAC cannot narrow them) only when it serves KindDefinitions:
/// `overlays/locked-down` grants none of it, the same install with its
/// component kind-definitions/ all of it. Asked of the API server with the
/// account's own token.
#[tokio::test]
async fn the_locked_down_account_holds_crd_rights_only_with_kind_definitions() {
    let client = common::cluster().await;
    let home = common::TestNamespace::new(&client, "locked-crd").await;
    for (i, (overlay, serves)) in [
        ("overlays/locked-down", false),
        ("overlays/locked-down-kind-definitions", true),
    ]
    .into_iter()
    .enumerate()
    {
        let account = format!("operator-{i}");
        let grants = overlay_roles(overlay, &format!("{}-{i}", home.name), &home.name, &account);
        let _grants = ClusterGrants(grants);
        let token = common::TokenKubeconfig::mint(&client, &home.name, &account).await;
        // A right both installs hold: the grants are in effect.
        common::wait_until(
            TIMEOUT,
            format!("{overlay}'s account allowed to watch samples"),
            || async { token.can_i(&["watch", "samples.nuvolaris.org"]) },
        )
        .await;
        for verb in ["create", "patch", "delete"] {
            assert_eq!(
                token.can_i(&[verb, "customresourcedefinitions.apiextensions.k8s.io"]),
                serves,
                "{overlay}: {verb} customresourcedefinitions"
            );
        }
        assert_eq!(
            token.can_i(&["watch", "kinddefinitions.kustomize-operator.io"]),
            serves,
            "{overlay}: watch kinddefinitions"
        );
        // Neither writes what its kinds produce.
        assert!(
            !token.can_i(&["create", "deployments.apps", "-n", &home.name]),
            "{overlay}"
        );
    }
}

/// The fixtures' cluster-scoped kind Tenant (a Namespace, a LimitRange
/// and a ConfigMap in it), its CRD installed.
fn tenant_kind() -> kustomize_operator::kinds::registry::Kind {
    let registry =
        kustomize_operator::kinds::registry::Registry::load(&common::kustomize_dirs()).unwrap();
    let kind = registry.select(&["tenant".to_string()]).unwrap().remove(0);
    let crd = serde_json::to_string(&kind.crd()).unwrap();
    let (ok, _, err) = common::kubectl_stdin(&["apply", "--server-side", "-f", "-"], &crd);
    assert!(ok, "installing the Tenant CRD: {err}");
    let name = kind.crd().metadata.name.unwrap();
    common::wait_established(&[&name]).unwrap_or_else(|e| panic!("{name} not established: {e}"));
    kind
}

/// Deletes a cluster-scoped resource and what it made when dropped, its
/// finalizer removed first (the test's operator may be gone).
struct ClusterScoped {
    resource: String,
    namespace: String,
}

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        let _ = common::kubectl(&[
            "patch",
            &self.resource,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        let _ = common::kubectl(&[
            "delete",
            &self.resource,
            "--ignore-not-found",
            "--wait=false",
        ]);
        let _ = common::kubectl(&[
            "delete",
            "namespace",
            &self.namespace,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
}

/// The Ready condition of a dynamic object's status.
fn ready_of(object: &kube::api::DynamicObject) -> Option<(ConditionStatus, Reason, String)> {
    let status: CommonStatus = serde_json::from_value(object.data["status"].clone()).ok()?;
    ready(&status)
}

/// In an install writing as tenants, a cluster-scoped resource has no
/// namespace whose account could write for it: without
/// `--cluster-service-account` it is refused (`Forbidden`, naming the flag)
/// although the operator's own account could write everything it makes;
/// with it, its writes run as that account (refused while the account
/// lacks the rights, Ready once it holds them), and so does its deletion.
/// The operator runs on its own token only.
#[tokio::test]
async fn a_cluster_scoped_kind_writes_as_the_cluster_account_or_not_at_all() {
    let client = common::cluster().await;
    let kind = tenant_kind();
    let tenants: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kind.declared().expect("a declared kind").resource,
    );
    let home = common::TestNamespace::new(&client, "cluster-op").await;
    let h = home.name.clone();
    // The test's Tenants carry its own shard, served by its operator alone.
    let shard = h.clone();
    let fixtures = common::fixture_kinds().display().to_string();
    // The operator's account: the Tenant kind's role (`kustomize-operator
    // rbac`: the tenants, and every write on what they make), events, and
    // the impersonation of cluster-writer in its home.
    let (code, printed, err) =
        common::operator_command("rbac", &["--kustomize-dir", &fixtures, "--kinds", "tenant"]);
    assert_eq!(code, Some(0), "kustomize-operator rbac: {err}");
    let mut role: Value = serde_saphyr::from_str(&printed).expect("a ClusterRole");
    let role_name = format!("{h}-tenant");
    role["metadata"] = json!({"name": role_name});
    role["rules"]
        .as_array_mut()
        .unwrap()
        .push(json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}));
    let writes = json!([{"apiGroups": [""], "resources": ["namespaces", "configmaps", "limitranges"],
                         "verbs": ["get", "list", "watch", "create", "patch", "delete"]}]);
    let writer_role = format!("{h}-cluster-writer");
    let grants = vec![
        role,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role_name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
               "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": h}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": writer_role}, "rules": writes}),
    ];
    account_with_role(
        &h,
        "operator",
        &h,
        "impersonate-cluster-writer",
        json!([
            {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["cluster-writer"], "verbs": ["impersonate"]},
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get"]},
        ]),
    );
    apply(&[json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "cluster-writer", "namespace": h}})]);
    apply(&grants);
    let mut cluster_grants = ClusterGrants(grants);
    let token = common::TokenKubeconfig::mint(&client, &h, "operator").await;
    common::wait_until(
        TIMEOUT,
        "the operator's token allowed to create namespaces",
        || async {
            token.can_i(&["create", "namespaces"])
                && token.can_i(&["impersonate", "serviceaccounts/cluster-writer", "-n", &h])
        },
    )
    .await;
    let cluster_writer = format!("system:serviceaccount:{h}:cluster-writer");
    let (_, no, _) = common::kubectl(&[
        "auth",
        "can-i",
        "create",
        "namespaces",
        "--as",
        &cluster_writer,
    ]);
    assert_eq!(no.trim(), "no", "cluster-writer starts without rights");

    let name = format!("t{:06x}", rand::random::<u32>() & 0xff_ffff);
    let made = format!("tenant-{name}");
    let _cleanup = ClusterScoped {
        resource: format!("{}/{name}", kind.crd().metadata.name.unwrap()),
        namespace: made.clone(),
    };
    let kubeconfig = token.path().display().to_string();
    let kubectl = common::RecordingKubectl::new();
    let recording = kubectl.path.display().to_string();
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = vec![
            "--kustomize-dir",
            &fixtures,
            "--kinds",
            "tenant",
            "--shard",
            &shard,
            "--default-service-account",
            "kustomize-writer",
            "--metrics-addr",
            "",
            "--kubectl",
            &recording,
        ];
        args.extend_from_slice(extra);
        common::OperatorProcess::spawn(&h, &[("KUBECONFIG", kubeconfig.as_str())], &args)
    };
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());

    // Writing as tenants, no cluster account: refused, nothing made.
    let mut operator = run(&[]);
    tenants
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "platform.example.com/v1", "kind": "Tenant",
                "metadata": {"name": name, "labels": {"kustomize-operator.io/shard": shard}},
                "spec": {"owner": "ops"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (_, _, message) = common::wait_for(TIMEOUT, "the Tenant refused (Forbidden)", || async {
        match ready_of(&tenants.get(&name).await.unwrap()) {
            Some(r @ (ConditionStatus::False, Reason::Forbidden, _)) => Ok(r),
            seen => Err((seen, operator.log_tail())),
        }
    })
    .await;
    for needle in [
        &format!("Tenant {name} is cluster-scoped"),
        "--cluster-service-account",
        "CLUSTER_SERVICE_ACCOUNT",
        "nothing was applied",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    assert!(
        namespaces.get_opt(&made).await.unwrap().is_none(),
        "{made} was created"
    );
    operator.signal(libc::SIGTERM);
    assert!(
        operator.wait_exit(TIMEOUT).await.is_some(),
        "the operator did not stop"
    );

    // With the cluster account, its writes run as that account: refused
    // while it lacks the right, though the operator's own account holds it.
    let cluster_account = format!("{h}/cluster-writer");
    let mut operator = run(&["--cluster-service-account", &cluster_account]);
    let (_, _, message) = common::wait_for(
        TIMEOUT,
        "the Tenant Forbidden as cluster-writer",
        || async {
            match ready_of(&tenants.get(&name).await.unwrap()) {
                Some(r @ (ConditionStatus::False, Reason::Forbidden, _))
                    if r.2
                        .contains(&format!("acting as ServiceAccount {cluster_account}")) =>
                {
                    Ok(r)
                }
                seen => Err((seen, operator.log_tail())),
            }
        },
    )
    .await;
    assert!(message.contains("namespaces"), "{message}");
    assert!(
        namespaces.get_opt(&made).await.unwrap().is_none(),
        "{made} was created"
    );

    // Granted, the next retry makes it Ready, the namespace made.
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": writer_role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": writer_role},
        "subjects": [{"kind": "ServiceAccount", "name": "cluster-writer", "namespace": h}]});
    apply(std::slice::from_ref(&binding));
    cluster_grants.0.push(binding);
    common::wait_for(TIMEOUT, "the Tenant Ready as cluster-writer", || async {
        match ready_of(&tenants.get(&name).await.unwrap()) {
            Some((ConditionStatus::True, _, _)) => Ok(()),
            seen => Err((seen, operator.log_tail())),
        }
    })
    .await;
    let namespace = namespaces.get(&made).await.unwrap();
    assert_eq!(
        namespace.labels().get("kustomize-operator.io/owner"),
        tenants.get(&name).await.unwrap().uid().as_ref()
    );
    // Deleted as cluster-writer too.
    tenants
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        "the Tenant gone and its namespace going",
        || async {
            tenants.get_opt(&name).await.unwrap().is_none()
                && namespaces
                    .get_opt(&made)
                    .await
                    .unwrap()
                    .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
        },
    )
    .await;
    let raw = format!("delete --raw=/api/v1/namespaces/{made} ");
    let deletes: Vec<String> = kubectl
        .runs()
        .into_iter()
        .filter(|run| run.contains(&raw))
        .collect();
    assert!(
        !deletes.is_empty()
            && deletes
                .iter()
                .all(|run| run.contains(&format!("--as={cluster_writer} "))),
        "the operator's deletes of {made}, which must act as {cluster_writer}: {deletes:#?}"
    );
    assert!(operator.running(), "{}", operator.log_tail());
}
