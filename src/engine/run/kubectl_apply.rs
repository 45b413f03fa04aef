//! Built manifests → the cluster: `kubectl apply --server-side -f -`, with
//! the applies of resources due together (same field manager, flags and
//! identity) coalesced into one run. The manifests go to kubectl on standard input,
//! so nothing applied (Secret data included) is written to disk.
//!
//! kubectl prints one line per object (`deployment.apps/web
//! serverside-applied`); each line goes back to the resource that owns that
//! object. Two resources whose objects kubectl would print alike never
//! share a run, so the attribution is exact.

use std::sync::Arc;

use serde_json::Value;

use super::batch::{self, Job, Member, Runner};
use crate::engine::model::identity::Identity;
use crate::engine::model::inventory::ObjectId;
use crate::kubectl::{CommandRecord, Invocation, Kubectl, KubectlError, Slot};

/// One object to apply, serialized once: a job waiting for its batch holds
/// the text, not the parsed object (a burst queues hundreds of jobs). A
/// clone shares the text.
#[derive(Clone)]
pub(crate) struct Document {
    /// How kubectl names the object in its output (`deployment.apps/web`).
    name: Option<String>,
    /// The manifest as JSON.
    json: Arc<str>,
}

impl Document {
    /// `manifest` as a document to apply.
    pub(crate) fn of(manifest: &Value) -> Self {
        Self {
            name: ObjectId::of_manifest(manifest).map(|id| id.kubectl_name()),
            json: manifest.to_string().into(),
        }
    }

    /// The size of its JSON in bytes.
    pub(crate) fn size(&self) -> usize {
        self.json.len()
    }
}

/// One resource's objects to apply.
pub(crate) struct ApplyJob {
    /// The objects to apply, each serialized.
    pub documents: Vec<Document>,
    /// The server-side apply field manager.
    pub field_manager: String,
    /// Take fields owned by other managers.
    pub force_conflicts: bool,
    /// Whose rights the apply uses: jobs of different identities never
    /// share a run.
    pub identity: Identity,
}

impl Job for ApplyJob {
    fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.field_manager,
            self.force_conflicts,
            self.identity.username().unwrap_or_default()
        )
    }

    fn names(&self) -> Vec<String> {
        self.documents
            .iter()
            .filter_map(|d| d.name.clone())
            .collect()
    }
}

/// The run that applied a job (its own output lines only), or why kubectl
/// could not start.
pub(crate) type Applied = Result<CommandRecord, NotStarted>;

/// kubectl could not start; every job of the batch gets the same error.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub(crate) struct NotStarted(Arc<KubectlError>);

/// The runner of an apply queue.
pub(crate) fn runner(kubectl: Kubectl) -> Runner<ApplyJob, Applied> {
    Arc::new(move |batch, slot| run(batch, slot, kubectl.clone()))
}

fn run(
    batch: Vec<Member<ApplyJob, Applied>>,
    slot: Slot,
    kubectl: Kubectl,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let Some(first) = batch.first() else { return };
        let invocation = Invocation::Apply {
            field_manager: first.job.field_manager.clone(),
            force_conflicts: first.job.force_conflicts,
            impersonate: first.job.identity.username(),
        };
        let input = stream(batch.iter().flat_map(|m| &m.job.documents));
        let record = match kubectl.run_with(slot, &invocation, Some(input)).await {
            Ok(record) => record,
            Err(e) => {
                let error = NotStarted(Arc::new(e));
                for m in batch {
                    let _ = m.reply.send(Err(error.clone()));
                }
                return;
            }
        };
        if batch.len() == 1 || record.succeeded() {
            return reply_each(batch, &record);
        }
        let k = kubectl.clone();
        batch::bisect(&kubectl, batch, move |half, slot| {
            run(half, slot, k.clone())
        })
        .await;
    })
}

/// Gives each member the output lines about its objects (a line naming no
/// member's object goes to every member).
fn reply_each(batch: Vec<Member<ApplyJob, Applied>>, record: &CommandRecord) {
    let size = u32::try_from(batch.len()).unwrap_or(u32::MAX);
    let names: Vec<Vec<String>> = batch.iter().map(|m| m.job.names()).collect();
    let lines = split_lines(&record.stdout, &names);
    for (m, stdout) in batch.into_iter().zip(lines) {
        let mut own = record.clone();
        if size > 1 {
            own.stdout = stdout;
            own.batch_size = Some(size);
        }
        let _ = m.reply.send(Ok(own));
    }
}

/// The documents as a YAML stream of JSON documents.
fn stream<'a>(documents: impl IntoIterator<Item = &'a Document>) -> Vec<u8> {
    let mut out = Vec::new();
    for d in documents {
        out.extend_from_slice(b"---\n");
        out.extend_from_slice(d.json.as_bytes());
        out.push(b'\n');
    }
    out
}

fn split_lines(stdout: &str, names: &[Vec<String>]) -> Vec<String> {
    let mut out = vec![String::new(); names.len()];
    for line in stdout.lines() {
        let object = line.split_whitespace().next().unwrap_or_default();
        match names.iter().position(|n| n.iter().any(|n| n == object)) {
            Some(i) => {
                out[i].push_str(line);
                out[i].push('\n');
            }
            None => {
                for o in &mut out {
                    o.push_str(line);
                    o.push('\n');
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_go_to_their_owner_and_unknown_lines_to_all() {
        let names = vec![
            vec!["deployment.apps/a".to_string()],
            vec!["deployment.apps/b".to_string()],
        ];
        let out = split_lines(
            "deployment.apps/a serverside-applied\ndeployment.apps/b serverside-applied\nsomething else\n",
            &names,
        );
        assert_eq!(
            out[0],
            "deployment.apps/a serverside-applied\nsomething else\n"
        );
        assert_eq!(
            out[1],
            "deployment.apps/b serverside-applied\nsomething else\n"
        );
    }

    #[test]
    fn jobs_with_other_flags_or_identities_do_not_share_a_run_and_names_are_kubectls() {
        let job = |force, identity| ApplyJob {
            documents: vec![Document::of(&json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "a"}
            }))],
            field_manager: "m".into(),
            force_conflicts: force,
            identity,
        };
        let tenant = || {
            Identity::ServiceAccount(crate::names::ServiceAccount {
                namespace: "a".into(),
                name: "deployer".into(),
            })
        };
        let job = |force| job(force, Identity::Operator);
        assert_ne!(job(true).key(), job(false).key());
        assert_ne!(
            job(false).key(),
            ApplyJob {
                identity: tenant(),
                ..job(false)
            }
            .key()
        );
        assert_eq!(job(true).names(), ["deployment.apps/web"]);
    }

    #[test]
    fn the_stream_is_one_document_per_manifest() {
        let documents = [
            Document::of(&json!({"a": 1})),
            Document::of(&json!({"b": "x\ny"})),
        ];
        let s = String::from_utf8(stream(&documents)).unwrap();
        assert_eq!(s, "---\n{\"a\":1}\n---\n{\"b\":\"x\\ny\"}\n");
    }

    #[tokio::test]
    async fn a_failed_batch_is_split_until_each_failure_is_alone() {
        use crate::kubectl::testing::{runner, script};
        let dir = tempfile::tempdir().unwrap();
        let script = script(dir.path(), "cat >/dev/null\necho 'error: boom' >&2\nexit 1");
        let kubectl = runner(script, std::time::Duration::from_secs(5), 1024);
        let mut replies = Vec::new();
        let mut batch = Vec::new();
        for name in ["a", "b"] {
            let (reply, rx) = tokio::sync::oneshot::channel();
            replies.push(rx);
            batch.push(Member {
                job: ApplyJob {
                    documents: vec![Document::of(
                        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
                    )],
                    field_manager: "m".into(),
                    force_conflicts: false,
                    identity: Identity::Operator,
                },
                reply,
                span: tracing::Span::none(),
            });
        }
        let slot = kubectl.acquire().await;
        run(batch, slot, kubectl.clone()).await;
        for rx in replies {
            let r = rx.await.unwrap().unwrap();
            assert_eq!(r.exit_code, Some(1));
            assert_eq!(r.batch_size, None, "reported from its own run");
            assert!(r.stderr.contains("boom"));
        }
        assert_eq!(kubectl.stats().spawned(), 3);
    }

    #[tokio::test]
    async fn a_batch_applies_once_and_splits_output() {
        use crate::engine::run::batch::{BatchSettings, Queue};
        use crate::kubectl::testing::{runner as fake_kubectl, script};
        let dir = tempfile::tempdir().unwrap();
        // One line per object name found on stdin.
        let script = script(
            dir.path(),
            "grep -o '\"name\":\"[a-z]*\"' | cut -d'\"' -f4 | sed 's|^|configmap/|; s|$| serverside-applied|'",
        );
        let kubectl = fake_kubectl(script, std::time::Duration::from_secs(5), 4096);
        let queue = Queue::start(
            kubectl.clone(),
            BatchSettings {
                window: std::time::Duration::from_millis(50),
                max: 10,
            },
            runner(kubectl.clone()),
        );
        let job = |name: &str| ApplyJob {
            documents: vec![Document::of(
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
            )],
            field_manager: "m".into(),
            force_conflicts: false,
            identity: Identity::Operator,
        };
        let (a, b) = tokio::join!(queue.submit(job("a")), queue.submit(job("b")));
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        assert_eq!(a.stdout, "configmap/a serverside-applied\n");
        assert_eq!(b.stdout, "configmap/b serverside-applied\n");
        assert_eq!(a.batch_size, Some(2));
        assert_eq!(kubectl.stats().spawned(), 1);
    }
}
