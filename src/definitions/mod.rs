//! Kinds in the cluster: `KindDefinition` resources (cluster-scoped,
//! `kustomize-operator.io/v1alpha1`) served while the operator runs. A
//! definition is a kind folder packed into one object (`kind pack`); the
//! operator checks each generation as it checks a folder at start, applies
//! the CRD it declares, and serves the kind in the engine's one runtime,
//! without a restart and without touching any other kind. The definitions
//! themselves are one more kind of that runtime (`controller`).
//!
//! - [`resource`]: the definition's CRD, names and status;
//! - `conditions`: its condition types and reasons, its own vocabulary;
//! - [`generation`]: one generation unpacked and checked (files,
//!   templates, kind file, base, clashes, breaking schema changes);
//! - [`crds`]: the declared CRD, applied with the definition's marker;
//! - [`rights`]: the access reviews behind `RightsGranted`;
//! - `serving`: the kinds served, one per definition, and their counts;
//! - `context`: what every reconcile shares (a leaf);
//! - `controller`: the reconcile of a definition, plugged into the
//!   runtime as a `Reconciler`;
//! - `deletion`: its deletion;
//! - `following`: under automatic sharding, one replica writes each
//!   definition and the others serve its kind as it does;
//! - [`revisions`]: every accepted change of its files, kept;
//! - `migration`, `migrator`: a kind's storage migrated when its storage
//!   version changes, by the API server where it can, else by the operator;
//! - `rollout`: which revision serves whom, and what its status says;
//! - `planning`: a change of the files planned against every resource of
//!   the kind before it is served;
//! - `progress`: the automatic rollout of `spec.rollout.steps`, one look
//!   per reconcile;
//! - [`signing`]: the key that signs the revisions kept in the cluster;
//! - `writes`: its status, finalizer and events.

mod conditions;
mod context;
mod controller;
pub mod crds;
mod deletion;
mod following;
pub mod generation;
mod migration;
mod migrator;
mod planned;
mod planning;
mod progress;
pub mod resource;
pub mod revisions;
pub mod rights;
mod rollout;
mod serving;
pub mod signing;
mod writes;

use std::path::PathBuf;
use std::sync::Arc;

use kube::Client;
use tokio_util::sync::CancellationToken;

pub use context::DefinitionError;
use generation::Taken;

use crate::conversion::Webhook;
use crate::engine::host::Engine;
use crate::engine::host::Runtime;
use crate::kind::Sandbox;
use crate::kinds::registry::Kind;

/// How the operator serves definitions.
#[derive(Debug, Clone)]
pub struct Config {
    /// Only definitions matching this label selector (default: all).
    pub selector: Option<String>,
    /// The kinds the operator serves from folders and built in: their
    /// names and CRDs are not free for a definition.
    pub static_kinds: Vec<Kind>,
    /// The most bytes the definitions served may hold together.
    pub budget: usize,
    /// Where the definitions' templates render (`None`: in process, for
    /// tests without a worker binary).
    pub isolation: Option<Arc<Sandbox>>,
    /// The operator's conversion webhook, if it serves one: a kind of
    /// several versions needs it.
    pub webhook: Option<Arc<Webhook>>,
    /// The operator's namespace, where the definitions' revisions are kept
    /// (`None`: in memory only).
    pub namespace: Option<String>,
    /// The operator's metrics (the rollouts').
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Whether the `KindDefinition` CRD is installed and the operator may list
/// and watch definitions (asked without reading any).
pub async fn installed(client: &Client) -> Result<crate::kinds::Availability, kube::Error> {
    crate::kinds::served(client, &resource::api_resource(), None).await
}

/// Serves the definitions of `config` until `shutdown` is cancelled, each
/// definition's kind a kind of `runtime`; then stops their kinds (their
/// running reconciles finish).
pub(crate) async fn serve(
    engine: Arc<Engine>,
    runtime: Arc<Runtime>,
    config: Config,
    shutdown: CancellationToken,
) {
    let taken = config
        .static_kinds
        .iter()
        .map(|kind| Taken {
            name: kind.name().to_string(),
            crd: kind.crd().metadata.name.unwrap_or_default(),
            by: format!("the kind {kind} (served from the operator's kustomize directories)"),
        })
        .collect();
    let work_dir = definitions_dir(&engine);
    let (nudges, nudged) = tokio::sync::mpsc::channel(serving::NUDGES_QUEUED);
    let engine_client = engine.client().clone();
    let ctx = Arc::new(context::DefinitionContext {
        client: engine.client().clone(),
        serving: serving::Serving::new(runtime.clone(), nudges),
        engine,
        taken,
        work_dir,
        isolation: config.isolation,
        webhook: config.webhook,
        applied_crds: crds::Applied::default(),
        granted: rights::Granted::default(),
        budget: config.budget,
        walks: migration::Walks::default(),
        migrator: migrator::Migrator::default(),
        store: (config.namespace.as_deref())
            .map(|ns| revisions::Store::new(engine_client.clone(), ns)),
        rejected: std::sync::Mutex::default(),
        plans: planned::Plans::default(),
        metrics: config.metrics,
    });
    controller::run(ctx, &runtime, config.selector, nudged, shutdown).await;
}

/// Where definitions are unpacked (inside the operator's work directory,
/// which is on tmpfs in the image), created if need be.
fn definitions_dir(engine: &Engine) -> PathBuf {
    let dir = engine.settings().work_dir.join("definitions");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the definitions directory");
    }
    dir
}
