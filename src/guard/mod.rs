//! What the operator reads from the API server, decoded defensively.
//!
//! Any object a tenant may patch can be hostile: nested 200 levels deep in
//! `metadata.managedFields` (the API server accepts it; serde_json stops at
//! 128 levels, and one such item fails a whole list, so a controller never
//! fills its cache and the operator could not start), or of a shape a
//! typed kind cannot read. The operator reads managedFields only of an
//! object it reads alone (to name who made an object it will not take
//! over), and one bad object must cost only itself.
//!
//! So every JSON response passes through [`GuardLayer`], a layer on the
//! kube client, before kube decodes it: a byte-level pass ([`scan`]) cuts
//! the managedFields out of every object of a list or a watch (they are
//! never decoded at all; of an object read alone, only when too deep),
//! and leaves out of a list (or turns into a bookmark in a watch) any object
//! still nested deeper than [`scan::MAX_DEPTH`], or refused by the shape
//! check of its resource ([`Guard::check_shape`], for the kinds with Rust
//! types). Each object left out is told to the callback the guard was
//! made with (the operator counts it, logs it at most every few minutes
//! by name, never its body, and puts a Warning event on it: see
//! [`report`]).
//!
//! Why not serde_json's own means: its recursion limit is what fails, and
//! turning it off (`unbounded_depth`) moves the failure to the stack; its
//! `IgnoredAny` skips a value iteratively but counts the depth too, and a
//! typed `ObjectMeta` cannot skip a field kube's types declare. A layer
//! over the client is the one place every list, watch and get passes,
//! whoever makes them (kube-runtime's watchers included).

mod body;
mod layer;
pub mod report;
pub mod scan;

use std::sync::{Arc, RwLock};

use serde::de::DeserializeOwned;

pub use layer::{GuardLayer, GuardService};
pub use scan::{ShapeCheck, SkipReason, Skipped};

/// The guard of one client: the shape checks of typed resources, and
/// where objects left out are told.
pub struct Guard {
    /// (group, plural, check): a handful, looked up on every request.
    checks: RwLock<Vec<(String, String, Arc<ShapeCheck>)>>,
    on_skip: Arc<dyn Fn(Skipped) + Send + Sync>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard that tells `on_skip` of every object it leaves out.
    pub fn new(on_skip: impl Fn(Skipped) + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            checks: RwLock::new(Vec::new()),
            on_skip: Arc::new(on_skip),
        })
    }

    /// The layer to put on a client.
    pub fn layer(self: &Arc<Self>) -> GuardLayer {
        GuardLayer {
            guard: self.clone(),
        }
    }

    /// Objects of `group`/`plural` are read as `K`: one that does not
    /// decode as `K` is left out of lists and watches instead of failing
    /// them.
    pub fn check_shape<K: DeserializeOwned>(&self, group: &str, plural: &str) {
        let check: Arc<ShapeCheck> = Arc::new(|bytes: &[u8]| {
            serde_json::from_slice::<K>(bytes)
                .map(drop)
                .map_err(|e| e.to_string())
        });
        if let Ok(mut checks) = self.checks.write() {
            checks.retain(|(g, p, _)| (g.as_str(), p.as_str()) != (group, plural));
            checks.push((group.to_string(), plural.to_string(), check));
        }
    }

    fn check_of(&self, group: &str, plural: &str) -> Option<Arc<ShapeCheck>> {
        let checks = self.checks.read().ok()?;
        checks
            .iter()
            .find(|(g, p, _)| g == group && p == plural)
            .map(|(_, _, check)| check.clone())
    }
}

/// Why the command-line verbs have no client for the kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// No kubeconfig (or in-cluster account) could be read.
    #[error("{}", crate::error_text::any(.0))]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from it.
    #[error("{}", crate::error_text::kube(.0))]
    Client(#[source] kube::Error),
}

/// A [`logging_client`] for the kubeconfig (or the in-cluster account):
/// the command-line verbs' (`render`, `diff`, `plan`, `shards`) way to the
/// cluster.
pub async fn kubeconfig_client() -> Result<kube::Client, KubeconfigError> {
    let config = kube::Config::infer()
        .await
        .map_err(KubeconfigError::Infer)?;
    logging_client(config).map_err(KubeconfigError::Client)
}

/// A client for `config` whose responses pass a guard of their own that
/// logs what it leaves out: for the command-line verbs (`render`, `diff`),
/// which read what tenants wrote as the operator does.
pub fn logging_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let guard = Guard::new(|skipped| {
        let id = &skipped.identity;
        tracing::warn!(
            kind = %id.kind,
            namespace = %id.namespace,
            name = %id.name,
            reason = %skipped.reason,
            "left an unreadable object out"
        );
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&guard.layer())
        .build())
}
