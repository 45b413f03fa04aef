//! Command-line interface: `run`, `render`, `diff`, `plan`, `crd`, `rbac`, `kind`. Every flag can
//! also be set through the environment variable named in its help.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::conversion::Endpoint;
use crate::duration::parse_duration;
use crate::kind::{KustomizeDir, TemplateError};
use crate::kinds::declared::pack::{self, PackError};
use crate::kinds::registry::{Registry, RegistryError};
use crate::kinds::{KindContext, KindFlags, KindOptions};
use crate::names::ServiceAccount;
use crate::partition::shard;
use crate::source::{ResourceRef, Source};

/// The Lease's default name.
pub const DEFAULT_LEASE_NAME: &str = "kustomize-operator";

/// A Kubernetes operator that reconciles custom resources by rendering
/// kustomize overlays and running kubectl.
#[derive(Debug, Parser)]
#[command(name = "kustomize-operator", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Export traces (a span per reconcile and per kubectl run) to this
    /// OpenTelemetry collector, over OTLP/HTTP: its base URL, such as
    /// `http://otel-collector:4318` (`/v1/traces` is added). Unset: no
    /// export.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
// Parsed once at start-up: the size of `Run` does not matter.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against the cluster in KUBECONFIG (or in-cluster).
    Run(Box<RunArgs>),
    /// Write the overlay `run` would apply for a resource (from a file,
    /// offline, or from the cluster by KIND/NAME), for `kubectl kustomize`.
    Render(RenderArgs),
    /// Show what `run` would change in the cluster now for a resource
    /// (`kubectl diff --server-side`; exit 0 no change, 1 changes, >1 error).
    Diff(DiffArgs),
    /// Plan a changed kind against every resource of it in the cluster:
    /// each one's render now and under the change, a server-side dry run
    /// as the identity that would write it (exit 0 nothing would fail, 1
    /// something would, >1 error).
    Plan(Box<PlanArgs>),
    /// Print every CRD as YAML (or write one file per CRD with --out-dir).
    Crd(CrdArgs),
    /// Print the ClusterRole each declared kind needs (aggregated into the operator's).
    Rbac(RbacArgs),
    /// Pack a kind folder into one KindDefinition, or unpack one.
    #[command(subcommand)]
    Kind(KindCommand),
    /// Show how the replicas of `--auto-shard` share the work: the
    /// members, the slots each holds, and how many resources each owns.
    Shards(ShardsArgs),
}

/// `shards` flags.
#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    /// Where the ring's Leases and table live (the operator's namespace).
    #[arg(
        long,
        short = 'n',
        env = "NAMESPACE",
        default_value = "kustomize-operator-system"
    )]
    pub namespace: String,
    /// The ring's name.
    #[arg(long, default_value = DEFAULT_LEASE_NAME, value_parser = shard::parse_name)]
    pub ring: String,
    /// Where the kinds come from (their resources are counted).
    #[command(flatten)]
    pub dirs: KindsDir,
}

/// `kind pack` / `kind unpack`.
#[derive(Debug, Subcommand)]
pub enum KindCommand {
    /// Print the KindDefinition of a kind folder, its files in `spec.files`.
    Pack {
        /// The kind folder (holding kind.yaml).
        dir: PathBuf,
    },
    /// Write the kind folder of a packed KindDefinition (`-`: standard input).
    Unpack {
        /// The packed definition.
        file: PathBuf,
        /// Where to write the folder (as `<out-dir>/<name>/`).
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
    },
}

/// Where the kinds come from: the kustomize directories.
#[derive(Debug, Clone, Args)]
pub struct KindsDir {
    /// Directories with one folder per kind (base/, patches/, resources/ and,
    /// for a declared kind, kind.yaml); comma-separated, searched in order.
    #[arg(
        long,
        env = "KUSTOMIZE_DIR",
        value_delimiter = ',',
        default_value = "kustomize"
    )]
    pub kustomize_dir: Vec<PathBuf>,
    /// Packed kind definitions (`kind pack`), served as if their folders
    /// were in a kustomize directory; comma-separated.
    #[arg(long, env = "KIND_DEFINITIONS", value_delimiter = ',')]
    pub kind_definition: Vec<PathBuf>,
}

/// Why the kinds could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KindsError {
    /// A kind folder's templates or base are broken.
    #[error(transparent)]
    Templates(#[from] TemplateError),
    /// A packed kind definition cannot be unpacked.
    #[error(transparent)]
    Definition(#[from] PackError),
    /// A kind file is wrong, or `--kinds` names an unknown kind.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl KindsDir {
    /// The kind folders, their templates parsed, and every kind they make
    /// known (besides the built-in ones), each kind file checked.
    /// Packed definitions are unpacked into a private temporary directory,
    /// read with the folders, and removed.
    pub fn load(&self) -> Result<(KustomizeDir, Registry), KindsError> {
        let unpacked = self.unpack_definitions()?;
        let mut roots = self.kustomize_dir.clone();
        roots.extend(unpacked.as_ref().map(|d| d.path().to_path_buf()));
        let dir = KustomizeDir::load_all(&roots)?;
        let registry = Registry::load(&dir)?;
        Ok((dir, registry))
    }

    /// The folders of `--kind-definition`, in a temporary directory.
    fn unpack_definitions(&self) -> Result<Option<tempfile::TempDir>, PackError> {
        if self.kind_definition.is_empty() {
            return Ok(None);
        }
        let dir = tempfile::Builder::new()
            .prefix("kustomize-operator-kinds-")
            .tempdir()
            .map_err(|source| PackError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        for file in &self.kind_definition {
            pack::unpack_file(file, dir.path())?;
        }
        Ok(Some(dir))
    }
}

/// Flags shared by `run` and `render`: what the kinds see.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The kustomize directories.
    #[command(flatten)]
    pub dirs: KindsDir,
    /// The namespace the operator itself runs in (the downward API sets it).
    #[arg(long, env = "NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// Every Rust kind's own flags.
    #[command(flatten)]
    pub kinds: KindFlags,
}

impl CommonArgs {
    /// The kinds' settings, for an operator watching `watch_namespace`.
    pub fn kind_options(&self, watch_namespace: Option<&str>) -> KindOptions {
        KindOptions {
            context: KindContext {
                operator_namespace: self.operator_namespace.clone(),
                watch_namespace: watch_namespace.map(str::to_string),
            },
            flags: self.kinds.clone(),
        }
    }
}

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Shared flags (and every kind's).
    #[command(flatten)]
    pub common: Box<CommonArgs>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile only resources labelled `kustomize-operator.io/shard=NAME`
    /// (default: only resources without that label).
    #[arg(long, env = "SHARD", value_parser = shard::parse_name)]
    pub shard: Option<String>,
    /// Write as the tenant: the apply, prune and delete of a namespaced
    /// resource (Sample, namespaced declared kinds, ExchangeRate,
    /// CopyratorRule) run as this ServiceAccount of the resource's
    /// namespace (`kubectl --as`), so the tenant's RBAC bounds them; a
    /// kind file's `reconcile.serviceAccountName` overrides it. Reads,
    /// watches and status stay with the operator's account. Default: the
    /// operator's own account.
    #[arg(long, env = "DEFAULT_SERVICE_ACCOUNT", value_parser = parse_account_name)]
    pub default_service_account: Option<String>,
    /// Write cluster-scoped resources (ChaosAgent, cluster-scoped declared
    /// kinds) as this ServiceAccount, NAMESPACE/NAME (`kubectl --as`), which
    /// the operator must be allowed to impersonate. They have no namespace
    /// account: in an install writing as tenants
    /// (`--default-service-account`, or a kind naming an account) they are
    /// refused without it (`Ready=False`, reason `Forbidden`), so the
    /// operator's own account writes nothing there. Default: none.
    #[arg(long, env = "CLUSTER_SERVICE_ACCOUNT", value_parser = ServiceAccount::parse)]
    pub cluster_service_account: Option<ServiceAccount>,
    /// Which controllers run, comma-separated: built-in and declared kinds
    /// by short name (default: all).
    #[arg(long, env = "KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// The kubectl executable (default: kubectl on PATH).
    #[arg(long, env = "KUBECTL")]
    pub kubectl: Option<PathBuf>,
    /// kubectl runs longer than this are killed.
    #[arg(long, env = "KUBECTL_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub kubectl_timeout: Duration,
    /// At most this many kubectl processes at once (default: 2 x cores).
    #[arg(long, env = "MAX_CONCURRENT_KUBECTL")]
    pub max_concurrent_kubectl: Option<usize>,
    /// Re-apply unchanged resources this often, to correct drift.
    #[arg(long, env = "RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Objects that are not healthy this long after an apply (a Deployment
    /// whose Pods never become available) make their resource Stalled.
    #[arg(long, env = "HEALTH_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub health_timeout: Duration,
    /// Keep the last overlay of each resource at `DIR/<kind>/<namespace>/<name>/`.
    #[arg(long, env = "KEEP_OVERLAYS")]
    pub keep_overlays: Option<PathBuf>,
    /// Where temporary overlays and kubectl's cache go (default: $TMPDIR/kustomize-operator).
    #[arg(long, env = "WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// Applies due within this window share one kubectl run (see --batch-max).
    #[arg(long, env = "BATCH_WINDOW", default_value = "10ms", value_parser = parse_duration)]
    pub batch_window: Duration,
    /// At most this many resources per kubectl run; 1 turns batching off.
    #[arg(long, env = "BATCH_MAX", default_value_t = 100)]
    pub batch_max: usize,
    /// At most this many reconciles of one kind at once (0: no limit); the
    /// others wait their turn. Keep it above kubectl slots × --batch-max,
    /// or batches run part-empty.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 512)]
    pub max_concurrent_reconciles: u16,
    /// At most this many API requests waiting for their answer at once
    /// (a watch's stream aside), however many resources are due together
    /// (as at start-up).
    #[arg(long, env = "MAX_API_REQUESTS", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_api_requests: u16,
    /// On SIGTERM, finish running reconciles within this time (kubectl runs
    /// still going near its end are killed and recorded). Keep it below the
    /// pod's terminationGracePeriodSeconds.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Address for /metrics, /healthz and /readyz ("" turns it off).
    #[arg(long, env = "METRICS_ADDR", default_value = "127.0.0.1:8080", value_parser = parse_addr)]
    pub metrics_addr: MetricsAddr,
    /// Address the conversion webhook listens on (HTTPS), which serves the
    /// older versions of kind definitions; off when not given, and a
    /// definition of several versions is then refused.
    #[arg(long, env = "CONVERSION_WEBHOOK_ADDR")]
    pub conversion_webhook_addr: Option<SocketAddr>,
    /// The URL the API server calls the webhook at, for an operator
    /// outside the cluster (`https://127.0.0.1:9443`).
    #[arg(
        long,
        env = "CONVERSION_WEBHOOK_URL",
        requires = "conversion_webhook_addr",
        conflicts_with = "conversion_webhook_service",
        value_parser = parse_webhook_url
    )]
    pub conversion_webhook_url: Option<Endpoint>,
    /// The Service the API server calls the webhook through, in front of
    /// the operator's Pods (`namespace/name:port`).
    #[arg(
        long,
        env = "CONVERSION_WEBHOOK_SERVICE",
        requires = "conversion_webhook_addr",
        value_parser = parse_webhook_service
    )]
    pub conversion_webhook_service: Option<Endpoint>,
    /// The Secret of the operator's namespace (`NAMESPACE`) holding the
    /// webhook's certificate, shared by every replica.
    #[arg(
        long,
        env = "CONVERSION_WEBHOOK_SECRET",
        default_value = "kustomize-operator-webhook"
    )]
    pub conversion_webhook_secret: String,
    /// How often each replica looks at the webhook's certificate in its
    /// Secret: renews it when it nears its end, and serves and trusts what
    /// another replica renewed.
    #[arg(long, env = "CONVERSION_WEBHOOK_CHECK", default_value = "5m", value_parser = parse_duration, hide = true)]
    pub conversion_webhook_check: std::time::Duration,
    /// How long a renewed certificate's CA is trusted before it serves
    /// (every replica must have read it, and put it in every CRD).
    #[arg(long, env = "CONVERSION_WEBHOOK_PROMOTE_AFTER", default_value = "30m", value_parser = parse_duration, hide = true)]
    pub conversion_webhook_promote_after: std::time::Duration,
    /// Serve the `KindDefinition`s of the cluster (kinds added, changed and
    /// removed with kubectl while the operator runs), when their CRD is
    /// installed. `--kinds` selects among the folder kinds only.
    #[arg(long, env = "SERVE_KIND_DEFINITIONS", default_value_t = true, action = clap::ArgAction::Set)]
    pub serve_kind_definitions: bool,
    /// Serve only the `KindDefinition`s matching this label selector
    /// (default: all).
    #[arg(long, env = "KIND_DEFINITION_SELECTOR")]
    pub kind_definition_selector: Option<String>,
    /// The most the definitions served may hold together, in KiB (each is
    /// held in memory and loaded at every start); a definition that would
    /// pass it is refused (`Accepted=False`, `TooLarge`).
    #[arg(long, env = "KIND_DEFINITIONS_BUDGET_KIB", default_value_t = 8192)]
    pub kind_definitions_budget_kib: u64,
    /// Longest one render of a defined kind's template may take; past it,
    /// the render worker is killed and the resource is `RenderFailed`.
    #[arg(long, env = "TEMPLATE_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub template_timeout: Duration,
    /// Most memory a render worker may map, in MiB.
    #[arg(long, env = "TEMPLATE_MEMORY_MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=16384))]
    pub template_memory_mib: u64,
    /// The binary render workers run (default: this one; an operator
    /// started inside another program names its own).
    #[arg(long, env = "RENDER_WORKER")]
    pub render_worker: Option<PathBuf>,
    /// Render workers (processes) for the templates of defined kinds.
    #[arg(long, env = "RENDER_WORKERS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub render_workers: u64,
    /// Run the controllers only while this replica holds a Lease (for several replicas).
    #[arg(long, env = "LEADER_ELECT", conflicts_with = "auto_shard")]
    pub leader_elect: bool,
    /// Share the resources between every replica running with this flag
    /// (the same `--auto-shard-ring`) by themselves: each reconciles its
    /// share, handed over without a gap or an overlap when replicas come
    /// and go (docs/deploy.md, "Automatic sharding"). Uses the Leases'
    /// namespace, identity and durations of `--leader-elect-*`.
    #[arg(long, env = "AUTO_SHARD")]
    pub auto_shard: bool,
    /// The ring the replicas of `--auto-shard` share (default:
    /// `kustomize-operator`, or `kustomize-operator-<shard>` with `--shard`).
    #[arg(long, env = "AUTO_SHARD_RING", value_parser = shard::parse_name)]
    pub auto_shard_ring: Option<String>,
    /// The Lease's namespace (default: the operator's namespace, NAMESPACE).
    #[arg(long, env = "LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// The Lease's name (a shard's default: `kustomize-operator-<shard>`).
    #[arg(
        long,
        env = "LEADER_ELECT_LEASE_NAME",
        default_value = DEFAULT_LEASE_NAME
    )]
    pub leader_elect_lease_name: String,
    /// This replica's name in the Lease (default: host name, process id, random suffix).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
    /// How long an unrenewed Lease stays with its holder.
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// The leader steps down when it could not renew for this long.
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try to take the Lease and the leader renews it.
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
}

/// Which resource `render` and `diff` work on: a file, or one in the
/// cluster.
#[derive(Debug, Clone, Args)]
pub struct ResourceArgs {
    /// A YAML file: the resource first, then any documents its kind needs offline.
    #[arg(short = 'f', long = "filename", conflicts_with = "resource")]
    pub file: Option<PathBuf>,
    /// A resource in the cluster, read with the kubeconfig (read-only):
    /// KIND/NAME, KIND as in `kubectl get` (sample, samples, copyratorrule, ...).
    #[arg(value_name = "KIND/NAME", required_unless_present = "file")]
    pub resource: Option<ResourceRef>,
    /// The namespace of KIND/NAME (default: the kubeconfig's).
    #[arg(short = 'n', long, requires = "resource")]
    pub namespace: Option<String>,
}

impl ResourceArgs {
    /// Where the resource comes from.
    pub fn source(&self) -> Source {
        match (&self.file, &self.resource) {
            (Some(file), _) => Source::File(file.clone()),
            (None, Some(reference)) => Source::Live {
                reference: reference.clone(),
                namespace: self.namespace.clone(),
            },
            // clap requires one of the two.
            (None, None) => Source::File(PathBuf::from("-")),
        }
    }
}

/// `render` flags.
#[derive(Debug, Clone, Args)]
pub struct RenderArgs {
    /// Shared flags (and every kind's, as for `run`).
    #[command(flatten)]
    pub common: Box<CommonArgs>,
    /// The resource.
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// The directory to write the overlay into (created; must be empty if it exists).
    #[arg(long)]
    pub out: PathBuf,
}

/// `diff` flags.
#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    /// Shared flags (and every kind's, as for `run`: give the operator's,
    /// such as --copyrator-namespaces, to see what it would do).
    #[command(flatten)]
    pub common: Box<CommonArgs>,
    /// The resource.
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// The kubectl to run (default: kubectl on PATH).
    #[arg(long, env = "KUBECTL")]
    pub kubectl: Option<PathBuf>,
}

/// `plan` flags.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The changed kind: a kind folder (holding kind.yaml) or a packed
    /// KindDefinition file (`kind pack`).
    #[arg(value_name = "FOLDER|FILE", required_unless_present_any = ["kind", "kind_definition"])]
    pub change: Option<PathBuf>,
    /// The changed kind by name: its folder in --kustomize-dir, or its
    /// definition among --kind-definition files.
    #[arg(long)]
    pub kind: Option<String>,
    /// Shared flags (and every kind's, as for `run`).
    #[command(flatten)]
    pub common: Box<CommonArgs>,
    /// What serves the resources now: the kind folder (or packed file)
    /// the operator serves them from. Default: the KindDefinition of the
    /// same name in the cluster, its kept revisions chosen for each
    /// resource by its `spec.rollout`.
    #[arg(long, value_name = "FOLDER|FILE")]
    pub current: Option<PathBuf>,
    /// Plan only the resources of this namespace (default: every namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// As the operator's `--default-service-account`: the dry run of a
    /// namespaced resource runs as this ServiceAccount of its namespace
    /// (unless the kind names its own), as the operator would write it.
    #[arg(long, env = "DEFAULT_SERVICE_ACCOUNT", value_parser = parse_account_name)]
    pub default_service_account: Option<String>,
    /// As the operator's `--cluster-service-account`: the identity the dry
    /// run of a cluster-scoped resource runs as (NAMESPACE/NAME).
    #[arg(long, env = "CLUSTER_SERVICE_ACCOUNT", value_parser = ServiceAccount::parse)]
    pub cluster_service_account: Option<ServiceAccount>,
    /// `table` for a person, `json` for CI.
    #[arg(short = 'o', long, value_enum, default_value_t = PlanOutput::Table)]
    pub output: PlanOutput,
    /// With the table: every resource's changes (objects added, changed
    /// with their fields, pruned).
    #[arg(long)]
    pub details: bool,
    /// At most this many resources planned at once (renders, builds and
    /// dry runs in flight).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,
    /// The kubectl that builds overlays kustomize must build (default:
    /// kubectl on PATH).
    #[arg(long, env = "KUBECTL")]
    pub kubectl: Option<PathBuf>,
}

/// How `plan` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanOutput {
    /// Counts, then what would fail and why.
    Table,
    /// The whole report as JSON.
    Json,
}

/// `crd` flags.
#[derive(Debug, Clone, Args)]
pub struct CrdArgs {
    /// The kustomize directories (declared kinds' CRDs come from them).
    #[command(flatten)]
    pub dirs: KindsDir,
    /// Only these kinds, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Write one `<name>.yaml` per CRD into this directory instead of printing.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// `rbac` flags.
#[derive(Debug, Clone, Args)]
pub struct RbacArgs {
    /// The kustomize directories.
    #[command(flatten)]
    pub dirs: KindsDir,
    /// Only these declared kinds, comma-separated (default: every declared kind).
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// The kubectl that builds each kind's base (default: kubectl on PATH).
    #[arg(long, env = "KUBECTL")]
    pub kubectl: Option<PathBuf>,
    /// Bind each role to this ServiceAccount, NAMESPACE/NAME, with a
    /// ClusterRoleBinding of the same name, instead of labelling it for
    /// every install's aggregating role: the kind granted to that install
    /// alone (as deploy/rbac/sample.yaml grants the Sample).
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_binding)]
    pub bind: Option<ServiceAccount>,
}

/// `rbac --bind`: a ServiceAccount as NAMESPACE/NAME.
fn parse_binding(text: &str) -> Result<ServiceAccount, String> {
    ServiceAccount::parse(text).map_err(|_| {
        format!("{text:?} is not NAMESPACE/NAME, the ServiceAccount to bind the roles to")
    })
}

/// Where the metrics endpoint listens, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<SocketAddr>);

fn parse_addr(s: &str) -> Result<MetricsAddr, String> {
    if s.is_empty() {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|e| format!("invalid address {s:?}: {e}"))
}

/// `--conversion-webhook-url`: an https URL.
fn parse_webhook_url(s: &str) -> Result<Endpoint, String> {
    match s.strip_prefix("https://") {
        Some(rest) if !rest.is_empty() => Ok(Endpoint::Url(s.to_string())),
        _ => Err(format!("{s:?} is not an https:// URL")),
    }
}

/// `--conversion-webhook-service`: `namespace/name:port`.
fn parse_webhook_service(s: &str) -> Result<Endpoint, String> {
    let parsed = s.split_once('/').and_then(|(namespace, rest)| {
        let (name, port) = rest.split_once(':')?;
        let port = port.parse().ok().filter(|p| (1..=65535).contains(p))?;
        let named = !namespace.is_empty() && !name.is_empty();
        named.then(|| Endpoint::Service {
            namespace: namespace.to_string(),
            name: name.to_string(),
            port,
        })
    });
    parsed.ok_or_else(|| format!("{s:?} is not namespace/name:port"))
}

/// A ServiceAccount name (`--default-service-account`).
pub fn parse_account_name(name: &str) -> Result<String, String> {
    crate::names::check_account_name(name).map(|()| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_flags_parse_with_defaults() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run", "--kinds", "sample"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.kinds, vec!["sample".to_string()]);
        assert_eq!(args.kubectl_timeout, Duration::from_secs(60));
        assert_eq!(args.resync_interval, Duration::from_secs(600));
        assert_eq!(
            args.common.dirs.kustomize_dir,
            vec![PathBuf::from("kustomize")]
        );
    }

    #[test]
    fn exchange_rate_flags_have_defaults_and_are_checked() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(
            args.common.kinds.exchange_rate.options(),
            crate::kinds::exchange_rate::ExchangeRateOptions::default()
        );
        let cli = Cli::try_parse_from([
            "kustomize-operator",
            "run",
            "--exchange-rate-url",
            "http://127.0.0.1:8000/{base}/{currency}",
            "--exchange-rate-min-refresh",
            "5s",
            "--exchange-rate-base",
            "USD",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(
            args.common.kinds.exchange_rate.min_refresh,
            Duration::from_secs(5)
        );
        assert_eq!(args.common.kinds.exchange_rate.base, "USD");
        for bad in [
            ["--exchange-rate-url", "http://x/{base}"],
            ["--exchange-rate-url", "file:///{currency}"],
            ["--exchange-rate-base", "usd"],
            ["--exchange-rate-timeout", "soon"],
        ] {
            let mut argv = vec!["kustomize-operator", "run"];
            argv.extend(bad);
            assert!(Cli::try_parse_from(&argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn leader_election_is_off_by_default() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert!(!args.leader_elect);
        assert_eq!(args.leader_elect_lease_duration, Duration::from_secs(15));
        let cli = Cli::try_parse_from([
            "kustomize-operator",
            "run",
            "--leader-elect",
            "--leader-elect-retry-period",
            "500ms",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert!(args.leader_elect);
        assert_eq!(args.leader_elect_retry_period, Duration::from_millis(500));
    }

    #[test]
    fn render_sees_the_same_kind_flags_as_run() {
        let cli = Cli::try_parse_from([
            "kustomize-operator",
            "render",
            "-f",
            "x.yaml",
            "--out",
            "o",
            "--copyrator-allow-system-namespaces",
            "--exchange-rate-base",
            "USD",
        ])
        .unwrap();
        let Command::Render(args) = cli.command else {
            panic!()
        };
        let options = args.common.kind_options(None);
        assert!(options.flags.copyrator.allow_system_namespaces);
        assert_eq!(options.flags.exchange_rate.base, "USD");
    }

    #[test]
    fn the_kinds_flags_default_to_what_no_flag_parses_to() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        let defaults = KindFlags::default();
        assert_eq!(args.common.kinds.exchange_rate, defaults.exchange_rate);
        assert_eq!(args.common.kinds.copyrator, defaults.copyrator);
        assert_eq!(args.common.kinds.chaos_agent, defaults.chaos_agent);
    }

    #[test]
    fn the_default_service_account_must_be_an_account_name() {
        assert_eq!(parse_account_name("deployer").as_deref(), Ok("deployer"));
        for bad in ["", "Deployer", "a/b", "-a", "a:b"] {
            assert!(parse_account_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_webhook_is_reached_at_a_url_or_through_a_service() {
        assert_eq!(
            parse_webhook_service("ops/webhook:443"),
            Ok(Endpoint::Service {
                namespace: "ops".into(),
                name: "webhook".into(),
                port: 443
            })
        );
        assert!(parse_webhook_service("webhook:443").is_err());
        assert!(parse_webhook_service("ops/webhook:0").is_err());
        assert!(parse_webhook_url("http://127.0.0.1:9443").is_err());
        let cli = Cli::try_parse_from([
            "kustomize-operator",
            "run",
            "--conversion-webhook-url",
            "https://127.0.0.1:9443",
        ]);
        assert!(cli.is_err(), "the URL needs an address to listen on");
    }

    #[test]
    fn empty_metrics_addr_disables() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run", "--metrics-addr", ""]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.metrics_addr, MetricsAddr(None));
    }

    #[test]
    fn rbac_binds_to_a_service_account_named_namespace_slash_name() {
        let cli = Cli::try_parse_from(["kustomize-operator", "rbac", "--bind", "ops/operator"]);
        let Command::Rbac(args) = cli.unwrap().command else {
            panic!()
        };
        let expected = ServiceAccount {
            namespace: "ops".into(),
            name: "operator".into(),
        };
        assert_eq!(args.bind, Some(expected));
        for bad in ["operator", "ops/", "/operator", "Ops/operator"] {
            let err = parse_binding(bad).unwrap_err();
            assert!(err.contains("NAMESPACE/NAME"), "{bad}: {err}");
        }
    }
}
