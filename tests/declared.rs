//! Kinds declared as folders, served by a running operator against the
//! control plane: `tests/fixtures/kinds/webapp` (namespaced: a ConfigMap and
//! a Deployment in its base, a generated ConfigMap, a Service only when
//! asked, a status mapping and a readiness rule) and `tenant`
//! (cluster-scoped: a Namespace and objects in it), and `credential` (a
//! Secret from a resource template). No Rust was written for any of them.

use ko_test_support as common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, LimitRange, Namespace, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kind::Owner;
use kustomize_operator::kinds::registry::{Kind, Registry};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const TIMEOUT: Duration = Duration::from_secs(90);

/// The fixture kinds, their CRDs installed once per test binary.
async fn fixture_kinds(client: &Client) -> Registry {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let registry = Registry::load(&common::kustomize_dirs()).unwrap();
    INSTALLED
        .get_or_init(|| async {
            for name in ["webapp", "tenant", "credential"] {
                install_crd(client, &select(&registry, name)).await;
            }
        })
        .await;
    registry
}

fn select(registry: &Registry, name: &str) -> Kind {
    registry.select(&[name.to_string()]).unwrap().remove(0)
}

/// Applies `kind`'s CRD and waits until it is established.
async fn install_crd(_client: &Client, kind: &Kind) {
    let crd = serde_json::to_string(&kind.crd()).unwrap();
    let (ok, _, err) = common::kubectl_stdin(&["apply", "--server-side", "-f", "-"], &crd);
    assert!(ok, "installing the CRD of {kind}: {err}");
    let name = kind.crd().metadata.name.unwrap();
    if let Err(err) = common::wait_established(&[&name]) {
        panic!("{name} not established: {err}");
    }
}

fn api_resource(kind: &Kind) -> ApiResource {
    kind.declared().expect("a declared kind").resource.clone()
}

/// The operator for `ns`, serving `kinds` from the repo's and the fixtures'
/// kind folders.
async fn operator(ns: &str, kinds: &str) -> kustomize_operator::Operator {
    let fixtures = common::fixture_kinds().display().to_string();
    common::start_operator(
        ns,
        &[
            "--kustomize-dir",
            &fixtures,
            "--kinds",
            kinds,
            "--health-timeout",
            "2m",
        ],
    )
    .await
}

fn webapp(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "apps.example.com/v1alpha1",
        "kind": "WebApp",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Waits until `name` reports `reason` on its Ready condition for its
/// current generation (Ready=True when `reason` is Applied); returns it.
async fn wait_reason(api: &Api<DynamicObject>, name: &str, reason: &str) -> DynamicObject {
    wait_reason_saying(api, name, reason, "").await
}

/// As `wait_reason`, with a Ready message that contains `part`.
async fn wait_reason_saying(
    api: &Api<DynamicObject>,
    name: &str,
    reason: &str,
    part: &str,
) -> DynamicObject {
    let what = format!("{name} to reach {reason} saying {part:?}");
    common::wait_for(TIMEOUT, what, || async {
        let object = api.get(name).await.unwrap();
        let status = &object.data["status"];
        let current = status["observedGeneration"].as_i64() == object.metadata.generation;
        let ready = condition(&object, "Ready");
        let matches = ready.is_some_and(|c| {
            c["reason"] == reason
                && (reason != "Applied" || c["status"] == "True")
                && c["message"].as_str().unwrap_or_default().contains(part)
        });
        if current && matches {
            Ok(object)
        } else {
            Err(status.clone())
        }
    })
    .await
}

async fn names<K>(api: &Api<K>) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut names: Vec<String> = api
        .list_metadata(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    names.sort();
    names
}

/// The data of the ConfigMap whose name starts with `prefix` (a generated one).
async fn generated(
    config_maps: &Api<ConfigMap>,
    prefix: &str,
) -> Vec<(String, BTreeMap<String, String>)> {
    config_maps
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|c| {
            (
                c.metadata.name.unwrap_or_default(),
                c.data.unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_webapp_is_applied_becomes_ready_changes_prunes_and_goes() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "webapp").await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let operator = operator(&ns.name, "webapp").await;

    let spec = json!({"replicas": 2, "greeting": "hi", "expose": true});
    apps.create(&PostParams::default(), &webapp("shop", spec))
        .await
        .unwrap();
    let ready = wait_reason(&apps, "shop", "Applied").await;
    // Ready only once the readiness rule holds: 2 replicas available.
    assert_eq!(
        ready.data["status"]["readyReplicas"], 2,
        "the status mapping"
    );
    assert_eq!(ready.data["status"]["inventory"]["count"], 4);
    let deployment = deployments.get("shop-web").await.unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(2));
    let labels = deployment.metadata.labels.unwrap();
    assert_eq!(
        labels["example.com/tier"], "frontend",
        "the schema's default"
    );
    assert_eq!(labels["app.kubernetes.io/instance"], "shop");
    assert_eq!(names(&services).await, ["shop-web"]);
    let greetings = generated(&config_maps, "shop-greeting-").await;
    assert_eq!(greetings.len(), 1);
    assert_eq!(greetings[0].1["greeting.txt"], "hi");
    assert!(
        config_maps
            .get_opt("shop-settings")
            .await
            .unwrap()
            .is_some()
    );

    // A new greeting, no Service, one replica: the new ConfigMap replaces
    // the old one and the Service is pruned.
    let change = json!({"spec": {"replicas": 1, "greeting": "bye", "expose": false}});
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let changed = wait_reason(&apps, "shop", "Applied").await;
    assert_eq!(changed.data["status"]["inventory"]["count"], 3);
    assert!(
        names(&services).await.is_empty(),
        "the Service was not pruned"
    );
    let greetings = generated(&config_maps, "shop-greeting-").await;
    assert_eq!(greetings.len(), 1, "{greetings:?}");
    assert_eq!(greetings[0].1["greeting.txt"], "bye");
    let deployment = deployments.get("shop-web").await.unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(1));

    apps.delete("shop", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the webapp shop gone", || async {
        apps.get_opt("shop").await.unwrap().is_none()
    })
    .await;
    assert!(deployments.get_opt("shop-web").await.unwrap().is_none());
    assert!(generated(&config_maps, "shop-").await.is_empty());
    operator.stop().await;
}

#[tokio::test]
async fn diff_lists_what_a_run_would_prune_and_what_it_would_leave() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "webapp-diff").await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let first = operator(&ns.name, "webapp").await;
    let spec = json!({"replicas": 1, "expose": true});
    apps.create(&PostParams::default(), &webapp("shop", spec))
        .await
        .unwrap();
    wait_reason(&apps, "shop", "Applied").await;
    first.stop().await;
    let fixtures = common::fixture_kinds().display().to_string();
    let diff = || {
        let args = ["webapp/shop", "-n", &ns.name, "--kustomize-dir", &fixtures];
        common::operator_command("diff", &args)
    };
    let service = format!("service/shop-web in {}", ns.name);

    // No longer exposed: a run would prune the Service; diff deletes nothing.
    let change = json!({"spec": {"expose": false}});
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let (code, out, err) = diff();
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        would(&out),
        [format!("# would prune {service} (no longer rendered)")],
        "stdout:\n{out}\nstderr:\n{err}"
    );
    assert_eq!(names(&services).await, ["shop-web"]);

    // Without the marker it would be left, and nothing else would change.
    let unmark = format!("{}-", Owner::LABEL);
    let (ok, _, err) = common::kubectl(&["-n", &ns.name, "label", "service/shop-web", &unmark]);
    assert!(ok, "{err}");
    let (code, out, err) = diff();
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let leave = would(&out);
    assert_eq!(leave.len(), 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        leave[0].starts_with(&format!(
            "# would leave {service} (no longer rendered, but no longer carries the marker"
        )),
        "{out}"
    );

    // Marked again, the operator prunes it as diff said; then diff is clean.
    let uid = apps.get("shop").await.unwrap().metadata.uid.unwrap();
    let mark = format!("{}={uid}", Owner::LABEL);
    let (ok, _, err) = common::kubectl(&["-n", &ns.name, "label", "service/shop-web", &mark]);
    assert!(ok, "{err}");
    let operator = operator(&ns.name, "webapp").await;
    wait_reason(&apps, "shop", "Applied").await;
    assert!(
        names(&services).await.is_empty(),
        "the Service was not pruned"
    );
    let (code, out, err) = diff();
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(would(&out).is_empty(), "{out}");
    operator.stop().await;
}

/// A requester who may diff a WebApp's objects but not read its Service
/// (a ServiceAccount token) gets the diff and a note that the prune check
/// could not be made, never a guess.
#[tokio::test]
async fn diff_says_so_when_the_requester_cannot_read_what_would_be_pruned() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "webapp-diff-rbac").await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let operator = operator(&ns.name, "webapp").await;
    let spec = json!({"replicas": 1, "expose": true});
    apps.create(&PostParams::default(), &webapp("shop", spec))
        .await
        .unwrap();
    wait_reason(&apps, "shop", "Applied").await;
    operator.stop().await;
    let change = json!({"spec": {"expose": false}});
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let grants = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: differ, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: differ, namespace: {ns}}}
rules:
  - {{apiGroups: [apps.example.com], resources: [webapps], verbs: [get]}}
  - {{apiGroups: [apps, ""], resources: [deployments, configmaps], verbs: [get, list, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: differ, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: differ}}
subjects: [{{kind: ServiceAccount, name: differ, namespace: {ns}}}]
"#,
        ns = ns.name
    );
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &grants);
    assert!(ok, "{err}");
    let token = common::TokenKubeconfig::mint(&client, &ns.name, "differ").await;
    common::wait_until(
        TIMEOUT,
        format!(
            "the differ's token allowed to patch deployments in {}",
            ns.name
        ),
        || async { token.can_i(&["patch", "deployments", "-n", &ns.name]) },
    )
    .await;
    assert!(!token.can_i(&["get", "services", "-n", &ns.name]));

    let fixtures = common::fixture_kinds().display().to_string();
    let args = ["webapp/shop", "-n", &ns.name, "--kustomize-dir", &fixtures];
    // kubectl diff compares status too, which the Deployment controller
    // may still be writing: clean once it settled.
    let (out, err) = common::wait_for(TIMEOUT, "diff to find nothing to change", async || {
        match common::operator_command_as("diff", &args, Some(token.path())) {
            (Some(0), out, err) => Ok((out, err)),
            (code, out, err) => Err(format!("exit {code:?}\nstdout:\n{out}\nstderr:\n{err}")),
        }
    })
    .await;
    assert!(would(&out).is_empty(), "{out}");
    assert!(
        err.contains("note: what run would prune was not checked") && err.contains("forbidden"),
        "stderr:\n{err}"
    );
}

/// `diff`'s lines about what a run would prune or leave.
fn would(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("# would"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn an_object_the_webapp_did_not_create_is_never_taken() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "webapp-own").await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let theirs: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "blog-settings"},
        "data": {"owner": "someone else"},
    }))
    .unwrap();
    config_maps
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let operator = operator(&ns.name, "webapp").await;

    apps.create(
        &PostParams::default(),
        &webapp("blog", json!({"replicas": 1})),
    )
    .await
    .unwrap();
    let refused = wait_reason(&apps, "blog", "OwnershipConflict").await;
    let message = condition(&refused, "Ready").unwrap()["message"].to_string();
    assert!(message.contains("blog-settings"), "{message}");
    let untouched = config_maps.get("blog-settings").await.unwrap();
    assert_eq!(untouched.data.unwrap()["owner"], "someone else");
    assert!(untouched.metadata.labels.is_none());

    apps.delete("blog", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the webapp blog gone", || async {
        apps.get_opt("blog").await.unwrap().is_none()
    })
    .await;
    assert!(
        config_maps
            .get_opt("blog-settings")
            .await
            .unwrap()
            .is_some(),
        "deleted what it did not create"
    );
    operator.stop().await;
}

#[tokio::test]
async fn hostile_strings_in_a_spec_stay_data() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "webapp-hostile").await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let operator = operator(&ns.name, "webapp").await;
    let hostile = [
        "x\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen",
        "{{ metadata.uid }} {% raw %} ${HOME} $(id)",
        "\"quoted\": 'single' # comment\n  indented: [a, b]",
        "&anchor *alias !!binary",
    ];
    for (i, text) in hostile.iter().enumerate() {
        let name = format!("h{i}");
        let spec = json!({"replicas": 0, "greeting": text});
        apps.create(&PostParams::default(), &webapp(&name, spec))
            .await
            .unwrap();
    }
    for (i, text) in hostile.iter().enumerate() {
        let name = format!("h{i}");
        let applied = wait_reason(&apps, &name, "Applied").await;
        assert_eq!(
            applied.data["status"]["inventory"]["count"], 3,
            "{name}: objects added"
        );
        let greetings = generated(&config_maps, &format!("{name}-greeting-")).await;
        assert_eq!(
            greetings[0].1["greeting.txt"], *text,
            "{name}: not byte for byte"
        );
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    assert!(secrets.get_opt("stolen").await.unwrap().is_none());
    for i in 0..hostile.len() {
        apps.delete(&format!("h{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    common::wait_until(TIMEOUT, "every hostile webapp gone", || async {
        names(&apps).await.is_empty()
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_cluster_scoped_tenant_makes_its_namespace_and_takes_it_away() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "tenant-op").await;
    let tenants: Api<DynamicObject> =
        Api::all_with(client.clone(), &api_resource(&select(&registry, "tenant")));
    let operator = operator(&ns.name, "tenant").await;
    let name = format!("t{:06x}", rand::random::<u32>() & 0xff_ffff);
    let tenant: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1",
        "kind": "Tenant",
        "metadata": {"name": name},
        "spec": {"owner": "ACME: ops\n---\nkind: Secret"},
    }))
    .unwrap();
    tenants
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let applied = wait_reason(&tenants, &name, "Applied").await;
    assert_eq!(applied.data["status"]["inventory"]["count"], 3);
    let namespace = format!("tenant-{name}");
    let created = Api::<Namespace>::all(client.clone())
        .get(&namespace)
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.unwrap()["platform.example.com/tenant"],
        name
    );
    let owner = Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .get("owner")
        .await
        .unwrap();
    let data = owner.data.unwrap();
    assert_eq!(data["owner"], "ACME: ops\n---\nkind: Secret");
    assert_eq!(data["pods"], "10", "the schema's default");
    assert!(
        Api::<LimitRange>::namespaced(client.clone(), &namespace)
            .get_opt("defaults")
            .await
            .unwrap()
            .is_some()
    );

    tenants
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, format!("the tenant {name} gone"), || async {
        tenants.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    let gone = Api::<Namespace>::all(client.clone())
        .get_opt(&namespace)
        .await
        .unwrap();
    assert!(
        gone.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the tenant's namespace is left"
    );
    operator.stop().await;
}

/// A kind folder written for one test, in a directory of its own.
/// The kind `name` of the kind folders under `folder`, its CRD installed.
async fn folder_kind(client: &Client, folder: &tempfile::TempDir, name: &str) -> Kind {
    let dir = kustomize_operator::kind::KustomizeDir::load(folder.path()).unwrap();
    let kind = select(&Registry::load(&dir).unwrap(), name);
    install_crd(client, &kind).await;
    kind
}

/// An operator for `ns` serving the kind `name` of `folder`, with `extra`
/// flags.
async fn folder_operator(
    ns: &str,
    folder: &tempfile::TempDir,
    name: &str,
    extra: &[&str],
) -> kustomize_operator::Operator {
    let path = folder.path().display().to_string();
    let mut flags = vec!["--kustomize-dir", &path, "--kinds", name];
    flags.extend(extra);
    common::start_operator(ns, &flags).await
}

fn kind_folder(name: &str, kind_file: &str, base: &[(&str, &str)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(name);
    std::fs::create_dir_all(dir.join("base")).unwrap();
    std::fs::write(dir.join("kind.yaml"), kind_file).unwrap();
    for (file, text) in base {
        std::fs::write(dir.join("base").join(file), text).unwrap();
    }
    root
}

/// Writes `text` as the resource template `file` of the kind `kind` in `folder`.
fn resource_template(folder: &tempfile::TempDir, kind: &str, file: &str, text: &str) {
    let resources = folder.path().join(kind).join("resources");
    std::fs::create_dir_all(&resources).unwrap();
    std::fs::write(resources.join(file), text).unwrap();
}

const OPTIONAL: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: optional}
spec:
  group: optional.example.com
  version: v1
  names: {kind: Optional, plural: optionals}
  schema:
    type: object
    properties:
      enabled: {type: boolean, default: false}
  overlay:
    resources:
      - template: settings.yaml
";

/// A resource whose render is empty (as kro's `resources: []` or an
/// `includeWhen` that is false) is applied and Ready with nothing, and what
/// it owned before is pruned.
#[tokio::test]
async fn an_empty_render_is_ready_and_prunes_what_was_owned() {
    let client = common::cluster().await;
    let folder = kind_folder(
        "optional",
        OPTIONAL,
        &[("kustomization.yaml", "resources: []\n")],
    );
    std::fs::create_dir_all(folder.path().join("optional/resources")).unwrap();
    std::fs::write(
        folder.path().join("optional/resources/settings.yaml"),
        "{% if spec.enabled %}\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {on: \"yes\"}\n{% endif %}\n",
    )
    .unwrap();
    let optional = folder_kind(&client, &folder, "optional").await;
    let ns = common::TestNamespace::new(&client, "optional").await;
    let operator = folder_operator(&ns.name, &folder, "optional", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&optional));
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let resource = |enabled: bool| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "optional.example.com/v1", "kind": "Optional",
            "metadata": {"name": "x"}, "spec": {"enabled": enabled},
        }))
        .unwrap()
    };

    // Empty from the start: Ready, nothing owned.
    api.create(&PostParams::default(), &resource(false))
        .await
        .unwrap();
    let empty = wait_reason(&api, "x", "Applied").await;
    assert_eq!(condition(&empty, "Ready").unwrap()["status"], "True");
    assert_eq!(empty.data["status"]["inventory"]["count"], 0);
    assert!(config_maps.get_opt("settings").await.unwrap().is_none());

    // Enabled: the ConfigMap is applied.
    let enable = json!({"spec": {"enabled": true}});
    api.patch("x", &PatchParams::default(), &Patch::Merge(&enable))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the ConfigMap settings applied", || async {
        config_maps.get_opt("settings").await.unwrap().is_some()
    })
    .await;

    // Disabled again: the render is empty, the ConfigMap is pruned and the
    // resource is Ready at its new generation with an empty inventory.
    let disable = json!({"spec": {"enabled": false}});
    api.patch("x", &PatchParams::default(), &Patch::Merge(&disable))
        .await
        .unwrap();
    common::wait_for(
        TIMEOUT,
        "the ConfigMap settings pruned, x Applied at generation 3",
        || async {
            let x = api.get("x").await.unwrap();
            let ready = condition(&x, "Ready").cloned().unwrap_or_default();
            let pruned = config_maps.get_opt("settings").await.unwrap().is_none();
            let done = pruned
                && ready["reason"] == "Applied"
                && ready["status"] == "True"
                && x.data["status"]["observedGeneration"] == 3
                && x.data["status"]["inventory"]["count"] == 0;
            if done {
                Ok(())
            } else {
                Err((pruned, x.metadata.generation, x.data["status"].clone()))
            }
        },
    )
    .await;
    api.delete("x", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Optional x gone", || async {
        api.get_opt("x").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

const JOINED: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: joined}
spec:
  group: joined.example.com
  version: v1
  names: {kind: Joined, plural: joineds}
  schema: {type: object}
  overlay:
    resources:
      - template: settings.yaml
";

/// A template writing a value next to text (`{{ metadata.name }}-v2`)
/// renders a quoted string followed by text, which kustomize does not
/// parse: the failure names the rendered file and line, with the fix.
#[tokio::test]
async fn a_value_written_next_to_text_fails_naming_the_line_and_the_fix() {
    let client = common::cluster().await;
    let folder = kind_folder(
        "joined",
        JOINED,
        &[("kustomization.yaml", "resources: []\n")],
    );
    resource_template(
        &folder,
        "joined",
        "settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ metadata.name }}-v2\ndata: {on: \"yes\"}\n",
    );
    let joined = folder_kind(&client, &folder, "joined").await;
    let ns = common::TestNamespace::new(&client, "joined").await;
    let operator = folder_operator(&ns.name, &folder, "joined", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&joined));
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "joined.example.com/v1", "kind": "Joined",
        "metadata": {"name": "shop"}, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    let failed = wait_reason_saying(
        &api,
        "shop",
        "RenderFailed",
        "templated/00-settings.yaml line 4: a value written next to text is a quoted string of its own",
    )
    .await;
    let message = condition(&failed, "Ready").unwrap()["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("{{ metadata.name ~ \"-v2\" }}"),
        "{message}"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    assert!(
        config_maps
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|c| !c
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .starts_with("shop"))
    );
    operator.stop().await;
}

const WIDGETS_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.inert.example.com}
spec:
  group: inert.example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
";

const OUTER: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: outer}
spec:
  group: outer.example.com
  version: v1
  names: {kind: Outer, plural: outers}
  schema: {type: object}
";

/// A child that is a custom resource (here of a kind no controller
/// serves) counts as ready only when it says so, not because it has no
/// status yet: the parent waits, naming it, until its Ready condition is
/// true.
#[tokio::test]
async fn a_custom_resource_child_is_ready_only_when_it_says_so() {
    let client = common::cluster().await;
    let (ok, _, err) = common::kubectl_stdin(&["apply", "--server-side", "-f", "-"], WIDGETS_CRD);
    assert!(ok, "{err}");
    common::wait_established(&["widgets.inert.example.com"]).unwrap();
    let folder = kind_folder(
        "outer",
        OUTER,
        &[
            ("kustomization.yaml", "resources: [widget.yaml]\n"),
            (
                "widget.yaml",
                "apiVersion: inert.example.com/v1\nkind: Widget\nmetadata: {name: part}\nspec: {size: 1}\n",
            ),
        ],
    );
    let outer = folder_kind(&client, &folder, "outer").await;
    let ns = common::TestNamespace::new(&client, "outer").await;
    let operator = folder_operator(&ns.name, &folder, "outer", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&outer));
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "outer.example.com/v1", "kind": "Outer",
        "metadata": {"name": "x"}, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    // Not the status of a slow first run ("applying generation 1").
    wait_reason_saying(&api, "x", "Progressing", "widget/part").await;

    let widgets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("inert.example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    let ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Done", "message": "",
        "lastTransitionTime": "2026-11-26T00:00:00Z",
    }]}});
    widgets
        .patch_status("part", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    let applied = wait_reason(&api, "x", "Applied").await;
    assert_eq!(condition(&applied, "Ready").unwrap()["status"], "True");
    api.delete("x", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Outer x gone", || async {
        api.get_opt("x").await.unwrap().is_none()
    })
    .await;
    assert!(widgets.get_opt("part").await.unwrap().is_none());
    operator.stop().await;
}

const STACK: &str = r#"apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: stack}
spec:
  group: stack.example.com
  version: v1
  names: {kind: Stack, plural: stacks}
  schema:
    type: object
    properties:
      replicas: {type: integer, default: 2}
  overlay:
    namePrefix: "{{ metadata.name }}-"
  children:
    web: {kind: Deployment, name: "{{ metadata.name }}-web"}
    deployments:
      kind: Deployment
      readyWhen: has(self.status.readyReplicas) && self.status.readyReplicas == self.spec.replicas
  status:
    - {field: available, type: integer, expression: "has(web.status.availableReplicas) ? web.status.availableReplicas : 0"}
    - {field: webConditions, type: array, expression: web.status.conditions}
    - {field: readyDeployments, type: integer, expression: "deployments.filter(d, has(d.status.readyReplicas) && d.status.readyReplicas == d.spec.replicas).size()"}
    - {field: summary, type: string, expression: "metadata.name + ' runs ' + string(size(deployments)) + ' deployments'"}
  readiness:
    - expression: has(web.status.availableReplicas) && web.status.availableReplicas >= spec.replicas
"#;

fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: busybox}}]}}\n"
    )
}

/// kro's status and readiness, in CEL over named children: a value with
/// a default, a list copied whole, an aggregate over every Deployment,
/// string arithmetic; Ready when the expression holds and every
/// Deployment's `readyWhen` does.
#[tokio::test]
async fn status_and_readiness_are_cel_over_the_children() {
    let client = common::cluster().await;
    let (web, worker) = (deployment("web", 2), deployment("worker", 1));
    let folder = kind_folder(
        "stack",
        STACK,
        &[
            ("kustomization.yaml", "resources: [web.yaml, worker.yaml]\n"),
            ("web.yaml", &web),
            ("worker.yaml", &worker),
        ],
    );
    let stack = folder_kind(&client, &folder, "stack").await;
    let ns = common::TestNamespace::new(&client, "stack").await;
    let operator = folder_operator(&ns.name, &folder, "stack", &["--health-timeout", "2m"]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&stack));
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "stack.example.com/v1", "kind": "Stack",
        "metadata": {"name": "s"}, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    let ready = wait_reason(&api, "s", "Applied").await;
    let status = &ready.data["status"];
    assert_eq!(status["available"], 2, "{status:#}");
    assert_eq!(status["readyDeployments"], 2, "{status:#}");
    assert_eq!(status["summary"], "s runs 2 deployments", "{status:#}");
    let conditions = status["webConditions"].as_array().expect("a list");
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True"),
        "{conditions:#?}"
    );
    api.delete("s", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Stack s gone", || async {
        api.get_opt("s").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

/// A CEL expression that does not compile, or reads a name the kind file
/// does not give, is refused when the kind is loaded, naming the field.
#[test]
fn a_bad_expression_is_refused_naming_the_kind_file_and_the_field() {
    for (bad, field, words) in [
        ("web.status.(", "spec.status[0].expression", "not CEL"),
        (
            "db.status.ready",
            "spec.status[0].expression",
            "reads \"db\"",
        ),
    ] {
        let kind_file = STACK.replacen(
            "\"has(web.status.availableReplicas) ? web.status.availableReplicas : 0\"",
            &format!("{bad:?}"),
            1,
        );
        assert_ne!(kind_file, STACK);
        let folder = kind_folder(
            "stack",
            &kind_file,
            &[("kustomization.yaml", "resources: []\n")],
        );
        let dir = kustomize_operator::kind::KustomizeDir::load(folder.path()).unwrap();
        let Err(error) = Registry::load(&dir) else {
            panic!("{bad} was not refused")
        };
        let error = error.to_string();
        assert!(
            error.contains("kind.yaml") && error.contains(field) && error.contains(words),
            "{error}"
        );
    }
}

const ORDERED: &str = r#"apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: ordered}
spec:
  group: ordered.example.com
  version: v1
  names: {kind: Ordered, plural: ordereds}
  scope: Cluster
  schema: {type: object}
  overlay:
    resources:
      - template: namespace.yaml
      - template: gadget.yaml
"#;

/// The CRD of Gadgets in the API group `group`.
fn gadgets_crd(group: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: gadgets.{group}}}
spec:
  group: {group}
  names: {{kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {{status: {{}}}}
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"
    )
}

/// A build holding a CRD, a Namespace and a custom resource of that CRD
/// in that Namespace converges in one reconcile: the CRD (established)
/// and the Namespace are applied first. The resource then waits for the
/// custom resource to say it is ready.
#[tokio::test]
async fn namespaces_and_crds_are_applied_before_what_needs_them() {
    let client = common::cluster().await;
    // A group of its own: the CRD is cluster-wide, and an earlier run's
    // resource may still own the last one.
    let group = format!("g{:06x}.example.com", rand::random::<u32>() & 0xff_ffff);
    let folder = kind_folder(
        "ordered",
        ORDERED,
        &[
            ("kustomization.yaml", "resources: [crd.yaml]\n"),
            ("crd.yaml", &gadgets_crd(&group)),
        ],
    );
    resource_template(
        &folder,
        "ordered",
        "namespace.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {{ \"order-\" ~ metadata.name }}\n",
    );
    resource_template(
        &folder,
        "ordered",
        "gadget.yaml",
        &format!(
            "apiVersion: {group}/v1\nkind: Gadget\nmetadata:\n  name: g\n  namespace: {{{{ \"order-\" ~ metadata.name }}}}\nspec: {{size: 1}}\n"
        ),
    );
    let ordered = folder_kind(&client, &folder, "ordered").await;
    let ns = common::TestNamespace::new(&client, "ordered").await;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource(&ordered));
    // Cluster-scoped: an earlier run's resources (a run that failed) would
    // be served by this operator too, with this run's kind folder.
    for stale in api.list(&Default::default()).await.unwrap() {
        let unhold = json!({"metadata": {"finalizers": null}});
        let stale = stale.metadata.name.unwrap();
        api.patch(&stale, &PatchParams::default(), &Patch::Merge(&unhold))
            .await
            .unwrap();
        let _ = api.delete(&stale, &DeleteParams::default()).await;
    }
    let operator = folder_operator(&ns.name, &folder, "ordered", &[]).await;
    let name = format!("o{:06x}", rand::random::<u32>() & 0xff_ffff);
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ordered.example.com/v1", "kind": "Ordered",
        "metadata": {"name": name}, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    // Not the status of a slow first run ("applying generation 1").
    wait_reason_saying(&api, &name, "Progressing", "gadget/g").await;
    let gadgets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &format!("order-{name}"),
        &ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(&group, "v1", "Gadget"),
            "gadgets",
        ),
    );
    let ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Done", "message": "",
        "lastTransitionTime": "2026-11-26T00:00:00Z",
    }]}});
    gadgets
        .patch_status("g", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    let applied = wait_reason(&api, &name, "Applied").await;
    assert_eq!(applied.data["status"]["inventory"]["count"], 3);
    // One apply did it: no attempt failed on the way.
    let (_, events, _) = common::kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ]);
    assert!(events.contains("Applied: "), "{events}");
    assert!(
        !events.contains("Failed: ") && !events.contains("ApiError: "),
        "{events}"
    );
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Ordered resource gone", || async {
        api.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

const LEAKY: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: leaky}
spec:
  group: leaky.example.com
  version: v1
  names: {kind: Leaky, plural: leakies}
  schema: {type: object}
";

#[tokio::test]
async fn a_namespaced_kind_cannot_create_objects_outside_its_namespace() {
    let client = common::cluster().await;
    let folder = kind_folder(
        "leaky",
        LEAKY,
        &[
            ("kustomization.yaml", "resources: [role.yaml]\n"),
            (
                "role.yaml",
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: leaked\nrules: []\n",
            ),
        ],
    );
    let leaky = folder_kind(&client, &folder, "leaky").await;
    let ns = common::TestNamespace::new(&client, "leaky").await;
    let operator = folder_operator(&ns.name, &folder, "leaky", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&leaky));
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "leaky.example.com/v1", "kind": "Leaky",
        "metadata": {"name": "x"}, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    let refused = wait_reason(&api, "x", "RenderFailed").await;
    let message = condition(&refused, "Ready").unwrap()["message"].to_string();
    assert!(
        message.contains("outside the resource's namespace") && message.contains("leaked"),
        "{message}"
    );
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    assert!(roles.get_opt("leaked").await.unwrap().is_none());
    api.delete("x", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Leaky x gone", || async {
        api.get_opt("x").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

const REACHING: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: reaching}
spec:
  group: reaching.example.com
  version: v1
  names: {kind: Reaching, plural: reachings}
  schema:
    type: object
    properties:
      leak: {type: boolean}
  overlay:
    resources:
      - template: objects.yaml
  reach:
    - {apiVersion: v1, kind: Namespace}
    - {apiVersion: v1, kind: ConfigMap, namespaces: [\"tenant-*\"]}
";

const REACHING_OBJECTS: &str = "apiVersion: v1
kind: Namespace
metadata: {name: {{ \"tenant-\" ~ metadata.name }}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: {{ \"tenant-\" ~ metadata.name }}}
data: {owner: {{ metadata.namespace }}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: {{ metadata.name ~ \"-home\" }}}
{% if spec.leak %}---
apiVersion: v1
kind: ConfigMap
metadata: {name: {{ metadata.name }}, namespace: kube-public}
{% endif %}";

/// A namespaced kind whose kind file declares `reach` makes a Namespace and
/// an object in it (marked, pruned and deleted like the rest), and nothing
/// beyond what it declares.
#[tokio::test]
async fn a_namespaced_kind_reaches_only_what_it_declares() {
    let client = common::cluster().await;
    let folder = kind_folder(
        "reaching",
        REACHING,
        &[("kustomization.yaml", "resources: []\n")],
    );
    resource_template(&folder, "reaching", "objects.yaml", REACHING_OBJECTS);
    let reaching = folder_kind(&client, &folder, "reaching").await;
    let ns = common::TestNamespace::new(&client, "reaching").await;
    let operator = folder_operator(&ns.name, &folder, "reaching", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&reaching));
    let name = format!("r{:06x}", rand::random::<u32>() & 0xff_ffff);
    let tenant = format!("tenant-{name}");
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "reaching.example.com/v1", "kind": "Reaching",
        "metadata": {"name": name}, "spec": {"leak": false},
    }))
    .unwrap();
    api.create(&PostParams::default(), &resource).await.unwrap();
    let applied = wait_reason(&api, &name, "Applied").await;
    assert_eq!(applied.data["status"]["inventory"]["count"], 3);
    let settings: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let there = settings.get("settings").await.unwrap();
    assert_eq!(there.data.unwrap()["owner"], ns.name);
    let marker = there.metadata.annotations.unwrap_or_default();
    assert!(
        marker
            .values()
            .any(|v| v.ends_with(&format!("/{}/{name}", ns.name))),
        "the object in another namespace carries its owner's marker: {marker:?}"
    );
    let home: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    assert!(
        home.get_opt(&format!("{name}-home"))
            .await
            .unwrap()
            .is_some()
    );

    // A ConfigMap in a namespace the kind does not declare: refused whole.
    let leak = json!({"spec": {"leak": true}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&leak))
        .await
        .unwrap();
    let refused = wait_reason(&api, &name, "RenderFailed").await;
    let message = condition(&refused, "Ready").unwrap()["message"].to_string();
    assert!(
        message.contains("reach") && message.contains(&format!("configmap/{name} in kube-public")),
        "{message}"
    );
    let public: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    assert!(public.get_opt(&name).await.unwrap().is_none());

    api.delete(&name, &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Reaching resource gone", || async {
        api.get_opt(&name).await.unwrap().is_none()
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let gone = namespaces.get_opt(&tenant).await.unwrap();
    assert!(
        gone.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the tenant's namespace is deleted with its resource"
    );
    operator.stop().await;
}

const THEMED: &str = "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: themed}
spec:
  group: themed.example.com
  version: v1
  names: {kind: Themed, plural: themeds}
  schema:
    type: object
    properties:
      palette: {type: string}
  references:
    colors: {apiVersion: v1, kind: ConfigMap, name: \"{{ spec.palette }}\"}
    swatches: {apiVersion: v1, kind: ConfigMap, selector: {swatch: \"{{ spec.palette }}\"}}
  overlay:
    resources:
      - template: theme.yaml
  status:
    - {field: color, type: string, expression: colors.data.color}
    - {field: swatches, type: integer, expression: size(swatches)}
";

const THEME: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: {{ metadata.name ~ \"-theme\" }}}
data: {color: {{ colors.data.color | default(value=\"none\") }}}
";

/// `kubectl apply -f -` of `text` as the admin.
fn apply_text(text: &str) {
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], text);
    assert!(ok, "kubectl apply: {err}");
}

/// The ConfigMap `name` of `ns` with `color`, as the admin.
fn palette(ns: &str, name: &str, color: &str) {
    apply_text(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\ndata: {{color: {color}}}\n"
    ));
}

/// A kind's references are read with the rights of the account its writes
/// use (a refusal names the reference and the right), their data reaches
/// templates and CEL, a missing one waits, and a change to one re-renders
/// the resources that read it.
#[tokio::test]
async fn references_are_read_as_the_writer_and_a_change_re_renders() {
    let client = common::cluster().await;
    let folder = kind_folder(
        "themed",
        THEMED,
        &[("kustomization.yaml", "resources: []\n")],
    );
    resource_template(&folder, "themed", "theme.yaml", THEME);
    let themed = folder_kind(&client, &folder, "themed").await;
    let ns = common::TestNamespace::new(&client, "themed").await;
    apply_text(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: painter, namespace: {}}}\n",
        ns.name
    ));
    let operator = folder_operator(
        &ns.name,
        &folder,
        "themed",
        &["--default-service-account", "painter"],
    )
    .await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&themed));
    let themed_resource = |name: &str, palette: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "themed.example.com/v1", "kind": "Themed",
            "metadata": {"name": name}, "spec": {"palette": palette},
        }))
        .unwrap()
    };
    palette(&ns.name, "sea", "blue");
    api.create(&PostParams::default(), &themed_resource("boat", "sea"))
        .await
        .unwrap();

    // The account may not read ConfigMaps: refused, naming the reference.
    let refused = wait_reason(&api, "boat", "Forbidden").await;
    let message = condition(&refused, "Ready").unwrap()["message"].to_string();
    assert!(
        message.contains("reference colors")
            && message.contains(&format!("system:serviceaccount:{}:painter", ns.name))
            && message.contains("configmap/sea"),
        "{message}"
    );
    apply_text(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: painter, namespace: {ns}}}\nrules: [{{apiGroups: [\"\"], resources: [configmaps], verbs: [get, list, watch, create, patch, delete]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: painter, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: painter}}\nsubjects: [{{kind: ServiceAccount, name: painter, namespace: {ns}}}]\n",
        ns = ns.name
    ));
    // A change to the reference reconciles its reader at once.
    palette(&ns.name, "sea", "teal");
    // A retry of the refused reconcile may apply blue first, once granted.
    common::wait_until(TIMEOUT, "boat applied with teal", || async {
        api.get("boat").await.unwrap().data["status"]["color"] == "teal"
    })
    .await;
    let applied = wait_reason(&api, "boat", "Applied").await;
    assert_eq!(applied.data["status"]["color"], "teal");
    assert_eq!(applied.data["status"]["swatches"], 0);
    // A selector's objects, read page by page (more than one page).
    let swatches: String = (0..12)
        .map(|i| {
            format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: swatch-{i}, namespace: {}, labels: {{swatch: sea}}}}\n",
                ns.name
            )
        })
        .collect();
    apply_text(&swatches);
    common::wait_until(TIMEOUT, "the 12 swatches counted", || async {
        api.get("boat").await.unwrap().data["status"]["swatches"] == 12
    })
    .await;
    assert_eq!(
        common::greeting::config_map_field(&ns.name, "boat-theme", "color"),
        "teal"
    );
    palette(&ns.name, "sea", "navy");
    common::wait_until(TIMEOUT, "the theme re-rendered navy", || async {
        common::greeting::config_map_field(&ns.name, "boat-theme", "color") == "navy"
    })
    .await;
    common::wait_until(TIMEOUT, "the status color navy", || async {
        api.get("boat").await.unwrap().data["status"]["color"] == "navy"
    })
    .await;

    // A reference not there yet: the resource waits, and goes on when it comes.
    api.create(&PostParams::default(), &themed_resource("raft", "lake"))
        .await
        .unwrap();
    let waiting = wait_reason(&api, "raft", "ReferenceNotFound").await;
    let message = condition(&waiting, "Ready").unwrap()["message"].to_string();
    assert!(message.contains("configmap/lake"), "{message}");
    palette(&ns.name, "lake", "green");
    wait_reason(&api, "raft", "Applied").await;
    assert_eq!(
        common::greeting::config_map_field(&ns.name, "raft-theme", "color"),
        "green"
    );
    for name in ["boat", "raft"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    common::wait_until(TIMEOUT, "the Themed resources gone", || async {
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn run_refuses_to_start_naming_the_file_and_the_field() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "refuse").await;
    let start = |dir: String| {
        let ns = ns.name.clone();
        async move {
            kustomize_operator::Operator::start(&common::run_args(
                &ns,
                &["--kustomize-dir", &dir, "--kinds", "leaky"],
            ))
            .await
            .err()
            .map(|e| e.to_string())
            .expect("the operator started")
        }
    };
    let unknown_field = LEAKY.replace("  schema:", "  shema: {}\n  schema:");
    let folder = kind_folder(
        "leaky",
        &unknown_field,
        &[("kustomization.yaml", "resources: []\n")],
    );
    let err = start(folder.path().display().to_string()).await;
    assert!(
        err.contains("leaky/kind.yaml") && err.contains("shema"),
        "{err}"
    );

    let broken_template =
        format!("{LEAKY}  overlay:\n    labels:\n      - pairs: {{a: \"{{{{ metadata.name \"}}\n");
    let folder = kind_folder(
        "leaky",
        &broken_template,
        &[("kustomization.yaml", "resources: []\n")],
    );
    let err = start(folder.path().display().to_string()).await;
    assert!(
        err.contains("leaky/kind.yaml") && err.contains("spec.overlay.labels[0].pairs.a"),
        "{err}"
    );

    let folder = kind_folder(
        "leaky",
        LEAKY,
        &[("kustomization.yaml", "resources: [missing.yaml]\n")],
    );
    let err = start(folder.path().display().to_string()).await;
    assert!(
        err.contains("leaky/base/kustomization.yaml: resources[0]")
            && err.contains("\"missing.yaml\" is not a file or folder of the kind's base"),
        "{err}"
    );

    let folder = kind_folder(
        "leaky",
        LEAKY,
        &[
            ("kustomization.yaml", "resources: [broken.yaml]\n"),
            ("broken.yaml", "kind: [\n"),
        ],
    );
    let err = start(folder.path().display().to_string()).await;
    assert!(
        err.contains("leaky/kind.yaml")
            && err.contains("base does not build")
            && err.contains("broken.yaml"),
        "{err}"
    );

    let err =
        kustomize_operator::Operator::start(&common::run_args(&ns.name, &["--kinds", "sampel"]))
            .await
            .err()
            .map(|e| e.to_string())
            .expect("started with an unknown kind");
    assert!(
        err.contains("unknown kind \"sampel\"") && err.contains("sample"),
        "{err}"
    );
}

/// Every file under `dir`, with its content.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            found.push((path, bytes));
        }
    }
    found
}

/// `--keep-overlays` keeps no Secret data, however the Secret got into the
/// overlay: here a declared kind's resource template renders it, and its
/// kind file declares nothing secret. A WebApp's overlay beside it is kept.
#[tokio::test]
async fn keep_overlays_keeps_no_secret_from_a_resource_template() {
    let client = common::cluster().await;
    let registry = fixture_kinds(&client).await;
    let ns = common::TestNamespace::new(&client, "dk-keep").await;
    let keep = tempfile::tempdir().unwrap();
    let fixtures = common::fixture_kinds().display().to_string();
    let operator = common::start_operator(
        &ns.name,
        &[
            "--kustomize-dir",
            &fixtures,
            "--kinds",
            "webapp,credential",
            "--keep-overlays",
            &keep.path().display().to_string(),
            "--health-timeout",
            "2m",
        ],
    )
    .await;
    let apps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "webapp")),
    );
    let credentials: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &api_resource(&select(&registry, "credential")),
    );
    let marker = format!("kept-overlay-marker-{}", ns.name);
    let credential: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.example.com/v1",
        "kind": "Credential",
        "metadata": {"name": "cred"},
        "spec": {"token": marker},
    }))
    .unwrap();
    credentials
        .create(&PostParams::default(), &credential)
        .await
        .unwrap();
    apps.create(
        &PostParams::default(),
        &webapp("plain", json!({"replicas": 1})),
    )
    .await
    .unwrap();
    wait_reason(&credentials, "cred", "Applied").await;
    wait_reason(&apps, "plain", "Applied").await;
    // The Secret was applied, with the token.
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns.name)
        .get("cred-token")
        .await
        .unwrap();
    assert_eq!(
        secret.data.unwrap()["token"].0,
        marker.as_bytes(),
        "the Secret holds the token"
    );
    // The WebApp's overlay is kept; the Credential's is not, and no kept
    // file holds the token, plain or base64.
    let kept = |kind: &str, name: &str| keep.path().join(kind).join(&ns.name).join(name);
    assert!(
        kept("webapp", "plain").join("kustomization.yaml").is_file(),
        "the WebApp's overlay is kept: {:?}",
        files_under(keep.path())
            .iter()
            .map(|(p, _)| p)
            .collect::<Vec<_>>()
    );
    assert!(!kept("credential", "cred").exists());
    let encoded = match serde_json::to_value(k8s_openapi::ByteString(marker.clone().into_bytes())) {
        Ok(Value::String(encoded)) => encoded,
        other => panic!("ByteString serializes as base64: {other:?}"),
    };
    for (path, bytes) in files_under(keep.path()) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(&marker) && !text.contains(&encoded),
            "{} holds the Secret's token",
            path.display()
        );
    }
    operator.stop().await;
}

/// A kind whose readiness rule and whose child's `readyWhen` each add a
/// margin from the spec (0 by default) to what they wait for.
const HELD: &str = r#"apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {name: held}
spec:
  group: held.example.com
  version: v1
  names: {kind: Held, plural: helds}
  schema:
    type: object
    properties:
      readinessMargin: {type: integer, default: 0}
      readyWhenMargin: {type: integer, default: 0}
  overlay:
    namePrefix: "{{ metadata.name }}-"
  children:
    web:
      kind: Deployment
      name: "{{ metadata.name }}-web"
      readyWhen: has(self.status.readyReplicas) && self.status.readyReplicas >= self.spec.replicas + schema.spec.readyWhenMargin
  status:
    - {field: available, type: integer, expression: "has(web.status.availableReplicas) ? web.status.availableReplicas : 0"}
    - {field: readyReplicas, type: integer, expression: "has(web.status.readyReplicas) ? web.status.readyReplicas : 0"}
  readiness:
    - expression: has(web.status.availableReplicas) && web.status.availableReplicas >= 2 + spec.readinessMargin
"#;

/// A readiness rule or a `readyWhen` that is false for the live objects
/// holds `Ready` back, naming itself, though everything else is ready: the
/// status written for the generation shows the Deployment's two replicas
/// available and ready (on kwok they always become so, which is why only
/// a false expression can hold a resource back here), and the same kind
/// with both margins 0 is Ready.
#[tokio::test]
async fn a_false_readiness_rule_or_ready_when_holds_ready_back() {
    let client = common::cluster().await;
    let web = deployment("web", 2);
    let folder = kind_folder(
        "held",
        HELD,
        &[
            ("kustomization.yaml", "resources: [web.yaml]\n"),
            ("web.yaml", &web),
        ],
    );
    let held = folder_kind(&client, &folder, "held").await;
    let ns = common::TestNamespace::new(&client, "held").await;
    let operator = folder_operator(&ns.name, &folder, "held", &["--health-timeout", "2m"]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&held));
    let cases = [
        ("ready", json!({})),
        ("readiness", json!({"readinessMargin": 1})),
        ("ready-when", json!({"readyWhenMargin": 1})),
    ];
    for (name, spec) in &cases {
        let resource: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "held.example.com/v1", "kind": "Held",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        api.create(&PostParams::default(), &resource).await.unwrap();
    }
    wait_reason(&api, "ready", "Applied").await;
    for (name, waits_for) in [
        (
            "readiness",
            "readiness[0]: waiting for has(web.status.availableReplicas) && web.status.availableReplicas >= 2 + spec.readinessMargin",
        ),
        (
            "ready-when",
            "web.readyWhen (ready-when-web): waiting for has(self.status.readyReplicas)",
        ),
    ] {
        let what = format!("{name}: its status written with 2 replicas available and ready");
        let held = common::wait_for(TIMEOUT, what, || async {
            let object = api.get(name).await.unwrap();
            let status = &object.data["status"];
            let current = status["observedGeneration"].as_i64() == object.metadata.generation;
            if current && status["available"] == 2 && status["readyReplicas"] == 2 {
                Ok(object)
            } else {
                Err(status.clone())
            }
        })
        .await;
        let ready = condition(&held, "Ready").expect("a Ready condition");
        assert_ne!(ready["status"], "True", "{name}: {ready:#}");
        let message = ready["message"].as_str().unwrap_or_default();
        assert!(message.contains(waits_for), "{name}: {ready:#}");
    }
    for (name, _) in &cases {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    common::wait_until(TIMEOUT, "the Helds gone", || async {
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    operator.stop().await;
}

/// The CRD of Things in the API group `group`, with `scope`.
fn things_crd(group: &str, scope: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: things.{group}}}
spec:
  group: {group}
  names: {{kind: Thing, plural: things, singular: thing, listKind: ThingList}}
  scope: {scope}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"
    )
}

/// Replaces the Thing CRD of `group` with one of `scope`: deleted, gone,
/// created, established.
fn things_with_scope(group: &str, scope: &str) {
    let crd = format!("things.{group}");
    common::kubectl(&["delete", "crd", &crd, "--ignore-not-found"]);
    let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &things_crd(group, scope));
    assert!(ok, "creating the {scope} CRD {crd}: {err}");
    common::wait_established(&[&crd]).unwrap();
}

/// A custom resource kind the operator applies (not one it serves),
/// deleted and created again with the other scope: the next apply finds
/// it where it is served now. The operator's discovery and kubectl's
/// discovery cache still say the old scope; the API server answers `404
/// page not found` at the old path, and both are asked again.
#[tokio::test]
async fn a_kind_it_applies_created_again_with_another_scope_is_applied_again() {
    let client = common::cluster().await;
    let group = format!(
        "t{:06x}.scope.example.com",
        rand::random::<u32>() & 0xff_ffff
    );
    let holder = format!(
        "apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata: {{name: holder}}
spec:
  group: holder.example.com
  version: v1
  names: {{kind: Holder, plural: holders}}
  schema: {{type: object}}
  reach:
    - {{apiVersion: {group}/v1, kind: Thing}}
  overlay:
    resources:
      - template: thing.yaml
"
    );
    let folder = kind_folder(
        "holder",
        &holder,
        &[("kustomization.yaml", "resources: []\n")],
    );
    resource_template(
        &folder,
        "holder",
        "thing.yaml",
        &format!(
            "apiVersion: {group}/v1\nkind: Thing\nmetadata:\n  name: {{{{ metadata.name ~ \"-thing\" }}}}\nspec: {{size: 1}}\n"
        ),
    );
    let crd = format!("things.{group}");
    let _cleanup = CrdOnDrop(crd.clone());
    let (ok, _, err) =
        common::kubectl_stdin(&["create", "-f", "-"], &things_crd(&group, "Cluster"));
    assert!(ok, "{err}");
    common::wait_established(&[&crd]).unwrap();
    let holders = folder_kind(&client, &folder, "holder").await;
    let ns = common::TestNamespace::new(&client, "rescoped").await;
    let operator = folder_operator(&ns.name, &folder, "holder", &[]).await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &api_resource(&holders));
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "holder.example.com/v1", "kind": "Holder",
        "metadata": {"name": "x"}, "spec": {},
    }))
    .unwrap();
    let thing_at = |namespace: Option<&str>| {
        let mut args = vec!["get", crd.as_str(), "x-thing", "-o", "name"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        common::kubectl(&args).0
    };

    api.create(&PostParams::default(), &resource).await.unwrap();
    wait_reason_saying(&api, "x", "Progressing", "x-thing").await;
    assert!(thing_at(None), "the cluster-scoped Thing applied");
    api.delete("x", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Holder x gone", || async {
        api.get_opt("x").await.unwrap().is_none()
    })
    .await;

    things_with_scope(&group, "Namespaced");
    api.create(&PostParams::default(), &resource).await.unwrap();
    // Not ApiError (`404 page not found`) nor ApplyFailed (`the server
    // could not find the requested resource`): applied, waiting for the
    // Thing to say it is ready.
    wait_reason_saying(&api, "x", "Progressing", "x-thing").await;
    assert!(thing_at(Some(&ns.name)), "the namespaced Thing applied");
    api.delete("x", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Holder x gone again", || async {
        api.get_opt("x").await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

/// Deletes the CRD it names when dropped (a failing test leaves none
/// behind).
struct CrdOnDrop(String);

impl Drop for CrdOnDrop {
    fn drop(&mut self) {
        common::kubectl(&[
            "delete",
            "crd",
            &self.0,
            "--wait=false",
            "--ignore-not-found",
        ]);
    }
}
