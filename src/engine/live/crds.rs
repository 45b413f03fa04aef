//! Whether a CustomResourceDefinition is established (its API served):
//! waited for by a reconcile whose build holds a CRD and resources of it,
//! and by a KindDefinition before its kind is served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

/// How long a new CRD may take to be established.
pub(crate) const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often it is looked at meanwhile.
const ESTABLISH_POLL: Duration = Duration::from_millis(200);

/// True once the CRD `name` is established (within [`ESTABLISH_TIMEOUT`]).
pub(crate) async fn wait_established(client: &Client, name: &str) -> Result<bool, kube::Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let deadline = tokio::time::Instant::now() + ESTABLISH_TIMEOUT;
    loop {
        let established = api
            .get_opt(name)
            .await?
            .is_some_and(|crd| is_established(&crd));
        if established || tokio::time::Instant::now() >= deadline {
            return Ok(established);
        }
        tokio::time::sleep(ESTABLISH_POLL).await;
    }
}

/// True when the CRD's `Established` condition is `True`.
fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Established" && c.status == "True")
}
