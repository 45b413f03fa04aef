//! The Kubernetes versions the operator supports: the API server's version
//! is read once at start, and one older than the range is refused there,
//! naming the range, rather than failing later at the first API it lacks.
//! A newer one is served, with a warning: nothing it removes is used.

use k8s_openapi::apimachinery::pkg::version::Info;

/// The oldest supported Kubernetes minor (1.x).
pub const OLDEST_MINOR: u32 = 33;
/// The newest Kubernetes minor tested (1.x).
pub const NEWEST_MINOR: u32 = 37;

/// How the API server's version stands against the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Within the range.
    Supported,
    /// Newer than any tested: served, with a warning.
    Newer,
}

/// Why the API server's version is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Older than the oldest supported.
    #[error(
        "the API server runs Kubernetes {found}, older than this operator supports (1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}): upgrade the cluster, or run an older release of the operator"
    )]
    TooOld {
        /// What the API server said (`v1.32.4`).
        found: String,
    },
    /// Its version does not read as Kubernetes 1.x.
    #[error(
        "the API server's version ({found}) does not read as Kubernetes 1.x; supported are 1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}"
    )]
    Unreadable {
        /// What the API server said.
        found: String,
    },
}

/// Where `info` (the API server's `/version`) stands.
pub fn check(info: &Info) -> Result<Standing, VersionError> {
    let found = if info.git_version.is_empty() {
        format!("{}.{}", info.major, info.minor)
    } else {
        info.git_version.clone()
    };
    let unreadable = || VersionError::Unreadable {
        found: found.clone(),
    };
    // Managed clusters write the minor as `33+`.
    let digits = |s: &str| -> Option<u32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    };
    let major = digits(&info.major).ok_or_else(unreadable)?;
    let minor = digits(&info.minor).ok_or_else(unreadable)?;
    match (major, minor) {
        (1, m) if m < OLDEST_MINOR => Err(VersionError::TooOld { found }),
        (1, m) if m > NEWEST_MINOR => Ok(Standing::Newer),
        (1, _) => Ok(Standing::Supported),
        _ => Err(unreadable()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Info::default()
        }
    }

    #[test]
    fn the_range_is_served_and_an_older_server_refused_naming_it() {
        assert_eq!(check(&info("1", "33", "v1.33.13")), Ok(Standing::Supported));
        assert_eq!(check(&info("1", "37", "v1.37.2")), Ok(Standing::Supported));
        assert_eq!(check(&info("1", "38", "v1.38.0")), Ok(Standing::Newer));
        let refused = check(&info("1", "32", "v1.32.4")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the API server runs Kubernetes v1.32.4, older than this operator supports (1.33 to 1.37): upgrade the cluster, or run an older release of the operator"
        );
    }

    #[test]
    fn a_managed_clusters_minor_with_a_plus_reads_as_its_number() {
        assert_eq!(
            check(&info("1", "34+", "v1.34.2-eks-1")),
            Ok(Standing::Supported)
        );
        assert!(matches!(
            check(&info("1", "30+", "v1.30.9-gke.1")),
            Err(VersionError::TooOld { .. })
        ));
    }

    #[test]
    fn a_version_that_is_not_kubernetes_1_x_is_refused() {
        assert!(matches!(
            check(&info("", "", "")),
            Err(VersionError::Unreadable { .. })
        ));
        assert!(matches!(
            check(&info("2", "0", "v2.0.0")),
            Err(VersionError::Unreadable { .. })
        ));
    }
}
