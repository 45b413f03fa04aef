//! Overlay: what a kind wants applied, as data, and its rendering into a
//! self-contained kustomize directory.
//!
//! A kind builds an [`Overlay`] (base folder, patch templates with their
//! values, extra resources, generators, namespace and label transforms).
//! [`Overlay::render`] turns it into a [`RenderedOverlay`]: an in-memory set
//! of files with a digest, without touching the disk, so a reconcile that
//! would change nothing can be detected cheaply. [`RenderedOverlay::write_to`]
//! then writes the files: the base copied in, `kustomization.yaml` built as
//! data and serialized, patches rendered from their templates.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::inventory::Owner;
use super::templates::{KustomizeDir, TemplateError};

mod hints;
mod in_process;
mod secrets;

pub use secrets::is_secret;

/// An error while rendering or writing an overlay.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    /// A template failed to render.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The overlay names a base folder that the kustomize directory lacks.
    #[error("no base folder for kind {0} in the kustomize directory")]
    MissingBase(String),
    /// A generated document could not be serialized.
    #[error("cannot serialize {what}: {reason}")]
    Serialize {
        /// Which file.
        what: String,
        /// The serializer's message.
        reason: String,
    },
    /// Writing the overlay to disk failed.
    #[error("cannot write overlay file {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What a kind wants applied, described as data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overlay {
    /// The kustomize folder whose `base/` is copied in and whose `patches/`
    /// hold the templates; `None` for an overlay of generated resources only.
    pub base: Option<String>,
    /// kustomize `namespace`: sets the namespace of every object.
    pub namespace: Option<String>,
    /// Sets [`Overlay::namespace`] only on objects that name none (a
    /// `NamespaceTransformer` with `unsetOnly`), instead of on all.
    pub namespace_unset_only: bool,
    /// kustomize `labels` entries.
    pub labels: Vec<Labels>,
    /// What every template of the overlay sees (a JSON object): its
    /// patches and its resource templates render with the same values.
    pub values: serde_json::Value,
    /// Patches rendered from templates.
    pub patches: Vec<PatchTemplate>,
    /// Complete objects added as resources, serialized from data.
    pub resources: Vec<serde_json::Value>,
    /// Objects rendered from templates of the kind folder's `resources/`:
    /// their file names there.
    pub resource_templates: Vec<String>,
    /// kustomize `configMapGenerator` entries.
    pub config_map_generators: Vec<ConfigMapGenerator>,
    /// kustomize `secretGenerator` entries.
    pub secret_generators: Vec<ConfigMapGenerator>,
    /// kustomize `generatorOptions`.
    pub generator_options: Option<GeneratorOptions>,
    /// kustomize `namePrefix`.
    pub name_prefix: Option<String>,
    /// kustomize `nameSuffix`.
    pub name_suffix: Option<String>,
    /// The kind knows the overlay holds Secret data. The engine does not
    /// rely on it: [`RenderedOverlay::is_sensitive`] also finds every
    /// Secret the rendered files hold, generate or patch in.
    pub sensitive: bool,
}

/// True when a YAML text holds no document: only blank lines, comments
/// and document separators.
fn no_documents(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// A kustomize `labels` entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Labels {
    /// The labels to add.
    pub pairs: BTreeMap<String, String>,
    /// Whether selectors (e.g. a Deployment's) get them too.
    pub include_selectors: bool,
    /// Whether Pod templates get them too.
    pub include_templates: bool,
}

/// A patch: a template of the kind's `patches/` folder, rendered with the
/// overlay's values, and what it applies to.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchTemplate {
    /// File name in `<kind>/patches/`.
    pub template: String,
    /// Which objects the patch applies to (kustomize `target`).
    pub target: Option<PatchTarget>,
    /// Lets a strategic-merge patch rename its target.
    pub allow_name_change: bool,
}

/// A kustomize patch target.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PatchTarget {
    /// API group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// API version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Object name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A kustomize `configMapGenerator` (or `secretGenerator`) entry. Values
/// are written as files, so any content (newlines, `=`, quotes) arrives
/// unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigMapGenerator {
    /// Name (kustomize appends a content hash unless disabled).
    pub name: String,
    /// Namespace of the generated object.
    pub namespace: Option<String>,
    /// Keys and values.
    pub data: BTreeMap<String, String>,
    /// Keep the name without kustomize's content hash.
    pub disable_name_suffix_hash: bool,
}

/// kustomize `generatorOptions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorOptions {
    /// Labels for generated objects.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for generated objects.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Turns off the content-hash suffix.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disable_name_suffix_hash: bool,
}

/// A kustomize builtin transformer's configuration (inline in `transformers`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Builtin {
    api_version: &'static str,
    kind: &'static str,
    metadata: BTreeMap<&'static str, &'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<BTreeMap<&'static str, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<&'static str, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    field_specs: Option<Vec<FieldSpec>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<BTreeMap<&'static str, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

impl Builtin {
    fn new(kind: &'static str, name: &'static str) -> Self {
        Self {
            api_version: "builtin",
            kind,
            metadata: BTreeMap::from([("name", name)]),
            labels: None,
            annotations: None,
            field_specs: None,
            target: None,
            patch: None,
        }
    }
}

/// Where a builtin transformer writes.
#[derive(Debug, Serialize)]
struct FieldSpec {
    path: &'static str,
    create: bool,
}

/// `kustomization.yaml`, as data.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct Kustomization {
    api_version: &'static str,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    resources: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    labels: Vec<Labels>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    patches: Vec<KustomizePatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name_suffix: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    config_map_generator: Vec<KustomizeGenerator>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    secret_generator: Vec<KustomizeGenerator>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generator_options: Option<GeneratorOptions>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    transformers: Vec<String>,
    /// The namespace set on objects that name none (as the transformer in
    /// `transformers` does), for the in-process build.
    #[serde(skip)]
    namespace_if_unset: Option<String>,
}

/// kustomize's builtin `NamespaceTransformer`, setting `namespace` only on
/// objects without one.
fn namespace_if_unset(namespace: &str) -> Value {
    json!({
        "apiVersion": "builtin",
        "kind": "NamespaceTransformer",
        "metadata": {"name": "namespace-if-unset", "namespace": namespace},
        "unsetOnly": true,
    })
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct KustomizePatch {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<PatchTarget>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<PatchOptions>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct PatchOptions {
    allow_name_change: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
struct KustomizeGenerator {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    files: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<GeneratorOptions>,
}

/// An overlay rendered in memory: relative path → content, and a digest.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedOverlay {
    files: BTreeMap<String, Vec<u8>>,
    digest: String,
    sensitive: bool,
    /// Whether the files hold a Secret: looked at on first use of
    /// [`RenderedOverlay::is_sensitive`] (only `--keep-overlays` asks).
    holds_secret: std::sync::OnceLock<bool>,
    plain: bool,
    prebuilt: Option<Vec<Value>>,
    /// What the in-process build needs; it runs on first use of
    /// [`RenderedOverlay::prebuilt`], not for a reconcile that only
    /// compares digests.
    native: Option<Box<NativeInput>>,
    native_built: std::sync::OnceLock<Option<Vec<Value>>>,
}

/// The kustomization and marker an overlay is built in process from.
#[derive(Debug, Clone, PartialEq)]
struct NativeInput {
    kustomization: Kustomization,
    marking: Option<Marking>,
}

/// The ownership marker the engine gives the objects of an overlay the
/// resource owns (kinds never set it themselves): the owner label and
/// annotation on every object, and, when asked, an ownerReference on the
/// objects in the owner's namespace. It is part of the overlay (inline
/// kustomize transformers), so `render` shows exactly what is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Marking {
    /// The owner.
    pub owner: Owner,
    /// Whether objects in the owner's namespace get an ownerReference.
    pub owner_references: bool,
}

impl Marking {
    /// The inline transformers that put the marker on every object.
    fn transformers(&self) -> Result<Vec<Builtin>, OverlayError> {
        let metadata_only = |path: &'static str| vec![FieldSpec { path, create: true }];
        let mut t = vec![
            Builtin {
                labels: Some(BTreeMap::from([(Owner::LABEL, self.owner.uid.clone())])),
                field_specs: Some(metadata_only("metadata/labels")),
                ..Builtin::new("LabelTransformer", "owner-label")
            },
            Builtin {
                annotations: Some(BTreeMap::from([(
                    Owner::ANNOTATION,
                    self.owner.annotation(),
                )])),
                field_specs: Some(metadata_only("metadata/annotations")),
                ..Builtin::new("AnnotationsTransformer", "owner-annotation")
            },
        ];
        if let (true, Some(ns)) = (self.owner_references, &self.owner.namespace) {
            let patch = json!({
                "apiVersion": "v1",
                "kind": "Any",
                "metadata": {"name": "any", "ownerReferences": [self.owner.owner_reference()]},
            });
            t.push(Builtin {
                target: Some(BTreeMap::from([("namespace", ns.clone())])),
                patch: Some(to_yaml(&patch, "owner-reference patch")?),
                ..Builtin::new("PatchTransformer", "owner-reference")
            });
        }
        Ok(t)
    }

    /// The same marker, put on built manifests in Rust (for overlays that
    /// need no kustomize build).
    fn mark(&self, manifest: &mut Value) {
        let meta = &mut manifest["metadata"];
        meta["labels"][Owner::LABEL] = json!(self.owner.uid);
        meta["annotations"][Owner::ANNOTATION] = json!(self.owner.annotation());
        let in_owner_ns = self.owner.namespace.is_some()
            && meta["namespace"].as_str() == self.owner.namespace.as_deref();
        if self.owner_references && in_owner_ns {
            let reference = json!(self.owner.owner_reference());
            match meta["ownerReferences"].as_array_mut() {
                Some(refs) => {
                    refs.retain(|r| r["uid"] != reference["uid"]);
                    refs.insert(0, reference);
                }
                None => meta["ownerReferences"] = json!([reference]),
            }
        }
    }
}

impl Overlay {
    /// True for characters kubectl and kustomize cannot carry in a string
    /// value however the YAML or JSON escapes them: DEL, the C1 controls other
    /// than NEL, and the non-characters U+FFFE and U+FFFF are refused ("yaml:
    /// control characters are not allowed"); NEL (U+0085) comes out as a
    /// space, from `kubectl kustomize` and from `kubectl apply` alike, JSON
    /// input included (the API server itself keeps it). A kind whose resources
    /// carry user text checks it with this and reports what cannot be applied
    /// instead of changing it.
    pub fn kustomize_refuses(c: char) -> bool {
        matches!(u32::from(c), 0x7f..=0x9f | 0xfffe | 0xffff)
    }

    /// Renders every file of the overlay in memory, with the ownership
    /// marker when the resource owns what it applies.
    pub fn render(
        &self,
        dir: &KustomizeDir,
        marking: Option<&Marking>,
    ) -> Result<RenderedOverlay, OverlayError> {
        let mut files = BTreeMap::new();
        let mut k = Kustomization {
            api_version: "kustomize.config.k8s.io/v1beta1",
            kind: "Kustomization",
            namespace: self
                .namespace
                .clone()
                .filter(|_| !self.namespace_unset_only),
            name_prefix: self.name_prefix.clone(),
            name_suffix: self.name_suffix.clone(),
            labels: self.labels.clone(),
            generator_options: self.generator_options.clone(),
            ..Default::default()
        };
        if let Some(namespace) = self
            .namespace
            .as_ref()
            .filter(|_| self.namespace_unset_only)
        {
            let transformer = namespace_if_unset(namespace);
            k.transformers.push(to_yaml(&transformer, "transformers")?);
            k.namespace_if_unset = Some(namespace.clone());
        }
        self.render_base(dir, &mut files, &mut k)?;
        for (i, resource) in self.resources.iter().enumerate() {
            let path = format!("resources/{i:03}.yaml");
            files.insert(path.clone(), to_yaml(resource, &path)?.into_bytes());
            k.resources.push(path);
        }
        for (i, template) in self.resource_templates.iter().enumerate() {
            let base = self.base.as_deref().unwrap_or_default();
            let text = dir.render(&format!("{base}/resources/{template}"), &self.values)?;
            if no_documents(&text) {
                // A template that renders nothing (`{% if spec.expose %}`)
                // produces no object; kustomize would refuse an empty file.
                continue;
            }
            let path = format!("templated/{i:02}-{template}");
            files.insert(path.clone(), text.into_bytes());
            k.resources.push(path);
        }
        self.render_patches(dir, &mut files, &mut k)?;
        k.config_map_generator = generators(&self.config_map_generators, "generated", &mut files);
        k.secret_generator = generators(&self.secret_generators, "secret", &mut files);
        if let Some(marking) = marking {
            for t in marking.transformers()? {
                k.transformers.push(to_yaml(&t, "transformers")?);
            }
        }
        files.insert(
            "kustomization.yaml".into(),
            to_yaml(&k, "kustomization.yaml")?.into_bytes(),
        );
        let mut rendered = RenderedOverlay::new(files);
        rendered.sensitive = self.sensitive;
        rendered.plain = self.is_plain();
        if rendered.plain {
            let mut manifests = self.resources.clone();
            if let Some(marking) = marking {
                manifests.iter_mut().for_each(|m| marking.mark(m));
            }
            rendered.prebuilt = Some(manifests);
        } else {
            rendered.native = Some(Box::new(NativeInput {
                kustomization: k,
                marking: marking.cloned(),
            }));
        }
        Ok(rendered)
    }

    /// True for an overlay of whole objects only (no base, patch, generator
    /// or transform): the engine builds it without kustomize, so nothing of
    /// it (Secret data included) is written to disk.
    pub fn is_plain(&self) -> bool {
        self.base.is_none()
            && self.namespace.is_none()
            && self.name_prefix.is_none()
            && self.name_suffix.is_none()
            && self.labels.is_empty()
            && self.patches.is_empty()
            && self.resource_templates.is_empty()
            && self.config_map_generators.is_empty()
            && self.secret_generators.is_empty()
            && self.generator_options.is_none()
    }

    fn render_base(
        &self,
        dir: &KustomizeDir,
        files: &mut BTreeMap<String, Vec<u8>>,
        k: &mut Kustomization,
    ) -> Result<(), OverlayError> {
        let Some(base) = &self.base else {
            return Ok(());
        };
        let base_files = dir
            .base(base)
            .ok_or_else(|| OverlayError::MissingBase(base.clone()))?;
        for (rel, bytes) in base_files {
            files.insert(format!("base/{rel}"), bytes.clone());
        }
        k.resources.push("base".into());
        Ok(())
    }

    fn render_patches(
        &self,
        dir: &KustomizeDir,
        files: &mut BTreeMap<String, Vec<u8>>,
        k: &mut Kustomization,
    ) -> Result<(), OverlayError> {
        for (i, patch) in self.patches.iter().enumerate() {
            let base = self.base.as_deref().unwrap_or_default();
            let name = format!("{base}/patches/{}", patch.template);
            let text = dir.render(&name, &self.values)?;
            let path = format!("patches/{i:02}-{}", patch.template);
            files.insert(path.clone(), text.into_bytes());
            k.patches.push(KustomizePatch {
                path,
                target: patch.target.clone(),
                options: patch.allow_name_change.then_some(PatchOptions {
                    allow_name_change: true,
                }),
            });
        }
        Ok(())
    }
}

/// The generator entries of `generators`, their values written as files
/// under `dir/<n>/` (so any content arrives unchanged).
fn generators(
    generators: &[ConfigMapGenerator],
    dir: &str,
    files: &mut BTreeMap<String, Vec<u8>>,
) -> Vec<KustomizeGenerator> {
    generators
        .iter()
        .enumerate()
        .map(|(i, generator)| {
            let mut sources = Vec::new();
            for (key, value) in &generator.data {
                let path = format!("{dir}/{i:02}/{key}");
                files.insert(path.clone(), value.clone().into_bytes());
                sources.push(format!("{key}={path}"));
            }
            KustomizeGenerator {
                name: generator.name.clone(),
                namespace: generator.namespace.clone(),
                files: sources,
                options: generator
                    .disable_name_suffix_hash
                    .then(|| GeneratorOptions {
                        disable_name_suffix_hash: true,
                        ..Default::default()
                    }),
            }
        })
        .collect()
}

fn to_yaml(value: &impl Serialize, what: &str) -> Result<String, OverlayError> {
    serde_saphyr::to_string(value).map_err(|e| OverlayError::Serialize {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

impl RenderedOverlay {
    /// Wraps a set of files, computing their digest.
    pub fn new(files: BTreeMap<String, Vec<u8>>) -> Self {
        let mut hasher = Sha256::new();
        for (path, bytes) in &files {
            hasher.update((path.len() as u64).to_le_bytes());
            hasher.update(path.as_bytes());
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        }
        let digest = format!("sha256:{}", hex::encode(hasher.finalize()));
        Self {
            files,
            digest,
            sensitive: false,
            holds_secret: std::sync::OnceLock::new(),
            plain: false,
            prebuilt: None,
            native: None,
            native_built: std::sync::OnceLock::new(),
        }
    }

    /// The built manifests, when the overlay needs no `kubectl kustomize`
    /// run: whole objects only (see [`Overlay::is_plain`]), or an overlay
    /// the engine builds in process (`in_process.rs`).
    pub fn prebuilt(&self) -> Option<&[Value]> {
        if self.plain {
            return self.prebuilt.as_deref();
        }
        let input = self.native.as_ref()?;
        self.native_built
            .get_or_init(|| {
                in_process::build(&input.kustomization, &self.files, input.marking.as_ref())
            })
            .as_deref()
    }

    /// True for an overlay of whole objects only (see [`Overlay::is_plain`]).
    pub fn is_plain(&self) -> bool {
        self.plain
    }

    /// True when the overlay may hold Secret data, whichever way it got
    /// there: the kind says so ([`Overlay::sensitive`]), or a file holds a
    /// Secret, a secret generator or a patch making one (see `secrets.rs`).
    /// The objects it builds to are looked at too, by [`is_secret`], where
    /// they are known.
    pub fn is_sensitive(&self) -> bool {
        self.sensitive
            || *self
                .holds_secret
                .get_or_init(|| secrets::holds_secret(&self.files))
    }

    /// A hint to add to a failed build of this overlay: the first line of
    /// a rendered template where a value touches text (`hints.rs`), shown
    /// unless the overlay may hold Secret data.
    pub fn build_hint(&self) -> Option<String> {
        hints::quoted_next_to_text(&self.files, !self.is_sensitive())
    }

    /// sha256 over every file's path and content.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The files, by relative path.
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.files
    }

    /// Writes the overlay into `dir`, readable by its owner only: the
    /// directories it creates (`dir` and its missing parents too) 0700,
    /// files 0600.
    pub fn write_to(&self, dir: &Path) -> Result<(), OverlayError> {
        private_dir(dir).map_err(|source| OverlayError::Write {
            path: dir.display().to_string(),
            source,
        })?;
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            let write_err = |source| OverlayError::Write {
                path: path.display().to_string(),
                source,
            };
            if let Some(parent) = path.parent() {
                private_dir(parent).map_err(write_err)?;
            }
            private_file(&path, bytes).map_err(write_err)?;
        }
        Ok(())
    }
}

/// Creates `dir` and its missing parents, each 0700.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to `path`, a file only its owner can read (0600).
fn private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_kubectl_cannot_carry_is_refused_and_the_rest_is_not() {
        for c in [
            '\u{7f}', '\u{80}', '\u{85}', '\u{9f}', '\u{fffe}', '\u{ffff}',
        ] {
            assert!(Overlay::kustomize_refuses(c), "U+{:04X}", u32::from(c));
        }
        for c in ['\t', '\n', '~', '\u{a0}', '\u{2028}', '\u{feff}', '😀'] {
            assert!(!Overlay::kustomize_refuses(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn a_template_rendering_nothing_is_no_document() {
        assert!(no_documents(""));
        assert!(no_documents("\n  \n# only a comment\n---\n"));
        assert!(!no_documents("---\napiVersion: v1\n"));
    }

    /// A kustomize directory holding one kind folder of `files`.
    pub(super) fn kind_folder(
        kind: &str,
        files: &[(&str, &str)],
    ) -> (tempfile::TempDir, KustomizeDir) {
        let root = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = root.path().join(kind).join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let loaded = KustomizeDir::load(root.path()).unwrap();
        (root, loaded)
    }

    fn kustomize_dir() -> (tempfile::TempDir, KustomizeDir) {
        kind_folder(
            "k",
            &[
                ("base/kustomization.yaml", "resources: [cm.yaml]\n"),
                (
                    "base/cm.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
                ),
                (
                    "patches/p.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  v: {{ v }}\n",
                ),
            ],
        )
    }

    fn overlay(v: &str) -> Overlay {
        Overlay {
            base: Some("k".into()),
            namespace: Some("ns".into()),
            values: json!({ "v": v }),
            patches: vec![PatchTemplate {
                template: "p.yaml".into(),
                target: None,
                allow_name_change: false,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn renders_a_self_contained_overlay() {
        let (_d, k) = kustomize_dir();
        let r = overlay("x").render(&k, None).unwrap();
        let names: Vec<_> = r.files().keys().cloned().collect();
        assert_eq!(
            names,
            [
                "base/cm.yaml",
                "base/kustomization.yaml",
                "kustomization.yaml",
                "patches/00-p.yaml"
            ]
        );
        let kz = String::from_utf8(r.files()["kustomization.yaml"].clone()).unwrap();
        assert!(kz.contains("namespace: ns"), "{kz}");
        assert!(kz.contains("- base"), "{kz}");
    }

    #[test]
    fn digest_follows_content() {
        let (_d, k) = kustomize_dir();
        let a = overlay("x").render(&k, None).unwrap();
        let b = overlay("x").render(&k, None).unwrap();
        let c = overlay("y").render(&k, None).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert!(a.digest().starts_with("sha256:"));
    }

    #[test]
    fn generator_values_are_files() {
        let (_d, k) = kustomize_dir();
        let o = Overlay {
            config_map_generators: vec![ConfigMapGenerator {
                name: "g".into(),
                namespace: None,
                data: BTreeMap::from([("rate".into(), "a=b\n\"c\"".into())]),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = o.render(&k, None).unwrap();
        assert_eq!(r.files()["generated/00/rate"], b"a=b\n\"c\"");
        let kz = String::from_utf8(r.files()["kustomization.yaml"].clone()).unwrap();
        assert!(kz.contains("rate=generated/00/rate"), "{kz}");
    }

    #[test]
    fn sensitivity_is_carried_to_the_rendering_but_not_the_digest() {
        let (_d, k) = kustomize_dir();
        let plain = overlay("x").render(&k, None).unwrap();
        let secret = Overlay {
            sensitive: true,
            ..overlay("x")
        }
        .render(&k, None)
        .unwrap();
        assert!(!plain.is_sensitive());
        assert!(secret.is_sensitive());
        assert_eq!(plain.digest(), secret.digest());
    }

    /// A kind folder whose base holds `base_extra` beside a ConfigMap, with a
    /// resource template and a patch template each rendering `text`.
    fn secret_kind(base_extra: &str) -> (tempfile::TempDir, KustomizeDir) {
        let resources = if base_extra.is_empty() {
            "resources: [cm.yaml]\n"
        } else {
            "resources: [cm.yaml, extra.yaml]\n"
        };
        kind_folder(
            "k",
            &[
                ("base/kustomization.yaml", resources),
                (
                    "base/cm.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
                ),
                ("base/extra.yaml", base_extra),
                (
                    "resources/secret.yaml",
                    "apiVersion: v1\nkind: {{ kind }}\nmetadata:\n  name: s\nstringData:\n  password: {{ v }}\n",
                ),
                (
                    "patches/p.yaml",
                    "apiVersion: v1\nkind: {{ kind }}\nmetadata:\n  name: cm\ndata:\n  v: {{ v }}\n",
                ),
                (
                    "patches/to-secret.json",
                    r#"[{"op": "replace", "path": "/kind", "value": "Secret"}]"#,
                ),
            ],
        )
    }

    fn templated(kind: &str) -> serde_json::Value {
        json!({"kind": kind, "v": "hunter2"})
    }

    #[test]
    fn any_secret_in_the_rendered_files_makes_the_overlay_sensitive() {
        let (_d, k) = secret_kind("");
        let base = || Overlay {
            base: Some("k".into()),
            ..Default::default()
        };
        let of = |kind: &str| Overlay {
            values: templated(kind),
            ..base()
        };
        let patch = |template: &str| PatchTemplate {
            template: template.into(),
            target: None,
            allow_name_change: false,
        };
        let resource_template = || vec!["secret.yaml".to_string()];
        let sensitive = |o: Overlay| o.render(&k, None).unwrap().is_sensitive();
        assert!(!sensitive(base()), "a ConfigMap only");
        assert!(!sensitive(Overlay {
            resource_templates: resource_template(),
            patches: vec![patch("p.yaml")],
            ..of("ConfigMap")
        }));
        assert!(sensitive(Overlay {
            resource_templates: resource_template(),
            ..of("Secret")
        }));
        assert!(sensitive(Overlay {
            patches: vec![patch("p.yaml")],
            ..of("Secret")
        }));
        assert!(sensitive(Overlay {
            patches: vec![patch("to-secret.json")],
            ..of("ConfigMap")
        }));
        assert!(sensitive(Overlay {
            secret_generators: vec![ConfigMapGenerator {
                name: "g".into(),
                ..Default::default()
            }],
            ..base()
        }));
        assert!(sensitive(Overlay {
            resources: vec![
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}})
            ],
            ..Default::default()
        }));
    }

    #[test]
    fn a_secret_in_the_base_makes_the_overlay_sensitive() {
        let (_d, k) = secret_kind("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n");
        let o = Overlay {
            base: Some("k".into()),
            ..Default::default()
        };
        assert!(o.render(&k, None).unwrap().is_sensitive());
        let (_d, k) = secret_kind(
            "apiVersion: builtin\nkind: SecretGenerator\nmetadata:\n  name: s\nliterals: [a=b]\n",
        );
        assert!(o.render(&k, None).unwrap().is_sensitive());
    }

    #[test]
    fn writes_files_to_disk() {
        let (_d, k) = kustomize_dir();
        let out = tempfile::tempdir().unwrap();
        overlay("x")
            .render(&k, None)
            .unwrap()
            .write_to(out.path())
            .unwrap();
        assert!(out.path().join("base/cm.yaml").is_file());
        assert!(out.path().join("patches/00-p.yaml").is_file());
    }

    fn marking(owner_references: bool) -> Marking {
        Marking {
            owner: Owner {
                api_version: "nuvolaris.org/v1".into(),
                kind: "Sample".into(),
                namespace: Some("ns".into()),
                name: "web".into(),
                uid: "u-1".into(),
            },
            owner_references,
        }
    }

    #[test]
    fn an_owned_overlay_carries_the_marker_as_transformers() {
        let (_d, k) = kustomize_dir();
        let r = overlay("x").render(&k, Some(&marking(true))).unwrap();
        let kz = String::from_utf8(r.files()["kustomization.yaml"].clone()).unwrap();
        assert!(kz.contains("LabelTransformer"), "{kz}");
        assert!(kz.contains("AnnotationsTransformer"), "{kz}");
        assert!(kz.contains("PatchTransformer"), "{kz}");
        assert!(kz.contains("Sample.nuvolaris.org/ns/web"), "{kz}");
        assert!(r.prebuilt().is_none(), "a base needs kustomize");
        let unmarked = overlay("x").render(&k, None).unwrap();
        assert_ne!(r.digest(), unmarked.digest());
        let no_refs = overlay("x").render(&k, Some(&marking(false))).unwrap();
        let kz = String::from_utf8(no_refs.files()["kustomization.yaml"].clone()).unwrap();
        assert!(!kz.contains("PatchTransformer"), "{kz}");
    }

    #[test]
    fn a_plain_overlay_is_built_and_marked_in_memory() {
        let (_d, k) = kustomize_dir();
        let o = Overlay {
            resources: vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}}),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "namespace": "other",
                    "labels": {"keep": "me"}}}),
            ],
            ..Default::default()
        };
        let r = o.render(&k, Some(&marking(true))).unwrap();
        let built = r.prebuilt().unwrap();
        assert_eq!(built[0]["metadata"]["labels"][Owner::LABEL], "u-1");
        assert_eq!(
            built[0]["metadata"]["annotations"][Owner::ANNOTATION],
            "Sample.nuvolaris.org/ns/web"
        );
        assert_eq!(built[0]["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(built[1]["metadata"]["labels"]["keep"], "me");
        assert_eq!(built[1]["metadata"]["labels"][Owner::LABEL], "u-1");
        assert!(
            built[1]["metadata"]["ownerReferences"].is_null(),
            "not in the owner's namespace"
        );
        let unmarked = o.render(&k, None).unwrap();
        assert_eq!(unmarked.prebuilt().unwrap(), o.resources.as_slice());
    }
}
