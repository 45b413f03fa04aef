//! Every replica's webhook answers from the CRDs themselves: the operator
//! that applies a CRD of several versions writes its kind's conversions
//! into it ([`super::ANNOTATION`]), and each replica, leader or not, just
//! started or not, follows the CRDs' metadata and answers with what the
//! applied CRD says.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{ANNOTATION, Conversions};
use crate::kinds::declared::versions::Versions;

/// Follows the CRDs carrying `label` until the task is dropped, keeping
/// `conversions` to what their annotations declare.
pub async fn follow(client: Client, conversions: Arc<Conversions>, label: &str) {
    let api = Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client);
    let config = watcher::Config::default().labels(label);
    let events = watcher(api, config).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(crd) | watcher::Event::InitApply(crd)) => {
                if let Some(versions) = declared(&crd) {
                    conversions.set(versions);
                }
            }
            Ok(watcher::Event::Delete(crd)) => {
                if let Some(versions) = declared(&crd) {
                    conversions.remove(&versions.group, &versions.kind);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %crate::error_text::watch(&e), "conversion webhook: cannot follow the CRDs")
            }
        }
    }
}

/// The conversions `crd`'s annotation declares, if it has a readable one.
fn declared(crd: &PartialObjectMeta<CustomResourceDefinition>) -> Option<Versions> {
    let text = crd.annotations().get(ANNOTATION)?;
    match serde_json::from_str(text) {
        Ok(versions) => Some(versions),
        Err(e) => {
            tracing::warn!(crd = %crd.name_any(), error = %e, "conversion webhook: the CRD's conversions do not parse");
            None
        }
    }
}
