//! The kustomize directory: every kind's base files and patch templates,
//! loaded and parsed once at start-up.
//!
//! Layout: `<dir>/<kind>/base/**` (plain kustomize, copied verbatim into each
//! overlay) and `<dir>/<kind>/patches/*.yaml` (Tera templates).
//!
//! Values reach templates only in serialized form. Every `{{ expression }}` is
//! escaped by [`yaml_scalar`], which turns it into a double-quoted YAML string,
//! so a value can never add keys, documents or lines to a rendered file. The
//! `json` filter is the one way to emit a typed scalar (a number or a boolean)
//! or a structure: it serializes the value as JSON, which YAML reads as flow
//! style. Templates that try to bypass this (`| safe`, `json_encode`) are
//! rejected when they are loaded.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tera::{Context, Tera};

/// An error while loading or rendering templates.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The kustomize directory or a file in it could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A template does not parse, or uses a forbidden construct.
    #[error("template {name} is invalid: {reason}")]
    Invalid {
        /// The template's name (`<kind>/patches/<file>`).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kind has no `base/kustomization.yaml`.
    #[error(
        "kustomize directory {dir} has no base for kind {kind} (expected {kind}/base/kustomization.yaml)"
    )]
    MissingBase {
        /// The kustomize directory.
        dir: PathBuf,
        /// The kind folder.
        kind: String,
    },
    /// Two kustomize directories hold a folder of the same name.
    #[error("kind folder {kind} is in both {first} and {second}")]
    Duplicate {
        /// The folder.
        kind: String,
        /// One directory.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// A template asked for by a kind does not exist.
    #[error("no template named {0}")]
    Unknown(String),
    /// Rendering failed (for example a variable the template needs is missing).
    #[error("rendering {name} failed: {reason}")]
    Render {
        /// The template's name.
        name: String,
        /// Tera's explanation, with its causes.
        reason: String,
    },
}

/// The parsed kustomize directories: per kind folder, its base files and
/// its templates (`patches/`, `resources/`).
#[derive(Debug)]
pub struct KustomizeDir {
    tera: Tera,
    bases: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    roots: BTreeMap<String, PathBuf>,
}

/// The folders of a kind folder that hold templates.
const TEMPLATE_DIRS: [&str; 2] = ["patches", "resources"];

impl KustomizeDir {
    /// Loads every kind folder under `root`, parsing all templates. A broken
    /// template is an error naming its file.
    pub fn load(root: &Path) -> Result<Self, TemplateError> {
        Self::load_all(std::slice::from_ref(&root.to_path_buf()))
    }

    /// Loads every kind folder under each of `roots` (a kind folder's name
    /// must be unique across them).
    pub fn load_all(roots: &[PathBuf]) -> Result<Self, TemplateError> {
        let mut dir = Self {
            tera: new_tera(),
            bases: BTreeMap::new(),
            roots: BTreeMap::new(),
        };
        let mut templates = Vec::new();
        for root in roots {
            for entry in kind_folders(root)? {
                let kind = entry.file_name().to_string_lossy().into_owned();
                if let Some(other) = dir.roots.get(&kind) {
                    return Err(TemplateError::Duplicate {
                        kind,
                        first: other.clone(),
                        second: root.clone(),
                    });
                }
                dir.load_kind(root, &entry.path(), &kind, &mut templates)?;
                dir.roots.insert(kind, root.clone());
            }
        }
        for (name, text) in &templates {
            dir.tera
                .add_raw_template(name, text)
                .map_err(|e| TemplateError::Invalid {
                    name: name.clone(),
                    reason: error_chain(&e),
                })?;
        }
        Ok(dir)
    }

    fn load_kind(
        &mut self,
        root: &Path,
        folder: &Path,
        kind: &str,
        templates: &mut Vec<(String, String)>,
    ) -> Result<(), TemplateError> {
        let base_dir = folder.join("base");
        if !base_dir.join("kustomization.yaml").is_file() {
            return Err(TemplateError::MissingBase {
                dir: root.to_path_buf(),
                kind: kind.to_string(),
            });
        }
        let mut files = BTreeMap::new();
        collect_files(&base_dir, &base_dir, &mut files)?;
        self.bases.insert(kind.to_string(), files);
        for sub in TEMPLATE_DIRS {
            let dir = folder.join(sub);
            if !dir.is_dir() {
                continue;
            }
            let mut found = BTreeMap::new();
            collect_files(&dir, &dir, &mut found)?;
            for (rel, bytes) in found {
                let name = format!("{kind}/{sub}/{rel}");
                let text = String::from_utf8(bytes).map_err(|_| TemplateError::Invalid {
                    name: name.clone(),
                    reason: "not UTF-8".into(),
                })?;
                check_no_escape_bypass(&name, &text)?;
                templates.push((name, text));
            }
        }
        Ok(())
    }

    /// The kind folders found, with the directory each was found in.
    pub fn kinds(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.roots.iter().map(|(k, r)| (k.as_str(), r.as_path()))
    }

    /// The templates of `kind`, relative to its folder (`patches/x.yaml`).
    pub fn templates_of(&self, kind: &str) -> Vec<String> {
        let prefix = format!("{kind}/");
        self.tera
            .get_template_names()
            .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// The base files of `kind` (relative path → content).
    pub fn base(&self, kind: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.bases.get(kind)
    }

    /// Renders the template `name` (e.g. `sample/patches/deployment.yaml`) with `values`.
    pub fn render(&self, name: &str, values: &impl Serialize) -> Result<String, TemplateError> {
        if !self.tera.get_template_names().any(|n| n == name) {
            return Err(TemplateError::Unknown(name.to_string()));
        }
        let context = Context::from_serialize(values).map_err(|e| TemplateError::Render {
            name: name.to_string(),
            reason: error_chain(&e),
        })?;
        self.tera
            .render(name, &context)
            .map_err(|e| TemplateError::Render {
                name: name.to_string(),
                reason: error_chain(&e),
            })
    }
}

/// The kind folders (directories) under `root`, sorted.
fn kind_folders(root: &Path) -> Result<Vec<std::fs::DirEntry>, TemplateError> {
    let mut kinds: Vec<_> = std::fs::read_dir(root)
        .map_err(|source| TemplateError::Read {
            path: root.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .collect();
    kinds.sort_by_key(|e| e.file_name());
    Ok(kinds)
}

fn new_tera() -> Tera {
    let mut tera = Tera::default();
    tera.autoescape_on(vec![".yaml", ".yml"]);
    tera.set_escape_fn(yaml_scalar);
    tera.register_filter("json", JsonFilter);
    tera
}

/// Rejects templates that would emit a value without serializing it.
fn check_no_escape_bypass(name: &str, text: &str) -> Result<(), TemplateError> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    for forbidden in ["|safe", "json_encode", "{%raw%}", "autoescape"] {
        if compact.contains(forbidden) {
            return Err(TemplateError::Invalid {
                name: name.to_string(),
                reason: format!(
                    "uses `{forbidden}`; values must go through the default escaping or the `json` filter"
                ),
            });
        }
    }
    Ok(())
}

fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, Vec<u8>>,
) -> Result<(), TemplateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TemplateError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_files(root, &path, out)?;
        } else {
            let bytes = std::fs::read(&path).map_err(|source| TemplateError::Read {
                path: path.clone(),
                source,
            })?;
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.insert(rel, bytes);
        }
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

/// Serializes any string as a YAML double-quoted scalar.
///
/// JSON string syntax is a subset of YAML's double-quoted style; on top of
/// serde_json's escaping, characters YAML does not allow unescaped in a stream
/// (DEL, the C1 controls, the byte-order mark, lone line separators) are
/// written as `\uXXXX` so that any input yields a valid, one-line scalar.
pub fn yaml_scalar(value: &str) -> String {
    let json = serde_json::Value::String(value.to_string()).to_string();
    escape_non_printable(&json)
}

fn escape_non_printable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        let code = c as u32;
        let needs_escape = code == 0x7f
            || (0x80..=0x9f).contains(&code)
            || code == 0xfeff
            || code == 0x2028
            || code == 0x2029
            || (0xfffe..=0xffff).contains(&code);
        if needs_escape {
            out.push_str(&format!("\\u{code:04x}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// `{{ value | json }}`: the value serialized as JSON (valid YAML flow style).
struct JsonFilter;

impl tera::Filter for JsonFilter {
    fn filter(
        &self,
        value: &tera::Value,
        _args: &HashMap<String, tera::Value>,
    ) -> tera::Result<tera::Value> {
        let json = serde_json::to_string(value).map_err(tera::Error::json)?;
        Ok(tera::Value::String(escape_non_printable(&json)))
    }

    fn is_safe(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir_with(template: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let kind = dir.path().join("k");
        std::fs::create_dir_all(kind.join("base")).unwrap();
        std::fs::create_dir_all(kind.join("patches")).unwrap();
        std::fs::write(kind.join("base/kustomization.yaml"), "resources: []\n").unwrap();
        std::fs::write(kind.join("patches/p.yaml"), template).unwrap();
        dir
    }

    #[test]
    fn default_escaping_quotes_every_value() {
        let dir = dir_with("name: {{ name }}\ncount: {{ count | json }}\n");
        let k = KustomizeDir::load(dir.path()).unwrap();
        let out = k
            .render("k/patches/p.yaml", &json!({"name": "a: b", "count": 3}))
            .unwrap();
        assert_eq!(out, "name: \"a: b\"\ncount: 3\n");
    }

    #[test]
    fn broken_template_is_an_error_naming_the_file() {
        let dir = dir_with("name: {{ name \n");
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("k/patches/p.yaml"), "{err}");
    }

    #[test]
    fn safe_filter_is_rejected() {
        let dir = dir_with("name: {{ name | safe }}\n");
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("safe"), "{err}");
    }

    #[test]
    fn missing_base_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("x/patches")).unwrap();
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no base for kind x"), "{err}");
    }

    #[test]
    fn scalar_escapes_yaml_hostile_characters() {
        assert_eq!(yaml_scalar("a\nb"), "\"a\\nb\"");
        assert_eq!(
            yaml_scalar("\u{7f}\u{85}\u{feff}"),
            "\"\\u007f\\u0085\\ufeff\""
        );
    }
}
