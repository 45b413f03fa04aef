//! kro's own examples, as kind folders (`tests/fixtures/kro`), on the
//! local control plane: the objects and the status kro would give.

use ko_test_support as common;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ResourceQuota, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kind::KustomizeDir;
use kustomize_operator::kinds::registry::{Kind, Registry};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

const TIMEOUT: Duration = Duration::from_secs(90);
const KINDS: [&str; 8] = [
    "webapp",
    "checksumrestart",
    "something",
    "job",
    "simpledeployment",
    "defaults",
    "tenantenv",
    "coredns",
];

fn folder() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kro")
}

/// The ported examples, their CRDs installed once per test binary.
async fn registry() -> Registry {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let dir = KustomizeDir::load(&folder()).expect("kro's examples load");
    let registry = Registry::load(&dir).expect("kro's examples are valid kinds");
    INSTALLED
        .get_or_init(|| async {
            let mut crds = Vec::new();
            for name in KINDS {
                let crd = select(&registry, name).crd();
                crds.push(crd.metadata.name.clone().unwrap());
                let crd = serde_json::to_string(&crd).unwrap();
                let (ok, _, err) =
                    common::kubectl_stdin(&["apply", "--server-side", "-f", "-"], &crd);
                assert!(ok, "installing the CRD of {name}: {err}");
            }
            let crds: Vec<&str> = crds.iter().map(String::as_str).collect();
            common::wait_established(&crds).unwrap();
        })
        .await;
    registry
}

fn select(registry: &Registry, name: &str) -> Kind {
    registry.select(&[name.to_string()]).unwrap().remove(0)
}

fn api(client: &Client, registry: &Registry, name: &str, ns: &str) -> Api<DynamicObject> {
    let kind = select(registry, name);
    let resource: &ApiResource = &kind.declared().expect("declared").resource;
    Api::namespaced_with(client.clone(), ns, resource)
}

async fn operator(ns: &str) -> kustomize_operator::Operator {
    let path = folder().display().to_string();
    common::start_operator(
        ns,
        &[
            "--kustomize-dir",
            &path,
            "--kinds",
            &KINDS.join(","),
            "--health-timeout",
            "2m",
        ],
    )
    .await
}

fn instance(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kro.run/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// Waits until `name`'s Ready condition is true at its current generation.
async fn ready(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    common::wait_until(TIMEOUT, format!("{name} Ready"), || async {
        let object = api.get(name).await.unwrap();
        let status = &object.data["status"];
        status["observedGeneration"].as_i64() == object.metadata.generation
            && status["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    })
    .await;
    api.get(name).await.unwrap()
}

/// A client, a test namespace named after `prefix`, and the API of the
/// kind `kind` there.
async fn scene(kind: &str, prefix: &str) -> (Client, common::TestNamespace, Api<DynamicObject>) {
    let client = common::cluster().await;
    let registry = registry().await;
    let ns = common::TestNamespace::new(&client, prefix).await;
    let apps = api(&client, &registry, kind, &ns.name);
    (client, ns, apps)
}

async fn delete(api: &Api<DynamicObject>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, format!("{name} gone"), || async {
        api.get_opt(name).await.unwrap().is_none()
    })
    .await;
}

#[tokio::test]
async fn kros_webapp_serves_its_status_and_its_optional_objects() {
    let (client, ns, apps) = scene("webapp", "kro-webapp").await;
    let operator = operator(&ns.name).await;
    let spec = json!({"name": "shop", "replicas": 2});
    apps.create(&PostParams::default(), &instance("WebApp", "shop", spec))
        .await
        .unwrap();
    let shop = ready(&apps, "shop").await;
    let status = &shop.data["status"];
    assert_eq!(status["availableReplicas"], 2, "{status:#}");
    let conditions = status["deploymentConditions"].as_array().expect("a list");
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True"),
        "{conditions:#?}"
    );
    assert!(
        status.get("url").is_none(),
        "no Ingress, no url: {status:#}"
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("shop")
        .await
        .unwrap();
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx"), "the default");
    let services = Api::<Service>::namespaced(client.clone(), &ns.name);
    assert!(services.get_opt("shop").await.unwrap().is_some());
    let ingresses = Api::<Ingress>::namespaced(client.clone(), &ns.name);
    assert!(ingresses.get_opt("shop").await.unwrap().is_none());

    // includeWhen, both ways: the Ingress comes, the Service goes.
    let change = json!({"spec": {"ingress": {"enabled": true}, "service": {"enabled": false}}});
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    let shop = ready(&apps, "shop").await;
    assert!(ingresses.get_opt("shop").await.unwrap().is_some());
    assert!(services.get_opt("shop").await.unwrap().is_none());
    assert!(
        shop.data["status"].get("url").is_none(),
        "no load balancer here: left out, as kro leaves it"
    );
    delete(&apps, "shop").await;
    operator.stop().await;
}

#[tokio::test]
async fn kros_checksum_restart_rolls_the_deployment_when_the_config_changes() {
    let (client, ns, apps) = scene("checksumrestart", "kro-checksum").await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name);
    let operator = operator(&ns.name).await;
    let checksum = |config: &Value| hex::encode(Sha256::digest(config.to_string()));
    let annotation = |d: Deployment| {
        d.spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()["checksum/config"]
            .clone()
    };
    let config = json!({"LOG_LEVEL": "info", "MODE": "a"});
    let spec = json!({"name": "app", "config": config});
    apps.create(
        &PostParams::default(),
        &instance("ConfigMapChecksumRestart", "app", spec),
    )
    .await
    .unwrap();
    let app = ready(&apps, "app").await;
    assert!(app.data["status"]["deploymentConditions"].is_array());
    let data = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get("app-config")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["MODE"], "a");
    let first = annotation(deployments.get("app").await.unwrap());
    assert_eq!(first, checksum(&config));

    let config = json!({"LOG_LEVEL": "info", "MODE": "b"});
    let change = json!({"spec": {"config": config}});
    apps.patch("app", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap();
    ready(&apps, "app").await;
    let second = annotation(deployments.get("app").await.unwrap());
    assert_eq!(second, checksum(&config));
    assert_ne!(second, first, "a new Pod template: the Deployment rolls");
    delete(&apps, "app").await;
    operator.stop().await;
}

/// kro's `random.seededString(length, seed)`, written here from kro's
/// `pkg/cel/library/random.go` apart from the operator's: character `i` is
/// the big-endian word at byte `4i mod 32` of the seed's SHA-256, mod 36.
fn kros_seeded_string(length: usize, seed: &str) -> String {
    const CHARS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let hash = Sha256::digest(seed);
    (0..length)
        .map(|i| {
            let at = (i * 4) % hash.len();
            let word = u32::from_be_bytes(hash[at..at + 4].try_into().unwrap());
            char::from(CHARS[(word % 36) as usize])
        })
        .collect()
}

/// FNV-1a 64 (its published definition), big-endian as Go's `Sum` gives it.
fn fnv64a(text: &str) -> [u8; 8] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash.to_be_bytes()
}

/// kro's cel-functions example, with kro's instance: the objects carry the
/// values kro writes, and the status is kro's, field for field (kro's two
/// fields, and the values kro's example computes with kro's functions,
/// each as kro computes it).
#[tokio::test]
async fn kros_cel_functions_give_kros_values() {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    // The independent renderings above agree with the Python ones
    // (functions/kro.rs's tests).
    assert_eq!(kros_seeded_string(10, "test-seed"), "5czheg3o5c");
    assert_eq!(b64(&fnv64a("app")), "50+nGQVqg4w=");

    let (client, ns, apps) = scene("something", "kro-functions").await;
    let operator = operator(&ns.name).await;
    let name = "my-instance-will-cel-functions";
    apps.create(
        &PostParams::default(),
        &instance("Something", name, json!({"name": "app"})),
    )
    .await
    .unwrap();
    let thing = ready(&apps, name).await;
    let uid = thing.metadata.uid.clone().unwrap();
    let seeded = kros_seeded_string(10, &uid);
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("app")
        .await
        .unwrap();
    let status = &thing.data["status"];
    let conditions: Vec<(String, String)> = deployment
        .status
        .clone()
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    let written: Vec<(String, String)> = status["deploymentConditions"]
        .as_array()
        .unwrap_or_else(|| panic!("{status:#}"))
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().into(),
                c["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(written, conditions, "{status:#}");
    for (field, want) in [
        ("availableReplicas", json!(10)),
        ("randomSeededString", json!(seeded)),
        ("jsonUnmarshalExample", json!("exampleJSONValue")),
        ("jsonMarshalExample", json!(r#"{"name":"app"}"#)),
        ("hashSha256", json!(b64(&Sha256::digest("app")))),
        ("hashFnv64a", json!(b64(&fnv64a("app")))),
    ] {
        assert_eq!(status[field], want, "{field} in {status:#}");
    }

    let env: Vec<(String, String)> = deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    let value = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} in {env:?}"))
    };
    assert_eq!(value("RANDOM_SEEDED_STRING"), seeded, "kro's value");
    assert_eq!(value("FULL_DNS_NAME"), "a.b.c.d.example.com");
    assert_eq!(value("DNS_FIRST_PART"), "a");
    assert_eq!(value("DNS_PARTIALS"), "a");
    assert_eq!(value("JSON_UNMARSHAL_EXAMPLE"), "exampleJSONValue");
    assert_eq!(value("LISTS_SUM"), "600");
    assert_eq!(value("QUANTITY_COMPARISON"), "small");
    assert_eq!(value("JSON_MARSHAL_EXAMPLE"), r#"{"name":"app"}"#);
    assert_eq!(value("HASH_SHA256"), hex::encode(Sha256::digest("app")));
    let labels = Api::<Service>::namespaced(client.clone(), &ns.name)
        .get("app")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels["partials"], "a.b.c");
    assert_eq!(labels["first_part"], "a");

    delete(&apps, name).await;
    operator.stop().await;
}

#[tokio::test]
async fn kros_job_example_is_ready_once_its_job_completes() {
    let (client, ns, apps) = scene("job", "kro-job").await;
    let operator = operator(&ns.name).await;
    let spec = json!({"replicas": 2, "delayInSeconds": 1});
    apps.create(
        &PostParams::default(),
        &instance("JobDeployment", "batch", spec),
    )
    .await
    .unwrap();
    ready(&apps, "batch").await;
    let job = Api::<Job>::namespaced(client.clone(), &ns.name)
        .get("batch-job")
        .await
        .unwrap();
    assert!(
        job.status.unwrap().completion_time.is_some(),
        "Ready only once the Job completed"
    );
    let command = job.spec.unwrap().template.spec.unwrap().containers[0]
        .command
        .clone()
        .unwrap();
    assert_eq!(command, ["sleep", "1"]);
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .get("batch")
        .await
        .unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(2));
    delete(&apps, "batch").await;
    operator.stop().await;
}

#[tokio::test]
async fn kros_simple_deployment_includes_its_service_when_enabled() {
    let (client, ns, apps) = scene("simpledeployment", "kro-simple").await;
    let operator = operator(&ns.name).await;
    apps.create(
        &PostParams::default(),
        &instance("SimpleDeployment", "simple", json!({"name": "simple"})),
    )
    .await
    .unwrap();
    let simple = ready(&apps, "simple").await;
    assert_eq!(simple.data["status"]["availableReplicas"], 1);
    assert!(simple.data["status"]["deploymentConditions"].is_array());
    let services = Api::<Service>::namespaced(client.clone(), &ns.name);
    let service = services.get("simple").await.unwrap();
    let port = &service.spec.unwrap().ports.unwrap()[0];
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080))
    );
    let off = json!({"spec": {"service": {"enabled": false}}});
    apps.patch("simple", &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    ready(&apps, "simple").await;
    assert!(
        services.get_opt("simple").await.unwrap().is_none(),
        "pruned"
    );
    delete(&apps, "simple").await;
    operator.stop().await;
}

#[tokio::test]
async fn kros_defaults_example_has_no_resource_and_its_defaults() {
    let (_client, ns, apps) = scene("defaults", "kro-defaults").await;
    let operator = operator(&ns.name).await;
    let spec = json!({"required": 1, "config": {"field": "x"}});
    apps.create(&PostParams::default(), &instance("Defaulted", "d", spec))
        .await
        .unwrap();
    let d = ready(&apps, "d").await;
    let spec = &d.data["spec"];
    assert_eq!(spec["elements"], json!(["a", "b", "c", "d"]));
    assert_eq!(
        (
            spec["element"].clone(),
            spec["enabled"].clone(),
            spec["number"].clone()
        ),
        (json!("e"), json!(true), json!(100))
    );
    assert_eq!(
        (
            spec["config"]["field2"].clone(),
            spec["config"]["field3"].clone()
        ),
        (json!(200), json!(2002))
    );
    let count = &d.data["status"]["inventory"]["count"];
    assert!(count.is_null() || *count == 0, "nothing applied: {count}");
    let missing = json!({"apiVersion": "kro.run/v1alpha1", "kind": "Defaulted",
        "metadata": {"name": "e"}, "spec": {}});
    let refused = apps
        .create(
            &PostParams::default(),
            &serde_json::from_value(missing).unwrap(),
        )
        .await;
    assert!(refused.is_err(), "`required` is required");
    delete(&apps, "d").await;
    operator.stop().await;
}

#[tokio::test]
async fn kros_tenant_environment_makes_a_namespace_and_what_goes_in_it() {
    let (client, ns, apps) = scene("tenantenv", "kro-tenant").await;
    let operator = operator(&ns.name).await;
    let tenant = format!("tenant-{:06x}", rand::random::<u32>() & 0xff_ffff);
    apps.create(
        &PostParams::default(),
        &instance("TenantEnvironment", "acme", json!({"tenantId": tenant})),
    )
    .await
    .unwrap();
    let acme = ready(&apps, "acme").await;
    assert_eq!(acme.data["status"]["inventory"]["count"], 3);
    let namespace = Api::<Namespace>::all(client.clone())
        .get(&tenant)
        .await
        .unwrap();
    assert_eq!(namespace.metadata.labels.unwrap()["name"], tenant);
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &tenant)
        .get(&format!("{tenant}-quota"))
        .await
        .unwrap();
    let hard = quota.spec.unwrap().hard.unwrap();
    assert_eq!(hard["limits.memory"].0, "2Gi");
    Api::<NetworkPolicy>::namespaced(client.clone(), &tenant)
        .get(&format!("{tenant}-isolation"))
        .await
        .unwrap();
    // kro takes any tenantId; here the schema and `reach` keep it to tenant-*.
    let system = instance(
        "TenantEnvironment",
        "sys",
        json!({"tenantId": "kube-system"}),
    );
    assert!(apps.create(&PostParams::default(), &system).await.is_err());
    delete(&apps, "acme").await;
    let gone = Api::<Namespace>::all(client.clone())
        .get_opt(&tenant)
        .await
        .unwrap();
    assert!(gone.is_none_or(|n| n.metadata.deletion_timestamp.is_some()));
    operator.stop().await;
}

#[tokio::test]
async fn kros_coredns_makes_its_cluster_role_and_binding_and_takes_them_away() {
    let (client, ns, apps) = scene("coredns", "kro-coredns").await;
    let operator = operator(&ns.name).await;
    let name = format!("kro-dns-{:06x}", rand::random::<u32>() & 0xff_ffff);
    apps.create(
        &PostParams::default(),
        &instance("CoreDNSDeployment", "dns", json!({"name": name})),
    )
    .await
    .unwrap();
    let dns = ready(&apps, "dns").await;
    assert_eq!(dns.data["status"]["availableReplicas"], 2);
    assert_eq!(dns.data["status"]["inventory"]["count"], 6);
    let roles = Api::<ClusterRole>::all(client.clone());
    let role = roles.get(&name).await.unwrap();
    assert_eq!(role.metadata.labels.unwrap()["k8s-app"], "kube-dns");
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let subject = &bindings.get(&name).await.unwrap().subjects.unwrap()[0];
    assert_eq!(subject.namespace.as_deref(), Some(ns.name.as_str()));
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .get(&name)
        .await
        .unwrap();
    let corefile = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get(&name)
        .await
        .unwrap()
        .data
        .unwrap()["Corefile"]
        .clone();
    assert!(corefile.starts_with(".:53 {"), "{corefile}");
    delete(&apps, "dns").await;
    assert!(roles.get_opt(&name).await.unwrap().is_none());
    assert!(bindings.get_opt(&name).await.unwrap().is_none());
    operator.stop().await;
}

/// Copies the kind folder `name` of kro's examples into a folder of its
/// own, with `change` made to its kind file; returns the folder.
fn changed_example(name: &str, change: impl FnOnce(String) -> String) -> tempfile::TempDir {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let root = tempfile::tempdir().unwrap();
    copy(&folder().join(name), &root.path().join(name));
    let kind_file = root.path().join(name).join("kind.yaml");
    let text = std::fs::read_to_string(&kind_file).unwrap();
    let changed = change(text.clone());
    assert_ne!(changed, text, "the change changes the kind file");
    std::fs::write(&kind_file, changed).unwrap();
    root
}

/// kro's simple-deployment with its Deployment's `readyWhen` false for the
/// live Deployment (one more replica available than it asks for) is never
/// Ready, and says what it waits for, though its status was written for
/// the generation with the replica available and its Service is there
/// (`kros_simple_deployment_includes_its_service_when_enabled` is the same
/// example Ready): on kwok the Pods become available anyway, so only the
/// `readyWhen` holds it back.
#[tokio::test]
async fn a_false_ready_when_holds_kros_simple_deployment_back() {
    let (client, ns, apps) = scene("simpledeployment", "kro-held").await;
    let false_ready_when = "self.spec.replicas + 1 == self.status.availableReplicas";
    let folder = changed_example("simpledeployment", |kind_file| {
        kind_file.replace(
            "readyWhen: self.spec.replicas == self.status.availableReplicas",
            &format!("readyWhen: {false_ready_when}"),
        )
    });
    let path = folder.path().display().to_string();
    let flags = [
        "--kustomize-dir",
        &path,
        "--kinds",
        "simpledeployment",
        "--health-timeout",
        "2m",
    ];
    let operator = common::start_operator(&ns.name, &flags).await;
    apps.create(
        &PostParams::default(),
        &instance("SimpleDeployment", "simple", json!({"name": "simple"})),
    )
    .await
    .unwrap();
    let what = "simple's status written with its replica available";
    let simple = common::wait_for(TIMEOUT, what, || async {
        let object = apps.get("simple").await.unwrap();
        let status = &object.data["status"];
        let current = status["observedGeneration"].as_i64() == object.metadata.generation;
        if current && status["availableReplicas"] == 1 {
            Ok(object)
        } else {
            Err(status.clone())
        }
    })
    .await;
    let conditions = simple.data["status"]["conditions"].as_array().unwrap();
    let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_ne!(ready["status"], "True", "{ready:#}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "deployment.readyWhen (simple): waiting for {false_ready_when}"
        )),
        "{ready:#}"
    );
    let services = Api::<Service>::namespaced(client.clone(), &ns.name);
    assert!(services.get_opt("simple").await.unwrap().is_some());
    delete(&apps, "simple").await;
    operator.stop().await;
}
