//! Hostile input: what one tenant writes or one definition declares costs
//! only itself. Each test puts something hostile in the operator's way
//! and asserts that the operator stays up (`/healthz`), and that another
//! resource is served after it (a Sample applied then gets its Deployment:
//! [`still_serving`]), while the hostile one is refused with a reason that
//! names the limit.

use ko_test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::greeting::{GreetingKind, ReadsAt};
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

/// The operator whose metrics are on `port` is up (`/healthz`) and serves
/// another resource: the Sample `name`, applied now in `ns`, gets its
/// Deployment.
async fn still_serving(operator: &OperatorProcess, port: u16, ns: &str, name: &str) {
    assert!(healthy(port).await, "{}", operator.log_tail());
    apply(&sample(ns, name, 2));
    common::wait_until(
        TIMEOUT,
        format!(
            "the Sample {name}'s Deployment applied; the operator's log:\n{}",
            operator.log_tail()
        ),
        async || replicas(ns, name) == 2,
    )
    .await;
    assert!(healthy(port).await, "{}", operator.log_tail());
}

/// `--metrics-addr` on a free loopback port: the flag and the port.
fn metrics_flag() -> (String, u16) {
    let port = common::free_port();
    (format!("--metrics-addr=127.0.0.1:{port}"), port)
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
        TIMEOUT,
        "the victim's change, made after it went deep, applied",
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
    let (metrics, port) = metrics_flag();
    let flags = kinds[0].flags(&[&metrics]);
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
    still_serving(&operator, port, &ns.name, "other").await;
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
    let (metrics, port) = metrics_flag();
    let flags = kinds[0].flags(&[&metrics]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    for (kind, (_, refusal)) in kinds.iter().zip(cases) {
        kind.apply();
        kind.wait_message("Accepted", "False", "Invalid", refusal)
            .await;
    }
    still_serving(&operator, port, &ns.name, "other").await;
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
    // Others go on being served while the hostile ones retry: the fine
    // Greeting's change is applied after both were refused, and they are
    // refused still.
    kind.greet(&ns.name, "fine", "changed", json!({}));
    common::wait_until(TIMEOUT, "the fine Greeting's change applied", async || {
        common::greeting::config_map_field(&ns.name, "fine", "message") == "changed"
    })
    .await;
    for name in ["looping", "growing"] {
        let resource = format!("greetings.{}/{name}", kind.group);
        let path = r#"jsonpath={.status.conditions[?(@.type=="Ready")].reason}"#;
        let (_, reason, _) = common::kubectl(&["get", &resource, "-n", &ns.name, "-o", path]);
        assert_eq!(reason.trim(), "RenderFailed", "{resource}");
    }
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
    let (metrics, port) = metrics_flag();
    let flags = kind.flags(&[&metrics]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
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
    still_serving(&operator, port, &ns.name, "other").await;
}

#[tokio::test]
async fn deleting_a_definition_that_never_served_touches_nothing_of_the_kind_it_names() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-del").await;
    let n = ns.name.as_str();
    // A Sample with its finalizer, served by an operator of Samples.
    let kind = GreetingKind::new(&ns);
    let (metrics, port) = metrics_flag();
    let flags = kind.flags(&[&metrics]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(n, &[], &flags);
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
    still_serving(&operator, port, n, "other").await;
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
    let (metrics, port) = metrics_flag();
    let flags = small.flags(&["--kind-definitions-budget-kib", "48", &metrics]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
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
    still_serving(&operator, port, &ns.name, "other").await;
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
    let (metrics, port) = metrics_flag();
    let flags = kind.flags(&[&metrics]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
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
    still_serving(&operator, port, &ns.name, "other").await;
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
    let (metrics, port) = metrics_flag();
    let mut flags = flags;
    flags.extend(["--cluster-service-account", &account, &metrics]);
    let operator = OperatorProcess::spawn(n, &[], &flags);
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
    // A Sample, which writes as its namespace's `kustomize-writer`.
    let (ok, _, err) = common::kubectl(&["create", "serviceaccount", "kustomize-writer", "-n", n]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&[
        "create",
        "rolebinding",
        "kustomize-writer",
        "-n",
        n,
        "--clusterrole=edit",
        &format!("--serviceaccount={n}:kustomize-writer"),
    ]);
    assert!(ok, "{err}");
    still_serving(&operator, port, n, "other").await;
}

/// Deletes a ClusterRoleBinding when dropped.
struct Unbind(String);

impl Drop for Unbind {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "clusterrolebinding", &self.0, "--wait=false"]);
    }
}

/// Waits until the definition's `status.<field>` is `want`.
async fn wait_definition_status(kind: &GreetingKind, field: &str, want: Value) {
    let what = format!("{} status.{field} = {want}", kind.name);
    common::wait_for(TIMEOUT, what, async || {
        let seen = kind.definition().unwrap_or_default()["status"][field].clone();
        if seen == want { Ok(()) } else { Err(seen) }
    })
    .await;
}

/// The Greeting `name` in `ns`, as JSON (`Null` when missing).
fn greeting(kind: &GreetingKind, ns: &str, name: &str) -> Value {
    let resource = format!("{}/{name}", kind.crd());
    let (_, out, _) = common::kubectl(&["get", &resource, "-n", ns, "-o", "json"]);
    serde_json::from_str(&out).unwrap_or_default()
}

/// Waits until the Greeting's condition `type_` is `status` with `reason`;
/// its message.
async fn wait_greeting_condition(
    kind: &GreetingKind,
    ns: &str,
    name: &str,
    (type_, status, reason): (&str, &str, &str),
) -> String {
    let what = format!("{ns}/{name} {type_}={status} ({reason})");
    common::wait_for(TIMEOUT, what, async || {
        let conditions = greeting(kind, ns, name)["status"]["conditions"].clone();
        let found = conditions
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_ && c["status"] == status && c["reason"] == reason);
        match found {
            Some(c) => Ok(c["message"].as_str().unwrap_or_default().to_string()),
            None => Err(conditions),
        }
    })
    .await
}

/// Waits until the Greeting is served by `revision` (its status says so)
/// and its ConfigMap's `field` is `value`.
async fn wait_served_by(
    kind: &GreetingKind,
    ns: &str,
    name: &str,
    revision: u32,
    field: (&str, &str),
) {
    let what = format!(
        "{ns}/{name} on revision {revision}, data.{} = {:?}",
        field.0, field.1
    );
    common::wait_for(TIMEOUT, what, async || {
        let on = greeting(kind, ns, name)["status"]["revision"].clone();
        let value = common::greeting::config_map_field(ns, name, field.0);
        if on == json!(revision) && value == field.1 {
            Ok(())
        } else {
            Err((on, value))
        }
    })
    .await;
}

/// Labels the Greeting `name` with the pin `revision`, as the admin.
fn pin(kind: &GreetingKind, ns: &str, name: &str, revision: &str) {
    let resource = format!("{}/{name}", kind.crd());
    let label = format!("kustomize-operator.io/revision={revision}");
    let (ok, _, err) = common::kubectl(&["label", &resource, "-n", ns, &label, "--overwrite"]);
    assert!(ok, "pinning {name} to {revision}: {err}");
}

/// Writes `status.pinnable` of the definition as anyone with
/// kinddefinitions/status rights can, while its operator is stopped: the
/// revision guard, where it is installed, admits what the status lists;
/// the operator decides from the spec alone.
fn widen_pins(kind: &GreetingKind, revisions: &[u32]) {
    let patch = json!({"status": {"pinnable": revisions}}).to_string();
    let (ok, _, err) = common::kubectl(&[
        "patch",
        "kinddefinition",
        &kind.name,
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
    assert!(ok, "writing status.pinnable: {err}");
}

/// The events about the Greeting `name` with `reason`: their messages.
fn greeting_events(ns: &str, name: &str, reason: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={name},reason={reason}");
    let (ok, out, err) = common::kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        &selector,
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    assert!(ok, "listing events: {err}");
    out.lines().map(str::to_string).collect()
}

/// The revision guard of deploy/admission, installed for one namespace
/// (its binding selects that namespace alone, so other tests' pins are not
/// checked), deleted when dropped.
struct RevisionGuard(tempfile::NamedTempFile);

impl RevisionGuard {
    fn install(ns: &str) -> Self {
        let docs = common::kustomize_documents("deploy/admission");
        let name = "kustomize-operator-revision-guard";
        let mine = format!("{name}-{ns}");
        let mut objects: Vec<Value> = docs
            .into_iter()
            .filter(|d| d["metadata"]["name"] == name)
            .collect();
        assert_eq!(objects.len(), 2, "the revision guard and its binding");
        for object in &mut objects {
            object["metadata"]["name"] = json!(mine);
            if object["kind"] == "ValidatingAdmissionPolicyBinding" {
                object["spec"]["policyName"] = json!(mine);
                object["spec"]["matchResources"] = json!({"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": ns}
                }});
            }
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        std::fs::write(file.path(), list.to_string()).unwrap();
        let (ok, _, err) = common::kubectl(&["apply", "-f", &file.path().display().to_string()]);
        assert!(ok, "installing the revision guard: {err}");
        Self(file)
    }
}

impl Drop for RevisionGuard {
    fn drop(&mut self) {
        let file = self.0.path().display().to_string();
        let _ = common::kubectl(&["delete", "-f", &file, "--ignore-not-found", "--wait=false"]);
    }
}

/// A tenant of `ns`: a ServiceAccount that may write the kind's resources
/// there and nothing else, acting with its own token.
struct Tenant {
    token: common::TokenKubeconfig,
    user: String,
}

impl Tenant {
    async fn new(client: &kube::Client, ns: &str, kind: &GreetingKind) -> Self {
        let account = "tenant";
        let grants = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": account, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": account, "namespace": ns},
             "rules": [{"apiGroups": [kind.group], "resources": ["greetings"],
                        "verbs": ["create", "get", "list", "update", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": account, "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]},
        ]});
        let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &grants.to_string());
        assert!(ok, "the tenant's grants: {err}");
        let token = common::TokenKubeconfig::mint(client, ns, account).await;
        let resource = kind.crd();
        common::wait_until(TIMEOUT, "the tenant may patch Greetings", async || {
            token.can_i(&["patch", &resource, "-n", ns])
        })
        .await;
        let user = format!("system:serviceaccount:{ns}:{account}");
        Self { token, user }
    }

    /// kubectl with the tenant's token.
    fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let kubeconfig = self.token.path().display().to_string();
        let mut argv = vec!["--kubeconfig", kubeconfig.as_str()];
        argv.extend_from_slice(args);
        common::kubectl(&argv)
    }

    /// Creates (`--dry-run=server` if `dry`) the Greeting `name` pinned to
    /// `revision`, as the tenant.
    fn create_pinned(
        &self,
        kind: &GreetingKind,
        ns: &str,
        name: &str,
        revision: &str,
        dry: bool,
    ) -> (bool, String) {
        let greeting = json!({
            "apiVersion": format!("{}/v1", kind.group),
            "kind": "Greeting",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"kustomize-operator.io/revision": revision}},
            "spec": {"message": "hi"},
        });
        let kubeconfig = self.token.path().display().to_string();
        let mut args = vec!["--kubeconfig", kubeconfig.as_str(), "create", "-f", "-"];
        if dry {
            args.push("--dry-run=server");
        }
        let (ok, _, err) = common::kubectl_stdin(&args, &greeting.to_string());
        (ok, err)
    }
}

/// Issue 58, finding 5: a tenant labelled her resource with revision 1 and
/// got back what revision 2 had removed. A pin the definition does not
/// allow (only the stable, the latest and those `pinnable` names) is
/// refused at admission where the revision guard is installed, and
/// without it (or past it: the guard reads a status anyone with /status
/// rights could widen) the operator reports it `InvalidSpec` and renders
/// nothing from that revision. A withdrawn revision's resources move to
/// the stable one, and `pinBy: Granted` lets only those granted `pin`.
#[tokio::test]
async fn a_pin_the_definition_does_not_allow_is_refused_at_admission_and_never_served() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-pin").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    // Revision 1 sets what revision 2 removes (as a hostNetwork: true).
    let language = "  language: {{ spec.language }}";
    let legacy = "\n  legacy: \"yes\"";
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(language, &format!("{language}{legacy}"))
    });
    let flags = kind.flags(&["--operator-namespace", n]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(n, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.edit("resources/configmap.yaml", |t| t.replace(legacy, ""));
    kind.apply();
    wait_definition_status(&kind, "revision", json!(2)).await;
    kind.greet(n, "web", "hi", json!({}));
    wait_served_by(&kind, n, "web", 2, ("message", "hi")).await;
    assert_eq!(common::greeting::config_map_field(n, "web", "legacy"), "");

    // Pinned to revision 1, past any guard: refused, nothing rendered by it.
    drop(operator);
    widen_pins(&kind, &[1, 2]);
    pin(&kind, n, "web", "1");
    let operator = OperatorProcess::spawn(n, &[], &flags);
    let refused = wait_greeting_condition(&kind, n, "web", ("Ready", "False", "InvalidSpec")).await;
    assert!(
        refused.contains(r#"the label kustomize-operator.io/revision="1" pins revision 1"#)
            && refused.contains("(pinnable: 2:"),
        "{refused}"
    );
    assert_eq!(
        common::greeting::config_map_field(n, "web", "legacy"),
        "",
        "revision 1's objects came back"
    );
    assert_eq!(
        common::greeting::config_map_field(n, "web", "message"),
        "hi"
    );
    let events = greeting_events(n, "web", "InvalidSpec");
    assert!(
        events.iter().any(|e| e.contains("pins revision 1")),
        "{events:?}"
    );
    wait_definition_status(&kind, "pinnable", json!([2])).await;

    // Made pinnable, it serves; withdrawn, its resource moves to the stable
    // one (told), and it may not be made stable.
    kind.roll_out(json!({"pinnable": [1]}));
    wait_served_by(&kind, n, "web", 1, ("legacy", "yes")).await;
    kind.roll_out(json!({"pinnable": [1], "withdrawn": [1]}));
    wait_served_by(&kind, n, "web", 2, ("legacy", "")).await;
    let events = greeting_events(n, "web", "RevisionWithdrawn");
    assert!(
        events
            .iter()
            .any(|e| e.contains("served by the stable revision 2")),
        "{events:?}"
    );
    wait_definition_status(&kind, "pinnable", json!([2])).await;
    kind.roll_out(json!({"stable": 1}));
    let withdrawn = kind
        .wait_condition("Accepted", "False", "RevisionWithdrawn")
        .await;
    assert!(
        withdrawn.contains("spec.rollout.stable 1 is withdrawn"),
        "{withdrawn}"
    );
    assert_eq!(greeting(&kind, n, "web")["status"]["revision"], json!(2));
    kind.roll_out(json!({"stable": null}));
    kind.wait_condition("Accepted", "True", "Valid").await;

    // With the guard: the tenant's pin is checked before it is stored.
    let _guard = RevisionGuard::install(n);
    let tenant = Tenant::new(&client, n, &kind).await;
    common::wait_until(
        TIMEOUT,
        "the revision guard refusing a pin to 1",
        async || {
            let (ok, err) = tenant.create_pinned(&kind, n, "canary", "1", true);
            !ok && err.contains("does not let resources pin")
        },
    )
    .await;
    kind.greet(n, "shop", "hi", json!({}));
    let resource = format!("{}/shop", kind.crd());
    let label = "kustomize-operator.io/revision=1";
    let (ok, _, err) = tenant.kubectl(&["label", &resource, "-n", n, label]);
    assert!(!ok, "the tenant pinned shop to revision 1");
    assert!(
        err.contains("revision-guard")
            && err.contains(r#"the label kustomize-operator.io/revision="1" of Greeting"#)
            && err.contains("(pinnable: 2:"),
        "{err}"
    );
    assert!(greeting(&kind, n, "shop")["metadata"]["labels"].is_null());
    let (ok, _, err) = tenant.kubectl(&[
        "label",
        &resource,
        "-n",
        n,
        "kustomize-operator.io/revision=2",
    ]);
    assert!(ok, "the tenant may pin the stable revision: {err}");

    // pinBy: Granted: only with the verb pin on the definition.
    kind.roll_out(json!({"pinBy": "Granted"}));
    let refused =
        common::wait_for(
            TIMEOUT,
            "the guard refusing an ungranted pin",
            async || match tenant.create_pinned(&kind, n, "mine", "2", true) {
                (false, err) if err.contains("may not pin") => Ok(err),
                other => Err(other),
            },
        )
        .await;
    assert!(
        refused.contains(&format!("user {} may not pin", tenant.user)),
        "{refused}"
    );
    let role = format!("{n}-pin");
    let grant = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"apiGroups": ["kustomize-operator.io"], "resources": ["kinddefinitions"],
                    "resourceNames": [kind.name], "verbs": ["pin"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": n}]},
    ]});
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &grant.to_string());
    assert!(ok, "granting pin: {err}");
    let _ungrant = Ungrant(role);
    let granted = format!("kinddefinitions.kustomize-operator.io/{}", kind.name);
    common::wait_until(TIMEOUT, "the tenant granted pin", async || {
        tenant.token.can_i(&["pin", &granted])
    })
    .await;
    let (ok, err) = tenant.create_pinned(&kind, n, "mine", "2", false);
    assert!(ok, "granted, the tenant may pin: {err}");

    for name in ["web", "shop", "mine"] {
        common::kubectl(&["delete", &kind.crd(), name, "-n", n]);
    }
    kind.delete().await;
    drop(operator);
}

/// Deletes a ClusterRole and its ClusterRoleBinding of one name when dropped.
struct Ungrant(String);

impl Drop for Ungrant {
    fn drop(&mut self) {
        for kind in ["clusterrolebinding", "clusterrole"] {
            let _ = common::kubectl(&["delete", kind, &self.0, "--wait=false"]);
        }
    }
}

/// Issue 58, finding 6: a ControllerRevision written into the operator's
/// namespace (revision 2's labels, owner and signature copied, its
/// template changed, numbered 7) was restored at start and served. A
/// restarted operator serves only revisions it signed and recorded: the
/// forged one is refused, said on the definition, and served neither by a
/// pin nor by `spec.rollout.stable: 7`.
#[tokio::test]
async fn a_forged_revision_is_not_served_after_a_restart_by_pin_or_by_stable() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-forged").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&["--operator-namespace", n]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(n, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let language = "  language: {{ spec.language }}";
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            language,
            &format!("{language}\n  shout: {{{{ spec.message | upper }}}}"),
        )
    });
    kind.apply();
    wait_definition_status(&kind, "revision", json!(2)).await;
    for name in ["web", "pinned"] {
        kind.greet(n, name, "hi", json!({}));
        wait_served_by(&kind, n, name, 2, ("shout", "HI")).await;
    }
    drop(operator);

    // The forgery: revision 2's object, its template changed, numbered 7.
    let genuine = format!("kinddefinition-{}-2", kind.name);
    let (ok, out, err) =
        common::kubectl(&["get", "controllerrevision", &genuine, "-n", n, "-o", "json"]);
    assert!(ok, "{err}");
    let original: Value = serde_json::from_str(&out).unwrap();
    let forged_name = format!("kinddefinition-{}-7", kind.name);
    let mut data = original["data"].clone();
    let file = &mut data["spec"]["files"]["resources/configmap.yaml"];
    let text = file
        .as_str()
        .unwrap()
        .replace(language, &format!("{language}\n  forged: \"yes\""));
    *file = json!(text);
    data["digest"] = json!(kustomize_operator::definitions::generation::digest(
        &data["spec"]
    ));
    let forged = json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": forged_name,
            "namespace": n,
            "labels": original["metadata"]["labels"],
            "ownerReferences": original["metadata"]["ownerReferences"],
        },
        "revision": 7,
        "data": data,
    });
    let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &forged.to_string());
    assert!(ok, "writing the forged revision: {err}");
    // Pinned to it (past any guard: see widen_pins).
    widen_pins(&kind, &[2, 7]);
    pin(&kind, n, "pinned", "7");

    let operator = OperatorProcess::spawn(n, &[], &flags);
    let said = kind
        .wait_message(
            "RevisionsVerified",
            "False",
            "RevisionRefused",
            "revision 7",
        )
        .await;
    assert!(
        said.contains(&format!("ControllerRevision {n}/{forged_name}"))
            && said.contains("signature is not the operator's"),
        "{said}"
    );
    let refused =
        wait_greeting_condition(&kind, n, "pinned", ("Ready", "False", "InvalidSpec")).await;
    assert!(
        refused.contains("names revision 7, which the operator refused"),
        "{refused}"
    );
    assert_eq!(
        common::greeting::config_map_field(n, "pinned", "forged"),
        ""
    );
    assert_eq!(
        common::greeting::config_map_field(n, "pinned", "shout"),
        "HI"
    );
    // The genuine revisions are served, recorded whole.
    let status = kind.definition().unwrap()["status"].clone();
    let kept: Vec<(Value, usize)> = (status["revisions"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["revision"].clone(),
                r["digest"].as_str().unwrap_or_default().len(),
            )
        })
        .collect();
    assert_eq!(kept, [(json!(1), 64), (json!(2), 64)]);

    // Nor by spec.rollout.stable: refused, what served keeps serving.
    kind.roll_out(json!({"stable": 7}));
    let refused = kind
        .wait_condition("Accepted", "False", "RevisionRefused")
        .await;
    assert!(
        refused.contains("spec.rollout.stable 7 names revision 7")
            && refused.contains("what served before keeps serving (stable revision 2)"),
        "{refused}"
    );
    assert_eq!(greeting(&kind, n, "web")["status"]["revision"], json!(2));
    assert_eq!(common::greeting::config_map_field(n, "web", "forged"), "");
    kind.roll_out(json!({"stable": null}));

    for name in ["web", "pinned"] {
        common::kubectl(&["delete", &kind.crd(), name, "-n", n]);
    }
    kind.delete().await;
    drop(operator);
}

/// The resident memory of process `pid` now and at its peak (VmRSS and
/// VmHWM), in MiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name));
        let kib = line.and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
        kib.unwrap_or_default() >> 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// What a crowd of clients that stall their reviews achieved: heads sent,
/// and bodies sent whole but for their last byte.
#[derive(Default)]
struct Stalling {
    heads: std::sync::atomic::AtomicUsize,
    stalled: std::sync::atomic::AtomicUsize,
}

/// One client, again and again until aborted: a review announcing
/// `announced` bytes, sent but for its last byte, held until the webhook
/// drops it (or refused at once), then a pause.
async fn stall_a_review(port: u16, ca: String, announced: usize, seen: Arc<Stalling>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let chunk = vec![b' '; 1 << 20];
    loop {
        if let Ok(mut tls) = common::webhook::connect(port, &ca).await {
            let head = format!(
                "POST /convert HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {announced}\r\n\r\n"
            );
            if tls.write_all(head.as_bytes()).await.is_ok() {
                seen.heads.fetch_add(1, Ordering::Relaxed);
                let mut sent = 0;
                while sent < announced - 1 {
                    let n = chunk.len().min(announced - 1 - sent);
                    if tls.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                    sent += n;
                }
                if sent == announced - 1 {
                    seen.stalled.fetch_add(1, Ordering::Relaxed);
                }
                // Held until the webhook answers or drops it.
                let mut answer = Vec::new();
                let _ = tls.read_to_end(&mut answer).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn stalled_reviews_of_64_mib_keep_the_webhooks_memory_bounded_and_lists_go_on() {
    use std::sync::atomic::Ordering;
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-webhook").await;
    let kind = GreetingKind::new(&ns);
    let metrics = common::free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let flags = kind.webhook_flags(&["--metrics-addr", &metrics_addr]);
    let webhook = GreetingKind::webhook_port(&flags);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env = [("NAMESPACE", ns.name.as_str())];
    let operator = OperatorProcess::spawn(&ns.name, &env, &flags);
    kind.serve_at_v2().await;
    // Stored at v2: a list at v1 converts it through the webhook.
    kind.write_at(&ns.name, "v2", "stored", json!({"text": "hello v2"}));
    let at_v1 = || kind.greeting_at(&ns.name, "v1", "stored")["spec"]["message"].clone();
    assert_eq!(at_v1(), "hello v2");
    let (idle, _) = memory(operator.pid());

    let ca = common::webhook::ca_of(&kind.crd());
    // Twelve announcing 64 MiB, more than any review read, and twelve the
    // largest review read (8 MiB, docs/security.md), each stalling one
    // byte short, again and again.
    let (huge, largest) = (Arc::new(Stalling::default()), Arc::new(Stalling::default()));
    let crowd: Vec<_> = (0..12)
        .flat_map(|_| {
            [
                tokio::spawn(stall_a_review(webhook, ca.clone(), 64 << 20, huge.clone())),
                tokio::spawn(stall_a_review(
                    webhook,
                    ca.clone(),
                    8 << 20,
                    largest.clone(),
                )),
            ]
        })
        .collect();
    common::wait_until(
        TIMEOUT,
        "twelve heads of 64 MiB sent, a body of 8 MiB stalled",
        async || {
            huge.heads.load(Ordering::Relaxed) >= 12 && largest.stalled.load(Ordering::Relaxed) >= 1
        },
    )
    .await;
    let reader = ReadsAt::start(format!("greetings.v1.{}", kind.group), ns.name.clone());
    assert_eq!(at_v1(), "hello v2", "listed at v1 under the attack");
    assert!(healthy(metrics).await, "/healthz under the attack");
    // Past the deadline of the first stalled body: the crowd takes the
    // room again, and the lists go on; memory stays within bounds all the
    // while.
    let dropped = largest.stalled.load(Ordering::Relaxed) + 1;
    let bounded = || {
        let (_, peak) = memory(operator.pid());
        assert!(
            peak <= idle + 128,
            "peak {peak} MiB, more than 128 MiB above idle ({idle} MiB)"
        );
        peak
    };
    common::wait_until(
        TIMEOUT,
        "a stalled body dropped and another stalled",
        async || {
            bounded();
            largest.stalled.load(Ordering::Relaxed) >= dropped
        },
    )
    .await;
    assert_eq!(at_v1(), "hello v2");
    assert!(healthy(metrics).await, "/healthz under the attack");
    let peak = bounded();
    for client in crowd {
        client.abort();
    }
    let (reads, failed) = reader.stop().await;
    eprintln!(
        "webhook under stalled reviews of 64 and 8 MiB: idle {idle} MiB, peak {peak} MiB; {reads} lists at v1"
    );
    assert!(
        failed.is_empty(),
        "{} of {reads} lists failed: {failed:?}",
        failed.len()
    );
    common::kubectl(&["delete", &kind.crd(), "stored", "-n", &ns.name]);
    kind.delete().await;
}

/// Gives the Greeting a `size` (v1), then, with `up` set, makes it v2:
/// `replicas`, a required integer, computed from a v1 object by `up`
/// (CEL), and v1 still served through the operator's webhook.
fn sized(kind: &GreetingKind, up: Option<&str>) {
    let language = "      language: {type: string, enum: [en, it], default: en}\n";
    kind.edit("kind.yaml", |t| {
        if t.contains("size:") {
            return t;
        }
        t.replace(
            language,
            &format!("{language}      size: {{type: string}}\n"),
        )
    });
    let Some(up) = up else { return };
    kind.edit("kind.yaml", |t| {
        let hub = t.replace(
            "    required: [message]\n    properties:\n",
            "    required: [message, replicas]\n    properties:\n      replicas: {type: integer}\n",
        );
        let v1 = format!(
            "  version: v2\n  versions:\n  - name: v1\n    schema:\n      type: object\n      required: [message]\n      properties:\n        message: {{type: string, minLength: 1, maxLength: 200}}\n  {language}        size: {{type: string}}\n    conversion:\n      up:\n        spec.replicas: \"{up}\"\n"
        );
        hub.replace("  version: v1\n", &v1)
    });
}

/// The Lease holder of the operators of `ns`.
fn leader(ns: &str) -> String {
    let path = "jsonpath={.spec.holderIdentity}";
    common::kubectl(&["get", "lease", "kustomize-operator", "-n", ns, "-o", path]).1
}

/// A replica of the operator with leader election in `ns`, serving the
/// conversion webhook on `addr` while the CRDs it applies name `url`.
fn replica(kind: &GreetingKind, ns: &str, name: &str, addr: &str, url: &str) -> OperatorProcess {
    let flags = kind.flags(&[
        "--conversion-webhook-addr",
        addr,
        "--conversion-webhook-url",
        url,
        "--leader-elect",
        "--leader-elect-namespace",
        ns,
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env = [("NAMESPACE", ns), ("POD_NAME", name)];
    OperatorProcess::spawn(ns, &env, &flags)
}

#[tokio::test]
async fn a_non_leader_computes_required_conversion_fields_and_the_migration_completes() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-replicas").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    sized(&kind, None);
    let (port_a, port_b) = (common::free_port(), common::free_port());
    let (addr_a, addr_b) = (format!("127.0.0.1:{port_a}"), format!("127.0.0.1:{port_b}"));
    // The API server calls the webhook of replica-b, which never leads:
    // it knows the kind's conversions only from the CRD's annotation.
    let url_b = format!("https://127.0.0.1:{port_b}");
    let a = replica(&kind, n, "replica-a", &addr_a, &url_b);
    common::wait_until(TIMEOUT, "replica-a leading", async || {
        leader(n) == "replica-a"
    })
    .await;
    let b = replica(&kind, n, "replica-b", &addr_b, &url_b);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.write_at(n, "v1", "q1", json!({"message": "big", "size": "large"}));
    kind.write_at(n, "v1", "q2", json!({"message": "small", "size": "small"}));

    sized(&kind, Some("self.spec.size == 'large' ? 3 : 1"));
    kind.apply();
    kind.wait_message("Serving", "True", "Running", "generation 2")
        .await;
    let path = "jsonpath={.spec.conversion.webhook.clientConfig.url}";
    let url = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
    assert_eq!(url, format!("{url_b}/convert"), "the CRD calls replica-b");
    for (name, replicas) in [("q1", 3), ("q2", 1)] {
        let resource = format!("greetings.v2.{}", kind.group);
        let spec = common::wait_for(TIMEOUT, format!("{name} read at v2"), async || {
            let (_, out, err) = common::kubectl(&["get", &resource, name, "-n", n, "-o", "json"]);
            let object: Value = serde_json::from_str(&out).map_err(|_| err)?;
            Ok::<_, String>(object["spec"].clone())
        })
        .await;
        assert_eq!(spec["replicas"], replicas, "{name}: {spec}");
        assert_eq!(spec["size"], if replicas == 3 { "large" } else { "small" });
    }
    let migrated = kind.wait_migrated().await;
    assert!(migrated.contains("stored at v2"), "{migrated}");
    let path = "jsonpath={.status.storedVersions}";
    let stored = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
    assert_eq!(stored, r#"["v2"]"#);
    assert_eq!(leader(n), "replica-a", "replica-b never led");
    drop((a, b));
}

#[tokio::test]
async fn a_decoy_crd_neither_changes_another_kinds_conversions_nor_removes_them() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-decoy").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    kind.to_v2();
    let flags = kind.webhook_flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(n, &[("NAMESPACE", n)], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.write_at(n, "v1", "one", json!({"message": "hello"}));

    // Marked as the kind's definition's, carrying its conversions but
    // moving `message` into the integer `length`.
    let path = "jsonpath={.metadata.annotations.kustomize-operator\\.io/conversions}";
    let annotation = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
    let mut conversions: Value = serde_json::from_str(&annotation).unwrap();
    conversions["older"][0]["conversion"]["moves"] =
        json!([{"from": "spec.message", "to": "spec.length"}]);
    let decoy_group = format!("decoy.{}", kind.group);
    let decoy_crd = format!("decoys.{decoy_group}");
    let decoy = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": decoy_crd,
            "labels": {"kustomize-operator.io/kind-definition": kind.name},
            "annotations": {"kustomize-operator.io/conversions": conversions.to_string()},
        },
        "spec": {
            "group": decoy_group,
            "names": {"kind": "Decoy", "plural": "decoys"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {
                "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }}],
        },
    });
    apply(&decoy);
    let _gone = DeleteCrd(decoy_crd.clone());
    common::wait_until(TIMEOUT, "the decoy refused in the log", async || {
        logged(&operator, &[&decoy_crd, "is not one this operator serves"])
    })
    .await;
    kind.write_at(n, "v1", "two", json!({"message": "still text"}));
    let two = kind.greeting_at(n, "v2", "two");
    assert_eq!(two["spec"]["text"], "still text", "{two}");
    assert!(two["spec"].get("length").is_none_or(Value::is_i64), "{two}");

    let (ok, _, err) = common::kubectl(&["delete", "crd", &decoy_crd]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "the decoy's deletion seen", async || {
        logged(&operator, &[&decoy_crd, "the CRD is gone"])
    })
    .await;
    assert_eq!(kind.greeting_at(n, "v1", "one")["spec"]["message"], "hello");
    kind.write_at(n, "v1", "three", json!({"message": "answered"}));
    assert_eq!(
        kind.greeting_at(n, "v2", "three")["spec"]["text"],
        "answered"
    );
}

/// True when a line `operator` logged holds every one of `parts`.
fn logged(operator: &OperatorProcess, parts: &[&str]) -> bool {
    let log = operator.log();
    log.lines()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}

/// Deletes a CRD when dropped.
struct DeleteCrd(String);

impl Drop for DeleteCrd {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "crd", &self.0, "--wait=false"]);
    }
}

/// A ValidatingAdmissionPolicy (and its binding), named `name`, denying
/// every update of the Greeting `held` of `group`; deleted when dropped.
struct Hold(String);

impl Hold {
    fn new(name: &str, group: &str, held: &str) -> Self {
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [group], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": ["greetings"],
                }]},
                "validations": [{
                    "expression": format!("object.metadata.name != '{held}'"),
                    "message": "held by the test",
                }],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        });
        apply(&policy);
        apply(&binding);
        Self(name.to_string())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = common::kubectl(&["delete", kind, &self.0, "--wait=false"]);
        }
    }
}

/// Lifts `hold` and waits until `large` (of `resource`, in `ns`) may be
/// written again: the kind's teardown strips its finalizer, which a hold
/// still in force would refuse, leaving the namespace terminating.
async fn lift(hold: Hold, resource: &str, ns: &str) {
    drop(hold);
    let mut tries = 0;
    common::wait_until(TIMEOUT, "the hold lifted", async || {
        tries += 1;
        let label = format!("lifted={tries}");
        common::kubectl(&["label", "--overwrite", resource, "large", "-n", ns, &label]).0
    })
    .await;
}

#[tokio::test]
async fn a_conversion_whose_output_has_the_wrong_type_is_refused_naming_the_field() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "hostile-output").await;
    let n = ns.name.as_str();
    let kind = GreetingKind::new(&ns);
    sized(&kind, None);
    let flags = kind.webhook_flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _operator = OperatorProcess::spawn(n, &[("NAMESPACE", n)], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.write_at(n, "v1", "large", json!({"message": "hi", "size": "large"}));
    kind.write_at(n, "v1", "plain", json!({"message": "hi"}));
    // Nobody may write `large` again, for now.
    let hold = Hold::new(&format!("hold-{n}"), &kind.group, "large");
    let resource = format!("greetings.{}", kind.group);
    // A new value each time: kubectl sends nothing for a label it already
    // has, and one try before the policy is in force would set it.
    let mut tries = 0;
    common::wait_until(TIMEOUT, "the hold in force", async || {
        tries += 1;
        let label = format!("tried={tries}");
        let (ok, _, err) =
            common::kubectl(&["label", "--overwrite", &resource, "large", "-n", n, &label]);
        !ok && err.contains("held by the test")
    })
    .await;

    // v2's `replicas` (an integer) from v1's `size`: 3 for a large one, 1
    // without a size, and the size itself (a string) otherwise.
    sized(
        &kind,
        Some("!has(self.spec.size) ? 1 : self.spec.size == 'large' ? 3 : self.spec.size"),
    );
    kind.apply();
    kind.wait_message("Serving", "True", "Running", "generation 2")
        .await;
    let greeting = json!({
        "apiVersion": format!("{}/v1", kind.group),
        "kind": "Greeting",
        "metadata": {"name": "odd", "namespace": n},
        "spec": {"message": "hi", "size": "secret-size"},
    });
    let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &greeting.to_string());
    assert!(!ok, "stored with a string in an integer field");
    assert!(
        err.contains(&format!(
            "{n}/odd: spec.replicas: expected integer, got string"
        )),
        "{err}"
    );
    assert!(!err.contains("secret-size"), "{err}");
    let v2 = format!("greetings.v2.{}", kind.group);
    let (found, _, err) = common::kubectl(&["get", &v2, "odd", "-n", n]);
    assert!(!found && err.contains("NotFound"), "nothing stored: {err}");

    let path = "jsonpath={.status.storedVersions}";
    // Where the API server migrates storage itself (storagemigration.k8s.io/v1,
    // Kubernetes 1.37), its migration has been seen both ways: succeeding
    // although the policy holds every update of `large` (its migrator
    // skips an object whose patch conflicts, taking it as written at the
    // new version meanwhile), or failing on `large` (any other error fails
    // it), after which the operator's own walk names `large`. Elsewhere
    // only the walk.
    let by_server = common::kubectl(&["get", "--raw", "/apis/storagemigration.k8s.io/v1"]).0;
    let (reason, said) = kind
        .wait_reason("StorageMigrated", &["Migrated", "MigrationFailed"])
        .await;
    if reason == "Migrated" {
        assert!(by_server, "migrated past the hold by the operator: {said}");
        assert!(said.contains("StorageVersionMigration"), "{said}");
        assert_eq!(kind.greeting_at(n, "v2", "plain")["spec"]["replicas"], 1);
        assert_eq!(kind.greeting_at(n, "v2", "large")["spec"]["replicas"], 3);
        let stored = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
        assert_eq!(stored, r#"["v2"]"#);
        lift(hold, &resource, n).await;
        return;
    }
    // The walk writes `plain`, names `large` and leaves v1 stored.
    let failed = kind
        .wait_message("StorageMigrated", "False", "MigrationFailed", "1 of the")
        .await;
    assert!(failed.contains(&format!("{n}/large: ")), "{failed}");
    assert!(failed.contains("held by the test"), "{failed}");
    assert!(!failed.contains("plain"), "{failed}");
    assert_eq!(kind.greeting_at(n, "v2", "plain")["spec"]["replicas"], 1);
    let stored = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
    assert_eq!(stored, r#"["v1","v2"]"#, "v1 still stored");

    // Released: the one that failed is written again, and then v1 goes.
    drop(hold);
    kind.wait_migrated().await;
    let stored = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]).1;
    assert_eq!(stored, r#"["v2"]"#);
    assert_eq!(kind.greeting_at(n, "v2", "large")["spec"]["replicas"], 3);
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
