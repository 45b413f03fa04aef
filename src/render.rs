//! `render`: the overlay `run` would apply for a resource, written offline.

use std::path::{Path, PathBuf};

use crate::cli::{CommonArgs, KindsError};
use crate::kind::Step;
use crate::kinds::RenderError;

/// Why `render` failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderCommandError {
    /// The input file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The input is not YAML.
    #[error("{path} is not valid YAML: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The kind folders could not be loaded.
    #[error(transparent)]
    Kinds(#[from] KindsError),
    /// The resource could not be rendered.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The output directory is unusable.
    #[error("output directory {path}: {reason}")]
    Output {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What `render` wrote.
#[derive(Debug)]
pub struct RenderSummary {
    /// The overlay directories written, with what each is for (`apply`: the
    /// resource's own objects; `patch`: fields of objects it acts on).
    pub overlays: Vec<(String, PathBuf)>,
    /// Objects the plan deletes that it does not own (`pod/x in ns`).
    pub deletes: Vec<String>,
    /// The resource had no `metadata.uid` (a file written by hand): the
    /// ownership marker holds a placeholder instead of the UID the live
    /// resource would have.
    pub placeholder_uid: bool,
}

/// Renders the resource in `file` into `out`.
///
/// A plan with one overlay is written to `out` itself, so `kubectl kustomize
/// <out>` prints what `run` applies; a plan with several is written to
/// `out/<n>-<verb>/`.
pub fn render_file(
    file: &Path,
    out: &Path,
    common: &CommonArgs,
) -> Result<RenderSummary, RenderCommandError> {
    let text = std::fs::read_to_string(file).map_err(|source| RenderCommandError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| RenderCommandError::Parse {
            path: file.to_path_buf(),
            reason: e.to_string(),
        })?;
    let docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let Some((resource, rest)) = docs.split_first() else {
        return Err(RenderCommandError::Parse {
            path: file.to_path_buf(),
            reason: "no document in the file".into(),
        });
    };
    let (dir, registry) = common.dirs.load()?;
    let kind = registry.of_document(resource).ok_or_else(|| {
        RenderError::UnknownKind(format!(
            "{} {} is not a kind this operator reconciles ({})",
            resource["apiVersion"].as_str().unwrap_or("<no apiVersion>"),
            resource["kind"].as_str().unwrap_or("<no kind>"),
            registry.names().join(", ")
        ))
    })?;
    let mut resource = resource.clone();
    // `run` sees namespaced resources with a namespace; offline, default
    // like kubectl does.
    let namespaced = kind.crd().spec.scope == "Namespaced";
    if namespaced && resource["metadata"]["namespace"].is_null() && resource["metadata"].is_object()
    {
        resource["metadata"]["namespace"] = "default".into();
    }
    let options = common.kind_options(None);
    let plan = kind.render(&resource, rest, &options, &dir)?;
    prepare_out(out)?;
    let overlay_steps = plan.overlays.iter().filter(|o| o.is_some()).count();
    let mut summary = RenderSummary {
        overlays: Vec::new(),
        deletes: Vec::new(),
        placeholder_uid: resource["metadata"]["uid"].as_str().is_none(),
    };
    for (i, (step, overlay)) in plan.steps.iter().zip(&plan.overlays).enumerate() {
        let verb = match step {
            Step::Apply { .. } => "apply",
            Step::Patch { .. } => "patch",
            Step::DeleteForeign { objects } => {
                summary
                    .deletes
                    .extend(objects.iter().map(ToString::to_string));
                continue;
            }
        };
        let Some(rendered) = overlay else { continue };
        let target = if overlay_steps == 1 {
            out.to_path_buf()
        } else {
            out.join(format!("{i}-{verb}"))
        };
        std::fs::create_dir_all(&target).map_err(|e| RenderCommandError::Output {
            path: target.clone(),
            reason: e.to_string(),
        })?;
        rendered
            .write_to(&target)
            .map_err(|e| RenderCommandError::Output {
                path: target.clone(),
                reason: e.to_string(),
            })?;
        summary.overlays.push((verb.to_string(), target));
    }
    Ok(summary)
}

fn prepare_out(out: &Path) -> Result<(), RenderCommandError> {
    let output_err = |reason: String| RenderCommandError::Output {
        path: out.to_path_buf(),
        reason,
    };
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| output_err(e.to_string()))?;
        if entries.next().is_some() {
            return Err(output_err("exists and is not empty".into()));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| output_err(e.to_string()))
}
