//! CopyratorRule's command-line flags (`run` and `render` share them).

use clap::Args;

use super::budget::{DEFAULT_READ_BUDGET, MIN_READ_BUDGET};
use super::plan::DEFAULT_MAX_BYTES;

/// CopyratorRule flags: where copies may go, and how much.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
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
    /// CopyratorRule: the most bytes of ConfigMap and Secret data all rules
    /// together hold while they read (a page being read counts 16 MiB);
    /// a rule waits for its turn. Default 64 MiB: twice the default
    /// --copyrator-max-bytes, so one rule at the cap fits beside others
    /// reading, and the operator stays far below its 512 Mi memory limit.
    #[arg(long = "copyrator-read-budget", env = "COPYRATOR_READ_BUDGET",
          default_value_t = DEFAULT_READ_BUDGET, value_parser = parse_read_budget)]
    pub read_budget: usize,
}

impl Default for Flags {
    /// What the flags' defaults parse to.
    fn default() -> Self {
        Self {
            namespace_selector: None,
            namespaces: Vec::new(),
            allow_system_namespaces: false,
            max_bytes: DEFAULT_MAX_BYTES,
            read_budget: DEFAULT_READ_BUDGET,
        }
    }
}

/// A read budget: at least one page ([`MIN_READ_BUDGET`]).
fn parse_read_budget(value: &str) -> Result<usize, String> {
    let bytes: usize = value
        .trim()
        .parse()
        .map_err(|e| format!("{value:?} is not a number of bytes: {e}"))?;
    if bytes < MIN_READ_BUDGET {
        return Err(format!(
            "{bytes} bytes is less than one page being read ({MIN_READ_BUDGET} bytes)"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_budget_holds_at_least_one_page() {
        assert_eq!(parse_read_budget("67108864"), Ok(64 * 1024 * 1024));
        assert!(parse_read_budget("1024").is_err());
        assert!(parse_read_budget("64Mi").is_err());
    }
}
