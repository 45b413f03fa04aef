//! kustomize-operator: a Kubernetes operator that reconciles custom resources
//! the Nuvolaris way. For each resource a kind's handler builds a kustomize
//! overlay as data ([`overlay::Overlay`]); the engine ([`controller`]) renders
//! it into a temp dir, runs `kubectl apply -k` ([`kubectl`]) and records the
//! outcome in the resource's status ([`status`]).

pub mod batch;
pub mod cli;
pub mod controller;
pub mod duration;
pub mod handler;
pub mod kinds;
pub mod kubectl;
pub mod leader;
pub mod memory;
pub mod metrics;
pub mod operator;
pub mod overlay;
pub mod render;
pub mod status;
pub mod templates;

pub use controller::{Engine, ReconcileError};
pub use handler::{Handler, HandlerError, Kind, Plan, Step};
pub use kinds::KindName;
pub use operator::{Operator, StartError};
pub use overlay::Overlay;

/// Any error the command-line entry points report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `run` could not start.
    #[error(transparent)]
    Start(#[from] operator::StartError),
    /// `render` failed.
    #[error(transparent)]
    Render(#[from] render::RenderCommandError),
    /// `crd` could not serialize or write.
    #[error("cannot write CRDs: {0}")]
    Crd(String),
    /// This replica lost the leader Lease; it exits so that it restarts as a candidate.
    #[error("lost the leader lease")]
    LostLeadership,
    /// Waiting for a signal failed.
    #[error("cannot install signal handlers: {0}")]
    Signal(#[source] std::io::Error),
}

/// Every CRD as one multi-document YAML stream, in registration order.
pub fn crds_yaml() -> Result<Vec<(String, String)>, Error> {
    KindName::ALL
        .iter()
        .map(|kind| {
            let crd = kind.crd();
            let name = crd.metadata.name.clone().unwrap_or_default();
            serde_saphyr::to_string(&crd)
                .map(|yaml| (name, yaml))
                .map_err(|e| Error::Crd(e.to_string()))
        })
        .collect()
}
