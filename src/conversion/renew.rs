//! The webhook's certificate, renewed while the operator runs. Every
//! replica looks at the shared Secret every [`Renewing::check`]
//! ([`certificate::shared`] renews it when it nears its end): what it finds,
//! its own renewal or another replica's, it serves from the next
//! handshake and trusts, and it brings every CRD that calls the webhook to
//! the CAs trusted now.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::Webhook;
use super::certificate::{self, Certificate, Renewal};
use super::server::ServingCertificate;
use crate::engine::host::Engine;

/// Where the shared certificate is, and how it is renewed.
#[derive(Clone)]
pub struct Renewing {
    /// The client its Secret and the CRDs are read and written with.
    pub client: Client,
    /// The operator's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub secret: String,
    /// The hosts the certificate is for.
    pub hosts: Vec<String>,
    /// When it is renewed.
    pub renewal: Renewal,
    /// How often it is looked at.
    pub check: Duration,
    /// The label of the CRDs the operator applies for definitions.
    pub label: String,
}

/// Looks at the certificate every `check` until the task is dropped,
/// starting from `current`, which `serving` serves and `webhook` trusts.
pub async fn renew(
    renewing: Renewing,
    webhook: Arc<Webhook>,
    serving: Arc<ServingCertificate>,
    mut current: Certificate,
) {
    let mut ticks = tokio::time::interval(renewing.check);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let found = certificate::shared(
            &renewing.client,
            &renewing.namespace,
            &renewing.secret,
            &renewing.hosts,
            &renewing.renewal,
        )
        .await;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "conversion webhook: cannot look at the certificate");
                continue;
            }
        };
        if webhook.set_ca(&found.ca_pem) {
            tracing::info!("conversion webhook: trusting the renewed CAs");
            trust(&renewing, &webhook).await;
        }
        if found.cert_pem != current.cert_pem {
            match serving.set(&found) {
                Ok(()) => {
                    tracing::info!(expires = %found.expires, "conversion webhook: serving the renewed certificate");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "conversion webhook: cannot serve the renewed certificate")
                }
            }
        }
        current = found;
    }
}

/// Brings the `caBundle` of every CRD carrying the label that calls the
/// webhook to the CAs `webhook` trusts now. Only those calling this
/// webhook: another install's CRDs carry the same label (a patch of
/// theirs made the API server call them with the wrong CAs, and changed
/// their spec under a storage migration, which then kept the old stored
/// versions).
async fn trust(renewing: &Renewing, webhook: &Webhook) {
    let api = Api::<CustomResourceDefinition>::all(renewing.client.clone());
    let crds = match api
        .list(&ListParams::default().labels(&renewing.label))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %crate::error_text::kube(&e), "conversion webhook: cannot list the CRDs to trust the renewed CAs");
            return;
        }
    };
    let bundle = ByteString(webhook.ca().into_bytes());
    let patch =
        json!({"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": bundle}}}}});
    for crd in crds.iter().filter(|crd| webhook.is_called_by(crd)) {
        // Under the operator's name, as its other writes are.
        let params = PatchParams {
            field_manager: Some(Engine::FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        if let Err(e) = api
            .patch(&crd.name_any(), &params, &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(crd = %crd.name_any(), error = %crate::error_text::kube(&e), "conversion webhook: cannot trust the renewed CAs");
        }
    }
}
