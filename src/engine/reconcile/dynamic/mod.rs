//! One controller for every declared kind, a kind folder's or a
//! definition's: a watch per kind, added and removed while the operator
//! runs, feeding one store and one queue, reconciled by one bounded set of
//! workers (kube-runtime's `applier`: its scheduler and runner, the same
//! that serve a Rust kind). Adding a kind costs a watch, not a controller.
//!
//! Each kind keeps its own context (its handler, its triggers): a new
//! generation of a definition replaces it, and its watch's first list
//! brings every resource of the kind to a reconcile with the new handler.
//! The runner never reconciles one resource twice at once, so a reconcile
//! of the generation before finishes before one of the new starts.

mod keyed;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt};
use kube::ResourceExt;
use kube::api::ApiResource;
use kube::runtime::controller::{Action, Config, applier};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) use watch::Count;

use keyed::Keyed;

use super::context::Context;
use super::controller::{error_policy, reconcile_one};
use super::status_writer;
use super::triggers::Triggers;
use crate::engine::contract::Handler;
use crate::engine::reconcile::runtime::Engine;

/// A handler whose kinds are known at run time (an [`ApiResource`] each):
/// the declared kinds'.
pub(crate) trait DynamicHandler:
    Handler<Resource: kube::Resource<DynamicType = ApiResource>>
{
}

impl<H> DynamicHandler for H
where
    H: Handler,
    H::Resource: kube::Resource<DynamicType = ApiResource>,
{
}

/// The dynamic controller of the declared kinds, all handled by `H`.
pub(crate) struct Dynamic<H: DynamicHandler> {
    shared: Arc<Shared<H>>,
    /// The queue's receiving end, until the workers run.
    queued: Mutex<Option<Requests<H::Resource>>>,
}

/// Requests for a reconcile, as the workers receive them.
type Requests<K> = mpsc::UnboundedReceiver<ObjectRef<Keyed<K>>>;

/// Where requests for a reconcile go.
pub(super) struct Queue<K>(mpsc::UnboundedSender<ObjectRef<Keyed<K>>>);

/// What the workers and the watches share.
pub(super) struct Shared<H: DynamicHandler> {
    engine: Arc<Engine>,
    writer: Mutex<reflector::store::Writer<Keyed<H::Resource>>>,
    store: reflector::Store<Keyed<H::Resource>>,
    queue: Queue<H::Resource>,
    kinds: RwLock<HashMap<Arc<str>, Arc<ServedKind<H>>>>,
}

/// One kind being served.
pub(super) struct ServedKind<H: DynamicHandler> {
    kind: Arc<str>,
    ctx: Arc<Context<H>>,
    stop: CancellationToken,
    /// The watch of its resources: it ends giving the keys it held.
    watch: Mutex<Option<JoinHandle<Held<H::Resource>>>>,
    /// The watch counting them.
    counting: Mutex<Option<JoinHandle<()>>>,
    /// The watches of the objects they read without owning them.
    references: Mutex<Vec<JoinHandle<()>>>,
    in_flight: AtomicUsize,
    idle: Notify,
    count: Option<Arc<Count>>,
}

/// The keys of a kind's resources in the store.
type Held<K> = std::collections::HashSet<ObjectRef<Keyed<K>>>;

/// Called when the count of a kind's resources changes.
pub(crate) type OnCount = Arc<dyn Fn() + Send + Sync>;

impl<H: DynamicHandler> Dynamic<H> {
    /// A controller serving no kind yet, on `engine`.
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

    /// Serves the kind of `handler` (by its name): a kind served already
    /// is replaced (its watches stopped, its running reconciles left to
    /// finish under its old handler). With `on_count`, the kind's
    /// resources in every namespace and shard are counted too
    /// ([`Dynamic::count`]), and `on_count` called when the count changes.
    pub async fn serve(&self, handler: H, on_count: Option<OnCount>) {
        let kind: Arc<str> = handler.info().name.as_str().into();
        self.stop_watches(&kind).await;
        let engine = self.shared.engine.clone();
        // Its CRD is new or changed: what kubectl and the engine cached of
        // its group may say another scope or other versions.
        engine.forget_discovery(&handler.info().dyn_type.group);
        let served = Arc::new(ServedKind {
            kind: kind.clone(),
            ctx: Arc::new(Context {
                engine: engine.clone(),
                handler: Arc::new(handler),
                triggers: Arc::new(Triggers::sharing(engine.settings.share.clone())),
            }),
            stop: CancellationToken::new(),
            watch: Mutex::default(),
            counting: Mutex::default(),
            references: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            count: on_count.as_ref().map(|_| Arc::new(Count::default())),
        });
        let watching = tokio::spawn(watch::resources(
            self.shared.clone(),
            served.clone(),
            served.stop.clone(),
        ));
        *crate::sync::lock(&served.watch) = Some(watching);
        let references = (served.ctx.handler.referenced().into_iter())
            .map(|resource| {
                tokio::spawn(watch::references(
                    self.shared.clone(),
                    served.clone(),
                    resource,
                    served.stop.clone(),
                ))
            })
            .collect();
        *crate::sync::lock(&served.references) = references;
        if let (Some(count), Some(on_count)) = (&served.count, on_count) {
            let counting = tokio::spawn(watch::count(
                engine.client.clone(),
                served.ctx.handler.info().dyn_type.clone(),
                count.clone(),
                on_count,
                served.stop.clone(),
            ));
            *crate::sync::lock(&served.counting) = Some(counting);
        }
        self.shared.kinds_mut().insert(kind, served);
    }

    /// Stops serving the kind `name`: its watches stop (those of its
    /// objects that other resources own too), its resources leave the
    /// store, its running reconciles finish and the statuses parked for it
    /// are written.
    pub async fn stop(&self, name: &str) {
        let served = self.shared.kinds_mut().remove(name);
        if let Some(served) = served {
            finish(&self.shared, &served).await;
            (self.shared.engine).kind_stopped(&served.ctx.handler.info().dyn_type);
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
    /// reconciles finish, stops every kind and writes the statuses parked
    /// for them. Runs once: a second call returns at once.
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
            |obj, shared: Arc<Shared<H>>| reconcile(obj, shared).boxed(),
            |_, _: &std::convert::Infallible, _| Action::await_change(),
            shared.clone(),
            shared.store.clone(),
            requests,
            config,
        )
        .for_each(|_| async {})
        .await;
        let all: Vec<Arc<ServedKind<H>>> =
            self.shared.kinds_mut().drain().map(|(_, s)| s).collect();
        for served in all {
            finish(&self.shared, &served).await;
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

impl<H: DynamicHandler> Shared<H> {
    fn kinds(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Arc<str>, Arc<ServedKind<H>>>> {
        self.kinds
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn kinds_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Arc<str>, Arc<ServedKind<H>>>> {
        self.kinds
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `keyed` in the store (replacing what it held under its key).
    fn hold(&self, keyed: Keyed<H::Resource>) {
        crate::sync::lock(&self.writer).apply_watcher_event(&watcher::Event::Apply(keyed));
    }

    /// Drops the resource under `key` from the store.
    fn drop_key(&self, key: &ObjectRef<Keyed<H::Resource>>) {
        if let Some(held) = self.store.get(key) {
            let gone = (*held).clone();
            crate::sync::lock(&self.writer).apply_watcher_event(&watcher::Event::Delete(gone));
        }
    }
}

/// Stops a kind's watches, waits until they ended; the keys its resource
/// watch held.
async fn stop_tasks<H: DynamicHandler>(served: &ServedKind<H>) -> Held<H::Resource> {
    served.stop.cancel();
    let references = std::mem::take(&mut *crate::sync::lock(&served.references));
    for watch in references {
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
/// reconciles runs, the statuses parked for it written and its resources
/// taken out of the store.
async fn finish<H: DynamicHandler>(shared: &Shared<H>, served: &ServedKind<H>) {
    let held = stop_tasks(served).await;
    loop {
        let idle = served.idle.notified();
        if served.in_flight.load(Ordering::Acquire) == 0 {
            break;
        }
        idle.await;
    }
    write_parked(shared, served).await;
    for key in &held {
        shared.drop_key(key);
    }
}

/// One reconcile: the resource's kind's, with its context; a kind no
/// longer served is skipped.
async fn reconcile<H: DynamicHandler>(
    obj: Arc<Keyed<H::Resource>>,
    shared: Arc<Shared<H>>,
) -> Result<Action, std::convert::Infallible> {
    let served = shared.kinds().get(&obj.kind).cloned();
    let Some(served) = served else {
        return Ok(Action::await_change());
    };
    served.in_flight.fetch_add(1, Ordering::AcqRel);
    let ctx = served.ctx.clone();
    let object = obj.object.clone();
    let action = match reconcile_one::<H>(object.clone(), ctx.clone()).await {
        Ok(action) => action,
        Err(e) => error_policy::<H>(object, &e, ctx),
    };
    if served.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        served.idle.notify_waiters();
    }
    Ok(action)
}

/// The resources whose owned objects changed (owner annotations
/// `Kind.group/namespace/name` from the engine's watches), of any kind
/// served now.
fn owned_changes<H: DynamicHandler>(
    shared: Arc<Shared<H>>,
) -> impl futures::Stream<Item = ObjectRef<Keyed<H::Resource>>> + Send + 'static {
    shared.engine.objects.changes().filter_map(move |owner| {
        let key = owner_key(&shared, &owner);
        async move { key }
    })
}

/// The key of the resource an owner annotation names, if its kind is served.
fn owner_key<H: DynamicHandler>(
    shared: &Shared<H>,
    annotation: &str,
) -> Option<ObjectRef<Keyed<H::Resource>>> {
    let kinds = shared.kinds();
    kinds.values().find_map(|served| {
        let resource = &served.ctx.handler.info().dyn_type;
        let (kind, group) = (&resource.kind, &resource.group);
        let rest = match group.as_str() {
            "" => annotation.strip_prefix(kind.as_str())?.strip_prefix('/')?,
            _ => annotation
                .strip_prefix(kind.as_str())?
                .strip_prefix('.')?
                .strip_prefix(group.as_str())?
                .strip_prefix('/')?,
        };
        Some(match rest.split_once('/') {
            Some((namespace, name)) => {
                keyed::key::<H::Resource>(&served.kind, Some(namespace), name)
            }
            None => keyed::key::<H::Resource>(&served.kind, None, rest),
        })
    })
}

/// Writes the statuses still parked for the kind as they stand, once its
/// reconciles are over: a stop loses no outcome.
async fn write_parked<H: DynamicHandler>(shared: &Shared<H>, served: &ServedKind<H>) {
    let ctx = &served.ctx;
    for (uid, parked) in ctx.engine.parked.take_of(&ctx.handler.info().name) {
        let key =
            keyed::key::<H::Resource>(&served.kind, parked.namespace.as_deref(), &parked.name);
        let Some(held) = shared.store.get(&key) else {
            continue;
        };
        if held.object.uid().as_deref() != Some(uid.as_str()) {
            continue;
        }
        // Given up meanwhile (automatic sharding): its new owner writes.
        let Some(_entered) = ctx.engine.enter(Some(&uid)) else {
            continue;
        };
        let status = parked.status.value();
        if let Err(e) = status_writer::write(&ctx.engine, &*ctx.handler, &held.object, status).await
        {
            tracing::warn!(object = %ctx.key(&held.object), error = %crate::error_text::kube(&e), "could not write a parked status");
        }
    }
}
