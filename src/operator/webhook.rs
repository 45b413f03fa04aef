//! The conversion webhook: its certificate, its endpoint, how it drains.

use std::net::SocketAddr;
use std::sync::Arc;

use super::Operator;
use super::StartError;
use crate::cli::RunArgs;
use crate::conversion::Webhook;
use crate::conversion::certificate::Certificate;
use crate::conversion::renew::Renewing;

/// How long the conversion webhook goes on answering once the operator
/// shuts down: the API server may still send reviews to this replica
/// until its Service's endpoints and every node's routes have dropped it
/// (a second or two), and every list of a kind at another version would
/// fail meanwhile. Not for a loopback URL ([`crate::conversion::Endpoint::drains`]):
/// an operator run beside the API server stops at once.
pub(super) const WEBHOOK_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the reviews under way may then take before their connections
/// are dropped.
pub(super) const WEBHOOK_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// The conversion webhook the command line asks for, with the
/// certificate it serves for the host the API server calls: the one every
/// replica shares (a Secret of the operator's namespace), or, for an
/// operator run without a namespace of its own, one made now.
pub(super) async fn conversion_webhook(
    args: &RunArgs,
    client: &kube::Client,
) -> Result<Option<WebhookStart>, StartError> {
    if args.conversion_webhook_addr.is_none() {
        return Ok(None);
    }
    let endpoint = (args.conversion_webhook_url.clone())
        .or_else(|| args.conversion_webhook_service.clone())
        .ok_or_else(|| {
            StartError::Webhook(
                "--conversion-webhook-addr needs --conversion-webhook-url or --conversion-webhook-service: where the API server calls it".into(),
            )
        })?;
    let hosts = endpoint.hosts();
    let renewal = crate::conversion::certificate::Renewal {
        promote_after: args.conversion_webhook_promote_after,
        ..Default::default()
    };
    let renewing = (args.common.operator_namespace.clone()).map(|namespace| Renewing {
        client: client.clone(),
        namespace,
        secret: args.conversion_webhook_secret.clone(),
        hosts: hosts.clone(),
        renewal,
        check: args.conversion_webhook_check,
        label: crate::definitions::resource::MARKER_LABEL.to_string(),
    });
    let certificate = match &renewing {
        Some(r) => {
            let shared = crate::conversion::certificate::shared;
            shared(client, &r.namespace, &r.secret, &hosts, &renewal).await
        }
        None => crate::conversion::certificate::make(&hosts),
    }
    .map_err(|e| StartError::Webhook(e.to_string()))?;
    let webhook = Webhook::new(endpoint, certificate.ca_pem.clone(), Arc::default());
    Ok(Some(WebhookStart {
        webhook: Arc::new(webhook),
        certificate,
        renewing,
    }))
}

/// The conversion webhook, as it starts: what the CRDs name, the
/// certificate it serves, and how that is renewed (when it is shared).
pub(super) struct WebhookStart {
    pub(super) webhook: Arc<Webhook>,
    pub(super) certificate: Certificate,
    pub(super) renewing: Option<Renewing>,
}

impl Operator {
    /// Starts the conversion webhook's endpoint on `addr`, the renewal of
    /// its certificate, and the following of the CRDs of the definitions
    /// served (`following`), from which it answers.
    pub(super) fn spawn_webhook(
        &mut self,
        addr: SocketAddr,
        start: WebhookStart,
        following: Option<crate::conversion::Following>,
    ) -> Result<(), StartError> {
        let WebhookStart {
            webhook,
            certificate,
            renewing,
        } = start;
        let serving = crate::conversion::server::ServingCertificate::new(&certificate)
            .map(Arc::new)
            .map_err(|e| StartError::Webhook(e.to_string()))?;
        if let Some(renewing) = renewing {
            let renewed = crate::conversion::renew::renew(
                renewing,
                webhook.clone(),
                serving.clone(),
                certificate,
            );
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = renewed => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        let token = self.shutdown.clone();
        let conversions = webhook.conversions.clone();
        let drain = if webhook.endpoint.drains() {
            WEBHOOK_DRAIN
        } else {
            std::time::Duration::ZERO
        };
        tracing::info!(%addr, endpoint = ?webhook.endpoint, "conversion webhook: serving");
        if let Some(following) = following {
            let client = self.engine.client().clone();
            let filed = conversions.clone();
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    () = crate::conversion::follow(client, filed, following) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        self.tasks.spawn(async move {
            let drained = token.clone();
            let stop = async move {
                drained.cancelled().await;
                tokio::time::sleep(drain).await;
            };
            let serving = crate::conversion::server::serve(addr, serving, conversions, stop);
            tokio::select! {
                result = serving => {
                    if let Err(e) = result {
                        tracing::error!(%addr, error = %e, "conversion webhook failed");
                    }
                }
                () = async {
                    token.cancelled().await;
                    tokio::time::sleep(drain + WEBHOOK_CLOSE).await;
                } => tracing::warn!("conversion webhook: connections still open at shutdown, dropped"),
            }
        });
        Ok(())
    }
}
