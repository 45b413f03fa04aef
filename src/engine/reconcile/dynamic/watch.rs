//! The watches of one kind served by the dynamic controller: its resources
//! (as a kind's own controller watched them: managedFields and kubectl's
//! last-applied annotation dropped, the owned kinds' watches primed from
//! the first list, only changes of a resource's input let through), fed
//! into the controller's one store and queue; and, for a kind defined in
//! the cluster, how many resources it has in every namespace and shard.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use super::keyed::Keyed;
use super::{Queue, Shared};
use crate::engine::reconcile::controller::slim;
use crate::engine::reconcile::primer::Primer;
use kube::Resource;

/// Watches the resources of `served`'s kind until `stop` is cancelled,
/// keeping the store and the queue of `shared`; returns the keys it holds
/// in the store (left there: the statuses parked for them are written
/// before they go).
pub(super) async fn resources<H: super::DynamicHandler>(
    shared: Arc<Shared<H>>,
    served: Arc<super::ServedKind<H>>,
    stop: CancellationToken,
) -> super::Held<H::Resource> {
    let engine = &served.ctx.engine;
    let handler = &served.ctx.handler;
    let namespace = engine.settings.namespace.clone();
    let api = handler.api(engine.reader.clone(), namespace.as_deref());
    let shard = crate::engine::model::shard::selector(engine.settings.shard.as_deref());
    let selector =
        crate::engine::model::shard::combine(handler.watch_selector(namespace.as_deref()), &shard);
    let config = watcher::Config::default().any_semantic().labels(&selector);
    let share = engine.settings.share.clone();
    let mut events = crate::engine::reconcile::shared_watch::watch(api, config, share)
        .default_backoff()
        .modify(slim::<H::Resource>)
        .boxed();
    let mut primer = Primer::new(engine.clone(), handler.clone());
    let mut held: super::Held<H::Resource> = HashSet::new();
    let mut listing: super::Held<H::Resource> = HashSet::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = events.next() => match event {
                Some(Ok(event)) => event,
                // The watch retries (after a backoff); kube-runtime logs it.
                Some(Err(_)) => continue,
                None => break,
            },
        };
        primer.see(&event);
        let admitted = served.ctx.triggers.admit(&event);
        match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                engine.memo.cached(object.meta());
                let keyed = Keyed::new(served.kind.clone(), object);
                let key = keyed.key();
                shared.hold(keyed);
                listing.insert(key.clone());
                held.insert(key.clone());
                if admitted {
                    shared.queue.push(key);
                }
            }
            watcher::Event::InitDone => {
                // Gone while the watch was away: no delete event came.
                for key in held.difference(&listing) {
                    shared.drop_key(key);
                }
                held = std::mem::take(&mut listing);
            }
            watcher::Event::Delete(object) => {
                // Whatever the kind remembered of it goes too (a finalizer
                // removed by someone else skips the engine's cleanup).
                handler.forget(&object);
                let key = Keyed::new(served.kind.clone(), object).key();
                shared.drop_key(&key);
                held.remove(&key);
            }
        }
    }
    held
}

/// Watches the metadata of the objects of type `resource` that the
/// resources of `served`'s kind read without owning them (in the watched
/// namespace, or all), and queues a reconcile of each resource that read
/// one that changed or went, until `stop` is cancelled.
pub(super) async fn references<H: super::DynamicHandler>(
    shared: Arc<Shared<H>>,
    served: Arc<super::ServedKind<H>>,
    resource: ApiResource,
    stop: CancellationToken,
) {
    let engine = &served.ctx.engine;
    let client = engine.client.clone();
    let api: kube::Api<PartialObjectMeta<DynamicObject>> =
        match engine.settings.namespace.as_deref() {
            Some(ns) => kube::Api::namespaced_with(client, ns, &resource),
            None => kube::Api::all_with(client, &resource),
        };
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .boxed();
    loop {
        let meta = tokio::select! {
            () = stop.cancelled() => break,
            event = events.next() => match event {
                Some(Ok(meta)) => meta,
                // The watch retries (after a backoff); kube-runtime logs it.
                Some(Err(_)) => continue,
                None => break,
            },
        };
        for (namespace, name) in served.ctx.handler.readers(&resource, &meta.metadata) {
            shared
                .queue
                .push(super::keyed::key(&served.kind, namespace.as_deref(), &name));
        }
    }
}

impl<K> Queue<K> {
    /// Asks for a reconcile of `key` (dropped once the controller stopped).
    pub(super) fn push(&self, key: ObjectRef<Keyed<K>>) {
        let _ = self.0.unbounded_send(key);
    }
}

/// How many resources a kind has, once its count watch listed them.
#[derive(Debug, Default)]
pub(crate) struct Count {
    value: AtomicU64,
    known: AtomicBool,
}

impl Count {
    fn set(&self, value: usize) {
        self.value.store(value as u64, Ordering::Relaxed);
        self.known.store(true, Ordering::Relaxed);
    }

    /// The count, once known.
    pub fn get(&self) -> Option<u64> {
        self.known
            .load(Ordering::Relaxed)
            .then(|| self.value.load(Ordering::Relaxed))
    }
}

/// Keeps `count` of the resources of `kind` in every namespace and shard
/// (their UIDs, from a metadata watch: a definition's count, which guards
/// its deletion, includes what other shards serve), calling `changed`
/// whenever it changes; until `stop` is cancelled.
pub(super) async fn count(
    client: kube::Client,
    kind: ApiResource,
    count: Arc<Count>,
    changed: Arc<dyn Fn() + Send + Sync>,
    stop: CancellationToken,
) {
    let api = kube::Api::<PartialObjectMeta<DynamicObject>>::all_with(client, &kind);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut uids: HashSet<String> = HashSet::new();
    let mut listing: HashSet<String> = HashSet::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => match event {
                Some(Ok(event)) => event,
                Some(Err(_)) => continue,
                None => return,
            },
        };
        let moved = match event {
            watcher::Event::Init => {
                listing.clear();
                false
            }
            watcher::Event::InitApply(object) => {
                listing.extend(object.metadata.uid);
                false
            }
            watcher::Event::InitDone => {
                std::mem::swap(&mut uids, &mut listing);
                listing.clear();
                true
            }
            watcher::Event::Apply(object) => object.metadata.uid.is_some_and(|u| uids.insert(u)),
            watcher::Event::Delete(object) => object.metadata.uid.is_some_and(|u| uids.remove(&u)),
        };
        if moved && count.get() != Some(uids.len() as u64) {
            count.set(uids.len());
            changed();
        }
    }
}
