//! What every reconcile of a definition shares ([`DefinitionContext`]),
//! what a check looked at ([`Checked`]), and why a reconcile failed. A
//! leaf: the controller, the deletion path and the writes use it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::api::DynamicObject;

use super::generation::{self, Rejection, Taken};
use super::migration::Walks;
use super::migrator::Migrator;
use super::revisions::Store;
use super::serving::Serving;
use crate::conversion::Webhook;
use crate::engine::host::Engine;
use crate::kind::Sandbox;

/// How many names a message lists.
pub(super) const NAMES_SHOWN: usize = 10;

/// Why a reconcile of a definition failed (retried after a pause).
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    /// An API call failed.
    #[error("{}", crate::error_text::kube(.0))]
    Kube(#[from] kube::Error),
    /// Its deletion waits for the resources of its kind (said in its
    /// status): the finalizer stays.
    #[error("the deletion waits for the kind's resources")]
    Waiting,
    /// The kind's CRD was deleted and the API server is still removing
    /// it: the finalizer stays until it is gone, so that the definition
    /// (or another of the same kind) can be created again at once.
    #[error("the deletion waits for the CRD {0} to be removed")]
    CrdTerminating(String),
    /// Under automatic sharding, the deletion of a definition orphaning
    /// its resources waits a moment ([`super::following::ORPHAN_GRACE`])
    /// for every replica to stop serving the kind.
    #[error("the deletion waits for every replica to stop serving the kind")]
    Orphaning,
}

/// What every reconcile of a definition shares.
pub(super) struct DefinitionContext {
    pub engine: Arc<Engine>,
    pub client: Client,
    pub serving: Serving,
    /// The names and CRDs of the kinds the operator serves from folders.
    pub taken: Vec<Taken>,
    /// Where definitions are unpacked while they are checked.
    pub work_dir: PathBuf,
    /// The most bytes the definitions served may hold together.
    pub budget: usize,
    /// Where the definitions' templates render.
    pub isolation: Option<Arc<Sandbox>>,
    /// The rights access reviews granted lately.
    pub granted: super::rights::Granted,
    /// Each served kind's CRD as last applied and established.
    pub applied_crds: super::crds::Applied,
    /// The operator's conversion webhook, if it serves one.
    pub webhook: Option<Arc<Webhook>>,
    /// Where each kind's storage migration by the operator is.
    pub walks: Walks,
    /// Whether the API server migrates storage itself.
    pub migrator: Migrator,
    /// Where revisions are kept (`None`: the operator's namespace is not
    /// known, and they live only as long as the process).
    pub store: Option<Store>,
    /// The last rejection of each definition that only a change of the
    /// definition can lift, with what it was made for.
    pub rejected: Mutex<HashMap<String, (Checked, Rejection)>>,
    /// The last plan of each definition's change of its files.
    pub plans: super::planned::Plans,
    /// The operator's metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// What a check looked at: the generation, and whether breaking changes
/// were allowed (an annotation, which changes no generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Checked {
    generation: Option<i64>,
    breaking_allowed: bool,
}

impl Checked {
    /// What a check of `def` now would look at.
    pub fn of(def: &DynamicObject) -> Self {
        Self {
            generation: def.metadata.generation,
            breaking_allowed: generation::breaking_allowed(def),
        }
    }
}
