//! A kind folder as one object, and back: `kind pack DIR` prints the
//! folder's `KindDefinition` with its files carried in `spec.files`
//! (`base/…`, `patches/…`, `resources/…`, each as text); `kind unpack`
//! writes the folder again. The folder stays the authoring and review
//! form; the packed object is what travels (a file, a pipe, later the
//! cluster).
//!
//! The files come back byte for byte, and so does `kind.yaml`: its text
//! travels in the annotation [`KIND_FILE_ANNOTATION`]. When the packed
//! definition was changed since (its spec no longer what that text says),
//! `kind.yaml` is written from the definition instead (keys in order, no
//! comments): what comes back is always what the definition says.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::file;

/// The most a packed definition may carry (its files and its spec): a
/// Kubernetes object stays well below etcd's limit of 1.5 MiB.
pub const MAX_PACKED_BYTES: usize = 512 * 1024;

/// The annotation carrying `kind.yaml`'s own text (comments and layout).
pub const KIND_FILE_ANNOTATION: &str = "kustomize-operator.io/kind-file";

/// The folders of a kind folder that a packed definition carries.
pub const FOLDERS: [&str; 3] = ["base", "patches", "resources"];

/// The field of a definition's spec that is the definition's, not the
/// kind's: which of its revisions serves which resources.
pub const ROLLOUT_FIELD: &str = "rollout";

/// Why a folder cannot be packed, or a definition unpacked.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A file or directory cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kind folder holds something a packed definition cannot carry.
    #[error("{path}: {reason}")]
    Unpackable {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The packed definition is not right.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which input (a file name, or `standard input`).
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// Together, the files are larger than a definition may be.
    #[error("{what}: {size} bytes, more than the {MAX_PACKED_BYTES} a kind definition may carry")]
    TooLarge {
        /// The folder or file.
        what: String,
        /// Its size.
        size: usize,
    },
}

/// The packed definition of the kind folder `dir`, as YAML.
pub fn pack(dir: &Path) -> Result<String, PackError> {
    let kind_file = dir.join(file::FILE_NAME);
    let text = read_text(&kind_file)?;
    let mut definition: Value =
        serde_saphyr::from_str(&text).map_err(|e| PackError::Unpackable {
            path: kind_file.clone(),
            reason: format!("not YAML: {e}"),
        })?;
    check_top_level(dir)?;
    let files = folder_files(dir)?;
    let size: usize = text.len() + files.values().map(String::len).sum::<usize>();
    if size > MAX_PACKED_BYTES {
        return Err(PackError::TooLarge {
            what: dir.display().to_string(),
            size,
        });
    }
    let spec = definition
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| PackError::Unpackable {
            path: kind_file.clone(),
            reason: "spec: missing, or not a mapping".into(),
        })?;
    if spec.contains_key("files") {
        return Err(PackError::Unpackable {
            path: kind_file,
            reason: "spec.files: a kind file does not carry files; its folder does".into(),
        });
    }
    spec.insert(
        "files".into(),
        serde_json::to_value(files).unwrap_or_default(),
    );
    if let Some(metadata) = definition
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        metadata.insert(
            "annotations".into(),
            serde_json::json!({ KIND_FILE_ANNOTATION: text }),
        );
    }
    serde_saphyr::to_string(&definition).map_err(|e| PackError::Invalid {
        what: dir.display().to_string(),
        reason: e.to_string(),
    })
}

/// Writes the kind folder of the packed definition `text` (read from
/// `what`) under `out` (as `out/<metadata.name>/`, which must not exist
/// yet); returns the folder.
pub fn unpack(text: &str, what: &str, out: &Path) -> Result<PathBuf, PackError> {
    let (kind_file, files) = split(text, what)?;
    let name = kind_name(&kind_file, what)?;
    let folder = out.join(&name);
    if folder.exists() {
        return Err(PackError::Unpackable {
            path: folder,
            reason: "exists already (unpack writes a new folder)".into(),
        });
    }
    write(
        &folder.join(file::FILE_NAME),
        &kind_file_text(&kind_file, what)?,
    )?;
    for (path, content) in &files {
        write(&folder.join(path), content)?;
    }
    Ok(folder)
}

/// `kind.yaml`'s text: as packed, if the definition still says what it
/// says; else the definition (its name, spec and identity) written out.
fn kind_file_text(definition: &Value, what: &str) -> Result<String, PackError> {
    let kind_file = serde_json::json!({
        "apiVersion": definition["apiVersion"],
        "kind": definition["kind"],
        "metadata": {"name": definition["metadata"]["name"]},
        "spec": definition["spec"],
    });
    let packed = definition["metadata"]["annotations"][KIND_FILE_ANNOTATION].as_str();
    if let Some(text) = packed {
        let same = serde_saphyr::from_str::<Value>(text).is_ok_and(|v| v == kind_file);
        if same {
            return Ok(text.to_string());
        }
    }
    serde_saphyr::to_string(&kind_file).map_err(|e| PackError::Invalid {
        what: what.into(),
        reason: e.to_string(),
    })
}

/// [`unpack`] of the packed definition in `file` (`-`: standard input).
pub fn unpack_file(file: &Path, out: &Path) -> Result<PathBuf, PackError> {
    let io = |source| PackError::Io {
        path: file.to_path_buf(),
        source,
    };
    if file.as_os_str() == "-" {
        let text = std::io::read_to_string(std::io::stdin()).map_err(io)?;
        return unpack(&text, "standard input", out);
    }
    let text = std::fs::read_to_string(file).map_err(io)?;
    unpack(&text, &file.display().to_string(), out)
}

/// The definition without its files, and its files (each path checked).
fn split(text: &str, what: &str) -> Result<(Value, BTreeMap<String, String>), PackError> {
    let invalid = |reason: String| PackError::Invalid {
        what: what.into(),
        reason,
    };
    if text.len() > MAX_PACKED_BYTES {
        return Err(PackError::TooLarge {
            what: what.into(),
            size: text.len(),
        });
    }
    let mut definition: Value =
        serde_saphyr::from_str(text).map_err(|e| invalid(format!("not YAML: {e}")))?;
    let files = definition
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .and_then(|spec| spec.remove("files"))
        .ok_or_else(|| invalid("spec.files: missing (is this a packed kind definition?)".into()))?;
    // Not the kind's: which of the definition's revisions serves whom.
    if let Some(spec) = definition.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove(ROLLOUT_FIELD);
    }
    let files: BTreeMap<String, String> = serde_json::from_value(files)
        .map_err(|e| invalid(format!("spec.files: a mapping of paths to text: {e}")))?;
    for path in files.keys() {
        check_path(path).map_err(|reason| invalid(format!("spec.files[{path}]: {reason}")))?;
    }
    Ok((definition, files))
}

/// `metadata.name`, usable as a folder name.
fn kind_name(definition: &Value, what: &str) -> Result<String, PackError> {
    let name = definition["metadata"]["name"].as_str().unwrap_or_default();
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if plain {
        Ok(name.to_string())
    } else {
        Err(PackError::Invalid {
            what: what.into(),
            reason: format!(
                "metadata.name: {name:?} is not a kind name (lowercase letters, digits, '-')"
            ),
        })
    }
}

/// A carried file's path: relative, inside one of [`FOLDERS`], no `..`.
fn check_path(path: &str) -> Result<(), String> {
    let mut components = Path::new(path).components();
    let first = match components.next() {
        Some(Component::Normal(first)) => first.to_string_lossy().into_owned(),
        _ => return Err("not a relative path".into()),
    };
    if !FOLDERS.contains(&first.as_str()) {
        return Err(format!("outside {}", FOLDERS.join("/, ") + "/"));
    }
    let rest: Vec<_> = components.collect();
    if rest.is_empty() || !rest.iter().all(|c| matches!(c, Component::Normal(_))) {
        return Err("not a file inside its folder".into());
    }
    Ok(())
}

/// Refuses a kind folder entry that packing would leave behind.
fn check_top_level(dir: &Path) -> Result<(), PackError> {
    for entry in read_dir(dir)? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let known = name == file::FILE_NAME || FOLDERS.contains(&name.as_str());
        if !known {
            return Err(PackError::Unpackable {
                path: entry.path(),
                reason: format!(
                    "a kind folder holds {} and {}/ only; this would be left behind",
                    file::FILE_NAME,
                    FOLDERS.join("/, ")
                ),
            });
        }
    }
    Ok(())
}

/// Every file under the folders a definition carries, by relative path.
fn folder_files(dir: &Path) -> Result<BTreeMap<String, String>, PackError> {
    let mut files = BTreeMap::new();
    for folder in FOLDERS {
        let root = dir.join(folder);
        if root.is_dir() {
            collect(&root, folder, &mut files)?;
        }
    }
    Ok(files)
}

fn collect(
    dir: &Path,
    prefix: &str,
    files: &mut BTreeMap<String, String>,
) -> Result<(), PackError> {
    for entry in read_dir(dir)? {
        let path = entry.path();
        let rel = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        if path.is_dir() {
            collect(&path, &rel, files)?;
        } else if path.is_file() {
            files.insert(rel, read_text(&path)?);
        } else {
            return Err(PackError::Unpackable {
                path,
                reason: "neither a file nor a directory".into(),
            });
        }
    }
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<std::fs::DirEntry>, PackError> {
    let io = |source| PackError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::read_dir(dir)
        .map_err(io)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io)
}

fn read_text(path: &Path) -> Result<String, PackError> {
    let bytes = std::fs::read(path).map_err(|source| PackError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|_| PackError::Unpackable {
        path: path.to_path_buf(),
        reason: "not UTF-8 text (a kind definition carries text files only)".into(),
    })
}

fn write(path: &Path, content: &str) -> Result<(), PackError> {
    let io = |source| PackError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, content).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let kind = dir.path().join("greeting");
        for (path, text) in [
            (
                "kind.yaml",
                "apiVersion: kustomize-operator.io/v1alpha1\nkind: KindDefinition\nmetadata: {name: greeting}\nspec: {group: x.io, version: v1}\n",
            ),
            ("base/kustomization.yaml", "resources: [deployment.yaml]\n"),
            (
                "base/deployment.yaml",
                "# a comment stays\nkind: Deployment\n",
            ),
            (
                "patches/deployment.yaml",
                "- {op: replace, path: /x, value: \"{{ spec.x }}\"}\n",
            ),
            ("resources/nested/cm.json", "{\"kind\": \"ConfigMap\"}"),
        ] {
            write(&kind.join(path), text).unwrap();
        }
        dir
    }

    #[test]
    fn a_folder_round_trips_its_files_byte_for_byte() {
        let src = folder();
        let packed = pack(&src.path().join("greeting")).unwrap();
        let out = tempfile::tempdir().unwrap();
        let unpacked = unpack(&packed, "packed.yaml", out.path()).unwrap();
        assert_eq!(unpacked, out.path().join("greeting"));
        for path in [
            "base/kustomization.yaml",
            "base/deployment.yaml",
            "patches/deployment.yaml",
            "resources/nested/cm.json",
        ] {
            assert_eq!(
                std::fs::read(src.path().join("greeting").join(path)).unwrap(),
                std::fs::read(unpacked.join(path)).unwrap(),
                "{path}"
            );
        }
        assert_eq!(
            std::fs::read(src.path().join("greeting/kind.yaml")).unwrap(),
            std::fs::read(unpacked.join("kind.yaml")).unwrap(),
        );
        assert_eq!(
            pack(&unpacked).unwrap(),
            packed,
            "packing again changes nothing"
        );
        let err = unpack(&packed, "packed.yaml", out.path()).unwrap_err();
        assert!(err.to_string().contains("exists already"), "{err}");
    }

    #[test]
    fn a_definition_changed_since_it_was_packed_unpacks_as_it_is_now() {
        let src = folder();
        let packed = pack(&src.path().join("greeting")).unwrap();
        // As `kubectl get -o yaml` would print it, after a change.
        let mut live: Value = serde_saphyr::from_str(&packed).unwrap();
        live["spec"]["version"] = "v2".into();
        live["metadata"]["uid"] = "u-1".into();
        let out = tempfile::tempdir().unwrap();
        let text = serde_saphyr::to_string(&live).unwrap();
        let unpacked = unpack(&text, "live", out.path()).unwrap();
        let kind_file: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(unpacked.join("kind.yaml")).unwrap())
                .unwrap();
        assert_eq!(kind_file["spec"]["version"], "v2");
        assert_eq!(
            kind_file["metadata"],
            serde_json::json!({"name": "greeting"})
        );
        assert!(kind_file["spec"].get("files").is_none());
    }

    #[test]
    fn what_a_definition_cannot_carry_is_refused_by_name() {
        let src = folder();
        let kind = src.path().join("greeting");
        write(&kind.join("NOTES.md"), "x").unwrap();
        let err = pack(&kind).unwrap_err().to_string();
        assert!(
            err.contains("NOTES.md") && err.contains("left behind"),
            "{err}"
        );
        std::fs::remove_file(kind.join("NOTES.md")).unwrap();
        std::fs::write(kind.join("base/logo.png"), [0xff, 0xfe, 0]).unwrap();
        let err = pack(&kind).unwrap_err().to_string();
        assert!(err.contains("logo.png") && err.contains("UTF-8"), "{err}");
        std::fs::write(kind.join("base/logo.png"), "x".repeat(MAX_PACKED_BYTES)).unwrap();
        let err = pack(&kind).unwrap_err().to_string();
        assert!(err.contains("more than the"), "{err}");
    }

    #[test]
    fn unpack_writes_nothing_outside_the_kind_folder() {
        let out = tempfile::tempdir().unwrap();
        for (files, expected) in [
            ("{'../escape.yaml': x}", "not a relative path"),
            ("{'/etc/passwd': x}", "not a relative path"),
            ("{'base/../../x': x}", "not a file inside"),
            ("{'secrets/x': x}", "outside base/"),
            ("{'base': x}", "not a file inside"),
        ] {
            let text = format!("metadata: {{name: greeting}}\nspec: {{files: {files}}}\n");
            let err = unpack(&text, "t.yaml", out.path()).unwrap_err().to_string();
            assert!(err.contains(expected), "{files}: {err}");
        }
        let err = unpack(
            "metadata: {name: ../x}\nspec: {files: {}}\n",
            "t.yaml",
            out.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not a kind name"), "{err}");
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
