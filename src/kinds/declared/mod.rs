//! Kinds declared as data: a folder `kustomize/<kind>/` with a kind file
//! (`kind.yaml`: the API, the schema of `spec`, the overlay recipe, status
//! fields), a `base/` and templates (`patches/`, `resources/`). No Rust: the
//! engine serves such a kind through the same path as a Rust kind, on
//! [`DeclaredObject`]s (`object`: compact JSON text beside the metadata).
//!
//! - [`file`](mod@file): the kind file's format;
//! - `validate`: every check, each error naming the file and the field;
//! - [`crd`]: the CRD generated from it;
//! - `example`: a made-up resource with every field set, rendered once to
//!   find templates that cannot render;
//! - [`breaking`]: the changes to it that would break what is stored;
//! - [`pack`]: a folder as one `KindDefinition` object, and back;
//! - `handler`: the handler serving it;
//! - [`rbac`]: the rules the operator needs for it.

pub mod breaking;
mod children;
pub mod conforms;
pub mod cost;
pub mod crd;
pub mod evaluation;
mod example;
pub mod expressions;
pub mod file;
mod handler;
pub mod kro_library;
#[cfg(test)]
mod kro_tests;
mod object;
pub mod pack;
pub mod rbac;
mod reach;
mod recipe;
pub mod references;
pub mod rollout;
pub mod typing;
mod validate;
pub mod versions;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::ApiResource;

use crate::kind::KustomizeDir;

pub use file::KindFile;
pub use handler::{DeclaredHandler, REVISION_FIELD, finalizer, kind_info};
pub use object::DeclaredObject;

/// A kind file that is not right.
#[derive(Debug, thiserror::Error)]
pub enum KindFileError {
    /// It cannot be read.
    #[error("{file}: cannot read: {reason}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// A field is missing, unknown or of the wrong type, or has a value
    /// that cannot work.
    #[error("{file}: {field}: {reason}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Where (`spec.names.plural`).
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// A kind declared by a folder, checked.
#[derive(Debug, Clone)]
pub struct DeclaredKind {
    /// The kind file.
    pub path: PathBuf,
    /// What it declares.
    pub file: KindFile,
    /// The API resource of its resources.
    pub resource: ApiResource,
    /// The object types its resource templates declare.
    pub resource_types: Vec<rbac::ObjectType>,
    /// How often a resource is applied again though unchanged, if the kind
    /// file says.
    pub interval: Option<Duration>,
    /// Its own templates and base, when it was defined in the cluster
    /// (`None`: those of the kustomize directories).
    pub templates: Option<Arc<KustomizeDir>>,
    /// Its templated strings, parsed.
    recipe: recipe::Recipe,
    /// Its CEL expressions, compiled.
    expressions: Arc<expressions::Compiled>,
    /// Its versions, their computed fields compiled.
    versions: versions::Versions,
}

impl DeclaredKind {
    /// Reads and checks the kind file of the folder `dir` (named after the
    /// kind); `templates` are the template files the folder holds
    /// (`patches/x.yaml`, `resources/y.yaml`).
    pub fn load(dir: &Path, templates: &[String]) -> Result<Self, KindFileError> {
        let path = dir.join(file::FILE_NAME);
        let text = std::fs::read_to_string(&path).map_err(|e| KindFileError::Read {
            file: path.clone(),
            reason: e.to_string(),
        })?;
        let folder = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = validate::parse(&path, &text)?;
        validate::check(&path, &file, &folder, templates)?;
        let recipe = recipe::Recipe::compile(&file.spec).map_err(|(field, reason)| {
            KindFileError::Invalid {
                file: path.clone(),
                field,
                reason,
            }
        })?;
        let expressions = expressions::Compiled::of(&file.spec).map_err(|(field, reason)| {
            KindFileError::Invalid {
                file: path.clone(),
                field,
                reason,
            }
        })?;
        let expressions = Arc::new(expressions);
        let versions = versions::Versions::of(&file.spec).map_err(|e| KindFileError::Invalid {
            file: path.clone(),
            field: "spec.versions".into(),
            reason: e.to_string(),
        })?;
        let resource = api_resource(&file);
        let resource_types = resource_types(dir, &path, &file)?;
        let interval = file
            .spec
            .reconcile
            .interval
            .as_deref()
            .and_then(|i| crate::duration::parse_duration(i).ok());
        Ok(Self {
            path,
            file,
            resource,
            resource_types,
            interval,
            templates: None,
            recipe,
            expressions,
            versions,
        })
    }

    /// Renders its templated strings in `isolation` from now on (a kind
    /// defined in the cluster; its templates and base go with
    /// [`KustomizeDir::isolate`]).
    pub fn isolate(&mut self, isolation: Arc<crate::kind::Sandbox>) {
        self.recipe.isolate(isolation);
    }

    /// The kind's short name (`--kinds`, its folder).
    pub fn name(&self) -> &str {
        &self.file.metadata.name
    }

    /// True when its resources are namespaced.
    pub fn namespaced(&self) -> bool {
        self.file.spec.scope == file::Scope::Namespaced
    }

    /// True when `doc` is one of its resources (apiVersion and kind match).
    pub fn matches(&self, doc: &serde_json::Value) -> bool {
        doc["apiVersion"].as_str() == Some(self.resource.api_version.as_str())
            && doc["kind"].as_str() == Some(self.resource.kind.as_str())
    }
}

/// The object types the kind's resource templates declare.
fn resource_types(
    dir: &Path,
    path: &Path,
    file: &KindFile,
) -> Result<Vec<rbac::ObjectType>, KindFileError> {
    let mut types = Vec::new();
    for (i, r) in file.spec.overlay.resources.iter().enumerate() {
        let field = format!("spec.overlay.resources[{i}].template");
        let template = dir.join("resources").join(&r.template);
        let text = std::fs::read_to_string(&template).map_err(|e| KindFileError::Invalid {
            file: path.to_path_buf(),
            field: field.clone(),
            reason: format!("cannot read {}: {e}", template.display()),
        })?;
        let declared = rbac::declared_types(&text).map_err(|reason| KindFileError::Invalid {
            file: path.to_path_buf(),
            field,
            reason: format!("resources/{}: {reason}", r.template),
        })?;
        types.extend(declared);
    }
    Ok(types)
}

/// The API resource a kind file declares.
fn api_resource(file: &KindFile) -> ApiResource {
    let spec = &file.spec;
    ApiResource {
        group: spec.group.clone(),
        version: spec.version.clone(),
        api_version: format!("{}/{}", spec.group, spec.version),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    }
}

/// Every declared kind of the kustomize directories: the kind folders
/// holding a kind file, in name order.
pub fn load(dir: &KustomizeDir) -> Result<Vec<DeclaredKind>, KindFileError> {
    dir.kinds()
        .map(|(name, root)| (name, root.join(name)))
        .filter(|(_, folder)| folder.join(file::FILE_NAME).is_file())
        .map(|(name, folder)| DeclaredKind::load(&folder, &dir.templates_of(name)))
        .collect()
}

#[cfg(test)]
mod tests;
