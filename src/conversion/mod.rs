//! The operator's own conversion webhook: the API server sends it every
//! object of a kind definition's kind that must change version (read at
//! one version, stored at another), and it answers with what the kind
//! file declares ([`Versions::convert`]). One endpoint answers for every
//! kind served; a kind with one version never calls it.
//!
//! It serves HTTPS with a certificate it makes at start (a CA of its own,
//! [`certificate`]); the CA goes into the `caBundle` of each CRD of
//! several versions it applies ([`Webhook::client_config`]).

mod budget;
pub mod certificate;
mod filed;
mod follow;
mod intake;
pub mod renew;
mod review;
pub mod server;
mod worker;

pub use filed::{Filed, Unconverted, Unfiled};
pub use follow::{Following, follow};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};

use crate::kinds::declared::versions::Versions;

/// The path the webhook answers on.
pub const PATH: &str = "/convert";
/// The annotation on a CRD the operator applied that holds its kind's
/// conversions (JSON): what every replica's webhook answers with.
pub const ANNOTATION: &str = "kustomize-operator.io/conversions";

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A URL (`https://127.0.0.1:9443`), for an operator outside the cluster.
    Url(String),
    /// A Service in front of the operator's Pods.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its port.
        port: i32,
    },
}

impl Endpoint {
    /// The host names the serving certificate must carry.
    pub fn hosts(&self) -> Vec<String> {
        match self {
            Self::Url(url) => {
                let uri = url.parse::<http::Uri>().ok();
                let host = uri.as_ref().and_then(http::Uri::host).unwrap_or_default();
                vec![
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string(),
                ]
            }
            Self::Service {
                namespace, name, ..
            } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
        }
    }

    /// Whether the API server may go on calling this process for a moment
    /// after it stops, through a route that then drops it (a Service's
    /// endpoints; a balancer behind a URL): its webhook drains. A
    /// loopback URL names this process alone, and nothing answers there
    /// once it is gone, drained or not.
    pub fn drains(&self) -> bool {
        match self {
            Self::Url(_) => !self.hosts().iter().all(|host| {
                host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }),
            Self::Service { .. } => true,
        }
    }
}

/// True when `crd` converts through a webhook.
pub fn calls_webhook(crd: &CustomResourceDefinition) -> bool {
    (crd.spec.conversion.as_ref()).is_some_and(|c| c.strategy == "Webhook" && c.webhook.is_some())
}

/// The conversions of every kind served, by group and kind, each filed
/// from the kind's own CRD ([`Filed::from_crd`]).
#[derive(Debug, Default)]
pub struct Conversions(Mutex<HashMap<(String, String), Arc<Filed>>>);

impl Conversions {
    /// Answers for `filed`'s kind with it from now on.
    pub fn file(&self, filed: Arc<Filed>) {
        crate::sync::lock(&self.0).insert(filed.key(), filed);
    }

    /// No longer answers for the kind `kind` of `group` if what it answers
    /// with was filed from the CRD `crd`: another CRD (a decoy naming the
    /// same kind, an older CRD of a renamed kind) removes nothing.
    pub fn remove(&self, group: &str, kind: &str, crd: &str) {
        let key = (group.to_string(), kind.to_string());
        let mut filed = crate::sync::lock(&self.0);
        if filed.get(&key).is_some_and(|f| f.crd() == crd) {
            filed.remove(&key);
        }
    }

    /// The conversions of the kind `kind` of `group`, if it is served.
    pub fn get(&self, group: &str, kind: &str) -> Option<Arc<Filed>> {
        let key = (group.to_string(), kind.to_string());
        crate::sync::lock(&self.0).get(&key).cloned()
    }
}

/// The webhook as the CRDs name it, and the conversions it answers with.
#[derive(Debug)]
pub struct Webhook {
    /// Where the API server reaches it.
    pub endpoint: Endpoint,
    /// The CAs the API server trusts it by (PEM): the one that signed its
    /// certificate, and while it is renewed its successor's.
    ca: Mutex<String>,
    /// What it converts with.
    pub conversions: Arc<Conversions>,
}

impl Webhook {
    /// The webhook at `endpoint`, trusted by `ca`.
    pub fn new(endpoint: Endpoint, ca: String, conversions: Arc<Conversions>) -> Self {
        Self {
            endpoint,
            ca: Mutex::new(ca),
            conversions,
        }
    }

    /// The CAs a CRD's `caBundle` holds.
    pub fn ca(&self) -> String {
        crate::sync::lock(&self.ca).clone()
    }

    /// Trusts `ca` from now on; true when it changed.
    pub fn set_ca(&self, ca: &str) -> bool {
        let mut held = crate::sync::lock(&self.ca);
        let changed = *held != ca;
        if changed {
            *held = ca.to_string();
        }
        changed
    }

    /// True when `crd` converts through this webhook: another operator's
    /// (another install, another namespace's), calling another URL or
    /// Service, is not this one's to touch, though it carries the same
    /// marker label.
    pub fn is_called_by(&self, crd: &CustomResourceDefinition) -> bool {
        let called = (crd.spec.conversion.as_ref())
            .filter(|c| c.strategy == "Webhook")
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref());
        let ours = self.client_config();
        called.is_some_and(|c| c.url == ours.url && c.service == ours.service)
    }

    /// Brings the `caBundle` of `crd`, if it calls the webhook, to the CAs
    /// trusted now (a CRD checked before a renewal carries the older).
    pub fn refresh(&self, crd: &mut CustomResourceDefinition) {
        let config = (crd.spec.conversion.as_mut())
            .and_then(|c| c.webhook.as_mut())
            .and_then(|w| w.client_config.as_mut());
        if let Some(config) = config {
            config.ca_bundle = Some(ByteString(self.ca().into_bytes()));
        }
    }

    /// Makes `crd` (of `versions`) call the webhook, which then answers
    /// for it: its `spec.conversion`, and its conversions in [`ANNOTATION`].
    /// Returns what the webhook answers for it with, read back from it as
    /// every replica reads it.
    pub fn attach(
        &self,
        crd: &mut CustomResourceDefinition,
        versions: &Versions,
    ) -> Result<Filed, Unfiled> {
        crd.spec.conversion = Some(self.conversion());
        let declared = serde_json::to_string(versions).map_err(|e| Unfiled::Unreadable {
            crd: crd.metadata.name.clone().unwrap_or_default(),
            reason: e.to_string(),
        })?;
        (crd.metadata.annotations.get_or_insert_default()).insert(ANNOTATION.into(), declared);
        Filed::from_crd(crd)
    }

    /// The `spec.conversion` of a CRD whose versions it converts.
    fn conversion(&self) -> CustomResourceConversion {
        CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(WebhookConversion {
                client_config: Some(self.client_config()),
                conversion_review_versions: vec!["v1".into()],
            }),
        }
    }

    /// How the API server calls it.
    fn client_config(&self) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(self.ca().into_bytes()));
        match &self.endpoint {
            Endpoint::Url(url) => WebhookClientConfig {
                url: Some(format!("{}{PATH}", url.trim_end_matches('/'))),
                ca_bundle,
                service: None,
            },
            Endpoint::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                url: None,
                ca_bundle,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(PATH.into()),
                    port: Some(*port),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionSpec;

    #[test]
    fn a_crd_calling_another_operators_webhook_is_not_called_by_this_one() {
        let ours = Webhook::new(
            Endpoint::Url("https://127.0.0.1:9443".into()),
            "CA".into(),
            Arc::default(),
        );
        let other = Webhook::new(
            Endpoint::Url("https://127.0.0.1:9444".into()),
            "CA".into(),
            Arc::default(),
        );
        let crd = |conversion| CustomResourceDefinition {
            spec: CustomResourceDefinitionSpec {
                conversion,
                ..Default::default()
            },
            ..Default::default()
        };
        let calling_ours = crd(Some(ours.conversion()));
        assert!(ours.is_called_by(&calling_ours));
        assert!(!other.is_called_by(&calling_ours));
        ours.set_ca("a renewed CA");
        assert!(ours.is_called_by(&calling_ours), "whatever CA it trusts");
        assert!(!ours.is_called_by(&crd(None)));
        let service = Webhook::new(
            Endpoint::Service {
                namespace: "ops".into(),
                name: "webhook".into(),
                port: 443,
            },
            "CA".into(),
            Arc::default(),
        );
        assert!(!service.is_called_by(&calling_ours));
        assert!(service.is_called_by(&crd(Some(service.conversion()))));
    }

    #[test]
    fn the_certificate_is_for_the_host_the_api_server_calls() {
        let url = |u: &str| Endpoint::Url(u.into()).hosts();
        assert_eq!(url("https://127.0.0.1:9443"), ["127.0.0.1"]);
        assert_eq!(url("https://[::1]:9443/x"), ["::1"]);
        assert_eq!(url("https://webhook.example.com"), ["webhook.example.com"]);
        let service = Endpoint::Service {
            namespace: "ops".into(),
            name: "webhook".into(),
            port: 443,
        };
        assert_eq!(
            service.hosts(),
            ["webhook.ops.svc", "webhook.ops.svc.cluster.local"]
        );
    }

    #[test]
    fn a_service_or_a_remote_url_drains_and_a_loopback_url_does_not() {
        let url = |u: &str| Endpoint::Url(u.into()).drains();
        assert!(!url("https://127.0.0.1:9443"));
        assert!(!url("https://[::1]:9443"));
        assert!(!url("https://localhost:9443"));
        assert!(url("https://webhook.example.com"));
        assert!(url("https://10.0.0.7:9443"));
        let service = Endpoint::Service {
            namespace: "ops".into(),
            name: "webhook".into(),
            port: 443,
        };
        assert!(service.drains());
    }
}
