//! Command-line interface: `run`, `render`, `crd`. Every flag can also be set
//! through the environment variable named in its help.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;
use crate::kinds::KindName;

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
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against the cluster in KUBECONFIG (or in-cluster).
    Run(RunArgs),
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
    /// Address for /metrics, /healthz and /readyz ("" turns it off).
    #[arg(long, env = "METRICS_ADDR", default_value = "127.0.0.1:8080", value_parser = parse_addr)]
    pub metrics_addr: MetricsAddr,
    /// CopyratorRule: only namespaces matching this label selector receive
    /// copies (default: every namespace).
    #[arg(long, env = "COPYRATOR_NAMESPACE_SELECTOR")]
    pub copyrator_namespace_selector: Option<String>,
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
    fn empty_metrics_addr_disables() {
        let cli = Cli::try_parse_from(["kustomize-operator", "run", "--metrics-addr", ""]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.metrics_addr, MetricsAddr(None));
    }
}
