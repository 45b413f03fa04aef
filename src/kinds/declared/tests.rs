//! Kind files end to end, without a cluster: parsing and every validation
//! error (each naming the file and the field), the CRD generated, what
//! templates see, status mappings and readiness rules.

use std::collections::BTreeMap;

use super::object::DeclaredObject;
use serde_json::{Value, json};

use super::*;
use crate::kind::{Handler, ObjectId, Step};

/// A kind file that passes every check.
const VALID: &str = r#"
apiVersion: kustomize-operator.io/v1alpha1
kind: KindDefinition
metadata:
  name: greeting
spec:
  group: hello.example.com
  version: v1
  names: {kind: Greeting, plural: greetings, shortNames: [greet]}
  schema:
    type: object
    required: [message]
    properties:
      message: {type: string, maxLength: 200}
      replicas: {type: integer, default: 2}
      style:
        type: object
        default: {}
        properties:
          color: {type: string, default: blue}
  printerColumns:
    - {name: Message, type: string, jsonPath: .spec.message}
  overlay:
    labels:
      - pairs: {app.kubernetes.io/instance: "{{ metadata.name }}"}
    patches:
      - {template: deployment.yaml, target: {kind: Deployment, name: web}}
    resources:
      - {template: service.yaml}
    configMapGenerator:
      - name: "{{ metadata.name }}-text"
        literals: {message: "{{ spec.message }}"}
  status:
    - field: available
      type: integer
      from: {kind: Deployment, name: web}
      path: .status.availableReplicas
  readiness:
    - from: {kind: Deployment, name: web}
      path: .status.readyReplicas
      atLeast: "{{ spec.replicas }}"
  reconcile: {interval: 5m}
"#;

/// A kind folder `greeting` holding `kind_file`, a base and templates.
fn folder(kind_file: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("greeting");
    for sub in ["base", "patches", "resources"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("kind.yaml"), kind_file).unwrap();
    std::fs::write(dir.join("base/kustomization.yaml"), "resources: []\n").unwrap();
    std::fs::write(dir.join("patches/deployment.yaml"), "[]\n").unwrap();
    std::fs::write(
        dir.join("resources/service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n",
    )
    .unwrap();
    root
}

fn load(kind_file: &str) -> Result<DeclaredKind, KindFileError> {
    let root = folder(kind_file);
    let templates = vec![
        "patches/deployment.yaml".to_string(),
        "resources/service.yaml".to_string(),
    ];
    DeclaredKind::load(&root.path().join("greeting"), &templates)
}

fn resource(spec: Value) -> DeclaredObject {
    serde_json::from_value(json!({
        "apiVersion": "hello.example.com/v1",
        "kind": "Greeting",
        "metadata": {"name": "hi", "namespace": "ns", "uid": "u-1"},
        "spec": spec,
    }))
    .unwrap()
}

#[test]
fn a_valid_kind_file_loads() {
    let kind = load(VALID).unwrap();
    assert_eq!(kind.name(), "greeting");
    assert_eq!(kind.resource.api_version, "hello.example.com/v1");
    assert_eq!(kind.resource.plural, "greetings");
    assert!(kind.namespaced());
    assert_eq!(kind.interval, Some(std::time::Duration::from_secs(300)));
    assert_eq!(kind.resource_types, vec![("v1".into(), "Service".into())]);
}

/// Every check, each by one change to the valid file: what the error names.
#[test]
fn every_error_names_the_file_and_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        ("spec:\n  group", "spec:\n  grupo: x\n  group", "grupo"),
        ("kind: KindDefinition", "kind: KindDefinitions", "kind"),
        (
            "apiVersion: kustomize-operator.io/v1alpha1",
            "apiVersion: v1",
            "apiVersion",
        ),
        ("name: greeting", "name: greetings", "metadata.name"),
        ("group: hello.example.com", "group: hello", "spec.group"),
        ("version: v1", "version: one", "spec.version"),
        ("kind: Greeting,", "kind: greeting,", "spec.names.kind"),
        (
            "plural: greetings",
            "plural: Greetings",
            "spec.names.plural",
        ),
        (
            "shortNames: [greet]",
            "shortNames: [Greet]",
            "spec.names.shortNames[0]",
        ),
        (
            "  schema:\n    type: object",
            "  schema:\n    type: string",
            "spec.schema",
        ),
        (
            "message: {type: string, maxLength: 200}",
            "message: {maxLength: 200}",
            "spec.schema.properties.message",
        ),
        (
            "message: {type: string, maxLength: 200}",
            "message: {type: text}",
            "spec.schema.properties.message",
        ),
        (
            "message: {type: string, maxLength: 200}",
            "message: {type: array}",
            "spec.schema.properties.message",
        ),
        (
            "{name: Message, type: string, jsonPath: .spec.message}",
            "{name: Message, type: text, jsonPath: .spec.message}",
            "spec.printerColumns[0].type",
        ),
        (
            "jsonPath: .spec.message}",
            "jsonPath: spec.message}",
            "spec.printerColumns[0].jsonPath",
        ),
        (
            "template: deployment.yaml",
            "template: deploy.yaml",
            "spec.overlay.patches[0].template",
        ),
        (
            "template: service.yaml",
            "template: svc.yaml",
            "spec.overlay.resources[0].template",
        ),
        (
            "  overlay:\n",
            "  overlay:\n    namespace: elsewhere\n",
            "spec.overlay.namespace",
        ),
        (
            "\"{{ metadata.name }}\"}",
            "\"{{ metadata.name \"}",
            "spec.overlay.labels[0].pairs.app.kubernetes.io/instance",
        ),
        (
            "name: \"{{ metadata.name }}-text\"",
            "name: \"{% if %}\"",
            "spec.overlay.configMapGenerator[0].name",
        ),
        (
            "field: available",
            "field: Available",
            "spec.status[0].field",
        ),
        (
            "field: available",
            "field: conditions",
            "spec.status[0].field",
        ),
        (
            "type: integer\n      from",
            "type: object\n      from",
            "spec.status[0].type",
        ),
        (
            "path: .status.availableReplicas",
            "path: .spec.replicas",
            "spec.status[0].path",
        ),
        (
            "from: {kind: Deployment, name: web}\n      path: .status.availableReplicas",
            "from: {kind: ConfigMap, name: web}\n      path: .status.availableReplicas",
            "spec.status[0].from.kind",
        ),
        (
            "atLeast: \"{{ spec.replicas }}\"",
            "atLeast: \"1\"\n      equals: \"1\"",
            "spec.readiness[0]",
        ),
        (
            "path: .status.readyReplicas",
            "path: status.readyReplicas",
            "spec.readiness[0].path",
        ),
        (
            "interval: 5m",
            "interval: 5 minutes",
            "spec.reconcile.interval",
        ),
        ("interval: 5m", "interval: 1s", "spec.reconcile.interval"),
        (
            "reconcile: {interval: 5m}",
            "reconcile: {deletionPolicy: Keep}",
            "spec.reconcile.deletionPolicy",
        ),
        (
            "reconcile: {interval: 5m}",
            "reach: [{apiVersion: v1, kind: ConfigMap, namespaces: [Kube-System]}]",
            "spec.reach[0].namespaces[0]",
        ),
        (
            "reconcile: {interval: 5m}",
            "reach: [{apiVersion: v1, kind: configmap}]",
            "spec.reach[0].kind",
        ),
        (
            "group: hello.example.com",
            "group: hello.example.com\n  scope: Cluster\n  reach: [{apiVersion: v1, kind: Namespace}]",
            "spec.reach[0]",
        ),
        (
            "reconcile: {interval: 5m}",
            "references: {spec: {apiVersion: v1, kind: ConfigMap, name: x}}",
            "spec.references.spec",
        ),
        (
            "reconcile: {interval: 5m}",
            "references: {colors: {apiVersion: v1, kind: ConfigMap}}",
            "spec.references.colors",
        ),
        (
            "reconcile: {interval: 5m}",
            "references: {colors: {apiVersion: v1, kind: ConfigMap, name: x, namespace: other}}",
            "spec.references.colors.namespace",
        ),
        (
            "reconcile: {interval: 5m}",
            "references: {colors: {apiVersion: v1, kind: ConfigMap, name: \"{{ spec.\"}}",
            "spec.references.colors.name",
        ),
    ];
    for (from, to, field) in cases {
        assert!(VALID.contains(from), "the case {from:?} does not apply");
        let broken = VALID.replacen(from, to, 1);
        let err = load(&broken).expect_err(&format!("{to:?} was accepted"));
        let text = err.to_string();
        assert!(
            text.contains("greeting/kind.yaml") && text.contains(field),
            "{to:?}: the error does not name the file and {field}: {text}"
        );
    }
    let err = load("spec: [unclosed").unwrap_err().to_string();
    assert!(
        err.contains("kind.yaml") && err.contains("not YAML"),
        "{err}"
    );
}

#[test]
fn a_resource_template_must_name_its_kind_literally() {
    let root = folder(VALID);
    let dir = root.path().join("greeting");
    std::fs::write(
        dir.join("resources/service.yaml"),
        "apiVersion: v1\nkind: {{ spec.kind }}\n",
    )
    .unwrap();
    let templates = vec![
        "patches/deployment.yaml".to_string(),
        "resources/service.yaml".to_string(),
    ];
    let err = DeclaredKind::load(&dir, &templates)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.overlay.resources[0].template") && err.contains("literal"),
        "{err}"
    );
}

#[test]
fn an_older_versions_columns_read_its_fields_where_its_moves_left_them() {
    let v1 = "  version: v2\n  versions:\n  - name: v1\n    schema:\n      type: object\n      required: [msg]\n      properties:\n        msg: {type: string, maxLength: 200}\n        replicas: {type: integer, default: 2}\n        style:\n          type: object\n          default: {}\n          properties:\n            color: {type: string, default: blue}\n    conversion:\n      moves:\n      - {from: spec.msg, to: spec.message}\n";
    let file = VALID.replace("  version: v1\n", v1).replace(
        "    - {name: Message, type: string, jsonPath: .spec.message}\n",
        "    - {name: Message, type: string, jsonPath: .spec.message}\n    - {name: Color, type: string, jsonPath: .spec.style.color}\n",
    );
    let crd = serde_json::to_value(load(&file).unwrap().crd()).unwrap();
    let paths = |i: usize| -> Vec<Value> {
        let columns = crd["spec"]["versions"][i]["additionalPrinterColumns"].as_array();
        columns
            .unwrap()
            .iter()
            .map(|c| c["jsonPath"].clone())
            .collect()
    };
    assert_eq!(crd["spec"]["versions"][1]["name"], "v1");
    assert_eq!(paths(0), [".spec.message", ".spec.style.color"]);
    assert_eq!(paths(1), [".spec.msg", ".spec.style.color"]);
}

#[test]
fn the_crd_has_the_schema_the_status_and_the_columns() {
    let crd = serde_json::to_value(load(VALID).unwrap().crd()).unwrap();
    assert_eq!(crd["metadata"]["name"], "greetings.hello.example.com");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["singular"], "greeting");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["greet"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1");
    assert_eq!(version["subresources"]["status"], json!({}));
    let schema = &version["schema"]["openAPIV3Schema"];
    assert_eq!(schema["required"], json!(["spec"]));
    assert_eq!(
        schema["properties"]["spec"]["properties"]["message"]["maxLength"],
        200
    );
    let status = &schema["properties"]["status"]["properties"];
    assert_eq!(status["available"]["type"], "integer");
    assert!(status["conditions"].is_object() && status["inventory"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Message"]);
    let without = VALID.replace(
        "  printerColumns:\n    - {name: Message, type: string, jsonPath: .spec.message}\n",
        "",
    );
    let crd = serde_json::to_value(load(&without).unwrap().crd()).unwrap();
    let defaults = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(defaults, 3, "Ready, Message, Age");
}

#[test]
fn templates_see_the_resource_with_the_schemas_defaults() {
    let kind = load(VALID).unwrap();
    let context = kind.recipe.context(&resource(json!({"message": "hey"})));
    assert_eq!(context["metadata"]["name"], "hi");
    assert_eq!(context["metadata"]["namespace"], "ns");
    assert_eq!(context["metadata"]["uid"], "u-1");
    assert_eq!(
        context["spec"],
        json!({"message": "hey", "replicas": 2, "style": {"color": "blue"}})
    );
    let given = kind.recipe.context(&resource(
        json!({"message": "x", "replicas": 0, "style": {"color": "red"}}),
    ));
    assert_eq!(given["spec"]["replicas"], 0);
    assert_eq!(given["spec"]["style"]["color"], "red");
}

#[test]
fn the_plan_is_the_recipe_for_the_resource() {
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(VALID).unwrap()));
    let plan = handler
        .plan(&resource(json!({"message": "hey"})), &BTreeMap::new())
        .unwrap();
    assert_eq!(
        plan.requeue_after,
        Some(std::time::Duration::from_secs(300))
    );
    let [Step::Apply { overlay, .. }] = plan.steps.as_slice() else {
        panic!("{plan:?}")
    };
    assert_eq!(overlay.base.as_deref(), Some("greeting"));
    assert_eq!(overlay.namespace.as_deref(), Some("ns"));
    assert_eq!(overlay.labels[0].pairs["app.kubernetes.io/instance"], "hi");
    assert_eq!(overlay.config_map_generators[0].name, "hi-text");
    assert_eq!(overlay.config_map_generators[0].data["message"], "hey");
    assert_eq!(overlay.values["spec"]["replicas"], 2);
    assert_eq!(overlay.resource_templates[0], "service.yaml");
    let greeting = resource(json!({"message": "hey"}));
    assert!(handler.reaches(&greeting, &object("apps/v1", "Deployment", Some("ns"))));
    assert!(!handler.reaches(&greeting, &object("apps/v1", "Deployment", Some("other"))));
    assert!(!handler.reaches(&greeting, &object("v1", "Namespace", None)));
    assert!(!overlay.namespace_unset_only);
}

#[test]
fn references_render_for_the_resource_and_reach_templates_and_expressions() {
    let reading = VALID.replace(
        "reconcile: {interval: 5m}",
        "references:\n    colors: {apiVersion: v1, kind: ConfigMap, name: \"{{ metadata.name }}-colors\"}\n    tokens: {apiVersion: v1, kind: Secret, selector: {team: \"{{ spec.message }}\"}}",
    );
    let kind = load(&reading).unwrap();
    let handler = DeclaredHandler::new(std::sync::Arc::new(kind));
    let hi = resource(json!({"message": "hey"}));
    let wanted = handler
        .kind()
        .recipe
        .references(&handler.kind().file.spec, &hi)
        .unwrap();
    assert_eq!(wanted.len(), 2);
    assert_eq!(
        wanted[0].by,
        super::references::By::Name("hi-colors".into())
    );
    assert_eq!(wanted[0].namespace, "ns");
    assert_eq!(
        wanted[1].by,
        super::references::By::Labels(BTreeMap::from([("team".into(), "hey".into())]))
    );
    let referenced = handler.referenced();
    let kinds: Vec<&str> = referenced.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["ConfigMap", "Secret"]);
    // Served from revisions: what every kept one reads, the stable one
    // (serving most resources) as much as the latest.
    let older = VALID.replace(
        "reconcile: {interval: 5m}",
        "references:\n    extra: {apiVersion: v1, kind: Service, name: web}",
    );
    let revisions = BTreeMap::from([
        (1, std::sync::Arc::new(load(&older).unwrap())),
        (2, std::sync::Arc::new(load(&reading).unwrap())),
    ]);
    let spec = super::rollout::RolloutSpec {
        stable: Some(1),
        ..Default::default()
    };
    let rollout = super::rollout::Rollout::new(revisions, &spec, &BTreeMap::new(), None).unwrap();
    let served = DeclaredHandler::with_rollout(std::sync::Arc::new(rollout)).unwrap();
    let referenced = served.referenced();
    let kinds: Vec<&str> = referenced.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["ConfigMap", "Secret", "Service"]);
    // Offline (`render -f`): from the documents after the resource.
    let documents = [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hi-colors"}, "data": {"c": "blue"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "t", "labels": {"team": "hey"}}}),
    ];
    let read = handler.observe_offline(&hi, &documents).unwrap();
    assert_eq!(read["colors"]["data"]["c"], "blue");
    assert_eq!(read["tokens"].as_array().unwrap().len(), 1);
    // The rbac: the references are read, never written.
    let rules = super::rbac::rules(handler.kind(), &Default::default());
    assert_eq!(rules.reads[0].resources, ["configmaps", "secrets"]);
    assert_eq!(rules.reads[0].verbs, ["get", "list", "watch"]);
}

#[test]
fn a_declared_reach_confines_the_kinds_objects_and_keeps_named_namespaces() {
    let reaching = VALID.replace(
        "reconcile: {interval: 5m}",
        "reach:\n    - {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole}\n    - {apiVersion: v1, kind: ConfigMap, namespaces: [\"tenant-*\", shared]}",
    );
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(&reaching).unwrap()));
    let greeting = resource(json!({"message": "hey"}));
    let reaches = |api_version, kind, namespace| {
        handler.reaches(&greeting, &object(api_version, kind, namespace))
    };
    assert!(reaches("rbac.authorization.k8s.io/v1", "ClusterRole", None));
    assert!(reaches("v1", "ConfigMap", Some("tenant-a")));
    assert!(!reaches("v1", "ConfigMap", Some("kube-system")));
    assert!(!reaches("v1", "Secret", Some("shared")));
    let plan = handler.plan(&greeting, &BTreeMap::new()).unwrap();
    let [Step::Apply { overlay, .. }] = plan.steps.as_slice() else {
        panic!("{plan:?}")
    };
    assert!(overlay.namespace_unset_only);
    assert_eq!(overlay.namespace.as_deref(), Some("ns"));
}

#[test]
fn text_kustomize_cannot_carry_is_an_invalid_spec_naming_the_field() {
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(VALID).unwrap()));
    let err = handler
        .plan(
            &resource(json!({"message": "bell\u{7f}"})),
            &BTreeMap::new(),
        )
        .unwrap_err();
    assert!(err.is_permanent());
    assert!(
        err.to_string().contains("spec.message contains U+007F"),
        "{err}"
    );
    // Other control characters are escaped, and go through.
    assert!(
        handler
            .plan(
                &resource(json!({"message": "tab\t nul\u{0} esc\u{1b}"})),
                &BTreeMap::new()
            )
            .is_ok()
    );
}

#[test]
fn a_label_value_kubernetes_would_refuse_is_an_invalid_spec() {
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(VALID).unwrap()));
    let mut long = resource(json!({"message": "x"}));
    long.metadata.name = Some("a".repeat(64));
    let err = handler.plan(&long, &BTreeMap::new()).unwrap_err();
    assert!(err.is_permanent());
    assert!(err.to_string().contains("at most 63"), "{err}");
}

/// An object named `x` of `kind` in `namespace`.
fn object(api_version: &str, kind: &str, namespace: Option<&str>) -> ObjectId {
    ObjectId {
        api_version: api_version.into(),
        kind: kind.into(),
        namespace: namespace.map(str::to_string),
        name: "x".into(),
    }
}

fn deployment(ready: i64, available: i64) -> BTreeMap<ObjectId, Value> {
    let id = ObjectId {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        namespace: Some("ns".into()),
        name: "web".into(),
    };
    BTreeMap::from([(
        id,
        json!({"status": {"readyReplicas": ready, "availableReplicas": available}}),
    )])
}

#[tokio::test]
async fn status_fields_and_readiness_read_the_objects() {
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(VALID).unwrap()));
    let greeting = resource(json!({"message": "x", "replicas": 3}));
    let read = handler.read_objects(&greeting, &deployment(1, 2)).await;
    assert_eq!(
        read.status,
        Some(json!({"available": 2}).as_object().unwrap().clone())
    );
    assert_eq!(
        read.not_ready,
        ["deployment/web: .status.readyReplicas is 1, waiting for at least 3"]
    );
    assert!(
        handler
            .read_objects(&greeting, &deployment(3, 3))
            .await
            .not_ready
            .is_empty()
    );
    let mut zero = deployment(0, 0);
    for state in zero.values_mut() {
        *state = json!({"status": {}});
    }
    let nothing_wanted = resource(json!({"message": "x", "replicas": 0}));
    assert!(
        handler
            .read_objects(&nothing_wanted, &zero)
            .await
            .not_ready
            .is_empty(),
        "an unset count is 0"
    );
    let none = handler.read_objects(&greeting, &BTreeMap::new()).await;
    assert_eq!(none.status, Some(serde_json::Map::new()), "unset, not null");
    assert_eq!(none.not_ready, ["deployment/web: not found"]);
}

#[tokio::test]
async fn equals_compares_text() {
    let equals = VALID.replace(
        "atLeast: \"{{ spec.replicas }}\"",
        "equals: \"{{ spec.replicas }}\"",
    );
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(&equals).unwrap()));
    let greeting = resource(json!({"message": "x", "replicas": 3}));
    assert!(
        handler
            .read_objects(&greeting, &deployment(3, 3))
            .await
            .not_ready
            .is_empty()
    );
    assert_eq!(
        handler
            .read_objects(&greeting, &deployment(4, 4))
            .await
            .not_ready
            .len(),
        1
    );
}

#[test]
fn the_rbac_of_revisions_covers_what_any_of_them_writes_or_reads() {
    let latest = load(VALID).unwrap();
    let older = VALID.replace(
        "reconcile: {interval: 5m}",
        "references:\n    extra: {apiVersion: v1, kind: Service, name: web}",
    );
    let older = load(&older).unwrap();
    let deployment = [json!({"apiVersion": "apps/v1", "kind": "Deployment"})];
    let job = [json!({"apiVersion": "batch/v1", "kind": "Job"})];
    let (latest_types, older_types) = (
        rbac::object_types(&latest, &deployment),
        rbac::object_types(&older, &job),
    );
    let rules = rbac::rules_of_revisions([(&latest, &latest_types), (&older, &older_types)]);
    let groups = |rules: &[rbac::Rule]| -> Vec<(String, Vec<String>)> {
        (rules.iter())
            .map(|r| (r.api_groups.concat(), r.resources.clone()))
            .collect()
    };
    assert_eq!(rules.own, rbac::rules(&latest, &latest_types).own);
    let objects = groups(&rules.objects);
    assert!(
        objects.contains(&("apps".into(), vec!["deployments".into()])),
        "{objects:?}"
    );
    assert!(
        objects.contains(&("batch".into(), vec!["jobs".into()])),
        "{objects:?}"
    );
    let reads = groups(&rules.reads);
    assert!(
        reads
            .iter()
            .any(|(group, resources)| group.is_empty()
                && resources.contains(&"services".to_string())),
        "the older revision's reference: {reads:?}"
    );
    let alone = groups(&rbac::rules(&latest, &latest_types).reads);
    assert!(
        !alone
            .iter()
            .any(|(_, resources)| resources.contains(&"services".to_string()))
    );
}

#[test]
fn the_rbac_covers_the_resources_and_what_the_overlay_produces() {
    let kind = load(VALID).unwrap();
    let base = [json!({"apiVersion": "apps/v1", "kind": "Deployment"})];
    let types = rbac::object_types(&kind, &base);
    let rules = rbac::rules(&kind, &types);
    let find = |group: &str| -> Vec<rbac::Rule> {
        rules
            .objects
            .iter()
            .filter(|r| r.api_groups == [group])
            .cloned()
            .collect()
    };
    let own = &rules.own;
    assert_eq!(own.len(), 2);
    assert!(own.iter().all(|r| r.api_groups == ["hello.example.com"]));
    assert_eq!(own[0].resources, ["greetings"]);
    assert_eq!(own[1].resources, ["greetings/status"]);
    assert_eq!(own[1].verbs, ["patch"]);
    assert!(find("hello.example.com").is_empty());
    let core = find("");
    assert_eq!(core[0].resources, ["configmaps", "services"]);
    let apps = find("apps");
    assert_eq!(apps[0].resources, ["deployments"]);
    assert!(!apps[0].verbs.contains(&"*".to_string()));
    let yaml = rbac::manifests(&kind, &rules, None).unwrap();
    let role: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(role["kind"], "ClusterRole");
    assert_eq!(role["metadata"]["labels"][rbac::AGGREGATE_LABEL], "true");
    assert_eq!(role["rules"], serde_json::to_value(rules.all()).unwrap());
    assert_eq!(
        role["rules"][0]["resources"][0], "greetings",
        "the kind's own first"
    );
    assert!(
        !yaml.contains("ClusterRoleBinding") && !yaml.contains("\n---"),
        "one document, no binding: {yaml}"
    );
    assert!(yaml.contains(rbac::AGGREGATING_ROLE), "{yaml}");

    // Bound (`--bind`): the same rules, no label, a binding to the account.
    let account = crate::names::ServiceAccount {
        namespace: "ops".into(),
        name: "operator".into(),
    };
    let yaml = rbac::manifests(&kind, &rules, Some(&account)).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let [role, binding] = &docs[..] else {
        panic!("a role and its binding: {yaml}")
    };
    assert_eq!(role["rules"], serde_json::to_value(rules.all()).unwrap());
    assert!(role["metadata"]["labels"][rbac::AGGREGATE_LABEL].is_null());
    assert_eq!(binding["kind"], "ClusterRoleBinding");
    assert_eq!(binding["metadata"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "operator", "namespace": "ops"}])
    );
    assert!(yaml.contains("--bind ops/operator"), "{yaml}");
}

#[test]
fn the_inventory_is_read_from_the_status_beside_the_kinds_own_fields() {
    let handler = DeclaredHandler::new(std::sync::Arc::new(load(VALID).unwrap()));
    let inventory = |r: &DeclaredObject| handler.common_status(r).and_then(|s| s.inventory);
    let greeting = resource(json!({"message": "hey"}));
    assert_eq!(inventory(&greeting), None);
    let greeting = greeting.with_field(
        "status",
        json!({
            "greeting": "a field of the kind's own",
            "inventory": {"count": 1, "objects": [
                {"apiVersion": "v1", "kind": "Service", "namespace": "ns", "names": ["hi"]},
            ]},
        }),
    );
    let inventory = inventory(&greeting).unwrap();
    assert_eq!(inventory.objects[0].kind, "Service");
    assert_eq!(inventory.objects[0].names, ["hi"]);
}

/// The kind folders the project keeps load offline, their expressions
/// checked against their schemas: a check too strict would refuse them.
#[test]
fn the_projects_kind_folders_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for folder in ["tests/fixtures/kro", "kustomize"] {
        let dir = KustomizeDir::load(&root.join(folder)).unwrap();
        let kinds = super::load(&dir).unwrap_or_else(|e| panic!("{folder}: {e}"));
        assert!(!kinds.is_empty(), "{folder}");
    }
}

#[test]
fn an_expression_is_checked_against_the_schema_and_its_field() {
    let with = |expression: &str| {
        let file = VALID.replace(
            "  readiness:\n",
            &format!(
                "    - {{field: length, type: integer, expression: {expression:?}}}\n  readiness:\n"
            ),
        );
        load(&file).map(drop).map_err(|e| e.to_string())
    };
    assert_eq!(with("size(spec.message) + spec.style.color.size()"), Ok(()));
    let misspelt = with("size(spec.mesage)").unwrap_err();
    assert!(misspelt.contains("spec.status[1].expression"), "{misspelt}");
    assert!(misspelt.contains("reads spec.mesage,"), "{misspelt}");
    let nested = with("size(spec.style.colour)").unwrap_err();
    assert!(nested.contains("(it declares: color)"), "{nested}");
    let wrong = with("spec.message").unwrap_err();
    assert!(
        wrong.contains("gives a string, where a value of type integer is wanted"),
        "{wrong}"
    );
}

/// A kind file whose status field is the finding's shape: one `filter`
/// over `spec.items`, each joined to `spec.big`; `bounds` are the two
/// fields' schema keywords.
fn finding(bounds: (&str, &str)) -> String {
    VALID
        .replace(
            "      message: {type: string, maxLength: 200}\n",
            &format!(
                "      message: {{type: string, maxLength: 200}}\n      items: {{type: array, {}items: {{type: string, maxLength: 16}}}}\n      big: {{type: string{}}}\n",
                bounds.0, bounds.1
            ),
        )
        .replace(
            "  readiness:\n",
            "    - {field: joined, type: integer, expression: \"spec.items.filter(i, (i + spec.big).size() > 0).size()\"}\n  readiness:\n",
        )
}

#[test]
fn an_expression_over_what_no_schema_bounds_is_refused_when_the_kind_loads() {
    let refused = load(&finding(("", ""))).unwrap_err().to_string();
    for part in [
        "spec.status[1].expression",
        "its estimated cost, ",
        "is over the limit of 10,000,000",
        "maxItems to spec.items",
        "maxLength to spec.big",
    ] {
        assert!(refused.contains(part), "{part:?} in {refused}");
    }
    // With bounds that fit, it loads.
    assert!(load(&finding(("maxItems: 300, ", ", maxLength: 40000"))).is_ok());
}

#[tokio::test]
async fn an_evaluation_over_its_limit_is_not_run_and_names_the_field_and_the_budget() {
    let kind = load(&finding(("maxItems: 300, ", ", maxLength: 40000"))).unwrap();
    let handler = DeclaredHandler::new(std::sync::Arc::new(kind));
    let items = vec!["x".repeat(16); 300];
    let costly = resource(json!({"message": "x", "items": items, "big": "y".repeat(40_000)}));
    let read = handler.read_objects(&costly, &deployment(3, 3)).await;
    let [line] = read.over_budget.as_slice() else {
        panic!("{read:?}")
    };
    assert!(line.starts_with("spec.status[1].expression: "), "{line}");
    assert!(
        line.contains("over the limit of 1,000,000 for one evaluation"),
        "{line}"
    );
    let fields = read.status.unwrap();
    assert!(!fields.contains_key("joined"), "left out: {fields:?}");
    assert_eq!(fields["available"], 3, "the other fields are read");
    // Small input: read, nothing over budget.
    let small = resource(json!({"message": "x", "items": ["a", "b"], "big": "y"}));
    let read = handler.read_objects(&small, &deployment(3, 3)).await;
    assert!(read.over_budget.is_empty(), "{read:?}");
    assert_eq!(read.status.unwrap()["joined"], 2);
}
