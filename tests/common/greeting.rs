//! The lab's Greeting kind (training/06), renamed for one test: its folder
//! packed into a KindDefinition and applied, its conditions awaited.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::TestNamespace;
use crate::common;

const TIMEOUT: Duration = Duration::from_secs(60);

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
            &common::repo().join("training/06-your-own-kind/greeting"),
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

    /// Edits a file of the folder.
    pub fn edit(&self, file: &str, change: impl FnOnce(String) -> String) {
        let path = self.folder.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, change(text)).unwrap();
    }

    /// `kind pack` of the folder, labelled for the test, applied.
    pub fn apply(&self) {
        self.apply_with(|_| {});
    }

    /// Like [`Self::apply`], changing the packed definition first.
    pub fn apply_with(&self, change: impl FnOnce(&mut Value)) {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_kustomize-operator"))
            .args(["kind", "pack"])
            .arg(&self.folder)
            .output()
            .expect("run kind pack");
        let packed = String::from_utf8_lossy(&output.stdout);
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "kind pack: {err}");
        let mut definition: Value = serde_saphyr::from_str(&packed).unwrap();
        let (key, value) = self.label.split_once('=').unwrap();
        definition["metadata"]["labels"] = json!({ key: value });
        change(&mut definition);
        let (ok, _, err) = common::kubectl_stdin(
            &["apply", "--server-side", "-f", "-"],
            &definition.to_string(),
        );
        assert!(ok, "applying the definition: {err}");
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
        let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &greeting.to_string());
        assert!(ok, "applying the Greeting: {err}");
    }

    pub fn definition(&self) -> Option<Value> {
        let (ok, out, _) = common::kubectl(&["get", "kinddefinition", &self.name, "-o", "json"]);
        ok.then(|| serde_json::from_str(&out).ok()).flatten()
    }

    /// Waits until the condition `type_` is `status` with `reason`; its message.
    pub async fn wait_condition(&self, type_: &str, status: &str, reason: &str) -> String {
        self.wait_message(type_, status, reason, "").await
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
        common::wait_for(TIMEOUT, what, async || {
            let definition = self.definition().ok_or(Value::Null)?;
            let conditions = &definition["status"]["conditions"];
            let found = conditions.as_array().into_iter().flatten().find(|c| {
                c["type"] == type_
                    && c["status"] == status
                    && c["reason"] == reason
                    && c["message"].as_str().unwrap_or_default().contains(part)
            });
            match found {
                Some(c) => Ok(c["message"].as_str().unwrap_or_default().to_string()),
                None => Err(conditions.clone()),
            }
        })
        .await
    }

    /// Deletes the definition and waits until it is gone. Admission (the
    /// guard of deploy/admission, when installed) refuses the deletion
    /// while the definition's status still counts resources: asked again
    /// until it is accepted.
    pub async fn delete(&self) {
        common::wait_until(TIMEOUT, format!("{} deleted", self.name), async || {
            let (ok, _, err) =
                common::kubectl(&["delete", "kinddefinition", &self.name, "--wait=false"]);
            ok || err.contains("NotFound")
        })
        .await;
        common::wait_until(TIMEOUT, format!("{} gone", self.name), async || {
            self.definition().is_none()
        })
        .await;
    }
}

/// Whatever a failing test leaves: its definition (finalizer and all),
/// its CRD.
impl Drop for GreetingKind {
    fn drop(&mut self) {
        let _ = common::kubectl(&[
            "patch",
            "kinddefinition",
            &self.name,
            "--type",
            "merge",
            "-p",
            // Orphan: the guard admits the deletion whatever the count.
            r#"{"metadata":{"finalizers":null},"spec":{"onDelete":"Orphan"}}"#,
        ]);
        let _ = common::kubectl(&["delete", "kinddefinition", &self.name, "--wait=false"]);
        let columns = "custom-columns=NS:.metadata.namespace,NAME:.metadata.name";
        let (_, listed, _) =
            common::kubectl(&["get", &self.crd(), "-A", "--no-headers", "-o", columns]);
        for line in listed.lines() {
            if let Some((ns, name)) = line.split_once(char::is_whitespace) {
                let _ = common::kubectl(&[
                    "patch",
                    &self.crd(),
                    name.trim(),
                    "-n",
                    ns,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let _ = common::kubectl(&["delete", "crd", &self.crd(), "--wait=false"]);
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
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
    let path = format!("jsonpath={{.data.{field}}}");
    common::kubectl(&["get", "configmap", name, "-n", ns, "-o", &path]).1
}

pub async fn wait_ready(kind: &GreetingKind, ns: &str, name: &str) {
    let resource = format!("greetings.{}/{name}", kind.group);
    common::wait_until(TIMEOUT, format!("{resource} Ready"), async || {
        let path = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
        common::kubectl(&["get", &resource, "-n", ns, "-o", path]).1 == "True"
    })
    .await;
}
