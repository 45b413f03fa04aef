//! A kind's base may load only its own files: every path a kustomization
//! of the base names (resources, components, patches, generators' files,
//! and the rest) must be a file or folder of the base itself. kustomize
//! would otherwise fetch a URL or clone a repository when it builds
//! (`resources: [https://...]`, `files: [x=http://...]`), from wherever the
//! operator runs; Helm charts (which need a flag the operator never passes,
//! and a download) are refused outright.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a base is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {reason}")]
pub struct BaseRefusal {
    /// The kustomization, relative to the kustomize directory.
    pub file: String,
    /// The field (`resources[0]`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// The names kustomize reads a kustomization from.
const KUSTOMIZATION_NAMES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Fields that are a list of paths.
const PATH_LISTS: [&str; 9] = [
    "resources",
    "components",
    "bases",
    "crds",
    "configurations",
    "generators",
    "transformers",
    "validators",
    "patchesStrategicMerge",
];

/// Checks every kustomization among `files` (the base of `kind`, by path
/// relative to the base folder).
pub fn check(kind: &str, files: &BTreeMap<String, Vec<u8>>) -> Result<(), BaseRefusal> {
    for (path, bytes) in files {
        let (dir, name) = match path.rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", path.as_str()),
        };
        if !KUSTOMIZATION_NAMES.contains(&name) {
            continue;
        }
        let file = format!("{kind}/base/{path}");
        let refused = |field: String, reason: String| BaseRefusal {
            file: file.clone(),
            field,
            reason,
        };
        let text =
            std::str::from_utf8(bytes).map_err(|_| refused("".into(), "not UTF-8".into()))?;
        let doc: Value = serde_saphyr::from_str(text)
            .map_err(|e| refused("".into(), format!("not YAML: {e}")))?;
        for (field, value) in paths(&doc) {
            if let Some(reason) = not_local(files, dir, &value) {
                return Err(refused(field, reason));
            }
        }
        for field in ["helmCharts", "helmChartInflationGenerator", "helmGlobals"] {
            if doc.get(field).is_some() {
                return Err(refused(
                    field.into(),
                    "Helm charts are not built by the operator (they are downloaded)".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Every (field, path) a kustomization names.
fn paths(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let text = |v: &Value| v.as_str().map(str::to_string);
    for field in PATH_LISTS {
        for (i, item) in list(doc, field).iter().enumerate() {
            // An inline patch (a mapping, or YAML in a string) is no path.
            match item.as_str() {
                Some(s) if field == "patchesStrategicMerge" && s.contains('\n') => {}
                Some(s) => out.push((format!("{field}[{i}]"), s.to_string())),
                None => {}
            }
        }
    }
    for field in ["patches", "patchesJson6902", "replacements"] {
        for (i, item) in list(doc, field).iter().enumerate() {
            if let Some(path) = item.get("path").and_then(text) {
                out.push((format!("{field}[{i}].path"), path));
            }
        }
    }
    for field in ["configMapGenerator", "secretGenerator"] {
        for (i, generator) in list(doc, field).iter().enumerate() {
            for (j, file) in list(generator, "files").iter().enumerate() {
                if let Some(entry) = file.as_str() {
                    // `key=path` or `path`.
                    let path = entry.split_once('=').map_or(entry, |(_, p)| p);
                    out.push((format!("{field}[{i}].files[{j}]"), path.to_string()));
                }
            }
            for (j, env) in list(generator, "envs").iter().enumerate() {
                if let Some(path) = env.as_str() {
                    out.push((format!("{field}[{i}].envs[{j}]"), path.to_string()));
                }
            }
            if let Some(env) = generator.get("env").and_then(text) {
                out.push((format!("{field}[{i}].env"), env));
            }
        }
    }
    if let Some(path) = doc
        .get("openapi")
        .and_then(|o| o.get("path"))
        .and_then(text)
    {
        out.push(("openapi.path".into(), path));
    }
    out
}

fn list<'a>(doc: &'a Value, field: &str) -> &'a [Value] {
    doc.get(field)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Why `path`, named by a kustomization in `dir`, is not a file or folder
/// of the base; `None` when it is.
fn not_local(files: &BTreeMap<String, Vec<u8>>, dir: &str, path: &str) -> Option<String> {
    let refusal = || {
        Some(format!(
            "{path:?} is not a file or folder of the kind's base; a base may load nothing from elsewhere (a URL, a repository, another folder)"
        ))
    };
    if path.contains("://") || path.contains('?') || path.starts_with('/') || path.contains('\\') {
        return refusal();
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            // Above the base.
            ".." if parts.pop().is_none() => return refusal(),
            ".." => {}
            part => parts.push(part),
        }
    }
    let resolved = parts.join("/");
    let folder = format!("{resolved}/");
    let exists = files.contains_key(&resolved) || files.keys().any(|f| f.starts_with(&folder));
    if exists { None } else { refusal() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(kustomization: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            (
                "kustomization.yaml".to_string(),
                kustomization.as_bytes().to_vec(),
            ),
            ("deployment.yaml".to_string(), b"kind: Deployment".to_vec()),
            (
                "sub/kustomization.yaml".to_string(),
                b"resources: [../deployment.yaml]".to_vec(),
            ),
            ("files/motd".to_string(), b"hi".to_vec()),
        ])
    }

    #[test]
    fn local_files_and_folders_are_fine() {
        let k = "resources: [deployment.yaml, ./sub]\nconfigMapGenerator:\n- name: m\n  files: [motd=files/motd]\n";
        assert_eq!(check("k", &base(k)), Ok(()));
    }

    #[test]
    fn anything_remote_is_refused_naming_the_field() {
        let cases = [
            ("resources: [https://example.com/x.yaml]", "resources[0]"),
            (
                "resources: [deployment.yaml, github.com/kubernetes-sigs/kustomize/examples/helloWorld?ref=v1.0.6]",
                "resources[1]",
            ),
            ("components: [git@github.com:org/repo.git]", "components[0]"),
            (
                "configMapGenerator:\n- name: m\n  files: [meta=http://169.254.169.254/latest/meta-data]",
                "configMapGenerator[0].files[0]",
            ),
            (
                "secretGenerator:\n- name: s\n  envs: [/etc/passwd]",
                "secretGenerator[0].envs[0]",
            ),
            (
                "patches:\n- path: ../../other/patch.yaml",
                "patches[0].path",
            ),
            ("resources: [missing.yaml]", "resources[0]"),
            (
                "helmCharts:\n- name: x\n  repo: https://charts.example.com",
                "helmCharts",
            ),
            (
                "openapi:\n  path: https://example.com/schema.json",
                "openapi.path",
            ),
        ];
        for (kustomization, field) in cases {
            let refused = check("k", &base(kustomization)).unwrap_err();
            assert_eq!(refused.file, "k/base/kustomization.yaml");
            assert_eq!(refused.field, field, "{kustomization}");
        }
    }

    #[test]
    fn a_nested_kustomization_is_checked_too() {
        let mut files = base("resources: [sub]");
        files.insert(
            "sub/kustomization.yaml".into(),
            b"resources: [https://x/y.yaml]".to_vec(),
        );
        let refused = check("k", &files).unwrap_err();
        assert_eq!(refused.file, "k/base/sub/kustomization.yaml");
    }

    #[test]
    fn inline_patches_are_no_paths() {
        let k = "resources: [deployment.yaml]\npatchesStrategicMerge:\n- |\n  kind: Deployment\n  metadata: {name: x}\n";
        assert_eq!(check("k", &base(k)), Ok(()));
    }
}
