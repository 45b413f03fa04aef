//! Where the operator reads and writes ConfigMaps and Secrets for
//! CopyratorRules: every namespace (the default), or only the namespaces
//! given with `--copyrator-namespaces`.
//!
//! The list exists for least privilege: with it, every list, watch, apply
//! and delete of ConfigMaps and Secrets names one of these namespaces, so
//! the operator's grants on them can be RoleBindings in exactly these
//! namespaces (`deploy/components/copyrator-namespaces`) instead of a
//! cluster-wide grant that would let it read every Secret in the cluster.

use std::collections::BTreeSet;

use crate::kind::{HandlerError, Reason};

/// The flag that lists the namespaces, for messages.
pub const FLAG: &str = "--copyrator-namespaces";

/// The namespaces the operator may touch ConfigMaps and Secrets in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace: lists and watches are cluster-wide.
    #[default]
    All,
    /// Only these: rules elsewhere are not served, other namespaces are
    /// never targets, and every call names one of them.
    Only(BTreeSet<String>),
}

impl Scope {
    /// The scope for the flag's value: an empty list is every namespace.
    pub fn new(namespaces: &[String]) -> Self {
        if namespaces.is_empty() {
            Self::All
        } else {
            Self::Only(namespaces.iter().cloned().collect())
        }
    }

    /// True when the operator may touch ConfigMaps and Secrets in `namespace`.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(set) => set.contains(namespace),
        }
    }

    /// The namespaces to list or watch one by one; `None` means one
    /// cluster-wide call.
    pub fn namespaces(&self) -> Option<&BTreeSet<String>> {
        match self {
            Self::All => None,
            Self::Only(set) => Some(set),
        }
    }

    /// The namespace each list, watch or delete names, one call per entry:
    /// each listed namespace, or (every namespace in scope) `unscoped` alone,
    /// where `None` is one cluster-wide call.
    pub fn call_namespaces<'a>(&'a self, unscoped: Option<&'a str>) -> Vec<Option<&'a str>> {
        match self {
            Self::All => vec![unscoped],
            Self::Only(set) => set.iter().map(|ns| Some(ns.as_str())).collect(),
        }
    }

    /// An error for a rule whose namespace is outside the scope: its sources
    /// cannot be read. Retried with backoff (a restart with a wider list
    /// serves it); nothing is read or written meanwhile.
    pub fn check_rule_namespace(&self, namespace: &str) -> Result<(), HandlerError> {
        match self {
            Self::Only(set) if !set.contains(namespace) => Err(HandlerError::transient(
                Reason::NamespaceNotServed,
                format!(
                    "the operator copies only within the namespaces given by {FLAG} ({}); \
                     it does not read sources in {namespace:?}",
                    set.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Parses the flag's value: comma-separated namespace names (RFC 1123
/// labels), spaces around them ignored.
pub fn parse_namespace(value: &str) -> Result<String, String> {
    let name = value.trim();
    if crate::names::is_dns_label(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_list_means_every_namespace() {
        assert_eq!(Scope::new(&[]), Scope::All);
        assert!(Scope::All.contains("anything"));
        assert!(Scope::All.namespaces().is_none());
        assert_eq!(Scope::All.call_namespaces(None), [None]);
        assert_eq!(Scope::All.call_namespaces(Some("w")), [Some("w")]);
        assert!(Scope::All.check_rule_namespace("x").is_ok());
    }

    #[test]
    fn a_list_limits_namespaces_and_rules() {
        let scope = Scope::new(&["b".into(), "a".into(), "b".into()]);
        let listed: Vec<&String> = scope.namespaces().unwrap().iter().collect();
        assert_eq!(listed, ["a", "b"]);
        assert_eq!(scope.call_namespaces(Some("w")), [Some("a"), Some("b")]);
        assert!(scope.contains("a") && !scope.contains("c"));
        assert!(scope.check_rule_namespace("a").is_ok());
        let err = scope.check_rule_namespace("c").unwrap_err();
        assert_eq!(err.reason(), Reason::NamespaceNotServed);
        assert!(
            err.to_string().contains("--copyrator-namespaces (a, b)"),
            "{err}"
        );
    }

    #[test]
    fn namespace_names_are_checked() {
        assert_eq!(parse_namespace(" team-a ").unwrap(), "team-a");
        for bad in ["", "Team", "-a", "a-", "a_b", &"a".repeat(64)] {
            assert!(parse_namespace(bad).is_err(), "{bad:?}");
        }
    }
}
