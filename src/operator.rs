//! Starting and stopping the operator: checks, the engine, one controller per
//! kind, the metrics endpoint. Used by `run` and by the integration tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::RunArgs;
use crate::controller::{Engine, Settings};
use crate::kinds::{KindName, KindOptions};
use crate::kubectl::{Kubectl, KubectlConfig, KubectlError};
use crate::leader::{LeaderConfig, LeaderConfigError, LeaderElector};
use crate::metrics::Metrics;
use crate::status::OUTPUT_LIMIT;
use crate::templates::{KustomizeDir, TemplateError};

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// kubectl is missing or not executable.
    #[error(transparent)]
    Kubectl(#[from] KubectlError),
    /// The kustomize directory is missing or a template is broken.
    #[error(transparent)]
    Templates(#[from] TemplateError),
    /// No usable cluster configuration.
    #[error("cannot configure a Kubernetes client (KUBECONFIG or in-cluster): {0}")]
    Config(#[source] kube::Error),
    /// The API server could not be reached.
    #[error("cannot reach the Kubernetes API server: {0}")]
    Connect(#[source] kube::Error),
    /// Some CRDs are not installed.
    #[error(
        "CRDs not installed for: {}; install them with `kubectl apply -k deploy/crds` (or `kustomize-operator crd | kubectl apply -f -`)",
        .0.join(", ")
    )]
    MissingCrds(Vec<String>),
    /// Leader election is asked for but cannot work as configured.
    #[error("leader election: {0}")]
    LeaderElection(#[from] LeaderConfigError),
    /// Leader election is asked for without a namespace for its Lease.
    #[error(
        "--leader-elect needs a namespace for its Lease: set NAMESPACE (the downward API does in the Deployment) or --leader-elect-namespace"
    )]
    LeaseNamespace,
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
    /// The shared engine (kubectl stats, metrics, client).
    pub engine: Arc<Engine>,
    shutdown: CancellationToken,
    lost: CancellationToken,
    tasks: JoinSet<()>,
    work_dir: PathBuf,
}

/// The leader election settings from the command line, checked; None without `--leader-elect`.
pub fn leader_config(args: &RunArgs) -> Result<Option<LeaderConfig>, StartError> {
    if !args.leader_elect {
        return Ok(None);
    }
    let namespace = args
        .leader_elect_namespace
        .clone()
        .or_else(|| args.operator_namespace.clone())
        .filter(|ns| !ns.is_empty())
        .ok_or(StartError::LeaseNamespace)?;
    let config = LeaderConfig {
        lease_name: args.leader_elect_lease_name.clone(),
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
        let kubectl_path = KubectlConfig::locate(args.kubectl.as_deref())?;
        let templates = Arc::new(KustomizeDir::load(&args.common.kustomize_dir)?);
        let config = kube::Config::infer()
            .await
            .map_err(|e| StartError::Config(kube::Error::InferConfig(e)))?;
        let client = kube::Client::try_from(config).map_err(StartError::Config)?;
        client
            .apiserver_version()
            .await
            .map_err(StartError::Connect)?;

        let kinds = args.selected_kinds();
        let mut missing = Vec::new();
        for kind in &kinds {
            let installed = kind
                .is_installed(&client, args.namespace.as_deref())
                .await
                .map_err(StartError::Connect)?;
            if !installed {
                missing.push(kind.crd().metadata.name.unwrap_or_default());
            }
        }
        if !missing.is_empty() {
            return Err(StartError::MissingCrds(missing));
        }

        let base_dir = args
            .work_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("kustomize-operator"));
        let work_dir = prepare_work_dir(&base_dir)?;
        let metrics = Arc::new(Metrics::new());
        let observer_metrics = metrics.clone();
        let kubectl = Kubectl::new(KubectlConfig {
            path: kubectl_path,
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
        let engine = Arc::new(Engine::new(
            client,
            kubectl,
            templates,
            Settings {
                resync_interval: args.resync_interval,
                keep_overlays: args.keep_overlays.clone(),
                work_dir: work_dir.clone(),
                namespace: args.namespace.clone(),
                reporter: "kustomize-operator".into(),
                concurrency: 0,
                batch: Some(crate::batch::BatchSettings {
                    window: args.batch_window,
                    max: args.batch_max,
                }),
            },
            metrics.clone(),
        ));

        let shutdown = CancellationToken::new();
        let lost = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let options = KindOptions {
            operator_namespace: args.operator_namespace.clone(),
            exchange_rate: args.exchange_rate.options(),
            watch_namespace: args.namespace.clone(),
            copyrator_namespace_selector: args.copyrator_namespace_selector.clone(),
            copyrator_namespaces: args.copyrator_namespaces.clone(),
        };
        let controllers = Controllers {
            kinds,
            engine: engine.clone(),
            options,
        };
        match leader {
            None => {
                metrics.set_leading(true);
                let mut running = controllers.start(&shutdown);
                tasks.spawn(async move { while running.join_next().await.is_some() {} });
            }
            Some(config) => {
                tracing::info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "leader election: waiting for the lease before starting the controllers");
                let elector = LeaderElector::new(engine.client.clone(), config);
                tasks.spawn(lead(elector, controllers, shutdown.clone(), lost.clone()));
            }
        }
        if let Some(addr) = args.metrics_addr.0 {
            let metrics = metrics.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
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
        tasks.spawn(crate::memory::trim_until(
            crate::memory::TRIM_INTERVAL,
            shutdown.clone(),
        ));
        metrics.set_ready(true);
        Ok(Self {
            engine,
            shutdown,
            lost,
            tasks,
            work_dir,
        })
    }

    /// Resolves when this replica lost the leader Lease (its controllers are
    /// then stopping); the process should exit so that it restarts as a candidate.
    pub async fn lost_leadership(&self) {
        self.lost.cancelled().await;
    }

    /// Asks every controller to stop after its running reconciles finish.
    pub fn shutdown(&self) {
        self.engine.metrics.set_ready(false);
        self.shutdown.cancel();
    }

    /// Waits until every task stopped, then removes the work directory.
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
        let _ = std::fs::remove_dir_all(&self.work_dir);
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
        let kubectl = self.engine.kubectl.clone();
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

/// The controllers to run, one per kind.
struct Controllers {
    kinds: Vec<KindName>,
    engine: Arc<Engine>,
    options: KindOptions,
}

impl Controllers {
    /// Starts one task per kind; each stops when `token` is cancelled.
    fn start(&self, token: &CancellationToken) -> JoinSet<()> {
        let mut set = JoinSet::new();
        for &kind in &self.kinds {
            let engine = self.engine.clone();
            let token = token.clone();
            let options = self.options.clone();
            set.spawn(async move {
                tracing::info!(kind = %kind, "controller started");
                kind.run(engine, &options, token.cancelled_owned()).await;
                tracing::info!(kind = %kind, "controller stopped");
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
    let metrics = controllers.engine.metrics.clone();
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
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot release the leader lease"),
        Err(_) => tracing::warn!("releasing the leader lease timed out"),
    }
}

fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

/// Creates `<base>/run-<pid>` and removes directories left by processes that
/// are gone (an operator killed mid-reconcile leaves its overlays behind).
fn prepare_work_dir(base: &Path) -> Result<PathBuf, StartError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StartError::WorkDir { path, source }
    };
    std::fs::create_dir_all(base).map_err(err(base))?;
    if let Ok(entries) = std::fs::read_dir(base) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("run-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                tracing::info!(dir = %entry.path().display(), "removing work directory of a stopped operator");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    // One directory per operator instance (tests run several in one process).
    static INSTANCE: AtomicU32 = AtomicU32::new(0);
    let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("run-{}-{instance}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(err(&dir))?;
    Ok(dir)
}

/// The kinds known to this build, for messages.
pub fn known_kinds() -> Vec<&'static str> {
    KindName::ALL.iter().map(|k| k.as_str()).collect()
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
    fn stale_work_dirs_are_removed_and_live_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        let stale = base.path().join("run-4000000000-0");
        let live = base.path().join("run-1-0");
        std::fs::create_dir_all(stale.join("overlay-x")).unwrap();
        std::fs::create_dir_all(&live).unwrap();
        let dir = prepare_work_dir(base.path()).unwrap();
        assert!(!stale.exists());
        assert!(live.exists());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("run-{}-", std::process::id())),
            "{name}"
        );
    }
}
