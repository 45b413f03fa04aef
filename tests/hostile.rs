//! Hostile input: what one tenant writes or one definition declares costs
//! only itself. Each test puts something hostile in the operator's way
//! and asserts that the operator stays up (`/healthz`), and that another
//! resource is served, within seconds, while the hostile one is refused
//! with a reason that names the limit.

use ko_test_support as common;

use std::time::Duration;

use common::greeting::GreetingKind;
use common::{OperatorProcess, TestNamespace};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);

/// `{"f:a":{"f:a":...{}}}`, `levels` deep: a valid set of managed fields.
fn deep_fields(levels: usize) -> Value {
    let mut value = json!({});
    for _ in 0..levels {
        value = json!({ "f:a": value });
    }
    value
}

/// Gives `resource` (`kind/name`) in `ns` a managedFields entry nested 200
/// levels deep, as a tenant allowed to patch it can: the API server takes
/// it; a client decoding it stops at 128 levels.
fn make_deep(ns: &str, resource: &str) {
    let (_, api_version, _) =
        common::kubectl(&["get", resource, "-n", ns, "-o", "jsonpath={.apiVersion}"]);
    let entry = json!([{
        "manager": "attacker",
        "operation": "Update",
        "apiVersion": api_version.trim(),
        "fieldsType": "FieldsV1",
        "fieldsV1": { "f:metadata": deep_fields(200) },
    }]);
    let patch = json!([
        {"op": "replace", "path": "/metadata/managedFields", "value": entry},
        {"op": "add", "path": "/metadata/labels", "value": {"deep": "yes"}},
    ]);
    let (ok, _, err) = common::kubectl(&[
        "patch",
        resource,
        "-n",
        ns,
        "--type",
        "json",
        "-p",
        &patch.to_string(),
    ]);
    assert!(ok, "making {resource} deep: {err}");
    let (_, out, _) = common::kubectl(&[
        "get",
        resource,
        "-n",
        ns,
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    assert!(
        out.matches("f:a").count() >= 200,
        "{resource} holds the deep entry"
    );
}

fn apply(manifest: &Value) {
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string());
    assert!(ok, "applying {}: {err}", manifest["metadata"]["name"]);
}

fn sample(ns: &str, name: &str, count: i64) -> Value {
    json!({
        "apiVersion": "nuvolaris.org/v1",
        "kind": "Sample",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"count": count},
    })
}

/// The `.spec.replicas` of the Deployment `name` (-1 when missing).
fn replicas(ns: &str, name: &str) -> i64 {
    let (_, out, _) = common::kubectl(&[
        "get",
        "deployment",
        name,
        "-n",
        ns,
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    out.trim().parse().unwrap_or(-1)
}

async fn healthy(port: u16) -> bool {
    matches!(common::http_get(port, "/healthz").await, Some((200, _)))
}

/// An operator serving every kind in `ns` (and this test's definitions),
/// with its metrics on a port of its own.
fn operator(ns: &str, extra: &[&str]) -> (OperatorProcess, u16) {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut flags = vec!["--metrics-addr", &addr];
    flags.extend(extra);
    (OperatorProcess::spawn(ns, &[], &flags), port)
}

async fn ready(operator: &OperatorProcess, port: u16) {
    common::wait_until(
        TIMEOUT,
        format!("the operator ready; its log:\n{}", operator.log_tail()),
        async || matches!(common::http_get(port, "/readyz").await, Some((200, _))),
    )
    .await;
}

#[tokio::test]
async fn deep_objects_in_every_watched_kind_neither_stop_the_start_nor_any_other_resource() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-deep").await;
    let n = ns.name.as_str();
    // The attacker's objects, made deep before the operator starts.
    apply(&sample(n, "attacker", 1));
    let (ok, _, err) =
        common::kubectl(&["create", "configmap", "bait", "-n", n, "--from-literal=a=b"]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&[
        "create",
        "secret",
        "generic",
        "bait",
        "-n",
        n,
        "--from-literal=a=b",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&["create", "deployment", "bait", "-n", n, "--image=nginx"]);
    assert!(ok, "{err}");
    apply(&json!({
        "apiVersion": "operators.brennerm.github.io/v1",
        "kind": "ExchangeRate",
        "metadata": {"name": "bait", "namespace": n},
        "spec": {"currency": "USD"},
    }));
    for resource in [
        "sample/attacker",
        "configmap/bait",
        "secret/bait",
        "deployment/bait",
        "exchangerate/bait",
    ] {
        make_deep(n, resource);
    }

    let (operator, port) = operator(n, &[]);
    ready(&operator, port).await;
    apply(&sample(n, "victim", 2));
    common::wait_until(TIMEOUT, "the victim's Deployment applied", async || {
        replicas(n, "victim") == 2
    })
    .await;
    // The attacker's own Sample is served too: only its managedFields,
    // which the operator never reads, were hostile.
    common::wait_until(TIMEOUT, "the attacker's Deployment applied", async || {
        replicas(n, "attacker") == 1
    })
    .await;
    // Made deep while the operator runs: its watches go on.
    make_deep(n, "sample/victim");
    apply(&sample(n, "victim", 3));
    common::wait_until(
        Duration::from_secs(15),
        "the victim's change applied within seconds",
        async || replicas(n, "victim") == 3,
    )
    .await;
    assert!(healthy(port).await, "{}", operator.log_tail());
}

#[tokio::test]
async fn big_objects_cost_only_themselves() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-big").await;
    let n = ns.name.as_str();
    let (operator, port) = operator(n, &[]);
    ready(&operator, port).await;
    // The largest annotations the API server takes (256 KiB in all), and a
    // ConfigMap of 1 MiB, which the copyrator's watch reads.
    let mut big = sample(n, "big", 1);
    big["metadata"]["annotations"] = json!({"padding": "x".repeat(250 << 10)});
    let server_side = ["apply", "--server-side", "-f", "-"];
    let (ok, _, err) = common::kubectl_stdin(&server_side, &big.to_string());
    assert!(ok, "{err}");
    let map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "big", "namespace": n},
        "data": {"padding": "x".repeat(1 << 20)},
    });
    let (ok, _, err) = common::kubectl_stdin(&server_side, &map.to_string());
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "the big Sample's Deployment", async || {
        replicas(n, "big") == 1
    })
    .await;
    apply(&sample(n, "other", 2));
    common::wait_until(TIMEOUT, "the other Sample's Deployment", async || {
        replicas(n, "other") == 2
    })
    .await;
    assert!(healthy(port).await, "{}", operator.log_tail());
}

/// A kind folder (`tag` tells it from the test's others) whose
/// `resources/configmap.yaml` is `template`.
fn hostile_kind(ns: &TestNamespace, tag: &str, template: &str) -> GreetingKind {
    let kind = GreetingKind::tagged(ns, tag);
    kind.edit("resources/configmap.yaml", |_| template.to_string());
    kind
}

#[tokio::test]
async fn a_definitions_template_may_not_read_the_environment_recurse_or_throw_values() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-tpl").await;
    let cases = [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ metadata.name }}}\ndata:\n  url: {{ get_env(name='EXCHANGE_RATE_URL') }}\n",
            "calls get_env()",
        ),
        (
            "{% macro m(n) %}{{ self::m(n=n) }}{% endmacro m %}apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ metadata.name }}}\ndata: {x: {{ self::m(n=1) }}}\n",
            "recursion is not allowed",
        ),
        (
            "{{ throw(message=spec.message) }}",
            "throw() needs a literal message",
        ),
    ];
    let kinds: Vec<GreetingKind> = cases
        .iter()
        .enumerate()
        .map(|(i, (template, _))| hostile_kind(&ns, &format!("t{i}"), template))
        .collect();
    // One operator serves them all (they share the test's label).
    let mut flags = kinds[0].flags(&[]);
    let addr = format!("127.0.0.1:{}", common::free_port());
    flags.extend(["--metrics-addr".to_string(), addr.clone()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(
        &ns.name,
        &[(
            "EXCHANGE_RATE_URL",
            "https://secret.example/{base}/{currency}?access_key=SECRET",
        )],
        &flags,
    );
    for (kind, (_, refusal)) in kinds.iter().zip(cases) {
        kind.apply();
        let message = kind
            .wait_message("Accepted", "False", "Invalid", refusal)
            .await;
        assert!(!message.contains("SECRET"), "{message}");
    }
    let _ = operator;
}

/// A definition's CEL is refused when it is accepted, naming the field:
/// a loop in a loop (a tenant sets the number of children), a name the
/// kind file does not give.
#[tokio::test]
async fn a_definitions_cel_may_not_nest_loops_or_read_unknown_names() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-cel").await;
    let cases = [
        (
            "  children:\n    maps: {kind: Deployment}\n  status:\n    - {field: pairs, type: integer, expression: \"maps.filter(a, maps.exists(b, a == b)).size()\"}\n",
            "spec.status[0].expression: comprehensions (all, exists, filter, map) may not nest",
        ),
        (
            "  readiness:\n    - expression: environment.HOME == ''\n",
            "spec.readiness[0].expression: reads \"environment\"",
        ),
    ];
    let kinds: Vec<GreetingKind> = cases
        .iter()
        .enumerate()
        .map(|(i, (extra, _))| {
            let kind = GreetingKind::tagged(&ns, &format!("c{i}"));
            kind.edit("kind.yaml", |text| text + extra);
            kind
        })
        .collect();
    let flags = kinds[0].flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    for (kind, (_, refusal)) in kinds.iter().zip(cases) {
        kind.apply();
        kind.wait_message("Accepted", "False", "Invalid", refusal)
            .await;
    }
    let _ = operator;
}

#[tokio::test]
async fn a_template_that_loops_or_balloons_on_real_input_fails_its_resource_only() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-loop").await;
    // Harmless for the example resource (a message of a few letters),
    // hostile for a long one: three nested ranges of 10,000, or a string
    // doubled forty times.
    let template = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ metadata.name }}}\ndata:\n  message: {{ spec.message }}\n{%- if spec.message is starting_with('loop') %}{% for i in range(end=10000) %}{% for j in range(end=10000) %}{% for k in range(end=10000) %}{% endfor %}{% endfor %}{% endfor %}{% endif %}\n{%- if spec.message is starting_with('grow') %}{% set_global s = spec.message %}{% for i in range(end=40) %}{% set_global s = s ~ s %}{% endfor %}{{ s | length }}{% endif %}\n";
    let kind = hostile_kind(&ns, "loop", template);
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = kind.flags(&["--metrics-addr", &addr, "--template-timeout", "1s"]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    ready(&operator, port).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "looping", "loop forever", json!({}));
    kind.greet(&ns.name, "growing", "grow big", json!({}));
    kind.greet(&ns.name, "fine", "hello", json!({}));
    common::greeting::wait_ready(&kind, &ns.name, "fine").await;
    for (name, limit) in [
        ("looping", "took longer than 1s"),
        ("growing", "render worker died"),
    ] {
        let resource = format!("greetings.{}/{name}", kind.group);
        common::wait_until(
            TIMEOUT,
            format!("{resource} RenderFailed naming {limit:?}"),
            async || {
                let path = r#"jsonpath={.status.conditions[?(@.type=="Ready")]}"#;
                let (_, out, _) = common::kubectl(&["get", &resource, "-n", &ns.name, "-o", path]);
                out.contains("RenderFailed") && out.contains(limit)
            },
        )
        .await;
    }
    assert!(healthy(port).await, "{}", operator.log_tail());
    // Others go on being served while the hostile ones retry.
    kind.greet(&ns.name, "fine", "changed", json!({}));
    common::wait_until(
        Duration::from_secs(20),
        "the fine Greeting's change applied",
        async || common::greeting::config_map_field(&ns.name, "fine", "message") == "changed",
    )
    .await;
    assert!(healthy(port).await, "{}", operator.log_tail());
}

#[tokio::test]
async fn a_definitions_base_may_not_name_a_url() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-url").await;
    let kind = GreetingKind::new(&ns);
    kind.edit("base/kustomization.yaml", |_| {
        "resources: []\nconfigMapGenerator:\n- name: meta\n  files: [token=http://169.254.169.254/latest/meta-data/token]\n".to_string()
    });
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    let message = kind
        .wait_message(
            "Accepted",
            "False",
            "Invalid",
            "configMapGenerator[0].files[0]",
        )
        .await;
    assert!(
        message.contains("may load nothing from elsewhere"),
        "{message}"
    );
}

#[tokio::test]
async fn deleting_a_definition_that_never_served_touches_nothing_of_the_kind_it_names() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-del").await;
    let n = ns.name.as_str();
    // A Sample with its finalizer, served by an operator of Samples.
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _operator = OperatorProcess::spawn(n, &[], &flags);
    apply(&sample(n, "kept", 1));
    common::wait_until(TIMEOUT, "the Sample's Deployment", async || {
        replicas(n, "kept") == 1
    })
    .await;
    let finalizers = || {
        common::kubectl(&[
            "get",
            "sample",
            "kept",
            "-n",
            n,
            "-o",
            "jsonpath={.metadata.finalizers}",
        ])
        .1
    };
    assert!(finalizers().contains("nuvolaris.org"), "{}", finalizers());
    // A definition naming Samples (taken: never served), orphaning on delete.
    kind.apply_with(|definition| {
        definition["spec"]["group"] = json!("nuvolaris.org");
        definition["spec"]["names"] = json!({"kind": "Sample", "plural": "samples"});
        definition["spec"]["onDelete"] = json!("Orphan");
    });
    kind.wait_condition("Accepted", "False", "Clash").await;
    kind.delete().await;
    assert!(
        finalizers().contains("nuvolaris.org"),
        "the Sample kept its finalizer: {}",
        finalizers()
    );
    let (_, events, _) = common::kubectl(&["get", "events", "-A", "-o", "json"]);
    let events: Value = serde_json::from_str(&events).unwrap();
    let naming: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["regarding"]["kind"] == "KindDefinition"
                || e["involvedObject"]["kind"] == "KindDefinition"
        })
        .filter(|e| e.to_string().contains(&format!("{n}/kept")))
        .collect();
    assert!(
        naming.is_empty(),
        "no event of the definition names the Sample: {naming:?}"
    );
}

#[tokio::test]
async fn definitions_past_the_budget_are_refused_and_reach_is_said() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-budget").await;
    let small = GreetingKind::tagged(&ns, "a");
    let cluster = GreetingKind::tagged(&ns, "b");
    cluster.edit("kind.yaml", |text| {
        text.replace("scope: Namespaced", "scope: Cluster")
    });
    cluster.edit("resources/configmap.yaml", |text| {
        text.replace(
            "  name: {{ metadata.name }}",
            "  name: {{ metadata.name }}\n  namespace: default",
        )
    });
    let big = GreetingKind::tagged(&ns, "c");
    big.edit("resources/configmap.yaml", |text| {
        format!("{{# {} #}}\n{text}", "padding ".repeat(8 << 10))
    });
    let flags = small.flags(&["--kind-definitions-budget-kib", "48"]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    small.apply();
    small.wait_condition("Accepted", "True", "Valid").await;
    cluster.apply();
    let granted = cluster
        .wait_condition("RightsGranted", "True", "Granted")
        .await;
    assert!(
        granted.contains("configmaps: in every namespace, kube-system included"),
        "{granted}"
    );
    let reach = |kind: &GreetingKind| kind.definition().unwrap()["status"]["reach"].clone();
    assert_eq!(
        reach(&cluster),
        json!(["configmaps: in every namespace, kube-system included"])
    );
    small
        .wait_condition("RightsGranted", "True", "Granted")
        .await;
    assert!(
        reach(&small)[0]
            .as_str()
            .unwrap()
            .starts_with("nothing beyond")
    );
    big.apply();
    let refused = big.wait_condition("Accepted", "False", "TooLarge").await;
    assert!(
        refused.contains("--kind-definitions-budget of 48 KiB"),
        "{refused}"
    );
    // The others go on being served.
    small.wait_condition("Serving", "True", "Running").await;

    // The revisions a definition keeps count too: 14 KiB of files changed
    // twice keeps three revisions beside the others, past 48 KiB; keeping
    // one revision fits.
    let kept = GreetingKind::tagged(&ns, "d");
    let padding = |letter: &str| letter.repeat(14 << 10);
    kept.edit("resources/configmap.yaml", |text| {
        format!("{{# {} #}}\n{text}", padding("a"))
    });
    let revision = async |number: u64| {
        let what = format!("{} at revision {number}", kept.name);
        common::wait_until(TIMEOUT, &what, async || {
            kept.definition()
                .is_some_and(|d| d["status"]["revision"] == number)
        })
        .await;
    };
    kept.apply();
    revision(1).await;
    kept.edit("resources/configmap.yaml", |t| {
        t.replace(&padding("a"), &padding("b"))
    });
    kept.apply();
    revision(2).await;
    kept.edit("resources/configmap.yaml", |t| {
        t.replace(&padding("b"), &padding("c"))
    });
    kept.apply();
    let refused = (kept.wait_message(
        "Accepted",
        "False",
        "TooLarge",
        "with the revisions it keeps",
    ))
    .await;
    assert!(refused.contains("spec.rollout.keep"), "{refused}");
    kept.apply_with(|d| d["spec"]["rollout"] = json!({"keep": 1}));
    revision(3).await;
    kept.wait_condition("Accepted", "True", "Valid").await;
}

#[tokio::test]
async fn a_status_field_of_the_wrong_type_is_left_out_not_the_whole_status() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-status").await;
    let kind = GreetingKind::new(&ns);
    // Each Greeting gets a Deployment too. `replicas` fits its type;
    // `deploymentConditions` (a list) does not: the API server would refuse the
    // status written whole.
    std::fs::write(
        kind.folder.join("resources/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: {{ metadata.name }}}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: {{ metadata.name }}}}\n  template:\n    metadata: {labels: {app: {{ metadata.name }}}}\n    spec: {containers: [{name: web, image: nginx}]}\n",
    )
    .unwrap();
    let from = r#"from: {kind: Deployment, name: "{{ metadata.name }}"}"#;
    kind.edit("kind.yaml", |text| {
        format!(
            "{}  status:\n    - {{field: replicas, type: integer, {from}, path: .status.replicas}}\n    - {{field: deploymentConditions, type: string, {from}, path: .status.conditions}}\n",
            text.replace("      - template: configmap.yaml", "      - template: configmap.yaml\n      - template: deployment.yaml")
        )
    });
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "hello", "hi there", json!({}));
    let resource = format!("greetings.{}/hello", kind.group);
    let status = common::wait_for(
        TIMEOUT,
        "the Greeting's status with its field",
        async || {
            let (_, out, _) = common::kubectl(&["get", &resource, "-n", &ns.name, "-o", "json"]);
            let object: Value = serde_json::from_str(&out).map_err(|_| out.clone())?;
            let status = object["status"].clone();
            let ready = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready")
                .cloned()
                .unwrap_or_default();
            let named = ready["message"]
                .as_str()
                .unwrap_or_default()
                .contains("status.deploymentConditions");
            if status["replicas"] == 1 && named {
                Ok(status)
            } else {
                Err(status)
            }
        },
    )
    .await;
    assert!(status.get("deploymentConditions").is_none(), "{status}");
}

#[tokio::test]
async fn a_cluster_scoped_definitions_rights_and_reach_are_those_of_its_writer() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-reach").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    kind.edit("kind.yaml", |text| {
        text.replace("scope: Namespaced", "scope: Cluster")
    });
    kind.edit("resources/configmap.yaml", |text| {
        text.replace(
            "  name: {{ metadata.name }}",
            &format!("  name: {{{{ metadata.name }}}}\n  namespace: {n}"),
        )
    });
    // The writer may write ConfigMaps in the test's namespace only.
    let (ok, _, err) = common::kubectl(&["create", "serviceaccount", "cluster-writer", "-n", n]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&[
        "create",
        "rolebinding",
        "cluster-writer",
        "-n",
        n,
        "--clusterrole=edit",
        &format!("--serviceaccount={n}:cluster-writer"),
    ]);
    assert!(ok, "{err}");
    let account = format!("{n}/cluster-writer");
    let flags = kind.flags(&["--default-service-account", "kustomize-writer"]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // Without an account for cluster-scoped kinds, a tenant-writing install refuses them.
    {
        let _operator = OperatorProcess::spawn(n, &[], &flags);
        kind.apply();
        kind.wait_message(
            "RightsGranted",
            "False",
            "MissingRights",
            "--cluster-service-account",
        )
        .await;
    }
    let mut flags = flags;
    flags.extend(["--cluster-service-account", &account]);
    let _operator = OperatorProcess::spawn(n, &[], &flags);
    let user = format!("system:serviceaccount:{n}:cluster-writer");
    let missing = kind
        .wait_message(
            "RightsGranted",
            "False",
            "MissingRights",
            &format!("({user}) create configmaps"),
        )
        .await;
    assert!(missing.contains(&format!("written as {user}")), "{missing}");
    let reach = kind.definition().unwrap()["status"]["reach"].clone();
    assert_eq!(
        reach,
        json!(["configmaps: only in namespaces that grant it"])
    );
    // Granted cluster-wide: the next look (every 10 s while False) says so.
    let binding = format!("{n}-cluster-writer");
    let (ok, _, err) = common::kubectl(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=edit",
        &format!("--serviceaccount={n}:cluster-writer"),
    ]);
    assert!(ok, "{err}");
    let _unbind = Unbind(binding);
    kind.wait_condition("RightsGranted", "True", "Granted")
        .await;
    let reach = kind.definition().unwrap()["status"]["reach"].clone();
    assert_eq!(
        reach,
        json!(["configmaps: in every namespace, kube-system included"])
    );
}

/// Deletes a ClusterRoleBinding when dropped.
struct Unbind(String);

impl Drop for Unbind {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "clusterrolebinding", &self.0, "--wait=false"]);
    }
}

/// A Greeting kind (`tag`) whose status field `joined` is the shape of
/// issue 58's finding 4: one `filter` over `spec.items`, each item joined
/// to the string `spec.big`; `bounds` are the two fields' schema keywords.
fn costly_kind(ns: &TestNamespace, tag: &str, bounds: (&str, &str)) -> GreetingKind {
    let kind = GreetingKind::tagged(ns, tag);
    let language = "      language: {type: string, enum: [en, it], default: en}\n";
    let fields = format!(
        "{language}      items: {{type: array, {}items: {{type: string, maxLength: 16}}}}\n      big: {{type: string{}}}\n",
        bounds.0, bounds.1
    );
    let expression = "spec.items.filter(i, (i + spec.big).size() > 0).size()";
    kind.edit("kind.yaml", |text| {
        text.replace(language, &fields)
            + &format!(
                "  status:\n    - {{field: joined, type: integer, expression: {expression:?}}}\n"
            )
    });
    kind
}

/// The `Ready` condition of `resource` (`kind/name`) in `ns`, as JSON.
fn ready_condition(ns: &str, resource: &str) -> Value {
    let path = r#"jsonpath={.status.conditions[?(@.type=="Ready")]}"#;
    let (_, out, _) = common::kubectl(&["get", resource, "-n", ns, "-o", path]);
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

/// Issue 58, finding 4: a status expression whose cost a tenant's spec
/// decides (a `filter` over 300 items, each joined to a long string) is
/// refused when its kind loads if nothing bounds its inputs. With bounds
/// that fit the estimate, an input too costly to evaluate leaves its two
/// resources `OverBudget` (naming the field and the budget) — while a
/// Sample of another namespace becomes Ready within 20 s, `/healthz`
/// answers, and the costly resources are deleted.
#[tokio::test]
async fn a_costly_cel_expression_is_refused_at_load_or_over_budget_at_run_and_costs_only_its_resources()
 {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-cost").await;
    let other = TestNamespace::new(&client, "hostile-cost-other").await;
    let unbounded = costly_kind(&ns, "u", ("", ""));
    let bounded = costly_kind(&ns, "b", ("maxItems: 300, ", ", maxLength: 40000"));
    // One operator for every namespace, serving this test's shard only.
    let shard = ns.name.clone();
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = bounded.flags(&["--shard", &shard, "--metrics-addr", &addr]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn_all_namespaces(&[], &flags);
    ready(&operator, port).await;

    // (a) Nothing bounds the inputs: refused when the kind loads.
    unbounded.apply();
    let refused = unbounded
        .wait_message(
            "Accepted",
            "False",
            "Invalid",
            "spec.status[0].expression: its estimated cost, ",
        )
        .await;
    for part in [
        "over the limit of 10,000,000",
        "maxItems to spec.items",
        "maxLength to spec.big",
    ] {
        assert!(refused.contains(part), "{part:?} in {refused}");
    }

    // (b) Bounds that fit the estimate, an input at them: over the budget
    // of one evaluation when it runs.
    bounded.apply();
    bounded.wait_condition("Serving", "True", "Running").await;
    let labels = json!({"kustomize-operator.io/shard": shard});
    let hostile = ["costly-1", "costly-2"];
    for name in hostile {
        apply(&json!({
            "apiVersion": format!("{}/v1", bounded.group),
            "kind": "Greeting",
            "metadata": {"name": name, "namespace": ns.name, "labels": labels},
            "spec": {"message": "hi", "items": vec!["x".repeat(16); 300], "big": "y".repeat(40_000)},
        }));
    }
    let mut web = sample(&other.name, "web", 1);
    web["metadata"]["labels"] = labels.clone();
    let created = std::time::Instant::now();
    apply(&web);
    common::wait_until(
        Duration::from_secs(20),
        "the other namespace's Sample Ready",
        async || ready_condition(&other.name, "sample/web")["status"] == "True",
    )
    .await;
    let took = created.elapsed();
    for name in hostile {
        let resource = format!("greetings.{}/{name}", bounded.group);
        let ready = common::wait_for(TIMEOUT, format!("{resource} OverBudget"), async || {
            let ready = ready_condition(&ns.name, &resource);
            if ready["reason"] == "OverBudget" {
                Ok(ready)
            } else {
                Err(ready)
            }
        })
        .await;
        assert_eq!(ready["status"], "False", "{ready}");
        let message = ready["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("spec.status[0].expression: ")
                && message.contains("over the limit of 1,000,000 for one evaluation"),
            "{message}"
        );
        assert!(
            common::has_event(&client, &ns.name, name, "OverBudget").await,
            "a Warning event for {name}"
        );
    }
    assert!(healthy(port).await, "{}", operator.log_tail());
    eprintln!("the other namespace's Sample was Ready {took:?} after it was created");

    // They are deleted: deletion evaluates nothing.
    let resources: Vec<String> = (hostile.iter())
        .map(|name| format!("greetings.{}/{name}", bounded.group))
        .collect();
    let mut delete = vec!["delete", "-n", &ns.name, "--timeout=60s"];
    delete.extend(resources.iter().map(String::as_str));
    let (ok, _, err) = common::kubectl(&delete);
    assert!(
        ok,
        "deleting the costly Greetings: {err}\n{}",
        operator.log_tail()
    );
    assert!(healthy(port).await, "{}", operator.log_tail());
}
