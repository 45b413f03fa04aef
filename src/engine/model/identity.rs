//! Whose rights a resource's writes use: the operator's own account, or a
//! ServiceAccount of the resource's namespace that kubectl impersonates
//! (`kubectl --as=system:serviceaccount:NS:NAME`), so the tenant's own RBAC
//! bounds what its resources can do (Flux's `serviceAccountName`).
//!
//! Only writes change identity: applies, prunes and deletes. Reads, watches,
//! status and events stay with the operator. The engine never acts as an
//! account of a system namespace or of the operator's own namespace for a
//! resource there. A cluster-scoped resource has no namespace account: it
//! writes as the account `--cluster-service-account` names, and in an
//! install that writes as tenants without one it is refused, so the
//! operator's own account writes nothing there.

use super::inventory::Owner;
use crate::names::ServiceAccount;

/// Namespaces whose accounts the engine never acts as (besides the
/// operator's own namespace).
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The identity a resource's writes run as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// The operator's own account.
    #[default]
    Operator,
    /// A ServiceAccount (of the resource's namespace, or the cluster
    /// account), impersonated.
    ServiceAccount(ServiceAccount),
}

impl Identity {
    /// The user kubectl acts as (`--as`), `None` for the operator itself.
    pub fn username(&self) -> Option<String> {
        match self {
            Self::Operator => None,
            Self::ServiceAccount(account) => Some(account.username()),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Operator => f.write_str("the operator's own account"),
            Self::ServiceAccount(account) => write!(f, "ServiceAccount {account}"),
        }
    }
}

/// Whose rights the writes of one kind's resources use, as the install and
/// the kind name them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Writers<'a> {
    /// The ServiceAccount named for the kind's writes (the kind's own, else
    /// `--default-service-account`): the install writes as tenants.
    pub account: Option<&'a str>,
    /// The kind makes things for the users of its namespaced resources:
    /// those write as `account` of their own namespace.
    pub tenant_writes: bool,
    /// The account cluster-scoped resources write as
    /// (`--cluster-service-account`).
    pub cluster_account: Option<&'a ServiceAccount>,
    /// The operator's own namespace: its accounts are never acted as for a
    /// resource in it.
    pub operator_namespace: Option<&'a str>,
}

/// Why the engine refuses to act for a resource at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A namespaced resource in a namespace whose accounts are never acted as.
    #[error(
        "writes for resources in namespace {namespace} would run as ServiceAccount {namespace}/{account}, and the operator never acts as an account of a system namespace or of its own namespace; nothing was applied"
    )]
    ProtectedNamespace {
        /// The resource's namespace.
        namespace: String,
        /// The account it would have acted as.
        account: String,
    },
    /// A cluster-scoped resource, while the install writes as tenants and
    /// names no account for cluster-scoped kinds.
    #[error(
        "{kind} {name} is cluster-scoped and has no namespace whose ServiceAccount {account} could write for it, and this operator writes as tenants, never as its own account: run it with --cluster-service-account NAMESPACE/NAME (CLUSTER_SERVICE_ACCOUNT), the account cluster-scoped resources write as; nothing was applied"
    )]
    NoClusterAccount {
        /// The resource's kind.
        kind: String,
        /// Its name.
        name: String,
        /// The account namespaced resources write as.
        account: String,
    },
}

impl Writers<'_> {
    /// The identity `owner`'s writes run as:
    ///
    /// - a namespaced owner of a kind that writes for tenants, with an account
    ///   named: that ServiceAccount of its namespace (refused in a protected
    ///   namespace);
    /// - a cluster-scoped owner: the cluster account when one is named; else,
    ///   when the install writes as tenants (an account is named), refused:
    ///   the operator's own account never writes for it then;
    /// - otherwise the operator's own account.
    pub fn identity_of(&self, owner: &Owner) -> Result<Identity, Refusal> {
        let writers = self;
        let Some(namespace) = owner.namespace.as_deref() else {
            return match (writers.cluster_account, writers.account) {
                (Some(cluster), _) => Ok(Identity::ServiceAccount(cluster.clone())),
                (None, Some(account)) => Err(Refusal::NoClusterAccount {
                    kind: owner.kind.clone(),
                    name: owner.name.clone(),
                    account: account.to_string(),
                }),
                (None, None) => Ok(Identity::Operator),
            };
        };
        let Some(account) = writers.account.filter(|_| writers.tenant_writes) else {
            return Ok(Identity::Operator);
        };
        if PROTECTED_NAMESPACES.contains(&namespace)
            || writers.operator_namespace == Some(namespace)
        {
            return Err(Refusal::ProtectedNamespace {
                namespace: namespace.to_string(),
                account: account.to_string(),
            });
        }
        Ok(Identity::ServiceAccount(ServiceAccount {
            namespace: namespace.to_string(),
            name: account.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(namespace: Option<&str>) -> Owner {
        Owner::sample_web(namespace)
    }

    /// An install writing as `account` (a kind writing for tenants).
    fn tenant(account: Option<&str>) -> Writers<'_> {
        Writers {
            account,
            tenant_writes: true,
            cluster_account: None,
            operator_namespace: Some("ops"),
        }
    }

    #[test]
    fn a_named_account_of_the_owners_namespace_is_impersonated() {
        let id = tenant(Some("deployer"))
            .identity_of(&owner(Some("team-a")))
            .unwrap();
        assert_eq!(
            id.username().as_deref(),
            Some("system:serviceaccount:team-a:deployer")
        );
        assert_eq!(id.to_string(), "ServiceAccount team-a/deployer");
    }

    #[test]
    fn without_an_account_the_operator_acts() {
        assert_eq!(
            tenant(None).identity_of(&owner(Some("team-a"))),
            Ok(Identity::Operator)
        );
        assert_eq!(
            tenant(None).identity_of(&owner(None)),
            Ok(Identity::Operator)
        );
        let not_for_tenants = Writers {
            tenant_writes: false,
            ..tenant(Some("deployer"))
        };
        assert_eq!(
            not_for_tenants.identity_of(&owner(Some("team-a"))),
            Ok(Identity::Operator)
        );
        assert_eq!(Identity::Operator.username(), None);
    }

    #[test]
    fn system_namespaces_and_the_operators_own_are_refused() {
        for ns in PROTECTED_NAMESPACES.iter().chain(&["ops"]) {
            let err = tenant(Some("deployer"))
                .identity_of(&owner(Some(ns)))
                .unwrap_err();
            assert!(
                matches!(&err, Refusal::ProtectedNamespace { namespace, .. } if namespace == ns),
                "{err:?}"
            );
            assert!(err.to_string().contains("never acts as"), "{err}");
        }
    }

    /// In an install writing as tenants, a cluster-scoped resource writes as
    /// the cluster account, or not at all: never as the operator.
    #[test]
    fn a_cluster_scoped_owner_writes_as_the_cluster_account_or_is_refused() {
        let err = tenant(Some("deployer"))
            .identity_of(&owner(None))
            .unwrap_err();
        assert_eq!(
            err,
            Refusal::NoClusterAccount {
                kind: "Sample".into(),
                name: "web".into(),
                account: "deployer".into(),
            }
        );
        let message = err.to_string();
        for needle in [
            "Sample web is cluster-scoped",
            "--cluster-service-account",
            "CLUSTER_SERVICE_ACCOUNT",
            "nothing was applied",
        ] {
            assert!(message.contains(needle), "{message}");
        }
        // Whether or not the kind writes for tenants: a cluster-scoped kind
        // never does, the install does.
        let account = ServiceAccount::parse("platform/cluster-writer").unwrap();
        let cluster = Identity::ServiceAccount(account.clone());
        for tenant_writes in [true, false] {
            let writers = Writers {
                cluster_account: Some(&account),
                tenant_writes,
                ..tenant(Some("deployer"))
            };
            assert_eq!(writers.identity_of(&owner(None)), Ok(cluster.clone()));
            // Namespaced resources are not affected by it.
            assert_eq!(
                writers
                    .identity_of(&owner(Some("team-a")))
                    .map(|id| id.to_string()),
                Ok(if tenant_writes {
                    "ServiceAccount team-a/deployer"
                } else {
                    "the operator's own account"
                }
                .to_string())
            );
        }
        // Named on an install that does not write as tenants, it is used too.
        let named = Writers {
            cluster_account: Some(&account),
            ..tenant(None)
        };
        assert_eq!(named.identity_of(&owner(None)), Ok(cluster.clone()));
        assert_eq!(
            cluster.username().as_deref(),
            Some("system:serviceaccount:platform:cluster-writer")
        );
    }
}
