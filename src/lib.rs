//! kustomize-operator: a Kubernetes operator that reconciles custom resources
//! the Nuvolaris way. For each resource a kind's handler says what it wants
//! as data ([`kind::Plan`]: kustomize overlays and typed steps); the engine
//! renders the overlay, builds it with `kubectl kustomize`, checks that it
//! takes over nothing it does not own, applies it with
//! `kubectl apply --server-side`, prunes what left it, and records the
//! outcome in the resource's status.
//!
//! Kinds are written against the facade in [`kind`]; the engine behind it
//! is private to the crate. The code that hosts the engine (the operator,
//! `render`, `diff`, the manifests, the metrics and the kind registry)
//! reaches it through its second facade, `engine::host`, and
//! through nothing else: outside `src/engine/`, only `kind.rs` and
//! `engine::host` name engine paths (`hack/check-imports` checks it, and
//! that no modules import each other in a circle).

pub mod cli;
pub mod conversion;
pub mod definitions;
pub mod diff;
pub mod duration;
pub(crate) mod dynamic_kind;
mod engine;
pub mod error_text;
mod functions;
pub mod guard;
pub mod kind;
pub mod kinds;
pub mod kubectl;
pub mod label;
pub mod leader;
pub mod manifests;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod partition;
pub mod plan;
pub mod render;
pub mod sharding;
pub mod source;
pub mod support_range;
pub(crate) mod sync;
pub mod telemetry;
mod text;
pub mod trust;

pub use kind::{Handler, HandlerError, Plan, Step};
pub use kinds::KindName;
pub use kubectl::KubectlStats;
pub use operator::{Operator, StartError};

/// Any error the command-line entry points report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `run` could not start.
    #[error(transparent)]
    Start(#[from] operator::StartError),
    /// `render` failed.
    #[error(transparent)]
    Render(#[from] render::RenderCommandError),
    /// `crd` or `rbac` failed.
    #[error(transparent)]
    Manifests(#[from] manifests::ManifestError),
    /// `kind pack` or `kind unpack` failed.
    #[error(transparent)]
    Pack(#[from] kinds::declared::pack::PackError),
    /// `shards` failed.
    #[error(transparent)]
    Shards(#[from] sharding::report::ShardsError),
    /// This replica lost the leader Lease; it exits so that it restarts as a candidate.
    #[error("lost its Lease: the leader's, or with --auto-shard its membership of the ring")]
    LostLeadership,
    /// Waiting for a signal failed.
    #[error("cannot install signal handlers: {0}")]
    Signal(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    /// An API server's answer to an invalid write, as kube decodes it.
    fn invalid() -> kube::Error {
        let status = serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "Sample.nuvolaris.org \"web\" is invalid: spec.count: Invalid value: -1: must be at least 0",
            "details": {"name": "web", "group": "nuvolaris.org", "kind": "Sample", "causes": [
                {"reason": "FieldValueInvalid", "message": "Invalid value: -1: must be at least 0", "field": "spec.count"},
            ]},
        });
        kube::Error::Api(Box::new(serde_json::from_value(status).unwrap()))
    }

    /// The crate's errors that carry an API error say it in words, never
    /// in kube's debug form, whichever way they are printed.
    #[test]
    fn errors_carrying_an_api_error_print_no_debug_form() {
        let crd = crate::definitions::crds::CrdError::Api {
            crd: "samples.nuvolaris.org".into(),
            source: invalid(),
        };
        let secret = crate::conversion::certificate::CertificateError::Secret {
            secret: "ops/webhook".into(),
            source: invalid(),
        };
        let said = [
            crate::definitions::DefinitionError::from(invalid()).to_string(),
            crate::StartError::Connect(invalid()).to_string(),
            crd.to_string(),
            secret.to_string(),
            crate::error_text::kube(&invalid()),
            crate::HandlerError::from(invalid()).to_string(),
            crate::error_text::any(
                &kube::runtime::finalizer::Error::<std::io::Error>::AddFinalizer(invalid()),
            ),
        ];
        for text in said {
            assert!(
                text.contains("spec.count: Invalid value: -1: must be at least 0"),
                "{text}"
            );
            for shape in ["Status {", "Some(", "ApiError", "\\\""] {
                assert!(!text.contains(shape), "{text}");
            }
        }
    }
}
