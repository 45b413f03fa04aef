//! Whose rights a resource's writes use: the operator's own account, or a
//! ServiceAccount of the resource's namespace that kubectl impersonates
//! (`kubectl --as=system:serviceaccount:NS:NAME`), so the tenant's own RBAC
//! bounds what its resources can do (Flux's `serviceAccountName`).
//!
//! Only writes change identity: applies, prunes and deletes. Reads, watches,
//! status and events stay with the operator. The engine never acts as an
//! account of a system namespace or of the operator's own namespace.

use super::inventory::Owner;

/// Namespaces whose accounts the engine never acts as (besides the
/// operator's own namespace).
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The identity a resource's writes run as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// The operator's own account.
    #[default]
    Operator,
    /// A ServiceAccount, impersonated.
    ServiceAccount {
        /// Its namespace (the resource's).
        namespace: String,
        /// Its name.
        name: String,
    },
}

impl Identity {
    /// The user kubectl acts as (`--as`), `None` for the operator itself.
    pub fn username(&self) -> Option<String> {
        match self {
            Self::Operator => None,
            Self::ServiceAccount { namespace, name } => {
                Some(format!("system:serviceaccount:{namespace}:{name}"))
            }
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Operator => f.write_str("the operator's own account"),
            Self::ServiceAccount { namespace, name } => {
                write!(f, "ServiceAccount {namespace}/{name}")
            }
        }
    }
}

/// Why the engine refuses to act for a resource at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "writes for resources in namespace {namespace} would run as ServiceAccount {namespace}/{account}, and the operator never acts as an account of a system namespace or of its own namespace; nothing was applied"
)]
pub struct ProtectedNamespace {
    /// The resource's namespace.
    pub namespace: String,
    /// The account it would have acted as.
    pub account: String,
}

/// The identity `owner`'s writes run as: the ServiceAccount `account` of
/// its namespace when one is named and the owner is namespaced, else the
/// operator's own. Refused in a protected namespace.
pub fn for_owner(
    owner: &Owner,
    account: Option<&str>,
    operator_namespace: Option<&str>,
) -> Result<Identity, ProtectedNamespace> {
    let (Some(namespace), Some(account)) = (owner.namespace.as_deref(), account) else {
        return Ok(Identity::Operator);
    };
    if PROTECTED_NAMESPACES.contains(&namespace) || operator_namespace == Some(namespace) {
        return Err(ProtectedNamespace {
            namespace: namespace.to_string(),
            account: account.to_string(),
        });
    }
    Ok(Identity::ServiceAccount {
        namespace: namespace.to_string(),
        name: account.to_string(),
    })
}

/// Checks a ServiceAccount name: a DNS subdomain (lower-case
/// alphanumerics, `-` and `.`, at most 253, alphanumeric at both ends).
pub fn check_account_name(name: &str) -> Result<(), String> {
    let valid = (1..=253).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a ServiceAccount name (a DNS subdomain)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(namespace: Option<&str>) -> Owner {
        Owner::sample_web(namespace)
    }

    #[test]
    fn a_named_account_of_the_owners_namespace_is_impersonated() {
        let id = for_owner(&owner(Some("team-a")), Some("deployer"), Some("ops")).unwrap();
        assert_eq!(
            id.username().as_deref(),
            Some("system:serviceaccount:team-a:deployer")
        );
        assert_eq!(id.to_string(), "ServiceAccount team-a/deployer");
    }

    #[test]
    fn without_an_account_or_a_namespace_the_operator_acts() {
        assert_eq!(
            for_owner(&owner(Some("team-a")), None, None),
            Ok(Identity::Operator)
        );
        assert_eq!(
            for_owner(&owner(None), Some("deployer"), None),
            Ok(Identity::Operator)
        );
        assert_eq!(Identity::Operator.username(), None);
    }

    #[test]
    fn system_namespaces_and_the_operators_own_are_refused() {
        for ns in PROTECTED_NAMESPACES.iter().chain(&["ops"]) {
            let err = for_owner(&owner(Some(ns)), Some("deployer"), Some("ops")).unwrap_err();
            assert_eq!(err.namespace, *ns);
            assert!(err.to_string().contains("never acts as"), "{err}");
        }
    }
}
