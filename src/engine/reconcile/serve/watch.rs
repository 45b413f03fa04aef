//! The watches of one kind the runtime serves: its resources (each event
//! seen by its reconciler first, which may cut the object down and say
//! whether it starts a reconcile), fed into the runtime's one store and
//! queue; and its nudges. (How many resources a kind defined in the
//! cluster has in every namespace is `count`'s.)

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use super::count::Tally;
use super::keyed::Keyed;
use super::{Held, Queue, Reconciler, Shared};

/// Watches the resources of the kind `kind` until `stop` is cancelled,
/// keeping the store and the queue of `shared`; returns the keys it holds
/// in the store (left there: what waits for them is written before they
/// go).
pub(super) async fn resources<R: Reconciler>(
    shared: Arc<Shared>,
    kind: Arc<str>,
    reconciler: Arc<R>,
    stop: CancellationToken,
    tally: Option<Tally>,
) -> Held {
    let (api, config) = reconciler.watched();
    let share = if reconciler.whole_on_every_replica() {
        None
    } else {
        shared.engine.settings.share.clone()
    };
    let mut events = crate::engine::reconcile::shared_watch::watch(api, config, share)
        .default_backoff()
        .boxed();
    let mut held = Held::new();
    let mut listing = Held::new();
    let mut said = Said::default();
    loop {
        let mut event = tokio::select! {
            () = stop.cancelled() => break,
            () = said.list_due(), if said.listing() => {
                said.list_slow(&kind);
                continue;
            }
            event = events.next() => match event {
                Some(Ok(event)) => event,
                // The watch retries, after a backoff.
                Some(Err(e)) => {
                    said.failed(&kind, &e);
                    continue;
                }
                None => break,
            },
        };
        said.seen(&event);
        if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = &mut event {
            slim(obj);
        }
        let admitted = reconciler.see(&mut event);
        let listed = matches!(event, watcher::Event::InitApply(_));
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                let keyed = Keyed::new(kind.clone(), Arc::new(object));
                let key = keyed.key();
                shared.hold(keyed);
                listing.insert(key.clone());
                if held.insert(key.clone()) && !listed {
                    tally.iter().for_each(|t| t.set(held.len()));
                }
                if admitted {
                    shared.queue.push(key);
                }
            }
            watcher::Event::InitDone => {
                // Gone while the watch was away: no delete event came.
                for key in held.difference(&listing) {
                    let object = shared.store.get(key);
                    if let Some(object) = object.and_then(|k| k.object::<R::Resource>()) {
                        reconciler.gone(&object);
                    }
                    shared.drop_key(key);
                }
                held = std::mem::take(&mut listing);
                tally.iter().for_each(|t| t.set(held.len()));
            }
            watcher::Event::Delete(object) => {
                // Whatever the kind remembered of it goes too (a finalizer
                // removed by someone else skips the engine's cleanup).
                reconciler.gone(&object);
                let key = Keyed::new(kind.clone(), Arc::new(object)).key();
                shared.drop_key(&key);
                if held.remove(&key) {
                    tally.iter().for_each(|t| t.set(held.len()));
                }
            }
        }
    }
    held
}

/// How long a watch's list may take before the log says so.
const SLOW_LIST: Duration = Duration::from_secs(30);

/// What the log was told of a watch: a list that takes long, and the
/// first failure after the watch ran well (kube-runtime logs them only
/// at debug level), so that a kind that never lists shows why.
#[derive(Default)]
struct Said {
    /// When the list under way is said to be slow.
    list_due: Option<tokio::time::Instant>,
    /// A failure was said, and no list has finished since.
    failing: bool,
}

impl Said {
    fn listing(&self) -> bool {
        self.list_due.is_some()
    }

    async fn list_due(&self) {
        if let Some(due) = self.list_due {
            tokio::time::sleep_until(due).await;
        }
    }

    fn list_slow(&mut self, kind: &str) {
        self.list_due = None;
        let seconds = SLOW_LIST.as_secs();
        tracing::warn!(kind, seconds, "the watch's list has not finished");
    }

    fn failed(&mut self, kind: &str, error: &watcher::Error) {
        if !std::mem::replace(&mut self.failing, true) {
            let error = crate::error_text::any(error);
            tracing::warn!(kind, %error, "the watch failed; it starts again after a backoff");
        }
    }

    fn seen<K>(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Init => {
                self.list_due = Some(tokio::time::Instant::now() + SLOW_LIST);
            }
            watcher::Event::InitDone => {
                self.list_due = None;
                self.failing = false;
            }
            _ => {}
        }
    }
}

/// The annotation `kubectl apply` (client-side) keeps the whole last
/// applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object what the store need not hold, for any
/// kind: with many resources, its managedFields and kubectl's
/// last-applied annotation are most of it.
pub(crate) fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Queues the reconciles `nudges` asks for until `stop` is cancelled.
pub(super) async fn nudged(
    shared: Arc<Shared>,
    mut nudges: BoxStream<'static, ObjectRef<Keyed>>,
    stop: CancellationToken,
) {
    loop {
        let key = tokio::select! {
            () = stop.cancelled() => break,
            key = nudges.next() => match key {
                Some(key) => key,
                None => break,
            },
        };
        shared.queue.push(key);
    }
}

impl Queue {
    /// Asks for a reconcile of `key` (dropped once the runtime stopped).
    pub(super) fn push(&self, key: ObjectRef<Keyed>) {
        let _ = self.0.unbounded_send(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::reconcile::traced::LogLines;
    use kube::api::DynamicObject;
    use tracing_subscriber::layer::SubscriberExt;

    const FAILED: &str = "the watch failed";
    const SLOW: &str = "the watch's list has not finished";

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_fails_or_lists_slowly_is_said_once_until_it_lists() {
        let lines = LogLines::default();
        let writer = lines.clone();
        let layer = tracing_subscriber::fmt::layer().with_writer(move || writer.clone());
        let _logging = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let mut said = Said::default();
        let init = watcher::Event::<DynamicObject>::Init;
        let done = watcher::Event::<DynamicObject>::InitDone;

        said.seen(&init);
        assert!(said.listing());
        said.failed("Greeting", &watcher::Error::NoResourceVersion);
        said.failed("Greeting", &watcher::Error::NoResourceVersion);
        assert_eq!(lines.count(FAILED), 1, "a failure said once");
        said.seen(&init);
        said.list_due().await;
        said.list_slow("Greeting");
        assert_eq!(lines.count(SLOW), 1);
        assert!(!said.listing(), "a slow list is said once");

        said.seen(&init);
        said.seen(&done);
        assert!(!said.listing());
        said.failed("Greeting", &watcher::Error::NoResourceVersion);
        assert_eq!(lines.count(FAILED), 2, "said again after a list finished");
    }
}
