//! Kubernetes events (`events.k8s.io/v1`) about the resources the engine
//! reconciles.
//!
//! Like kube-runtime's `Recorder`, a repeat of an event is folded into a
//! series (one PATCH of its count instead of a new Event). Unlike it, the
//! note is part of what makes two events "the same": the `Recorder` keys on
//! type, reason, action and objects only, so `deployment.apps/web
//! configured` after `deployment.apps/web created` showed as `created (x2)`.
//! That key is not configurable, hence this small publisher.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::Mutex;

use super::status::truncate;
use crate::kind::EventType;

/// How long a published event can still become a series.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// Longest note kept, in bytes (the API allows 1 KiB).
const NOTE_LIMIT: usize = 1000;

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Publish<'a> {
    /// The object the event is about.
    pub regarding: &'a ObjectReference,
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: &'a str,
    /// What the engine was doing (`Apply`, `Delete`, ...).
    pub action: &'a str,
    /// Detail.
    pub note: &'a str,
    /// Another object the event is about.
    pub related: Option<&'a ObjectReference>,
}

/// An object reference, as far as it tells objects apart: namespace, name, UID.
type RefKey = (Option<String>, Option<String>, Option<String>);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    regarding: RefKey,
    related: Option<(Option<String>, RefKey)>,
    warning: bool,
    reason: String,
    action: String,
    note: String,
}

#[derive(Debug, Clone)]
struct Sent {
    name: String,
    namespace: String,
    count: i32,
    last: jiff::Timestamp,
}

/// Publishes events as one controller instance.
pub(crate) struct Events {
    client: Client,
    controller: String,
    instance: String,
    sent: Mutex<HashMap<Key, Sent>>,
}

impl Events {
    /// A publisher reporting as `controller` (instance: `POD_NAME` or the host).
    pub fn new(client: Client, controller: &str) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "kustomize-operator".into());
        Self {
            client,
            controller: controller.to_string(),
            instance,
            sent: Mutex::default(),
        }
    }

    /// Publishes `event`: a new Event, or the next count of the same one
    /// published in the last few minutes.
    pub async fn publish(&self, event: &Publish<'_>) -> Result<(), kube::Error> {
        let note = truncate(event.note, NOTE_LIMIT);
        let key = Key {
            regarding: ref_key(event.regarding),
            related: event.related.map(|r| (r.kind.clone(), ref_key(r))),
            warning: event.type_ == EventType::Warning,
            reason: event.reason.to_string(),
            action: event.action.to_string(),
            note: note.clone(),
        };
        let now = jiff::Timestamp::now();
        let mut sent = self.sent.lock().await;
        sent.retain(|_, s| now.duration_since(s.last).unsigned_abs() < SERIES_TTL);
        if let Some(previous) = sent.get_mut(&key) {
            previous.count += 1;
            previous.last = now;
            let previous = previous.clone();
            drop(sent);
            return self.extend_series(&previous, now).await;
        }
        let namespace = event
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let created = Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(
                &PostParams::default(),
                &self.event(event, note, now, &namespace),
            )
            .await?;
        sent.insert(
            key,
            Sent {
                name: created.metadata.name.unwrap_or_default(),
                namespace,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn event(&self, e: &Publish<'_>, note: String, now: jiff::Timestamp, namespace: &str) -> Event {
        let name = e.regarding.name.as_deref().unwrap_or("object");
        Event {
            metadata: ObjectMeta {
                // As kubelets and kube-runtime name events: the object, then a
                // number unique enough for one object's events.
                name: Some(format!(
                    "{}.{:x}",
                    truncate(name, 200).trim_end_matches("..."),
                    now.as_nanosecond().unsigned_abs() ^ u128::from(rand::random::<u32>())
                )),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(e.action.to_string()),
            reason: Some(e.reason.to_string()),
            type_: Some(match e.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            note: Some(note),
            regarding: Some(e.regarding.clone()),
            related: e.related.cloned(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }

    async fn extend_series(&self, sent: &Sent, now: jiff::Timestamp) -> Result<(), kube::Error> {
        let patch = Event {
            series: Some(EventSeries {
                count: sent.count,
                last_observed_time: MicroTime(now),
            }),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &sent.namespace)
            .patch(&sent.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

fn ref_key(r: &ObjectReference) -> RefKey {
    (r.namespace.clone(), r.name.clone(), r.uid.clone())
}
