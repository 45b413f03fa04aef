//! Coalescing kubectl runs: builds (`kubectl kustomize`) and applies
//! (`kubectl apply -f -`) of resources that become due together share one
//! kubectl process, and each resource gets back only its own part.
//!
//! Each kubectl run costs a fixed ~0.2 CPU-seconds before it talks to the
//! API server, so one run per resource caps throughput at a few resources
//! per second per core. A [`Queue`] takes jobs; it starts a run as soon as
//! a kubectl slot is free, after waiting a short window for company, taking
//! up to `max` compatible jobs whose object names do not collide. While
//! every slot is busy the queue grows, so a burst turns into a few large
//! runs while a lone change still goes out at once.
//!
//! If a run fails, the batch is split in halves and each half run again,
//! down to single jobs: every failing job finally runs alone and gets its
//! own precise error, at a cost of about 2·log2(n) runs.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span};

use crate::kubectl::{Kubectl, Slot};

/// How runs are coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// After the first queued job, wait this long for others.
    pub window: Duration,
    /// At most this many jobs per kubectl run.
    pub max: usize,
}

/// A job that may share a kubectl run with others.
pub(crate) trait Job: Send + 'static {
    /// Jobs share a run only with jobs of the same key (e.g. the same flags).
    fn key(&self) -> String;
    /// Names that must be unique within a run (how kubectl's output lines
    /// are told apart).
    fn names(&self) -> Vec<String>;
}

/// A queued job, where its result goes, and the span it was queued in
/// (its reconcile's), which the run's span belongs to ([`run_span`]).
pub(crate) struct Member<J, R> {
    pub job: J,
    pub reply: oneshot::Sender<R>,
    pub span: Span,
}

/// Runs a batch: sends every member its reply (a member whose reply is
/// dropped sees `None` from [`Queue::submit`]).
pub(crate) type Runner<J, R> =
    Arc<dyn Fn(Vec<Member<J, R>>, Slot) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The handle reconciles use to queue jobs.
pub(crate) struct Queue<J, R> {
    tx: mpsc::UnboundedSender<Member<J, R>>,
}

impl<J, R> Clone for Queue<J, R> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<J: Job, R: Send + 'static> Queue<J, R> {
    /// Starts the queue's task.
    pub fn start(kubectl: Kubectl, settings: BatchSettings, run: Runner<J, R>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(queue_loop(rx, kubectl, settings, run));
        Self { tx }
    }

    /// Queues `job` and waits for its result; `None` when the queue is gone.
    pub async fn submit(&self, job: J) -> Option<R> {
        let (reply, rx) = oneshot::channel();
        let span = Span::current();
        self.tx.send(Member { job, reply, span }).ok()?;
        rx.await.ok()
    }
}

async fn queue_loop<J: Job, R: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<Member<J, R>>,
    kubectl: Kubectl,
    settings: BatchSettings,
    run: Runner<J, R>,
) {
    let mut pending: VecDeque<Member<J, R>> = VecDeque::new();
    let mut open = true;
    while open || !pending.is_empty() {
        if pending.is_empty() {
            match rx.recv().await {
                Some(m) => pending.push_back(m),
                None => break,
            }
            open = gather(&mut rx, &mut pending, settings).await;
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
        let span = run_span(&batch);
        tokio::spawn(run(batch, slot).instrument(span));
    }
}

/// The span a run's log lines and kubectl spans belong to: a lone job's
/// reconcile, so that a trace holds the kubectl run it caused; for a
/// shared run, a `batch` span of its own that follows from every job's
/// (a link to each reconcile, in OpenTelemetry's terms).
fn run_span<J, R>(batch: &[Member<J, R>]) -> Span {
    if let [lone] = batch {
        return lone.span.clone();
    }
    let span = tracing::info_span!(parent: None, "batch", jobs = batch.len());
    for member in batch {
        span.follows_from(&member.span);
    }
    span
}

/// Waits up to the window for more jobs; false when the channel closed.
async fn gather<J, R>(
    rx: &mut mpsc::UnboundedReceiver<Member<J, R>>,
    pending: &mut VecDeque<Member<J, R>>,
    settings: BatchSettings,
) -> bool {
    let deadline = tokio::time::Instant::now() + settings.window;
    while pending.len() < settings.max {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(m)) => pending.push_back(m),
            Ok(None) => return false,
            Err(_) => break,
        }
    }
    true
}

/// Takes up to `max` members from the front of the queue that share the
/// first one's key and whose names do not collide; the others stay queued
/// in order.
fn take_batch<J: Job, R>(pending: &mut VecDeque<Member<J, R>>, max: usize) -> Vec<Member<J, R>> {
    let mut batch: Vec<Member<J, R>> = Vec::new();
    let mut names = HashSet::new();
    let mut kept = VecDeque::new();
    let mut key = None;
    while let Some(m) = pending.pop_front() {
        let k = m.job.key();
        let member_names = m.job.names();
        let fits = batch.len() < max
            && key.as_ref().is_none_or(|first| *first == k)
            && !member_names.iter().any(|n| names.contains(n));
        if !fits {
            kept.push_back(m);
            continue;
        }
        key.get_or_insert(k);
        names.extend(member_names);
        batch.push(m);
    }
    *pending = kept;
    batch
}

/// Splits a failed batch in halves and runs each again with `run`.
pub(crate) async fn bisect<J, R, F, Fut>(kubectl: &Kubectl, mut batch: Vec<Member<J, R>>, run: F)
where
    F: Fn(Vec<Member<J, R>>, Slot) -> Fut,
    Fut: Future<Output = ()>,
{
    let second = batch.split_off(batch.len() / 2);
    for half in [batch, second] {
        let slot = kubectl.acquire().await;
        run(half, slot).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct T {
        key: &'static str,
        names: Vec<String>,
    }

    impl Job for T {
        fn key(&self) -> String {
            self.key.into()
        }
        fn names(&self) -> Vec<String> {
            self.names.clone()
        }
    }

    fn member(key: &'static str, names: &[&str]) -> Member<T, ()> {
        let (reply, _rx) = oneshot::channel();
        Member {
            job: T {
                key,
                names: names.iter().map(|s| s.to_string()).collect(),
            },
            reply,
            span: Span::none(),
        }
    }

    #[test]
    fn colliding_names_wait_for_the_next_batch() {
        let mut q: VecDeque<_> = [
            member("k", &["deployment.apps/a"]),
            member("k", &["deployment.apps/a"]),
            member("k", &["deployment.apps/b"]),
        ]
        .into();
        let b = take_batch(&mut q, 10);
        assert_eq!(b.len(), 2);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].job.names, ["deployment.apps/a"]);
    }

    #[test]
    fn batch_size_is_bounded() {
        let mut q: VecDeque<_> = (0..5).map(|i| member("k", &[&format!("x/{i}")])).collect();
        assert_eq!(take_batch(&mut q, 3).len(), 3);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn only_jobs_of_the_same_key_share_a_run() {
        let mut q: VecDeque<_> = [
            member("force", &["a"]),
            member("plain", &["b"]),
            member("force", &["c"]),
        ]
        .into();
        let b = take_batch(&mut q, 10);
        let keys: Vec<_> = b.iter().map(|m| m.job.key).collect();
        assert_eq!(keys, ["force", "force"]);
        assert_eq!(q.len(), 1);
    }
}
