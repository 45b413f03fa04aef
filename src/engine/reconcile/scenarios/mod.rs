//! Reconcile scenarios without a cluster: one reconcile at a time of a
//! small kind (a `Widget` owning one ConfigMap per name in its spec),
//! through the engine's own path ([`reconcile_one`], [`error_policy`]),
//! against a mocked API server ([`fake_api`]) and a fake kubectl
//! (`fake_kubectl.py`) that share their objects. Each scenario asserts on
//! what the "cluster" holds afterwards and on the resource's status, as the
//! real-plane suite does (`tests/`), in well under a second.

mod fake_api;
mod runtime;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use self::fake_api::FakeApi;
use super::context::Context;
use super::handled::{error_policy, reconcile_one};
use super::triggers::Triggers;
use crate::engine::contract::{Handler, HandlerError, KindInfo, Plan};
use crate::engine::model::inventory::{ObjectId, Owner};
use crate::engine::model::overlay::Overlay;
use crate::engine::model::status::{CommonStatus, ConditionStatus, ConditionType, Reason};
use crate::engine::model::templates::KustomizeDir;
use crate::engine::reconcile::runtime::{Engine, Settings};
use crate::kubectl::{Kubectl, KubectlConfig};

const NAMESPACE: &str = "ns";
const WIDGETS: &str = "/apis/test.example.com/v1/namespaces/ns/widgets";
const CONFIG_MAPS: &str = "/api/v1/namespaces/ns/configmaps";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const FINALIZER: &str = "test.example.com/kustomize-operator";
const RESYNC: Duration = Duration::from_secs(600);

/// The kind of the scenarios: a Widget owns a ConfigMap for each name in
/// `spec.configMaps`, holding `spec.data`.
struct Widgets {
    info: KindInfo<ApiResource>,
    /// The user each observation read as, in order.
    readers: std::sync::Mutex<Vec<Option<String>>>,
}

/// The Widget's API resource (served under [`WIDGETS`]).
fn widget_resource() -> ApiResource {
    ApiResource {
        group: "test.example.com".into(),
        version: "v1".into(),
        api_version: "test.example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

impl Widgets {
    fn new() -> Self {
        Self {
            info: KindInfo {
                health: false,
                ..KindInfo::new("widget", FINALIZER, widget_resource())
            },
            readers: std::sync::Mutex::default(),
        }
    }

    /// Widgets made for their namespace's users: their writes run as a
    /// ServiceAccount of it, when the install names one.
    fn for_tenants() -> Self {
        let mut widgets = Self::new();
        widgets.info.tenant_writes = true;
        widgets
    }

    /// The users the observations so far read as.
    fn readers(&self) -> Vec<Option<String>> {
        self.readers.lock().expect("not poisoned").clone()
    }
}

impl Handler for Widgets {
    type Resource = DynamicObject;
    type Observed = ();
    type Status = Value;

    fn info(&self) -> &KindInfo<ApiResource> {
        &self.info
    }

    fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<DynamicObject> {
        let namespace = namespace.unwrap_or(NAMESPACE);
        kube::Api::namespaced_with(client, namespace, &self.info.dyn_type)
    }

    /// Confined to the Widget's own namespace.
    fn reaches(&self, widget: &DynamicObject, object: &ObjectId) -> bool {
        object.namespace.is_some() && object.namespace == widget.metadata.namespace
    }

    fn common_status(&self, resource: &DynamicObject) -> Option<CommonStatus> {
        serde_json::from_value(resource.data.get("status")?.clone()).ok()
    }

    async fn observe(&self, _: &DynamicObject, _: &kube::Client) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn observe_as(
        &self,
        _: &DynamicObject,
        _: &kube::Client,
        user: Option<&str>,
    ) -> Result<(), HandlerError> {
        let mut readers = self.readers.lock().expect("not poisoned");
        readers.push(user.map(str::to_string));
        Ok(())
    }

    fn observe_offline(&self, _: &DynamicObject, _: &[Value]) -> Result<(), HandlerError> {
        Ok(())
    }

    fn plan(&self, resource: &DynamicObject, _: &()) -> Result<Plan<Value>, HandlerError> {
        let spec = &resource.data["spec"];
        let names = spec["configMaps"].as_array().cloned().unwrap_or_default();
        let config_map = |name: &Value| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "data": spec["data"],
            })
        };
        Ok(Plan::apply(Overlay {
            resources: names.iter().map(config_map).collect(),
            ..Default::default()
        }))
    }
}

/// One scenario's world: the mocked API server, the fake kubectl sharing
/// its folder, and an engine serving Widgets on both.
struct World {
    dir: tempfile::TempDir,
    api: Arc<FakeApi>,
    ctx: Arc<Context<Widgets>>,
}

/// What one reconcile returned, and what the controller does next.
struct Ran {
    /// The reconcile succeeded.
    ok: bool,
    /// Why it did not.
    error: Option<String>,
    /// The next look: the reconcile's, else the error policy's.
    next: Action,
}

impl World {
    async fn new() -> Self {
        Self::with(Widgets::new(), |_| {}).await
    }

    /// A world whose Widgets' writes are all refused: they write as an
    /// account of their namespace, the operator's own, whose accounts are
    /// never acted as.
    async fn refusing() -> Self {
        Self::with(Widgets::for_tenants(), |settings| {
            settings.default_service_account = Some("app".into());
            settings.operator_namespace = Some(NAMESPACE.into());
        })
        .await
    }

    /// A world serving `widgets`, with the settings `configure` leaves.
    async fn with(widgets: Widgets, configure: impl FnOnce(&mut Settings)) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let api = FakeApi::new(dir.path());
        let kubectl = Kubectl::new(KubectlConfig {
            path: fake_kubectl(dir.path()),
            timeout: Duration::from_secs(20),
            max_concurrent: 4,
            cache_dir: None,
            output_cap: 64 * 1024,
        });
        let templates = dir.path().join("kustomize");
        std::fs::create_dir_all(&templates).expect("a kustomize dir");
        let templates = KustomizeDir::load(&templates).expect("an empty kustomize dir loads");
        let mut settings = settings(dir.path());
        configure(&mut settings);
        let engine = Engine::new(
            api.client(),
            kubectl,
            Arc::new(templates),
            settings,
            Arc::new(crate::engine::reconcile::runtime::NoMetrics),
        );
        let ctx = Arc::new(Context {
            engine: Arc::new(engine),
            handler: Arc::new(widgets),
            triggers: Arc::new(Triggers::default()),
        });
        Self { dir, api, ctx }
    }

    /// Creates the Widget `name` (generation 1).
    fn create(&self, name: &str, config_maps: &[&str], data: Value) {
        let widget = json!({
            "apiVersion": "test.example.com/v1", "kind": "Widget",
            "metadata": {
                "name": name, "namespace": NAMESPACE, "generation": 1,
                "uid": format!("uid-{name}"),
            },
            "spec": {"configMaps": config_maps, "data": data},
        });
        self.api.put(&format!("{WIDGETS}/{name}"), widget);
    }

    /// Changes the Widget's spec, as an edit does (its generation goes up).
    fn edit(&self, name: &str, config_maps: &[&str], data: Value) {
        let mut widget = self.widget(name).expect("the widget exists");
        widget["spec"] = json!({"configMaps": config_maps, "data": data});
        let generation = widget["metadata"]["generation"].as_i64().unwrap_or(1);
        widget["metadata"]["generation"] = json!(generation + 1);
        self.api.put(&format!("{WIDGETS}/{name}"), widget);
    }

    /// Marks the Widget deleted, as `kubectl delete` does to an object
    /// with finalizers.
    fn delete(&self, name: &str) {
        let mut widget = self.widget(name).expect("the widget exists");
        widget["metadata"]["deletionTimestamp"] = json!("2026-11-27T12:00:00Z");
        self.api.put(&format!("{WIDGETS}/{name}"), widget);
    }

    fn widget(&self, name: &str) -> Option<Value> {
        self.api.get(&format!("{WIDGETS}/{name}"))
    }

    fn config_map(&self, name: &str) -> Option<Value> {
        self.api.get(&format!("{CONFIG_MAPS}/{name}"))
    }

    /// The engine's part of the Widget's status.
    fn status(&self, name: &str) -> CommonStatus {
        let widget = self.widget(name).expect("the widget exists");
        serde_json::from_value(widget["status"].clone()).expect("a status the engine wrote")
    }

    /// The reasons of the events published so far, oldest first.
    fn events(&self) -> Vec<String> {
        let published = self.published().into_iter();
        published
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The events published so far, oldest first.
    fn published(&self) -> Vec<Value> {
        let mut events: Vec<Value> = self.api.list(EVENTS).into_values().collect();
        events.sort_by_key(|e| e["eventTime"].as_str().unwrap_or_default().to_string());
        events
    }

    /// How many times an event of `reason` was published (a repeat
    /// extends its series).
    fn event_count(&self, reason: &str) -> i64 {
        let events = self.api.list(EVENTS).into_values();
        let of_reason = events.filter(|e| e["reason"] == reason);
        of_reason
            .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
            .sum()
    }

    /// The note of the latest event of `reason`.
    fn event_note(&self, reason: &str) -> String {
        let published = self.published().into_iter();
        let latest = published.rev().find(|e| e["reason"] == reason);
        latest
            .and_then(|e| e["note"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Every kubectl run so far, as its arguments.
    fn kubectl_runs(&self) -> Vec<Vec<String>> {
        let log = std::fs::read_to_string(self.dir.path().join("calls.jsonl")).unwrap_or_default();
        log.lines()
            .map(|l| serde_json::from_str(l).expect("a logged run"))
            .collect()
    }

    /// Makes kubectl's `verb` runs fail (`apply-fails`, `apply-conflicts`,
    /// `delete-fails`) with `stderr`, or succeed again (`None`).
    fn kubectl_fails(&self, marker: &str, stderr: Option<&str>) {
        let path = self.dir.path().join(marker);
        match stderr {
            Some(text) => std::fs::write(path, text).expect("the marker is written"),
            None => std::fs::remove_file(path).expect("the marker was there"),
        }
    }

    /// One reconcile of the Widget `name` as the API server holds it now;
    /// on failure, the controller's error policy says when it runs again.
    async fn reconcile(&self, name: &str) -> Ran {
        let widget = self.widget(name).expect("the widget exists");
        let widget: Arc<DynamicObject> =
            Arc::new(serde_json::from_value(widget).expect("a widget"));
        match reconcile_one(widget.clone(), self.ctx.clone()).await {
            Ok(next) => Ran {
                ok: true,
                error: None,
                next,
            },
            Err(e) => Ran {
                ok: false,
                error: Some(format!("{e:?}")),
                next: error_policy(widget, &e, self.ctx.clone()),
            },
        }
    }
}

/// Settings for a scenario: nothing batched, nothing kept, one resync
/// every ten minutes.
fn settings(dir: &Path) -> Settings {
    Settings {
        resync_interval: RESYNC,
        health_timeout: Duration::from_secs(60),
        keep_overlays: None,
        work_dir: dir.to_path_buf(),
        namespace: None,
        shard: None,
        share: None,
        reporter: "kustomize-operator".into(),
        batch_window: Duration::ZERO,
        batch_max: 1,
        max_reconciles: 0,
        default_service_account: None,
        cluster_service_account: None,
        operator_namespace: None,
    }
}

/// Installs the fake kubectl for the state folder `dir`. It is written by a
/// child process (`cp`), so no process this test binary forks can hold it
/// open for writing when it runs ("text file busy").
fn fake_kubectl(dir: &Path) -> std::path::PathBuf {
    let source = include_str!("fake_kubectl.py").replace("@STATE@", &dir.display().to_string());
    let draft = dir.join("kubectl.py");
    std::fs::write(&draft, source).expect("the fake kubectl is written");
    let path = dir.join("kubectl");
    let copied = std::process::Command::new("cp")
        .arg(&draft)
        .arg(&path)
        .status()
        .expect("cp runs");
    assert!(copied.success(), "the fake kubectl is installed");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("the fake kubectl is executable");
    path
}

/// When the controller looks again after `action` (`None`: on a change
/// only). kube-runtime keeps the delay private; its `Debug` shows it.
fn delay(action: &Action) -> Option<Duration> {
    let text = format!("{action:?}");
    let inner = text
        .strip_prefix("Action { requeue_after: Some(")?
        .strip_suffix(") }")?;
    let units = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| Some((inner.strip_suffix(unit)?, *scale)))?;
    Some(Duration::from_secs_f64(number.parse::<f64>().ok()? * scale))
}

fn ready(status: &CommonStatus) -> (ConditionStatus, Reason) {
    let ready = status
        .condition(ConditionType::Ready)
        .expect("a Ready condition");
    (ready.status, ready.reason)
}

fn inventory(status: &CommonStatus) -> Vec<String> {
    let ids = status
        .inventory
        .as_ref()
        .map(|i| i.ids())
        .unwrap_or_default();
    ids.iter().map(|id| id.name.clone()).collect()
}

fn applies(runs: &[Vec<String>]) -> usize {
    runs.iter().filter(|r| r.contains(&"apply".into())).count()
}

#[tokio::test]
async fn a_new_resource_gets_its_finalizer_its_objects_and_a_ready_status() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));

    let ran = world.reconcile("w").await;

    assert!(ran.ok, "{:?} after {:?}", ran.error, world.api.requests());
    assert_eq!(delay(&ran.next), Some(RESYNC));
    let widget = world.widget("w").unwrap();
    assert_eq!(widget["metadata"]["finalizers"], json!([FINALIZER]));
    let config_map = world.config_map("w-a").expect("the ConfigMap was applied");
    assert_eq!(config_map["data"], json!({"greeting": "hello"}));
    assert_eq!(config_map["metadata"]["labels"][Owner::LABEL], "uid-w");
    let runs = world.kubectl_runs();
    assert_eq!(runs.len(), 1);
    assert!(runs[0].starts_with(&["apply".into(), "--server-side".into()]));
    assert!(!runs[0].contains(&"--force-conflicts".into()));
    let status = world.status("w");
    assert_eq!(ready(&status), (ConditionStatus::True, Reason::Applied));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(inventory(&status), ["w-a"]);
    let record = status.last_command.expect("the kubectl run is recorded");
    assert_eq!(record.stdout, "configmap/w-a serverside-applied\n");
    assert_eq!(world.events(), ["Applied"]);
}

#[tokio::test]
async fn an_unchanged_resource_runs_no_kubectl_and_writes_nothing() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    assert!(world.reconcile("w").await.ok);
    let requests = world.api.requests().len();
    let status = world.widget("w").unwrap()["status"].clone();

    let ran = world.reconcile("w").await;

    assert!(ran.ok);
    let next = delay(&ran.next).expect("a resync is due");
    assert!(
        next <= RESYNC && next > RESYNC - Duration::from_secs(30),
        "{next:?}"
    );
    assert_eq!(world.kubectl_runs().len(), 1, "no second kubectl run");
    let writes: Vec<String> = world.api.requests()[requests..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect();
    assert!(
        writes.is_empty(),
        "an unchanged resource writes nothing: {writes:?}"
    );
    assert_eq!(world.widget("w").unwrap()["status"], status);
}

#[tokio::test]
async fn a_changed_spec_is_applied_again() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    assert!(world.reconcile("w").await.ok);
    let first = world.status("w").applied_digest;

    world.edit("w", &["w-a"], json!({"greeting": "bonjour"}));
    let ran = world.reconcile("w").await;

    assert!(ran.ok);
    assert_eq!(applies(&world.kubectl_runs()), 2);
    assert_eq!(
        world.config_map("w-a").unwrap()["data"]["greeting"],
        "bonjour"
    );
    let status = world.status("w");
    assert_eq!(ready(&status), (ConditionStatus::True, Reason::Applied));
    assert_eq!(status.observed_generation, Some(2));
    assert_ne!(status.applied_digest, first);
    assert_eq!(world.event_count("Applied"), 2);
}

#[tokio::test]
async fn what_a_resource_no_longer_renders_is_pruned_if_it_still_carries_the_marker() {
    let world = World::new().await;
    world.create("w", &["w-a", "w-b", "w-c"], json!({"k": "v"}));
    let ran = world.reconcile("w").await;
    assert!(ran.ok, "{:?}", ran.error);
    assert_eq!(inventory(&world.status("w")), ["w-a", "w-b", "w-c"]);
    // Someone else takes w-c over: it loses the marker.
    let path = format!("{CONFIG_MAPS}/w-c");
    let mut taken = world.api.get(&path).unwrap();
    taken["metadata"]["labels"] = json!({"team": "other"});
    world.api.put(&path, taken);

    world.edit("w", &["w-a"], json!({"k": "v"}));
    let ran = world.reconcile("w").await;

    assert!(ran.ok);
    assert!(world.config_map("w-a").is_some());
    assert!(world.config_map("w-b").is_none(), "w-b was pruned");
    assert!(
        world.config_map("w-c").is_some(),
        "w-c is not its own: left"
    );
    let deletes: Vec<Vec<String>> = world
        .kubectl_runs()
        .into_iter()
        .filter(|r| r.contains(&"delete".into()))
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(deletes[0].contains(&format!("--raw={CONFIG_MAPS}/w-b")));
    let status = world.status("w");
    assert_eq!(ready(&status), (ConditionStatus::True, Reason::Applied));
    assert_eq!(inventory(&status), ["w-a"]);
    assert!(world.event_note("Pruned").contains("configmap/w-b"));
    let ignored = world.event_note("InventoryIgnored");
    assert!(ignored.contains("forgot 1 listed object"), "{ignored}");
}

#[tokio::test]
async fn an_object_it_did_not_create_is_not_applied_over() {
    let world = World::new().await;
    let foreign = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "w-a", "namespace": NAMESPACE, "uid": "someone-else"},
        "data": {"theirs": "yes"},
    });
    world.api.put(&format!("{CONFIG_MAPS}/w-a"), foreign);
    world.create("w", &["w-a"], json!({"greeting": "hello"}));

    let ran = world.reconcile("w").await;

    assert!(!ran.ok);
    assert_eq!(world.kubectl_runs().len(), 0, "nothing was applied");
    assert_eq!(
        world.config_map("w-a").unwrap()["data"],
        json!({"theirs": "yes"})
    );
    let status = world.status("w");
    assert_eq!(
        ready(&status),
        (ConditionStatus::False, Reason::OwnershipConflict)
    );
    assert!(world.events().contains(&"OwnershipConflict".to_string()));
}

#[tokio::test]
async fn a_field_conflict_is_reported_and_retried() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    let conflict = "error: Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1: .data.greeting\n";
    world.kubectl_fails("apply-conflicts", Some(conflict));

    let ran = world.reconcile("w").await;

    assert!(!ran.ok);
    let next = delay(&ran.next).expect("retried");
    assert!(next >= Duration::from_secs(1) && next < Duration::from_millis(1100));
    let status = world.status("w");
    assert_eq!(
        ready(&status),
        (ConditionStatus::False, Reason::FieldConflict)
    );
    assert!(
        status
            .message
            .unwrap_or_default()
            .contains(".data.greeting")
    );
    let record = status.last_command.expect("the failed run is recorded");
    assert_eq!(record.exit_code, Some(1));
    assert!(world.events().contains(&"FieldConflict".to_string()));
    assert!(world.config_map("w-a").is_none());
}

#[tokio::test]
async fn a_failing_apply_backs_off_and_a_success_resets_it() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    world.kubectl_fails("apply-fails", Some("error: connection refused\n"));

    let mut delays = Vec::new();
    for _ in 0..3 {
        let ran = world.reconcile("w").await;
        assert!(!ran.ok);
        delays.push(delay(&ran.next).expect("retried"));
    }

    for (delay, base) in delays.iter().zip([1, 2, 4]) {
        let base = Duration::from_secs(base);
        assert!(*delay >= base && *delay < base.mul_f64(1.1), "{delays:?}");
    }
    assert_eq!(applies(&world.kubectl_runs()), 3, "each retry ran kubectl");
    let status = world.status("w");
    assert_eq!(
        ready(&status),
        (ConditionStatus::False, Reason::ApplyFailed)
    );
    assert!(
        status
            .message
            .unwrap_or_default()
            .contains("connection refused")
    );

    world.kubectl_fails("apply-fails", None);
    let ran = world.reconcile("w").await;
    assert!(ran.ok);
    assert_eq!(
        ready(&world.status("w")),
        (ConditionStatus::True, Reason::Applied)
    );
    world.edit("w", &["w-a"], json!({"greeting": "again"}));
    world.kubectl_fails("apply-fails", Some("error: connection refused\n"));
    let after = delay(&world.reconcile("w").await.next).expect("retried");
    assert!(
        after < Duration::from_millis(1100),
        "backoff starts over: {after:?}"
    );
}

#[tokio::test]
async fn a_deleted_resource_has_its_objects_deleted_before_its_finalizer_goes() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    assert!(world.reconcile("w").await.ok);

    world.delete("w");
    let ran = world.reconcile("w").await;

    assert!(ran.ok);
    assert!(world.config_map("w-a").is_none(), "its object was deleted");
    assert!(
        world.widget("w").is_none(),
        "its finalizer went: it is gone"
    );
    let delete = world.kubectl_runs().pop().unwrap();
    assert!(
        delete.contains(&format!("--raw={CONFIG_MAPS}/w-a")),
        "{delete:?}"
    );
    assert!(
        world
            .event_note("Deleted")
            .contains("deleted 1 object(s): configmap/w-a")
    );
}

#[tokio::test]
async fn a_failed_delete_keeps_the_resource_until_it_succeeds() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    assert!(world.reconcile("w").await.ok);
    world.delete("w");
    world.kubectl_fails("delete-fails", Some("error: the server is on fire\n"));

    let ran = world.reconcile("w").await;

    assert!(!ran.ok);
    assert!(delay(&ran.next).is_some(), "retried");
    let widget = world.widget("w").expect("kept while its objects remain");
    assert_eq!(widget["metadata"]["finalizers"], json!([FINALIZER]));
    assert!(world.config_map("w-a").is_some());
    let status = world.status("w");
    assert_eq!(
        ready(&status),
        (ConditionStatus::False, Reason::DeleteFailed)
    );
    assert!(status.message.unwrap_or_default().contains("on fire"));

    world.kubectl_fails("delete-fails", None);
    assert!(world.reconcile("w").await.ok);
    assert!(world.config_map("w-a").is_none());
    assert!(world.widget("w").is_none());
}

#[tokio::test]
async fn a_resource_whose_writes_are_refused_is_not_even_observed() {
    let world = World::refusing().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));

    let ran = world.reconcile("w").await;

    assert!(!ran.ok, "refused, yet it succeeded");
    let status = world.status("w");
    assert_eq!(ready(&status), (ConditionStatus::False, Reason::Forbidden));
    let message = status.message.unwrap_or_default();
    assert!(message.contains("never acts as an account"), "{message}");
    assert_eq!(world.ctx.handler.readers(), Vec::<Option<String>>::new());
    assert!(world.kubectl_runs().is_empty());
    assert!(world.config_map("w-a").is_none());
}

#[tokio::test]
async fn a_tenants_resource_is_observed_as_the_account_its_writes_use() {
    let world = World::with(Widgets::for_tenants(), |settings| {
        settings.default_service_account = Some("app".into());
    })
    .await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));

    world.reconcile("w").await;

    let reader = format!("system:serviceaccount:{NAMESPACE}:app");
    assert_eq!(world.ctx.handler.readers(), [Some(reader)]);
}

#[tokio::test]
async fn the_operators_own_resource_is_observed_as_the_operator() {
    let world = World::new().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));

    let ran = world.reconcile("w").await;

    assert!(ran.ok, "{:?}", ran.error);
    assert_eq!(world.ctx.handler.readers(), [None]);
}

#[tokio::test]
async fn a_resource_without_an_inventory_whose_writes_are_refused_stays_when_deleted() {
    let world = World::refusing().await;
    world.create("w", &["w-a"], json!({"greeting": "hello"}));
    // As a version without inventories left it (before the refusal was
    // configured): finalized, applied, no inventory.
    let mut widget = world.widget("w").expect("the widget exists");
    widget["metadata"]["finalizers"] = json!([FINALIZER]);
    widget["status"] = json!({"appliedDigest": "an older version's digest"});
    world.api.put(&format!("{WIDGETS}/w"), widget);

    world.delete("w");
    let ran = world.reconcile("w").await;

    assert!(!ran.ok, "its delete was refused, yet it succeeded");
    let widget = world
        .widget("w")
        .expect("it stays while its writes are refused");
    assert_eq!(widget["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(
        ready(&world.status("w")),
        (ConditionStatus::False, Reason::Forbidden)
    );
    assert_eq!(world.ctx.handler.readers(), Vec::<Option<String>>::new());
    assert!(world.kubectl_runs().is_empty());
}
