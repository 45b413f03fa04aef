//! The kinds served from definitions: one controller task per kind, each
//! with its own stop token. Replacing a generation stops the old
//! controller (its running reconciles finish) and starts the new one,
//! whose first pass looks at every resource of the kind and applies again
//! those whose overlay changed. Beside each controller, a watch of the
//! kind's resources in every namespace (metadata only, keeping their UIDs)
//! counts them and nudges the definition when the count changes, so the
//! count in its status (which admission reads to refuse deleting a
//! definition whose kind still has resources) follows at once. Dropping
//! the table aborts every task.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::generation::{Generation, Taken};
use crate::engine::host::Engine;
use crate::kinds::KindOptions;
use crate::kinds::registry::Kind;

/// A kind being served.
struct Served {
    generation: Generation,
    stop: CancellationToken,
    task: JoinHandle<()>,
    count: Arc<Count>,
}

/// How many resources of a kind exist, once the watch listed them.
#[derive(Debug, Default)]
struct Count {
    value: AtomicU64,
    known: AtomicBool,
}

impl Count {
    fn set(&self, value: usize) {
        self.value.store(value as u64, Ordering::Relaxed);
        self.known.store(true, Ordering::Relaxed);
    }

    fn get(&self) -> Option<u64> {
        self.known
            .load(Ordering::Relaxed)
            .then(|| self.value.load(Ordering::Relaxed))
    }
}

/// Aborts the task if the table goes without stopping it.
impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every kind served from a definition, by definition name.
pub struct Serving {
    engine: Arc<Engine>,
    options: KindOptions,
    shutdown: CancellationToken,
    served: Mutex<BTreeMap<String, Served>>,
    /// Names of definitions one of whose resources was deleted.
    nudges: mpsc::Sender<String>,
}

/// How many nudges may wait (more are dropped: the periodic look at each
/// definition counts again anyway).
pub const NUDGES_QUEUED: usize = 256;

impl Serving {
    /// An empty table; controllers stop when `shutdown` is cancelled, and
    /// deletions of a kind's resources are told on `nudges`.
    pub fn new(
        engine: Arc<Engine>,
        options: KindOptions,
        shutdown: CancellationToken,
        nudges: mpsc::Sender<String>,
    ) -> Self {
        Self {
            engine,
            options,
            shutdown,
            served: Mutex::default(),
            nudges,
        }
    }

    /// The generation served for the definition `name`, if any.
    pub fn current(&self, name: &str) -> Option<Generation> {
        crate::sync::lock(&self.served)
            .get(name)
            .map(|s| s.generation.clone())
    }

    /// True when the controller of `name` runs (it has not stopped by itself).
    pub fn running(&self, name: &str) -> bool {
        crate::sync::lock(&self.served)
            .get(name)
            .is_some_and(|s| !s.task.is_finished())
    }

    /// How many resources the kind served for `name` has, in every
    /// namespace, once its watch listed them.
    pub fn resources(&self, name: &str) -> Option<u64> {
        crate::sync::lock(&self.served)
            .get(name)
            .and_then(|s| s.count.get())
    }

    /// The bytes of the definitions served, but for `name`'s.
    pub fn bytes_of_others(&self, name: &str) -> usize {
        crate::sync::lock(&self.served)
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(_, s)| s.generation.bytes)
            .sum()
    }

    /// The names and CRDs of the kinds served for other definitions.
    pub fn taken_by_others(&self, name: &str) -> Vec<Taken> {
        crate::sync::lock(&self.served)
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(other, s)| Taken {
                name: s.generation.kind.name().to_string(),
                crd: s.generation.crd_name(),
                by: format!("the KindDefinition {other}"),
            })
            .collect()
    }

    /// Serves `generation` for `name`: stops the controller of the
    /// generation before (waiting for its running reconciles), then
    /// starts one for this one.
    pub async fn serve(&self, name: &str, generation: Generation) {
        self.stop(name).await;
        let stop = self.shutdown.child_token();
        let kind = Kind::Declared(generation.kind.clone());
        let engine = self.engine.clone();
        let options = self.options.clone();
        let token = stop.clone();
        let definition = name.to_string();
        let number = generation.number;
        let count = Arc::new(Count::default());
        let counting = keep_count(
            self.engine.client().clone(),
            generation.kind.resource.clone(),
            definition.clone(),
            self.nudges.clone(),
            count.clone(),
        );
        let task = tokio::spawn(async move {
            tracing::info!(kind = %kind, definition, generation = number, "controller started");
            tokio::select! {
                () = kind.run(engine, &options, token.clone().cancelled_owned()) => {}
                () = counting => {}
            }
            if token.is_cancelled() {
                tracing::info!(kind = %kind, definition, "controller stopped");
            } else {
                tracing::error!(kind = %kind, definition, "controller stopped unexpectedly");
            }
        });
        let served = Served {
            generation,
            stop,
            task,
            count,
        };
        crate::sync::lock(&self.served).insert(name.to_string(), served);
    }

    /// Stops the controller of `name`, if one runs, and waits for it.
    pub async fn stop(&self, name: &str) {
        let served = crate::sync::lock(&self.served).remove(name);
        if let Some(served) = served {
            finish(served).await;
        }
    }

    /// Stops every controller and waits for them.
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *crate::sync::lock(&self.served));
        for served in all.into_values() {
            finish(served).await;
        }
    }
}

/// Keeps `count` of the resources of `kind` in every namespace (their
/// UIDs, from a metadata watch), and tells `nudges` the name `definition`
/// whenever it changes. Never returns.
async fn keep_count(
    client: kube::Client,
    kind: ApiResource,
    definition: String,
    nudges: mpsc::Sender<String>,
    count: Arc<Count>,
) {
    let api = kube::Api::<PartialObjectMeta<DynamicObject>>::all_with(client, &kind);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut uids: HashSet<String> = HashSet::new();
    let mut listing: HashSet<String> = HashSet::new();
    while let Some(event) = events.next().await {
        // Errors are retried by the watch, after a backoff.
        let Ok(event) = event else { continue };
        let changed = match event {
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
        if changed && count.get() != Some(uids.len() as u64) {
            count.set(uids.len());
            let _ = nudges.try_send(definition.clone());
        }
    }
    std::future::pending::<()>().await;
}

/// Cancels a controller and waits until its running reconciles finished.
async fn finish(mut served: Served) {
    tracing::debug!(
        kind = served.generation.kind.name(),
        "stopping the controller"
    );
    served.stop.cancel();
    let _ = (&mut served.task).await;
}
