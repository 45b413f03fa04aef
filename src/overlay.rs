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
use sha2::{Digest, Sha256};

use crate::templates::{KustomizeDir, TemplateError};

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

/// True for characters kustomize refuses in a string value however the YAML
/// escapes them ("yaml: control characters are not allowed"): DEL, the C1
/// controls other than NEL, and the non-characters U+FFFE and U+FFFF. A
/// kind whose resources carry user text checks it with this and reports
/// what cannot be applied.
pub fn kustomize_refuses(c: char) -> bool {
    matches!(u32::from(c), 0x7f..=0x84 | 0x86..=0x9f | 0xfffe | 0xffff)
}

/// What a kind wants applied, described as data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overlay {
    /// The kustomize folder whose `base/` is copied in and whose `patches/`
    /// hold the templates; `None` for an overlay of generated resources only.
    pub base: Option<String>,
    /// kustomize `namespace`: sets the namespace of every object.
    pub namespace: Option<String>,
    /// kustomize `labels` entries.
    pub labels: Vec<Labels>,
    /// Patches rendered from templates.
    pub patches: Vec<PatchTemplate>,
    /// Complete objects added as resources, serialized from data.
    pub resources: Vec<serde_json::Value>,
    /// kustomize `configMapGenerator` entries.
    pub config_map_generators: Vec<ConfigMapGenerator>,
    /// kustomize `generatorOptions`.
    pub generator_options: Option<GeneratorOptions>,
    /// The overlay holds Secret data: `--keep-overlays` does not keep it.
    pub sensitive: bool,
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

/// A patch: a template of the kind's `patches/` folder and the values it sees.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchTemplate {
    /// File name in `<kind>/patches/`.
    pub template: String,
    /// The template context (a JSON object).
    pub values: serde_json::Value,
    /// Which objects the patch applies to (kustomize `target`).
    pub target: Option<Target>,
    /// Lets a strategic-merge patch rename its target.
    pub allow_name_change: bool,
}

/// A kustomize patch target.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Target {
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

/// A kustomize `configMapGenerator` entry. Values are written as files, so
/// any content (newlines, `=`, quotes) arrives unchanged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigMapGenerator {
    /// Name (kustomize appends a content hash unless disabled).
    pub name: String,
    /// Namespace of the generated ConfigMap.
    pub namespace: Option<String>,
    /// Keys and values.
    pub data: BTreeMap<String, String>,
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

/// `kustomization.yaml`, as data.
#[derive(Debug, Default, Serialize)]
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    config_map_generator: Vec<KustomizeGenerator>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generator_options: Option<GeneratorOptions>,
}

#[derive(Debug, Serialize)]
struct KustomizePatch {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<Target>,
    #[serde(skip_serializing_if = "Option::is_none")]
    options: Option<PatchOptions>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PatchOptions {
    allow_name_change: bool,
}

#[derive(Debug, Serialize)]
struct KustomizeGenerator {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    files: Vec<String>,
}

/// An overlay rendered in memory: relative path → content, and a digest.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedOverlay {
    files: BTreeMap<String, Vec<u8>>,
    digest: String,
    sensitive: bool,
}

impl Overlay {
    /// Renders every file of the overlay in memory.
    pub fn render(&self, dir: &KustomizeDir) -> Result<RenderedOverlay, OverlayError> {
        let mut files = BTreeMap::new();
        let mut k = Kustomization {
            api_version: "kustomize.config.k8s.io/v1beta1",
            kind: "Kustomization",
            namespace: self.namespace.clone(),
            labels: self.labels.clone(),
            generator_options: self.generator_options.clone(),
            ..Default::default()
        };
        if let Some(base) = &self.base {
            let base_files = dir
                .base(base)
                .ok_or_else(|| OverlayError::MissingBase(base.clone()))?;
            for (rel, bytes) in base_files {
                files.insert(format!("base/{rel}"), bytes.clone());
            }
            k.resources.push("base".into());
        }
        for (i, resource) in self.resources.iter().enumerate() {
            let path = format!("resources/{i:03}.yaml");
            files.insert(path.clone(), to_yaml(resource, &path)?.into_bytes());
            k.resources.push(path);
        }
        for (i, patch) in self.patches.iter().enumerate() {
            let base = self.base.as_deref().unwrap_or_default();
            let name = format!("{base}/patches/{}", patch.template);
            let text = dir.render(&name, &patch.values)?;
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
        for (i, generator) in self.config_map_generators.iter().enumerate() {
            let mut sources = Vec::new();
            for (key, value) in &generator.data {
                let path = format!("generated/{i:02}/{key}");
                files.insert(path.clone(), value.clone().into_bytes());
                sources.push(format!("{key}={path}"));
            }
            k.config_map_generator.push(KustomizeGenerator {
                name: generator.name.clone(),
                namespace: generator.namespace.clone(),
                files: sources,
            });
        }
        files.insert(
            "kustomization.yaml".into(),
            to_yaml(&k, "kustomization.yaml")?.into_bytes(),
        );
        let mut rendered = RenderedOverlay::new(files);
        rendered.sensitive = self.sensitive;
        Ok(rendered)
    }
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
        }
    }

    /// True when the overlay holds Secret data (see [`Overlay::sensitive`]).
    pub fn is_sensitive(&self) -> bool {
        self.sensitive
    }

    /// sha256 over every file's path and content.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The files, by relative path.
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.files
    }

    /// Writes the overlay into `dir` (which must exist).
    pub fn write_to(&self, dir: &Path) -> Result<(), OverlayError> {
        for (rel, bytes) in &self.files {
            let path = dir.join(rel);
            let write_err = |source| OverlayError::Write {
                path: path.display().to_string(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(write_err)?;
            }
            std::fs::write(&path, bytes).map_err(write_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kustomize_dir() -> (tempfile::TempDir, KustomizeDir) {
        let dir = tempfile::tempdir().unwrap();
        let kind = dir.path().join("k");
        std::fs::create_dir_all(kind.join("base")).unwrap();
        std::fs::create_dir_all(kind.join("patches")).unwrap();
        std::fs::write(
            kind.join("base/kustomization.yaml"),
            "resources: [cm.yaml]\n",
        )
        .unwrap();
        std::fs::write(
            kind.join("base/cm.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
        )
        .unwrap();
        std::fs::write(
            kind.join("patches/p.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  v: {{ v }}\n",
        )
        .unwrap();
        let loaded = KustomizeDir::load(dir.path()).unwrap();
        (dir, loaded)
    }

    fn overlay(v: &str) -> Overlay {
        Overlay {
            base: Some("k".into()),
            namespace: Some("ns".into()),
            patches: vec![PatchTemplate {
                template: "p.yaml".into(),
                values: json!({ "v": v }),
                target: None,
                allow_name_change: false,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn renders_a_self_contained_overlay() {
        let (_d, k) = kustomize_dir();
        let r = overlay("x").render(&k).unwrap();
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
        let a = overlay("x").render(&k).unwrap();
        let b = overlay("x").render(&k).unwrap();
        let c = overlay("y").render(&k).unwrap();
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
            }],
            ..Default::default()
        };
        let r = o.render(&k).unwrap();
        assert_eq!(r.files()["generated/00/rate"], b"a=b\n\"c\"");
        let kz = String::from_utf8(r.files()["kustomization.yaml"].clone()).unwrap();
        assert!(kz.contains("rate=generated/00/rate"), "{kz}");
    }

    #[test]
    fn sensitivity_is_carried_to_the_rendering_but_not_the_digest() {
        let (_d, k) = kustomize_dir();
        let plain = overlay("x").render(&k).unwrap();
        let secret = Overlay {
            sensitive: true,
            ..overlay("x")
        }
        .render(&k)
        .unwrap();
        assert!(!plain.is_sensitive());
        assert!(secret.is_sensitive());
        assert_eq!(plain.digest(), secret.digest());
    }

    #[test]
    fn writes_files_to_disk() {
        let (_d, k) = kustomize_dir();
        let out = tempfile::tempdir().unwrap();
        overlay("x")
            .render(&k)
            .unwrap()
            .write_to(out.path())
            .unwrap();
        assert!(out.path().join("base/cm.yaml").is_file());
        assert!(out.path().join("patches/00-p.yaml").is_file());
    }
}
