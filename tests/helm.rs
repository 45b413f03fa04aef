//! The Helm chart (`charts/kustomize-operator`) for real.
//!
//! Without a cluster: `helm lint`; `helm template` with the default values
//! renders exactly what `kubectl kustomize deploy` builds, and with
//! `copyratorNamespaces` what `overlays/copyrator-namespaces` builds (the
//! chart and deploy/ cannot drift apart: any difference fails here, Helm's
//! labels and deploy/'s Namespace aside); the values shape the install; bad
//! values are refused with a message naming them.
//!
//! Against the control plane: `helm install`, the objects and the RBAC of
//! the chart's ServiceAccount (its own token, `kubectl auth can-i`), `helm
//! upgrade` with other values, `helm uninstall` leaving nothing but the CRDs.
//! The release is `ko-helm-<random>` in a namespace of its own: its
//! cluster-scoped names derive from the release, so it never touches the
//! install of `tests/deploy.rs` (`kustomize-operator-system`, deploy/'s
//! names). The CRDs are shared with every test: `helm install` applies the
//! chart's copies (identical to deploy/'s, so nothing changes), and upgrade
//! and uninstall leave them alone.

use ko_test_support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kustomize_operator::kinds::declared::rbac::AGGREGATE_LABEL;
use serde_json::{Value, json};

const CHART: &str = "charts/kustomize-operator";
const TIMEOUT: Duration = Duration::from_secs(60);

/// The labels a Helm chart adds by convention to deploy/'s: removed from
/// labels and selectors before comparing.
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// The helm binary.
struct Helm(PathBuf);

/// The helm binary, or return (a loud skip; a failure under CI).
macro_rules! helm_or_skip {
    () => {
        match common::helm_path() {
            Some(path) => Helm(path),
            None => return,
        }
    };
}

impl Helm {
    /// Runs helm; returns (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(&self.0)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.0.display()));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs helm and panics, with its output, when it fails.
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "helm {args:?} failed:\n{out}\n{err}");
        out
    }

    /// `helm template <release> <chart> --namespace <namespace> --include-crds <args>`:
    /// the documents.
    fn template(&self, release: &str, namespace: &str, args: &[&str]) -> Vec<Value> {
        let chart = chart();
        let mut argv = vec![
            "template",
            release,
            &chart,
            "--namespace",
            namespace,
            "--include-crds",
        ];
        argv.extend_from_slice(args);
        serde_saphyr::from_multiple(&self.ok(&argv)).expect("helm template prints YAML")
    }

    /// The error of a `helm template` that must fail.
    fn template_error(&self, args: &[&str]) -> String {
        let chart = chart();
        let mut argv = vec!["template", "kustomize-operator", &chart];
        argv.extend_from_slice(args);
        let (ok, out, err) = self.run(&argv);
        assert!(
            !ok,
            "helm template {args:?} should fail; it printed:\n{out}"
        );
        err
    }
}

fn chart() -> String {
    common::repo().join(CHART).display().to_string()
}

/// `kind namespace/name` (no namespace: cluster-scoped).
fn identity(doc: &Value) -> String {
    format!(
        "{} {}/{}",
        doc["kind"].as_str().unwrap_or_default(),
        doc["metadata"]["namespace"].as_str().unwrap_or_default(),
        doc["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Kinds kustomize (kyaml v0.20) does not know are cluster-scoped, and
/// stamps with the kustomization's namespace; the API server drops it.
const CLUSTER_SCOPED_KUSTOMIZE_MISTAKES: [&str; 2] = [
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The documents by identity; an identity may appear once.
fn by_identity(docs: &[Value]) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for doc in docs {
        let mut doc = doc.clone();
        if CLUSTER_SCOPED_KUSTOMIZE_MISTAKES.contains(&doc["kind"].as_str().unwrap_or_default())
            && let Some(meta) = doc["metadata"].as_object_mut()
        {
            meta.remove("namespace");
        }
        let doc = &doc;
        assert!(
            map.insert(identity(doc), doc.clone()).is_none(),
            "{} appears twice",
            identity(doc)
        );
    }
    map
}

/// `doc` without Helm's labels in its labels and selectors.
fn without_helm_labels(mut doc: Value) -> Value {
    for pointer in [
        "/metadata/labels",
        "/spec/selector",
        "/spec/selector/matchLabels",
        "/spec/template/metadata/labels",
        "/spec/podSelector/matchLabels",
    ] {
        if let Some(Value::Object(labels)) = doc.pointer_mut(pointer) {
            for label in HELM_LABELS {
                labels.remove(*label);
            }
        }
    }
    doc
}

/// Fails unless the chart's documents are kustomize's, object for object and
/// field for field, with two differences allowed: Helm's labels (removed from
/// the chart's), and deploy/'s Namespace (a chart installs into the namespace
/// `helm install --namespace` names, which Helm must find or create before
/// the release; docs/deploy.md, "Helm").
fn assert_same_objects(kustomize: &[Value], helm: &[Value], what: &str) {
    let mut expected = by_identity(kustomize);
    let namespaces: Vec<String> = expected
        .keys()
        .filter(|k| k.starts_with("Namespace "))
        .cloned()
        .collect();
    assert_eq!(namespaces.len(), 1, "{what}: one Namespace: {namespaces:?}");
    expected.remove(&namespaces[0]);
    let actual: BTreeMap<String, Value> = by_identity(helm)
        .into_iter()
        .map(|(k, v)| (k, without_helm_labels(v)))
        .collect();
    let missing: Vec<&String> = expected
        .keys()
        .filter(|k| !actual.contains_key(*k))
        .collect();
    let extra: Vec<&String> = actual
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: the chart lacks {missing:?} and adds {extra:?}"
    );
    let mut report = Vec::new();
    for (id, want) in &expected {
        let mut found = Vec::new();
        differences(want, &actual[id], "", &mut found);
        if !found.is_empty() {
            report.push(format!("{id}:\n{}", found.join("\n")));
        }
    }
    assert!(
        report.is_empty(),
        "{what}: objects differ (Helm's labels removed):\n{}",
        report.join("\n")
    );
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "(nothing)".to_string(), Value::to_string)
}

/// Where `a` (kustomize's) and `b` (the chart's) differ: one line per JSON
/// pointer, with both values. Numbers compare by value.
fn differences(a: &Value, b: &Value, at: &str, found: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let (x, y) = (x.get(key), y.get(key));
                let at = format!("{at}/{key}");
                match (x, y) {
                    (Some(x), Some(y)) => differences(x, y, &at, found),
                    _ => found.push(format!("  {at}: kustomize {}, helm {}", show(x), show(y))),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let at = format!("{at}/{i}");
                match (x.get(i), y.get(i)) {
                    (Some(x), Some(y)) => differences(x, y, &at, found),
                    (x, y) => {
                        found.push(format!("  {at}: kustomize {}, helm {}", show(x), show(y)))
                    }
                }
            }
        }
        // kustomize writes the CRDs' `minimum: 1.0` as 1; helm prints crds/ as is.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a != b => found.push(format!("  {at}: kustomize {a}, helm {b}")),
        _ => {}
    }
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn names_of(docs: &[Value], kind: &str) -> BTreeSet<String> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The operator container's environment: name → value (or valueFrom).
fn env_of(deployment: &Value) -> Vec<(String, Value)> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let value = e.get("value").cloned().unwrap_or(e["valueFrom"].clone());
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

fn env_value(deployment: &Value, name: &str) -> Option<String> {
    env_of(deployment)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str().unwrap_or_default().to_string())
}

#[test]
fn the_charts_crds_are_deploys() {
    let deploy = common::repo().join("deploy/crds");
    let chart = common::repo().join(CHART).join("crds");
    let files = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "kustomization.yaml")
            .collect()
    };
    assert_eq!(
        files(&deploy),
        files(&chart),
        "{CHART}/crds holds deploy/crds' CRDs (and nothing else): \
         cargo run -- crd --out-dir {CHART}/crds"
    );
    for name in files(&deploy) {
        assert_eq!(
            std::fs::read_to_string(deploy.join(&name)).unwrap(),
            std::fs::read_to_string(chart.join(&name)).unwrap(),
            "{CHART}/crds/{name} differs from deploy/crds: cargo run -- crd --out-dir {CHART}/crds"
        );
    }
}

#[test]
fn the_charts_admission_policies_are_deploys() {
    let policies: BTreeSet<String> = std::fs::read_dir(common::repo().join("deploy/admission"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    let template =
        std::fs::read_to_string(common::repo().join(CHART).join("templates/admission.yaml"))
            .unwrap();
    for name in &policies {
        assert!(
            template.contains(&format!("{name:?}")),
            "templates/admission.yaml does not render {name}"
        );
        assert_eq!(
            std::fs::read_to_string(common::repo().join("deploy/admission").join(name)).unwrap(),
            std::fs::read_to_string(
                common::repo()
                    .join(CHART)
                    .join("files/admission")
                    .join(name)
            )
            .unwrap(),
            "{CHART}/files/admission/{name} differs from deploy/admission: copy it over"
        );
    }
}

#[test]
fn the_charts_kinds_are_the_operators() {
    let kinds = common::all_kinds();
    let operator: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join(CHART).join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let enumerated: Vec<&str> = schema["properties"]["kinds"]["items"]["enum"]
        .as_array()
        .expect("kinds' enum")
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(enumerated, operator, "values.schema.json: kinds");
    let helpers =
        std::fs::read_to_string(common::repo().join(CHART).join("templates/_helpers.tpl")).unwrap();
    assert!(
        helpers.contains(&format!("\n{}\n", operator.join(","))),
        "templates/_helpers.tpl's allKinds lists {operator:?}"
    );
    for kind in &operator {
        assert!(
            common::repo()
                .join(CHART)
                .join(format!("templates/rbac-{kind}.yaml"))
                .exists(),
            "the chart has no templates/rbac-{kind}.yaml"
        );
    }
}

#[test]
fn helm_lint_passes() {
    let helm = helm_or_skip!();
    let chart = chart();
    helm.ok(&["lint", "--strict", &chart]);
    helm.ok(&[
        "lint",
        "--strict",
        &chart,
        "--set-json",
        r#"copyratorNamespaces=["platform","team-a"]"#,
        "--set-json",
        r#"kinds=["copyrator","sample"]"#,
        "--set",
        "watchNamespace=platform,replicas=1,leaderElection.enabled=false",
    ]);
}

/// One source of truth: with its default values, a release
/// `kustomize-operator` in `kustomize-operator-system` renders deploy/.
#[test]
fn default_values_render_what_deploy_installs() {
    let helm = helm_or_skip!();
    let rendered = helm.template("kustomize-operator", "kustomize-operator-system", &[]);
    assert_same_objects(
        &common::kustomize_documents("deploy"),
        &rendered,
        "helm template vs kubectl kustomize deploy",
    );
}

/// ... and with `copyratorNamespaces` (the overlay's list),
/// overlays/copyrator-namespaces.
#[test]
fn copyrator_namespaces_render_what_the_overlay_installs() {
    let helm = helm_or_skip!();
    let overlay = common::kustomize_documents("overlays/copyrator-namespaces");
    let list = serde_json::to_string(&common::copyrator_namespaces_env(&overlay)).unwrap();
    let rendered = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &["--set-json", &format!("copyratorNamespaces={list}")],
    );
    assert_same_objects(
        &overlay,
        &rendered,
        "helm template vs kubectl kustomize overlays/copyrator-namespaces",
    );
}

/// ... and with `autoSharding` (three replicas, no leader election),
/// overlays/auto-sharding.
#[test]
fn an_auto_sharding_release_renders_what_the_overlay_installs() {
    let helm = helm_or_skip!();
    let overlay = common::kustomize_documents("overlays/auto-sharding");
    let rendered = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set",
            "autoSharding.enabled=true,leaderElection.enabled=false,replicas=3",
        ],
    );
    assert_same_objects(
        &overlay,
        &rendered,
        "helm template vs kubectl kustomize overlays/auto-sharding",
    );
    let refused = helm.template_error(&["--set", "autoSharding.enabled=true"]);
    assert!(
        refused.contains("set leaderElection.enabled=false"),
        "{refused}"
    );
}

/// ... and locked down, writing as `kustomize-writer`, overlays/locked-down.
#[test]
fn a_locked_down_release_renders_what_the_overlay_installs() {
    let helm = helm_or_skip!();
    let overlay = common::kustomize_documents("overlays/locked-down");
    let rendered = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set",
            "writeAs.lockedDown=true",
            "--set",
            "writeAs.serviceAccountName=kustomize-writer",
        ],
    );
    assert_same_objects(
        &overlay,
        &rendered,
        "helm template vs kubectl kustomize overlays/locked-down",
    );
    let refused = helm.template_error(&["--set", "writeAs.lockedDown=true"]);
    assert!(refused.contains("writeAs.serviceAccountName"), "{refused}");
}

/// ... and locked down serving KindDefinitions,
/// overlays/locked-down-kind-definitions.
#[test]
fn a_locked_down_release_serving_definitions_renders_what_the_overlay_installs() {
    let helm = helm_or_skip!();
    let overlay = common::kustomize_documents("overlays/locked-down-kind-definitions");
    let rendered = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set",
            "writeAs.lockedDown=true,writeAs.kindDefinitions=true",
            "--set",
            "writeAs.serviceAccountName=kustomize-writer",
        ],
    );
    assert_same_objects(
        &overlay,
        &rendered,
        "helm template vs kubectl kustomize overlays/locked-down-kind-definitions",
    );
    let refused = helm.template_error(&["--set", "writeAs.kindDefinitions=true"]);
    assert!(refused.contains("writeAs.lockedDown"), "{refused}");
    let refused =
        helm.template_error(&["--set", "writeAs.clusterServiceAccount=ops/cluster-writer"]);
    assert!(refused.contains("writeAs.serviceAccountName"), "{refused}");
}

/// ... and with the conversion webhook, overlays/conversion-webhook; a
/// release that serves no KindDefinitions cannot have it.
#[test]
fn a_conversion_webhook_release_renders_what_the_overlay_installs() {
    let helm = helm_or_skip!();
    let overlay = common::kustomize_documents("overlays/conversion-webhook");
    let rendered = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &["--set", "conversionWebhook.enabled=true"],
    );
    assert_same_objects(
        &overlay,
        &rendered,
        "helm template vs kubectl kustomize overlays/conversion-webhook",
    );
    let refused = helm.template_error(&[
        "--set",
        "conversionWebhook.enabled=true,writeAs.lockedDown=true",
        "--set",
        "writeAs.serviceAccountName=kustomize-writer",
    ]);
    assert!(refused.contains("conversionWebhook.enabled"), "{refused}");
}

/// The NetworkPolicy's values: the API server's CIDRs replace "any address
/// but link-local", ExchangeRate's provider gets a rule of its own, the
/// metrics port its sources; off, there is none. And the cluster account
/// reaches the operator's environment.
#[test]
fn the_network_policy_and_the_cluster_account_follow_the_values() {
    let helm = helm_or_skip!();
    let docs = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set-json",
            r#"networkPolicy.apiServer.cidrs=["10.0.0.5/32"]"#,
            "--set-json",
            r#"networkPolicy.exchangeRate.to=[{"ipBlock":{"cidr":"203.0.113.0/24"}}]"#,
            "--set-json",
            r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"team":"monitoring"}}}]"#,
            "--set",
            "writeAs.serviceAccountName=kustomize-writer,writeAs.clusterServiceAccount=ops/cluster-writer",
        ],
    );
    let policy = find(&docs, "NetworkPolicy", "kustomize-operator");
    assert_eq!(
        policy["spec"]["egress"][1]["to"],
        json!([{"ipBlock": {"cidr": "10.0.0.5/32"}}])
    );
    assert_eq!(
        policy["spec"]["egress"][2],
        json!({"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 443, "protocol": "TCP"}]})
    );
    assert_eq!(
        policy["spec"]["ingress"][0]["from"],
        json!([{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}])
    );
    let deployment = find(&docs, "Deployment", "kustomize-operator");
    assert_eq!(
        env_value(deployment, "CLUSTER_SERVICE_ACCOUNT").as_deref(),
        Some("ops/cluster-writer")
    );
    let off = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &["--set", "networkPolicy.enabled=false"],
    );
    assert!(names_of(&off, "NetworkPolicy").is_empty());
}

/// `tracing.otlpEndpoint` sends the operator's traces to a Collector and
/// lets it out to the Collector: at the peers named, else at any address
/// but link-local, on the Collector's ports. Unset, neither is there.
#[test]
fn a_tracing_endpoint_sets_the_exporter_and_opens_the_collector() {
    let helm = helm_or_skip!();
    let endpoint = "http://otel-collector.observability:4318";
    let collector = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]);
    let to = format!("tracing.collector.to={collector}");
    let named = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set",
            &format!("tracing.otlpEndpoint={endpoint}"),
            "--set-json",
            &to,
        ],
    );
    let deployment = find(&named, "Deployment", "kustomize-operator");
    assert_eq!(
        env_value(deployment, "OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some(endpoint)
    );
    let egress = |docs: &[Value]| -> Vec<Value> {
        let policy = find(docs, "NetworkPolicy", "kustomize-operator");
        policy["spec"]["egress"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let to_collector = json!({"to": collector, "ports": [{"port": 4318, "protocol": "TCP"}]});
    assert!(
        egress(&named).contains(&to_collector),
        "{:#?}",
        egress(&named)
    );

    let anywhere = helm.template(
        "kustomize-operator",
        "kustomize-operator-system",
        &[
            "--set",
            &format!("tracing.otlpEndpoint={endpoint}"),
            "--set-json",
            "tracing.collector.ports=[4317,4318]",
        ],
    );
    let any_address = json!({
        "to": [
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
            {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}},
        ],
        "ports": [{"port": 4317, "protocol": "TCP"}, {"port": 4318, "protocol": "TCP"}],
    });
    assert!(
        egress(&anywhere).contains(&any_address),
        "{:#?}",
        egress(&anywhere)
    );

    let default = helm.template("kustomize-operator", "kustomize-operator-system", &[]);
    let deployment = find(&default, "Deployment", "kustomize-operator");
    assert_eq!(env_value(deployment, "OTEL_EXPORTER_OTLP_ENDPOINT"), None);
    let to_collector_port = egress(&default).iter().any(|rule| {
        (rule["ports"].as_array()).is_some_and(|ports| ports.iter().any(|p| p["port"] == 4318))
    });
    assert!(!to_collector_port, "{:#?}", egress(&default));
}

#[test]
fn the_values_shape_the_install() {
    let helm = helm_or_skip!();
    let docs = helm.template(
        "lab",
        "operators",
        &[
            "--set-json",
            r#"kinds=["sample"]"#,
            "--set",
            "watchNamespace=team-a,replicas=1,leaderElection.enabled=false",
            "--set",
            "image.repository=registry.example/kustomize-operator,image.tag=1.2.3,image.pullPolicy=Always",
            "--set",
            "resources.limits.memory=1Gi",
            "--set-json",
            r#"extraEnv=[{"name":"RUST_LOG","value":"debug"},{"name":"BATCH_MAX","value":"1"}]"#,
        ],
    );
    // Every name derives from the release: two releases share no cluster-scoped object.
    let prefix = "lab-kustomize-operator";
    for doc in docs
        .iter()
        .filter(|d| d["kind"] != "CustomResourceDefinition")
    {
        let name = doc["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with(prefix),
            "{} is not {prefix}-*",
            identity(doc)
        );
        if let Some(subjects) = doc["subjects"].as_array() {
            assert_eq!(
                subjects,
                &vec![json!({"kind": "ServiceAccount", "name": prefix, "namespace": "operators"})]
            );
        }
        let cluster_scoped = ["ClusterRole", "ClusterRoleBinding"]
            .iter()
            .chain(&CLUSTER_SCOPED_KUSTOMIZE_MISTAKES)
            .any(|k| doc["kind"] == *k);
        if !cluster_scoped {
            assert_eq!(
                doc["metadata"]["namespace"],
                "operators",
                "{}",
                identity(doc)
            );
        }
        assert_eq!(
            doc["metadata"]["labels"]["app.kubernetes.io/instance"],
            "lab"
        );
    }
    // Only the listed kinds' grants; no leader election without it.
    assert_eq!(
        names_of(&docs, "ClusterRole"),
        BTreeSet::from(
            ["events", "kind-definitions", "kinds", "sample"]
                .map(|role| format!("{prefix}-{role}"))
        )
    );
    // The declared kind's role is bound, not aggregated: no role of the
    // release is a source of `-kinds` (uninstalling it would race the
    // control plane's aggregation controller).
    let sample = find(&docs, "ClusterRole", &format!("{prefix}-sample"));
    assert!(names_of(&docs, "ClusterRoleBinding").contains(&format!("{prefix}-sample")));
    for role in docs.iter().filter(|d| d["kind"] == "ClusterRole") {
        assert!(
            role["metadata"]["labels"][AGGREGATE_LABEL].is_null(),
            "{}",
            role["metadata"]["name"]
        );
    }
    assert_eq!(sample["rules"][0]["resources"], json!(["samples"]));
    let kinds = find(&docs, "ClusterRole", &format!("{prefix}-kinds"));
    assert_eq!(
        kinds["aggregationRule"]["clusterRoleSelectors"],
        json!([{"matchLabels": {AGGREGATE_LABEL: "true"}}])
    );
    // No leader election: only the Role keeping the definitions' revisions.
    let revisions = BTreeSet::from([format!("{prefix}-revisions")]);
    assert_eq!(names_of(&docs, "Role"), revisions);
    assert_eq!(names_of(&docs, "RoleBinding"), revisions);
    let deployment = find(&docs, "Deployment", prefix);
    assert_eq!(deployment["spec"]["replicas"], 1);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example/kustomize-operator:1.2.3"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(container["resources"]["requests"]["memory"], "256Mi");
    assert_eq!(env_value(deployment, "KINDS").as_deref(), Some("sample"));
    assert_eq!(
        env_value(deployment, "WATCH_NAMESPACE").as_deref(),
        Some("team-a")
    );
    assert_eq!(env_value(deployment, "LEADER_ELECT"), None);
    assert_eq!(env_value(deployment, "COPYRATOR_NAMESPACES"), None);
    // extraEnv replaces the chart's variable in place and adds the others at the end.
    let names: Vec<String> = env_of(deployment).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.iter().filter(|n| *n == "RUST_LOG").count(), 1);
    assert_eq!(env_value(deployment, "RUST_LOG").as_deref(), Some("debug"));
    assert_eq!(names.last().map(String::as_str), Some("BATCH_MAX"));
    // The CRDs come along with --include-crds, unchanged: every kind's and
    // KindDefinition's.
    assert_eq!(
        names_of(&docs, "CustomResourceDefinition").len(),
        common::all_kinds().len() + 1
    );
}

/// A release for shard `b` runs its operator with SHARD=b and may take
/// the Lease `kustomize-operator-b`, and only that one.
#[test]
fn a_shard_release_runs_its_shard_with_its_own_lease() {
    let helm = helm_or_skip!();
    let docs = helm.template(
        "shard-b",
        "kustomize-operator-system",
        &["--set", "shard=b"],
    );
    let deployment = find(&docs, "Deployment", "shard-b-kustomize-operator");
    assert_eq!(env_value(deployment, "SHARD").as_deref(), Some("b"));
    let role = docs
        .iter()
        .find(|d| d["kind"] == "Role")
        .expect("the leader-election Role");
    let leases: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resourceNames"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(leases, ["kustomize-operator-b"]);
    let default = helm.template("kustomize-operator", "kustomize-operator-system", &[]);
    let main = find(&default, "Deployment", "kustomize-operator");
    assert_eq!(env_value(main, "SHARD"), None, "the default shard");
}

#[test]
fn bad_values_are_refused_with_a_message_naming_them() {
    let helm = helm_or_skip!();
    for (args, expected) in [
        (&["--set", "shard=not a label"][..], "/shard"),
        (&["--set-json", r#"kinds=["pods"]"#][..], "/kinds/0"),
        (
            &["--set", "replicas=2,leaderElection.enabled=false"],
            "replicas: 2 replicas need leaderElection.enabled=true",
        ),
        (
            &[
                "--set-json",
                r#"kinds=["sample"]"#,
                "--set-json",
                r#"copyratorNamespaces=["team-a"]"#,
            ],
            "copyratorNamespaces is set but copyrator is not among kinds",
        ),
        (
            &["--set-json", r#"copyratorNamespaces=["Team_A"]"#],
            "/copyratorNamespaces/0",
        ),
        (&["--set", "watchNamespace=-x"], "/watchNamespace"),
        (
            &[
                "--set-json",
                r#"extraEnv=[{"name":"KINDS","value":"sample"}]"#,
            ],
            "extraEnv: KINDS is set by the chart from kinds",
        ),
        (
            &["--set-json", r#"extraEnv=[{"name":"SHARD","value":"b"}]"#],
            "extraEnv: SHARD is set by the chart from shard",
        ),
        (
            &["--set", "tracing.otlpEndpoint=otel-collector:4318"],
            "/tracing/otlpEndpoint",
        ),
        // A misspelt value is an error, not silently ignored.
        (
            &["--set", "replica=3"],
            "additional properties 'replica' not allowed",
        ),
    ] {
        let err = helm.template_error(args);
        assert!(
            err.contains(expected),
            "helm template {args:?}: the error should contain {expected:?}:\n{err}"
        );
    }
}

/// A kubeconfig holding nothing but the API server, its CA and a token
/// minted for a ServiceAccount (`kubectl create token`).
struct TokenKubeconfig {
    _dir: tempfile::TempDir,
    path: String,
}

impl TokenKubeconfig {
    fn mint(namespace: &str, account: &str) -> Self {
        let (ok, token, err) = common::kubectl(&["create", "token", account, "-n", namespace]);
        assert!(ok, "kubectl create token {account}: {err}");
        let (ok, admin, err) =
            common::kubectl(&["config", "view", "--raw", "--minify", "-o", "json"]);
        assert!(ok, "kubectl config view: {err}");
        let admin: Value = serde_json::from_str(&admin).unwrap();
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": admin["clusters"][0]["cluster"]}],
            "users": [{"name": account, "user": {"token": token.trim()}}],
            "contexts": [{"name": "sa", "context": {"cluster": "cluster", "user": account}}],
            "current-context": "sa",
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
        Self {
            path: path.display().to_string(),
            _dir: dir,
        }
    }

    /// Waits until `kubectl auth can-i <args>` with the token answers
    /// `allowed`, failing after [`TIMEOUT`]: the authorizer learns of new and
    /// deleted bindings through a watch, a moment after helm returns.
    async fn expect(&self, args: &[&str], allowed: bool) {
        let what = format!(
            "the token to be {}: {args:?}",
            if allowed { "allowed" } else { "denied" }
        );
        common::wait_until(TIMEOUT, what, || async { self.can_i(args) == allowed }).await;
    }

    /// `kubectl auth can-i <args>` with the token: true for "yes".
    fn can_i(&self, args: &[&str]) -> bool {
        let mut argv = vec!["--kubeconfig", &self.path, "auth", "can-i"];
        argv.extend_from_slice(args);
        let (_, out, err) = common::kubectl(&argv);
        match out.trim() {
            "yes" => true,
            "no" => false,
            other => panic!("kubectl auth can-i {args:?}: {other:?} {err}"),
        }
    }
}

/// Uninstalls the release and deletes its namespace when dropped (the
/// happy path has uninstalled it already).
struct Release<'a> {
    helm: &'a Helm,
    name: String,
    namespace: String,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TEST_NAMESPACES").is_none() {
            let _ = self.helm.run(&[
                "uninstall",
                &self.name,
                "--namespace",
                &self.namespace,
                "--ignore-not-found",
            ]);
            let _ = common::kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
        }
    }
}

/// `kubectl get <what> -l app.kubernetes.io/instance=<release> -o name` (all
/// namespaces for namespaced kinds).
fn objects_of(release: &str, what: &str) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let (ok, out, err) = common::kubectl(&["get", what, "-A", "-l", &selector, "-o", "name"]);
    assert!(ok, "kubectl get {what}: {err}");
    out.lines().map(str::to_string).collect()
}

/// `kubectl get -o name`'s names of the ClusterRoles `<fullname>-<role>`, sorted.
fn cluster_roles_named(fullname: &str, roles: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = roles
        .iter()
        .map(|role| format!("clusterrole.rbac.authorization.k8s.io/{fullname}-{role}"))
        .collect();
    names.sort();
    names
}

fn get_json(args: &[&str]) -> Value {
    let mut argv = vec!["get"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["-o", "json"]);
    let (ok, out, err) = common::kubectl(&argv);
    assert!(ok, "kubectl {argv:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn install_upgrade_uninstall_on_the_control_plane() {
    let client = common::cluster().await;
    let helm = helm_or_skip!();
    let team_a = common::TestNamespace::new(&client, "helm-a").await;
    let team_b = common::TestNamespace::new(&client, "helm-b").await;
    let name = format!("ko-helm-{:06x}", rand::random::<u32>() & 0xff_ffff);
    // The namespace as docs/deploy.md's "Helm" recommends it: Pod Security
    // "restricted" enforced, as deploy/namespace.yaml does.
    let (ok, _, err) = common::kubectl(&["create", "namespace", &name]);
    assert!(ok, "{err}");
    let release = Release {
        helm: &helm,
        name: name.clone(),
        namespace: name.clone(),
    };
    let ns = release.namespace.as_str();
    let (ok, _, err) = common::kubectl(&[
        "label",
        "namespace",
        ns,
        "kustomize-operator-test=true",
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    ]);
    assert!(ok, "{err}");
    let chart = chart();
    let fullname = format!("{name}-kustomize-operator");

    // Install: every object, named after the release.
    let out = helm.ok(&["install", &name, &chart, "--namespace", ns]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    let mut cluster_roles: Vec<String> = objects_of(&name, "clusterroles");
    cluster_roles.sort();
    let expected = cluster_roles_named(
        &fullname,
        &[
            "chaosagent",
            "copyrator",
            "events",
            "exchangerate",
            "kind-definitions",
            "kinds",
            "sample",
        ],
    );
    assert_eq!(cluster_roles, expected);
    // Every role bound, the Sample's too: none is aggregated into `-kinds`.
    assert_eq!(objects_of(&name, "clusterrolebindings").len(), 7);
    for (what, object) in [
        ("serviceaccount", fullname.clone()),
        ("service", format!("{fullname}-metrics")),
        ("role", format!("{fullname}-leader-election")),
        ("rolebinding", format!("{fullname}-leader-election")),
    ] {
        get_json(&["-n", ns, what, &object]);
    }
    let deployment = get_json(&["-n", ns, "deployment", &fullname]);
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        fullname.as_str()
    );
    assert_eq!(
        env_value(&deployment, "LEADER_ELECT").as_deref(),
        Some("true")
    );
    // The ReplicaSet's Pods exist only if "restricted" admitted them (they
    // stay Pending on a control plane without nodes).
    let selector = format!("app.kubernetes.io/instance={name}");
    common::wait_until(
        TIMEOUT,
        format!("two Pods of the release {name}"),
        || async {
            let (_, out, _) =
                common::kubectl(&["get", "pods", "-n", ns, "-l", &selector, "-o", "name"]);
            out.lines().count() == 2
        },
    )
    .await;

    // RBAC, through a token of the chart's ServiceAccount.
    let token = TokenKubeconfig::mint(ns, &fullname);
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
        &["delete", "pods", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &[
            "update",
            "leases.coordination.k8s.io/kustomize-operator",
            "-n",
            ns,
        ],
        &["list", "secrets", "-n", "kube-system"],
    ]
    .into_iter()
    // KindDefinitions, and the CRDs they declare.
    .chain(common::deploy::KIND_DEFINITION_RIGHTS)
    {
        token.expect(allowed, true).await;
    }
    for denied in [
        &["delete", "namespaces"][..],
        &["patch", "nodes"],
        &["delete", "services", "-n", "default"],
        &["create", "pods", "-n", "default"],
        &["delete", "samples.nuvolaris.org", "-n", "default"],
        &["update", "leases.coordination.k8s.io/other", "-n", ns],
        &["get", "leases.coordination.k8s.io", "-n", "kube-system"],
        &["create", "clusterrolebindings"],
        &["escalate", "clusterroles"],
        &["create", "serviceaccounts/token", "-n", ns],
        &["impersonate", "users"],
        &["update", "customresourcedefinitions.apiextensions.k8s.io"],
        &["delete", "kinddefinitions.kustomize-operator.io"],
    ] {
        token.expect(denied, false).await;
    }

    // Upgrade: one replica, two kinds, Copyrator confined to two namespaces.
    let scope = [team_a.name.as_str(), team_b.name.as_str()];
    let out = helm.ok(&[
        "upgrade",
        &name,
        &chart,
        "--namespace",
        ns,
        "--set",
        "replicas=1",
        "--set-json",
        r#"kinds=["sample","copyrator"]"#,
        "--set-json",
        &format!(
            "copyratorNamespaces={}",
            serde_json::to_string(&scope).unwrap()
        ),
    ]);
    assert!(out.contains("REVISION: 2"), "{out}");
    let deployment = get_json(&["-n", ns, "deployment", &fullname]);
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        env_value(&deployment, "KINDS").as_deref(),
        Some("sample,copyrator")
    );
    assert_eq!(
        env_value(&deployment, "COPYRATOR_NAMESPACES"),
        Some(scope.join(","))
    );
    // What the new values no longer render is gone (unlike `kubectl apply`).
    let mut cluster_roles: Vec<String> = objects_of(&name, "clusterroles");
    cluster_roles.sort();
    let expected = cluster_roles_named(
        &fullname,
        &[
            "copyrator-copies",
            "copyrator-rules",
            "events",
            "kind-definitions",
            "kinds",
            "sample",
        ],
    );
    assert_eq!(cluster_roles, expected);
    let mut bindings = objects_of(&name, "rolebindings");
    bindings.sort();
    assert_eq!(
        bindings.len(),
        4,
        "leader election, the definitions' revisions, one per Copyrator namespace: {bindings:?}"
    );
    for ns in scope {
        get_json(&[
            "-n",
            ns,
            "rolebinding",
            &format!("{fullname}-copyrator-copies"),
        ]);
    }
    // The same token: Secrets only in the two namespaces, no more Pods.
    for ns in scope {
        token.expect(&["get", "secrets", "-n", ns], true).await;
    }
    token
        .expect(&["watch", "copyrators.flant.com", "--all-namespaces"], true)
        .await;
    for denied in [
        &["list", "secrets", "-n", "kube-system"][..],
        &["list", "secrets", "--all-namespaces"],
        &["delete", "pods", "-n", "default"],
        &["create", "configmaps", "-n", "default"],
    ] {
        token.expect(denied, false).await;
    }

    // Uninstall: nothing of the release is left but the CRDs.
    let out = helm.ok(&["uninstall", &name, "--namespace", ns]);
    assert!(out.contains("uninstalled"), "{out}");
    common::wait_until(
        TIMEOUT,
        format!("no object of the release {name} left"),
        || async {
            [
                "clusterroles",
                "clusterrolebindings",
                "roles",
                "rolebindings",
                "serviceaccounts",
                "services",
                "deployments",
                "replicasets",
                "pods",
            ]
            .iter()
            .all(|what| objects_of(&name, what).is_empty())
        },
    )
    .await;
    let (ok, out, err) = helm.run(&["list", "--namespace", ns, "--short"]);
    assert!(ok && out.trim().is_empty(), "releases left: {out} {err}");
    for kind in common::all_kinds() {
        let crd = kind.crd().metadata.name.unwrap_or_default();
        get_json(&["customresourcedefinition", &crd]);
    }
    drop(release);
}

/// `helm uninstall` then `helm install` of the same release, round after
/// round: every install succeeds, and after every uninstall nothing of the
/// release is left, its aggregating ClusterRole `<fullname>-kinds` looked
/// up by name (one the control plane created again would carry neither
/// the release's labels nor Helm's annotations, and the next install would
/// fail on it: "exists and cannot be imported into the current release").
/// While the chart's Sample role was a source of `-kinds`, the control
/// plane's aggregation controller, writing `-kinds`' rules by a server-side
/// apply as `helm uninstall` deleted both, created it again in 6 of 20
/// rounds of a shell loop on the local control plane, and this test failed
/// in each of its 9 runs (at round 1 to 4). Each round waits for the release's grants to
/// be in effect (the operator's account may watch Samples) before
/// uninstalling, as a user's release would be. The CRDs are shared with
/// every test and are no part of it (`--skip-crds`).
#[tokio::test]
async fn uninstall_then_install_again_works_every_time() {
    let _area = common::area::enter().await;
    const ROUNDS: usize = 10;
    let _client = common::cluster().await;
    let helm = helm_or_skip!();
    let name = format!("ko-again-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let (ok, _, err) = common::kubectl(&["create", "namespace", &name]);
    assert!(ok, "{err}");
    let (ok, _, err) =
        common::kubectl(&["label", "namespace", &name, "kustomize-operator-test=true"]);
    assert!(ok, "{err}");
    let fullname = format!("{name}-kustomize-operator");
    let aggregating = format!("clusterrole/{fullname}-kinds");
    // One the control plane created again belongs to no release: deleted
    // by name (after the release's own cleanup).
    let _leftover = common::DeleteOnDrop(vec![aggregating.clone()]);
    let release = Release {
        helm: &helm,
        name: name.clone(),
        namespace: name.clone(),
    };
    let ns = release.namespace.as_str();
    let chart = chart();
    let account = format!("--as=system:serviceaccount:{ns}:{fullname}");
    let install = ["install", &name, &chart, "--namespace", ns, "--skip-crds"];
    for round in 1..=ROUNDS {
        let (ok, out, err) = helm.run(&install);
        assert!(ok, "round {round}: helm install failed:\n{out}\n{err}");
        common::wait_until(
            TIMEOUT,
            format!("round {round}: the release's account may watch Samples"),
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
        helm.ok(&["uninstall", &name, "--namespace", ns]);
        common::wait_until(
            TIMEOUT,
            format!("round {round}: nothing of the release {name} left"),
            || async {
                let (_, left, _) =
                    common::kubectl(&["get", &aggregating, "-o", "json", "--ignore-not-found"]);
                if let Ok(role) = serde_json::from_str::<Value>(&left) {
                    let instance = &role["metadata"]["labels"]["app.kubernetes.io/instance"];
                    assert!(
                        !instance.is_null(),
                        "round {round}: {aggregating} was created again after the uninstall, \
                         without the release's labels: by the control plane's aggregation \
                         controller, whose server-side apply of its rules creates it if it is gone"
                    );
                    return false;
                }
                ["clusterroles", "clusterrolebindings", "deployments"]
                    .iter()
                    .all(|what| objects_of(&name, what).is_empty())
            },
        )
        .await;
    }
    // The last uninstall left nothing in the way either.
    let (ok, out, err) = helm.run(&install);
    assert!(
        ok,
        "helm install after {ROUNDS} rounds failed:\n{out}\n{err}"
    );
    helm.ok(&["uninstall", &name, "--namespace", ns]);
    drop(release);
}

/// The conversion webhook's port is open to the sources
/// `networkPolicy.webhookFrom` names, and to any without them.
#[test]
fn the_webhooks_port_is_open_to_the_sources_named() {
    let helm = helm_or_skip!();
    let webhook = |extra: &[&str]| {
        let mut values = vec!["--set", "conversionWebhook.enabled=true"];
        values.extend(extra);
        let docs = helm.template("kustomize-operator", "kustomize-operator-system", &values);
        find(&docs, "NetworkPolicy", "kustomize-operator")["spec"]["ingress"][1].clone()
    };
    let ports = json!([{"port": 9443, "protocol": "TCP"}]);
    assert_eq!(webhook(&[]), json!({"ports": ports}));
    let from = json!([{"ipBlock": {"cidr": "10.0.0.5/32"}}]);
    let named = webhook(&[
        "--set-json",
        r#"networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"10.0.0.5/32"}}]"#,
    ]);
    assert_eq!(named, json!({"ports": ports, "from": from}));
}
