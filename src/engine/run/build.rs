//! Overlay → manifests: `kubectl kustomize`, with the builds of resources
//! due together coalesced into one run.
//!
//! A coalesced run builds a root kustomization listing each resource's
//! overlay as a sub-directory; every object it prints carries its owner's
//! marker label, which says whose it is. Overlays that need no kustomize
//! (whole objects only, or in the subset `overlay/in_process.rs` builds) never
//! get here: the engine builds them in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::batch::{self, BatchSettings, Job, Member, Queue, Runner};
use crate::engine::model::inventory::Owner;
use crate::engine::model::overlay::RenderedOverlay;
use crate::kubectl::{CommandRecord, Invocation, Kubectl, Slot};

/// One overlay to build.
struct BuildJob {
    /// The rendered overlay (with the owner's marker).
    pub overlay: RenderedOverlay,
    /// The owner's UID: the marker label value on every object it builds.
    pub owner_uid: String,
}

/// A queue building overlays with `kubectl kustomize`: the builds of
/// resources due together coalesced into one run.
#[derive(Clone)]
pub(crate) struct Builds(Queue<BuildJob, Built>);

impl Builds {
    /// Starts a queue writing its overlays under `work_dir`: after the
    /// first build queued, it waits `window` for others, and builds at
    /// most `max` in one run.
    pub(crate) fn start(kubectl: Kubectl, window: Duration, max: usize, work_dir: PathBuf) -> Self {
        Self(Queue::start(
            kubectl.clone(),
            BatchSettings { window, max },
            BuildJob::runner(kubectl, work_dir),
        ))
    }

    /// Builds `overlay`, every object of which carries the marker of the
    /// owner `owner_uid`; `None` when the queue stopped.
    pub(crate) async fn build(&self, overlay: RenderedOverlay, owner_uid: String) -> Option<Built> {
        self.0.submit(BuildJob { overlay, owner_uid }).await
    }

    /// Builds the base of the kind folder `kind` alone, in `work_dir`: what
    /// it produces, or why it does not build. In memory when it is in the
    /// subset the engine builds itself (a KindDefinition's check builds
    /// its base: a `kubectl kustomize` run each was two thirds of the CPU
    /// of serving 100 at once), else one run of its own.
    pub(crate) async fn build_base(
        kubectl: &Kubectl,
        work_dir: &Path,
        templates: &crate::engine::model::templates::KustomizeDir,
        kind: &str,
    ) -> Built {
        let overlay = crate::engine::model::overlay::Overlay {
            base: Some(kind.to_string()),
            ..Default::default()
        }
        .render(templates, None)
        .map_err(|e| BuildFailure {
            message: e.to_string(),
            record: None,
        })?;
        Self::build_one(kubectl, work_dir, &overlay).await
    }

    /// Builds one rendered overlay, in `work_dir`: in memory when it needs
    /// no kustomize, else one `kubectl kustomize` run of its own.
    pub(crate) async fn build_one(
        kubectl: &Kubectl,
        work_dir: &Path,
        overlay: &RenderedOverlay,
    ) -> Built {
        if let Some(manifests) = overlay.prebuilt() {
            return Ok(manifests.to_vec());
        }
        let slot = kubectl.acquire().await;
        build_dir(work_dir, kubectl, slot, |dir| overlay.write_to(dir)).await
    }
}

impl BuildJob {
    /// The runner of a build queue writing overlays under `work_dir`.
    fn runner(kubectl: Kubectl, work_dir: PathBuf) -> Runner<Self, Built> {
        Arc::new(move |batch, slot| {
            let kubectl = kubectl.clone();
            let work_dir = work_dir.clone();
            Box::pin(async move { run(batch, slot, kubectl, work_dir).await })
        })
    }
}

impl Job for BuildJob {
    fn key(&self) -> String {
        "build".into()
    }

    fn names(&self) -> Vec<String> {
        vec![self.owner_uid.clone()]
    }
}

/// Why an overlay did not build.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct BuildFailure {
    /// What went wrong.
    pub message: String,
    /// The `kubectl kustomize` run, if one ran.
    pub record: Option<CommandRecord>,
}

/// The manifests an overlay builds to, or why it did not.
pub(crate) type Built = Result<Vec<Value>, BuildFailure>;

fn run(
    batch: Vec<Member<BuildJob, Built>>,
    slot: Slot,
    kubectl: Kubectl,
    work_dir: PathBuf,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if batch.len() == 1 {
            return build_alone(batch, slot, &kubectl, &work_dir).await;
        }
        match build_together(&batch, slot, &kubectl, &work_dir).await {
            Some(parts) => {
                for (m, manifests) in batch.into_iter().zip(parts) {
                    let _ = m.reply.send(Ok(manifests));
                }
            }
            None => {
                let (k, w) = (kubectl.clone(), work_dir.clone());
                batch::bisect(&kubectl, batch, move |half, slot| {
                    run(half, slot, k.clone(), w.clone())
                })
                .await;
            }
        }
    })
}

async fn build_alone(
    batch: Vec<Member<BuildJob, Built>>,
    slot: Slot,
    kubectl: &Kubectl,
    work_dir: &Path,
) {
    let Some(m) = batch.into_iter().next() else {
        return;
    };
    let result = build_dir(work_dir, kubectl, slot, |dir| m.job.overlay.write_to(dir)).await;
    let _ = m.reply.send(result);
}

/// Builds every member in one run; `None` when it failed (or its output
/// cannot be told apart), so the batch is split.
async fn build_together(
    batch: &[Member<BuildJob, Built>],
    slot: Slot,
    kubectl: &Kubectl,
    work_dir: &Path,
) -> Option<Vec<Vec<Value>>> {
    let write = |dir: &Path| -> Result<(), crate::engine::model::overlay::OverlayError> {
        let mut root = RootKustomization::default();
        for (i, m) in batch.iter().enumerate() {
            let sub = format!("r{i:04}");
            let path = dir.join(&sub);
            std::fs::create_dir_all(&path).map_err(|source| write_error(&path, source))?;
            m.job.overlay.write_to(&path)?;
            root.resources.push(sub);
        }
        let yaml = serde_saphyr::to_string(&root).map_err(|e| {
            crate::engine::model::overlay::OverlayError::Serialize {
                what: "kustomization.yaml".into(),
                reason: e.to_string(),
            }
        })?;
        let path = dir.join("kustomization.yaml");
        std::fs::write(&path, yaml).map_err(|source| write_error(&path, source))
    };
    let manifests = build_dir(work_dir, kubectl, slot, write).await.ok()?;
    split_by_owner(manifests, batch)
}

fn write_error(path: &Path, source: std::io::Error) -> crate::engine::model::overlay::OverlayError {
    crate::engine::model::overlay::OverlayError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// Writes an overlay into a private temp dir (removed on return, on every
/// path), builds it and parses what kubectl printed.
async fn build_dir(
    work_dir: &Path,
    kubectl: &Kubectl,
    slot: Slot,
    write: impl FnOnce(&Path) -> Result<(), crate::engine::model::overlay::OverlayError>,
) -> Built {
    let failure = |message: String| BuildFailure {
        message,
        record: None,
    };
    let dir = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(work_dir)
        .map_err(|e| failure(format!("cannot create a work directory: {e}")))?;
    write(dir.path()).map_err(|e| failure(e.to_string()))?;
    let invocation = Invocation::Build {
        dir: dir.path().to_path_buf(),
    };
    let record = kubectl
        .run_with(slot, &invocation, None)
        .await
        .map_err(|e| failure(e.to_string()))?;
    drop(dir);
    if !record.succeeded() || record.output_truncated {
        let message = if record.output_truncated {
            "the overlay builds to more than 64 MiB of manifests".to_string()
        } else {
            format!("kubectl kustomize failed: {}", record.summary())
        };
        return Err(BuildFailure {
            message,
            record: Some(record),
        });
    }
    parse(&record.stdout).map_err(|e| BuildFailure {
        message: format!("kubectl kustomize printed what is not YAML: {e}"),
        record: Some(record),
    })
}

/// The documents of a YAML stream, empty ones dropped.
pub(crate) fn parse(stream: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(stream)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// Each member's manifests, told apart by their owner label; `None` when an
/// object carries no member's marker.
fn split_by_owner(
    manifests: Vec<Value>,
    batch: &[Member<BuildJob, Built>],
) -> Option<Vec<Vec<Value>>> {
    let index: HashMap<&str, usize> = batch
        .iter()
        .enumerate()
        .map(|(i, m)| (m.job.owner_uid.as_str(), i))
        .collect();
    let mut parts = vec![Vec::new(); batch.len()];
    for m in manifests {
        let owner = m["metadata"]["labels"][Owner::LABEL].as_str()?;
        parts[*index.get(owner)?].push(m);
    }
    Some(parts)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RootKustomization {
    api_version: &'static str,
    kind: &'static str,
    resources: Vec<String>,
}

impl Default for RootKustomization {
    fn default() -> Self {
        Self {
            api_version: "kustomize.config.k8s.io/v1beta1",
            kind: "Kustomization",
            resources: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::oneshot;

    fn member(uid: &str) -> (Member<BuildJob, Built>, oneshot::Receiver<Built>) {
        let (reply, rx) = oneshot::channel();
        let overlay = RenderedOverlay::new(Default::default());
        (
            Member {
                job: BuildJob {
                    overlay,
                    owner_uid: uid.into(),
                },
                reply,
                span: tracing::Span::none(),
            },
            rx,
        )
    }

    #[test]
    fn objects_go_to_the_member_whose_marker_they_carry() {
        let (a, _ra) = member("a");
        let (b, _rb) = member("b");
        let doc = |owner: &str, name: &str| json!({"kind": "ConfigMap", "metadata": {"name": name, "labels": {Owner::LABEL: owner}}});
        let parts =
            split_by_owner(vec![doc("b", "x"), doc("a", "y"), doc("b", "z")], &[a, b]).unwrap();
        assert_eq!(parts[0].len(), 1);
        assert_eq!(parts[1].len(), 2);
        let (a, _ra) = member("a");
        assert!(split_by_owner(vec![doc("c", "x")], &[a]).is_none());
    }

    #[test]
    fn a_stream_parses_into_documents() {
        let docs = parse("a: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": 2})]);
        assert!(parse("a: [").is_err());
    }
}
