//! The CRD a definition declares: applied server-side carrying the
//! definition's marker, waited for until established, deleted when the
//! kind goes. A CRD without the marker is never changed or deleted.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use super::resource::MARKER_LABEL;
use crate::engine::host::FIELD_MANAGER;
pub(crate) use crate::engine::host::wait_established;

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
/// CRD of that name exists without its marker.
pub async fn apply(
    client: &Client,
    crd: &CustomResourceDefinition,
    definition: &str,
) -> Result<(), CrdError> {
    let name = crd.name_any();
    let api_error = |source| CrdError::Api {
        crd: name.clone(),
        source,
    };
    if let Some(existing) = live(client, &name).await.map_err(api_error)? {
        let owner = marker(&existing);
        if owner != Some(definition) {
            return Err(CrdError::NotOwned {
                crd: name,
                owner: owner.map(str::to_string),
            });
        }
    }
    let mut body = serde_json::to_value(crd).map_err(|e| api_error(kube::Error::SerdeError(e)))?;
    body["apiVersion"] = "apiextensions.k8s.io/v1".into();
    body["kind"] = "CustomResourceDefinition".into();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(api_error)?;
    Ok(())
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
