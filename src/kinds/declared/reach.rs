//! Where a declared kind's objects may be: a namespaced kind's resources
//! may be created by anyone who may write in their namespace, so their
//! objects stay in it, and beyond it only where the kind file's `reach`
//! says ([`Handler::reaches`](crate::kind::Handler::reaches)).

/// Where a resource's objects may be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reach {
    /// Anywhere its writer may write.
    #[default]
    Anywhere,
    /// In the resource's own namespace, and beyond it only where one of
    /// these says (a kind file's `reach`).
    Confined(Vec<Beyond>),
}

/// Objects of one kind a confined resource may have outside its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beyond {
    /// API group (`""` for the core group).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// `None`: cluster-scoped objects of the kind. Else the namespaces
    /// they may be in: a name, `prefix-*`, or `*` for any.
    pub namespaces: Option<Vec<String>>,
}

impl Reach {
    /// True when an object of `api_version`/`kind` in `namespace` (`None`:
    /// cluster-scoped) may be one of the objects of a resource in `home`.
    pub fn allows(
        &self,
        home: Option<&str>,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> bool {
        let Self::Confined(beyond) = self else {
            return true;
        };
        if namespace.is_some() && namespace == home {
            return true;
        }
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        beyond
            .iter()
            .filter(|b| b.group == group && b.kind == kind)
            .any(|b| match (&b.namespaces, namespace) {
                (None, None) => true,
                (Some(patterns), Some(ns)) => patterns.iter().any(|p| matches(p, ns)),
                _ => false,
            })
    }
}

/// A namespace pattern: a name, `prefix-*`, or `*`.
fn matches(pattern: &str, namespace: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => namespace.starts_with(prefix),
        None => pattern == namespace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined() -> Reach {
        Reach::Confined(vec![
            Beyond {
                group: String::new(),
                kind: "Namespace".into(),
                namespaces: None,
            },
            Beyond {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespaces: Some(vec!["tenant-*".into(), "shared".into()]),
            },
        ])
    }

    #[test]
    fn a_confined_resource_reaches_only_what_its_kind_declares() {
        let reach = confined();
        let home = Some("team");
        assert!(reach.allows(home, "apps/v1", "Deployment", Some("team")));
        assert!(!reach.allows(home, "apps/v1", "Deployment", Some("other")));
        assert!(reach.allows(home, "v1", "Namespace", None));
        assert!(!reach.allows(home, "rbac.authorization.k8s.io/v1", "ClusterRole", None));
        assert!(reach.allows(home, "v1", "ConfigMap", Some("tenant-a")));
        assert!(reach.allows(home, "v1", "ConfigMap", Some("shared")));
        assert!(!reach.allows(home, "v1", "ConfigMap", Some("kube-system")));
        assert!(!reach.allows(home, "v1", "ConfigMap", None));
        // Same kind name, another group: not the declared one.
        assert!(!reach.allows(home, "example.com/v1", "Namespace", None));
    }

    #[test]
    fn an_unconfined_resource_reaches_anywhere() {
        assert!(Reach::Anywhere.allows(Some("team"), "v1", "ConfigMap", Some("kube-system")));
        assert!(Reach::Confined(vec![]).allows(Some("team"), "v1", "ConfigMap", Some("team")));
        assert!(!Reach::Confined(vec![]).allows(Some("team"), "v1", "Namespace", None));
    }
}
