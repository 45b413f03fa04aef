//! Command-line interface: `run`, `render`, `crd`. Every flag can also be set
//! through the environment variable named in its help.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;
use crate::kinds::KindName;
use crate::kinds::{copyrator, exchange_rate};

/// A Kubernetes operator that reconciles custom resources by rendering
/// kustomize overlays and running kubectl.
#[derive(Debug, Parser)]
#[command(name = "kustomize-operator", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
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
    /// Write the overlay `run` would apply for the resource in a file, offline.
    Render(RenderArgs),
    /// Print every CRD as YAML (or write one file per CRD with --out-dir).
    Crd(CrdArgs),
}

/// Flags shared by `run` and `render`.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Directory with one folder per kind (base/ and patches/).
    #[arg(long, env = "KUSTOMIZE_DIR", default_value = "kustomize")]
    pub kustomize_dir: PathBuf,
}

/// `run` flags.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Which controllers run, comma-separated (default: all).
    #[arg(long, env = "KINDS", value_delimiter = ',', value_parser = parse_kind)]
    pub kinds: Vec<KindName>,
    /// The namespace the operator itself runs in (the downward API sets it).
    #[arg(long, env = "NAMESPACE")]
    pub operator_namespace: Option<String>,
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
    /// Keep the last overlay of each resource at DIR/<kind>/<namespace>/<name>/.
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
    /// On SIGTERM, finish running reconciles within this time (kubectl runs
    /// still going near its end are killed and recorded). Keep it below the
    /// pod's terminationGracePeriodSeconds.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Address for /metrics, /healthz and /readyz ("" turns it off).
    #[arg(long, env = "METRICS_ADDR", default_value = "127.0.0.1:8080", value_parser = parse_addr)]
    pub metrics_addr: MetricsAddr,
    /// Run the controllers only while this replica holds a Lease (for several replicas).
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,
    /// The Lease's namespace (default: the operator's namespace, NAMESPACE).
    #[arg(long, env = "LEADER_ELECT_NAMESPACE")]
    pub leader_elect_namespace: Option<String>,
    /// The Lease's name.
    #[arg(
        long,
        env = "LEADER_ELECT_LEASE_NAME",
        default_value = "kustomize-operator"
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
    /// CopyratorRule: only namespaces matching this label selector receive
    /// copies (default: every namespace).
    #[arg(long, env = "COPYRATOR_NAMESPACE_SELECTOR")]
    pub copyrator_namespace_selector: Option<String>,
    /// CopyratorRule: read and write ConfigMaps and Secrets only in these
    /// namespaces (comma-separated; default: every namespace). Rules
    /// elsewhere are not served. Lets the operator's Secret grants be
    /// RoleBindings in these namespaces (deploy/components/copyrator-namespaces).
    #[arg(long, env = "COPYRATOR_NAMESPACES", value_delimiter = ',', value_parser = copyrator::scope::parse_namespace)]
    pub copyrator_namespaces: Vec<String>,
    /// ExchangeRate flags (boxed: keeps `Command` small).
    #[command(flatten)]
    pub exchange_rate: Box<ExchangeRateArgs>,
}

/// ExchangeRate flags: the rate provider and the refresh limits.
#[derive(Debug, Clone, Args)]
pub struct ExchangeRateArgs {
    /// ExchangeRate: provider URL; `{base}` and `{currency}` are replaced by the ISO 4217 codes.
    #[arg(long = "exchange-rate-url", env = "EXCHANGE_RATE_URL", default_value = exchange_rate::DEFAULT_URL, value_parser = parse_url_template)]
    pub url: String,
    /// ExchangeRate: where the rate sits in the provider's JSON answer (dotted path; `{base}`, `{currency}` replaced).
    #[arg(long = "exchange-rate-path", env = "EXCHANGE_RATE_PATH", default_value = exchange_rate::DEFAULT_RATE_PATH)]
    pub rate_path: String,
    /// ExchangeRate: the base currency when `spec.base` is not set.
    #[arg(long = "exchange-rate-base", env = "EXCHANGE_RATE_BASE", default_value = exchange_rate::DEFAULT_BASE, value_parser = parse_currency)]
    pub base: String,
    /// ExchangeRate: provider requests taking longer fail.
    #[arg(long = "exchange-rate-timeout", env = "EXCHANGE_RATE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// ExchangeRate: the shortest `spec.refreshInterval` accepted (shorter is InvalidSpec).
    #[arg(long = "exchange-rate-min-refresh", env = "EXCHANGE_RATE_MIN_REFRESH", default_value = "1m", value_parser = parse_duration)]
    pub min_refresh: Duration,
}

impl ExchangeRateArgs {
    /// The handler's settings.
    pub fn options(&self) -> exchange_rate::ExchangeRateOptions {
        exchange_rate::ExchangeRateOptions {
            url: self.url.clone(),
            rate_path: self.rate_path.clone(),
            base: self.base.clone(),
            timeout: self.timeout,
            min_refresh: self.min_refresh,
        }
    }
}

fn parse_url_template(s: &str) -> Result<String, String> {
    exchange_rate::provider::check_url_template(s).map(|()| s.to_string())
}

fn parse_currency(s: &str) -> Result<String, String> {
    if exchange_rate::is_currency_code(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an ISO 4217 code such as EUR"))
    }
}

/// `render` flags.
#[derive(Debug, Clone, Args)]
pub struct RenderArgs {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
    /// A YAML file: the resource first, then any documents its kind needs offline.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// The directory to write the overlay into (created; must be empty if it exists).
    #[arg(long)]
    pub out: PathBuf,
}

/// `crd` flags.
#[derive(Debug, Clone, Args)]
pub struct CrdArgs {
    /// Write one `<name>.yaml` per CRD into this directory instead of printing.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

fn parse_kind(s: &str) -> Result<KindName, String> {
    s.parse()
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

impl RunArgs {
    /// The kinds to run: those given, or all.
    pub fn selected_kinds(&self) -> Vec<KindName> {
        if self.kinds.is_empty() {
            KindName::ALL.to_vec()
        } else {
            self.kinds.clone()
        }
    }
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
        assert_eq!(args.kinds, vec![KindName::Sample]);
        assert_eq!(args.kubectl_timeout, Duration::from_secs(60));
        assert_eq!(args.resync_interval, Duration::from_secs(600));
        assert_eq!(args.common.kustomize_dir, PathBuf::from("kustomize"));
    }

    #[test]
    fn unknown_kind_is_rejected_with_the_known_ones() {
        let err = Cli::try_parse_from(["kustomize-operator", "run", "--kinds", "pods"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("known kinds: sample"), "{err}");
    }

    #[test]
    fn exchange_rate_flags_have_defaults_and_are_checked() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(
            args.exchange_rate.options(),
            exchange_rate::ExchangeRateOptions::default()
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
        assert_eq!(args.exchange_rate.min_refresh, Duration::from_secs(5));
        assert_eq!(args.exchange_rate.base, "USD");
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
    fn empty_metrics_addr_disables() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run", "--metrics-addr", ""]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.metrics_addr, MetricsAddr(None));
    }
}
