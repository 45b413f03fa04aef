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
    tasks: JoinSet<()>,
    work_dir: PathBuf,
}

impl Operator {
    /// Checks prerequisites and starts one controller per selected kind.
    pub async fn start(args: &RunArgs) -> Result<Self, StartError> {
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
            },
            metrics.clone(),
        ));

        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let options = KindOptions {
            operator_namespace: args.operator_namespace.clone(),
            copyrator_namespace_selector: args.copyrator_namespace_selector.clone(),
        };
        for kind in kinds {
            let engine = engine.clone();
            let token = shutdown.clone();
            let options = options.clone();
            tasks.spawn(async move {
                tracing::info!(kind = %kind, "controller started");
                kind.run(engine, &options, token.cancelled_owned()).await;
                tracing::info!(kind = %kind, "controller stopped");
            });
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
        metrics.set_ready(true);
        Ok(Self {
            engine,
            shutdown,
            tasks,
            work_dir,
        })
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
