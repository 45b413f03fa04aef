//! The watch of a kind's resources when replicas share the work by
//! themselves: only the resources in this replica's share pass, and the
//! watch lists again whenever the share changes, so that the store gains
//! the resources of a slot taken and loses those of a slot given up (the
//! reflector replaces its contents when a list ends); holding nothing, it
//! reads nothing. The resources that pass are counted in the share.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, stream};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use crate::partition::share::{Share, fnv1a64};

type Events<K> = BoxStream<'static, watcher::Result<Event<K>>>;

/// The watch of `api` with `config`; with a share, filtered by it and
/// started again each time it changes.
pub(crate) fn watch<K>(api: Api<K>, config: watcher::Config, share: Option<Arc<Share>>) -> Events<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let Some(share) = share else {
        return watcher::watcher(api, config).boxed();
    };
    share.filter_collection(api.resource_url());
    let state = State {
        held: share.subscribe(),
        current: None,
        counted: Counted {
            share,
            uids: HashSet::new(),
            listing: None,
        },
    };
    stream::unfold(state, move |mut state| {
        let (api, config) = (api.clone(), config.clone());
        async move {
            loop {
                let events = match &mut state.current {
                    Some(events) => events,
                    // Holding nothing (yet, or for now): nothing to read.
                    None if state.held.borrow_and_update().is_empty() => {
                        state.held.changed().await.ok()?;
                        continue;
                    }
                    None => state
                        .current
                        .insert(watcher::watcher(api.clone(), config.clone()).boxed()),
                };
                tokio::select! {
                    changed = state.held.changed() => {
                        changed.ok()?;
                        state.current = None;
                    }
                    event = events.next() => {
                        let event = event?;
                        if state.counted.pass(&event) {
                            return Some((event, state));
                        }
                    }
                }
            }
        }
    })
    .boxed()
}

/// The watch as it stands: the share followed, the current watcher.
struct State<K> {
    held: tokio::sync::watch::Receiver<crate::partition::share::Slots>,
    current: Option<Events<K>>,
    counted: Counted,
}

/// The resources this watch let through (their UIDs' hashes), counted in
/// the share until the watch ends.
struct Counted {
    share: Arc<Share>,
    uids: HashSet<u64>,
    /// The resources of a list under way.
    listing: Option<HashSet<u64>>,
}

impl Counted {
    /// Whether an event passes (an object's only when its UID is in the
    /// share), counting what does.
    fn pass<K: Resource>(&mut self, event: &watcher::Result<Event<K>>) -> bool {
        let uid = |obj: &K| {
            obj.meta()
                .uid
                .as_deref()
                .map(|u| (self.share.owns(u), fnv1a64(u)))
        };
        match event {
            Ok(Event::Init) => self.listing = Some(HashSet::new()),
            Ok(Event::InitApply(obj)) => match uid(obj) {
                Some((true, hash)) => {
                    self.listing.get_or_insert_default().insert(hash);
                }
                _ => return self.foreign(),
            },
            Ok(Event::InitDone) => {
                let listed = self.listing.take().unwrap_or_default();
                self.share
                    .count_resources(listed.len() as i64 - self.uids.len() as i64);
                self.uids = listed;
            }
            Ok(Event::Apply(obj)) => match uid(obj) {
                Some((true, hash)) => {
                    if self.uids.insert(hash) {
                        self.share.count_resources(1);
                    }
                }
                _ => return self.foreign(),
            },
            Ok(Event::Delete(obj)) => {
                if let Some((_, hash)) = uid(obj)
                    && self.uids.remove(&hash)
                {
                    self.share.count_resources(-1);
                }
            }
            Err(_) => {}
        }
        true
    }
}

impl Counted {
    /// A resource outside the share was read: counted, left out.
    fn foreign(&self) -> bool {
        self.share.count_foreign();
        false
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.share.count_resources(-(self.uids.len() as i64));
    }
}
