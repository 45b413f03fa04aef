//! Built manifests → the cluster: `kubectl apply --server-side -f -`, with
//! the applies of resources due together (same field manager and flags)
//! coalesced into one run. The manifests go to kubectl on standard input,
//! so nothing applied (Secret data included) is written to disk.
//!
//! kubectl prints one line per object as it applies it (`deployment.apps/web
//! serverside-applied`); each line goes back to the resource that owns that
//! object, and a resource is answered as soon as all of its objects were
//! reported, while the run goes on with the others. Two resources whose
//! objects kubectl would print alike never share a run, so the attribution
//! is exact. If the run fails, only the resources not yet answered are run
//! again.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::mpsc;

use super::batch::{self, Job, Member, Runner};
use super::inventory::ObjectId;
use super::kubectl::{CommandRecord, Invocation, Kubectl, Printed, Slot};

/// One resource's objects to apply.
pub(crate) struct ApplyJob {
    /// The manifests.
    pub manifests: Vec<Value>,
    /// The server-side apply field manager.
    pub field_manager: String,
    /// Take fields owned by other managers.
    pub force_conflicts: bool,
}

impl Job for ApplyJob {
    fn key(&self) -> String {
        format!("{}/{}", self.field_manager, self.force_conflicts)
    }

    fn names(&self) -> Vec<String> {
        self.manifests
            .iter()
            .filter_map(ObjectId::of_manifest)
            .map(|id| id.kubectl_name())
            .collect()
    }
}

/// The run that applied a job (its own output lines only), or why kubectl
/// could not start.
pub(crate) type Applied = Result<CommandRecord, String>;

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
        };
        let input = stream(batch.iter().flat_map(|m| &m.job.manifests));
        if batch.len() == 1 {
            let result = kubectl.run_with(slot, &invocation, Some(input)).await;
            if let Some(m) = batch.into_iter().next() {
                let _ = m.reply.send(result.map_err(|e| e.to_string()));
            }
            return;
        }
        let (lines, printed) = mpsc::unbounded_channel();
        let mut progress = Progress::new(batch, kubectl.command_line(&invocation));
        let (result, ()) = tokio::join!(
            kubectl.run_streaming(slot, &invocation, Some(input), lines),
            progress.follow(printed),
        );
        let size = progress.size;
        let rest = progress.rest();
        match result {
            Err(e) => {
                for (m, _) in rest {
                    let _ = m.reply.send(Err(e.to_string()));
                }
            }
            Ok(record) if record.succeeded() => {
                for (m, stdout) in rest {
                    let own = CommandRecord {
                        stdout,
                        batch_size: Some(size),
                        ..record.clone()
                    };
                    let _ = m.reply.send(Ok(own));
                }
            }
            Ok(_) => {
                let rest: Vec<_> = rest.into_iter().map(|(m, _)| m).collect();
                let k = kubectl.clone();
                batch::bisect(&kubectl, rest, move |half, slot| run(half, slot, k.clone())).await;
            }
        }
    })
}

/// A batch run under way: each member is answered as soon as kubectl has
/// printed a line for every one of its objects (kubectl prints one line
/// per object applied, as it goes), not when the whole run ends. Its
/// record then says exit code 0, its own lines, what kubectl wrote to
/// stderr so far and how long its part took.
struct Progress {
    pending: Vec<Pending>,
    command: String,
    started_at: jiff::Timestamp,
    start: Instant,
    stderr: String,
    /// Lines naming no member's object: for every member answered at the end.
    unclaimed: String,
    size: u32,
}

/// One member of a run under way.
struct Pending {
    member: Option<Member<ApplyJob, Applied>>,
    names: Vec<String>,
    /// Its objects kubectl has not reported yet.
    unreported: Vec<String>,
    stdout: String,
}

impl Progress {
    fn new(batch: Vec<Member<ApplyJob, Applied>>, command: String) -> Self {
        let size = u32::try_from(batch.len()).unwrap_or(u32::MAX);
        let pending = batch
            .into_iter()
            .map(|m| {
                let names = m.job.names();
                Pending {
                    unreported: names.clone(),
                    names,
                    member: Some(m),
                    stdout: String::new(),
                }
            })
            .collect();
        Self {
            pending,
            command,
            started_at: jiff::Timestamp::now(),
            start: Instant::now(),
            stderr: String::new(),
            unclaimed: String::new(),
            size,
        }
    }

    /// Takes kubectl's lines until it is done printing.
    async fn follow(&mut self, mut printed: mpsc::UnboundedReceiver<Printed>) {
        while let Some(line) = printed.recv().await {
            match line {
                Printed::Err(line) => push_line(&mut self.stderr, &line),
                Printed::Out(line) => self.claim(&line),
            }
        }
    }

    /// Gives a stdout line to the member whose object it names, and
    /// answers that member if it was the last of its objects.
    fn claim(&mut self, line: &str) {
        let object = line.split_whitespace().next().unwrap_or_default();
        let Some(p) = self
            .pending
            .iter_mut()
            .find(|p| p.names.iter().any(|n| n == object))
        else {
            push_line(&mut self.unclaimed, line);
            return;
        };
        push_line(&mut p.stdout, line);
        if let Some(i) = p.unreported.iter().position(|n| n == object) {
            p.unreported.swap_remove(i);
        }
        if p.unreported.is_empty()
            && let Some(m) = p.member.take()
        {
            let record = CommandRecord {
                command: self.command.clone(),
                exit_code: Some(0),
                stdout: std::mem::take(&mut p.stdout),
                stderr: self.stderr.clone(),
                started_at: self.started_at,
                duration_ms: u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX),
                timed_out: false,
                batch_size: Some(self.size),
                output_truncated: false,
            };
            let _ = m.reply.send(Ok(record));
        }
    }

    /// The members not answered yet, each with its stdout lines (and the
    /// unclaimed ones).
    fn rest(self) -> Vec<(Member<ApplyJob, Applied>, String)> {
        let unclaimed = self.unclaimed;
        self.pending
            .into_iter()
            .filter_map(|p| Some((p.member?, p.stdout + &unclaimed)))
            .collect()
    }
}

fn push_line(to: &mut String, line: &str) {
    to.push_str(line);
    to.push('\n');
}

/// The manifests as a YAML stream of JSON documents.
pub(crate) fn stream<'a>(manifests: impl IntoIterator<Item = &'a Value>) -> Vec<u8> {
    let mut out = Vec::new();
    for m in manifests {
        out.extend_from_slice(b"---\n");
        out.extend_from_slice(m.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::oneshot;

    fn config_map(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    }

    /// A member applying config maps `names`, and where its answer comes.
    fn member(names: &[&str]) -> (Member<ApplyJob, Applied>, oneshot::Receiver<Applied>) {
        let (reply, rx) = oneshot::channel();
        let job = ApplyJob {
            manifests: names.iter().map(|n| config_map(n)).collect(),
            field_manager: "m".into(),
            force_conflicts: false,
        };
        (Member { job, reply }, rx)
    }

    #[test]
    fn a_member_is_answered_once_all_its_objects_are_reported() {
        let (a, mut a_rx) = member(&["a1", "a2"]);
        let (b, _b_rx) = member(&["b"]);
        let mut progress = Progress::new(vec![a, b], "kubectl apply".into());
        progress.claim("configmap/a1 serverside-applied");
        assert!(a_rx.try_recv().is_err(), "a2 is not reported yet");
        progress.claim("something else");
        progress.claim("configmap/a2 serverside-applied");
        let a = a_rx.try_recv().unwrap().unwrap();
        assert_eq!(
            (a.exit_code, a.batch_size, a.stdout.as_str()),
            (
                Some(0),
                Some(2),
                "configmap/a1 serverside-applied\nconfigmap/a2 serverside-applied\n"
            )
        );
        let rest = progress.rest();
        assert_eq!(rest.len(), 1);
        assert_eq!(
            rest[0].1, "something else\n",
            "unclaimed lines go to the rest"
        );
    }

    #[test]
    fn jobs_with_other_flags_do_not_share_a_run_and_names_are_kubectls() {
        let job = |force| ApplyJob {
            manifests: vec![json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "a"}
            })],
            field_manager: "m".into(),
            force_conflicts: force,
        };
        assert_ne!(job(true).key(), job(false).key());
        assert_eq!(job(true).names(), ["deployment.apps/web"]);
    }

    #[test]
    fn the_stream_is_one_document_per_manifest() {
        let s = String::from_utf8(stream(&[json!({"a": 1}), json!({"b": "x\ny"})])).unwrap();
        assert_eq!(s, "---\n{\"a\":1}\n---\n{\"b\":\"x\\ny\"}\n");
    }

    #[tokio::test]
    async fn a_failed_batch_is_split_until_each_failure_is_alone() {
        use super::super::kubectl::testing::{runner, script};
        let dir = tempfile::tempdir().unwrap();
        let script = script(dir.path(), "cat >/dev/null\necho 'error: boom' >&2\nexit 1");
        let kubectl = runner(script, std::time::Duration::from_secs(5), 1024);
        let ((a, a_rx), (b, b_rx)) = (member(&["a"]), member(&["b"]));
        let slot = kubectl.acquire().await;
        run(vec![a, b], slot, kubectl.clone()).await;
        for rx in [a_rx, b_rx] {
            let r = rx.await.unwrap().unwrap();
            assert_eq!(r.exit_code, Some(1));
            assert_eq!(r.batch_size, None, "reported from its own run");
            assert!(r.stderr.contains("boom"));
        }
        assert_eq!(kubectl.stats().spawned(), 3);
    }

    #[tokio::test]
    async fn a_member_applied_is_answered_while_the_run_goes_on_and_only_the_rest_is_retried() {
        use super::super::kubectl::testing::{runner, script};
        let dir = tempfile::tempdir().unwrap();
        let script = script(
            dir.path(),
            "input=$(cat)\n\
             case \"$input\" in *'\"a\"'*) echo 'configmap/a serverside-applied';; esac\n\
             case \"$input\" in *'\"b\"'*) sleep 2; echo 'error: b broke' >&2; exit 1;; esac",
        );
        let kubectl = runner(script, std::time::Duration::from_secs(10), 1024);
        let ((a, a_rx), (b, b_rx)) = (member(&["a"]), member(&["b"]));
        let slot = kubectl.acquire().await;
        let batch = tokio::spawn(run(vec![a, b], slot, kubectl.clone()));
        let a = a_rx.await.unwrap().unwrap();
        assert!(!batch.is_finished(), "a was answered before kubectl ended");
        assert_eq!((a.exit_code, a.batch_size), (Some(0), Some(2)));
        assert_eq!(a.stdout, "configmap/a serverside-applied\n");
        batch.await.unwrap();
        let b = b_rx.await.unwrap().unwrap();
        assert_eq!((b.exit_code, b.batch_size), (Some(1), None));
        assert!(b.stderr.contains("b broke"));
        assert_eq!(kubectl.stats().spawned(), 2, "only b ran again");
    }

    #[tokio::test]
    async fn a_batch_applies_once_and_splits_output() {
        use super::super::batch::{BatchSettings, Queue};
        use super::super::kubectl::testing::{runner as fake_kubectl, script};
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
            manifests: vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
            ],
            field_manager: "m".into(),
            force_conflicts: false,
        };
        let (a, b) = tokio::join!(queue.submit(job("a")), queue.submit(job("b")));
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        assert_eq!(a.stdout, "configmap/a serverside-applied\n");
        assert_eq!(b.stdout, "configmap/b serverside-applied\n");
        assert_eq!(a.batch_size, Some(2));
        assert_eq!(kubectl.stats().spawned(), 1);
    }
}
