//! `crd` and `rbac`: the manifests a cluster needs before the operator can
//! serve its kinds, built-in and declared.

use std::path::Path;

use crate::cli::{CrdArgs, KindsError, RbacArgs};
use crate::engine::host::Preview;
use crate::kinds::declared::rbac;
use crate::kinds::registry::Kind;
use crate::kubectl::{Kubectl, KubectlConfig, KubectlError};

/// Why `crd` or `rbac` failed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The kind folders could not be loaded, or `--kinds` is wrong.
    #[error(transparent)]
    Kinds(#[from] KindsError),
    /// `rbac` was asked for a built-in kind.
    #[error("{0} is built into the operator: its RBAC is deploy/rbac/{0}.yaml")]
    Builtin(String),
    /// kubectl is missing.
    #[error(transparent)]
    Kubectl(#[from] KubectlError),
    /// A declared kind's base does not build.
    #[error("{file}: the kind's base does not build: {reason}")]
    Base {
        /// The kind file.
        file: String,
        /// Why.
        reason: String,
    },
    /// Serializing or writing failed.
    #[error("{0}")]
    Write(String),
}

/// Each selected kind's CRD as YAML, with its name.
pub fn crds_yaml(args: &CrdArgs) -> Result<Vec<(String, String)>, ManifestError> {
    let (_, registry) = args.dirs.load()?;
    registry.refuse_versions().map_err(KindsError::from)?;
    let kinds = registry.select(&args.kinds).map_err(KindsError::from)?;
    let mut crds: Vec<_> = kinds.iter().map(Kind::crd).collect();
    if args.kinds.is_empty() {
        crds.push(crate::definitions::resource::crd());
    }
    crds.into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            serde_saphyr::to_string(&crd)
                .map(|yaml| (name, yaml))
                .map_err(|e| ManifestError::Write(e.to_string()))
        })
        .collect()
}

/// Prints the CRDs, or writes one file per CRD into `out_dir`.
pub fn write_crds(args: &CrdArgs) -> Result<(), ManifestError> {
    let crds = crds_yaml(args)?;
    match &args.out_dir {
        Some(dir) => write_files(dir, &crds),
        None => {
            for (_, yaml) in crds {
                println!("---\n{}", yaml.trim_end());
            }
            Ok(())
        }
    }
}

fn write_files(dir: &Path, files: &[(String, String)]) -> Result<(), ManifestError> {
    std::fs::create_dir_all(dir).map_err(|e| ManifestError::Write(e.to_string()))?;
    for (name, yaml) in files {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, yaml)
            .map_err(|e| ManifestError::Write(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// The ClusterRole of each selected declared kind (every declared kind
/// when none is named), aggregated or bound (`--bind`), as YAML per kind,
/// with its name.
pub async fn rbac_yaml(args: &RbacArgs) -> Result<Vec<(String, String)>, ManifestError> {
    let (dir, registry) = args.dirs.load()?;
    let kinds = if args.kinds.is_empty() {
        registry
            .all()
            .iter()
            .filter(|k| k.declared().is_some())
            .cloned()
            .collect()
    } else {
        registry.select(&args.kinds).map_err(KindsError::from)?
    };
    let kubectl = Kubectl::new(KubectlConfig::one_shot(args.kubectl.as_deref())?);
    let work = tempfile::tempdir().map_err(|e| ManifestError::Write(e.to_string()))?;
    let mut out = Vec::new();
    for kind in &kinds {
        let Kind::Declared(declared) = kind else {
            return Err(ManifestError::Builtin(kind.name().to_string()));
        };
        let base = Preview::base(&kubectl, work.path(), &dir, declared.name())
            .await
            .map_err(|reason| ManifestError::Base {
                file: declared.path.display().to_string(),
                reason,
            })?;
        let types = rbac::object_types(declared, &base);
        let rules = rbac::rules(declared, &types);
        let yaml =
            rbac::manifests(declared, &rules, args.bind.as_ref()).map_err(ManifestError::Write)?;
        out.push((declared.name().to_string(), yaml));
    }
    Ok(out)
}
