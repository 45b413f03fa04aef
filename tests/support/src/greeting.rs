//! The lab's Greeting kind (training/06), renamed for one test: its folder
//! packed into a KindDefinition and applied, its conditions awaited.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::api::ApiResource;
use serde_json::{Value, json};

use crate::{TestNamespace, api};

const TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`GreetingKind::wait_migrated`] waits.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(180);

/// A Greeting kind folder of one test: the lab's, renamed.
pub struct GreetingKind {
    /// The definition's (and the kind's short) name.
    pub name: String,
    /// Its API group, unique to the test.
    pub group: String,
    /// The label selecting the test's definitions.
    pub label: String,
    _dir: tempfile::TempDir,
    pub folder: PathBuf,
}

impl GreetingKind {
    pub fn new(ns: &TestNamespace) -> Self {
        Self::tagged(ns, "")
    }

    /// A kind of its own among several of one test: `tag` goes into its
    /// name and group.
    pub fn tagged(ns: &TestNamespace, tag: &str) -> Self {
        let suffix = format!("{}{tag}", ns.name.rsplit('-').next().unwrap_or("x"));
        let name = format!("greeting-{suffix}");
        let group = format!("g{suffix}.kd.test");
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(&name);
        copy_dir(
            &crate::repo().join("training/06-your-own-kind/greeting"),
            &folder,
        );
        let kind_file = folder.join("kind.yaml");
        let text = std::fs::read_to_string(&kind_file)
            .unwrap()
            .replace("name: greeting ", &format!("name: {name} "))
            .replace("group: hello.nuvolaris.org", &format!("group: {group}"));
        std::fs::write(&kind_file, text).unwrap();
        Self {
            name,
            group,
            label: format!("kd-test={}", ns.name),
            _dir: dir,
            folder,
        }
    }

    /// The flags of an operator serving Sample and this test's
    /// definitions, then `extra`.
    pub fn flags(&self, extra: &[&str]) -> Vec<String> {
        let flags: Vec<String> = [
            "--kinds",
            "sample",
            "--serve-kind-definitions=true",
            "--kind-definition-selector",
            &self.label,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        flags
    }

    /// [`Self::flags`] with the operator's conversion webhook served on a
    /// free loopback port (its address and URL), then `extra`.
    pub fn webhook_flags(&self, extra: &[&str]) -> Vec<String> {
        let port = crate::free_port();
        let (addr, url) = (
            format!("127.0.0.1:{port}"),
            format!("https://127.0.0.1:{port}"),
        );
        let webhook = [
            "--conversion-webhook-addr",
            &addr,
            "--conversion-webhook-url",
            &url,
        ];
        let all: Vec<&str> = webhook.into_iter().chain(extra.iter().copied()).collect();
        self.flags(&all)
    }

    /// The loopback port of the webhook [`Self::webhook_flags`] gave.
    pub fn webhook_port(flags: &[String]) -> u16 {
        let at = flags.iter().position(|f| f == "--conversion-webhook-addr");
        let addr = &flags[at.expect("webhook flags") + 1];
        addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Applies the definition, waits until it serves, then moves the kind
    /// to v2 ([`Self::to_v2`]) and waits until that generation serves.
    pub async fn serve_at_v2(&self) {
        self.apply();
        self.wait_condition("Serving", "True", "Running").await;
        self.to_v2();
        self.apply();
        self.wait_message("Serving", "True", "Running", "generation 2")
            .await;
    }

    /// Edits a file of the folder.
    pub fn edit(&self, file: &str, change: impl FnOnce(String) -> String) {
        let path = self.folder.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, change(text)).unwrap();
    }

    /// Sets the definition's `spec.rollout` (a merge patch: `null`
    /// removes a field).
    pub fn roll_out(&self, rollout: Value) {
        let patch = json!({"spec": {"rollout": rollout}});
        let patched = self.merge_patch(patch);
        patched.unwrap_or_else(|err| panic!("patching the rollout: {err}"));
    }

    /// A JSON merge patch of the definition.
    fn merge_patch(&self, patch: Value) -> Result<(), String> {
        api::merge_patch(&definitions(), None, &self.name, patch)
    }

    /// Greetings at `version` of this kind.
    pub fn greetings(&self, version: &str) -> ApiResource {
        api::resource(&self.group, version, "Greeting", "greetings")
    }

    /// The Greetings as kubectl reaches them: at the served version of the
    /// highest priority, in the kind's scope (v1 and namespaced while the
    /// CRD cannot be read).
    pub fn served(&self) -> Served {
        let crd = api::get(&api::crds(), None, &self.crd()).ok().flatten();
        let crd = crd.unwrap_or_default();
        let versions = crd["spec"]["versions"].as_array().into_iter().flatten();
        let served = versions.filter(|v| v["served"] == true);
        let names = served.filter_map(|v| v["name"].as_str());
        let preferred = names.max_by_key(|name| kube::core::Version::parse(name).priority());
        Served {
            resource: self.greetings(preferred.unwrap_or("v1")),
            namespaced: crd["spec"]["scope"] != "Cluster",
        }
    }

    /// `kind pack` of the folder, labelled for the test, applied.
    pub fn apply(&self) {
        self.apply_with(|_| {});
    }

    /// The folder, packed (`kind pack`).
    fn packed(&self) -> String {
        let output = std::process::Command::new(crate::operator_binary())
            .args(["kind", "pack"])
            .arg(&self.folder)
            .output()
            .expect("run kind pack");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "kind pack: {err}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Grants the operator's account what the kind needs, as an
    /// administrator does for an operator in the cluster: the ClusterRole
    /// `kustomize-operator rbac` prints, applied.
    pub fn grant_rights(&self) {
        let packed = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(packed.path(), self.packed()).unwrap();
        let output = std::process::Command::new(crate::operator_binary())
            .args(["rbac", "--kinds", &self.name, "--kind-definition"])
            .arg(packed.path())
            .output()
            .expect("run rbac");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "rbac: {err}");
        let role = String::from_utf8_lossy(&output.stdout);
        let (ok, _, err) = crate::kubectl_stdin(&["apply", "-f", "-"], &role);
        assert!(ok, "applying the kind's ClusterRole: {err}");
    }

    /// Like [`Self::apply`], changing the packed definition first.
    pub fn apply_with(&self, change: impl FnOnce(&mut Value)) {
        let mut definition: Value = serde_saphyr::from_str(&self.packed()).unwrap();
        let (key, value) = self.label.split_once('=').unwrap();
        definition["metadata"]["labels"] = json!({ key: value });
        change(&mut definition);
        // As `kubectl apply --server-side` does: kubectl's manager, and
        // conflicts refused.
        let applied = api::apply(&definitions(), &definition, "kubectl", false);
        applied.unwrap_or_else(|err| panic!("applying the definition: {err}"));
    }

    /// The kind at v2: `message` is `text`, `length` is new (computed from
    /// v1's `message` when a v1 object converts up), and v1 (with `notes`
    /// too if the kind has them) is still served, converted by the
    /// operator's webhook as the kind file declares.
    pub fn to_v2(&self) {
        self.edit("kind.yaml", |t| {
            let notes = if t.contains("      notes:") {
                "        notes: {type: object, x-kubernetes-preserve-unknown-fields: true}\n"
            } else {
                ""
            };
            let hub = t
                .replace(
                    "    required: [message]\n    properties:\n      message:",
                    "    required: [text]\n    properties:\n      length: {type: integer}\n      text:",
                )
                .replace("jsonPath: .spec.message", "jsonPath: .spec.text");
            hub.replace(
                "  version: v1\n",
                &format!("  version: v2\n  versions:\n  - name: v1\n    schema:\n      type: object\n      required: [message]\n      properties:\n        message: {{type: string, minLength: 1, maxLength: 200}}\n        language: {{type: string, enum: [en, it], default: en}}\n{notes}    conversion:\n      moves:\n      - {{from: spec.message, to: spec.text}}\n      up:\n        spec.length: size(self.spec.message)\n"),
            )
        });
        self.edit("resources/configmap.yaml", |t| {
            t.replace(
                "  message: {{ spec.message }}",
                "  message: {{ spec.text }}\n  version: v2",
            )
        });
    }

    /// The Greeting `name` in `ns` read at `version`.
    pub fn greeting_at(&self, ns: &str, version: &str, name: &str) -> Value {
        let read = api::get(&self.greetings(version), Some(ns), name);
        let found = read.unwrap_or_else(|err| panic!("get Greeting {name} at {version}: {err}"));
        found.unwrap_or_else(|| panic!("no Greeting {name} at {version}"))
    }

    /// Creates (or changes) the Greeting `name` in `ns` at `version` with
    /// `spec`.
    pub fn write_at(&self, ns: &str, version: &str, name: &str, spec: Value) {
        let applied = self.try_write_at(ns, version, name, spec);
        applied.unwrap_or_else(|err| panic!("applying the Greeting at {version}: {err}"));
    }

    /// Like [`Self::write_at`], saying why the write failed (e.g. its
    /// conversion webhook not reachable yet) instead of panicking.
    pub fn try_write_at(
        &self,
        ns: &str,
        version: &str,
        name: &str,
        spec: Value,
    ) -> Result<(), String> {
        let greeting = json!({
            "apiVersion": format!("{}/{version}", self.group),
            "kind": "Greeting",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        self.apply_greeting(version, &greeting)
    }

    pub fn crd(&self) -> String {
        format!("greetings.{}", self.group)
    }

    /// Creates (or changes) the Greeting `name` in `ns`.
    pub fn greet(&self, ns: &str, name: &str, message: &str, labels: Value) {
        let greeting = json!({
            "apiVersion": format!("{}/v1", self.group),
            "kind": "Greeting",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"message": message},
        });
        let applied = self.apply_greeting("v1", &greeting);
        applied.unwrap_or_else(|err| panic!("applying the Greeting: {err}"));
    }

    /// A Greeting applied as `kubectl apply` would: the test's manifest
    /// wins over any other writer's fields.
    fn apply_greeting(&self, version: &str, greeting: &Value) -> Result<(), String> {
        api::apply(&self.greetings(version), greeting, "ko-test", true)
    }

    /// Deletes the Greetings `names` of `ns` (not waiting for them to go).
    pub fn delete_greetings(&self, ns: &str, names: &[impl AsRef<str>]) {
        let served = self.served();
        for name in names {
            let deleted = api::delete(&served.resource, served.namespace(ns), name.as_ref());
            deleted.unwrap_or_else(|err| panic!("deleting Greeting {}: {err}", name.as_ref()));
        }
    }

    /// The Greeting `name` of `ns` (kubectl's way: `ns` is ignored when the
    /// kind is cluster-scoped), as JSON.
    pub fn read(&self, ns: &str, name: &str) -> Result<Option<Value>, String> {
        let served = self.served();
        api::get(&served.resource, served.namespace(ns), name)
    }

    /// The Greetings of `ns`, as JSON.
    pub fn greetings_in(&self, ns: &str) -> Vec<Value> {
        let served = self.served();
        let listed = api::list(&served.resource, served.namespace(ns));
        listed.unwrap_or_else(|err| panic!("listing the Greetings of {ns}: {err}"))
    }

    /// The definition as the API server has it (`None`: none, or the read
    /// failed).
    pub fn definition(&self) -> Option<Value> {
        api::get(&definitions(), None, &self.name).ok().flatten()
    }

    /// Waits until the operator has seen generation `generation` of the
    /// definition: its `Accepted` condition observed it (or a later one).
    pub async fn wait_observed(&self, generation: i64) {
        let what = format!("{} Accepted at generation {generation} or later", self.name);
        self.wait_condition_where(what, |c| {
            c["type"] == "Accepted" && c["observedGeneration"].as_i64() >= Some(generation)
        })
        .await;
    }

    /// Waits until the condition `type_` is `status` with `reason`; its message.
    pub async fn wait_condition(&self, type_: &str, status: &str, reason: &str) -> String {
        self.wait_message(type_, status, reason, "").await
    }

    /// Waits until the kind's resources are all stored at its newest
    /// version (`StorageMigrated` True, `Migrated`); the message. Up to
    /// three minutes: the API server's own migration (kube-controller-
    /// manager's) of two Greetings was seen still running after a minute
    /// in a full CI run.
    pub async fn wait_migrated(&self) -> String {
        let what = format!("{} StorageMigrated=True (Migrated)", self.name);
        let found = self
            .wait_condition_within(MIGRATION_TIMEOUT, what, |c| {
                c["type"] == "StorageMigrated" && c["status"] == "True" && c["reason"] == "Migrated"
            })
            .await;
        text(&found, "message")
    }

    /// Waits until the condition `type_` is `status` with `reason` and a
    /// message containing `part`; the message.
    pub async fn wait_message(
        &self,
        type_: &str,
        status: &str,
        reason: &str,
        part: &str,
    ) -> String {
        let what = format!("{} {type_}={status} ({reason}) saying {part:?}", self.name);
        let found = self
            .wait_condition_where(what, |c| {
                c["type"] == type_
                    && c["status"] == status
                    && c["reason"] == reason
                    && text(c, "message").contains(part)
            })
            .await;
        text(&found, "message")
    }

    /// Waits until the condition `type_` has one of `reasons`; that reason
    /// and the condition's message.
    pub async fn wait_reason(&self, type_: &str, reasons: &[&str]) -> (String, String) {
        let what = format!("{} {type_} with one of {reasons:?}", self.name);
        let found = self
            .wait_condition_where(what, |c| {
                c["type"] == type_ && reasons.iter().any(|r| c["reason"] == *r)
            })
            .await;
        (text(&found, "reason"), text(&found, "message"))
    }

    /// Waits until one of the definition's conditions is `wanted`; that
    /// condition. Until then it shows the conditions last seen.
    async fn wait_condition_where(&self, what: String, wanted: impl Fn(&Value) -> bool) -> Value {
        self.wait_condition_within(TIMEOUT, what, wanted).await
    }

    /// Like [`Self::wait_condition_where`], for up to `timeout`.
    async fn wait_condition_within(
        &self,
        timeout: Duration,
        what: String,
        wanted: impl Fn(&Value) -> bool,
    ) -> Value {
        crate::wait_for(timeout, what, async || {
            // What was seen says why: the read's error, no definition, or
            // its conditions (Null before the operator wrote any).
            let read = api::get(&definitions(), None, &self.name);
            let read = read.map_err(|e| json!(format!("reading it failed: {e}")))?;
            let definition = read.ok_or_else(|| json!("no such definition"))?;
            let conditions = &definition["status"]["conditions"];
            let found = conditions
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| wanted(c));
            found.cloned().ok_or_else(|| conditions.clone())
        })
        .await
    }

    /// Deletes every Greeting of `ns` and waits until none is left. Not
    /// `kubectl delete --all --wait`: that waits for each object in turn,
    /// at kubectl's five requests a second (20 s for a hundred); here one
    /// list per look. kubectl's, which reads a Greeting nested deeper than
    /// serde_json's limit.
    pub async fn delete_every_greeting(&self, ns: &str) {
        let crd = self.crd();
        let (ok, _, err) = crate::kubectl(&["delete", &crd, "--all", "-n", ns, "--wait=false"]);
        assert!(ok, "deleting every Greeting of {ns}: {err}");
        let what = format!("every Greeting of {ns} gone");
        crate::wait_until(TIMEOUT, what, async || {
            let (ok, names, _) = crate::kubectl(&["get", &crd, "-n", ns, "-o", "name"]);
            ok && names.trim().is_empty()
        })
        .await;
    }

    /// Deletes the definition and waits until it is gone. Admission (the
    /// guard of deploy/admission, when installed) refuses the deletion
    /// while the definition's status still counts resources: asked again
    /// until it is accepted.
    pub async fn delete(&self) {
        crate::wait_until(TIMEOUT, format!("{} deleted", self.name), async || {
            api::delete(&definitions(), None, &self.name).is_ok()
        })
        .await;
        crate::wait_until(TIMEOUT, format!("{} gone", self.name), async || {
            matches!(api::get(&definitions(), None, &self.name), Ok(None))
        })
        .await;
    }
}

/// The string `key` of a condition (empty when it has none).
fn text(condition: &Value, key: &str) -> String {
    condition[key].as_str().unwrap_or_default().to_string()
}

/// Whatever a failing test leaves: its definition (finalizer and all),
/// its CRD.
impl Drop for GreetingKind {
    fn drop(&mut self) {
        // Orphan: the guard admits the deletion whatever the count.
        let orphan = json!({"metadata": {"finalizers": null}, "spec": {"onDelete": "Orphan"}});
        let _ = self.merge_patch(orphan);
        let _ = api::delete(&definitions(), None, &self.name);
        let greetings = self.served().resource;
        let unheld = json!({"metadata": {"finalizers": null}});
        for greeting in api::list(&greetings, None).unwrap_or_default() {
            let (ns, name) = (
                &greeting["metadata"]["namespace"],
                &greeting["metadata"]["name"],
            );
            let name = name.as_str().unwrap_or_default();
            let _ = api::merge_patch(&greetings, ns.as_str(), name, unheld.clone());
        }
        let _ = api::delete(&api::crds(), None, &self.crd());
    }
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A field of a ConfigMap (empty when it or the ConfigMap is missing).
pub fn config_map_field(ns: &str, name: &str, field: &str) -> String {
    let found = api::get(&api::config_maps(), Some(ns), name).ok().flatten();
    let value = found.as_ref().map(|c| &c["data"][field]);
    value
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub async fn wait_ready(kind: &GreetingKind, ns: &str, name: &str) {
    crate::wait_for(TIMEOUT, format!("Greeting {name} Ready"), async || {
        let found = kind.read(ns, name);
        let conditions = found.map(|g| g.map(|g| g["status"]["conditions"].clone()));
        let conditions = conditions.map_err(Value::String)?.unwrap_or_default();
        let ready = conditions
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if ready { Ok(()) } else { Err(conditions) }
    })
    .await;
}

/// Lists a resource in a namespace again and again, until stopped.
pub struct ReadsAt {
    stop: Arc<AtomicBool>,
    made: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl ReadsAt {
    pub fn start(resource: String, namespace: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let made = Arc::new(AtomicUsize::new(0));
        let (stopped, counted) = (stop.clone(), made.clone());
        let task = tokio::task::spawn_blocking(move || {
            let (mut reads, mut failed) = (0, Vec::new());
            while !stopped.load(Ordering::Relaxed) {
                let (ok, _, err) =
                    crate::kubectl(&["get", &resource, "-n", &namespace, "-o", "name"]);
                reads += 1;
                counted.store(reads, Ordering::Relaxed);
                if !ok {
                    failed.push(err);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (reads, failed)
        });
        Self { stop, made, task }
    }

    /// How many lists were made so far.
    pub fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }

    /// How many lists were made, and the errors of those that failed.
    pub async fn stop(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.task).await.expect("the reader")
    }
}

/// A failing test's reader stops too: the runtime would wait for it.
impl Drop for ReadsAt {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How kubectl reaches a kind's Greetings: the version it prefers, the
/// kind's scope.
pub struct Served {
    pub resource: ApiResource,
    namespaced: bool,
}

impl Served {
    /// `ns` for a namespaced kind; none for a cluster-scoped one.
    pub fn namespace<'a>(&self, ns: &'a str) -> Option<&'a str> {
        self.namespaced.then_some(ns)
    }
}

/// KindDefinitions.
fn definitions() -> ApiResource {
    kustomize_operator::definitions::resource::api_resource()
}
