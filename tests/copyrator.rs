//! CopyratorRule (flant.com/v1) against the real control plane. Each test
//! has its own source namespace (where the operator runs, `--namespace`) and
//! its own target namespaces; a rule that targets "every namespace" is only
//! ever used with `--copyrator-namespace-selector` naming a label on this
//! test's namespaces, so no test copies into anyone else's.

use ko_test_support as common;

use kustomize_operator::kind::{ConditionStatus, ConditionType, Reason};

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kinds::copyrator::{
    CopyratorRule, CopyratorRuleSpec, CopyratorRuleStatus, DeletionPolicy, RuleType,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);
const RULE_LABEL: &str = "copyrator.flant.com/rule";

/// Everything the operator logs in this test binary (at debug level, trace
/// for the operator itself), to check that no Secret data reaches the logs.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,kustomize_operator=trace",
            ))
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .try_init();
    });
}

/// Removes the finalizer of every rule left in a namespace when dropped, so
/// that a test that stopped early (or left rules behind) does not leave its
/// namespace terminating forever once the operator is gone.
struct ReleaseRules(String);

impl Drop for ReleaseRules {
    fn drop(&mut self) {
        // Deleting first: an operator still running does not add a finalizer
        // back to a rule being deleted.
        let _ = common::kubectl(&[
            "delete",
            "copyrators",
            "--all",
            "-n",
            &self.0,
            "--wait=false",
        ]);
        let (_, out, _) = common::kubectl(&["get", "copyrators", "-n", &self.0, "-o", "name"]);
        for rule in out.lines().filter(|l| !l.is_empty()) {
            let _ = common::kubectl(&[
                "patch",
                "-n",
                &self.0,
                rule,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
        }
    }
}

/// Creates `object` through `api`; the test fails if the API server refuses it.
async fn create<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    api.create(&PostParams::default(), object)
        .await
        .expect("the API server creates it");
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn rule(
    name: &str,
    rule_type: RuleType,
    selector: &[(&str, &str)],
    namespaces: &[&str],
    deletion_policy: Option<DeletionPolicy>,
) -> CopyratorRule {
    CopyratorRule::new(
        name,
        CopyratorRuleSpec {
            rule_type: Some(rule_type),
            selector: Some(labels(selector)),
            namespaces: Some(namespaces.iter().map(|s| s.to_string()).collect()),
            deletion_policy,
        },
    )
}

fn config_map(name: &str, label_pairs: &[(&str, &str)], value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels(label_pairs)},
        "data": {"value": value, "multi": "line one\nline two\n"},
        "binaryData": {"blob": "AAECAw=="}
    }))
    .unwrap()
}

async fn rule_status(rules: &Api<CopyratorRule>, name: &str) -> CopyratorRuleStatus {
    rules.get(name).await.unwrap().status.unwrap_or_default()
}

async fn wait_ready(rules: &Api<CopyratorRule>, name: &str) -> CopyratorRuleStatus {
    common::wait_for(TIMEOUT, format!("the rule {name} Ready"), || async {
        let s = rule_status(rules, name).await;
        if s.common.is_ready() && s.common.observed_generation.is_some() {
            Ok(s)
        } else {
            Err(s)
        }
    })
    .await
}

async fn get_cm(client: &Client, ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

async fn cm_value(client: &Client, ns: &str, name: &str) -> Option<String> {
    get_cm(client, ns, name)
        .await
        .and_then(|c| c.data)
        .and_then(|d| d.get("value").cloned())
}

async fn wait_cm_value(client: &Client, namespaces: &[&str], name: &str, value: Option<&str>) {
    common::wait_until(
        TIMEOUT,
        format!("the ConfigMap {name} to hold {value:?} (None: to be gone) in {namespaces:?}"),
        || async {
            for ns in namespaces {
                if cm_value(client, ns, name).await.as_deref() != value {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

async fn events(client: &Client, ns: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

async fn add_namespace_label(client: &Client, ns: &str, key: &str, value: &str) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .unwrap();
}

/// One test's cluster: its source namespace (where its rules live and its
/// operator watches), its target namespaces, and the ConfigMaps and rules
/// of the source namespace. Dropped after the test's operator (declare the
/// operator after it): the rules are released, then the namespaces go.
struct Fixture {
    client: Client,
    /// The source namespace's ConfigMaps.
    cms: Api<ConfigMap>,
    /// The source namespace's rules.
    rules: Api<CopyratorRule>,
    targets: Vec<common::TestNamespace>,
    // Fields drop in order: the rules are released before their namespace goes.
    _release: ReleaseRules,
    src: common::TestNamespace,
}

impl Fixture {
    /// The source namespace `ko-<prefix>-...` and `targets` target
    /// namespaces `ko-<prefix>t<i>-...`; the operator's logs captured.
    async fn new(prefix: &str, targets: usize) -> Self {
        capture_logs();
        let client = common::cluster().await;
        let src = common::TestNamespace::new(&client, prefix).await;
        let release = ReleaseRules(src.name.clone());
        let mut namespaces = Vec::new();
        for i in 0..targets {
            namespaces.push(common::TestNamespace::new(&client, &format!("{prefix}t{i}")).await);
        }
        Self {
            cms: Api::namespaced(client.clone(), &src.name),
            rules: Api::namespaced(client.clone(), &src.name),
            client,
            targets: namespaces,
            _release: release,
            src,
        }
    }

    /// The names of the target namespaces.
    fn targets(&self) -> Vec<&str> {
        self.targets.iter().map(|n| n.name.as_str()).collect()
    }

    /// An operator of the copyrator kind alone, watching the source
    /// namespace, with `extra` flags.
    async fn start_operator(&self, extra: &[&str]) -> kustomize_operator::Operator {
        let args = [&["--kinds", "copyrator"][..], extra].concat();
        common::start_operator(&self.src.name, &args).await
    }
}

#[tokio::test]
async fn configmap_rule_over_three_namespaces_and_a_new_one() {
    let fx = Fixture::new("cr-src", 3).await;
    let later = format!("{}-later", fx.src.name);
    let operator = fx.start_operator(&[]).await;
    create(
        &fx.cms,
        &config_map("app-config", &[("copy", "yes"), ("app", "web")], "v1"),
    )
    .await;
    create(&fx.cms, &config_map("not-me", &[("app", "web")], "x")).await;
    let mut listed = fx.targets();
    listed.push(&later);
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &listed, None),
    )
    .await;

    let t = fx.targets();
    wait_cm_value(&fx.client, &t, "app-config", Some("v1")).await;
    let status = wait_ready(&fx.rules, "r").await;
    let source = get_cm(&fx.client, &fx.src.name, "app-config")
        .await
        .unwrap();
    for ns in &t {
        let copy = get_cm(&fx.client, ns, "app-config").await.unwrap();
        assert_eq!(copy.data, source.data);
        assert_eq!(copy.binary_data, source.binary_data);
        let copy_labels = copy.metadata.labels.unwrap();
        for (k, v) in source.metadata.labels.clone().unwrap() {
            assert_eq!(copy_labels.get(&k), Some(&v), "label {k}");
        }
        assert_eq!(copy_labels[RULE_LABEL], format!("{}.r", fx.src.name));
        assert_eq!(copy_labels["copyrator.flant.com/source"], "app-config");
        let annotations = copy.metadata.annotations.unwrap();
        assert_eq!(annotations[RULE_LABEL], format!("{}/r", fx.src.name));
        assert_eq!(
            annotations["copyrator.flant.com/source"],
            format!("{}/app-config", fx.src.name)
        );
        assert!(get_cm(&fx.client, ns, "not-me").await.is_none());
    }
    // Status: per target the copied sources and the result, the last command.
    assert_eq!(status.copies.copy_count, 3);
    assert_eq!(status.copies.sources, ["app-config"]);
    for target in &status.copies.targets {
        if target.namespace == later {
            assert_eq!(target.result, "NotFound");
        } else {
            assert_eq!(target.result, "Copied", "{target:?}");
            assert_eq!(target.copied, ["app-config"]);
        }
    }
    let cmd = status.common.last_command.unwrap();
    assert!(
        cmd.command.contains(" apply --server-side")
            && cmd
                .command
                .contains(&format!("--field-manager=copyrator.{}.r", fx.src.name))
            && !cmd.command.contains("--force-conflicts"),
        "new copies are created by the rule's own manager, never forced: {}",
        cmd.command
    );
    assert!(
        cmd.stdout
            .contains("configmap/app-config serverside-applied"),
        "{}",
        cmd.stdout
    );
    // One kubectl run for the three copies; the reconciles their watch
    // events trigger (the positive marker: counted as skipped) find
    // nothing to do.
    common::wait_until(TIMEOUT, "a skipped reconcile of the rule", || async {
        operator.metrics().skipped_count("copyrator") >= 1
    })
    .await;
    assert_eq!(operator.kubectl_stats().spawned(), 1);

    // A listed namespace that appears receives copies.
    let later_ns = common::TestNamespace::adopt(later.clone());
    create(
        &Api::<Namespace>::all(fx.client.clone()),
        &serde_json::from_value(
            json!({"metadata": {"name": later, "labels": {"kustomize-operator-test": "true"}}}),
        )
        .unwrap(),
    )
    .await;
    wait_cm_value(&fx.client, &[&later], "app-config", Some("v1")).await;

    // A source change reaches every copy through the watch of the
    // source: within TIMEOUT (60 s), far short of the periodic resync
    // (10 minutes), which cannot be what copied it.
    let all: Vec<&str> = t.iter().copied().chain([later.as_str()]).collect();
    fx.cms
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "v2"}})),
        )
        .await
        .unwrap();
    wait_cm_value(&fx.client, &all, "app-config", Some("v2")).await;

    // A copy deleted or edited by someone else is put back.
    Api::<ConfigMap>::namespaced(fx.client.clone(), t[0])
        .delete("app-config", &DeleteParams::default())
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(fx.client.clone(), t[1])
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "edited"}})),
        )
        .await
        .unwrap();
    wait_cm_value(&fx.client, &t, "app-config", Some("v2")).await;

    operator.stop().await;
    drop(later_ns);
}

/// More sources than one page of a list holds (the operator reads them in
/// pages: measured first, then read again under one hold): every one is
/// copied, and a copy edited on the second page of the rule's copies (kept
/// only as fingerprints) is put back.
#[tokio::test]
async fn sources_over_several_pages_are_all_copied_and_kept() {
    let fx = Fixture::new("cr-pages", 1).await;
    let t = fx.targets();
    const SOURCES: usize = 130;
    for i in 0..SOURCES {
        create(
            &fx.cms,
            &config_map(&format!("cm-{i:03}"), &[("copy", "yes")], "v1"),
        )
        .await;
    }
    let operator = fx.start_operator(&[]).await;
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &[t[0]], None),
    )
    .await;
    let copies: Api<ConfigMap> = Api::namespaced(fx.client.clone(), t[0]);
    common::wait_until(TIMEOUT, format!("{SOURCES} copies in {}", t[0]), || async {
        copies
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            >= SOURCES
    })
    .await;
    let status = wait_ready(&fx.rules, "r").await;
    assert_eq!(status.copies.source_count as usize, SOURCES);
    assert_eq!(status.copies.copy_count as usize, SOURCES);

    let last = format!("cm-{:03}", SOURCES - 1);
    copies
        .patch(
            &last,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "edited"}})),
        )
        .await
        .unwrap();
    wait_cm_value(&fx.client, &[t[0]], &last, Some("v1")).await;
    operator.stop().await;
}

#[tokio::test]
async fn a_source_losing_its_label_or_deleted_loses_its_copies() {
    let fx = Fixture::new("cr-lbl", 2).await;
    let t = fx.targets();
    let operator = fx.start_operator(&[]).await;
    for name in ["a", "b", "c"] {
        create(&fx.cms, &config_map(name, &[("copy", "yes")], name)).await;
    }
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &t, None),
    )
    .await;
    for name in ["a", "b", "c"] {
        wait_cm_value(&fx.client, &t, name, Some(name)).await;
    }

    // The label goes: its copies go, the source stays.
    fx.cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"copy": null}}})),
        )
        .await
        .unwrap();
    wait_cm_value(&fx.client, &t, "a", None).await;
    assert!(get_cm(&fx.client, &fx.src.name, "a").await.is_some());
    // The source is deleted: its copies go.
    fx.cms.delete("b", &DeleteParams::default()).await.unwrap();
    wait_cm_value(&fx.client, &t, "b", None).await;
    assert_eq!(cm_value(&fx.client, t[0], "c").await.as_deref(), Some("c"));
    common::wait_until(TIMEOUT, "the rule r listing only the source c", || async {
        rule_status(&fx.rules, "r").await.copies.sources == ["c"]
    })
    .await;

    // A namespace no longer listed loses its copies.
    fx.rules
        .patch(
            "r",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"namespaces": [t[0]]}})),
        )
        .await
        .unwrap();
    wait_cm_value(&fx.client, &[t[1]], "c", None).await;
    assert_eq!(cm_value(&fx.client, t[0], "c").await.as_deref(), Some("c"));
    operator.stop().await;
}

#[tokio::test]
async fn deleting_a_rule_deletes_its_copies_unless_it_retains_them() {
    let fx = Fixture::new("cr-del", 1).await;
    let t = fx.targets();
    let operator = fx.start_operator(&[]).await;
    create(&fx.cms, &config_map("dropped", &[("set", "delete")], "d")).await;
    create(&fx.cms, &config_map("kept", &[("set", "retain")], "k")).await;
    create(
        &fx.rules,
        &rule(
            "deleting",
            RuleType::Configmap,
            &[("set", "delete")],
            &t,
            None,
        ),
    )
    .await;
    create(
        &fx.rules,
        &rule(
            "retaining",
            RuleType::Configmap,
            &[("set", "retain")],
            &t,
            Some(DeletionPolicy::Retain),
        ),
    )
    .await;
    wait_cm_value(&fx.client, &t, "dropped", Some("d")).await;
    wait_cm_value(&fx.client, &t, "kept", Some("k")).await;
    wait_ready(&fx.rules, "deleting").await;
    wait_ready(&fx.rules, "retaining").await;

    for name in ["deleting", "retaining"] {
        fx.rules
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    common::wait_until(TIMEOUT, "every rule gone", || async {
        fx.rules
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    assert!(get_cm(&fx.client, t[0], "dropped").await.is_none());
    assert_eq!(
        cm_value(&fx.client, t[0], "kept").await.as_deref(),
        Some("k")
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_foreign_object_is_left_alone_and_reported() {
    let fx = Fixture::new("cr-fgn", 2).await;
    let t = fx.targets();
    create(
        &Api::<ConfigMap>::namespaced(fx.client.clone(), t[0]),
        &config_map("app-config", &[("owner", "someone")], "mine"),
    )
    .await;
    let operator = fx.start_operator(&[]).await;
    create(
        &fx.cms,
        &config_map("app-config", &[("copy", "yes")], "theirs"),
    )
    .await;
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &t, None),
    )
    .await;
    wait_cm_value(&fx.client, &[t[1]], "app-config", Some("theirs")).await;
    let status = wait_ready(&fx.rules, "r").await;
    let foreign = get_cm(&fx.client, t[0], "app-config").await.unwrap();
    assert_eq!(foreign.data.unwrap()["value"], "mine");
    assert!(!foreign.metadata.labels.unwrap().contains_key(RULE_LABEL));
    assert_eq!(status.copies.foreign_count, 1);
    let target = status
        .copies
        .targets
        .iter()
        .find(|x| x.namespace == t[0])
        .unwrap();
    assert_eq!(target.result, "Conflict");
    assert_eq!(target.foreign, ["app-config"]);
    common::wait_until(
        TIMEOUT,
        format!("a ForeignObject warning naming {}/app-config", t[0]),
        || async {
            events(&fx.client, &fx.src.name).await.iter().any(|e| {
                e.reason.as_deref() == Some("ForeignObject")
                    && e.type_.as_deref() == Some("Warning")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains(&format!("{}/app-config", t[0])))
            })
        },
    )
    .await;

    // Deleting the rule deletes its copy and still leaves the foreign object.
    fx.rules
        .delete("r", &DeleteParams::default())
        .await
        .unwrap();
    wait_cm_value(&fx.client, &[t[1]], "app-config", None).await;
    assert_eq!(
        cm_value(&fx.client, t[0], "app-config").await.as_deref(),
        Some("mine")
    );
    operator.stop().await;
}

#[tokio::test]
async fn a_value_kustomize_cannot_carry_is_reported_and_loses_nothing() {
    let fx = Fixture::new("cr-c1", 1).await;
    let t = fx.targets();
    let operator = fx.start_operator(&[]).await;
    create(&fx.cms, &config_map("settings", &[("copy", "yes")], "v1")).await;
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &t, None),
    )
    .await;
    wait_cm_value(&fx.client, &t, "settings", Some("v1")).await;

    // The API server accepts a C1 control character; kustomize does not.
    fx.cms
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "c1\u{91}"}})),
        )
        .await
        .unwrap();
    create(&fx.cms, &config_map("other", &[("copy", "yes")], "ok")).await;
    wait_cm_value(&fx.client, &t, "other", Some("ok")).await;
    // The reconcile of the patch alone may already report the value; wait
    // for the one that also saw "other" (it copied it first, then wrote
    // its status).
    common::wait_until(TIMEOUT, "the rule r reporting settings as not copyable, with 2 sources", || async {
        let copies = rule_status(&fx.rules, "r").await.copies;
        copies.not_copyable
            == ["settings: the value of \"value\" holds U+0091, a character kustomize cannot process"]
            && copies.source_count == 2
    })
    .await;
    let status = wait_ready(&fx.rules, "r").await;
    assert_eq!(status.copies.source_count, 2);
    // The copy made before stays as it was.
    assert_eq!(
        cm_value(&fx.client, t[0], "settings").await.as_deref(),
        Some("v1")
    );
    common::wait_until(TIMEOUT, "a NotCopyable warning about settings", || async {
        events(&fx.client, &fx.src.name).await.iter().any(|e| {
            e.reason.as_deref() == Some("NotCopyable")
                && e.type_.as_deref() == Some("Warning")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("settings: the value"))
        })
    })
    .await;
    operator.stop().await;
}

fn secret(name: &str, type_: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(&[("copy", "yes")])),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Standard base64, to look for encoded secret values.
fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(ByteString(bytes.to_vec())).unwrap() {
        serde_json::Value::String(s) => s,
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn a_secret_rule_copies_registry_and_tls_secrets_and_keeps_their_data_secret() {
    let fx = Fixture::new("cr-sec", 2).await;
    let t = fx.targets();
    let keep = tempfile::tempdir().unwrap();
    let marker = format!("s3cr3t-{:08x}", rand::random::<u32>());
    let docker = format!(
        r#"{{"auths":{{"registry.example.com":{{"username":"bot","password":"{marker}-pw","auth":"Ym90Og=="}}}}}}"#
    );
    let key = format!("-----BEGIN PRIVATE KEY-----\n{marker}-key\n-----END PRIVATE KEY-----\n");
    let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let operator = fx
        .start_operator(&["--keep-overlays", &keep.path().display().to_string()])
        .await;
    let secrets: Api<Secret> = Api::namespaced(fx.client.clone(), &fx.src.name);
    create(
        &secrets,
        &secret(
            "registry",
            "kubernetes.io/dockerconfigjson",
            &[(".dockerconfigjson", docker.as_bytes())],
        ),
    )
    .await;
    create(
        &secrets,
        &secret(
            "tls",
            "kubernetes.io/tls",
            &[("tls.crt", cert.as_bytes()), ("tls.key", key.as_bytes())],
        ),
    )
    .await;
    create(
        &fx.rules,
        &rule(
            "pull-secrets",
            RuleType::Secret,
            &[("copy", "yes")],
            &t,
            None,
        ),
    )
    .await;
    common::wait_until(
        TIMEOUT,
        "the Secrets registry and tls copied into every target",
        || async {
            for ns in &t {
                let api: Api<Secret> = Api::namespaced(fx.client.clone(), ns);
                for name in ["registry", "tls"] {
                    if api.get_opt(name).await.unwrap().is_none() {
                        return false;
                    }
                }
            }
            true
        },
    )
    .await;
    let status = wait_ready(&fx.rules, "pull-secrets").await;
    assert_eq!(status.copies.copy_count, 4);
    for ns in &t {
        let api: Api<Secret> = Api::namespaced(fx.client.clone(), ns);
        for name in ["registry", "tls"] {
            let copy = api.get(name).await.unwrap();
            let source = secrets.get(name).await.unwrap();
            assert_eq!(copy.type_, source.type_, "{ns}/{name}");
            assert_eq!(copy.data, source.data, "{ns}/{name}");
            // Server-side apply: no last-applied annotation repeating the data.
            let annotations = copy.metadata.annotations.unwrap_or_default();
            assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        }
    }
    // A source change propagates to the Secret copies too.
    secrets
        .patch(
            "tls",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"tls.crt": base64(b"renewed")}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the renewed tls.crt in every copy", || async {
        let mut all = true;
        for ns in &t {
            let copy = Api::<Secret>::namespaced(fx.client.clone(), ns)
                .get("tls")
                .await
                .unwrap();
            all &= copy.data.unwrap()["tls.crt"] == ByteString(b"renewed".to_vec());
        }
        all
    })
    .await;
    wait_ready(&fx.rules, "pull-secrets").await;

    // No secret value in status, events, logs or kept overlays.
    let forbidden = [
        marker.clone(),
        base64(docker.as_bytes()),
        base64(key.as_bytes()),
        base64(format!("{marker}-pw").as_bytes()),
    ];
    common::wait_until(
        TIMEOUT,
        format!("an Applied event in {}", fx.src.name),
        || async {
            events(&fx.client, &fx.src.name)
                .await
                .iter()
                .any(|e| e.reason.as_deref() == Some("Applied"))
        },
    )
    .await;
    let rule_json = serde_json::to_string(&fx.rules.get("pull-secrets").await.unwrap()).unwrap();
    let mut event_text = String::new();
    for ns in [fx.src.name.as_str()].into_iter().chain(t.iter().copied()) {
        for e in events(&fx.client, ns).await {
            event_text.push_str(&serde_json::to_string(&e).unwrap());
        }
    }
    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    assert!(
        logs.contains("pull-secrets"),
        "the operator's logs were not captured"
    );
    for secret in &forbidden {
        assert!(
            !rule_json.contains(secret.as_str()),
            "secret data in the rule: {rule_json}"
        );
        assert!(
            !event_text.contains(secret.as_str()),
            "secret data in events"
        );
        assert!(!logs.contains(secret.as_str()), "secret data in the logs");
    }
    let kept = keep
        .path()
        .join("copyrator")
        .join(&fx.src.name)
        .join("pull-secrets");
    assert!(
        !kept.exists(),
        "an overlay with Secret data was kept at {}",
        kept.display()
    );

    fx.rules
        .delete("pull-secrets", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        format!("the copy tls gone from {}", t[0]),
        || async {
            Api::<Secret>::namespaced(fx.client.clone(), t[0])
                .get_opt("tls")
                .await
                .unwrap()
                .is_none()
        },
    )
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn the_api_server_rejects_bad_rules() {
    let fx = Fixture::new("cr-bad", 0).await;
    let cases = [
        ("spec:\n  ruleType: pod\n  selector: {a: b}\n", "ruleType"),
        (
            "spec:\n  ruleType: configmap\n  selector: \"a=b\"\n",
            "selector",
        ),
        (
            "spec:\n  ruleType: configmap\n  selector: [a, b]\n",
            "selector",
        ),
        ("ruleType: pod\nselector: {a: b}\n", "ruleType"),
        ("ruleType: configmap\nselector: a=b\n", "selector"),
        ("spec:\n  ruleType: configmap\n", "selector is required"),
        ("spec:\n  ruleType: configmap\n  selector: {}\n", "selector"),
        (
            "spec:\n  ruleType: configmap\n  selector: {a: b}\nruleType: secret\n",
            "spec.ruleType and the top-level ruleType differ",
        ),
        (
            "spec:\n  ruleType: configmap\n  selector: {a: b}\n  deletionPolicy: Sometimes\n",
            "deletionPolicy",
        ),
        (
            "spec:\n  ruleType: configmap\n  selector: {a: b}\n  namespaces: [\"Not_A_Namespace\"]\n",
            "namespaces",
        ),
    ];
    for (body, expected) in cases {
        let manifest = format!(
            "apiVersion: flant.com/v1\nkind: CopyratorRule\nmetadata:\n  name: bad\n  namespace: {}\n{body}",
            fx.src.name
        );
        let (ok, _, err) = common::kubectl_stdin(&["create", "-f", "-"], &manifest);
        assert!(!ok, "accepted:\n{body}");
        assert!(err.contains(expected), "{body}: {err}");
    }
}

/// The Copyrator article's example rule, verbatim.
const ARTICLE: &str = r#"apiVersion: flant.com/v1
kind: CopyratorRule
metadata:
  name: main-rule
  labels:
    module: copyrator
ruleType: configmap
selector:
  copyrator: "true"
namespace: default
"#;

#[tokio::test]
async fn the_articles_top_level_form_is_kept_and_honoured() {
    let fx = Fixture::new("cr-art", 2).await;
    let t = fx.targets();
    // The rule targets every namespace: the operator may copy only into this
    // test's namespaces.
    let tag = format!("copyrator-test-{:06x}", rand::random::<u32>() & 0xff_ffff);
    for ns in t.iter().chain([&fx.src.name.as_str()]) {
        add_namespace_label(&fx.client, ns, "copyrator-test", &tag).await;
    }
    let selector = format!("copyrator-test={tag}");
    let operator = fx
        .start_operator(&["--copyrator-namespace-selector", &selector])
        .await;
    create(
        &fx.cms,
        &config_map("settings", &[("copyrator", "true")], "s"),
    )
    .await;
    // The manifest as printed, but for the namespace its sources are read
    // from, which must be the rule's own (the article uses `default`).
    let manifest = ARTICLE.replace("namespace: default", &format!("namespace: {}", fx.src.name));
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-n", &fx.src.name, "-f", "-"], &manifest);
    assert!(ok, "{err}");
    // The API server kept the top-level fields.
    let (_, stored, _) = common::kubectl(&[
        "get",
        "-n",
        &fx.src.name,
        "copyrator",
        "main-rule",
        "-o",
        "json",
    ]);
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored["ruleType"], "configmap");
    assert_eq!(stored["selector"], json!({"copyrator": "true"}));
    assert_eq!(stored["namespace"], fx.src.name.as_str());
    assert!(stored.get("spec").is_none());

    // Every namespace the operator may copy into gets the copy, but not the
    // rule's own; a new one too.
    wait_cm_value(&fx.client, &t, "settings", Some("s")).await;
    let status = wait_ready(&fx.rules, "main-rule").await;
    assert_eq!(status.copies.target_count, 2);
    let newcomer = common::TestNamespace::new(&fx.client, "cr-artnew").await;
    add_namespace_label(&fx.client, &newcomer.name, "copyrator-test", &tag).await;
    wait_cm_value(&fx.client, &[&newcomer.name], "settings", Some("s")).await;

    // Unchanged, the manifest names `default` as its source namespace: in
    // any other namespace that is reported, not silently ignored.
    let elsewhere = common::TestNamespace::new(&fx.client, "cr-art2").await;
    let _release_elsewhere = ReleaseRules(elsewhere.name.clone());
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-n", &elsewhere.name, "-f", "-"], ARTICLE);
    assert!(ok, "{err}");
    let other_operator = common::start_operator(
        &elsewhere.name,
        &[
            "--kinds",
            "copyrator",
            "--copyrator-namespace-selector",
            &selector,
        ],
    )
    .await;
    let rules2: Api<CopyratorRule> = Api::namespaced(fx.client.clone(), &elsewhere.name);
    common::wait_until(
        TIMEOUT,
        format!(
            "main-rule InvalidSpec in {}, naming \"default\"",
            elsewhere.name
        ),
        || async {
            rule_status(&rules2, "main-rule")
                .await
                .common
                .condition(ConditionType::Ready)
                .is_some_and(|c| {
                    c.reason == Reason::InvalidSpec
                        && c.message.contains("\"default\"")
                        && c.message.contains(&elsewhere.name)
                })
        },
    )
    .await;
    other_operator.stop().await;
    operator.stop().await;
}

#[tokio::test]
async fn a_failed_apply_is_reported_per_target_and_retried() {
    let fx = Fixture::new("cr-fail", 1).await;
    let t = fx.targets();
    // A kubectl that fails `apply` while a marker file exists.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("fail-applies");
    let wrapper = dir.path().join("kubectl");
    common::write_script(
        &wrapper,
        &format!(
            r#"for a in "$@"; do
  if [ "$a" = apply ] && [ -e {marker} ]; then echo "error: injected apply failure" >&2; exit 1; fi
done
exec {real} "$@""#,
            marker = marker.display(),
            real = common::kubectl_path().display()
        ),
    );
    std::fs::write(&marker, "").unwrap();
    let operator = fx
        .start_operator(&["--kubectl", &wrapper.display().to_string()])
        .await;
    create(&fx.cms, &config_map("app-config", &[("copy", "yes")], "v1")).await;
    create(
        &fx.rules,
        &rule("r", RuleType::Configmap, &[("copy", "yes")], &t, None),
    )
    .await;
    common::wait_until(TIMEOUT, "the rule r ApplyFailed for its target", || async {
        let s = rule_status(&fx.rules, "r").await;
        s.common
            .condition(ConditionType::Ready)
            .is_some_and(|c| c.status == ConditionStatus::False && c.reason == Reason::ApplyFailed)
            && s.copies
                .targets
                .first()
                .is_some_and(|x| x.result == "ApplyFailed")
    })
    .await;
    let s = rule_status(&fx.rules, "r").await;
    assert!(
        s.common
            .last_command
            .unwrap()
            .stderr
            .contains("injected apply failure")
    );
    assert!(get_cm(&fx.client, t[0], "app-config").await.is_none());

    std::fs::remove_file(&marker).unwrap();
    wait_cm_value(&fx.client, &t, "app-config", Some("v1")).await;
    common::wait_until(
        Duration::from_secs(90),
        "the rule r Ready with its target Copied",
        || async {
            let s = rule_status(&fx.rules, "r").await;
            s.common.is_ready()
                && s.copies
                    .targets
                    .first()
                    .is_some_and(|x| x.result == "Copied")
        },
    )
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn diff_shows_the_copies_a_changed_source_would_change_with_secret_values_masked() {
    let fx = Fixture::new("cr-diff", 1).await;
    let t = fx.targets();
    let old = format!("old-{:08x}", rand::random::<u32>());
    let new = format!("new-{:08x}", rand::random::<u32>());
    let operator = fx.start_operator(&[]).await;
    let secrets: Api<Secret> = Api::namespaced(fx.client.clone(), &fx.src.name);
    create(
        &secrets,
        &secret("token", "Opaque", &[("password", old.as_bytes())]),
    )
    .await;
    create(
        &fx.rules,
        &rule("tokens", RuleType::Secret, &[("copy", "yes")], &t, None),
    )
    .await;
    wait_ready(&fx.rules, "tokens").await;
    common::wait_until(TIMEOUT, format!("the copy token in {}", t[0]), || async {
        Api::<Secret>::namespaced(fx.client.clone(), t[0])
            .get_opt("token")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let (code, out, err) =
        common::operator_command("diff", &["copyratorrule/tokens", "-n", &fx.src.name]);
    assert_eq!(code, Some(0), "in sync: stdout:\n{out}\nstderr:\n{err}");
    operator.stop().await;

    // The source changes while the operator is away: its copy would change.
    secrets
        .patch(
            "token",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"password": base64(new.as_bytes())}})),
        )
        .await
        .unwrap();
    let (code, out, err) =
        common::operator_command("diff", &["copyratorrule/tokens", "-n", &fx.src.name]);
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains(&format!("v1.Secret.{}.token", t[0])), "{out}");
    assert!(out.contains("password: '*** (before)'"), "{out}");
    assert!(out.contains("password: '*** (after)'"), "{out}");
    for value in [&old, &new] {
        for shown in [value.clone(), base64(value.as_bytes())] {
            assert!(
                !out.contains(&shown) && !err.contains(&shown),
                "{shown} in\n{out}\n{err}"
            );
        }
    }
    // Nothing was written: the copy still holds the old value.
    let copy = Api::<Secret>::namespaced(fx.client.clone(), t[0])
        .get("token")
        .await
        .unwrap();
    assert_eq!(copy.data.unwrap()["password"], ByteString(old.into_bytes()));
}
