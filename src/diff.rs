//! `diff`: what `run` would change in the cluster right now for one
//! resource. The resource is rendered as `render` does ([`crate::render`]),
//! then each overlay goes through `kubectl diff --server-side` with the
//! engine's field manager: a server-side dry run, nothing written. kubectl
//! masks Secret values in its output; an overlay the engine builds in
//! memory (whole objects, such as Copyrator's copies) goes to kubectl on
//! standard input, so Secret data is never written to disk.
//!
//! After the overlays, `diff` lists what a run would prune (objects that
//! leave the resource and still carry its marker) and what it would leave
//! (no longer marked), as `# would prune ...` / `# would leave ...` lines;
//! the engine's preview (`engine::host::preview`) knows the candidates.
//!
//! Exit codes as `kubectl diff`: 0 nothing would change, 1 something
//! would (a prune included), above 1 an error.

use std::collections::BTreeSet;
use std::path::Path;

use crate::cli::CommonArgs;
use crate::engine::host::Engine;
use crate::kind::Step;
use crate::kinds::{OwnedObjects, Preview};
use crate::kubectl::{Invocation, Kubectl, KubectlConfig};
use crate::render::{RenderCommandError, Source, prepare};

/// Why `diff` could not compare.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// The resource could not be rendered.
    #[error(transparent)]
    Render(#[from] RenderCommandError),
    /// kubectl could not be found or started.
    #[error(transparent)]
    Kubectl(#[from] crate::kubectl::KubectlError),
    /// An overlay could not be handed to kubectl.
    #[error("{0}")]
    Io(String),
}

/// What `diff` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// The cluster is as `run` would leave it.
    None,
    /// `run` would change something (kubectl printed what).
    Changes,
}

/// What kubectl made of one overlay.
enum Compared {
    Same,
    Differs,
    /// kubectl failed with this exit code (its message went to stderr).
    Failed(i32),
}

/// Compares what `run` would apply for the resource in `source` with the
/// cluster; kubectl's diff goes to standard output. `Err` for a failure
/// before kubectl ran; `Ok(Err(code))` when kubectl itself failed.
pub async fn diff(
    source: &Source,
    common: &CommonArgs,
    kubectl: Option<&Path>,
) -> Result<Result<Drift, i32>, DiffError> {
    let kubectl = Kubectl::new(KubectlConfig::one_shot(kubectl)?);
    let prepared = prepare(source, common, OwnedObjects::Read).await?;
    if prepared.placeholder_uid {
        eprintln!(
            "note: the resource has no metadata.uid, so the ownership marker, and what templates derive from the uid, differ from the live one (they saw a stand-in); diff KIND/NAME compares the resource in the cluster"
        );
    }
    let mut drift = Drift::None;
    for (step, overlay) in prepared.output.steps.iter().zip(&prepared.output.overlays) {
        let (field_manager, force) = match step {
            Step::Apply { field_manager, .. } => (
                field_manager.as_deref().unwrap_or(Engine::FIELD_MANAGER),
                prepared.output.takes_back,
            ),
            Step::Patch { field_manager, .. } => (field_manager.as_str(), true),
            Step::DeleteForeign { objects } => {
                for object in objects {
                    println!("# would delete {object} (not owned; not diffed)");
                }
                drift = Drift::Changes;
                continue;
            }
        };
        let Some(overlay) = overlay else { continue };
        let input = input_of(overlay.prebuilt(), |dir| overlay.write_to(dir))?;
        match compare(&kubectl, input, field_manager, force).await? {
            Compared::Same => {}
            Compared::Differs => drift = Drift::Changes,
            Compared::Failed(code) => return Ok(Err(code)),
        }
    }
    match prune_preview(&kubectl, &prepared.output).await {
        Ok(true) => drift = Drift::Changes,
        Ok(false) => {}
        Err(Unchecked(why)) => eprintln!("note: what run would prune was not checked: {why}"),
    }
    Ok(Ok(drift))
}

/// Why `diff` could not tell what a run would prune.
struct Unchecked(String);

/// Prints what a run would do with each object leaving the resource;
/// true when it would prune one. The overlays are built only when a
/// candidate exists in the cluster.
async fn prune_preview(kubectl: &Kubectl, output: &Preview) -> Result<bool, Unchecked> {
    let pruning = &output.pruning;
    match &pruning.looked {
        _ if !pruning.prunes || pruning.candidates.is_empty() => return Ok(false),
        None => {
            return Err(Unchecked(format!(
                "{} objects in the file's status.inventory; diff KIND/NAME reads them from the cluster",
                pruning.candidates.len()
            )));
        }
        Some(Err(why)) => return Err(Unchecked(why.clone())),
        Some(Ok(_)) if !pruning.has_live_candidates() => return Ok(false),
        Some(Ok(_)) => {}
    }
    let built = if pruning.declared.is_none() {
        let work = tempfile::Builder::new()
            .prefix("kustomize-operator-diff-")
            .tempdir()
            .map_err(|e| Unchecked(format!("cannot make a temporary directory: {e}")))?;
        (output.applied_objects(kubectl, work.path()).await).map_err(Unchecked)?
    } else {
        BTreeSet::new()
    };
    let fates = pruning.fates(&built);
    for fate in &fates {
        println!("{fate}");
    }
    Ok(fates.iter().any(|fate| fate.prunes()))
}

/// `kubectl diff --server-side` of one overlay, through the runner (its
/// timeout, process group and output cap); kubectl's output is passed on.
async fn compare(
    kubectl: &Kubectl,
    input: Input,
    field_manager: &str,
    force: bool,
) -> Result<Compared, DiffError> {
    // `dir` (an overlay's files) stays until kubectl is done.
    let (stdin, dir) = match input {
        Input::Stdin(bytes) => (Some(bytes), None),
        Input::Dir(dir) => (None, Some(dir)),
    };
    let invocation = Invocation::Diff {
        field_manager: field_manager.to_string(),
        force_conflicts: force,
        dir: dir.as_ref().map(|d| d.path().to_path_buf()),
    };
    let record = kubectl.run(&invocation, stdin).await?;
    print!("{}", record.stdout);
    eprint!("{}", record.stderr);
    if record.timed_out {
        eprintln!("{}", record.summary());
    }
    Ok(match record.exit_code {
        Some(0) if !record.timed_out => Compared::Same,
        Some(1) if !record.timed_out => Compared::Differs,
        Some(code) if code > 1 => Compared::Failed(code),
        _ => Compared::Failed(2),
    })
}

/// Where kubectl reads an overlay from.
enum Input {
    /// The objects, built in memory, as a JSON `List` on standard input.
    Stdin(Vec<u8>),
    /// The overlay's files, for `-k` (a private temporary directory).
    Dir(tempfile::TempDir),
}

/// How kubectl reads an overlay: its objects (`prebuilt`, when built in
/// memory) on standard input, else its files, which `write` puts in a
/// private temporary directory.
fn input_of<E: std::fmt::Display>(
    prebuilt: Option<&[serde_json::Value]>,
    write: impl FnOnce(&std::path::Path) -> Result<(), E>,
) -> Result<Input, DiffError> {
    if let Some(manifests) = prebuilt {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": manifests});
        return serde_json::to_vec(&list)
            .map(Input::Stdin)
            .map_err(|e| DiffError::Io(e.to_string()));
    }
    let dir = tempfile::Builder::new()
        .prefix("kustomize-operator-diff-")
        .tempdir()
        .map_err(|e| DiffError::Io(format!("cannot make a temporary directory: {e}")))?;
    write(dir.path()).map_err(|e| DiffError::Io(e.to_string()))?;
    Ok(Input::Dir(dir))
}
