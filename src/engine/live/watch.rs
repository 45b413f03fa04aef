//! The live state of the objects resources own, kept by watches: one per
//! kind of object that appears in some inventory (and has a state worth
//! watching), selected by the owner label, each object cut down to what
//! health rules and status fields read. A change to a watched object wakes
//! its owner's controller; reading the state costs no API call.
//!
//! A watch lives while its kind is served: it stops when the operator
//! stops serving the kind ([`ObjectCache::stop_kind`]) or when the API
//! server no longer serves it (its CRD deleted), and starts again the next
//! time a resource needs it. A watch that fails otherwise retries with
//! backoff and says so once per distinct failure.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::ApiResource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::compact::CompactObject;
use super::ownership::{ApiKind, Discovery};
use super::waiters::Waiters;
use crate::engine::model::inventory::{ObjectId, Owner};
use crate::error_text;

/// How long the first list of a new watch may take before reads go on
/// without it.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Changes queued for slow controllers.
const CHANGES: usize = 4096;
/// Deleted objects remembered per watch.
const DELETED_KEPT: usize = 10_000;
/// Parallel reads of fresh states.
const CONCURRENCY: usize = 16;
/// How long a look right after an apply waits for the watch to show an
/// object the apply created before reading it from the API server.
const ARRIVAL_WAIT: Duration = Duration::from_secs(2);

/// True when objects of `id`'s kind need no watch to be judged.
pub(crate) fn always_current(id: &ObjectId) -> bool {
    ObjectId::always_current_kind(id.group(), &id.kind)
}

/// What is known of one object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// Its state (metadata, `spec.replicas`, `spec.type`, `status`).
    Object(Value),
    /// It does not exist (and was not seen deleted).
    Absent,
    /// The watch saw it deleted, and it has not come back.
    Deleted,
    /// It cannot be read: why.
    Unreadable(String),
}

/// An object's place: its namespace (`None` when cluster-scoped) and name.
type Place = (Option<String>, String);

/// One watch: its store, its last error, and the objects it saw deleted.
#[derive(Clone)]
struct Watch {
    store: Store<CompactObject>,
    resource: ApiResource,
    error: Arc<Mutex<Option<String>>>,
    deleted: Arc<Mutex<HashSet<Place>>>,
    started: tokio::time::Instant,
    /// Turns true once the first list is in the store. (The store's own
    /// `wait_until_ready` wakes only the last of several waiters.)
    listed: tokio::sync::watch::Receiver<bool>,
    /// Whoever waits for an object to arrive, woken by its events.
    arrivals: Arc<Waiters<Place>>,
    /// Stops the watch.
    stop: CancellationToken,
}

impl Watch {
    fn error(&self) -> Option<String> {
        crate::sync::lock(&self.error).clone()
    }

    /// Waits until the first list is in the store, at most until
    /// [`READY_TIMEOUT`] after the watch started: every reader waits,
    /// not only the one that started it, so none judges an object absent
    /// from a store still listing.
    async fn listed(&self) {
        if self.is_listed() {
            return;
        }
        let deadline = self.started + READY_TIMEOUT;
        let mut listed = self.listed.clone();
        let _ = tokio::time::timeout_at(deadline, listed.wait_for(|done| *done)).await;
    }

    /// True once the first list is in the store.
    fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// The state of `id` once the store holds it, waiting up to
    /// [`ARRIVAL_WAIT`] for it to arrive; `None` if it did not, or if the
    /// watch cannot say.
    async fn arrival(&self, id: &ObjectId, namespaced: bool) -> Option<Seen> {
        let deadline = tokio::time::Instant::now() + ARRIVAL_WAIT;
        let expected = Waiters::wait_for(&self.arrivals, self.place(id, namespaced));
        loop {
            // Registered before looking, so an arrival in between still wakes it.
            let arrived = expected.notify().notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            match self.seen(id, namespaced) {
                seen @ Seen::Object(_) => return Some(seen),
                Seen::Unreadable(_) => return None,
                Seen::Absent | Seen::Deleted => {}
            }
            tokio::time::timeout_at(deadline, arrived).await.ok()?;
        }
    }
}

/// One watch: a kind of object (group, version, kind), in one namespace
/// when the operator watches only one (`None`: every namespace).
type WatchKey = (String, String, String, Option<String>);

/// The watches running, by kind (and namespace).
type Watches = Arc<Mutex<HashMap<WatchKey, Watch>>>;

/// The watches, started on first use.
pub(crate) struct ObjectCache {
    client: Client,
    namespace: Option<String>,
    /// How the API serves each kind (shared with the engine).
    discovery: Discovery,
    watches: Watches,
    /// Owner annotations of objects that changed, for every controller.
    changes: broadcast::Sender<String>,
}

impl ObjectCache {
    /// A cache for an operator watching `namespace` (all when `None`),
    /// finding kinds with `discovery`.
    pub fn new(client: Client, namespace: Option<String>, discovery: Discovery) -> Self {
        Self {
            client,
            namespace,
            discovery,
            watches: Arc::default(),
            changes: broadcast::channel(CHANGES).0,
        }
    }

    /// Stops the watches of the kind `kind` of the API group `group` (the
    /// operator stopped serving it): the next resource that needs them
    /// starts them again.
    pub fn stop_kind(&self, group: &str, kind: &str) {
        let mut watches = crate::sync::lock(&self.watches);
        watches.retain(|(g, _, k, _), watch| {
            let stopping = g == group && k == kind;
            if stopping {
                watch.stop.cancel();
            }
            !stopping
        });
    }

    /// Owner annotations (`Kind.group/ns/name`) of objects that changed,
    /// as a stream that ends with the cache. Changes missed by a slow
    /// reader are skipped: the next resync catches them.
    pub fn changes(&self) -> impl futures::Stream<Item = String> + Send + use<> {
        stream::unfold(self.changes.subscribe(), |mut changes| async move {
            loop {
                match changes.recv().await {
                    Ok(owner) => return Some((owner, changes)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// What the watches know of each of `ids` whose kind is watched.
    pub async fn states(&self, ids: &BTreeSet<ObjectId>) -> BTreeMap<ObjectId, Seen> {
        let mut found = BTreeMap::new();
        for id in ids.iter().filter(|id| !always_current(id)) {
            let seen = match self.discovery.resolve(&self.client, id).await {
                Ok(served) => self.watch(id, &served).await.seen(id, served.namespaced),
                Err(e) => Seen::Unreadable(crate::error_text::kube(&e)),
            };
            found.insert(id.clone(), seen);
        }
        found
    }

    /// Each of `ids` whose kind is watched, right after an apply: those it
    /// `created` as soon as the watch shows them (any state the watch has
    /// of them is newer than the apply's), the others read from the API
    /// server now (the watch may not have caught up with the apply yet).
    pub async fn after_apply(
        &self,
        ids: &BTreeSet<ObjectId>,
        created: &BTreeSet<ObjectId>,
    ) -> BTreeMap<ObjectId, Seen> {
        let watched: Vec<ObjectId> = ids
            .iter()
            .filter(|id| !always_current(id))
            .cloned()
            .collect();
        stream::iter(watched)
            .map(|id| {
                let new = created.contains(&id);
                self.read(id, new)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await
    }

    async fn read(&self, id: ObjectId, new: bool) -> (ObjectId, Seen) {
        let seen = self.read_one(&id, new).await;
        (id, seen)
    }

    async fn read_one(&self, id: &ObjectId, new: bool) -> Seen {
        let served = match self.discovery.resolve(&self.client, id).await {
            Ok(served) => served,
            Err(e) => return Seen::Unreadable(crate::error_text::kube(&e)),
        };
        // Started now, the watch wakes the owner when the object changes.
        let watch = self.watch(id, &served).await;
        if new && let Some(seen) = watch.arrival(id, served.namespaced).await {
            return seen;
        }
        let api: Api<CompactObject> = match (&id.namespace, served.namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &served.resource),
            _ => Api::all_with(self.client.clone(), &served.resource),
        };
        match api.get_opt(&id.name).await {
            Ok(Some(object)) => Seen::Object(object.to_value()),
            Ok(None) => Seen::Absent,
            Err(e) => Seen::Unreadable(crate::error_text::kube(&e)),
        }
    }

    /// Starts the watch of `id`'s kind unless it runs, without waiting for
    /// its first list: an operator starting with many resources lists
    /// their objects while it lists them.
    pub async fn prime(&self, id: &ObjectId) {
        if always_current(id) {
            return;
        }
        if let Ok(served) = self.discovery.resolve(&self.client, id).await {
            self.running(id, &served);
        }
    }

    /// The watch of `id`'s kind, started (and given a moment to list) if it
    /// was not yet.
    async fn watch(&self, id: &ObjectId, served: &ApiKind) -> Watch {
        let watch = self.running(id, served);
        watch.listed().await;
        watch
    }

    /// The watch of `id`'s kind, started if it was not yet.
    fn running(&self, id: &ObjectId, served: &ApiKind) -> Watch {
        // An operator for one namespace watches each namespace its
        // resources' objects are in (a cluster-scoped resource may put them
        // anywhere) rather than asking to list the whole cluster.
        let scope = match (&self.namespace, served.namespaced) {
            (Some(_), true) => id.namespace.clone(),
            _ => None,
        };
        let key = (
            id.group().to_string(),
            id.version().to_string(),
            id.kind.clone(),
            scope.clone(),
        );
        crate::sync::lock(&self.watches)
            .entry(key.clone())
            .or_insert_with(|| self.start(key, &served.resource, scope.as_deref()))
            .clone()
    }

    fn start(&self, key: WatchKey, resource: &ApiResource, namespace: Option<&str>) -> Watch {
        let api: Api<CompactObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let writer = reflector::store::Writer::new(resource.clone());
        let (listed, listed_rx) = tokio::sync::watch::channel(false);
        let watch = Watch {
            store: writer.as_reader(),
            resource: resource.clone(),
            error: Arc::default(),
            deleted: Arc::default(),
            started: tokio::time::Instant::now(),
            listed: listed_rx,
            arrivals: Arc::default(),
            stop: CancellationToken::new(),
        };
        let config = watcher::Config::default()
            .labels(Owner::LABEL)
            .any_semantic();
        let events = watcher(api, config).default_backoff().reflect(writer);
        let feed = Feed {
            watch: watch.clone(),
            key,
            name: resource_name(resource),
            changes: self.changes.clone(),
            watches: self.watches.clone(),
            discovery: self.discovery.clone(),
        };
        tokio::spawn(feed.run(events, listed));
        watch
    }
}

/// What the task of one watch keeps up to date.
struct Feed {
    watch: Watch,
    key: WatchKey,
    /// `plural.group`, for logs and messages.
    name: String,
    changes: broadcast::Sender<String>,
    watches: Watches,
    discovery: Discovery,
}

impl Feed {
    /// Feeds the watch's events into its store until it is stopped or the
    /// API server no longer serves its kind.
    async fn run(
        self,
        events: impl futures::Stream<Item = Result<watcher::Event<CompactObject>, watcher::Error>>,
        listed: tokio::sync::watch::Sender<bool>,
    ) {
        futures::pin_mut!(events);
        // Owners of objects seen during a (re)list: the store shows the
        // new list only once it is done, so they are woken then.
        let mut relisted = BTreeSet::new();
        loop {
            let event = tokio::select! {
                () = self.watch.stop.cancelled() => {
                    self.stopped("the operator no longer serves its kind");
                    return;
                }
                event = events.next() => event,
            };
            match event {
                None => return,
                Some(Ok(event)) => {
                    if matches!(event, watcher::Event::InitDone) {
                        listed.send_replace(true);
                    }
                    remember_deletions(&self.watch.deleted, &event);
                    wake_owners(&self.changes, &event, &mut relisted);
                    wake_arrivals(&self.watch.arrivals, &event);
                    self.recovered();
                }
                Some(Err(e)) if error_text::watch_path_not_served(&e) => {
                    self.stopped("the API server no longer serves it (its CRD was deleted, or changed its versions or scope)");
                    return;
                }
                Some(Err(e)) => self.failed(&e),
            }
        }
    }

    /// Says why the watch failed, once per distinct failure; readers see
    /// its objects as unreadable until it recovers.
    fn failed(&self, e: &watcher::Error) {
        let message = format!("cannot watch {}: {}", self.name, error_text::watch(e));
        let mut error = crate::sync::lock(&self.watch.error);
        if error.as_deref() != Some(message.as_str()) {
            tracing::warn!(resource = %self.name, error = %error_text::watch(e), "watch of owned objects failed; retrying with backoff");
            *error = Some(message);
        }
        drop(error);
        self.watch.arrivals.wake_all();
    }

    /// Clears a failure once the watch works again.
    fn recovered(&self) {
        if crate::sync::lock(&self.watch.error).take().is_some() {
            tracing::info!(resource = %self.name, "watching owned objects again");
        }
    }

    /// Ends the watch: out of the table (unless another took its place),
    /// its kind's discovery forgotten, its readers told why.
    fn stopped(&self, why: &str) {
        *crate::sync::lock(&self.watch.error) =
            Some(format!("{} is not watched: {why}", self.name));
        self.watch.arrivals.wake_all();
        {
            let mut watches = crate::sync::lock(&self.watches);
            let ours = watches
                .get(&self.key)
                .is_some_and(|w| Arc::ptr_eq(&w.error, &self.watch.error));
            if ours {
                watches.remove(&self.key);
            }
        }
        let (group, version, kind, _) = &self.key;
        self.discovery.forget_kind(group, version, kind);
        tracing::info!(resource = %self.name, reason = why, "stopped watching owned objects");
    }
}

/// `plural.group` (`plural` for the core group).
fn resource_name(resource: &ApiResource) -> String {
    match resource.group.as_str() {
        "" => resource.plural.clone(),
        group => format!("{}.{group}", resource.plural),
    }
}

impl Watch {
    /// Where the store keeps `id`.
    fn place(&self, id: &ObjectId, namespaced: bool) -> Place {
        let namespace = id.namespace.clone().filter(|_| namespaced);
        (namespace, id.name.clone())
    }

    /// What the store knows of `id`.
    fn seen(&self, id: &ObjectId, namespaced: bool) -> Seen {
        if let Some(error) = self.error() {
            return Seen::Unreadable(error);
        }
        let place = self.place(id, namespaced);
        let mut reference = ObjectRef::<CompactObject>::new_with(&id.name, self.resource.clone());
        if let Some(ns) = &place.0 {
            reference = reference.within(ns);
        }
        match self.store.get(&reference) {
            Some(object) => Seen::Object(object.to_value()),
            None if crate::sync::lock(&self.deleted).contains(&place) => Seen::Deleted,
            None if self.is_listed() => Seen::Absent,
            None => Seen::Unreadable(format!("{} not listed yet", self.resource.plural)),
        }
    }
}

/// Notes an object the watch saw deleted; forgets it when it comes back.
fn remember_deletions(deleted: &Mutex<HashSet<Place>>, event: &watcher::Event<CompactObject>) {
    let place = |o: &CompactObject| (o.namespace(), o.name_any());
    let mut deleted = crate::sync::lock(deleted);
    match event {
        watcher::Event::Delete(o) => {
            // Bounded: past the cap, drift waits for the resync instead.
            if deleted.len() >= DELETED_KEPT {
                deleted.clear();
            }
            deleted.insert(place(o));
        }
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            deleted.remove(&place(o));
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// Wakes the runs waiting for the object an event is about (every run at
/// the end of a list: the store shows a list once it is done).
fn wake_arrivals(arrivals: &Waiters<Place>, event: &watcher::Event<CompactObject>) {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
            arrivals.wake(&(o.namespace(), o.name_any()));
        }
        watcher::Event::InitDone => arrivals.wake_all(),
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
    }
}

/// Wakes the owners of the objects an event is about, once the store shows
/// the change: at once for a change, at the end of a (re)list for the
/// objects it listed (collected in `relisted` until then).
fn wake_owners(
    changes: &broadcast::Sender<String>,
    event: &watcher::Event<CompactObject>,
    relisted: &mut BTreeSet<String>,
) {
    let owner = |o: &CompactObject| o.owner().cloned();
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
            if let Some(owner) = owner(o) {
                let _ = changes.send(owner);
            }
        }
        watcher::Event::Init => relisted.clear(),
        watcher::Event::InitApply(o) => relisted.extend(owner(o)),
        watcher::Event::InitDone => {
            for owner in std::mem::take(relisted) {
                let _ = changes.send(owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;
    use serde_json::json;

    use super::*;

    fn deployments() -> (Watch, reflector::store::Writer<CompactObject>) {
        let gvk = GroupVersionKind::gvk("apps", "v1", "Deployment");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "deployments");
        let writer = reflector::store::Writer::new(resource.clone());
        let (_, listed) = tokio::sync::watch::channel(true);
        let watch = Watch {
            store: writer.as_reader(),
            resource,
            error: Arc::default(),
            deleted: Arc::default(),
            started: tokio::time::Instant::now(),
            listed,
            arrivals: Arc::default(),
            stop: CancellationToken::new(),
        };
        (watch, writer)
    }

    fn web() -> ObjectId {
        ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("a".into()),
            name: "web".into(),
        }
    }

    fn arrived(name: &str) -> watcher::Event<CompactObject> {
        let object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "a", "uid": "u", "resourceVersion": "5"},
            "spec": {"replicas": 0},
        });
        watcher::Event::Apply(serde_json::from_value(object).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_created_object_is_read_from_the_watch_once_it_arrives() {
        let (watch, mut writer) = deployments();
        let waiting = tokio::spawn({
            let watch = watch.clone();
            async move { watch.arrival(&web(), true).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Another object first: the waiter looks again and goes on waiting.
        writer.apply_watcher_event(&arrived("db"));
        wake_arrivals(&watch.arrivals, &arrived("db"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.apply_watcher_event(&arrived("web"));
        wake_arrivals(&watch.arrivals, &arrived("web"));
        let seen = waiting.await.unwrap();
        let Some(Seen::Object(state)) = seen else {
            panic!("{seen:?}")
        };
        assert_eq!(state["metadata"]["name"], "web");
        assert_eq!(state["spec"]["replicas"], 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_that_never_arrives_is_left_to_a_read_after_the_wait() {
        let (watch, _writer) = deployments();
        let start = tokio::time::Instant::now();
        assert_eq!(watch.arrival(&web(), true).await, None);
        assert_eq!(start.elapsed(), ARRIVAL_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_is_not_waited_for() {
        let (watch, _writer) = deployments();
        *watch.error.lock().unwrap() = Some("cannot watch deployments: forbidden".into());
        let start = tokio::time::Instant::now();
        assert_eq!(watch.arrival(&web(), true).await, None);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    /// A client whose API server answers every request with `answer`
    /// (`None`: never answers).
    fn api_answering(answer: Option<(u16, &'static str)>) -> Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            let Some((code, body)) = answer else {
                return std::future::pending().await;
            };
            let mut response =
                http::Response::new(kube::client::Body::from(body.as_bytes().to_vec()));
            *response.status_mut() = http::StatusCode::from_u16(code).unwrap();
            Ok::<_, std::convert::Infallible>(response)
        });
        Client::new(service, "default")
    }

    /// An object of a custom kind, and how the API served it.
    fn gadget(group: &str) -> (ObjectId, ApiKind) {
        let gvk = GroupVersionKind::gvk(group, "v1", "Gadget");
        let id = ObjectId {
            api_version: format!("{group}/v1"),
            kind: "Gadget".into(),
            namespace: Some("a".into()),
            name: "g".into(),
        };
        let served = ApiKind {
            resource: ApiResource::from_gvk_with_plural(&gvk, "gadgets"),
            namespaced: true,
        };
        (id, served)
    }

    fn watched(cache: &ObjectCache) -> usize {
        crate::sync::lock(&cache.watches).len()
    }

    #[tokio::test]
    async fn a_watch_whose_kind_is_no_longer_served_stops_and_says_why() {
        let cache = ObjectCache::new(
            api_answering(Some((404, "404 page not found"))),
            None,
            Discovery::default(),
        );
        let (id, served) = gadget("gone.example.com");
        let watch = cache.running(&id, &served);
        tokio::time::timeout(Duration::from_secs(5), async {
            while watched(&cache) > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the watch stops at the first 404 page not found");
        let Seen::Unreadable(why) = watch.seen(&id, true) else {
            panic!("a stopped watch's objects are unreadable")
        };
        assert!(
            why.starts_with(
                "gadgets.gone.example.com is not watched: the API server no longer serves it"
            ),
            "{why}"
        );
    }

    #[tokio::test]
    async fn stopping_a_kind_stops_its_watches_and_no_other() {
        let cache = ObjectCache::new(api_answering(None), None, Discovery::default());
        let (id, served) = gadget("stops.example.com");
        let (other_id, other) = gadget("stays.example.com");
        let watch = cache.running(&id, &served);
        cache.running(&other_id, &other);
        assert_eq!(watched(&cache), 2);
        cache.stop_kind("stops.example.com", "Gadget");
        assert_eq!(watched(&cache), 1);
        assert!(watch.stop.is_cancelled());
        tokio::time::timeout(Duration::from_secs(5), async {
            while !matches!(watch.seen(&id, true), Seen::Unreadable(_)) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("its readers are told");
        // Needed again: a new watch starts.
        let again = cache.running(&id, &served);
        assert!(!again.stop.is_cancelled());
        assert_eq!(watched(&cache), 2);
    }
}
