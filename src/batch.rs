//! Coalescing applies: overlays of resources that become due together are
//! applied with one `kubectl apply -k`, and kubectl's per-object output lines
//! are mapped back to each resource.
//!
//! Each kubectl run costs a fixed ~0.2 CPU-seconds before it talks to the API
//! server, so one run per resource caps throughput at a few resources per
//! second per core. The batcher queues applies; it starts a run as soon as a
//! kubectl slot is free, after waiting a short window for company, taking up
//! to `max` queued overlays. While every slot is busy the queue grows, so a
//! burst turns into a few large runs while a lone change still goes out at
//! once.
//!
//! The combined directory has one sub-directory per resource (each a complete
//! overlay) and a root `kustomization.yaml` listing them. Output lines
//! (`deployment.apps/web created`) are attributed through the object names a
//! plan declares ([`crate::handler::Plan::batch_names`]); two overlays naming
//! the same object never share a batch, so attribution is exact. If the run
//! fails, the batch is split in halves and each half applied again, down to
//! single resources: every failing resource is finally applied alone and
//! gets its own precise status, at a cost of about 2·log2(n) runs.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::kubectl::{CommandRecord, Kubectl};
use crate::overlay::RenderedOverlay;

/// How applies are coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// After the first queued apply, wait this long for others.
    pub window: Duration,
    /// At most this many overlays per kubectl run.
    pub max: usize,
}

/// What the batcher did with one apply.
#[derive(Debug)]
pub enum BatchOutcome {
    /// kubectl ran: in a batch that succeeded (the record holds this
    /// resource's lines), or alone (the record is that run's, success or not).
    Done(CommandRecord),
    /// kubectl could not run: apply alone.
    ApplyAlone,
}

struct Member {
    overlay: RenderedOverlay,
    names: Vec<String>,
    reply: oneshot::Sender<BatchOutcome>,
}

/// The handle reconciles use to queue applies.
#[derive(Debug, Clone)]
pub struct Batcher {
    queue: mpsc::UnboundedSender<Member>,
}

impl Batcher {
    /// Starts the batching task.
    pub fn start(kubectl: Kubectl, work_dir: PathBuf, settings: BatchSettings) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(batch_loop(rx, kubectl, work_dir, settings));
        Self { queue }
    }

    /// Queues `overlay` (whose objects kubectl prints as `names`) and waits
    /// for the outcome.
    pub async fn apply(&self, overlay: RenderedOverlay, names: Vec<String>) -> BatchOutcome {
        let (reply, rx) = oneshot::channel();
        let member = Member {
            overlay,
            names,
            reply,
        };
        if self.queue.send(member).is_err() {
            return BatchOutcome::ApplyAlone;
        }
        rx.await.unwrap_or(BatchOutcome::ApplyAlone)
    }
}

async fn batch_loop(
    mut rx: mpsc::UnboundedReceiver<Member>,
    kubectl: Kubectl,
    work_dir: PathBuf,
    settings: BatchSettings,
) {
    let mut pending: VecDeque<Member> = VecDeque::new();
    let mut open = true;
    while open || !pending.is_empty() {
        if pending.is_empty() {
            match rx.recv().await {
                Some(m) => pending.push_back(m),
                None => break,
            }
            let deadline = tokio::time::Instant::now() + settings.window;
            while pending.len() < settings.max {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(m)) => pending.push_back(m),
                    Ok(None) => {
                        open = false;
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        // Wait for a kubectl slot; whatever arrives meanwhile joins the queue.
        let slot = loop {
            if !open {
                break kubectl.acquire().await;
            }
            tokio::select! {
                slot = kubectl.acquire() => break slot,
                m = rx.recv() => match m {
                    Some(m) => pending.push_back(m),
                    None => open = false,
                },
            }
        };
        while let Ok(m) = rx.try_recv() {
            pending.push_back(m);
        }
        let batch = take_batch(&mut pending, settings.max);
        let kubectl = kubectl.clone();
        let work_dir = work_dir.clone();
        tokio::spawn(async move {
            run_batch(batch, kubectl, slot, &work_dir).await;
        });
    }
}

/// Takes up to `max` members from the front of the queue whose object names
/// do not collide; the others stay queued in order.
fn take_batch(pending: &mut VecDeque<Member>, max: usize) -> Vec<Member> {
    let mut batch = Vec::new();
    let mut names = HashSet::new();
    let mut kept = VecDeque::new();
    while let Some(m) = pending.pop_front() {
        let collides = m.names.iter().any(|n| names.contains(n));
        if batch.len() >= max || collides {
            kept.push_back(m);
            continue;
        }
        names.extend(m.names.iter().cloned());
        batch.push(m);
    }
    *pending = kept;
    batch
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RootKustomization {
    api_version: &'static str,
    kind: &'static str,
    resources: Vec<String>,
}

async fn run_batch(
    batch: Vec<Member>,
    kubectl: Kubectl,
    slot: crate::kubectl::Slot,
    work_dir: &std::path::Path,
) {
    let reply_all = |batch: Vec<Member>| {
        for m in batch {
            let _ = m.reply.send(BatchOutcome::ApplyAlone);
        }
    };
    let Ok(dir) = tempfile::Builder::new()
        .prefix("batch-")
        .tempdir_in(work_dir)
    else {
        return reply_all(batch);
    };
    if let [single] = batch.as_slice() {
        // Alone: exactly the run the engine would make without batching.
        if single.overlay.write_to(dir.path()).is_err() {
            return reply_all(batch);
        }
        let args = apply_args(dir.path());
        let outcome = match kubectl.run_with(slot, &args, None).await {
            Ok(record) => BatchOutcome::Done(record),
            Err(_) => BatchOutcome::ApplyAlone,
        };
        for m in batch {
            let _ = m.reply.send(outcome_clone(&outcome));
        }
        return;
    }
    let mut root = RootKustomization {
        api_version: "kustomize.config.k8s.io/v1beta1",
        kind: "Kustomization",
        resources: Vec::with_capacity(batch.len()),
    };
    for (i, m) in batch.iter().enumerate() {
        let sub = format!("r{i:04}");
        if m.overlay.write_to(&dir.path().join(&sub)).is_err() {
            return reply_all(batch);
        }
        root.resources.push(sub);
    }
    let Ok(yaml) = serde_saphyr::to_string(&root) else {
        return reply_all(batch);
    };
    if std::fs::write(dir.path().join("kustomization.yaml"), yaml).is_err() {
        return reply_all(batch);
    }
    let record = match kubectl.run_with(slot, &apply_args(dir.path()), None).await {
        Ok(r) => r,
        Err(_) => return reply_all(batch),
    };
    drop(dir);
    if !record.succeeded() {
        // Find the culprits by halves: members that apply cleanly in a
        // smaller batch are done; a failing one ends up alone, with its own
        // error. One bad resource costs about 2·log2(n) runs, not n.
        let mut first = batch;
        let second = first.split_off(first.len() / 2);
        for half in [first, second] {
            let slot = kubectl.acquire().await;
            Box::pin(run_batch(half, kubectl.clone(), slot, work_dir)).await;
        }
        return;
    }
    let size = u32::try_from(batch.len()).unwrap_or(u32::MAX);
    let lines = split_lines(&record.stdout, &batch);
    for (m, stdout) in batch.into_iter().zip(lines) {
        let mut own = record.clone();
        own.stdout = stdout;
        own.batch_size = Some(size);
        let _ = m.reply.send(BatchOutcome::Done(own));
    }
}

fn apply_args(dir: &std::path::Path) -> Vec<String> {
    vec!["apply".into(), "-k".into(), dir.display().to_string()]
}

fn outcome_clone(o: &BatchOutcome) -> BatchOutcome {
    match o {
        BatchOutcome::Done(r) => BatchOutcome::Done(r.clone()),
        BatchOutcome::ApplyAlone => BatchOutcome::ApplyAlone,
    }
}

/// Gives each member the output lines about its objects; a line naming no
/// member's object goes to every member.
fn split_lines(stdout: &str, batch: &[Member]) -> Vec<String> {
    let mut out = vec![String::new(); batch.len()];
    for line in stdout.lines() {
        let object = line.split_whitespace().next().unwrap_or_default();
        let owner = batch
            .iter()
            .position(|m| m.names.iter().any(|n| n == object));
        match owner {
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
    use std::collections::BTreeMap;

    fn member(names: &[&str]) -> (Member, oneshot::Receiver<BatchOutcome>) {
        let (reply, rx) = oneshot::channel();
        let overlay = RenderedOverlay::new(BTreeMap::from([(
            "kustomization.yaml".to_string(),
            format!("# {}\n", names.join(",")).into_bytes(),
        )]));
        (
            Member {
                overlay,
                names: names.iter().map(|s| s.to_string()).collect(),
                reply,
            },
            rx,
        )
    }

    #[test]
    fn colliding_names_wait_for_the_next_batch() {
        let mut q: VecDeque<_> = [
            &["deployment.apps/a"][..],
            &["deployment.apps/a"],
            &["deployment.apps/b"],
        ]
        .iter()
        .map(|n| member(n).0)
        .collect();
        let b = take_batch(&mut q, 10);
        assert_eq!(b.len(), 2);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].names, ["deployment.apps/a"]);
    }

    #[test]
    fn batch_size_is_bounded() {
        let mut q: VecDeque<_> = (0..5).map(|i| member(&[&format!("x/{i}")]).0).collect();
        assert_eq!(take_batch(&mut q, 3).len(), 3);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn lines_go_to_their_owner_and_unknown_lines_to_all() {
        let batch = vec![
            member(&["deployment.apps/a"]).0,
            member(&["deployment.apps/b"]).0,
        ];
        let out = split_lines(
            "deployment.apps/a created\ndeployment.apps/b unchanged\nsomething else\n",
            &batch,
        );
        assert_eq!(out[0], "deployment.apps/a created\nsomething else\n");
        assert_eq!(out[1], "deployment.apps/b unchanged\nsomething else\n");
    }

    #[tokio::test]
    async fn a_failed_batch_is_split_until_each_failure_is_alone() {
        use crate::kubectl::KubectlConfig;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("kubectl");
        std::fs::write(&script, "#!/bin/sh\necho 'error: boom' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let kubectl = Kubectl::new(KubectlConfig {
            path: script,
            timeout: Duration::from_secs(5),
            max_concurrent: 1,
            cache_dir: None,
            output_cap: 1024,
        });
        let (a, ra) = member(&["x/a"]);
        let (b, rb) = member(&["x/b"]);
        let slot = kubectl.acquire().await;
        run_batch(vec![a, b], kubectl.clone(), slot, dir.path()).await;
        for rx in [ra, rb] {
            let BatchOutcome::Done(r) = rx.await.unwrap() else {
                panic!("not run")
            };
            assert_eq!(r.exit_code, Some(1));
            assert_eq!(r.batch_size, None, "reported from its own run");
            assert!(r.stderr.contains("boom"));
        }
        assert_eq!(kubectl.stats().spawned(), 3);
    }

    #[tokio::test]
    async fn a_batch_applies_once_and_splits_output() {
        use crate::kubectl::KubectlConfig;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("kubectl");
        // Prints one line per sub-overlay listed in the root kustomization.
        std::fs::write(
            &script,
            "#!/bin/sh\nfor a in \"$@\"; do d=\"$a\"; done\nfor r in $(grep -o 'r[0-9][0-9]*' \"$d/kustomization.yaml\"); do n=$(head -1 \"$d/$r/kustomization.yaml\" | cut -c3-); echo \"$n created\"; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let kubectl = Kubectl::new(KubectlConfig {
            path: script,
            timeout: Duration::from_secs(5),
            max_concurrent: 1,
            cache_dir: None,
            output_cap: 4096,
        });
        let batcher = Batcher::start(
            kubectl.clone(),
            dir.path().to_path_buf(),
            BatchSettings {
                window: Duration::from_millis(50),
                max: 10,
            },
        );
        let (a, b) = tokio::join!(
            batcher.apply(member(&["x/a"]).0.overlay, vec!["x/a".into()]),
            batcher.apply(member(&["x/b"]).0.overlay, vec!["x/b".into()]),
        );
        let (BatchOutcome::Done(a), BatchOutcome::Done(b)) = (a, b) else {
            panic!("not applied");
        };
        assert_eq!(a.stdout, "x/a created\n");
        assert_eq!(b.stdout, "x/b created\n");
        assert_eq!(a.batch_size, Some(2));
        assert_eq!(kubectl.stats().spawned(), 1);
    }
}
