//! Starting and stopping the operator: the engine, the controllers, the
//! metrics endpoint. Used by `run` and by the integration tests.
//!
//! - `config`: the command line turned into settings;
//! - `checks`: connecting, and what is checked before anything starts;
//! - `controllers`: the controllers, at once or under leader election;
//! - `webhook`: the conversion webhook;
//! - `work_dir`: the operator's private work directory.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::{KindsError, RunArgs};
use crate::engine::host::Engine;
use crate::kubectl::{KubectlConfig, KubectlError, KubectlStats};
use crate::leader::{LeaderConfig, LeaderConfigError, LeaderElector};
use crate::metrics::Metrics;
use crate::partition::share::Share;
use crate::sharding::Sharing;

mod checks;
mod config;
mod connection;
mod controllers;
mod webhook;
mod work_dir;

use checks::{Connected, check_bases, check_crds, connect};
use config::{definitions_config, kubectl, settings, stall_bound};
pub use config::{leader_config, sharing_config};
use controllers::{Controllers, lead};
use webhook::conversion_webhook;
use work_dir::WorkDir;

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

impl Operator {
    /// Checks prerequisites and starts the runtime serving the selected kinds.
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
        let stop = self.shutdown.clone();
        self.tasks
            .spawn(async move { engine.forget_expired_until(stop).await });
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
