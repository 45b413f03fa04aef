//! Kubernetes events (`events.k8s.io/v1`) about the resources the engine
//! reconciles.
//!
//! Like kube-runtime's `Recorder`, a repeat of an event is folded into a
//! series (one PATCH of its count instead of a new Event). Unlike it, the
//! note is part of what makes two events "the same": the `Recorder` keys on
//! type, reason, action and objects only, so `deployment.apps/web
//! configured` after `deployment.apps/web created` showed as `created (x2)`.
//! That key is not configurable, hence this small publisher.

use std::hash::{BuildHasher, RandomState};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::sync::{Mutex, MutexGuard};
use tokio::time::{Duration, Instant};

use super::expiring::Expiring;
use crate::engine::contract::EventType;
use crate::text::truncate;

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
type RefKey<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// What makes two events the same event.
#[derive(Debug, Hash)]
struct Key<'a> {
    regarding: RefKey<'a>,
    related: Option<(Option<&'a str>, RefKey<'a>)>,
    warning: bool,
    reason: &'a str,
    action: &'a str,
    note: &'a str,
}

impl<'a> Key<'a> {
    fn of(event: &'a Publish<'_>, note: &'a str) -> Self {
        Self {
            regarding: ref_key(event.regarding),
            related: event.related.map(|r| (r.kind.as_deref(), ref_key(r))),
            warning: event.type_ == EventType::Warning,
            reason: event.reason,
            action: event.action,
            note,
        }
    }
}

/// A [`Key`] hashed with the publisher's random keys. The series map holds
/// this instead of the key's strings: with an entry per resource for
/// minutes after a burst, the strings were about ten small allocations
/// each, left scattered over the pages the burst filled. Two different
/// keys share a fingerprint with a chance of about one in 2^64 per pair.
type Fingerprint = u64;

#[derive(Debug, Clone)]
struct Sent {
    name: String,
    namespace: String,
    count: i32,
}

/// Publishes events as one controller instance.
pub(crate) struct Events {
    client: Client,
    controller: String,
    instance: String,
    sent: Mutex<Expiring<Fingerprint, Sent>>,
    fingerprints: RandomState,
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
            fingerprints: RandomState::new(),
        }
    }

    /// Publishes `event`: a new Event, or the next count of the same one
    /// published in the last few minutes.
    pub async fn publish(&self, event: &Publish<'_>) -> Result<(), kube::Error> {
        let note = truncate(event.note, NOTE_LIMIT);
        let key = self.fingerprint(&Key::of(event, &note));
        let now = jiff::Timestamp::now();
        let seen = Instant::now();
        // The lock is never held across a request: events of different
        // resources go out in parallel.
        if let Some(previous) = self.next_in_series(key, seen) {
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
        let sent = Sent {
            name: created.metadata.name.unwrap_or_default(),
            namespace,
            count: 1,
        };
        self.sent().insert(key, sent, seen + SERIES_TTL, seen);
        Ok(())
    }

    /// The series `key` continues, counted one up, if it was published in
    /// the last few minutes.
    fn next_in_series(&self, key: Fingerprint, now: Instant) -> Option<Sent> {
        let mut sent = self.sent();
        let previous = sent.renew(&key, now + SERIES_TTL, now)?;
        previous.count += 1;
        Some(previous.clone())
    }

    /// Forgets the series that ended (see [`Expiring::forget_expired`]).
    pub fn forget_expired(&self, now: Instant) {
        self.sent().forget_expired(now);
    }

    fn sent(&self) -> MutexGuard<'_, Expiring<Fingerprint, Sent>> {
        crate::sync::lock(&self.sent)
    }

    fn fingerprint(&self, key: &Key<'_>) -> Fingerprint {
        self.fingerprints.hash_one(key)
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

fn ref_key(r: &ObjectReference) -> RefKey<'_> {
    (r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(note: &str) -> Key<'_> {
        Key {
            regarding: (Some("ns"), Some("web"), Some("u1")),
            related: None,
            warning: false,
            reason: "Applied",
            action: "Apply",
            note,
        }
    }

    fn events() -> Events {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Events::new(Client::try_from(config).unwrap(), "test")
    }

    #[tokio::test]
    async fn a_repeat_within_the_ttl_continues_the_series() {
        let events = events();
        let t0 = Instant::now();
        let created = events.fingerprint(&key("created"));
        assert!(events.next_in_series(created, t0).is_none());
        let sent = Sent {
            name: "web.1".into(),
            namespace: "ns".into(),
            count: 1,
        };
        events.sent().insert(created, sent, t0 + SERIES_TTL, t0);
        let next = events.next_in_series(created, t0).unwrap();
        assert_eq!((next.name.as_str(), next.count), ("web.1", 2));
        assert!(
            events
                .next_in_series(events.fingerprint(&key("configured")), t0)
                .is_none(),
            "another note is another event"
        );
        let later = t0 + SERIES_TTL + Duration::from_secs(1);
        assert!(
            events.next_in_series(created, later).is_none(),
            "the series ended"
        );
    }

    #[tokio::test]
    async fn a_quiet_publisher_forgets_the_series_that_ended() {
        let events = events();
        let t0 = Instant::now();
        let sent = Sent {
            name: "web.1".into(),
            namespace: "ns".into(),
            count: 1,
        };
        events.sent().insert(1, sent, t0 + SERIES_TTL, t0);
        events.forget_expired(t0 + SERIES_TTL / 2);
        assert_eq!(events.sent().len(), 1, "still going");
        events.forget_expired(t0 + SERIES_TTL);
        assert_eq!(events.sent().len(), 0);
    }
}
