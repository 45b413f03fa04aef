//! `render`: the overlay `run` would apply for a resource, written for
//! `kubectl kustomize`. The resource comes from a file (offline: what the
//! kind observes comes from the documents after it) or from the cluster by
//! reference, `KIND/NAME` (read-only: the kind observes the cluster without
//! side effects). [`prepare`] is shared with `diff`.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject};

use crate::cli::{CommonArgs, KindsError};
use crate::kind::Step;
use crate::kinds::{OwnedObjects, Preview, RenderError};
pub use crate::source::{BadReference, ResourceRef, Source};

/// Why `render` (or `diff`) could not render the resource.
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
    /// A reference is not `KIND/NAME`.
    #[error(transparent)]
    Reference(#[from] BadReference),
    /// The cluster could not be reached or read.
    #[error("cannot read {what} from the cluster: {reason}")]
    Cluster {
        /// What was being read.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// The kind folders could not be loaded.
    #[error(transparent)]
    Kinds(#[from] KindsError),
    /// A reference names no kind this operator serves.
    #[error(transparent)]
    Registry(#[from] crate::kinds::registry::RegistryError),
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

/// A resource rendered: the plan's steps and overlays.
#[derive(Debug)]
pub struct Prepared {
    /// The steps and their rendered overlays.
    pub output: Preview,
    /// The resource had no `metadata.uid` (a file written by hand): the
    /// templates and the ownership marker saw a stand-in,
    /// [`Preview::PLACEHOLDER_UID`](crate::kinds::Preview::PLACEHOLDER_UID), instead of the
    /// UID the live resource has.
    pub placeholder_uid: bool,
}

/// What `render` wrote.
#[derive(Debug)]
pub struct RenderSummary {
    /// The overlay directories written, with what each is for (`apply`: the
    /// resource's own objects; `patch`: fields of objects it acts on).
    pub overlays: Vec<(String, PathBuf)>,
    /// Objects the plan deletes that it does not own (`pod/x in ns`).
    pub deletes: Vec<String>,
    /// See [`Prepared::placeholder_uid`].
    pub placeholder_uid: bool,
    /// Lines of rendered templates that YAML will likely refuse, each
    /// with its file under the overlay written and the fix (a value
    /// written next to text).
    pub hints: Vec<String>,
}

/// Renders the resource from `source`; `owned` says whether a resource
/// read from the cluster has the objects it owns read too.
pub async fn prepare(
    source: &Source,
    common: &CommonArgs,
    owned: OwnedObjects,
) -> Result<Prepared, RenderCommandError> {
    match source {
        Source::File(file) => prepare_file(file, common),
        Source::Live {
            reference,
            namespace,
        } => prepare_live(reference, namespace.as_deref(), common, owned).await,
    }
}

/// Renders the resource in `file`, offline.
fn prepare_file(file: &Path, common: &CommonArgs) -> Result<Prepared, RenderCommandError> {
    let (dir, registry) = common.dirs.load()?;
    let (resource, rest) = read_file(file)?;
    let kind = registry.of_document(&resource).ok_or_else(|| {
        RenderError::UnknownKind(format!(
            "{} {} is not a kind this operator reconciles ({})",
            resource["apiVersion"].as_str().unwrap_or("<no apiVersion>"),
            resource["kind"].as_str().unwrap_or("<no kind>"),
            registry.names().join(", ")
        ))
    })?;
    let resource = default_namespace(resource, kind);
    let (resource, placeholder_uid) = default_uid(resource);
    let output = kind.render(&resource, &rest, &common.kind_options(None), &dir)?;
    Ok(Prepared {
        output,
        placeholder_uid,
    })
}

/// Renders the resource `reference` names, read from the cluster.
async fn prepare_live(
    reference: &ResourceRef,
    namespace: Option<&str>,
    common: &CommonArgs,
    owned: OwnedObjects,
) -> Result<Prepared, RenderCommandError> {
    let (dir, registry) = common.dirs.load()?;
    let kind = registry.by_name(&reference.kind)?;
    let client = client().await?;
    let resource = fetch(&client, kind, reference, namespace).await?;
    let options = common.kind_options(None);
    let output = kind
        .render_live(&resource, &client, &options, &dir, owned)
        .await?;
    Ok(Prepared {
        output,
        placeholder_uid: false,
    })
}

/// Renders the resource from `source` into `out` (see [`write`]).
pub async fn render(
    source: &Source,
    out: &Path,
    common: &CommonArgs,
) -> Result<RenderSummary, RenderCommandError> {
    write(&prepare(source, common, OwnedObjects::Skip).await?, out)
}

/// Renders the resource in `file` into `out`, offline (see [`write`]).
pub fn render_file(
    file: &Path,
    out: &Path,
    common: &CommonArgs,
) -> Result<RenderSummary, RenderCommandError> {
    write(&prepare_file(file, common)?, out)
}

/// Writes a rendered resource into `out`.
///
/// A plan with one overlay is written to `out` itself, so `kubectl kustomize
/// <out>` prints what `run` applies; a plan with several is written to
/// `out/<n>-<verb>/`. Everything written is private (0700/0600).
fn write(prepared: &Prepared, out: &Path) -> Result<RenderSummary, RenderCommandError> {
    prepare_out(out)?;
    let plan = &prepared.output;
    let overlay_steps = plan.overlays.iter().filter(|o| o.is_some()).count();
    let mut summary = RenderSummary {
        overlays: Vec::new(),
        deletes: Vec::new(),
        placeholder_uid: prepared.placeholder_uid,
        hints: Vec::new(),
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
        let output_err = |reason: String| RenderCommandError::Output {
            path: target.clone(),
            reason,
        };
        rendered
            .write_to(&target)
            .map_err(|e| output_err(e.to_string()))?;
        if let Some(hint) = rendered.build_hint() {
            summary.hints.push(format!("{}/{hint}", target.display()));
        }
        summary.overlays.push((verb.to_string(), target));
    }
    Ok(summary)
}

/// The resource (first document) and the documents after it.
fn read_file(
    file: &Path,
) -> Result<(serde_json::Value, Vec<serde_json::Value>), RenderCommandError> {
    let text = std::fs::read_to_string(file).map_err(|source| RenderCommandError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| RenderCommandError::Parse {
            path: file.to_path_buf(),
            reason: e.to_string(),
        })?;
    let mut docs = docs.into_iter().filter(|d| !d.is_null());
    let resource = docs.next().ok_or_else(|| RenderCommandError::Parse {
        path: file.to_path_buf(),
        reason: "no document in the file".into(),
    })?;
    Ok((resource, docs.collect()))
}

/// `run` sees namespaced resources with a namespace; offline, default like
/// kubectl does.
fn default_namespace(
    mut resource: serde_json::Value,
    kind: &crate::kinds::registry::Kind,
) -> serde_json::Value {
    let namespaced = kind.crd().spec.scope == "Namespaced";
    if namespaced && resource["metadata"]["namespace"].is_null() && resource["metadata"].is_object()
    {
        resource["metadata"]["namespace"] = "default".into();
    }
    resource
}

/// The API server gives every resource a `metadata.uid`; a file written by
/// hand has none: it gets the stand-in
/// [`Preview::PLACEHOLDER_UID`](crate::kinds::Preview::PLACEHOLDER_UID), so that templates
/// reading it (`seeded_string(seed=metadata.uid, ...)`) render, and the
/// ownership marker holds the same. True when the stand-in was given.
fn default_uid(mut resource: serde_json::Value) -> (serde_json::Value, bool) {
    let missing = resource["metadata"]["uid"].as_str().is_none();
    if missing && resource["metadata"].is_object() {
        resource["metadata"]["uid"] = crate::kinds::Preview::PLACEHOLDER_UID.into();
    }
    (resource, missing)
}

async fn client() -> Result<kube::Client, RenderCommandError> {
    let failed = |reason: String| RenderCommandError::Cluster {
        what: "the kubeconfig".into(),
        reason,
    };
    (crate::guard::kubeconfig_client().await).map_err(|e| failed(e.to_string()))
}

/// The live resource `reference` names, as JSON.
async fn fetch(
    client: &kube::Client,
    kind: &crate::kinds::registry::Kind,
    reference: &ResourceRef,
    namespace: Option<&str>,
) -> Result<serde_json::Value, RenderCommandError> {
    let (resource, namespaced) = kind.api_resource();
    let namespace = namespace.unwrap_or(client.default_namespace());
    let api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let what = match namespaced {
        true => format!(
            "{}/{} in namespace {namespace}",
            kind.name(),
            reference.name
        ),
        false => format!("{}/{}", kind.name(), reference.name),
    };
    let object = api
        .get_opt(&reference.name)
        .await
        .map_err(|e| RenderCommandError::Cluster {
            what: what.clone(),
            reason: crate::error_text::kube(&e),
        })?
        .ok_or_else(|| RenderCommandError::Cluster {
            what,
            reason: "not found".into(),
        })?;
    serde_json::to_value(&object).map_err(|e| RenderCommandError::Cluster {
        what: reference.name.clone(),
        reason: e.to_string(),
    })
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
    // Readable by its owner only, like the overlays written into it.
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(out)
        .map_err(|e| output_err(e.to_string()))
}
