//! The runtime's state: what every reconcile of every kind shares (the
//! client, the kubectl runner and its queues, the live objects' cache,
//! discovery, events, failure counts, written and parked statuses), and
//! the settings the controllers run with. Only the reconcile stage
//! reaches into it; host code holds it through [`crate::engine::host`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::events::Events;
use super::expiring::Expiring;
use super::parked::ParkedStatuses;
use super::status_memo::StatusMemo;
use crate::engine::contract::KindInfo;
use crate::engine::live::ownership::Discovery;
use crate::engine::live::watch::ObjectCache;
use crate::engine::model::identity::{Identity, Refusal, Writers};
use crate::engine::model::inventory::Owner;
use crate::engine::model::templates::KustomizeDir;
use crate::engine::run::batch::{BatchSettings, Queue};
use crate::engine::run::build::{self, Builds};
use crate::engine::run::kubectl_apply::{self, Applied, ApplyJob};
use crate::kubectl::Kubectl;
use crate::names::ServiceAccount;
use crate::partition::share::Entered;

/// How often expired entries are forgotten when no reconcile comes by
/// ([`Engine::forget_expired`]).
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// Shortest and longest retry delay after a failure.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A count of failures in a row is forgotten this long after the last
/// one: a resource failing still fails again sooner (the longest delay is
/// half of it), a deleted one leaves nothing behind.
const FAILURES_KEPT: Duration = BACKOFF_MAX.saturating_mul(2);

/// How the engine behaves, shared by every controller. `Default` resyncs,
/// batches and limits nothing: the operator sets every field from its
/// flags, an engine that only plans ([`Engine::planning`]) what it uses.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Re-apply unchanged resources this often, to correct drift.
    pub resync_interval: Duration,
    /// Objects not healthy this long after an apply stall their resource.
    pub health_timeout: Duration,
    /// Keep the last overlay of each resource under this directory.
    pub keep_overlays: Option<PathBuf>,
    /// Where per-reconcile temp dirs are created.
    pub work_dir: PathBuf,
    /// Watch only this namespace (namespaced kinds).
    pub namespace: Option<String>,
    /// Reconcile only the resources of this shard (`None`: the unlabelled).
    pub shard: Option<String>,
    /// With replicas sharing the work by themselves, this replica's share:
    /// only its resources are watched and reconciled (`None`: all).
    pub share: Option<Arc<crate::partition::share::Share>>,
    /// Name reported on events.
    pub reporter: String,
    /// After the first kubectl job queued, wait this long for others to
    /// share its run.
    pub batch_window: Duration,
    /// At most this many jobs share one kubectl run.
    pub batch_max: usize,
    /// At most this many reconciles of one kind run at once (0: no limit).
    pub max_reconciles: u16,
    /// The ServiceAccount of a resource's namespace that the writes of
    /// kinds with `tenant_writes` run as (`None`: the operator's own
    /// account, unless the kind names one).
    pub default_service_account: Option<String>,
    /// The ServiceAccount the writes of cluster-scoped resources run as
    /// (`--cluster-service-account`); without it, in an install writing as
    /// tenants, they are refused.
    pub cluster_service_account: Option<ServiceAccount>,
    /// The operator's own namespace: its accounts are never acted as.
    pub operator_namespace: Option<String>,
}

impl Settings {
    /// Whose rights the writes of `owner`, a resource of `kind`, use: a
    /// ServiceAccount of its namespace when the kind writes for tenants and
    /// an account is named (by the kind, else by
    /// `--default-service-account`); for a cluster-scoped owner the account
    /// `--cluster-service-account` names, or, in an install writing as
    /// tenants without one, none (refused); else the operator's own. The
    /// reconcile and `plan` both ask here.
    pub fn writer_of<D>(&self, owner: &Owner, kind: &KindInfo<D>) -> Result<Identity, Refusal> {
        let writers = Writers {
            account: (kind.service_account.as_deref()).or(self.default_service_account.as_deref()),
            tenant_writes: kind.tenant_writes,
            cluster_account: self.cluster_service_account.as_ref(),
            operator_namespace: self.operator_namespace.as_deref(),
        };
        writers.identity_of(owner)
    }
}

/// What the engine tells of its reconciles: the host's metrics implement
/// it and are passed in ([`Engine::new`]); the engine names no metrics of
/// its own.
pub trait ReconcileMetrics: Send + Sync {
    /// A reconcile of `kind` starts; it counts as running until what is
    /// returned drops.
    fn started(&self, kind: &str) -> Box<dyn Send>;
    /// A reconcile of `kind` failed.
    fn failed(&self, kind: &str);
    /// A reconcile of `kind` found nothing to do.
    fn skipped(&self, kind: &str);
}

/// Tells nothing (an engine that only plans; the mocked API's scenarios).
#[derive(Debug, Default)]
pub struct NoMetrics;

impl ReconcileMetrics for NoMetrics {
    fn started(&self, _: &str) -> Box<dyn Send> {
        Box::new(())
    }
    fn failed(&self, _: &str) {}
    fn skipped(&self, _: &str) {}
}

/// Everything a reconcile needs, shared by every controller.
pub struct Engine {
    pub(super) client: Client,
    /// What the watches of the resources served read with (the share's
    /// client under automatic sharding; else `client`).
    pub(super) reader: Client,
    pub(super) kubectl: Kubectl,
    pub(super) templates: Arc<KustomizeDir>,
    pub(super) settings: Settings,
    pub(super) metrics: Arc<dyn ReconcileMetrics>,
    pub(super) events: Events,
    pub(super) failures: Mutex<Expiring<String, u32>>,
    pub(super) memo: StatusMemo,
    pub(super) parked: ParkedStatuses,
    pub(super) builds: Builds,
    pub(super) applies: Queue<ApplyJob, Applied>,
    pub(super) discovery: Discovery,
    pub(super) objects: ObjectCache,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings)
            .finish()
    }
}

impl Engine {
    /// The field manager of the engine's server-side applies (objects and status).
    pub const FIELD_MANAGER: &str = "kustomize-operator";

    /// The CRD `name`'s metadata once it is established at its current
    /// generation (`None`: not within half a minute): what a kind's CRD,
    /// or a definition's, is awaited with before it is served.
    pub async fn wait_established(
        &self,
        name: &str,
    ) -> Result<Option<kube::core::ObjectMeta>, kube::Error> {
        crate::engine::live::crds::wait_established(&self.client, name).await
    }

    /// Builds the engine (and starts its kubectl queues).
    pub fn new(
        client: Client,
        kubectl: Kubectl,
        templates: Arc<KustomizeDir>,
        settings: Settings,
        metrics: Arc<dyn ReconcileMetrics>,
    ) -> Self {
        let batch = BatchSettings {
            window: settings.batch_window,
            max: settings.batch_max.max(1),
        };
        let builds = Builds::start(
            kubectl.clone(),
            batch.window,
            batch.max,
            settings.work_dir.clone(),
        );
        let applies = Queue::start(
            kubectl.clone(),
            batch,
            kubectl_apply::runner(kubectl.clone()),
        );
        let discovery = Discovery::default();
        Self {
            events: Events::new(client.clone(), &settings.reporter),
            objects: ObjectCache::new(
                client.clone(),
                settings.namespace.clone(),
                discovery.clone(),
            ),
            reader: client.clone(),
            client,
            kubectl,
            templates,
            settings,
            metrics,
            failures: Mutex::default(),
            memo: StatusMemo::default(),
            parked: ParkedStatuses::default(),
            builds,
            applies,
            discovery,
        }
    }

    /// An engine that only plans (`plan`): no kind folders of its own (a
    /// planned kind brings its templates), no metrics. A plan uses its
    /// settings (whose rights writes use, the namespace planned) and its
    /// build queue.
    pub fn planning(client: Client, kubectl: Kubectl, settings: Settings) -> Self {
        let templates = Arc::new(KustomizeDir::default());
        Self::new(client, kubectl, templates, settings, Arc::new(NoMetrics))
    }

    /// The engine, its watches reading with `reader` (a client naming the
    /// replica's share in its lists and watches): every other request
    /// goes on using the engine's client.
    #[must_use]
    pub fn reading_with(mut self, reader: Client) -> Self {
        self.reader = reader;
        self
    }

    /// The API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The kubectl runner.
    pub fn kubectl(&self) -> &Kubectl {
        &self.kubectl
    }

    /// The queue building overlays with `kubectl kustomize`.
    pub(crate) fn builds(&self) -> &Builds {
        &self.builds
    }

    /// Builds the base of the kind folder `kind` alone (`kubectl
    /// kustomize`), from `templates` (default: the engine's): what it
    /// produces, or why it does not build.
    pub(crate) async fn build_base(
        &self,
        templates: Option<&KustomizeDir>,
        kind: &str,
    ) -> build::Built {
        Builds::build_base(
            &self.kubectl,
            &self.settings.work_dir,
            templates.unwrap_or(&self.templates),
            kind,
        )
        .await
    }

    /// The engine's settings.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Publishes an event about `regarding` (repeats fold into a series);
    /// a failure to publish is logged, not returned.
    pub(crate) async fn publish_event(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        event: &crate::engine::contract::PlannedEvent,
    ) {
        let reason = event.reason;
        let event = super::events::Publish {
            regarding,
            type_: event.type_,
            reason,
            action: reason,
            note: &event.note,
            related: event.related.as_ref(),
        };
        if let Err(e) = self.events.publish(&event).await {
            tracing::warn!(reason, error = %crate::error_text::kube(&e), "cannot publish an event");
        }
    }

    /// Forgets how the API serves the kinds of the API group `group`, in
    /// the engine and in kubectl's cache: a CRD of the group changed (a
    /// kind started or stopped being served, or kubectl was told a
    /// resource of the group is not served), and the next look asks the
    /// API server again.
    pub(crate) fn forget_discovery(&self, group: &str) {
        self.discovery.forget_group(group);
        self.kubectl.forget_discovery_of(group);
    }

    /// The kind `resource` is no longer served by the operator (its
    /// definition went, or a new generation replaces it): its discovery
    /// is forgotten and the watches of its objects (owned by other
    /// resources) stop; they start again when a resource needs them.
    pub(crate) fn kind_stopped(&self, resource: &kube::api::ApiResource) {
        self.forget_discovery(&resource.group);
        self.objects.stop_kind(&resource.group, &resource.kind);
    }

    /// Forgets what has expired (see [`Self::forget_expired`]) every
    /// [`FORGET_EVERY`], until `stop` is cancelled.
    pub async fn forget_expired_until(&self, stop: CancellationToken) {
        crate::memory::every(FORGET_EVERY, stop, || self.forget_expired()).await;
    }

    /// Forgets what the engine remembered about resources for a few
    /// minutes (events' series, parked statuses, written statuses, failure
    /// counts) once it expired. The tables also sweep themselves when used;
    /// run every [`FORGET_EVERY`], this keeps a quiet operator from holding
    /// a burst's entries until its next event.
    pub fn forget_expired(&self) {
        let now = tokio::time::Instant::now();
        self.events.forget_expired(now);
        self.parked.forget_expired(now);
        self.memo.forget_expired(now);
        crate::sync::lock(&self.failures).forget_expired(now);
    }

    /// Whether this replica may work on the resource with `uid` now: always
    /// without a share; with one, only in a slot it holds, entered for the
    /// work (the slot waits for it before it is given up) until the guard
    /// returned drops. None: not this replica's to touch.
    pub(super) fn enter(&self, uid: Option<&str>) -> Option<Option<Entered<'_>>> {
        match (&self.settings.share, uid) {
            (None, _) => Some(None),
            (Some(share), Some(uid)) => share.enter(uid).map(Some),
            (Some(_), None) => None,
        }
    }

    /// Counts a failure of `key` (returns how many in a row), or clears them.
    pub(super) fn failure_count(&self, key: &str, failed: bool) -> u32 {
        let mut failures = crate::sync::lock(&self.failures);
        if !failed {
            failures.remove(key);
            return 0;
        }
        let now = tokio::time::Instant::now();
        let count = failures
            .get(key, now)
            .copied()
            .unwrap_or(0)
            .saturating_add(1);
        failures.insert(key.to_string(), count, now + FAILURES_KEPT, now);
        count
    }
}

/// The retry delay after `failures` consecutive failures: exponential from
/// one second, capped at five minutes, with up to 10% jitter.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_MIN.saturating_mul(1 << exp).min(BACKOFF_MAX);
    let jitter = base.mul_f64(rand::random::<f64>() * 0.1);
    base + jitter
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let d1 = backoff(1);
        assert!(d1 >= Duration::from_secs(1) && d1 < Duration::from_millis(1100));
        let d4 = backoff(4);
        assert!(d4 >= Duration::from_secs(8) && d4 < Duration::from_millis(8900));
        let d30 = backoff(30);
        assert!(d30 >= BACKOFF_MAX && d30 <= BACKOFF_MAX.mul_f64(1.1));
    }
}
