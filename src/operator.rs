//! Starting and stopping the operator: checks, the engine, one controller per
//! kind, the metrics endpoint. Used by `run` and by the integration tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::{KindsError, RunArgs};
use crate::conversion::Webhook;
use crate::conversion::certificate::Certificate;
use crate::conversion::renew::Renewing;
use crate::engine::host::Dynamic;
use crate::engine::host::share::Share;
use crate::engine::host::{
    BatchSettings, Engine, Kubectl, KubectlConfig, KubectlError, KubectlStats, OUTPUT_LIMIT,
    Settings, in_cluster_kubeconfig,
};
use crate::guard::Guard;
use crate::kinds::declared::DeclaredHandler;
use crate::kinds::registry::Kind;
use crate::kinds::{KindOptions, Served};
use crate::leader::{LeaderConfig, LeaderConfigError, LeaderElector};
use crate::metrics::Metrics;
use crate::sharding::{Sharing, SharingConfig};

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// kubectl is missing or not executable.
    #[error(transparent)]
    Kubectl(#[from] KubectlError),
    /// A kustomize directory is missing, a template or a kind file is
    /// broken, or `--kinds` names an unknown kind.
    #[error(transparent)]
    Kinds(#[from] KindsError),
    /// A declared kind's base does not build.
    #[error("{file}: the kind's base does not build: {reason}")]
    Base {
        /// The kind file.
        file: PathBuf,
        /// kubectl's message.
        reason: String,
    },
    /// No usable cluster configuration.
    #[error(
        "cannot configure a Kubernetes client (KUBECONFIG or in-cluster): {}",
        crate::error_text::kube(.0)
    )]
    Config(#[source] kube::Error),
    /// The API server could not be reached.
    #[error("cannot reach the Kubernetes API server: {}", crate::error_text::kube(.0))]
    Connect(#[source] kube::Error),
    /// Some CRDs are not installed.
    #[error(
        "CRDs not installed for: {}; install them with `kubectl apply -k deploy/crds` (or `kustomize-operator crd | kubectl apply -f -`)",
        .0.join(", ")
    )]
    MissingCrds(Vec<String>),
    /// The operator's account may not list or watch some kinds.
    #[error(
        "the operator's account ({account}) may not {}{}: grant it (the install's ClusterRoles, or `kustomize-operator rbac` for a declared kind)",
        .missing.join(", "),
        .namespace.as_deref().map(|n| format!(" in the namespace {n}")).unwrap_or_default()
    )]
    Forbidden {
        /// Who the operator is, as the API server knows it.
        account: String,
        /// `verb resource` for each right missing.
        missing: Vec<String>,
        /// The namespace it was asked for; `None`: every namespace.
        namespace: Option<String>,
    },
    /// The API server's Kubernetes version is outside the supported range.
    #[error(transparent)]
    Version(#[from] crate::support_range::VersionError),
    /// Automatic sharding is asked for without a namespace for its Leases.
    #[error(
        "--auto-shard needs a namespace for its Leases and table: set NAMESPACE (the downward API does in the Deployment) or --leader-elect-namespace"
    )]
    ShardingNamespace,
    /// Leader election is asked for but cannot work as configured.
    #[error("leader election: {0}")]
    LeaderElection(#[from] LeaderConfigError),
    /// Leader election is asked for without a namespace for its Lease.
    #[error(
        "--leader-elect needs a namespace for its Lease: set NAMESPACE (the downward API does in the Deployment) or --leader-elect-namespace"
    )]
    LeaseNamespace,
    /// The conversion webhook cannot be set up.
    #[error("conversion webhook: {0}")]
    Webhook(String),
    /// The work directory cannot be prepared.
    #[error("cannot prepare work directory {path}: {source}")]
    WorkDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A running operator.
pub struct Operator {
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    lost: CancellationToken,
    tasks: JoinSet<()>,
    work_dir: WorkDir,
    kinds: Vec<String>,
}

/// The Lease's name: as given, or, for a shard left with the default name,
/// the default with the shard's (each shard elects its own leader).
fn lease_name(args: &RunArgs) -> String {
    match &args.shard {
        Some(shard) if args.leader_elect_lease_name == crate::cli::DEFAULT_LEASE_NAME => {
            format!("{}-{shard}", crate::cli::DEFAULT_LEASE_NAME)
        }
        _ => args.leader_elect_lease_name.clone(),
    }
}

/// The automatic sharding settings from the command line, checked; None
/// without `--auto-shard`.
pub fn sharing_config(args: &RunArgs) -> Result<Option<SharingConfig>, StartError> {
    if !args.auto_shard {
        return Ok(None);
    }
    let namespace = args
        .leader_elect_namespace
        .clone()
        .or_else(|| args.common.operator_namespace.clone())
        .ok_or(StartError::ShardingNamespace)?;
    let identity = args
        .leader_elect_identity
        .clone()
        .unwrap_or_else(crate::leader::default_identity);
    let config = SharingConfig {
        ring: args
            .auto_shard_ring
            .clone()
            .unwrap_or_else(|| match &args.shard {
                Some(shard) => format!("{}-{shard}", crate::cli::DEFAULT_LEASE_NAME),
                None => crate::cli::DEFAULT_LEASE_NAME.to_string(),
            }),
        namespace,
        identity: crate::sharding::member_name(&identity),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    config.validate()?;
    Ok(Some(config))
}

/// The leader election settings from the command line, checked; None without `--leader-elect`.
pub fn leader_config(args: &RunArgs) -> Result<Option<LeaderConfig>, StartError> {
    if !args.leader_elect {
        return Ok(None);
    }
    let namespace = args
        .leader_elect_namespace
        .clone()
        .or_else(|| args.common.operator_namespace.clone())
        .filter(|ns| !ns.is_empty())
        .ok_or(StartError::LeaseNamespace)?;
    let config = LeaderConfig {
        lease_name: lease_name(args),
        namespace,
        identity: args
            .leader_elect_identity
            .clone()
            .unwrap_or_else(crate::leader::default_identity),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    config.validate()?;
    Ok(Some(config))
}

impl Operator {
    /// Checks prerequisites and starts one controller per selected kind.
    pub async fn start(args: &RunArgs) -> Result<Self, StartError> {
        let leader = leader_config(args)?;
        let sharing = sharing_config(args)?;
        let share = sharing.as_ref().map(|_| Arc::new(Share::new()));
        let kubectl_path = KubectlConfig::locate(args.kubectl.as_deref())?;
        let (templates, registry) = args.common.dirs.load()?;
        registry.refuse_versions().map_err(KindsError::from)?;
        let templates = Arc::new(templates);
        let kinds = registry.select(&args.kinds).map_err(KindsError::from)?;
        let metrics = Arc::new(Metrics::new());
        metrics.stall_after(stall_bound(args.kubectl_timeout));
        let Connected {
            client,
            reader,
            guard,
            unreadable,
        } = connect(args.max_api_requests, &metrics, share.clone()).await?;
        check_crds(&client, &guard, &kinds, args.namespace.as_deref()).await?;
        let webhook = conversion_webhook(args, &client).await?;
        let definitions = definitions_config(
            args,
            &client,
            &metrics,
            registry.all(),
            webhook.as_ref().map(|w| w.webhook.clone()),
        )
        .await;
        // The webhook answers for the kinds of the definitions served.
        let following = definitions.as_ref().map(|d| crate::conversion::Following {
            marker: crate::definitions::resource::MARKER_LABEL.to_string(),
            definitions: crate::definitions::resource::api_resource(),
            selector: d.selector.clone(),
        });
        let base_dir = args
            .work_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("kustomize-operator"));
        let work_dir = WorkDir::prepare(&base_dir)?;
        let kubectl = kubectl(args, kubectl_path, &base_dir, &metrics);
        let engine = Arc::new(
            Engine::new(
                client.clone(),
                kubectl,
                templates,
                settings(args, work_dir.path.clone(), share.clone()),
                metrics.clone(),
            )
            .reading_with(reader),
        );
        check_bases(&engine, &kinds).await?;
        let names = kinds.iter().map(|k| k.name().to_string()).collect();
        let controllers = Controllers {
            kinds,
            engine: engine.clone(),
            metrics: metrics.clone(),
            options: args.common.kind_options(args.namespace.as_deref()),
            definitions,
        };
        let mut operator = Self {
            engine,
            metrics: metrics.clone(),
            shutdown: CancellationToken::new(),
            lost: CancellationToken::new(),
            tasks: JoinSet::new(),
            work_dir,
            kinds: names,
        };
        let stop = operator.shutdown.clone();
        operator
            .tasks
            .spawn(crate::guard::report::run(client, unreadable, stop));
        if let (Some(config), Some(share)) = (sharing, share) {
            tracing::info!(ring = %config.ring, namespace = %config.namespace, identity = %config.identity, "automatic sharding: sharing the resources with the ring's other replicas");
            let sharing = Sharing::new(
                operator.engine.client().clone(),
                config,
                share,
                metrics.clone(),
            );
            let (stop, lost) = (operator.shutdown.clone(), operator.lost.clone());
            operator.tasks.spawn(sharing.run(stop, lost));
        }
        operator.spawn_controllers(controllers, leader);
        operator.spawn_services(args);
        if let (Some(addr), Some(webhook)) = (args.conversion_webhook_addr, webhook) {
            operator.spawn_webhook(addr, webhook, following)?;
        }
        metrics.set_ready(true);
        Ok(operator)
    }

    /// Starts the controllers: at once, or once this replica leads.
    fn spawn_controllers(&mut self, controllers: Controllers, leader: Option<LeaderConfig>) {
        match leader {
            None => {
                self.metrics.set_leading(true);
                let mut running = controllers.start(&self.shutdown);
                let lost = self.lost.clone();
                self.tasks.spawn(async move {
                    tokio::select! {
                        () = async { while running.join_next().await.is_some() {} } => return,
                        () = lost.cancelled() => {}
                    }
                    // Automatic sharding could not renew this replica's
                    // Lease: its share may be another's soon, so its
                    // reconciles stop at once (dropped, their kubectl killed).
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                });
            }
            Some(config) => {
                tracing::info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "leader election: waiting for the lease before starting the controllers");
                let elector = LeaderElector::new(self.engine.client().clone(), config);
                self.tasks.spawn(lead(
                    elector,
                    controllers,
                    self.shutdown.clone(),
                    self.lost.clone(),
                ));
            }
        }
    }

    /// Starts the conversion webhook's endpoint on `addr`, the renewal of
    /// its certificate, and the following of the CRDs of the definitions
    /// served (`following`), from which it answers.
    fn spawn_webhook(
        &mut self,
        addr: SocketAddr,
        start: WebhookStart,
        following: Option<crate::conversion::Following>,
    ) -> Result<(), StartError> {
        let WebhookStart {
            webhook,
            certificate,
            renewing,
        } = start;
        let serving = crate::conversion::server::ServingCertificate::new(&certificate)
            .map(Arc::new)
            .map_err(|e| StartError::Webhook(e.to_string()))?;
        if let Some(renewing) = renewing {
            let renewed = crate::conversion::renew::renew(
                renewing,
                webhook.clone(),
                serving.clone(),
                certificate,
            );
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = renewed => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        let token = self.shutdown.clone();
        let conversions = webhook.conversions.clone();
        tracing::info!(%addr, endpoint = ?webhook.endpoint, "conversion webhook: serving");
        if let Some(following) = following {
            let client = self.engine.client().clone();
            let filed = conversions.clone();
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = crate::conversion::follow(client, filed, following) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        self.tasks.spawn(async move {
            let drained = token.clone();
            let stop = async move {
                drained.cancelled().await;
                tokio::time::sleep(WEBHOOK_DRAIN).await;
            };
            let serving = crate::conversion::server::serve(addr, serving, conversions, stop);
            tokio::select! {
                result = serving => {
                    if let Err(e) = result {
                        tracing::error!(%addr, error = %e, "conversion webhook failed");
                    }
                }
                () = async {
                    token.cancelled().await;
                    tokio::time::sleep(WEBHOOK_DRAIN + WEBHOOK_CLOSE).await;
                } => tracing::warn!("conversion webhook: connections still open at shutdown, dropped"),
            }
        });
        Ok(())
    }

    /// Starts the metrics endpoint, the forgetting of expired entries and
    /// (without jemalloc) the memory trimmer.
    fn spawn_services(&mut self, args: &RunArgs) {
        if let Some(addr) = args.metrics_addr.0 {
            let metrics = self.metrics.clone();
            let token = self.shutdown.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    result = crate::metrics::serve(addr, metrics) => {
                        if let Err(e) = result {
                            tracing::error!(%addr, error = %e, "metrics endpoint failed");
                        }
                    }
                    () = token.cancelled() => {}
                }
            });
        }
        let engine = self.engine.clone();
        self.tasks.spawn(crate::memory::every(
            crate::engine::host::FORGET_EVERY,
            self.shutdown.clone(),
            move || engine.forget_expired(),
        ));
        // jemalloc (the binary's allocator by default) hands freed pages
        // back by itself; glibc is trimmed.
        #[cfg(not(feature = "jemalloc"))]
        self.tasks.spawn(crate::memory::every(
            crate::memory::TRIM_INTERVAL,
            self.shutdown.clone(),
            crate::memory::release_free_memory,
        ));
    }

    /// The kinds whose controllers run.
    pub fn kinds(&self) -> &[String] {
        &self.kinds
    }

    /// kubectl run counters (spawned, failed, timed out, waiting, running).
    pub fn kubectl_stats(&self) -> &KubectlStats {
        self.engine.kubectl().stats()
    }

    /// The operator's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Resolves when this replica lost the leader Lease (its controllers are
    /// then stopping); the process should exit so that it restarts as a candidate.
    pub async fn lost_leadership(&self) {
        self.lost.cancelled().await;
    }

    /// Asks every controller to stop after its running reconciles finish.
    pub fn shutdown(&self) {
        self.metrics.set_ready(false);
        self.shutdown.cancel();
    }

    /// Waits until every task stopped, then removes the work directory.
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
        self.work_dir.remove();
    }

    /// Shuts down and waits.
    pub async fn stop(self) {
        self.shutdown();
        self.wait().await;
    }

    /// Shuts down within `grace`: running reconciles may finish; near the end
    /// of the grace period kubectl runs still going are killed, so their
    /// reconciles record the kill in status before the process exits.
    /// Returns false if some task was still running at the deadline.
    pub async fn stop_within(self, grace: std::time::Duration) -> bool {
        let kubectl = self.engine.kubectl().clone();
        let for_recording = grace.mul_f64(0.2).min(std::time::Duration::from_secs(5));
        self.shutdown();
        let wait = self.wait();
        tokio::pin!(wait);
        if tokio::time::timeout(grace.saturating_sub(for_recording), &mut wait)
            .await
            .is_ok()
        {
            return true;
        }
        tracing::warn!("grace period nearly over: killing running kubectl processes");
        kubectl.kill_all();
        tokio::time::timeout(for_recording, wait).await.is_ok()
    }
}

/// The controllers to run: one per Rust kind, one dynamic controller for
/// every declared kind (the folders' and the definitions'), and the one
/// serving kind definitions.
struct Controllers {
    kinds: Vec<Kind>,
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    options: KindOptions,
    definitions: Option<crate::definitions::Config>,
}

impl Controllers {
    /// Starts one task per Rust kind and one for the declared kinds; each
    /// stops when `token` is cancelled.
    fn start(&self, token: &CancellationToken) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let declared: Vec<_> = self
            .kinds
            .iter()
            .filter_map(Kind::declared)
            .cloned()
            .collect();
        if !declared.is_empty() || self.definitions.is_some() {
            let dynamic = Arc::new(Dynamic::<DeclaredHandler>::new(self.engine.clone()));
            if let Some(config) = self.definitions.clone() {
                let engine = self.engine.clone();
                let token = token.clone();
                set.spawn(crate::definitions::serve(
                    engine,
                    dynamic.clone(),
                    config,
                    token,
                ));
            }
            let metrics = self.metrics.clone();
            let token = token.clone();
            set.spawn(async move {
                for kind in declared {
                    tracing::info!(kind = kind.name(), "serving");
                    dynamic.serve(DeclaredHandler::new(kind), None).await;
                }
                dynamic.run(token.clone().cancelled_owned()).await;
                if !token.is_cancelled() {
                    tracing::error!("the controller of the declared kinds stopped unexpectedly");
                    metrics.controller_stopped("declared kinds");
                }
            });
        }
        for kind in self.kinds.iter().filter(|k| k.declared().is_none()) {
            let kind = kind.clone();
            let engine = self.engine.clone();
            let token = token.clone();
            let options = self.options.clone();
            let metrics = self.metrics.clone();
            set.spawn(async move {
                tracing::info!(kind = %kind, "controller started");
                kind.run(engine, &options, token.clone().cancelled_owned())
                    .await;
                if token.is_cancelled() {
                    tracing::info!(kind = %kind, "controller stopped");
                } else {
                    tracing::error!(kind = %kind, "controller stopped unexpectedly");
                    metrics.controller_stopped(kind.name());
                }
            });
        }
        set
    }
}

/// Leader election around the controllers: wait for the Lease, run the
/// controllers while renewing it; on shutdown stop them, keep renewing until
/// their running reconciles finished, then release the Lease; on loss abort
/// them and cancel `lost`.
async fn lead(
    mut elector: LeaderElector,
    controllers: Controllers,
    shutdown: CancellationToken,
    lost: CancellationToken,
) {
    let metrics = controllers.metrics.clone();
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.cancelled() => return,
    }
    metrics.set_leading(true);
    let token = shutdown.child_token();
    let mut running = controllers.start(&token);
    let lost_reason = tokio::select! {
        reason = elector.hold() => Some(reason),
        () = shutdown.cancelled() => None,
    };
    token.cancel();
    if let Some(reason) = lost_reason {
        // Another replica may lead already: abort at once rather than let
        // running reconciles finish (dropping them kills their kubectl).
        tracing::error!(%reason, "lost the leader lease: aborting the controllers");
        metrics.set_leading(false);
        running.abort_all();
        while running.join_next().await.is_some() {}
        lost.cancel();
        return;
    }
    // Shutting down: the Lease stays ours until the running reconciles are done.
    let mut renewing = true;
    let drained = async { while running.join_next().await.is_some() {} };
    tokio::pin!(drained);
    loop {
        tokio::select! {
            () = &mut drained => break,
            reason = elector.hold(), if renewing => {
                tracing::warn!(%reason, "lost the leader lease while stopping");
                renewing = false;
            }
        }
    }
    metrics.set_leading(false);
    let deadline = elector.config().renew_deadline;
    match tokio::time::timeout(deadline, elector.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %crate::error_text::kube(&e), "cannot release the leader lease")
        }
        Err(_) => tracing::warn!("releasing the leader lease timed out"),
    }
}

/// How long reconciles may run with none finishing before `/healthz`
/// fails: one reconcile runs up to three kubectl commands (build, apply,
/// prune), each within `kubectl_timeout`, after waiting for a slot that
/// another such run frees; and reads its objects' CEL within its
/// deadline.
fn stall_bound(kubectl_timeout: Duration) -> Duration {
    kubectl_timeout.saturating_mul(4) + crate::kinds::declared::evaluation::DEADLINE
}

fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

/// The clients of the cluster, and what their guard leaves out.
struct Connected {
    /// For every request.
    client: kube::Client,
    /// For the watches of the resources served: with a share
    /// (`--auto-shard`), their lists and watches name it; else `client`.
    reader: kube::Client,
    guard: Arc<Guard>,
    unreadable: crate::guard::report::Reports,
}

/// A client for the cluster in KUBECONFIG (or in-cluster), checked to
/// answer, with at most `max_requests` requests in flight (HTTP/1.1 needs a
/// connection per request, and each idle connection costs memory), whose
/// responses pass the guard (`crate::guard`): the objects it leaves out are
/// counted in `metrics` and queued in the reports returned. With a share
/// (`--auto-shard`), a second client under the same limit and guard reads
/// the watched resources naming it: every other read (a count, a
/// migration, a rollout's gate) sees the whole kind.
async fn connect(
    max_requests: u16,
    metrics: &Arc<Metrics>,
    share: Option<Arc<Share>>,
) -> Result<Connected, StartError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| StartError::Config(kube::Error::InferConfig(e)))?;
    let (sink, unreadable) = crate::guard::report::channel();
    let counted = metrics.clone();
    let guard = Guard::new(move |skipped| {
        counted.unreadable(&skipped.identity.kind, &skipped.reason);
        sink.send(skipped);
    });
    let limit = tower::limit::GlobalConcurrencyLimitLayer::new(usize::from(max_requests));
    let builder = || {
        kube::client::ClientBuilder::try_from(config.clone())
            .map_err(StartError::Config)
            .map(|b| b.with_layer(&guard.layer()).with_layer(&limit))
    };
    let client = builder()?.build();
    let reader = match share {
        Some(share) => builder()?
            .with_layer(&crate::sharding::selector::SelectorLayer::new(Some(share)))
            .build(),
        None => client.clone(),
    };
    let version = (client.apiserver_version().await).map_err(StartError::Connect)?;
    if crate::support_range::check(&version)? == crate::support_range::Standing::Newer {
        tracing::warn!(
            version = %version.git_version,
            "the API server runs a Kubernetes newer than this operator was tested with (1.{} to 1.{})",
            crate::support_range::OLDEST_MINOR,
            crate::support_range::NEWEST_MINOR
        );
    }
    Ok(Connected {
        client,
        reader,
        guard,
        unreadable,
    })
}

/// How long the conversion webhook goes on answering once the operator
/// shuts down: the API server may still send reviews to this replica
/// until its Service's endpoints and every node's routes have dropped it
/// (a second or two), and every list of a kind at another version would
/// fail meanwhile.
const WEBHOOK_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the reviews under way may then take before their connections
/// are dropped.
const WEBHOOK_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// The conversion webhook the command line asks for, with the
/// certificate it serves for the host the API server calls: the one every
/// replica shares (a Secret of the operator's namespace), or, for an
/// operator run without a namespace of its own, one made now.
async fn conversion_webhook(
    args: &RunArgs,
    client: &kube::Client,
) -> Result<Option<WebhookStart>, StartError> {
    if args.conversion_webhook_addr.is_none() {
        return Ok(None);
    }
    let endpoint = (args.conversion_webhook_url.clone())
        .or_else(|| args.conversion_webhook_service.clone())
        .ok_or_else(|| {
            StartError::Webhook(
                "--conversion-webhook-addr needs --conversion-webhook-url or --conversion-webhook-service: where the API server calls it".into(),
            )
        })?;
    let hosts = endpoint.hosts();
    let renewal = crate::conversion::certificate::Renewal {
        promote_after: args.conversion_webhook_promote_after,
        ..Default::default()
    };
    let renewing = (args.common.operator_namespace.clone()).map(|namespace| Renewing {
        client: client.clone(),
        namespace,
        secret: args.conversion_webhook_secret.clone(),
        hosts: hosts.clone(),
        renewal,
        check: args.conversion_webhook_check,
        label: crate::definitions::resource::MARKER_LABEL.to_string(),
    });
    let certificate = match &renewing {
        Some(r) => {
            let shared = crate::conversion::certificate::shared;
            shared(client, &r.namespace, &r.secret, &hosts, &renewal).await
        }
        None => crate::conversion::certificate::make(&hosts),
    }
    .map_err(|e| StartError::Webhook(e.to_string()))?;
    let webhook = Webhook::new(endpoint, certificate.ca_pem.clone(), Arc::default());
    Ok(Some(WebhookStart {
        webhook: Arc::new(webhook),
        certificate,
        renewing,
    }))
}

/// The conversion webhook, as it starts: what the CRDs name, the
/// certificate it serves, and how that is renewed (when it is shared).
struct WebhookStart {
    webhook: Arc<Webhook>,
    certificate: Certificate,
    renewing: Option<Renewing>,
}

/// How `KindDefinition`s are served: `None` when turned off, or when their
/// CRD is not installed (said in the log: the operator serves its folder
/// kinds as before).
async fn definitions_config(
    args: &RunArgs,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    static_kinds: &[Kind],
    webhook: Option<Arc<Webhook>>,
) -> Option<crate::definitions::Config> {
    if !args.serve_kind_definitions {
        return None;
    }
    match crate::definitions::installed(client).await {
        Ok(Served::Yes) => Some(crate::definitions::Config {
            metrics: metrics.clone(),
            selector: args.kind_definition_selector.clone(),
            static_kinds: static_kinds.to_vec(),
            default_service_account: args.default_service_account.clone(),
            isolation: sandbox(args),
            budget: usize::try_from(args.kind_definitions_budget_kib << 10).unwrap_or(usize::MAX),
            webhook,
            // Under automatic sharding, every replica reads the revisions
            // its definitions' writers keep: in the ring's namespace when
            // the operator has none of its own.
            namespace: (args.common.operator_namespace.clone()).or_else(|| {
                args.auto_shard
                    .then(|| args.leader_elect_namespace.clone())?
            }),
        }),
        Ok(Served::NotInstalled) => {
            tracing::warn!(
                "the KindDefinition CRD is not installed: kinds defined in the cluster are not served (`kubectl apply -k deploy/crds` installs it)"
            );
            None
        }
        Ok(Served::Forbidden(verb)) => {
            tracing::warn!(
                "the operator's account may not {verb} KindDefinitions: kinds defined in the cluster are not served"
            );
            None
        }
        Err(e) => {
            tracing::warn!(error = %crate::error_text::kube(&e), "cannot list KindDefinitions: kinds defined in the cluster are not served");
            None
        }
    }
}

/// The render workers of defined kinds' templates (`None`, and rendered in
/// process, only when this binary cannot be found again).
fn sandbox(args: &RunArgs) -> Option<Arc<dyn crate::engine::host::Isolation>> {
    let limits = crate::sandbox::Limits {
        time: args.template_timeout,
        memory: args.template_memory_mib << 20,
    };
    let workers = usize::try_from(args.render_workers).unwrap_or(1);
    let exe = match &args.render_worker {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe(),
    };
    match exe.map(|exe| crate::sandbox::Sandbox::new(exe, workers, limits)) {
        Ok(sandbox) => Some(Arc::new(sandbox)),
        Err(e) => {
            tracing::error!(error = %e, "cannot find the operator's binary: defined kinds' templates render in process, without limits");
            None
        }
    }
}

/// Fails, naming the kind file, when a declared kind's base does not build
/// (found now rather than at the first reconcile).
async fn check_bases(engine: &Engine, kinds: &[Kind]) -> Result<(), StartError> {
    for declared in kinds.iter().filter_map(Kind::declared) {
        engine
            .build_base(None, declared.name())
            .await
            .map_err(|failure| StartError::Base {
                file: declared.path.clone(),
                reason: failure.to_string(),
            })?;
    }
    Ok(())
}

/// The user name the API server knows the operator's client as (a
/// SelfSubjectReview), for messages; `unknown` when it cannot tell.
async fn whoami(client: &kube::Client) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = SelfSubjectReview::default();
    kube::Api::<SelfSubjectReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .unwrap_or_else(|| "unknown".to_string())
}

/// Fails, naming them, when the CRDs of some of `kinds` are not installed,
/// or when the operator may not list and watch their resources. Every
/// kind with a Rust type has `guard` check the shape of what it reads.
async fn check_crds(
    client: &kube::Client,
    guard: &crate::guard::Guard,
    kinds: &[Kind],
    namespace: Option<&str>,
) -> Result<(), StartError> {
    let mut missing = Vec::new();
    let mut forbidden = Vec::new();
    for kind in kinds {
        let crd = kind.crd();
        let name = crd.metadata.name.unwrap_or_default();
        match kind
            .served(client, namespace)
            .await
            .map_err(StartError::Connect)?
        {
            Served::Yes => kind.check_shape(guard),
            Served::NotInstalled => missing.push(name),
            Served::Forbidden(verb) => forbidden.push(format!("{verb} {name}")),
        }
    }
    if !missing.is_empty() {
        Err(StartError::MissingCrds(missing))
    } else if !forbidden.is_empty() {
        Err(StartError::Forbidden {
            account: whoami(client).await,
            missing: forbidden,
            namespace: namespace.map(str::to_string),
        })
    } else {
        Ok(())
    }
}

fn kubectl(args: &RunArgs, path: PathBuf, base_dir: &Path, metrics: &Arc<Metrics>) -> Kubectl {
    let observer_metrics = metrics.clone();
    let kubectl = Kubectl::new(KubectlConfig {
        path,
        timeout: args.kubectl_timeout,
        max_concurrent: args
            .max_concurrent_kubectl
            .unwrap_or_else(default_concurrency),
        cache_dir: Some(base_dir.join("kubectl-cache")),
        output_cap: OUTPUT_LIMIT * 4,
    })
    .with_observer(Arc::new(move |verb, code, duration| {
        observer_metrics.kubectl_run(verb, code, duration);
    }));
    metrics.attach_kubectl(kubectl.shared_stats());
    // What a run before this one cached may be hours old (a CRD deleted
    // and created again meanwhile): kubectl asks the API server afresh.
    kubectl.forget_all_discovery();
    match in_cluster_kubeconfig(base_dir) {
        Ok(Some(kubeconfig)) => kubectl.with_kubeconfig(kubeconfig),
        Ok(None) => kubectl,
        Err(e) => {
            tracing::warn!(error = %e, "cannot write kubectl's in-cluster kubeconfig: kubectl --as will not reach the API server");
            kubectl
        }
    }
}

fn settings(args: &RunArgs, work_dir: PathBuf, share: Option<Arc<Share>>) -> Settings {
    Settings {
        resync_interval: args.resync_interval,
        health_timeout: args.health_timeout,
        keep_overlays: args.keep_overlays.clone(),
        work_dir,
        namespace: args.namespace.clone(),
        shard: args.shard.clone(),
        share,
        reporter: match &args.shard {
            Some(shard) => format!("kustomize-operator-{shard}"),
            None => "kustomize-operator".into(),
        },
        batch: BatchSettings {
            window: args.batch_window,
            max: args.batch_max,
        },
        max_reconciles: args.max_concurrent_reconciles,
        default_service_account: args.default_service_account.clone(),
        cluster_service_account: args.cluster_service_account.clone(),
        operator_namespace: args.common.operator_namespace.clone(),
    }
}

/// This operator's private work directory, `<base>/run-<pid>-<n>`, locked
/// while the operator runs.
struct WorkDir {
    path: PathBuf,
    _lock: std::fs::File,
}

/// The lock file in each work directory.
const LOCK_FILE: &str = ".lock";

impl WorkDir {
    /// Creates this operator's directory after removing every directory no
    /// running operator holds: whatever an earlier run left (an operator
    /// killed mid-reconcile, or a restarted container, whose PID 1 is the
    /// PID of the one before), Secret data included, is gone before work
    /// starts.
    fn prepare(base: &Path) -> Result<Self, StartError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StartError::WorkDir { path, source }
        };
        std::fs::create_dir_all(base).map_err(err(base))?;
        remove_abandoned(base);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::claim(base) {
                Ok(dir) => return Ok(dir),
                // Another operator's sweep took it between creation and
                // lock (they start together in tests): take another name.
                Err((path, e)) if attempt < CLAIM_ATTEMPTS => {
                    tracing::debug!(dir = %path.display(), error = %e, "work directory taken away while created; trying another");
                }
                Err((path, e)) => return Err(err(&path)(e)),
            }
        }
    }

    /// Creates and locks a new `run-<pid>-<n>` under `base`.
    fn claim(base: &Path) -> Result<Self, (PathBuf, std::io::Error)> {
        // One directory per operator instance (tests run several in one process).
        static INSTANCE: AtomicU32 = AtomicU32::new(0);
        let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("run-{}-{instance}", std::process::id()));
        let failed = |e| (path.clone(), e);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(failed)?;
        let lock = std::fs::File::create(path.join(LOCK_FILE)).map_err(failed)?;
        lock.try_lock()
            .map_err(|e| failed(std::io::Error::other(e.to_string())))?;
        // A sweep that locked it first may have removed it before letting go.
        if !still_linked(&lock, &path.join(LOCK_FILE)) {
            return Err(failed(std::io::Error::other(
                "removed by another operator's sweep",
            )));
        }
        Ok(Self { path, _lock: lock })
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the `run-*` directories under `base` whose lock nobody holds.
/// The sweep holds each lock while it removes the directory, so an
/// operator creating its own directory at the same time either gets the
/// lock first (and keeps the directory) or fails to and takes another
/// name. A directory without a lock file is removed only once it is a
/// minute old: a younger one may be being created.
fn remove_abandoned(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("run-") {
            continue;
        }
        // Held until the directory is gone.
        let _lock = match std::fs::File::open(entry.path().join(LOCK_FILE)) {
            Ok(lock) if lock.try_lock().is_ok() => Some(lock),
            Ok(_) => continue,
            Err(_) if older_than(&entry.path(), UNLOCKED_GRACE) => None,
            Err(_) => continue,
        };
        tracing::info!(dir = %entry.path().display(), "removing the work directory of an operator that is gone");
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// How old a `run-*` directory without a lock file must be to be removed.
const UNLOCKED_GRACE: Duration = Duration::from_secs(60);
/// Tries at creating this operator's work directory.
const CLAIM_ATTEMPTS: u32 = 5;

/// True when `path` is still the file `file` has open.
fn still_linked(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(linked)) => open.dev() == linked.dev() && open.ino() == linked.ino(),
        _ => false,
    }
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn run_args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["kustomize-operator", "run"];
        full.extend_from_slice(argv);
        match crate::cli::Cli::try_parse_from(full).unwrap().command {
            crate::cli::Command::Run(args) => *args,
            _ => unreachable!(),
        }
    }

    #[test]
    fn leader_election_settings_are_checked_before_connecting() {
        assert_eq!(leader_config(&run_args(&[])).unwrap(), None);
        assert!(matches!(
            leader_config(&run_args(&["--leader-elect"])),
            Err(StartError::LeaseNamespace)
        ));
        let config = leader_config(&run_args(&[
            "--leader-elect",
            "--operator-namespace",
            "ops",
            "--leader-elect-identity",
            "pod-1",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (config.namespace.as_str(), config.identity.as_str()),
            ("ops", "pod-1")
        );
        assert_eq!(config.lease_name, "kustomize-operator");
        let shard = leader_config(&run_args(&[
            "--leader-elect",
            "--operator-namespace",
            "ops",
            "--shard",
            "b",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            shard.lease_name, "kustomize-operator-b",
            "each shard its own Lease"
        );
        let explicit = leader_config(&run_args(&[
            "--leader-elect",
            "--operator-namespace",
            "ops",
            "--leader-elect-namespace",
            "elsewhere",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(explicit.namespace, "elsewhere");
        assert!(matches!(
            leader_config(&run_args(&[
                "--leader-elect",
                "--leader-elect-namespace",
                "ops",
                "--leader-elect-renew-deadline",
                "20s",
            ])),
            Err(StartError::LeaderElection(_))
        ));
    }

    #[test]
    fn operators_starting_together_each_keep_their_work_dir() {
        let base = tempfile::tempdir().unwrap();
        for _ in 0..20 {
            let dirs: Vec<WorkDir> = std::thread::scope(|scope| {
                let starts: Vec<_> = (0..8)
                    .map(|_| scope.spawn(|| WorkDir::prepare(base.path())))
                    .collect();
                starts
                    .into_iter()
                    .map(|s| s.join().unwrap().unwrap())
                    .collect()
            });
            for dir in &dirs {
                assert!(
                    dir.path.join(LOCK_FILE).exists(),
                    "{} was swept",
                    dir.path.display()
                );
            }
        }
    }

    #[test]
    fn work_dirs_nobody_holds_are_removed_and_held_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        // Left by a restarted container: same PID, lock not held.
        let abandoned = base.path().join(format!("run-{}-99", std::process::id()));
        std::fs::create_dir_all(abandoned.join("build-x")).unwrap();
        std::fs::write(abandoned.join(LOCK_FILE), "").unwrap();
        // An older layout without a lock file.
        let old = base.path().join("run-4000000000-0");
        std::fs::create_dir_all(&old).unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::open(&old)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        // One being created right now: no lock file yet.
        let young = base.path().join("run-4000000001-0");
        std::fs::create_dir_all(&young).unwrap();
        let live = WorkDir::prepare(base.path()).unwrap();
        assert!(!abandoned.exists());
        assert!(!old.exists());
        assert!(young.exists(), "may be being created");
        let second = WorkDir::prepare(base.path()).unwrap();
        assert!(live.path.exists(), "held by a running operator");
        assert_ne!(live.path, second.path);
        drop(live);
        let _third = WorkDir::prepare(base.path()).unwrap();
        assert!(second.path.exists());
    }
}
