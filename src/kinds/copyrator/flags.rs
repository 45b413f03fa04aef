//! CopyratorRule's command-line flags (`run` and `render` share them).

use clap::Args;

use super::plan::DEFAULT_MAX_BYTES;

/// CopyratorRule flags: where copies may go, and how much.
#[derive(Debug, Clone, Args)]
#[group(id = "copyrator_flags")]
pub struct Flags {
    /// CopyratorRule: only namespaces matching this label selector receive
    /// copies (default: every namespace).
    #[arg(
        long = "copyrator-namespace-selector",
        env = "COPYRATOR_NAMESPACE_SELECTOR"
    )]
    pub namespace_selector: Option<String>,
    /// CopyratorRule: read and write ConfigMaps and Secrets only in these
    /// namespaces (comma-separated; default: every namespace). Rules
    /// elsewhere are not served. Lets the operator's Secret grants be
    /// RoleBindings in these namespaces (deploy/components/copyrator-namespaces).
    #[arg(long = "copyrator-namespaces", env = "COPYRATOR_NAMESPACES", value_delimiter = ',', value_parser = super::scope::parse_namespace)]
    pub namespaces: Vec<String>,
    /// CopyratorRule: let rules copy into kube-system, kube-public,
    /// kube-node-lease and the operator's own namespace (off: a rule naming
    /// one reports it Excluded).
    #[arg(
        long = "copyrator-allow-system-namespaces",
        env = "COPYRATOR_ALLOW_SYSTEM_NAMESPACES"
    )]
    pub allow_system_namespaces: bool,
    /// CopyratorRule: the most bytes of copies one rule may want (sources'
    /// data × target namespaces); above it the rule is TooLarge.
    #[arg(long = "copyrator-max-bytes", env = "COPYRATOR_MAX_BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub max_bytes: usize,
}
