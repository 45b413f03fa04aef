//! Kinds defined in the cluster (`KindDefinition`), served by a running
//! operator: added, changed and removed with kubectl, without a restart,
//! without touching another kind.
//!
//! Each test defines its own kind (the lab's Greeting, in an API group of
//! its own, so the CRDs never collide) and serves only its own definitions
//! (`--kind-definition-selector kd-test=<namespace>`).

use ko_test_support as common;

use std::time::Duration;

use common::greeting::{GreetingKind, ReadsAt, config_map_field, wait_ready};
use common::{OperatorProcess, TestNamespace};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The watches of every kind served share the operator's connections to
/// the API server (HTTP/2, src/operator/connection.rs), where HTTP/1.1
/// took a connection per watch: eight definitions' kinds, each watched
/// twice under `--namespace` (its resources, and their count).
#[tokio::test]
async fn the_watches_of_many_kinds_share_one_connection() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-share").await;
    let kinds: Vec<GreetingKind> = (0..8)
        .map(|i| GreetingKind::tagged(&ns, &format!("w{i}")))
        .collect();
    let flags = kinds[0].flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    for kind in &kinds {
        kind.apply();
    }
    // Each its own greeting: their ConfigMaps are named after them.
    for (i, kind) in kinds.iter().enumerate() {
        kind.wait_condition("Serving", "True", "Running").await;
        kind.greet(&ns.name, &format!("hello-{i}"), "Hello", json!({}));
    }
    // Each kind's watch brought its greeting: its watches are open.
    for (i, kind) in kinds.iter().enumerate() {
        wait_ready(kind, &ns.name, &format!("hello-{i}")).await;
    }
    let connections = operator.established_connections();
    assert!(
        (1..=2).contains(&connections),
        "{connections} connections to the API server for 8 kinds' 16 watches and more:\n{}",
        operator.log_tail()
    );
}

#[tokio::test]
async fn a_definition_is_served_without_a_restart_and_a_template_change_rolls_out() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-serve").await;
    let kind = GreetingKind::new(&ns);
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = kind.flags(&["--metrics-addr", &addr]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    let pid = operator.pid();
    common::wait_until(TIMEOUT, "the operator ready", async || {
        matches!(common::http_get(port, "/readyz").await, Some((200, _)))
    })
    .await;

    kind.apply();
    let serving = kind.wait_condition("Serving", "True", "Running").await;
    assert!(serving.contains("generation 1"), "{serving}");
    kind.wait_condition("CRDEstablished", "True", "Established")
        .await;
    kind.greet(&ns.name, "hello", "Hello from a test", json!({}));
    wait_ready(&kind, &ns.name, "hello").await;
    assert_eq!(
        config_map_field(&ns.name, "hello", "message"),
        "Hello from a test"
    );
    a_crd_changed_by_hand_is_applied_again(&kind).await;

    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    kind.apply();
    common::wait_until(
        TIMEOUT,
        "the template change applied to hello",
        async || config_map_field(&ns.name, "hello", "shout") == "HELLO FROM A TEST",
    )
    .await;
    // The new generation serves before its status says so.
    kind.wait_message("Serving", "True", "Running", "generation 2")
        .await;
    assert!(
        operator.running(),
        "the operator exited:\n{}",
        operator.log_tail()
    );
    assert_eq!(operator.pid(), pid);
    // The whole log, not a tail: the start line is logged once per start.
    let starts = operator.log().matches("operator running").count();
    assert_eq!(starts, 1, "the operator started {starts} times");

    common::kubectl(&[
        "delete",
        &format!("greetings.{}", kind.group),
        "hello",
        "-n",
        &ns.name,
    ]);
    // Another controller's finalizer holds the CRD: the definition waits
    // for the CRD to be gone, and says so.
    let hold = r#"{"metadata":{"finalizers":["kd-test/hold"]}}"#;
    let (ok, _, err) = common::kubectl(&["patch", "crd", &kind.crd(), "--type=merge", "-p", hold]);
    assert!(ok, "{err}");
    let (ok, _, err) = common::kubectl(&["delete", "kinddefinition", &kind.name, "--wait=false"]);
    assert!(ok, "{err}");
    kind.wait_message("Serving", "False", "WaitingForResources", "remove the CRD")
        .await;
    assert!(kind.definition().is_some(), "the definition waits");
    // Retried: the API server may take its own finalizer off meanwhile.
    common::wait_until(TIMEOUT, "the hold released", async || {
        release_hold(&kind.crd())
    })
    .await;
    kind.delete().await;
    let (crd_left, _, _) = common::kubectl(&["get", "crd", &kind.crd()]);
    assert!(!crd_left, "the CRD is removed with the last resource gone");
}

/// The kind's CRD changed by hand (a field the definition sets) is
/// applied again at the definition's next look, which an annotation brings
/// at once. (A CRD unchanged since it was applied is read, not applied:
/// `crds::Applied`, unit-tested.)
fn a_crd_changed_by_hand_is_applied_again(kind: &GreetingKind) -> impl Future<Output = ()> {
    const PATCHED: &str =
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/message/type";
    const READ: &str = "jsonpath={.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.message.type}";
    let message_type = || {
        let (ok, out, err) = common::kubectl(&["get", "crd", &kind.crd(), "-o", READ]);
        assert!(ok, "{err}");
        out
    };
    async move {
        assert_eq!(message_type(), "string");
        let change = format!(r#"[{{"op":"replace","path":"{PATCHED}","value":"integer"}}]"#);
        let (ok, _, err) =
            common::kubectl(&["patch", "crd", &kind.crd(), "--type=json", "-p", &change]);
        assert!(ok, "{err}");
        assert_eq!(message_type(), "integer");
        let (ok, _, err) = common::kubectl(&[
            "annotate",
            "kinddefinition",
            &kind.name,
            "kd-test/look=now",
            "--overwrite",
        ]);
        assert!(ok, "{err}");
        common::wait_until(TIMEOUT, "the CRD applied again", async || {
            message_type() == "string"
        })
        .await;
    }
}

/// Takes the test's finalizer `kd-test/hold` off the CRD `crd`; whether
/// that succeeded.
fn release_hold(crd: &str) -> bool {
    let (ok, out, err) = common::kubectl(&["get", "crd", crd, "-o", "json"]);
    assert!(ok, "{err}");
    let crd_object: Value = serde_json::from_str(&out).unwrap();
    let finalizers = crd_object["metadata"]["finalizers"].as_array().unwrap();
    let at = finalizers.iter().position(|f| f == "kd-test/hold").unwrap();
    let path = format!("/metadata/finalizers/{at}");
    let patch = json!([
        {"op": "test", "path": path, "value": "kd-test/hold"},
        {"op": "remove", "path": path},
    ]);
    let patch = patch.to_string();
    common::kubectl(&["patch", "crd", crd, "--type=json", "-p", &patch]).0
}

/// Gives the kind's schema a field that keeps whatever it is given.
fn with_notes(kind: &GreetingKind) {
    kind.edit("kind.yaml", |t| {
        t.replace(
            "      language: {type: string, enum: [en, it], default: en}\n",
            "      language: {type: string, enum: [en, it], default: en}\n      notes: {type: object, x-kubernetes-preserve-unknown-fields: true}\n",
        )
    });
}

/// Creates the Greeting `deep` at v1, a tenant's: its `spec.notes` nested
/// 2,000 levels deep (the API server keeps up to 10,000; a decoder's
/// default stops at 128). Built as text: a `Value` that deep is more than
/// a test's stack should hold.
fn create_deep(kind: &GreetingKind, ns: &str) {
    let notes = format!("{}1{}", r#"{"a":["#.repeat(1_000), "]}".repeat(1_000));
    let greeting = format!(
        r#"{{"apiVersion":"{}/v1","kind":"Greeting","metadata":{{"name":"deep","namespace":"{ns}"}},"spec":{{"message":"deep","notes":{notes}}}}}"#,
        kind.group
    );
    let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &greeting);
    assert!(ok, "creating the deep Greeting: {err}");
}

/// The `spec.text` of the Greeting `name` read at `version`, without
/// decoding the rest of it.
fn text_of(kind: &GreetingKind, ns: &str, version: &str, name: &str) -> String {
    let resource = format!("greetings.{version}.{}", kind.group);
    let path = "jsonpath={.spec.text}";
    let (ok, out, err) = common::kubectl(&["get", &resource, name, "-n", ns, "-o", path]);
    assert!(ok, "get {resource} {name}: {err}");
    out
}

#[tokio::test]
async fn a_kind_gains_a_version_with_a_rename_converted_by_the_operators_webhook_and_migrated() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-versions").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.webhook_flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // Its own namespace: where the webhook's certificate is kept.
    let env = [("NAMESPACE", ns.name.as_str())];
    let mut operator = OperatorProcess::spawn(&ns.name, &env, &flags);
    with_notes(&kind);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    create_deep(&kind, &ns.name);
    let names = ["one", "two", "three"];
    for name in names {
        kind.greet(&ns.name, name, &format!("hello {name}"), json!({}));
    }
    for name in names {
        wait_ready(&kind, &ns.name, name).await;
    }
    // The deep one is left out of what the operator reads, and said so on
    // it (docs/security.md, "Decoding what tenants wrote").
    common::wait_until(
        TIMEOUT,
        "a Warning Unreadable on the deep Greeting",
        async || {
            let path =
                r#"jsonpath={range .items[*]}{.type}/{.reason}/{.regarding.name}{"\n"}{end}"#;
            let events =
                common::kubectl(&["get", "events.events.k8s.io", "-n", &ns.name, "-o", path]);
            events.1.lines().any(|e| e == "Warning/Unreadable/deep")
        },
    )
    .await;
    // Of a shard no operator serves: nobody writes it again but the
    // storage migration.
    let idle = json!({"kustomize-operator.io/shard": "elsewhere"});
    kind.greet(&ns.name, "idle", "hello idle", idle.clone());
    // A hundred more of that shard (in one apply): the migration walks more
    // than one page, and they too are written again by it alone.
    let bulk: Vec<Value> = (0..100)
        .map(|i| {
            json!({
                "apiVersion": format!("{}/v1", kind.group),
                "kind": "Greeting",
                "metadata": {"name": format!("bulk-{i:03}"), "namespace": ns.name, "labels": idle},
                "spec": {"message": format!("bulk {i}")},
            })
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": bulk});
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
    assert!(ok, "{err}");

    kind.to_v2();
    kind.apply();
    kind.wait_message("Serving", "True", "Running", "generation 2")
        .await;
    for name in names {
        common::wait_until(TIMEOUT, format!("{name} rendered from v2"), async || {
            config_map_field(&ns.name, name, "version") == "v2"
                && config_map_field(&ns.name, name, "message") == format!("hello {name}")
        })
        .await;
        let v2 = kind.greeting_at(&ns.name, "v2", name);
        assert_eq!(v2["apiVersion"], format!("{}/v2", kind.group));
        // `length`: CEL over the v1 object, as the conversion computes it.
        let length = format!("hello {name}").len();
        assert_eq!(
            v2["spec"],
            json!({"text": format!("hello {name}"), "language": "en", "length": length})
        );
        let v1 = kind.greeting_at(&ns.name, "v1", name);
        assert_eq!(
            v1["spec"],
            json!({"message": format!("hello {name}"), "language": "en"})
        );
    }
    // The deep one, stored at v1, converted whole for the lists at v2 (the
    // operator's own among them, which went on for every other Greeting).
    assert_eq!(text_of(&kind, &ns.name, "v2", "deep"), "deep");
    let crd: Value =
        serde_json::from_str(&common::kubectl(&["get", "crd", &kind.crd(), "-o", "json"]).1)
            .unwrap();
    assert_eq!(crd["spec"]["conversion"]["strategy"], "Webhook");
    let versions: Vec<(&str, bool)> = (crd["spec"]["versions"].as_array().unwrap().iter())
        .map(|v| (v["name"].as_str().unwrap(), v["storage"] == true))
        .collect();
    assert_eq!(versions, [("v2", true), ("v1", false)]);

    // The storage migration is awaited first: the API server's trims
    // `storedVersions` only when the CRD did not change while it ran, and
    // a restart in the middle was seen to make the operator walk the
    // Greetings itself (CI trial 44).
    let migrated = kind.wait_migrated().await;
    // A restart keeps the CA the CRD trusts (kept in a Secret), and the new
    // process answers for v1 at once.
    let ca = |crd: &Value| crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"].clone();
    let secret = common::kubectl(&[
        "get",
        "secret",
        "kustomize-operator-webhook",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    assert_eq!(ca(&crd), secret.1, "the CRD trusts the Secret's CA");
    operator.signal(libc::SIGTERM);
    assert!(operator.wait_exit(Duration::from_secs(30)).await.is_some());
    operator = OperatorProcess::spawn(&ns.name, &env, &flags);
    common::wait_until(TIMEOUT, "one read at v1 after the restart", async || {
        let resource = format!("greetings.v1.{}", kind.group);
        common::kubectl(&["get", &resource, "one", "-n", &ns.name]).0
    })
    .await;
    let after: Value =
        serde_json::from_str(&common::kubectl(&["get", "crd", &kind.crd(), "-o", "json"]).1)
            .unwrap();
    assert_eq!(ca(&after), ca(&crd), "the same CA after the restart");

    kind.write_at(&ns.name, "v1", "four", json!({"message": "written at v1"}));
    assert_eq!(
        kind.greeting_at(&ns.name, "v2", "four")["spec"]["text"],
        "written at v1"
    );
    assert_eq!(
        kind.greeting_at(&ns.name, "v1", "four")["spec"]["message"],
        "written at v1"
    );
    kind.write_at(&ns.name, "v2", "five", json!({"text": "written at v2"}));
    assert_eq!(
        kind.greeting_at(&ns.name, "v1", "five")["spec"]["message"],
        "written at v2"
    );
    common::wait_until(TIMEOUT, "four and five rendered", async || {
        config_map_field(&ns.name, "four", "message") == "written at v1"
            && config_map_field(&ns.name, "five", "message") == "written at v2"
    })
    .await;
    let (ok, listed, err) = common::kubectl(&[
        "get",
        &format!("greetings.v1.{}", kind.group),
        "-n",
        &ns.name,
        "-o",
        "name",
    ]);
    assert!(ok, "{err}");
    assert_eq!(listed.lines().count(), 107, "{listed}");

    // Storage migration (awaited before the restart): every Greeting
    // written again at v2, then v1 no longer listed as stored, so it can go.
    assert!(migrated.contains("stored at v2"), "{migrated}");
    // Where the API server serves StorageVersionMigrations (Kubernetes
    // 1.37), its own did it: the operator's, owned by the definition.
    let migration = format!("{}-v2", kind.crd());
    let by_the_api_server = serves_storage_migrations();
    if by_the_api_server {
        let by = format!("by the API server's StorageVersionMigration {migration}");
        assert!(migrated.contains(&by), "{migrated}");
        let made: Value = serde_json::from_str(
            &common::kubectl(&["get", "storageversionmigration", &migration, "-o", "json"]).1,
        )
        .unwrap();
        let succeeded = (made["status"]["conditions"].as_array().unwrap().iter())
            .any(|c| c["type"] == "Succeeded" && c["status"] == "True");
        assert!(succeeded, "{made}");
        assert_eq!(
            made["metadata"]["labels"]["kustomize-operator.io/kind-definition"],
            kind.name.as_str()
        );
        let owner = &made["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["kind"], &owner["name"]),
            (&json!("KindDefinition"), &json!(kind.name))
        );
    } else {
        assert!(!migrated.contains("API server"), "{migrated}");
    }
    let stored = common::kubectl(&[
        "get",
        "crd",
        &kind.crd(),
        "-o",
        "jsonpath={.status.storedVersions}",
    ]);
    assert_eq!(stored.1, r#"["v2"]"#);
    // The CA renewal brings the CRD's caBundle to the CAs trusted now with
    // a patch of its own (here: the same CA twice), which the operator's
    // apply does not own: leaving the webhook is applied all the same.
    renew_the_trusted_cas(&kind.crd());
    kind.edit("kind.yaml", |t| {
        let start = t.find("  versions:\n").unwrap();
        let end = t.find("  names:").unwrap();
        format!("{}{}", &t[..start], &t[end..])
    });
    kind.apply_with(|d| {
        d["metadata"]["annotations"]["kustomize-operator.io/allow-breaking-changes"] =
            "true".into();
    });
    kind.wait_message("Serving", "True", "Running", "generation 3")
        .await;
    kind.wait_condition("CRDEstablished", "True", "Established")
        .await;
    let crd: Value =
        serde_json::from_str(&common::kubectl(&["get", "crd", &kind.crd(), "-o", "json"]).1)
            .unwrap();
    assert_eq!(
        crd["spec"]["versions"].as_array().unwrap().len(),
        1,
        "{crd}"
    );
    // Without v1 and without a webhook, a Greeting still stored at v1
    // would be read with v1's fields: each was written again at v2.
    for name in names.into_iter().chain(["idle"]) {
        let v2 = kind.greeting_at(&ns.name, "v2", name);
        assert_eq!(v2["spec"]["text"], format!("hello {name}"), "{v2}");
    }
    assert_eq!(
        text_of(&kind, &ns.name, "v2", "deep"),
        "deep",
        "migrated too"
    );
    let resource = format!("greetings.v2.{}", kind.group);
    let path = "jsonpath={range .items[*]}{.spec.text}{\"\\n\"}{end}";
    let (ok, texts, err) = common::kubectl(&["get", &resource, "-n", &ns.name, "-o", path]);
    assert!(ok, "{err}");
    let bulk = texts.lines().filter(|t| t.starts_with("bulk ")).count();
    assert_eq!(bulk, 100, "{texts}");

    kind.delete_every_greeting(&ns.name).await;
    kind.delete().await;
    if by_the_api_server {
        common::wait_until(
            TIMEOUT,
            "the migration deleted with its definition",
            async || {
                let (_, _, err) = common::kubectl(&["get", "storageversionmigration", &migration]);
                err.contains("NotFound")
            },
        )
        .await;
    }
    assert!(
        operator.running(),
        "the operator exited:\n{}",
        operator.log_tail()
    );
}

/// True when the API server serves `storagemigration.k8s.io/v1`
/// (Kubernetes 1.37 and later).
fn serves_storage_migrations() -> bool {
    let (ok, _, err) = common::kubectl(&["get", "--raw", "/apis/storagemigration.k8s.io/v1"]);
    assert!(ok || err.contains("NotFound"), "{err}");
    ok
}

/// Every kind folder of the repository with a kind file, packed.
fn packed_kind_folders() -> Vec<(String, Value)> {
    let repo = common::repo();
    let mut folders = Vec::new();
    for parent in [
        "kustomize",
        "tests/fixtures/kinds",
        "training/06-your-own-kind",
    ] {
        for entry in std::fs::read_dir(repo.join(parent)).unwrap() {
            let path = entry.unwrap().path();
            if path.join("kind.yaml").is_file() {
                folders.push(path);
            }
        }
    }
    folders.sort();
    folders
        .into_iter()
        .map(|folder| {
            let packed = kustomize_operator::kinds::declared::pack::pack(&folder).unwrap();
            (
                folder.display().to_string(),
                serde_saphyr::from_str(&packed).unwrap(),
            )
        })
        .collect()
}

/// The KindDefinition CRD is derived from the kind file's types: the API
/// server takes every kind folder of the repository, and refuses at
/// `kubectl apply` a recipe field it does not know or of the wrong shape,
/// which it used to keep for the operator to find.
#[tokio::test]
async fn the_api_server_takes_every_kind_folder_and_refuses_a_mistyped_recipe() {
    common::cluster().await;
    let dry_run = |definition: &Value| {
        common::kubectl_stdin(
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            &definition.to_string(),
        )
    };
    let folders = packed_kind_folders();
    assert!(folders.len() >= 5, "{folders:?}");
    for (folder, definition) in &folders {
        let (ok, _, err) = dry_run(definition);
        assert!(ok, "{folder}: {err}");
    }
    let (_, greeting) = folders
        .iter()
        .find(|(folder, _)| folder.ends_with("greeting"))
        .unwrap();
    type Change = fn(&mut Value);
    let cases: [(Change, &str); 6] = [
        (
            |d| d["spec"]["overlay"]["namePrefx"] = json!("x-"),
            ".spec.overlay.namePrefx: field not declared in schema",
        ),
        (
            |d| d["spec"]["readiness"] = json!({"path": ".status.x"}),
            ".spec.readiness: expected list",
        ),
        (
            |d| d["spec"]["reconcile"] = json!({"deletionPolicy": "Keep"}),
            "spec.reconcile.deletionPolicy: Unsupported value: \"Keep\"",
        ),
        (
            |d| {
                d["spec"]["status"] = json!([{"field": "n", "type": "int",
                    "from": {"kind": "Deployment", "name": "x"}, "path": ".status.n"}])
            },
            "spec.status[0].type: Unsupported value: \"int\"",
        ),
        (
            |d| d["spec"]["group"] = json!("nodot"),
            "spec.group in body should match",
        ),
        (
            |d| {
                d["spec"].as_object_mut().unwrap().remove("files");
            },
            "spec.files: Required value",
        ),
    ];
    for (change, refusal) in cases {
        let mut definition = greeting.clone();
        change(&mut definition);
        let (ok, out, err) = dry_run(&definition);
        assert!(!ok && err.contains(refusal), "{refusal}: {out}{err}");
    }
}

#[tokio::test]
async fn a_bad_definition_stops_no_other_kind_and_names_the_file() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-bad").await;
    let good = GreetingKind::new(&ns);
    let bad = {
        let other = TestNamespace::new(&client, "kd-bad2").await;
        let mut kind = GreetingKind::new(&other);
        kind.label = good.label.clone();
        kind
    };
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = good.flags(&["--metrics-addr", &addr]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;

    bad.edit("resources/configmap.yaml", |t| {
        format!("{t}  broken: {{% if %}}\n")
    });
    bad.apply();
    good.apply();
    let message = bad.wait_condition("Accepted", "False", "Invalid").await;
    assert!(message.contains("resources/configmap.yaml"), "{message}");
    bad.wait_condition("Serving", "False", "NoValidGeneration")
        .await;
    good.wait_condition("Serving", "True", "Running").await;
    good.greet(&ns.name, "hello", "still served", json!({}));
    wait_ready(&good, &ns.name, "hello").await;
    let sample = json!({
        "apiVersion": "nuvolaris.org/v1", "kind": "Sample",
        "metadata": {"name": "web", "namespace": ns.name}, "spec": {"count": 1},
    });
    assert!(common::kubectl_stdin(&["apply", "-f", "-"], &sample.to_string()).0);
    common::wait_until(TIMEOUT, "the Sample applied", async || {
        common::kubectl(&["get", "deployment", "web", "-n", &ns.name]).0
    })
    .await;
    assert_eq!(
        common::http_get(port, "/readyz")
            .await
            .map(|(code, _)| code),
        Some(200)
    );
    assert!(
        !common::kubectl(&["get", "crd", &bad.crd()]).0,
        "no CRD for a rejected kind"
    );

    // Not waiting in kubectl: this operator runs on the test's thread.
    let greetings = format!("greetings.{}", good.group);
    common::kubectl(&[
        "delete",
        &greetings,
        "hello",
        "-n",
        &ns.name,
        "--wait=false",
    ]);
    common::kubectl(&["delete", "sample", "web", "-n", &ns.name, "--wait=false"]);
    good.delete().await;
    bad.delete().await;
    operator.stop().await;
}

#[tokio::test]
async fn a_breaking_change_is_refused_naming_the_field_and_an_additive_one_rolls_out() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-breaking").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;

    kind.edit("kind.yaml", |t| t.replace("enum: [en, it]", "enum: [en]"));
    kind.apply();
    let message = kind
        .wait_condition("Accepted", "False", "BreakingChange")
        .await;
    assert!(message.contains("spec.language"), "{message}");
    assert!(message.contains("\"it\""), "{message}");
    let serving = kind.wait_condition("Serving", "True", "Running").await;
    assert!(
        serving.contains("generation 1"),
        "the last good generation serves: {serving}"
    );
    let crd = common::kubectl(&["get", "crd", &kind.crd(), "-o", "json"]).1;
    assert!(crd.contains("\"it\""), "the CRD keeps the wider enum");

    kind.edit("kind.yaml", |t| {
        t.replace("enum: [en]", "enum: [en, it, fr]").replace(
            "    properties:\n",
            "    properties:\n      signature: {type: string}\n",
        )
    });
    kind.apply();
    kind.wait_message("Accepted", "True", "Valid", "generation 3")
        .await;
    kind.wait_message("Serving", "True", "Running", "generation 3")
        .await;

    kind.edit("kind.yaml", |t| {
        t.replace("      signature: {type: string}\n", "")
    });
    kind.apply_with(|d| {
        d["metadata"]["annotations"]["kustomize-operator.io/allow-breaking-changes"] =
            "true".into();
    });
    // Allowed by the annotation.
    kind.wait_message("Serving", "True", "Running", "generation 4")
        .await;

    kind.delete().await;
    operator.stop().await;
}

/// The guard of deploy/admission: on or off for every KindDefinition of
/// the cluster (only this test binary changes definitions; only this test
/// changes the guard).
fn guard(on: bool) {
    let file = common::repo().join("deploy/admission/kinddefinition.yaml");
    let file = file.display().to_string();
    let (ok, _, err) = if on {
        common::kubectl(&["apply", "-f", &file])
    } else {
        common::kubectl(&["delete", "-f", &file, "--ignore-not-found"])
    };
    assert!(ok, "guard {on}: {err}");
}

/// What a server-side dry run of deleting the definition says: `None`
/// when admitted, the refusal otherwise.
fn refused_deletion(kind: &GreetingKind) -> Option<String> {
    let (ok, _, err) =
        common::kubectl(&["delete", "kinddefinition", &kind.name, "--dry-run=server"]);
    (!ok).then_some(err)
}

#[tokio::test]
async fn deleting_a_definition_is_refused_or_waits_while_resources_exist_and_orphan_leaves_them() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-delete").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "hello", "kept", json!({}));
    wait_ready(&kind, &ns.name, "hello").await;
    common::wait_until(
        TIMEOUT,
        "the definition counting one Greeting",
        async || {
            kind.definition()
                .is_some_and(|d| d["status"]["resources"] == 1)
        },
    )
    .await;

    // Admission refuses what it can see: the count, the API identity.
    guard(true);
    let refusal = common::wait_for(TIMEOUT, "the guard refusing the deletion", async || {
        refused_deletion(&kind).ok_or("admitted")
    })
    .await;
    assert!(
        refusal.contains("1 resource of kind Greeting exists"),
        "{refusal}"
    );
    let moved = format!("{{\"spec\":{{\"group\":\"other.{}\"}}}}", kind.group);
    let (ok, _, err) = common::kubectl(&[
        "patch",
        "kinddefinition",
        &kind.name,
        "--type",
        "merge",
        "-p",
        &moved,
        "--dry-run=server",
    ]);
    assert!(
        !ok && err.contains("spec.group"),
        "moving the kind's group: {err}"
    );
    // A new version is not a new identity while the old one stays served.
    let schema = kind.definition().unwrap()["spec"]["schema"].clone();
    let dry_run = |patch: &Value| {
        let patch = patch.to_string();
        let args = ["patch", "kinddefinition", &kind.name, "--type", "merge"];
        let (ok, _, err) =
            common::kubectl(&[&args[..], &["-p", &patch, "--dry-run=server"]].concat());
        (ok, err)
    };
    let (ok, err) = dry_run(&json!({"spec": {"version": "v2"}}));
    assert!(!ok && err.contains("spec.version"), "a version gone: {err}");
    let kept = json!({"spec": {"version": "v2", "versions": [{"name": "v1", "schema": schema}]}});
    let (ok, err) = dry_run(&kept);
    assert!(ok, "v1 kept under spec.versions: {err}");

    // Without the guard (or counted too late), the finalizer holds it.
    guard(false);
    common::wait_until(
        TIMEOUT,
        "the deletion admitted without the guard",
        async || refused_deletion(&kind).is_none(),
    )
    .await;
    common::kubectl(&["delete", "kinddefinition", &kind.name, "--wait=false"]);
    let message = kind
        .wait_condition("Serving", "True", "WaitingForResources")
        .await;
    guard(true);
    assert!(message.contains(&format!("{}/hello", ns.name)), "{message}");
    assert!(kind.definition().is_some(), "the definition waits");
    let orphan = r#"{"spec":{"onDelete":"Orphan"}}"#;
    let patched = common::kubectl(&[
        "patch",
        "kinddefinition",
        &kind.name,
        "--type",
        "merge",
        "-p",
        orphan,
    ]);
    assert!(patched.0, "{}", patched.2);
    common::wait_until(TIMEOUT, "the orphaning definition gone", async || {
        kind.definition().is_none()
    })
    .await;
    let greeting = format!("greetings.{}", kind.group);
    let (ok, finalizers, _) = common::kubectl(&[
        "get",
        &greeting,
        "hello",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.metadata.finalizers}",
    ]);
    assert!(ok, "the Greeting stays");
    assert!(
        finalizers.is_empty(),
        "no finalizer is left that nobody removes: {finalizers}"
    );
    assert_eq!(config_map_field(&ns.name, "hello", "message"), "kept");
    assert!(
        common::kubectl(&["get", "crd", &kind.crd()]).0,
        "the CRD stays with its resources"
    );

    let (deleted, _, err) = common::kubectl(&[
        "delete",
        &greeting,
        "hello",
        "-n",
        &ns.name,
        "--timeout=30s",
    ]);
    assert!(
        deleted,
        "an orphaned resource deletes without a controller: {err}"
    );
    operator.stop().await;
}

/// A ClusterRole granting `rules`, bound to the ServiceAccount
/// `account` of `ns`; deleted when dropped.
struct Grant {
    name: String,
}

impl Grant {
    fn apply(name: &str, ns: &str, account: &str, rules: Value) -> Self {
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules,
        });
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
        });
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [role, binding]});
        let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        assert!(ok, "granting {name}: {err}");
        Self { name: name.into() }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "clusterrolebinding,clusterrole", &self.name]);
    }
}

#[tokio::test]
async fn rights_granted_follows_the_operators_roles_without_a_restart() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-rights").await;
    let kind = GreetingKind::new(&ns);
    assert!(common::kubectl(&["create", "serviceaccount", "operator", "-n", &ns.name]).0);
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let read_write = [
        "get", "list", "watch", "create", "patch", "update", "delete",
    ];
    // Everything the operator needs but the ConfigMaps its Greetings make.
    let _base = Grant::apply(
        &format!("{}-operator", ns.name),
        &ns.name,
        "operator",
        json!([
            rule(
                "kustomize-operator.io",
                &["kinddefinitions", "kinddefinitions/status"],
                &read_write
            ),
            rule(
                "apiextensions.k8s.io",
                &["customresourcedefinitions"],
                &read_write
            ),
            rule("events.k8s.io", &["events"], &["create", "patch"]),
            rule("nuvolaris.org", &["samples", "samples/status"], &read_write),
            rule(&kind.group, &["greetings", "greetings/status"], &read_write),
        ]),
    );
    let token = common::TokenKubeconfig::mint(&client, &ns.name, "operator").await;
    let kubeconfig = token.path().display().to_string();
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut operator = OperatorProcess::spawn(&ns.name, &[("KUBECONFIG", &kubeconfig)], &flags);
    let pid = operator.pid();

    kind.apply();
    let missing = kind
        .wait_condition("RightsGranted", "False", "MissingRights")
        .await;
    assert!(missing.contains("create configmaps"), "{missing}");
    assert!(missing.contains("delete configmaps"), "{missing}");
    assert!(!missing.contains("greetings"), "{missing}");

    let _configmaps = Grant::apply(
        &format!("{}-configmaps", ns.name),
        &ns.name,
        "operator",
        json!([rule("", &["configmaps"], &read_write)]),
    );
    kind.wait_condition("RightsGranted", "True", "Granted")
        .await;
    assert!(
        operator.running(),
        "the operator exited:\n{}",
        operator.log_tail()
    );
    assert_eq!(operator.pid(), pid, "noticed without a restart");
    kind.greet(&ns.name, "hello", "granted", json!({}));
    wait_ready(&kind, &ns.name, "hello").await;

    let greetings = format!("greetings.{}", kind.group);
    common::kubectl(&[
        "delete",
        &greetings,
        "hello",
        "-n",
        &ns.name,
        "--timeout=60s",
    ]);
    kind.delete().await;
}

/// An operator process of shard `shard`, named `name` (`POD_NAME`: its
/// Lease identity and its events' reporting instance), serving its
/// metrics on `port`, electing a leader for its shard.
fn shard_replica(
    kind: &GreetingKind,
    ns: &str,
    shard: &str,
    name: &str,
    port: u16,
) -> OperatorProcess {
    let addr = format!("127.0.0.1:{port}");
    let flags = kind.flags(&[
        "--shard",
        shard,
        "--metrics-addr",
        &addr,
        "--leader-elect",
        "--leader-elect-namespace",
        ns,
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "250ms",
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    OperatorProcess::spawn(ns, &[("POD_NAME", name)], &flags)
}

/// The Lease of shard `shard` in `ns`: its holder and transitions.
fn lease(ns: &str, shard: &str) -> (String, i64) {
    let (_, out, _) = common::kubectl(&[
        "get",
        "lease",
        &format!("kustomize-operator-{shard}"),
        "-n",
        ns,
        "-o",
        "jsonpath={.spec.holderIdentity} {.spec.leaseTransitions}",
    ]);
    let (holder, transitions) = out.split_once(' ').unwrap_or((&out, ""));
    (holder.to_string(), transitions.trim().parse().unwrap_or(0))
}

/// Which operator processes published an `Applied` event about `name`:
/// the events' reporting instances (each process's `POD_NAME`).
async fn applied_by(client: &kube::Client, ns: &str, name: &str) -> Vec<String> {
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap();
    let mut by: Vec<String> = events
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Applied")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .filter_map(|e| e.reporting_instance)
        .collect();
    by.sort();
    by.dedup();
    by
}

/// What one replica's own metrics say: the reconciles it started (every
/// kind) and whether it leads.
async fn reconciles_and_leading(port: u16) -> (f64, f64) {
    let (code, text) = common::http_get(port, "/metrics")
        .await
        .expect("the replica's metrics");
    assert_eq!(code, 200, "{text}");
    (
        common::metric_sum(&text, "kustomize_operator_reconciles_total", &[]),
        common::metric_sum(&text, "kustomize_operator_leader", &[]),
    )
}

/// Two replicas of shard `a` and one of shard `b` serve a defined kind:
/// each Greeting is applied by the process leading its shard (the
/// events' reporting instance, each process's own metrics), the standby
/// reconciles nothing, and when the leader of `a` is SIGKILLed the Lease
/// moves to the standby, which then serves new Greetings of `a`, in the
/// same process, started once.
#[tokio::test]
async fn a_defined_kind_is_served_by_two_shards_and_survives_its_leader() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-shards").await;
    let kind = GreetingKind::new(&ns);
    let ports = [
        common::free_port(),
        common::free_port(),
        common::free_port(),
    ];
    let a1 = shard_replica(&kind, &ns.name, "a", "a1", ports[0]);
    let a2 = shard_replica(&kind, &ns.name, "a", "a2", ports[1]);
    let b1 = shard_replica(&kind, &ns.name, "b", "b1", ports[2]);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let shard = |s: &str| json!({"kustomize-operator.io/shard": s});
    kind.greet(&ns.name, "hello-a", "from shard a", shard("a"));
    kind.greet(&ns.name, "hello-b", "from shard b", shard("b"));
    wait_ready(&kind, &ns.name, "hello-a").await;
    wait_ready(&kind, &ns.name, "hello-b").await;

    let (leader, transitions) =
        common::wait_for(TIMEOUT, "shard a's leader", async || {
            match lease(&ns.name, "a") {
                (holder, transitions) if holder == "a1" || holder == "a2" => {
                    Ok((holder, transitions))
                }
                other => Err(other),
            }
        })
        .await;
    assert_eq!(lease(&ns.name, "b").0, "b1", "shard b's leader");
    let ((gone, gone_port), (stays, stays_port), standby) = if leader == "a1" {
        ((a1, ports[0]), (a2, ports[1]), "a2")
    } else {
        ((a2, ports[1]), (a1, ports[0]), "a1")
    };

    // Each Greeting applied by its shard's leader, and by no other process.
    let by = common::wait_for(
        TIMEOUT,
        "the Applied events of hello-a and hello-b",
        async || {
            let seen = (
                applied_by(&client, &ns.name, "hello-a").await,
                applied_by(&client, &ns.name, "hello-b").await,
            );
            if seen.0.is_empty() || seen.1.is_empty() {
                Err(seen)
            } else {
                Ok(seen)
            }
        },
    )
    .await;
    assert_eq!(by, (vec![leader.clone()], vec!["b1".to_string()]));
    let (leader_reconciles, leading) = reconciles_and_leading(gone_port).await;
    assert!(
        leader_reconciles >= 1.0 && leading == 1.0,
        "{leader}: {leader_reconciles} reconciles, leader {leading}"
    );
    assert_eq!(
        reconciles_and_leading(stays_port).await,
        (0.0, 0.0),
        "the standby {standby} reconciled or leads (reconciles, leader)"
    );
    let (b_reconciles, b_leading) = reconciles_and_leading(ports[2]).await;
    assert!(
        b_reconciles >= 1.0 && b_leading == 1.0,
        "b1: {b_reconciles} reconciles, leader {b_leading}"
    );

    // The leader killed: the Lease moves to the standby.
    let mut stays = stays;
    let stays_pid = stays.pid();
    gone.signal(libc::SIGKILL);
    common::wait_for(
        TIMEOUT,
        format!("shard a's Lease held by {standby}"),
        async || match lease(&ns.name, "a") {
            (holder, moved) if holder == standby && moved > transitions => Ok(()),
            other => Err(other),
        },
    )
    .await;
    kind.greet(&ns.name, "hello-a2", "after the leader", shard("a"));
    wait_ready(&kind, &ns.name, "hello-a2").await;
    assert_eq!(
        config_map_field(&ns.name, "hello-a2", "message"),
        "after the leader"
    );
    let by = common::wait_for(TIMEOUT, "an Applied event about hello-a2", async || {
        let seen = applied_by(&client, &ns.name, "hello-a2").await;
        if seen.is_empty() { Err(seen) } else { Ok(seen) }
    })
    .await;
    assert_eq!(by, vec![standby.to_string()], "hello-a2 applied by");
    let (reconciles, leading) = reconciles_and_leading(stays_port).await;
    assert!(
        reconciles >= 1.0 && leading == 1.0,
        "{standby}: {reconciles} reconciles, leader {leading}"
    );
    // The same process took over, started once (its whole log, not a tail).
    assert!(stays.running(), "{standby} exited:\n{}", stays.log_tail());
    assert_eq!(stays.pid(), stays_pid);
    let log = stays.log();
    assert_eq!(
        log.matches("operator running").count(),
        1,
        "{standby} started again:\n{log}"
    );
    assert_eq!(
        log.matches("acquired the leader lease").count(),
        1,
        "{standby} took the Lease once:\n{log}"
    );
    assert_eq!(
        applied_by(&client, &ns.name, "hello-a").await,
        vec![leader.clone()]
    );

    kind.delete_greetings(&ns.name, &["hello-a", "hello-b", "hello-a2"]);
    common::wait_until(TIMEOUT, "every Greeting deleted by its shard", async || {
        kind.greetings_in(&ns.name).is_empty()
    })
    .await;
    kind.delete().await;
    drop((gone, stays, b1));
}

/// What the webhook's CA renewal does to a CRD calling the webhook: its
/// `caBundle` merge-patched to the CAs trusted now (the one there, twice).
fn renew_the_trusted_cas(crd: &str) {
    use base64::Engine as _;
    let read = common::api::get(&common::api::crds(), None, crd);
    let live = read.unwrap().expect("the CRD");
    let bundle = &live["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"];
    let engine = base64::engine::general_purpose::STANDARD;
    let pem = engine.decode(bundle.as_str().expect("a caBundle")).unwrap();
    let twice = engine.encode([pem.as_slice(), pem.as_slice()].concat());
    let patch = json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": twice}}}}});
    let patched = common::api::merge_patch(&common::api::crds(), None, crd, patch);
    patched.unwrap_or_else(|err| panic!("patching the caBundle of {crd}: {err}"));
}

/// A field of a Greeting's status (`Null` when it or the Greeting is missing).
fn greeting_status(kind: &GreetingKind, ns: &str, name: &str, field: &str) -> Value {
    let read = kind.read(ns, name);
    let greeting = read.ok().flatten().unwrap_or_default();
    greeting["status"][field].clone()
}

/// Waits until each Greeting is served by its revision, its ConfigMap
/// applied by it (`shout` only from revision 2), and the definition counts
/// them.
async fn wait_revisions(kind: &GreetingKind, ns: &str, wanted: &[(&str, u64)], counted: &str) {
    for (name, revision) in wanted {
        let shout = if *revision == 2 { "HI" } else { "" };
        let what = format!("{name} on revision {revision}");
        common::wait_for(TIMEOUT, what, async || {
            let on = greeting_status(kind, ns, name, "revision");
            let field = config_map_field(ns, name, "shout");
            if on == json!(revision) && field == shout {
                Ok(())
            } else {
                Err((on, field))
            }
        })
        .await;
    }
    common::wait_for(
        TIMEOUT,
        format!("the definition counting {counted}"),
        async || {
            let status = kind.definition().unwrap_or_default()["status"].clone();
            if status["onRevisions"] == counted {
                Ok(())
            } else {
                Err(status["onRevisions"].clone())
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_change_reaches_the_canary_first_all_on_promote_and_a_rollback_renders_the_same_bytes() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-rollout").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&["--operator-namespace", &ns.name]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "stable", "hi", json!({}));
    kind.greet(&ns.name, "canary", "hi", json!({"track": "canary"}));
    // The revision guard, where a test installed it cluster-wide, reads the
    // pins a definition allows from its status through the API server's
    // own informer: a pin made the moment the status says Serving may be
    // refused once, and is asked again until accepted.
    let pin = json!({"kustomize-operator.io/revision": "1"});
    let pinned = json!({
        "apiVersion": format!("{}/v1", kind.group),
        "kind": "Greeting",
        "metadata": {"name": "pinned", "namespace": ns.name, "labels": pin},
        "spec": {"message": "hi"},
    });
    common::wait_until(TIMEOUT, "the pinned Greeting accepted", async || {
        common::kubectl_stdin(&["apply", "-f", "-"], &pinned.to_string()).0
    })
    .await;
    let all_on_1 = [("stable", 1), ("canary", 1), ("pinned", 1)];
    wait_revisions(&kind, &ns.name, &all_on_1, "1:3").await;
    let digest = |name: &str| greeting_status(&kind, &ns.name, name, "appliedDigest");
    let before: Vec<Value> = ["stable", "canary"].map(digest).to_vec();

    // Revision 2 goes to the canary only.
    kind.roll_out(json!({"stable": 1, "canary": {"track": "canary"}}));
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    kind.apply();
    let canary = [("canary", 2), ("stable", 1), ("pinned", 1)];
    wait_revisions(&kind, &ns.name, &canary, "1:2 2:1").await;
    let status = kind.definition().unwrap()["status"].clone();
    assert_eq!(
        (&status["revision"], &status["stableRevision"]),
        (&json!(2), &json!(1))
    );
    let (_, kept, _) = common::kubectl(&[
        "get",
        "controllerrevisions",
        "-n",
        &ns.name,
        "-l",
        &format!("kustomize-operator.io/kind-definition={}", kind.name),
        "-o",
        "jsonpath={.items[*].revision}",
    ]);
    assert_eq!(
        kept, "1 2",
        "each revision kept in the operator's namespace"
    );

    // A new operator serves the same revisions, restored from the cluster.
    drop(operator);
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    common::wait_until(TIMEOUT, "the revisions restored", async || {
        operator.log().contains("restored the kept revisions")
    })
    .await;
    assert!(
        operator.log().contains("revisions=[1, 2]"),
        "{}",
        operator.log_tail()
    );

    // Promoted: all but the pinned one move to revision 2 (revision 1,
    // neither stable nor latest now, may be pinned only when named so).
    kind.roll_out(json!({"stable": 2, "canary": null, "pinnable": [1]}));
    let promoted = [("stable", 2), ("canary", 2), ("pinned", 1)];
    wait_revisions(&kind, &ns.name, &promoted, "1:1 2:2").await;

    // Rolled back: revision 1 renders what it rendered, byte for byte.
    kind.roll_out(json!({"stable": 1, "pinnable": null}));
    wait_revisions(&kind, &ns.name, &all_on_1, "1:3").await;
    assert_eq!(["stable", "canary"].map(digest).to_vec(), before);

    // A revision that is not kept is refused; what served goes on.
    kind.roll_out(json!({"stable": 7}));
    let refused = kind
        .wait_condition("Accepted", "False", "RevisionNotKept")
        .await;
    assert!(
        refused.contains("stable 7 is not a kept revision (kept: 1, 2)"),
        "{refused}"
    );
    assert_eq!(
        greeting_status(&kind, &ns.name, "stable", "revision"),
        json!(1)
    );
    kind.roll_out(Value::Null);

    for name in ["stable", "canary", "pinned"] {
        common::kubectl(&["delete", &kind.crd(), name, "-n", &ns.name]);
    }
    kind.delete().await;
    drop(operator);
}

/// The webhook's Secret in `ns`, as JSON.
fn webhook_secret(ns: &str) -> Value {
    let (ok, out, err) = common::kubectl(&[
        "get",
        "secret",
        "kustomize-operator-webhook",
        "-n",
        ns,
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// How many certificates the CRD's `caBundle` holds.
fn trusted_cas(kind: &GreetingKind) -> usize {
    let path = "jsonpath={.spec.conversion.webhook.clientConfig.caBundle}";
    let (_, bundle, _) = common::kubectl(&["get", "crd", &kind.crd(), "-o", path]);
    let pem = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, bundle.trim())
        .unwrap_or_default();
    String::from_utf8_lossy(&pem)
        .matches("BEGIN CERTIFICATE")
        .count()
}

#[tokio::test]
async fn the_webhooks_certificate_is_renewed_while_it_runs_and_no_list_fails() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-renew").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.webhook_flags(&[
        "--conversion-webhook-check",
        "1s",
        "--conversion-webhook-promote-after",
        "6s",
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env = [("NAMESPACE", ns.name.as_str())];
    let operator = OperatorProcess::spawn(&ns.name, &env, &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "one", "hello one", json!({}));
    wait_ready(&kind, &ns.name, "one").await;
    kind.to_v2();
    kind.apply();
    kind.wait_message("Serving", "True", "Running", "generation 2")
        .await;
    assert_eq!(trusted_cas(&kind), 1);
    let before = webhook_secret(&ns.name)["data"]["tls.crt"].clone();
    // Another install's CRD: the same marker label, another webhook.
    let foreign = ForeignCrd::apply(&ns.name);

    // A certificate near its end: its successor is trusted first, then
    // serves, while a client lists at v1 (through the webhook) throughout.
    let reader = ReadsAt::start(format!("greetings.v1.{}", kind.group), ns.name.clone());
    let soon = jiff::Zoned::now()
        .date()
        .saturating_add(jiff::Span::new().days(2));
    let patch = json!({"metadata": {"annotations": {"kustomize-operator.io/webhook-expires": soon.to_string()}}});
    let (ok, _, err) = common::kubectl(&[
        "patch",
        "secret",
        "kustomize-operator-webhook",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
    ]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "both CAs trusted by the CRD", async || {
        trusted_cas(&kind) == 2
    })
    .await;
    assert_eq!(
        foreign.read(),
        (json!(ForeignCrd::CA), json!(1)),
        "another install's CRD untouched (its caBundle, its generation)"
    );
    // Written under the operator's name, as its apply is.
    let (ok, managers, err) = common::kubectl(&[
        "get",
        "crd",
        &kind.crd(),
        "--show-managed-fields",
        "-o",
        "jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation}{\"\\n\"}{end}",
    ]);
    assert!(ok, "{err}");
    assert!(
        managers.lines().any(|m| m == "kustomize-operator/Update"),
        "the caBundle's writer: {managers}"
    );
    assert_eq!(
        webhook_secret(&ns.name)["data"]["tls.crt"],
        before,
        "not served yet"
    );
    common::wait_until(TIMEOUT, "the successor served", async || {
        operator.log().contains("serving the renewed certificate")
    })
    .await;
    let renewed = webhook_secret(&ns.name);
    assert_ne!(renewed["data"]["tls.crt"], before);
    assert_eq!(renewed["data"].get("next.crt"), None, "promoted");
    // A few lists served by the renewed certificate.
    let promoted = reader.made();
    common::wait_until(TIMEOUT, "3 lists after the promotion", async || {
        reader.made() >= (promoted + 3).max(10)
    })
    .await;
    let (reads, failed) = reader.stop().await;
    assert!(reads >= 10, "{reads} lists");
    assert!(
        failed.is_empty(),
        "{} of {reads} lists failed: {failed:?}",
        failed.len()
    );
    // A write at v1 goes through the renewed certificate too.
    kind.write_at(&ns.name, "v1", "one", json!({"message": "renewed"}));
    assert_eq!(
        kind.greeting_at(&ns.name, "v2", "one")["spec"]["text"],
        "renewed"
    );
    common::kubectl(&["delete", &kind.crd(), "one", "-n", &ns.name]);
    kind.delete().await;
    drop(operator);
}

/// A CRD as another install of the operator leaves it: the marker label
/// of its definitions, a conversion webhook of its own. Deleted when
/// dropped.
struct ForeignCrd {
    name: String,
}

impl ForeignCrd {
    /// Its `caBundle` (base64 of `another install's CA`).
    const CA: &str = "YW5vdGhlciBpbnN0YWxsJ3MgQ0E=";

    /// Applies one in an API group named after the namespace `ns`.
    fn apply(ns: &str) -> Self {
        let group = format!("{ns}.foreign.test");
        let name = format!("widgets.{group}");
        let schema = json!({"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}});
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": {"kustomize-operator.io/kind-definition": "another-install"}},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [
                    {"name": "v2", "served": true, "storage": true, "schema": schema},
                    {"name": "v1", "served": true, "storage": false, "schema": schema},
                ],
                "conversion": {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": "https://127.0.0.1:1/convert", "caBundle": Self::CA},
                }},
            },
        });
        let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &crd.to_string());
        assert!(ok, "{err}");
        Self { name }
    }

    /// Its `caBundle` and generation, as the API server has them.
    fn read(&self) -> (Value, Value) {
        let live = common::api::get(&common::api::crds(), None, &self.name);
        let live = live.unwrap().expect("the foreign CRD");
        let config = &live["spec"]["conversion"]["webhook"]["clientConfig"];
        (
            config["caBundle"].clone(),
            live["metadata"]["generation"].clone(),
        )
    }
}

impl Drop for ForeignCrd {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "crd", &self.name, "--wait=false"]);
    }
}

/// Two kinds, one applying the other: the child Greeting kind
/// (cluster-scoped, rendering nothing: Ready as soon as it is applied)
/// and the parent, whose Greetings each apply a child `<name>-child` (its
/// `reach` declares the child kind), served by one operator whose log is
/// read.
struct Nested {
    child: GreetingKind,
    parent: GreetingKind,
    operator: OperatorProcess,
}

impl Nested {
    async fn serve(ns: &TestNamespace) -> Self {
        let child = GreetingKind::tagged(ns, "c");
        child.edit("kind.yaml", |t| {
            let cut = t.find("  overlay:").expect("the overlay");
            t[..cut].replace("scope: Namespaced", "scope: Cluster")
        });
        std::fs::remove_dir_all(child.folder.join("resources")).unwrap();
        let parent = GreetingKind::tagged(ns, "p");
        let group = child.group.clone();
        parent.edit("kind.yaml", |t| {
            t.replace(
                "  scope: Namespaced\n",
                &format!("  scope: Namespaced\n  reach:\n    - {{apiVersion: {group}/v1, kind: Greeting}}\n"),
            )
            .replace(
                "      - template: configmap.yaml\n",
                "      - template: configmap.yaml\n      - template: child.yaml\n",
            )
        });
        let template = format!(
            "apiVersion: {group}/v1\nkind: Greeting\nmetadata:\n  name: {{{{ metadata.name ~ \"-child\" }}}}\nspec:\n  message: {{{{ spec.message }}}}\n"
        );
        std::fs::write(parent.folder.join("resources/child.yaml"), template).unwrap();
        let flags = parent.flags(&[]);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
        child.apply();
        child.wait_condition("Serving", "True", "Running").await;
        parent.apply();
        parent.wait_condition("Serving", "True", "Running").await;
        Self {
            child,
            parent,
            operator,
        }
    }

    /// The parent Greeting `top` and its child, applied and Ready.
    async fn fill(&self, ns: &str) {
        self.parent.greet(ns, "top", "from the parent", json!({}));
        wait_ready(&self.parent, ns, "top").await;
        wait_ready(&self.child, ns, "top-child").await;
    }

    /// `top` deleted (its child with it), then the child kind's
    /// definition and CRD.
    async fn empty_and_drop_the_child_kind(&self, ns: &str) {
        let (ok, _, err) = common::kubectl(&[
            "delete",
            &self.parent.crd(),
            "top",
            "-n",
            ns,
            "--wait=false",
        ]);
        assert!(ok, "{err}");
        let child = self.child.crd();
        common::wait_until(TIMEOUT, "top and its child gone", async || {
            let top = common::kubectl(&["get", &self.parent.crd(), "top", "-n", ns]).0;
            let below = common::kubectl(&["get", &child, "top-child", "-n", ns]).0;
            !top && !below
        })
        .await;
        self.child.delete().await;
        common::wait_until(TIMEOUT, format!("the CRD {child} gone"), async || {
            !common::kubectl(&["get", "crd", &child]).0
        })
        .await;
    }
}

/// A kind's definition deleted and created again with the other scope
/// (what docs/kind-file.md prescribes for a scope change) is found again
/// by a kind that applies its objects: neither the engine's discovery
/// nor kubectl's cache still says the old scope.
#[tokio::test]
async fn a_kind_created_again_with_another_scope_is_applied_again() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-scope").await;
    let nested = Nested::serve(&ns).await;
    nested.fill(&ns.name).await;
    nested.empty_and_drop_the_child_kind(&ns.name).await;

    nested.child.edit("kind.yaml", |t| {
        t.replace("scope: Cluster", "scope: Namespaced")
    });
    nested.child.apply();
    nested
        .child
        .wait_condition("CRDEstablished", "True", "Established")
        .await;
    nested
        .child
        .wait_condition("Serving", "True", "Running")
        .await;
    nested.fill(&ns.name).await;
    let (ok, out, err) = common::kubectl(&[
        "get",
        &nested.child.crd(),
        "top-child",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.metadata.namespace}",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, ns.name, "the child is namespaced now");
    nested.empty_and_drop_the_child_kind(&ns.name).await;
    nested.parent.delete().await;
}

/// Once a kind stops being served, no watch of its objects goes on
/// failing: the parent's watch of its children stops, says so once, and
/// nothing about the kind is logged as failing afterwards.
#[tokio::test]
async fn a_kind_that_stopped_is_no_longer_watched() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-stopped").await;
    let nested = Nested::serve(&ns).await;
    nested.fill(&ns.name).await;
    nested.empty_and_drop_the_child_kind(&ns.name).await;

    let resource = format!("resource={}", nested.child.crd());
    let stopped = |log: &str| {
        log.lines()
            .any(|l| l.contains("stopped watching owned objects") && l.contains(&resource))
    };
    common::wait_until(TIMEOUT, "the watch of the children stopped", async || {
        stopped(&nested.operator.log())
    })
    .await;
    // Longer than the watch's first retries (0.8 s, then 1.6 s): a watch
    // still running would have failed by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = nested.operator.log();
    let failing: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&nested.child.crd()) || l.contains("page not found"))
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert!(failing.is_empty(), "{failing:#?}");
    let stops = log.lines().filter(|l| stopped(l)).count();
    assert_eq!(stops, 1, "said once:\n{log}");
    nested.parent.delete().await;
}

/// `kustomize-operator plan` of the kind's folder as it is now (the
/// change) with `args` and `-o json`: its exit code, report and stderr.
fn plan_json(kind: &GreetingKind, args: &[&str]) -> (Option<i32>, Value, String) {
    let folder = kind.folder.display().to_string();
    let mut argv = vec![folder.as_str(), "-o", "json"];
    argv.extend(args);
    let (code, out, err) = common::operator_command("plan", &argv);
    let report = serde_json::from_str(&out).unwrap_or(Value::Null);
    (code, report, err)
}

/// The resources of a plan's report whose outcome is `outcome`, by name.
fn planned(report: &Value, outcome: &str) -> Vec<String> {
    let resources = report["resources"].as_array().into_iter().flatten();
    resources
        .filter(|r| r["outcome"] == outcome)
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The definition served, 20 Greetings made, the operator stopped: only
/// the plan reads the cluster from there.
async fn twenty_greetings(ns: &TestNamespace, kind: &GreetingKind) {
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    for i in 0..20 {
        let message = match i {
            7 => "hello world".to_string(),
            _ => format!("hello-{i}"),
        };
        kind.greet(&ns.name, &format!("g{i:02}"), &message, json!({}));
    }
    for i in 0..20 {
        wait_ready(kind, &ns.name, &format!("g{i:02}")).await;
    }
    operator.stop().await;
}

#[tokio::test]
async fn plan_names_the_one_greeting_of_20_a_template_would_break_and_passes_a_good_change() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-plan").await;
    let kind = GreetingKind::new(&ns);
    twenty_greetings(&ns, &kind).await;
    let template = kind.folder.join("resources/configmap.yaml");
    let served = std::fs::read_to_string(&template).unwrap();

    // A label from the message: valid for 19 messages, not for "hello world".
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  name: {{ metadata.name }}\n",
            "  name: {{ metadata.name }}\n  labels:\n    said: {{ spec.message }}\n",
        )
    });
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name]);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    assert_eq!(
        report["summary"],
        json!({"resources": 20, "unchanged": 0, "wouldChange": 19, "wouldFail": 1, "wouldLoseFields": 0}),
        "{report:#}"
    );
    assert_eq!(planned(&report, "Fails"), ["g07"]);
    let g07 = &report["resources"][7];
    assert_eq!(g07["revision"], 1, "{g07:#}");
    let failure = &g07["failures"][0];
    assert_eq!(failure["reason"], "Invalid", "{g07:#}");
    assert_eq!(failure["object"]["name"], "g07", "{g07:#}");
    assert!(
        failure["message"].as_str().unwrap().contains("hello world"),
        "{failure}"
    );
    let g00 = &report["resources"][0];
    assert_eq!(g00["objects"][0]["fields"], json!(["metadata.labels.said"]));
    // The table: the counts, then the resource, its reason and the object.
    let folder = kind.folder.display().to_string();
    let (code, table, err) = common::operator_command("plan", &[&folder, "-n", &ns.name]);
    assert_eq!(code, Some(1), "{table}\n{err}");
    assert!(
        table.starts_with(&format!(
            "plan of {}: 20 resources: 0 unchanged, 19 would change, 1 would fail\n",
            kind.name
        )),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.contains(" g07 "))
        .unwrap_or_default();
    assert!(
        line.contains(&ns.name) && line.contains("Invalid") && line.contains("configmap/g07"),
        "{table}"
    );
    // Nothing was written.
    let (_, said, _) = common::kubectl(&[
        "get",
        "configmap",
        "g00",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.metadata.labels.said}",
    ]);
    assert_eq!(said, "", "the plan applied nothing");

    // A good change: every Greeting would change, none fail.
    std::fs::write(
        &template,
        served.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        ),
    )
    .unwrap();
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(report["summary"]["wouldChange"], 20, "{report:#}");
    assert_eq!(report["summary"]["wouldFail"], 0, "{report:#}");
    let resources = report["resources"].as_array().unwrap();
    assert!(
        resources
            .iter()
            .all(|r| r["objects"] == json!([{"object": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns.name, "name": r["name"]}, "change": "Changed", "fields": ["data.shout"]}])),
        "{report:#}"
    );
    // The folder as served: nothing would change.
    std::fs::write(&template, &served).unwrap();
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(report["summary"]["unchanged"], 20, "{report:#}");

    // Without a kubectl to build with, no plan at all: said at once,
    // rather than a build failure for each resource.
    let missing = kind.folder.join("no-kubectl");
    let missing = missing.display().to_string();
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name, "--kubectl", &missing]);
    assert_eq!(code, Some(2), "{report:#}\n{err}");
    assert!(
        err.contains("a plan builds overlays with kubectl kustomize"),
        "{err}"
    );
}

#[tokio::test]
async fn plan_of_a_new_version_names_the_stored_fields_it_would_lose() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-plan-v2").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "hello", "Hello", json!({}));
    kind.write_at(
        &ns.name,
        "v1",
        "ciao",
        json!({"message": "Ciao", "language": "it"}),
    );
    wait_ready(&kind, &ns.name, "ciao").await;
    operator.stop().await;

    // v2 stores `text` (v1's `message`) and a computed `length`, and has
    // no `language`: declared lossy, so the kind loads, and every stored
    // Greeting would lose its language.
    kind.edit("kind.yaml", |t| {
        t.replace(
            "    required: [message]\n    properties:\n      message: {type: string, minLength: 1, maxLength: 200}\n      language: {type: string, enum: [en, it], default: en}\n",
            "    required: [text]\n    properties:\n      text: {type: string, minLength: 1, maxLength: 200}\n      length: {type: integer}\n",
        )
        .replace("jsonPath: .spec.message", "jsonPath: .spec.text")
        .replace(
            "  version: v1\n",
            "  version: v2\n  versions:\n  - name: v1\n    schema:\n      type: object\n      required: [message]\n      properties:\n        message: {type: string, minLength: 1, maxLength: 200}\n        language: {type: string, enum: [en, it], default: en}\n    conversion:\n      moves:\n      - {from: spec.message, to: spec.text}\n      up:\n        spec.length: size(self.spec.message)\n      lossy: [spec.language]\n",
        )
    });
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  message: {{ spec.message }}",
            "  message: {{ spec.text }}",
        )
        .replace(
            "  language: {{ spec.language }}",
            "  length: \"{{ spec.length }}\"",
        )
    });
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name]);
    assert_eq!(
        code,
        Some(0),
        "losing a field declared lossy fails nothing: {report:#}\n{err}"
    );
    assert_eq!(report["summary"]["wouldLoseFields"], 2, "{report:#}");
    assert_eq!(report["guard"]["changes"], json!([]), "v1 is still served");
    for resource in report["resources"].as_array().unwrap() {
        assert_eq!(
            resource["lostFields"],
            json!(["spec.language"]),
            "{resource:#}"
        );
    }
    // The change renders the converted object: v1's message as text, its
    // computed length.
    let hello = &report["resources"][1];
    assert_eq!(hello["name"], "hello");
    let fields = &hello["objects"][0]["fields"];
    // Its ownerReference names the kind at v2 now.
    let changed = json!([
        "data.language",
        "data.length",
        "metadata.ownerReferences[0].apiVersion"
    ]);
    assert_eq!(fields, &changed, "{hello:#}");
    let folder = kind.folder.display().to_string();
    let (_, table, _) = common::operator_command("plan", &[&folder, "-n", &ns.name]);
    assert!(table.contains("would lose fields:\n"), "{table}");
    assert!(
        table.contains(&format!("{}/ciao: spec.language", ns.name)),
        "{table}"
    );
}

#[tokio::test]
async fn plan_dry_runs_as_the_tenant_and_names_what_it_may_not_do_and_what_the_caller_cannot_read()
{
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-plan-as").await;
    let kind = GreetingKind::new(&ns);
    // The kind as the operator serves it, from a packed file; its CRD.
    let current = tempfile::NamedTempFile::new().unwrap();
    let packed = std::process::Command::new(common::operator_binary())
        .args(["kind", "pack"])
        .arg(&kind.folder)
        .output()
        .unwrap();
    assert!(packed.status.success());
    std::fs::write(current.path(), &packed.stdout).unwrap();
    let current = current.path().display().to_string();
    let (code, crd, err) = common::operator_command(
        "crd",
        &["--kind-definition", &current, "--kinds", &kind.name],
    );
    assert_eq!(code, Some(0), "{err}");
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &crd);
    assert!(ok, "{err}");
    common::wait_established(&[&kind.crd()]).unwrap();
    kind.greet(&ns.name, "a", "Hello", json!({}));
    kind.greet(&ns.name, "b", "Ciao", json!({}));
    let role = |verbs: &str| {
        format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: deployer, namespace: {ns}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: deployer, namespace: {ns}}}\nrules: [{{apiGroups: [\"\"], resources: [configmaps], verbs: [{verbs}]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: deployer, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: deployer}}\nsubjects: [{{kind: ServiceAccount, name: deployer, namespace: {ns}}}]\n",
            ns = ns.name
        )
    };
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &role("get, list"));
    assert!(ok, "{err}");
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    let as_deployer = [
        "--current",
        current.as_str(),
        "-n",
        &ns.name,
        "--default-service-account",
        "deployer",
    ];
    let (code, report, err) = plan_json(&kind, &as_deployer);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    assert_eq!(planned(&report, "Fails"), ["a", "b"], "{report:#}");
    let failure = &report["resources"][0]["failures"][0];
    assert_eq!(failure["reason"], "Forbidden", "{failure:#}");
    let message = failure["message"].as_str().unwrap();
    let account = format!("system:serviceaccount:{}:deployer", ns.name);
    assert!(
        message.contains(&account) && message.contains("configmaps"),
        "{message}"
    );
    // The operator's own identity (the caller's here) may.
    let (code, report, err) = plan_json(&kind, &as_deployer[..4]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    // Granted the writes, the tenant may too.
    let (ok, _, err) = common::kubectl_stdin(
        &["apply", "-f", "-"],
        &role("get, list, create, patch, update"),
    );
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "the plan as the tenant to pass", async || {
        plan_json(&kind, &as_deployer).0 == Some(0)
    })
    .await;

    // A renamed ConfigMap is a new object; one of that name exists,
    // not made by the Greeting: the operator would not take it over.
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  name: {{ metadata.name }}\n",
            "  name: {{ metadata.name ~ \"-v2\" }}\n",
        )
    });
    let (ok, _, err) = common::kubectl(&["create", "configmap", "a-v2", "-n", &ns.name]);
    assert!(ok, "{err}");
    let (code, report, err) = plan_json(&kind, &as_deployer[..4]);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    assert_eq!(planned(&report, "Fails"), ["a"], "{report:#}");
    let a = &report["resources"][0];
    let kinds: Vec<&Value> = a["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["change"])
        .collect();
    assert_eq!(kinds, [&json!("Pruned"), &json!("Added")], "{a:#}");
    assert_eq!(a["failures"][0]["reason"], "OwnershipConflict", "{a:#}");
    assert_eq!(a["failures"][0]["object"]["name"], "a-v2", "{a:#}");

    // A caller who cannot list the kind is told which right is missing.
    let token = common::TokenKubeconfig::mint(&client, &ns.name, "deployer").await;
    let folder = kind.folder.display().to_string();
    let (code, out, err) = common::operator_command_as(
        "plan",
        &[&folder, "--current", &current, "-n", &ns.name],
        Some(token.path()),
    );
    assert_eq!(code, Some(2), "{out}\n{err}");
    let missing = format!(
        "missing rights: list greetings.{} in namespace {}",
        kind.group, ns.name
    );
    assert!(err.contains(&missing), "{err}");
}

#[tokio::test]
async fn plan_compares_each_greeting_with_the_kept_revision_serving_it() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-plan-rev").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&["--operator-namespace", &ns.name]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.greet(&ns.name, "stable", "hi", json!({}));
    kind.greet(&ns.name, "canary", "hi", json!({"track": "canary"}));
    wait_revisions(&kind, &ns.name, &[("stable", 1), ("canary", 1)], "1:2").await;
    kind.roll_out(json!({"stable": 1, "canary": {"track": "canary"}}));
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    kind.apply();
    let canary = [("canary", 2), ("stable", 1)];
    wait_revisions(&kind, &ns.name, &canary, "1:1 2:1").await;
    operator.stop().await;

    // The folder is revision 2: the canary already has it, the stable
    // Greeting (on revision 1, read back from its ControllerRevision)
    // would gain the field.
    let (code, report, err) = plan_json(&kind, &["-n", &ns.name, "--operator-namespace", &ns.name]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(
        report["current"],
        format!(
            "the KindDefinition {} in the cluster (latest revision 2, stable 1)",
            kind.name
        )
    );
    let (canary, stable) = (&report["resources"][0], &report["resources"][1]);
    assert_eq!(
        (&canary["name"], &canary["revision"]),
        (&json!("canary"), &json!(2))
    );
    assert_eq!(canary["outcome"], "Unchanged", "{report:#}");
    assert_eq!(
        (&stable["name"], &stable["revision"]),
        (&json!("stable"), &json!(1))
    );
    assert_eq!(stable["outcome"], "Changes", "{report:#}");
    assert_eq!(
        stable["objects"][0]["fields"],
        json!(["data.shout"]),
        "{report:#}"
    );
}

// Automatic rollouts (issue 61, item 3): `spec.rollout.steps` moves the
// latest revision to more resources step by step, each step gated by the
// health of the resources it moved, and rolls back by itself.

use std::collections::{BTreeMap, BTreeSet};

/// The record of the definition's automatic rollout (its annotation
/// `kustomize-operator.io/rollout`), `Null` when it has none.
fn rollout_record(kind: &GreetingKind) -> Value {
    let definition = kind.definition().unwrap_or_default();
    let text = &definition["metadata"]["annotations"]["kustomize-operator.io/rollout"];
    (text.as_str())
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// Each Greeting of `ns`: the revision its status says, and the digest of
/// what it applied.
fn greeting_states(kind: &GreetingKind, ns: &str) -> BTreeMap<String, (Value, Value)> {
    (kind.greetings_in(ns).iter())
        .map(|g| {
            let name = g["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let status = &g["status"];
            (
                name,
                (status["revision"].clone(), status["appliedDigest"].clone()),
            )
        })
        .collect()
}

/// The names of the ConfigMaps of `ns` whose data has `field`: the
/// Greetings a revision adding `field` was applied for.
fn config_maps_with(ns: &str, field: &str) -> BTreeSet<String> {
    let listed = common::api::list(&common::api::config_maps(), Some(ns));
    let config_maps = listed.unwrap_or_else(|err| panic!("listing the ConfigMaps: {err}"));
    (config_maps.iter())
        .filter(|cm| !cm["data"][field].is_null())
        .filter_map(|cm| cm["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Creates the Greetings `names` in `ns` (the first labelled
/// `track=canary`, saying `first`; the others `hi`) and waits until each is
/// Ready on revision `revision`.
async fn greet_all(kind: &GreetingKind, ns: &str, names: &[String], first: &str, revision: u32) {
    for (i, name) in names.iter().enumerate() {
        let (message, labels) = match i {
            0 => (first, json!({"track": "canary"})),
            _ => ("hi", json!({})),
        };
        kind.greet(ns, name, message, labels);
    }
    common::wait_for(
        TIMEOUT,
        format!("{} Greetings Ready on revision {revision}", names.len()),
        async || {
            let states = greeting_states(kind, ns);
            let behind: Vec<&String> = (names.iter())
                .filter(|n| {
                    states
                        .get(*n)
                        .is_none_or(|(r, d)| *r != json!(revision) || d.is_null())
                })
                .collect();
            if behind.is_empty() {
                Ok(())
            } else {
                Err(behind.len())
            }
        },
    )
    .await;
    for name in names {
        wait_ready(kind, ns, name).await;
    }
}

/// The Greetings of `names` a rollout at `step` (from 0) of the steps
/// `canary, then each of percents` has moved: the canary (the first
/// name), then those whose namespace/name hashes into the share.
fn share(ns: &str, names: &[String], percents: &[u8], step: usize) -> BTreeSet<String> {
    use kustomize_operator::kinds::declared::rollout::steps::in_share;
    let percent = match step {
        0 => 0,
        k => percents[k - 1],
    };
    (names.iter().enumerate())
        .filter(|(i, name)| *i == 0 || (percent > 0 && in_share(Some(ns), name, percent)))
        .map(|(_, name)| name.clone())
        .collect()
}

/// Events about the definition with `reason` (cluster-scoped: in `default`).
async fn definition_events(
    client: &kube::Client,
    kind: &GreetingKind,
    reason: &str,
) -> Vec<String> {
    let events =
        kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap();
    (events.items.into_iter())
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(kind.name.as_str())
        })
        .filter_map(|e| e.note)
        .collect()
}

/// The rollout of a template change that breaks one Greeting of 20 — its
/// ConfigMap rendered invalid for the message `boom` — stops by itself
/// after its first step (the canary: that Greeting), goes back to the
/// stable revision byte for byte, leaves the 19 others untouched, does not
/// promote the latest, and says why in the status, an event and the
/// metrics. A stable revision that is not kept refuses the rollout.
#[tokio::test]
async fn a_change_that_breaks_1_of_20_rolls_back_by_itself_after_its_first_step() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-rollback").await;
    let kind = GreetingKind::new(&ns);
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = kind.flags(&["--operator-namespace", &ns.name, "--metrics-addr", &addr]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let steps = json!([{"canary": true}, {"percent": 50}, {"percent": 100}]);
    kind.roll_out(
        json!({"canary": {"track": "canary"}, "steps": steps, "gate": {"window": "15s"}}),
    );
    // Unset, `stable` is taken to be what serves every resource now.
    kind.wait_message("RolledOut", "True", "Complete", "revision 1 is stable")
        .await;
    let definition = kind.definition().unwrap();
    assert_eq!(definition["spec"]["rollout"]["stable"], 1);
    let names: Vec<String> = std::iter::once("boom".to_string())
        .chain((1..20).map(|i| format!("g-{i:02}")))
        .collect();
    greet_all(&kind, &ns.name, &names, "boom", 1).await;
    let before = greeting_states(&kind, &ns.name);

    // Revision 2 adds `shout`, and for `boom` a data value that is no string.
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}\n{%- if spec.message == \"boom\" %}\n  broken: 1\n{%- endif %}",
        )
    });
    kind.apply();
    let rolled_back = kind
        .wait_message(
            "RolledOut",
            "False",
            "GateTimedOut",
            "revision 2 rolled back at step 1 of 3",
        )
        .await;
    assert!(
        rolled_back.contains(&format!("{}/boom (ApplyFailed", ns.name)),
        "{rolled_back}"
    );
    assert!(rolled_back.contains("back on revision 1"), "{rolled_back}");
    let record = rollout_record(&kind);
    assert_eq!(
        (&record["phase"], &record["step"], &record["revision"]),
        (&json!("RolledBack"), &json!(0), &json!(2))
    );
    // Back on the stable revision, byte for byte: the digest it applied before.
    common::wait_for(TIMEOUT, "boom back on revision 1, as before", async || {
        let now = greeting_states(&kind, &ns.name);
        if now["boom"] == before["boom"] {
            Ok(())
        } else {
            Err(now["boom"].clone())
        }
    })
    .await;
    wait_ready(&kind, &ns.name, "boom").await;
    // The 19 others never moved: the same digest, revision 1, no `shout`.
    let after = greeting_states(&kind, &ns.name);
    for name in &names[1..] {
        assert_eq!(after[name], before[name], "{name} was touched");
    }
    assert_eq!(config_maps_with(&ns.name, "shout"), BTreeSet::new());
    // The latest is not promoted.
    let definition = kind.definition().unwrap();
    assert_eq!(definition["spec"]["rollout"]["stable"], 1);
    let status = &definition["status"];
    assert_eq!(
        (&status["revision"], &status["stableRevision"]),
        (&json!(2), &json!(1))
    );
    assert_eq!(status["rollout"]["phase"], "RolledBack");
    assert_eq!(
        status["rollout"]["progress"],
        "revision 2 rolled back at step 1 of 3"
    );
    let told = common::wait_for(TIMEOUT, "a RolledBack event", async || {
        let notes = definition_events(&client, &kind, "RolledBack").await;
        if notes.is_empty() {
            Err(notes)
        } else {
            Ok(notes)
        }
    })
    .await;
    assert!(
        told[0].contains("rolled back at step 1 of 3") && told[0].contains("boom"),
        "{told:?}"
    );
    let (_, metrics) = common::http_get(port, "/metrics").await.expect("metrics");
    let label = format!("definition=\"{}\"", kind.name);
    assert_eq!(
        common::metric_sum(
            &metrics,
            "kustomize_operator_rollout_rollbacks_total",
            &[&label]
        ),
        1.0
    );
    assert_eq!(
        common::metric_sum(&metrics, "kustomize_operator_rollout_steps", &[&label]),
        3.0
    );

    // A gate's CEL is bounded as every expression: a loop in a loop is
    // refused when the definition is checked, and what served goes on.
    let nested = "resources.all(r, resources.exists(s, s.metadata.name == r.metadata.name))";
    kind.roll_out(json!({"gate": {"window": "15s", "expression": nested}}));
    let refused = kind.wait_condition("Accepted", "False", "Invalid").await;
    assert!(
        refused.starts_with(
            "spec.rollout.gate.expression: comprehensions (all, exists, filter, map) may not nest"
        ),
        "{refused}"
    );
    kind.roll_out(json!({"gate": {"window": "15s", "expression": null}}));
    kind.wait_condition("Accepted", "True", "Valid").await;

    // A stable revision that is not kept: nothing starts, the condition says so.
    kind.roll_out(json!({"stable": 9}));
    let refused = kind
        .wait_condition("RolledOut", "False", "RevisionNotKept")
        .await;
    assert!(
        refused
            .contains("does not start: spec.rollout.stable 9 is not a kept revision (kept: 1, 2)"),
        "{refused}"
    );
    assert_eq!(greeting_states(&kind, &ns.name)["g-01"], before["g-01"]);
    kind.roll_out(json!({"stable": 1}));

    kind.delete_greetings(&ns.name, &names);
    kind.delete().await;
    drop(operator);
}

/// A good change reaches every one of 20 Greetings through every step
/// with no human action: at each step exactly its hashed share moved
/// (nothing beyond it, and all of the steps before it), and at the end
/// every Greeting is on the latest revision, which is stable.
#[tokio::test]
async fn a_good_change_reaches_all_20_through_every_step_by_itself() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-steps").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&["--operator-namespace", &ns.name]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let percents = [25, 50, 100];
    let steps = json!([{"canary": true}, {"percent": 25}, {"percent": 50}, {"percent": 100}]);
    kind.roll_out(json!({"canary": {"track": "canary"}, "steps": steps}));
    kind.wait_message("RolledOut", "True", "Complete", "revision 1 is stable")
        .await;
    let names: Vec<String> = (0..20).map(|i| format!("g-{i:02}")).collect();
    greet_all(&kind, &ns.name, &names, "hi", 1).await;
    let all: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(
        share(&ns.name, &names, &percents, 3),
        all,
        "the last step takes all"
    );

    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    kind.apply();
    // Sampled: the record, the ConfigMaps moved, the record again; a
    // sample whose two reads agree saw the cluster at that step: nothing
    // beyond its share moved, and all of the shares before it. (A step
    // that adds no resource passes at once, between two samples: each
    // step is checked again below, by what the operator counted.)
    common::wait_for(
        Duration::from_secs(180),
        "the rollout of revision 2 promoted",
        async || {
            let record = rollout_record(&kind);
            let moved = config_maps_with(&ns.name, "shout");
            if rollout_record(&kind) != record || record["revision"] != 2 {
                return Err(record);
            }
            if record["phase"] == "Promoted" {
                return Ok(());
            }
            assert_eq!(record["phase"], "Progressing", "{record}");
            let step = record["step"].as_u64().unwrap() as usize;
            let reached = share(&ns.name, &names, &percents, step);
            assert!(
                moved.is_subset(&reached),
                "at step {step}: moved {moved:?}, beyond {reached:?}"
            );
            if step > 0 {
                let before = share(&ns.name, &names, &percents, step - 1);
                assert!(
                    before.is_subset(&moved),
                    "at step {step}: {before:?} not all moved: {moved:?}"
                );
            }
            Err(record)
        },
    )
    .await;
    // Which steps were sampled depends on timing (a step whose resources
    // are Ready at once may pass between two samples); every step is
    // checked below by the count the operator gave when its gate passed.
    common::wait_for(TIMEOUT, "every Greeting on revision 2", async || {
        let moved = config_maps_with(&ns.name, "shout");
        let on: BTreeSet<String> = (greeting_states(&kind, &ns.name).into_iter())
            .filter(|(_, (revision, _))| *revision == json!(2))
            .map(|(name, _)| name)
            .collect();
        if moved == all && on == all {
            Ok(())
        } else {
            Err((moved.len(), on.len()))
        }
    })
    .await;
    let message = kind
        .wait_message("RolledOut", "True", "Complete", "revision 2")
        .await;
    assert!(message.contains("revision 2 is stable"), "{message}");
    let definition = kind.definition().unwrap();
    assert_eq!(definition["spec"]["rollout"]["stable"], 2, "promoted");
    // The promotion's status says so at once; `stableRevision` is the
    // stable revision serving, which moves when the generation the
    // promotion made is served: a look or two later.
    common::wait_for(TIMEOUT, "revision 2 the stable one serving", async || {
        let status = kind.definition().unwrap_or_default()["status"].clone();
        let settled = status["stableRevision"] == 2
            && status["rollout"]["progress"] == "complete: revision 2 is stable";
        if settled { Ok(()) } else { Err(status) }
    })
    .await;
    let (_, columns, _) = common::kubectl(&["get", "kinddefinition", &kind.name, "--no-headers"]);
    assert!(
        columns.contains("complete: revision 2 is stable"),
        "{columns}"
    );
    // Each step passed with exactly its share on revision 2, as counted
    // when its gate passed (from the resources' statuses).
    let passed = definition_events(&client, &kind, "RolloutStep").await;
    for step in 0..3 {
        let moved = share(&ns.name, &names, &percents, step).len();
        let note = format!(
            "step {} of 4 passed its gate: step {} begins ({moved} of 20 resources on revision 2)",
            step + 1,
            step + 2
        );
        assert!(passed.contains(&note), "{note:?} in {passed:?}");
    }
    let promoted = definition_events(&client, &kind, "Promoted").await;
    let note = "every step passed its gate (20 of 20 resources on revision 2): revision 2 is stable (spec.rollout.stable)";
    assert_eq!(promoted, [note]);

    kind.delete_greetings(&ns.name, &names);
    kind.delete().await;
    drop(operator);
}

/// `spec.rollout.paused` holds a rollout at its step — through a restart
/// of the operator, which reads where it is from the definition — and
/// clearing it lets the rollout go on to the end. A change of the files
/// in the middle of a rollout starts it over for the new revision and
/// leaves no resource on the one it replaces, which is no longer kept.
#[tokio::test]
async fn a_paused_rollout_holds_across_a_restart_and_a_change_midway_starts_over() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-pause").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&["--operator-namespace", &ns.name]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let percents = [25, 50, 75, 100];
    let steps = json!([{"canary": true}, {"percent": 25}, {"percent": 50}, {"percent": 75}, {"percent": 100}]);
    kind.roll_out(json!({"canary": {"track": "canary"}, "steps": steps}));
    kind.wait_message("RolledOut", "True", "Complete", "revision 1 is stable")
        .await;
    let names: Vec<String> = (0..10).map(|i| format!("p-{i:02}")).collect();
    greet_all(&kind, &ns.name, &names, "hi", 1).await;

    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  language: {{ spec.language }}",
            "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
        )
    });
    kind.apply();
    common::wait_for(
        TIMEOUT,
        "the rollout of revision 2 at its second step",
        async || {
            let record = rollout_record(&kind);
            if record["revision"] == 2 && record["step"].as_u64() >= Some(1) {
                Ok(())
            } else {
                Err(record)
            }
        },
    )
    .await;
    kind.roll_out(json!({"paused": true}));
    // Held: its gate passed (every resource of the step moved), no step more.
    kind.wait_message("RolledOut", "False", "Paused", "its gate passed")
        .await;
    let held = rollout_record(&kind);
    assert_eq!(held["phase"], "Paused", "{held}");
    let step = held["step"].as_u64().unwrap() as usize;
    assert!(step < 4, "paused at step {step} of 5");
    let moved = config_maps_with(&ns.name, "shout");
    assert_eq!(
        moved,
        share(&ns.name, &names, &percents, step),
        "at step {step}"
    );

    // A new operator reads where the rollout is, and holds it there.
    drop(operator);
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = kind.flags(&["--operator-namespace", &ns.name, "--metrics-addr", &addr]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = OperatorProcess::spawn(&ns.name, &[], &flags);
    let label = format!("definition=\"{}\"", kind.name);
    common::wait_for(TIMEOUT, "the new operator at the paused step", async || {
        let text = common::http_get(port, "/metrics")
            .await
            .map(|(_, t)| t)
            .unwrap_or_default();
        let at = common::metric_sum(&text, "kustomize_operator_rollout_step", &[&label]);
        if at == (step + 1) as f64 {
            Ok(())
        } else {
            Err(at)
        }
    })
    .await;
    assert_eq!(rollout_record(&kind), held, "the record is as it was");
    assert_eq!(config_maps_with(&ns.name, "shout"), moved, "nothing moved");
    let status = kind.definition().unwrap()["status"]["rollout"].clone();
    assert_eq!(status["phase"], "Paused");
    assert!(
        status["progress"]
            .as_str()
            .unwrap()
            .starts_with(&format!("paused at step {} of 5", step + 1)),
        "{status}"
    );

    // Resumed: on to the end.
    kind.roll_out(json!({"paused": null}));
    kind.wait_message("RolledOut", "True", "Complete", "revision 2")
        .await;
    let all: BTreeSet<String> = names.iter().cloned().collect();
    common::wait_for(TIMEOUT, "every Greeting on revision 2", async || {
        let moved = config_maps_with(&ns.name, "shout");
        if moved == all { Ok(()) } else { Err(moved) }
    })
    .await;
    assert_eq!(kind.definition().unwrap()["spec"]["rollout"]["stable"], 2);
    assert!(
        !definition_events(&client, &kind, "RolloutResumed")
            .await
            .is_empty()
    );

    // A change in the middle of a rollout: revision 3 (adding `whisper`)
    // at its second step when revision 4 (adding `hush`) comes; keeping 2
    // revisions, 3 is dropped. The rollout starts over for 4, and no
    // Greeting is left on 3: each goes back to the stable 2, then on to 4.
    kind.roll_out(json!({"keep": 2}));
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  shout: {{ spec.message | upper }}",
            "  shout: {{ spec.message | upper }}\n  whisper: {{ spec.message | lower }}",
        )
    });
    kind.apply();
    common::wait_for(
        TIMEOUT,
        "the rollout of revision 3 at its second step",
        async || {
            let record = rollout_record(&kind);
            let ok = record["revision"] == 3 && record["step"].as_u64() >= Some(1);
            if ok { Ok(()) } else { Err(record) }
        },
    )
    .await;
    assert!(
        config_maps_with(&ns.name, "whisper").contains("p-00"),
        "the canary on 3"
    );
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  whisper: {{ spec.message | lower }}",
            "  whisper: {{ spec.message | lower }}\n  hush: \"...\"",
        )
    });
    kind.apply();
    common::wait_for(
        TIMEOUT,
        "revision 3 dropped, no Greeting left on it",
        async || {
            let record = rollout_record(&kind);
            let status = kind.definition().unwrap_or_default()["status"].clone();
            let kept: Vec<Value> = (status["revisions"].as_array().into_iter().flatten())
                .map(|r| r["revision"].clone())
                .collect();
            let on_3: BTreeSet<String> = config_maps_with(&ns.name, "whisper")
                .difference(&config_maps_with(&ns.name, "hush"))
                .cloned()
                .collect();
            let from = &record["from"];
            if record["revision"] == 4
                && *from == 2
                && kept == [json!(2), json!(4)]
                && on_3.is_empty()
            {
                Ok(())
            } else {
                Err((record, kept, on_3))
            }
        },
    )
    .await;
    kind.wait_message("RolledOut", "True", "Complete", "revision 4")
        .await;
    common::wait_for(TIMEOUT, "every Greeting on revision 4", async || {
        let on_4 = config_maps_with(&ns.name, "hush");
        let states = greeting_states(&kind, &ns.name);
        let on_3 = states.values().filter(|(r, _)| *r == json!(3)).count();
        if on_4 == all && on_3 == 0 {
            Ok(())
        } else {
            Err((on_4.len(), on_3))
        }
    })
    .await;
    assert_eq!(kind.definition().unwrap()["spec"]["rollout"]["stable"], 4);

    kind.delete_greetings(&ns.name, &names);
    kind.delete().await;
    drop(operator);
}

/// A change of the files is planned in the cluster before it is served
/// (issue 61, item 2). With `spec.rollout.plan: Wait`, a template that
/// breaks 1 Greeting of 20 waits: the plan's summary in the status names
/// it, `Planned` and `Accepted` say why, revision 1 keeps serving and
/// nothing is applied. Fixed, the change is planned again, passes and is
/// served to all 20.
#[tokio::test]
async fn a_change_whose_plan_fails_waits_with_the_plan_in_the_status_and_a_good_one_is_served() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-plan-wait").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let operator = common::start_operator(&ns.name, &flags).await;
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    for i in 0..20 {
        let message = match i {
            7 => "hello world".to_string(),
            _ => format!("hello-{i}"),
        };
        kind.greet(&ns.name, &format!("g{i:02}"), &message, json!({}));
    }
    for i in 0..20 {
        wait_ready(&kind, &ns.name, &format!("g{i:02}")).await;
    }
    kind.roll_out(json!({"plan": "Wait"}));
    // Generation 2 (the rollout's setting alone) is served before the
    // change that fails its plan comes.
    kind.wait_observed(2).await;
    // A label from the message: valid for 19 messages, not for "hello world".
    kind.edit("resources/configmap.yaml", |t| {
        t.replace(
            "  name: {{ metadata.name }}\n",
            "  name: {{ metadata.name }}\n  labels:\n    said: {{ spec.message }}\n",
        )
    });
    kind.apply();
    let accepted = kind
        .wait_message("Accepted", "False", "PlanFailed", "it waits")
        .await;
    let status = kind.definition().unwrap()["status"].clone();
    let plan = &status["plan"];
    assert_eq!(
        (&plan["resources"], &plan["wouldChange"], &plan["wouldFail"]),
        (&json!(20), &json!(19), &json!(1)),
        "{status:#}"
    );
    let first = plan["failures"][0].as_str().unwrap_or_default();
    assert!(
        first.starts_with(&format!("{}/g07: Invalid: ", ns.name)) && first.contains("hello world"),
        "{status:#}"
    );
    assert!(
        accepted.contains("generation 2 keeps serving"),
        "{accepted}"
    );
    let planned = kind.wait_condition("Planned", "False", "PlanFailed").await;
    assert!(planned.contains("1 would fail"), "{planned}");
    assert_eq!(status["revision"], 1, "no revision 2: {status:#}");
    assert!(
        config_maps_with(&ns.name, "language").len() == 20,
        "the Greetings' ConfigMaps stay"
    );
    let (_, said, _) = common::kubectl(&[
        "get",
        "configmaps",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.items[*].metadata.labels.said}",
    ]);
    assert_eq!(said, "", "nothing of the waiting change was applied");

    // Fixed: planned again, it passes and is served to every Greeting.
    kind.edit("resources/configmap.yaml", |t| {
        t.replace("  labels:\n    said: {{ spec.message }}\n", "")
            .replace(
                "  language: {{ spec.language }}",
                "  language: {{ spec.language }}\n  shout: {{ spec.message | upper }}",
            )
    });
    kind.apply();
    let planned = kind.wait_condition("Planned", "True", "PlanPassed").await;
    assert!(
        planned.contains("20 would change, 0 would fail"),
        "{planned}"
    );
    kind.wait_condition("Accepted", "True", "Valid").await;
    common::wait_for(TIMEOUT, "every Greeting's ConfigMap shouting", async || {
        let shouting = config_maps_with(&ns.name, "shout");
        if shouting.len() == 20 {
            Ok(())
        } else {
            Err(shouting)
        }
    })
    .await;
    let names: Vec<String> = (0..20).map(|i| format!("g{i:02}")).collect();
    kind.delete_greetings(&ns.name, &names);
    kind.delete().await;
    drop(operator);
}

/// A kind of two versions from its first generation, a Greeting written
/// at the older one: the API server's server-side apply of the operator at
/// v2 reads the live object through the webhook, and a field the older
/// version does not declare in the webhook's answer (`spec.length`,
/// computed going up, kept going down) failed every apply with "field not
/// declared in schema" on Kubernetes 1.37: the webhook prunes its answer to
/// the version's schema.
#[tokio::test]
async fn a_greeting_written_at_the_older_version_of_a_new_two_version_kind_is_ready() {
    let client = common::cluster().await;
    let ns = TestNamespace::new(&client, "kd-v1-into-v2").await;
    let kind = GreetingKind::new(&ns);
    let flags = kind.webhook_flags(&[]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env = [("NAMESPACE", ns.name.as_str())];
    let operator = OperatorProcess::spawn(&ns.name, &env, &flags);
    kind.to_v2();
    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    kind.write_at(&ns.name, "v1", "one", json!({"message": "before"}));
    wait_ready(&kind, &ns.name, "one").await;
    let at_v1 = kind.greeting_at(&ns.name, "v1", "one");
    assert_eq!(at_v1["spec"]["message"], "before", "{at_v1}");
    assert!(at_v1["spec"].get("length").is_none(), "pruned: {at_v1}");
    let at_v2 = kind.greeting_at(&ns.name, "v2", "one");
    assert_eq!(at_v2["spec"]["text"], "before", "{at_v2}");
    common::kubectl(&["delete", &kind.crd(), "one", "-n", &ns.name]);
    kind.delete().await;
    drop(operator);
}
