//! The runtime: the one reconcile loop of everything the operator serves
//! (the Rust kinds, the declared kinds of folders and definitions, the
//! KindDefinitions themselves). Each kind is a [`Reconciler`] with a
//! watch of its resources, added and removed while the operator runs,
//! feeding one store and one queue, reconciled by one bounded set of
//! workers (kube-runtime's `applier`: its scheduler and runner). Adding
//! a kind costs a watch, not a controller.
//!
//! Each kind keeps its own reconciler: a new generation of a definition
//! replaces it, and its watch's first list brings every resource of the
//! kind to a reconcile with the new one. The runner never reconciles one
//! resource twice at once, so a reconcile of the generation before
//! finishes before one of the new starts.

mod count;
mod keyed;
mod reconciler;
mod served;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use kube::api::ApiResource;
use kube::runtime::controller::{Action, Config, applier};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) use count::Count;
pub(crate) use reconciler::Reconciler;
pub(crate) use watch::slim;

use keyed::Keyed;
use served::Served;

use crate::engine::reconcile::runtime::Engine;

/// How long a reconcile runs before the log says so.
const SLOW_RECONCILE: std::time::Duration = std::time::Duration::from_secs(30);

/// The runtime: every kind served, one store, one queue, one set of
/// workers.
pub(crate) struct Runtime {
    shared: Arc<Shared>,
    /// The queue's receiving end, until the workers run.
    queued: Mutex<Option<Requests>>,
}

/// Requests for a reconcile, as the workers receive them.
type Requests = mpsc::UnboundedReceiver<ObjectRef<Keyed>>;

/// Where requests for a reconcile go.
pub(super) struct Queue(mpsc::UnboundedSender<ObjectRef<Keyed>>);

/// What the workers and the watches share.
pub(super) struct Shared {
    engine: Arc<Engine>,
    writer: Mutex<reflector::store::Writer<Keyed>>,
    store: reflector::Store<Keyed>,
    queue: Queue,
    kinds: RwLock<HashMap<Arc<str>, Arc<ServedKind>>>,
}

/// One kind being served.
pub(super) struct ServedKind {
    kind: Arc<str>,
    reconciler: Arc<dyn Served>,
    stop: CancellationToken,
    /// The watch of its resources: it ends giving the keys it held.
    watch: Mutex<Option<JoinHandle<Held>>>,
    /// The watch counting them.
    counting: Mutex<Option<JoinHandle<()>>>,
    /// What else starts its reconciles.
    nudged: Mutex<Vec<JoinHandle<()>>>,
    in_flight: AtomicUsize,
    idle: Notify,
    count: Option<Arc<Count>>,
    /// Its turns, when it runs at most so many reconciles at once.
    turns: Option<Arc<Semaphore>>,
}

/// The keys of a kind's resources in the store.
type Held = std::collections::HashSet<ObjectRef<Keyed>>;

/// Called when the count of a kind's resources changes.
pub(crate) type OnCount = Arc<dyn Fn() + Send + Sync>;

/// A kind's resources counted in every namespace and shard: where they
/// are served, and what to call when the count changes.
pub(crate) struct Counted {
    /// The kind's resources.
    pub resource: ApiResource,
    /// Called on every change of the count.
    pub on_count: OnCount,
    /// The watch of the kind's resources sees all of them (no namespace,
    /// shard or share narrows it): it counts them, with no watch of its
    /// own.
    pub by_resource_watch: bool,
}

impl Runtime {
    /// A runtime serving no kind yet, on `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        let mut writer = reflector::store::Writer::new(());
        // Ready at once: every kind brings its resources itself.
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let store = writer.as_reader();
        let (tx, rx) = mpsc::unbounded();
        Self {
            shared: Arc::new(Shared {
                engine,
                writer: Mutex::new(writer),
                store,
                queue: Queue(tx),
                kinds: RwLock::default(),
            }),
            queued: Mutex::new(Some(rx)),
        }
    }

    /// The engine every kind is served on.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.shared.engine
    }

    /// Serves the kind `kind` with `reconciler`: a kind served already is
    /// replaced (its watches stopped, its running reconciles left to
    /// finish with its old reconciler). With `counted`, the kind's
    /// resources in every namespace and shard are counted too
    /// ([`Runtime::count`]).
    pub async fn serve<R: Reconciler>(&self, kind: &str, reconciler: R, counted: Option<Counted>) {
        let kind: Arc<str> = kind.into();
        self.stop_watches(&kind).await;
        let reconciler = Arc::new(reconciler);
        let served = Arc::new(ServedKind {
            kind: kind.clone(),
            reconciler: reconciler.clone(),
            stop: CancellationToken::new(),
            watch: Mutex::default(),
            counting: Mutex::default(),
            nudged: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            count: counted.as_ref().map(|_| Arc::new(Count::default())),
            turns: reconciler
                .at_once()
                .map(|n| Arc::new(Semaphore::new(n.max(1)))),
        });
        // Served before its watches start: a reconcile they ask for finds
        // its kind.
        self.shared.kinds_mut().insert(kind, served.clone());
        self.start_watches(&served, reconciler, counted);
    }

    /// Stops serving the kind `name`: its watches stop, its running
    /// reconciles finish, what waits is written ([`Reconciler::finish`])
    /// and its resources leave the store.
    pub async fn stop(&self, name: &str) {
        let served = self.shared.kinds_mut().remove(name);
        if let Some(served) = served {
            finish(&self.shared, &served).await;
            served.reconciler.stopped();
        }
    }

    /// How many resources the kind `name` has in every namespace, when it
    /// is counted and its count watch listed them.
    pub fn count(&self, name: &str) -> Option<u64> {
        let kinds = self.shared.kinds();
        kinds.get(name)?.count.as_ref()?.get()
    }

    /// True while the kind `name` is served and its watch runs.
    pub fn running(&self, name: &str) -> bool {
        let kinds = self.shared.kinds();
        kinds.get(name).is_some_and(|served| {
            crate::sync::lock(&served.watch)
                .as_ref()
                .is_some_and(|t| !t.is_finished())
        })
    }

    /// Runs the workers until `shutdown` resolves, then lets the running
    /// reconciles finish and stops every kind. Runs once: a second call
    /// returns at once.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) {
        let Some(queued) = crate::sync::lock(&self.queued).take() else {
            return;
        };
        let changed = owned_changes(self.shared.clone());
        let requests = futures::stream::select(queued, changed)
            .take_until(shutdown)
            .map(Ok::<_, std::convert::Infallible>);
        let config = Config::default().concurrency(self.shared.engine.settings.max_reconciles);
        let shared = self.shared.clone();
        applier(
            |obj, shared: Arc<Shared>| reconcile(obj, shared).boxed(),
            |_, _: &std::convert::Infallible, _| Action::await_change(),
            shared.clone(),
            shared.store.clone(),
            requests,
            config,
        )
        .for_each(|_| async {})
        .await;
        let all: Vec<Arc<ServedKind>> = self.shared.kinds_mut().drain().map(|(_, s)| s).collect();
        for served in all {
            finish(&self.shared, &served).await;
        }
    }

    /// Starts the watches of `served`: its resources', its nudges' and, if
    /// `counted` and its resources' watch does not count them, its count's.
    fn start_watches(
        &self,
        served: &ServedKind,
        reconciler: Arc<dyn Served>,
        counted: Option<Counted>,
    ) {
        let (kind, stop) = (&served.kind, &served.stop);
        let (counted, tally) = match (&served.count, counted) {
            (Some(count), Some(counted)) if counted.by_resource_watch => {
                let tally = count::Tally {
                    count: count.clone(),
                    on_count: counted.on_count,
                };
                (None, Some(tally))
            }
            (_, counted) => (counted, None),
        };
        let shared = self.shared.clone();
        let watching = reconciler
            .clone()
            .watch(shared, kind.clone(), stop.clone(), tally);
        *crate::sync::lock(&served.watch) = Some(tokio::spawn(watching));
        let nudged = (reconciler.nudges(&self.shared, kind).into_iter())
            .map(|nudges| {
                let shared = self.shared.clone();
                tokio::spawn(watch::nudged(shared, nudges, stop.clone()))
            })
            .collect();
        *crate::sync::lock(&served.nudged) = nudged;
        if let (Some(count), Some(counted)) = (&served.count, counted) {
            let client = self.shared.engine.client.clone();
            let counting = count::count(client, counted, count.clone(), stop.clone());
            *crate::sync::lock(&served.counting) = Some(tokio::spawn(counting));
        }
    }

    /// Stops the watches of the kind `kind` and takes its resources out of
    /// the store (a new generation's watch brings them back).
    async fn stop_watches(&self, kind: &str) {
        let served = self.shared.kinds().get(kind).cloned();
        if let Some(served) = served {
            for key in stop_tasks(&served).await {
                self.shared.drop_key(&key);
            }
        }
    }
}

impl Shared {
    fn kinds(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Arc<str>, Arc<ServedKind>>> {
        self.kinds
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn kinds_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Arc<str>, Arc<ServedKind>>> {
        self.kinds
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `keyed` in the store (replacing what it held under its key).
    fn hold(&self, keyed: Keyed) {
        crate::sync::lock(&self.writer).apply_watcher_event(&watcher::Event::Apply(keyed));
    }

    /// Drops the resource under `key` from the store.
    fn drop_key(&self, key: &ObjectRef<Keyed>) {
        if let Some(held) = self.store.get(key) {
            let gone = (*held).clone();
            crate::sync::lock(&self.writer).apply_watcher_event(&watcher::Event::Delete(gone));
        }
    }
}

/// Stops a kind's watches, waits until they ended; the keys its resource
/// watch held.
async fn stop_tasks(served: &ServedKind) -> Held {
    served.stop.cancel();
    let nudged = std::mem::take(&mut *crate::sync::lock(&served.nudged));
    for watch in nudged {
        let _ = watch.await;
    }
    let counting = crate::sync::lock(&served.counting).take();
    if let Some(counting) = counting {
        let _ = counting.await;
    }
    let watching = crate::sync::lock(&served.watch).take();
    match watching {
        Some(watching) => watching.await.unwrap_or_default(),
        None => Held::default(),
    }
}

/// Stops the kind for good: its watches, then, once none of its
/// reconciles runs, what waits written and its resources taken out of
/// the store.
async fn finish(shared: &Shared, served: &ServedKind) {
    let held = stop_tasks(served).await;
    loop {
        let idle = served.idle.notified();
        if served.in_flight.load(Ordering::Acquire) == 0 {
            break;
        }
        idle.await;
    }
    let resources = held
        .iter()
        .filter_map(|key| shared.store.get(key))
        .map(|k| (*k).clone());
    served.reconciler.clone().finish(resources.collect()).await;
    for key in &held {
        shared.drop_key(key);
    }
}

/// One reconcile: the resource's kind's, with its reconciler; a kind no
/// longer served is skipped.
async fn reconcile(
    obj: Arc<Keyed>,
    shared: Arc<Shared>,
) -> Result<Action, std::convert::Infallible> {
    let served = shared.kinds().get(&obj.kind).cloned();
    let Some(served) = served else {
        return Ok(Action::await_change());
    };
    served.in_flight.fetch_add(1, Ordering::AcqRel);
    // Waiting for a turn is not running: not said as slow.
    let _turn = match &served.turns {
        Some(turns) => turns.clone().acquire_owned().await.ok(),
        None => None,
    };
    let action = said_if_slow(served.reconciler.clone().reconcile(&obj), &obj).await;
    if served.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        served.idle.notify_waiters();
    }
    Ok(action)
}

/// Awaits `reconciling`, the reconcile of `obj`; one still running after
/// [`SLOW_RECONCILE`] is said in the log (once), so that a reconcile that
/// waits for good shows where.
async fn said_if_slow(reconciling: impl Future<Output = Action>, obj: &Keyed) -> Action {
    let mut reconciling = std::pin::pin!(reconciling);
    tokio::select! {
        action = &mut reconciling => return action,
        () = tokio::time::sleep(SLOW_RECONCILE) => {}
    }
    tracing::warn!(
        kind = %obj.kind,
        object = %obj.key(),
        seconds = SLOW_RECONCILE.as_secs(),
        "a reconcile is still running"
    );
    reconciling.await
}

/// The resources whose owned objects changed (owner annotations
/// `Kind.group/namespace/name` from the engine's watches), of any kind
/// served now.
fn owned_changes(
    shared: Arc<Shared>,
) -> impl futures::Stream<Item = ObjectRef<Keyed>> + Send + 'static {
    shared.engine.objects.changes().filter_map(move |owner| {
        let kinds = shared.kinds();
        let key = kinds
            .values()
            .find_map(|served| served.reconciler.owner(&served.kind, &owner));
        std::future::ready(key)
    })
}
