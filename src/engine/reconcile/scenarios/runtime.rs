//! The one runtime, against the mocked API server: a kind a handler plans
//! for (the Widget, a dynamic kind) served whole, and two plug-ins beside
//! it, one of a Rust type (ConfigMaps) and one of `DynamicObject` (as a
//! KindDefinition is), each reconciled with its own type, nudged, and
//! given the resources it held when it stops.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{CONFIG_MAPS, NAMESPACE, Widgets, World, ready, widget_resource};
use crate::engine::contract::{Object, Watching};
use crate::engine::model::status::{ConditionStatus, Reason};
use crate::engine::reconcile::serve::{Reconciler, Runtime};

/// How long a scenario waits for what it expects.
const PATIENCE: Duration = Duration::from_secs(20);

/// A plug-in that tells `seen` the name of every resource it reconciles,
/// asks for reconciles on `nudges`, and tells `finished` what it held.
struct Recorder<K: Object> {
    api: kube::Api<K>,
    seen: mpsc::UnboundedSender<String>,
    nudges: Mutex<Option<BoxStream<'static, ObjectRef<K>>>>,
    finished: mpsc::UnboundedSender<Vec<String>>,
}

impl<K: Object> Reconciler for Recorder<K> {
    type Resource = K;

    fn watched(&self) -> (kube::Api<K>, watcher::Config) {
        (self.api.clone(), watcher::Config::default())
    }

    async fn reconcile(&self, resource: Arc<K>) -> Action {
        let _ = self.seen.send(resource.name_any());
        Action::await_change()
    }

    fn nudges(&self, _: Watching<K>) -> Vec<BoxStream<'static, ObjectRef<K>>> {
        crate::sync::lock(&self.nudges).take().into_iter().collect()
    }

    async fn finish(&self, resources: Vec<Arc<K>>) {
        let mut names: Vec<String> = resources.iter().map(|r| r.name_any()).collect();
        names.sort();
        let _ = self.finished.send(names);
    }
}

/// A recorder of `api`'s resources, with the ends a scenario holds: the
/// names reconciled, where to nudge, and the names held at the stop.
struct Recorded<K: Object> {
    seen: mpsc::UnboundedReceiver<String>,
    nudge: mpsc::UnboundedSender<ObjectRef<K>>,
    finished: mpsc::UnboundedReceiver<Vec<String>>,
}

fn recorder<K: Object>(api: kube::Api<K>) -> (Recorder<K>, Recorded<K>) {
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let (nudge, nudged) = mpsc::unbounded_channel();
    let (finished_tx, finished) = mpsc::unbounded_channel();
    let nudges = tokio_stream_of(nudged);
    let recorder = Recorder {
        api,
        seen: seen_tx,
        nudges: Mutex::new(Some(nudges)),
        finished: finished_tx,
    };
    let recorded = Recorded {
        seen,
        nudge,
        finished,
    };
    (recorder, recorded)
}

fn tokio_stream_of<T: Send + 'static>(rx: mpsc::UnboundedReceiver<T>) -> BoxStream<'static, T> {
    futures::stream::unfold(rx, |mut rx| async move { Some((rx.recv().await?, rx)) }).boxed()
}

/// The next `count` names reconciled, sorted.
async fn next_seen(seen: &mut mpsc::UnboundedReceiver<String>, count: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..count {
        let name = tokio::time::timeout(PATIENCE, seen.recv()).await;
        names.push(
            name.expect("a reconcile in time")
                .expect("the recorder lives"),
        );
    }
    names.sort();
    names
}

/// Waits until `holds` (polled), failing the scenario after [`PATIENCE`].
async fn eventually(what: &str, holds: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !holds() {
        assert!(tokio::time::Instant::now() < deadline, "{what} in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Puts an empty ConfigMap `name` in the mocked API server.
fn put_config_map(world: &World, name: &str) {
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE}, "data": {}});
    world.api.put(&format!("{CONFIG_MAPS}/{name}"), config_map);
}

/// Runs `runtime` until the token it returns is cancelled.
fn run(runtime: &Arc<Runtime>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let (running, stop) = (runtime.clone(), token.clone());
    let task = tokio::spawn(async move { running.run(stop.cancelled_owned()).await });
    (token, task)
}

#[tokio::test]
async fn the_runtime_serves_a_handlers_kind_to_its_status() {
    let world = World::new().await;
    world.create("web", &["web-a", "web-b"], json!({"greeting": "hello"}));
    let runtime = Arc::new(Runtime::new(world.ctx.engine.clone()));
    runtime.serve_kind(Widgets::new(), None).await;
    let (stop, task) = run(&runtime);
    let has_status = || world.widget("web").is_some_and(|w| !w["status"].is_null());
    eventually("the widget is Ready", || {
        has_status() && ready(&world.status("web")).0 == ConditionStatus::True
    })
    .await;
    assert_eq!(
        ready(&world.status("web")),
        (ConditionStatus::True, Reason::Applied)
    );
    assert_eq!(
        world.config_map("web-a").unwrap()["data"]["greeting"],
        "hello"
    );
    assert!(world.config_map("web-b").is_some());
    let finalizers = &world.widget("web").unwrap()["metadata"]["finalizers"];
    assert_eq!(finalizers, &json!([super::FINALIZER]));
    stop.cancel();
    task.await.expect("the runtime stops");
}

#[tokio::test]
async fn a_typed_and_a_dynamic_kind_share_one_runtime_each_with_its_own_type() {
    let world = World::new().await;
    let client = world.ctx.engine.client.clone();
    for name in ["red", "blue"] {
        put_config_map(&world, name);
    }
    world.create("web", &[], json!({}));
    let widgets = widget_resource();
    let (typed, mut config_maps) = recorder(kube::Api::<ConfigMap>::namespaced(
        client.clone(),
        NAMESPACE,
    ));
    let dynamic_api = kube::Api::<DynamicObject>::namespaced_with(client, NAMESPACE, &widgets);
    let (dynamic, mut definitions) = recorder(dynamic_api);
    let web = ObjectRef::new_with("web", widgets.clone()).within(NAMESPACE);
    let runtime = Arc::new(Runtime::new(world.ctx.engine.clone()));
    runtime.serve("configmaps", typed, None).await;
    runtime.serve("widgets", dynamic, None).await;
    let (stop, task) = run(&runtime);
    // Each kind's first list brings its resources to its own reconciler.
    assert_eq!(next_seen(&mut config_maps.seen, 2).await, ["blue", "red"]);
    assert_eq!(next_seen(&mut definitions.seen, 1).await, ["web"]);
    // A nudge of one resource of each kind, each to its own reconciler.
    let red = ObjectRef::<ConfigMap>::new("red").within(NAMESPACE);
    config_maps.nudge.send(red).expect("nudged");
    assert_eq!(next_seen(&mut config_maps.seen, 1).await, ["red"]);
    definitions.nudge.send(web.clone()).expect("nudged");
    assert_eq!(next_seen(&mut definitions.seen, 1).await, ["web"]);
    // A kind stopped is given what it held; the other goes on.
    runtime.stop("configmaps").await;
    let held = tokio::time::timeout(PATIENCE, config_maps.finished.recv()).await;
    assert_eq!(
        held.expect("finished in time"),
        Some(vec!["blue".into(), "red".into()])
    );
    definitions.nudge.send(web.clone()).expect("nudged");
    assert_eq!(next_seen(&mut definitions.seen, 1).await, ["web"]);
    assert!(!runtime.running("configmaps") && runtime.running("widgets"));
    stop.cancel();
    task.await.expect("the runtime stops");
    let held = tokio::time::timeout(PATIENCE, definitions.finished.recv()).await;
    assert_eq!(
        held.expect("finished at the stop"),
        Some(vec!["web".into()])
    );
}

#[tokio::test]
async fn a_kind_watched_whole_is_counted_by_its_own_watch() {
    // No namespace, shard or share narrows the watch (the scenario's
    // settings): the resources' watch counts them, with no watch of its own.
    let world = World::new().await;
    world.create("web", &[], json!({}));
    world.create("api", &[], json!({}));
    let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let on_count = {
        let told = told.clone();
        Arc::new(move || {
            told.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let runtime = Arc::new(Runtime::new(world.ctx.engine.clone()));
    let widgets = Widgets::new();
    runtime.serve_kind(widgets, Some(on_count)).await;
    let (stop, task) = run(&runtime);
    eventually("both widgets counted", || {
        runtime.count("widget") == Some(2)
    })
    .await;
    assert!(told.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    stop.cancel();
    task.await.expect("the runtime stops");
}

/// A recorder whose kind is served slowly: starting its watches takes
/// until its watch has seen a resource, and a while more, so that a
/// reconcile asked for by that first event runs while the serving has not
/// yet returned.
struct Slow {
    recorder: Recorder<DynamicObject>,
    seen_first: std::sync::mpsc::SyncSender<()>,
    waited: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Reconciler for Slow {
    type Resource = DynamicObject;

    fn watched(&self) -> (kube::Api<DynamicObject>, watcher::Config) {
        self.recorder.watched()
    }

    fn see(&self, _event: &mut watcher::Event<DynamicObject>) -> bool {
        let _ = self.seen_first.try_send(());
        true
    }

    async fn reconcile(&self, resource: Arc<DynamicObject>) -> Action {
        self.recorder.reconcile(resource).await
    }

    fn nudges(
        &self,
        _: Watching<DynamicObject>,
    ) -> Vec<BoxStream<'static, ObjectRef<DynamicObject>>> {
        // Called while the runtime starts the kind's watches, on the
        // thread serving it (not one of the runtime's workers).
        let seen = crate::sync::lock(&self.waited).recv_timeout(PATIENCE);
        assert!(seen.is_ok(), "the watch saw a resource in time");
        std::thread::sleep(Duration::from_millis(500));
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_served_on_a_running_runtime_loses_no_first_reconcile() {
    // The kind must be known to the runtime before its watch starts: a
    // reconcile the watch's first list asks for, run before the kind was
    // known, was dropped, and the resource waited for its next change.
    let world = World::new().await;
    world.create("web", &[], json!({}));
    let widgets = widget_resource();
    let client = world.ctx.engine.client.clone();
    let api = kube::Api::<DynamicObject>::namespaced_with(client, NAMESPACE, &widgets);
    let (recorder, mut recorded) = recorder(api);
    let (seen_first, waited) = std::sync::mpsc::sync_channel(1);
    let slow = Slow {
        recorder,
        seen_first,
        waited: Mutex::new(waited),
    };
    let runtime = Arc::new(Runtime::new(world.ctx.engine.clone()));
    let (stop, task) = run(&runtime);
    // Served from a thread of its own, so that its wait blocks no worker:
    // the watch and the reconcile it asks for run meanwhile.
    let (serving, handle) = (runtime.clone(), tokio::runtime::Handle::current());
    let served = std::thread::spawn(move || handle.block_on(serving.serve("widgets", slow, None)));
    assert_eq!(next_seen(&mut recorded.seen, 1).await, ["web"]);
    served.join().expect("served");
    stop.cancel();
    task.await.expect("the runtime stops");
}

/// A plug-in whose reconciles take a while, at most `at_once` of them at a
/// time: it keeps the most it saw running together.
struct Crowded {
    recorder: Recorder<ConfigMap>,
    at_once: usize,
    running: std::sync::atomic::AtomicUsize,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Reconciler for Crowded {
    type Resource = ConfigMap;

    fn watched(&self) -> (kube::Api<ConfigMap>, watcher::Config) {
        self.recorder.watched()
    }

    fn at_once(&self) -> Option<usize> {
        Some(self.at_once)
    }

    async fn reconcile(&self, resource: Arc<ConfigMap>) -> Action {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.running.fetch_sub(1, SeqCst);
        self.recorder.reconcile(resource).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_runs_no_more_reconciles_at_once_than_it_asks() {
    let world = World::new().await;
    let names: Vec<String> = (0..6).map(|i| format!("cm-{i}")).collect();
    for name in &names {
        put_config_map(&world, name);
    }
    let client = world.ctx.engine.client.clone();
    let (recorder, mut recorded) = recorder(kube::Api::<ConfigMap>::namespaced(client, NAMESPACE));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let crowded = Crowded {
        recorder,
        at_once: 2,
        running: Default::default(),
        most: most.clone(),
    };
    let runtime = Arc::new(Runtime::new(world.ctx.engine.clone()));
    runtime.serve("configmaps", crowded, None).await;
    let (stop, task) = run(&runtime);
    // The first list asks for all six at once (the runtime's own limit is
    // off in these scenarios); they run two at a time.
    assert_eq!(next_seen(&mut recorded.seen, 6).await, names);
    assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    stop.cancel();
    task.await.expect("the runtime stops");
}
