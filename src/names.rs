//! The syntax of Kubernetes object names, checked before the API server
//! would refuse one (label syntax is [`crate::label`]'s).

/// True for a DNS label (RFC 1123): 1 to 63 lower-case alphanumerics and
/// `-`, alphanumeric at both ends; a namespace's name, for one.
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
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

/// A ServiceAccount, by namespace and name (`NAMESPACE/NAME` on a command
/// line): whose rights writes use, or whom a role is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceAccount {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccount {
    /// Parses `NAMESPACE/NAME`: a namespace name and a ServiceAccount name.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (namespace, name) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not NAMESPACE/NAME (a ServiceAccount)"))?;
        if !is_dns_label(namespace) {
            return Err(format!(
                "{namespace:?} is not a namespace name (in {text:?}, NAMESPACE/NAME)"
            ));
        }
        check_account_name(name)?;
        Ok(Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// The user the API server knows it as
    /// (`system:serviceaccount:NAMESPACE:NAME`).
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::{ServiceAccount, check_account_name};

    #[test]
    fn a_service_account_is_namespace_slash_name() {
        let account = ServiceAccount::parse("kustomize-operator-system/writer").unwrap();
        assert_eq!(account.namespace, "kustomize-operator-system");
        assert_eq!(account.name, "writer");
        assert_eq!(account.to_string(), "kustomize-operator-system/writer");
        assert_eq!(
            account.username(),
            "system:serviceaccount:kustomize-operator-system:writer"
        );
        for bad in [
            "writer",
            "/writer",
            "ns/",
            "NS/writer",
            "ns/Writer",
            "a/b/c",
            "-ns/w",
        ] {
            assert!(ServiceAccount::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_account_name_is_a_dns_subdomain() {
        for good in ["a", "tenant-1", "ci.bot", &"x".repeat(253)] {
            assert!(check_account_name(good).is_ok(), "{good:?}");
        }
        for bad in ["", "-a", "a.", "A", "a_b", "a/b", &"x".repeat(254)] {
            let refused = check_account_name(bad).unwrap_err();
            assert!(refused.contains("not a ServiceAccount name"), "{refused}");
        }
    }
}
