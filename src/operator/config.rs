//! The command line turned into the operator's settings: leader election,
//! automatic sharding, the engine's settings, kubectl, the sandbox, the
//! KindDefinitions served.

use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::StartError;
use crate::cli::RunArgs;
use crate::conversion::Webhook;
use crate::engine::host::Settings;
use crate::kind::Sandbox;
use crate::kinds::Availability;
use crate::kinds::registry::Kind;
use crate::kubectl::Kubectl;
use crate::kubectl::in_cluster_kubeconfig;
use crate::kubectl::{KubectlConfig, RUN_OUTPUT_CAP};
use crate::leader::LeaderConfig;
use crate::metrics::Metrics;
use crate::partition::share::Share;
use crate::sharding::SharingConfig;

/// The Lease's name: as given, or, for a shard left with the default name,
/// the default with the shard's (each shard elects its own leader).
pub(super) fn lease_name(args: &RunArgs) -> String {
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

/// How long reconciles may run with none finishing before `/healthz`
/// fails: one reconcile runs up to three kubectl commands (build, apply,
/// prune), each within `kubectl_timeout`, after waiting for a slot that
/// another such run frees; and reads its objects' CEL within its
/// deadline.
pub(super) fn stall_bound(kubectl_timeout: Duration) -> Duration {
    kubectl_timeout.saturating_mul(4) + crate::kinds::declared::evaluation::DEADLINE
}

pub(super) fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

/// How `KindDefinition`s are served: `None` when turned off, or when their
/// CRD is not installed (said in the log: the operator serves its folder
/// kinds as before).
pub(super) async fn definitions_config(
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
        Ok(Availability::Yes) => Some(crate::definitions::Config {
            metrics: metrics.clone(),
            selector: args.kind_definition_selector.clone(),
            static_kinds: static_kinds.to_vec(),
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
        Ok(Availability::NotInstalled) => {
            tracing::warn!(
                "the KindDefinition CRD is not installed: kinds defined in the cluster are not served (`kubectl apply -k deploy/crds` installs it)"
            );
            None
        }
        Ok(Availability::Forbidden(verb)) => {
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
pub(super) fn sandbox(args: &RunArgs) -> Option<Arc<Sandbox>> {
    let (time, memory) = (args.template_timeout, args.template_memory_mib << 20);
    let workers = usize::try_from(args.render_workers).unwrap_or(1);
    let exe = match &args.render_worker {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe(),
    };
    match exe.map(|exe| Sandbox::new(exe, workers, time, memory)) {
        Ok(sandbox) => Some(Arc::new(sandbox)),
        Err(e) => {
            tracing::error!(error = %e, "cannot find the operator's binary: defined kinds' templates render in process, without limits");
            None
        }
    }
}

pub(super) fn kubectl(
    args: &RunArgs,
    path: PathBuf,
    base_dir: &Path,
    metrics: &Arc<Metrics>,
) -> Kubectl {
    let observer_metrics = metrics.clone();
    let kubectl = Kubectl::new(KubectlConfig {
        path,
        timeout: args.kubectl_timeout,
        max_concurrent: args
            .max_concurrent_kubectl
            .unwrap_or_else(default_concurrency),
        cache_dir: Some(base_dir.join("kubectl-cache")),
        output_cap: RUN_OUTPUT_CAP,
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

pub(super) fn settings(args: &RunArgs, work_dir: PathBuf, share: Option<Arc<Share>>) -> Settings {
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
        batch_window: args.batch_window,
        batch_max: args.batch_max,
        max_reconciles: args.max_concurrent_reconciles,
        default_service_account: args.default_service_account.clone(),
        cluster_service_account: args.cluster_service_account.clone(),
        operator_namespace: args.common.operator_namespace.clone(),
    }
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
}
