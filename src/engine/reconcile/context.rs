//! What every reconcile of one kind shares ([`Context`]: the engine, the
//! kind's handler, its triggers) and why a reconcile did not succeed
//! ([`ReconcileError`]). A leaf: the controller, the apply and deletion
//! paths and the health checkup all use it, and it uses none of them.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::triggers::Triggers;
use crate::engine::contract::{Handler, HandlerError};
use crate::engine::model::identity::Identity;
use crate::engine::model::inventory::Owner;
use crate::engine::model::outcome::Failure;
use crate::engine::model::overlay::Marking;
use crate::engine::model::status::Reason;
use crate::engine::model::templates::KustomizeDir;
use crate::engine::reconcile::runtime::Engine;

/// Why a reconcile did not succeed (its status says it in full).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The reconcile failed; the resource's status and an event say why.
    #[error("{reason}: {message}")]
    Failed {
        /// The condition reason.
        reason: Reason,
        /// What went wrong.
        message: String,
        /// Retrying cannot help until the resource changes.
        permanent: bool,
    },
    /// An API call failed (e.g. writing status).
    #[error("{}", crate::error_text::kube(.0))]
    Kube(#[from] kube::Error),
}

/// What every reconcile of one kind shares.
pub(crate) struct Context<H: Handler> {
    pub engine: Arc<Engine>,
    pub handler: Arc<H>,
    /// Which watch events start a reconcile (status writes do not).
    pub triggers: Arc<Triggers>,
}

impl<H: Handler> Context<H> {
    /// The templates and bases the kind's overlays render from: its own
    /// (a kind defined in the cluster), else the engine's.
    pub(crate) fn templates(&self) -> &KustomizeDir {
        self.handler
            .info()
            .templates
            .as_deref()
            .unwrap_or(&self.engine.templates)
    }

    /// Where `--keep-overlays` keeps the overlay of the resource `meta`
    /// describes (`None` when overlays are not kept).
    pub(crate) fn kept_overlay(&self, meta: &ObjectMeta) -> Option<std::path::PathBuf> {
        let root = self.engine.settings.keep_overlays.as_ref()?;
        Some(crate::engine::run::kept::dir(
            root,
            &self.handler.info().name,
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        ))
    }

    /// `kind/namespace/name`, for logs and the backoff counter.
    pub fn key(&self, obj: &H::Resource) -> String {
        format!(
            "{}/{}/{}",
            self.handler.info().name,
            obj.namespace().unwrap_or_default(),
            obj.name_any()
        )
    }

    /// Whose rights the writes of `owner` use
    /// ([`Settings::writer_of`](super::runtime::Settings::writer_of));
    /// `Forbidden` when refused.
    pub fn identity(&self, owner: &Owner) -> Result<Identity, Failure> {
        (self.engine.settings)
            .writer_of(owner, self.handler.info())
            .map_err(|e| Failure::new(Reason::Forbidden, e.to_string()))
    }

    /// Whose rights `obj`'s reads of objects it does not own use: the
    /// identity its writes use, as the user to impersonate (`None`: the
    /// operator's own account). Refused (`Forbidden`) as its writes are:
    /// the engine then acts for the resource not at all, not even to read.
    pub fn reader(&self, obj: &H::Resource) -> Result<Option<String>, HandlerError> {
        let refused = |message| HandlerError::transient(Reason::Forbidden, message);
        let owner = self
            .owner(obj)
            .ok_or_else(|| refused("the resource has no uid yet".into()))?;
        let identity = self.identity(&owner).map_err(|f| refused(f.message))?;
        Ok(identity.username())
    }

    /// The resource as the owner of what it applies.
    pub fn owner(&self, obj: &H::Resource) -> Option<Owner> {
        Some(owner_with_uid(&*self.handler, obj, obj.uid()?))
    }
}

/// `obj` as the owner of what it applies, with `uid` (its own, or a
/// placeholder for a resource that has none yet: [`super::preview`]).
pub(crate) fn owner_with_uid<H: Handler>(handler: &H, obj: &H::Resource, uid: String) -> Owner {
    let dt = &handler.info().dyn_type;
    Owner {
        api_version: H::Resource::api_version(dt).into_owned(),
        kind: H::Resource::kind(dt).into_owned(),
        namespace: obj.namespace(),
        name: obj.name_any(),
        uid,
    }
}

/// How `owner`'s objects are marked, by its kind's policy.
pub(crate) fn marking<H: Handler>(handler: &H, owner: Owner) -> Marking {
    Marking {
        owner,
        owner_references: handler.info().owner_references,
    }
}

#[cfg(test)]
mod tests {
    use super::ReconcileError;

    /// An API error reads as the crate's words for it
    /// (`error_text::kube`, checked against kube's debug form in the
    /// crate root's tests).
    #[test]
    fn an_api_error_reads_as_the_crates_words_for_it() {
        let status = serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "spec.count: Invalid value: -1: must be at least 0",
        });
        let error = || kube::Error::Api(Box::new(serde_json::from_value(status.clone()).unwrap()));
        let said = ReconcileError::from(error()).to_string();
        assert_eq!(said, crate::error_text::kube(&error()));
        assert!(said.contains("spec.count: Invalid value: -1"), "{said}");
    }
}
