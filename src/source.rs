//! Where the resource of `render` and `diff` comes from: a file, or the
//! cluster by reference (`KIND/NAME`). A leaf: the command line parses into
//! it and `render` reads from it.

use std::path::PathBuf;

/// A reference that is not `KIND/NAME`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not KIND/NAME (for example sample/web)")]
pub struct BadReference(
    /// The text given.
    pub String,
);

/// A resource in the cluster, as the command line names it: `KIND/NAME`
/// (KIND: the kind's short name, kind, plural, singular or CRD short name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    /// The kind, as given.
    pub kind: String,
    /// The resource's name.
    pub name: String,
}

impl std::str::FromStr for ResourceRef {
    type Err = BadReference;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    kind: kind.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(BadReference(s.to_string())),
        }
    }
}

/// Where the resource to render comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A YAML file: the resource first, then any documents its kind needs.
    File(PathBuf),
    /// The cluster in KUBECONFIG: this resource, in `namespace` (default:
    /// the kubeconfig's) when its kind is namespaced.
    Live {
        /// The resource.
        reference: ResourceRef,
        /// Its namespace.
        namespace: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_kind_slash_name() {
        let r: ResourceRef = "sample/web".parse().unwrap();
        assert_eq!((r.kind.as_str(), r.name.as_str()), ("sample", "web"));
        for bad in ["sample", "/web", "sample/", "a/b/c", ""] {
            assert!(bad.parse::<ResourceRef>().is_err(), "{bad}");
        }
    }
}
