//! Every kind one operator serves: the kinds compiled in (Rust, for logic
//! data cannot express) and the kinds declared by folders of the kustomize
//! directories. `run --kinds`, `crd`, `render` and `rbac` all look kinds up
//! here, so a declared kind is a kind everywhere.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::declared::{self, DeclaredHandler, DeclaredKind, KindFileError};
use super::{
    Availability, CheckShape, KindName, KindOptions, OwnedObjects, Preview, Render, RenderError,
    RenderLive, ServeIn, WithHandler, served,
};
use crate::engine::host::Runtime;
use crate::kind::KustomizeDir;

/// One kind.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Compiled into the operator.
    Builtin(KindName),
    /// Declared by a kind folder.
    Declared(Arc<DeclaredKind>),
}

/// Why the kinds could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A kind file is wrong.
    #[error(transparent)]
    KindFile(#[from] KindFileError),
    /// `--kinds` names a kind nobody serves.
    #[error("unknown kind {name:?}; known kinds: {known}")]
    Unknown {
        /// What was asked for.
        name: String,
        /// What exists.
        known: String,
    },
    /// A kind folder takes the name or the API of another kind.
    #[error("{file}: {reason}")]
    Clash {
        /// The kind file.
        file: PathBuf,
        /// With what.
        reason: String,
    },
}

impl Kind {
    /// The short name: the `--kinds` value and the kind folder.
    pub fn name(&self) -> &str {
        match self {
            Self::Builtin(k) => k.as_str(),
            Self::Declared(d) => d.name(),
        }
    }

    /// The CRD.
    pub fn crd(&self) -> CustomResourceDefinition {
        match self {
            Self::Builtin(k) => k.crd(),
            Self::Declared(d) => d.crd(),
        }
    }

    /// The declared kind, if this is one.
    pub fn declared(&self) -> Option<&Arc<DeclaredKind>> {
        match self {
            Self::Builtin(_) => None,
            Self::Declared(d) => Some(d),
        }
    }

    /// Does `action` with the kind's handler, built from `options`.
    fn with_handler<A: WithHandler>(&self, options: &KindOptions, action: A) -> A::Output {
        match self {
            Self::Builtin(k) => k.with_handler(options, action),
            Self::Declared(d) => action.with(DeclaredHandler::new(d.clone())),
        }
    }

    /// Whether the API server serves the kind and the client may list and
    /// watch it (in `namespace`, if given), asked without reading any
    /// resource of it.
    pub(crate) async fn served(
        &self,
        client: &kube::Client,
        namespace: Option<&str>,
    ) -> Result<Availability, kube::Error> {
        served(client, &self.api_resource().0, namespace).await
    }

    /// Has `guard` leave out a resource of this kind that its Rust type
    /// cannot read, instead of failing the list or watch holding it.
    pub fn check_shape(&self, guard: &crate::guard::Guard) {
        let (resource, _) = self.api_resource();
        let action = CheckShape {
            guard,
            resource: &resource,
        };
        self.with_handler(&KindOptions::default(), action);
    }

    /// Serves the kind in `runtime` (its reconciles run once the runtime
    /// runs).
    pub(crate) async fn serve(&self, runtime: &Runtime, options: &KindOptions) {
        self.with_handler(options, ServeIn { runtime }).await;
    }

    /// True when `doc` is a resource of this kind (apiVersion and kind).
    pub fn matches(&self, doc: &serde_json::Value) -> bool {
        match self {
            Self::Builtin(k) => KindName::of_document(doc) == Some(*k),
            Self::Declared(d) => d.matches(doc),
        }
    }

    /// Renders the plan `run` would carry out for `doc`, offline.
    pub fn render(
        &self,
        doc: &serde_json::Value,
        rest: &[serde_json::Value],
        options: &KindOptions,
        dir: &KustomizeDir,
    ) -> Result<Preview, RenderError> {
        self.with_handler(options, Render { doc, rest, dir })
    }

    /// Renders the plan `run` would carry out now for `doc`, a resource
    /// read from the cluster (the kind observes the cluster read-only).
    pub async fn render_live(
        &self,
        doc: &serde_json::Value,
        client: &kube::Client,
        options: &KindOptions,
        dir: &KustomizeDir,
        owned: OwnedObjects,
    ) -> Result<Preview, RenderError> {
        let action = RenderLive {
            doc,
            client,
            dir,
            owned,
        };
        self.with_handler(options, action).await
    }

    /// True when `name` names this kind on the command line: its short
    /// name, kind, plural, singular or a short name of its CRD (any case).
    pub fn answers_to(&self, name: &str) -> bool {
        let crd = self.crd();
        let names = &crd.spec.names;
        std::iter::once(self.name())
            .chain([names.kind.as_str(), names.plural.as_str()])
            .chain(names.singular.as_deref())
            .chain(names.short_names.iter().flatten().map(String::as_str))
            .any(|n| n.eq_ignore_ascii_case(name))
    }

    /// Where the API serves this kind's resources (the CRD's storage
    /// version), and whether they are namespaced.
    pub fn api_resource(&self) -> (kube::api::ApiResource, bool) {
        let crd = self.crd();
        let version = crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .or(crd.spec.versions.first())
            .map(|v| v.name.clone())
            .unwrap_or_default();
        let group = crd.spec.group.clone();
        let resource = kube::api::ApiResource {
            api_version: format!("{group}/{version}"),
            group,
            version,
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        };
        (resource, crd.spec.scope == "Namespaced")
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kinds one operator knows.
#[derive(Debug, Clone)]
pub struct Registry {
    kinds: Vec<Kind>,
}

impl Registry {
    /// The built-in kinds and every kind declared in `dir`, each kind file
    /// checked (an error names the file and the field).
    pub fn load(dir: &KustomizeDir) -> Result<Self, RegistryError> {
        let mut kinds: Vec<Kind> = KindName::ALL.iter().copied().map(Kind::Builtin).collect();
        for declared in declared::load(dir)? {
            check_clash(&kinds, &declared)?;
            kinds.push(Kind::Declared(Arc::new(declared)));
        }
        Ok(Self { kinds })
    }

    /// Refuses a declared kind of several versions, for what serves or
    /// installs kinds as folders (`run`, `crd`): its CRD would go without
    /// the conversion webhook that the operator attaches only to the CRD of
    /// a KindDefinition in the cluster. Offline verbs (`render`, `diff`,
    /// `rbac`) read such a kind at its stored version.
    pub fn refuse_versions(&self) -> Result<(), RegistryError> {
        let several = self.kinds.iter().filter_map(Kind::declared);
        match several.into_iter().find(|d| !d.file.spec.versions.is_empty()) {
            None => Ok(()),
            Some(declared) => Err(KindFileError::Invalid {
                file: declared.path.clone(),
                field: "spec.versions".into(),
                reason: "a kind folder serves one version; older versions are served for a KindDefinition in the cluster, whose CRD the operator applies with its conversion webhook".into(),
            }
            .into()),
        }
    }

    /// Every kind: the built-in ones first, then the declared ones by name.
    pub fn all(&self) -> &[Kind] {
        &self.kinds
    }

    /// The kinds named (case-insensitively), or all when `names` is empty.
    pub fn select(&self, names: &[String]) -> Result<Vec<Kind>, RegistryError> {
        if names.is_empty() {
            return Ok(self.kinds.clone());
        }
        names
            .iter()
            .map(|name| {
                self.kinds
                    .iter()
                    .find(|k| k.name().eq_ignore_ascii_case(name))
                    .cloned()
                    .ok_or_else(|| RegistryError::Unknown {
                        name: name.clone(),
                        known: self.names().join(", "),
                    })
            })
            .collect()
    }

    /// The kind of the resource `doc`, if one is served.
    pub fn of_document(&self, doc: &serde_json::Value) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.matches(doc))
    }

    /// The kind `name` names (see [`Kind::answers_to`]).
    pub fn by_name(&self, name: &str) -> Result<&Kind, RegistryError> {
        self.kinds
            .iter()
            .find(|k| k.answers_to(name))
            .ok_or_else(|| RegistryError::Unknown {
                name: name.to_string(),
                known: self.names().join(", "),
            })
    }

    /// The short names.
    pub fn names(&self) -> Vec<&str> {
        self.kinds.iter().map(Kind::name).collect()
    }
}

/// A declared kind may not take a name, a CRD or an API another kind has.
fn check_clash(kinds: &[Kind], declared: &DeclaredKind) -> Result<(), RegistryError> {
    let crd_name = declared.crd_name();
    for other in kinds {
        let reason = if other.name().eq_ignore_ascii_case(declared.name()) {
            Some(format!(
                "the kind name {:?} is taken by a built-in kind",
                declared.name()
            ))
        } else if other.crd().metadata.name.as_deref() == Some(crd_name.as_str()) {
            Some(format!(
                "the CRD {crd_name} is already served by the kind {other}"
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(RegistryError::Clash {
                file: declared.path.clone(),
                reason,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The training's Greeting folder copied under a new root, its kind
    /// file changed by `change`.
    fn greeting(change: impl FnOnce(String) -> String) -> tempfile::TempDir {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("training/06-your-own-kind/greeting");
        let root = tempfile::tempdir().unwrap();
        let to = root.path().join("greeting");
        for file in [
            "kind.yaml",
            "base/kustomization.yaml",
            "resources/configmap.yaml",
        ] {
            std::fs::create_dir_all(to.join(file).parent().unwrap()).unwrap();
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
        let kind_file = to.join("kind.yaml");
        let text = std::fs::read_to_string(&kind_file).unwrap();
        std::fs::write(&kind_file, change(text)).unwrap();
        root
    }

    fn registry(root: &Path) -> Registry {
        let dir = KustomizeDir::load_all(&[root.to_path_buf()]).unwrap();
        Registry::load(&dir).unwrap()
    }

    #[test]
    fn a_kind_of_several_versions_loads_but_is_refused_where_folders_are_served() {
        let one = greeting(|t| t);
        assert!(registry(one.path()).refuse_versions().is_ok());
        let several = greeting(|t| {
            t.replace("  version: v1\n", "  version: v2\n  versions:\n  - name: v1\n    schema: {type: object, required: [message], properties: {message: {type: string, minLength: 1, maxLength: 200}, language: {type: string, enum: [en, it], default: en}}}\n")
        });
        let registry = registry(several.path());
        let greeting = registry.select(&["greeting".into()]).unwrap();
        assert_eq!(greeting.len(), 1, "offline verbs read it");
        let refused = registry.refuse_versions().unwrap_err().to_string();
        assert!(refused.contains("spec.versions"), "{refused}");
        assert!(refused.contains("conversion webhook"), "{refused}");
    }
}
