//! The CRD a definition declares: applied server-side carrying the
//! definition's marker, waited for until established, deleted when the
//! kind goes. A CRD without the marker is never changed or deleted. A CRD
//! as it was last applied and established is read, not applied again
//! ([`Applied`]): a definition's periodic look costs one read of it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use super::resource::MARKER_LABEL;
use crate::conversion::calls_webhook;
use crate::engine::host::Engine;

/// Why a CRD could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD of that name exists without this definition's marker.
    #[error(
        "the CRD {crd} exists and was not made for this definition ({}): the operator leaves it alone",
        match owner { Some(o) => format!("its marker names the KindDefinition {o}"), None => "it carries no marker".to_string() }
    )]
    NotOwned {
        /// The CRD.
        crd: String,
        /// The definition its marker names, if any.
        owner: Option<String>,
    },
    /// The API refused or failed.
    #[error("the CRD {crd}: {}", crate::error_text::kube(.source))]
    Api {
        /// The CRD.
        crd: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// What the operator applied to each CRD and saw established: the body's
/// fingerprint, and the object's UID and resource version as read when it
/// was established (after the API server's own status writes that follow
/// an apply). The live CRD still at that UID and version (not changed
/// since, by hand or otherwise, nor deleted and created again) and the
/// body to apply the same: nothing to apply, and it is established. A CRD
/// whose spec changed between the apply and that read (another
/// generation) is not recorded: the next look applies it again. Kept in
/// the process only: a restart applies each CRD once more.
#[derive(Debug, Default)]
pub struct Applied(Mutex<HashMap<String, Stamp>>);

/// One CRD as applied: the body's fingerprint, the object's UID and
/// resource version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    body: u64,
    uid: String,
    version: String,
}

impl Stamp {
    /// `body`'s fingerprint, with the UID and resource version of `meta`.
    fn of(body: u64, meta: &ObjectMeta) -> Option<Self> {
        Some(Self {
            body,
            uid: meta.uid.clone()?,
            version: meta.resource_version.clone()?,
        })
    }
}

impl Applied {
    /// True when `live` is as `body` was last applied and established.
    fn unchanged(&self, body: u64, live: &CustomResourceDefinition) -> bool {
        let stamps = crate::sync::lock(&self.0);
        stamps
            .get(&live.name_any())
            .is_some_and(|stamp| Some(stamp) == Stamp::of(body, &live.metadata).as_ref())
    }

    /// The CRD `name`, applied as `applied` says, is established, its
    /// metadata as read then `meta`; recorded only if that is still the
    /// generation the apply made.
    pub fn established(&self, name: &str, applied: AppliedAs, meta: &ObjectMeta) {
        if meta.generation != applied.generation {
            return;
        }
        if let Some(stamp) = Stamp::of(applied.body.0, meta) {
            crate::sync::lock(&self.0).insert(name.to_string(), stamp);
        }
    }

    /// The CRD `name` is gone, or is to be applied again.
    pub fn forget(&self, name: &str) {
        crate::sync::lock(&self.0).remove(name);
    }
}

/// True when `live` converts through the webhook and `wanted` does not.
/// The webhook's renewal writes the `caBundle` with a patch of its own,
/// which an apply that no longer names it does not remove: left without
/// its strategy, it would make this and every later apply invalid.
fn leaves_webhook(live: &CustomResourceDefinition, wanted: &CustomResourceDefinition) -> bool {
    calls_webhook(live) && !calls_webhook(wanted)
}

/// Takes the webhook out of the CRD `name`'s conversion, whoever wrote
/// its parts: the strategy back to `None`, the client config removed.
async fn drop_webhook(client: &Client, name: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}});
    let params = PatchParams {
        field_manager: Some(Engine::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// The fingerprint of a CRD's body as applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

/// What [`apply`] did.
#[derive(Debug)]
pub enum Outcome {
    /// The live CRD is as last applied and established: nothing applied.
    Unchanged,
    /// Applied (for [`Applied::established`] once it is).
    Applied(AppliedAs),
}

/// What an apply of a CRD wrote: the body's fingerprint and the
/// generation the API server answered with.
#[derive(Debug, Clone, Copy)]
pub struct AppliedAs {
    body: Fingerprint,
    generation: Option<i64>,
}

/// The definition named by the marker of `crd`, if it carries one.
pub fn marker(crd: &CustomResourceDefinition) -> Option<&str> {
    crd.labels().get(MARKER_LABEL).map(String::as_str)
}

/// The live CRD `name`, if it exists.
pub async fn live(
    client: &Client,
    name: &str,
) -> Result<Option<CustomResourceDefinition>, kube::Error> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(name)
        .await
}

/// Applies `crd` (server-side) for the definition `definition`, unless a
/// CRD of that name exists without its marker, or exists as `applied`
/// says it was last applied and established.
pub async fn apply(
    client: &Client,
    crd: &CustomResourceDefinition,
    definition: &str,
    applied: &Applied,
) -> Result<Outcome, CrdError> {
    let name = crd.name_any();
    let api_error = |source| CrdError::Api {
        crd: name.clone(),
        source,
    };
    let mut body = serde_json::to_value(crd).map_err(|e| api_error(kube::Error::SerdeError(e)))?;
    body["apiVersion"] = "apiextensions.k8s.io/v1".into();
    body["kind"] = "CustomResourceDefinition".into();
    let fingerprint = fingerprint(&body);
    if let Some(existing) = live(client, &name).await.map_err(api_error)? {
        let owner = marker(&existing);
        if owner != Some(definition) {
            return Err(CrdError::NotOwned {
                crd: name,
                owner: owner.map(str::to_string),
            });
        }
        if applied.unchanged(fingerprint.0, &existing) {
            return Ok(Outcome::Unchanged);
        }
        if leaves_webhook(&existing, crd) {
            drop_webhook(client, &name).await.map_err(api_error)?;
        }
    }
    applied.forget(&name);
    let answer = Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply(Engine::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error)?;
    Ok(Outcome::Applied(AppliedAs {
        body: fingerprint,
        generation: answer.metadata.generation,
    }))
}

/// The fingerprint of a CRD's body (JSON, whose maps keep their keys in
/// order: the same body, the same text).
fn fingerprint(body: &serde_json::Value) -> Fingerprint {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut hasher);
    Fingerprint(hasher.finish())
}

/// Deletes the CRD `name` if it carries the marker of `definition`;
/// whether the API server is still removing it (its answer to the delete
/// is the CRD itself, not a status).
pub async fn delete_owned(
    client: &Client,
    name: &str,
    definition: &str,
) -> Result<bool, kube::Error> {
    let Some(existing) = live(client, name).await? else {
        return Ok(false);
    };
    if marker(&existing) != Some(definition) {
        tracing::info!(
            crd = name,
            definition,
            "the CRD is not this definition's: left in place"
        );
        return Ok(false);
    }
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(answer) => Ok(answer.is_left()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(uid: &str, version: &str) -> CustomResourceDefinition {
        let mut crd = CustomResourceDefinition::default();
        crd.metadata.name = Some("greetings.hello.io".into());
        crd.metadata.uid = Some(uid.into());
        crd.metadata.resource_version = Some(version.into());
        crd.metadata.generation = Some(1);
        crd
    }

    #[test]
    fn a_crd_is_applied_again_unless_it_is_as_applied_and_established() {
        let applied = Applied::default();
        let body = fingerprint(&serde_json::json!({"spec": {"group": "hello.io"}}));
        let other = fingerprint(&serde_json::json!({"spec": {"group": "hello.io", "x": 1}}));
        assert!(!applied.unchanged(body.0, &crd("a", "7")), "never applied");
        let as_applied = AppliedAs {
            body,
            generation: Some(1),
        };
        applied.established("greetings.hello.io", as_applied, &crd("a", "7").metadata);
        assert!(applied.unchanged(body.0, &crd("a", "7")));
        assert!(
            !applied.unchanged(other.0, &crd("a", "7")),
            "another body to apply"
        );
        assert!(!applied.unchanged(body.0, &crd("a", "8")), "changed since");
        assert!(!applied.unchanged(body.0, &crd("b", "7")), "created again");
        applied.forget("greetings.hello.io");
        assert!(!applied.unchanged(body.0, &crd("a", "7")), "forgotten");
    }

    #[test]
    fn a_crd_changed_between_its_apply_and_its_establishment_is_not_recorded() {
        let applied = Applied::default();
        let body = fingerprint(&serde_json::json!({"spec": {"group": "hello.io"}}));
        let mut changed = crd("a", "9");
        changed.metadata.generation = Some(2);
        let as_applied = AppliedAs {
            body,
            generation: Some(1),
        };
        applied.established("greetings.hello.io", as_applied, &changed.metadata);
        assert!(
            !applied.unchanged(body.0, &changed),
            "another generation: applied again"
        );
    }
}
