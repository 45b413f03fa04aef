//! What the operator does with an object the guard left out: it logs it
//! by name (never its body) and puts a Warning event on it, at most once
//! per object and reason every [`REPEAT`]; the metric counts every time.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::scan::Skipped;

/// How often one object's being left out is said again.
pub const REPEAT: Duration = Duration::from_secs(10 * 60);
/// Objects left out that wait to be reported; more are dropped (still counted).
const QUEUE: usize = 256;
/// Objects remembered as reported; past this, the oldest are forgotten.
const REMEMBERED: usize = 10_000;

/// Where the guard sends what it left out.
#[derive(Clone, Debug)]
pub struct Sink(mpsc::Sender<Skipped>);

impl Sink {
    /// Queues `skipped` for reporting (dropped when the queue is full).
    pub fn send(&self, skipped: Skipped) {
        let _ = self.0.try_send(skipped);
    }
}

/// The queue of objects left out, to be reported by [`run`].
#[derive(Debug)]
pub struct Reports(mpsc::Receiver<Skipped>);

/// A sink and the reports it fills.
pub fn channel() -> (Sink, Reports) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Sink(tx), Reports(rx))
}

/// Reports every object left out until `stop` is cancelled (or the sink
/// is dropped: the client holding it is held here too, so only `stop`
/// ends a running operator's reports).
pub async fn run(client: kube::Client, mut reports: Reports, stop: CancellationToken) {
    let reporter = Reporter {
        controller: "kustomize-operator".into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok()),
    };
    let events = Recorder::new(client, reporter);
    let mut said: HashMap<String, Instant> = HashMap::new();
    loop {
        let skipped = tokio::select! {
            () = stop.cancelled() => return,
            next = reports.0.recv() => match next {
                Some(skipped) => skipped,
                None => return,
            },
        };
        let now = Instant::now();
        let key = key(&skipped);
        if said.get(&key).is_some_and(|at| now < *at + REPEAT) {
            continue;
        }
        if said.len() >= REMEMBERED {
            said.retain(|_, at| now < *at + REPEAT);
        }
        said.insert(key, now);
        report(&events, &skipped).await;
    }
}

fn key(skipped: &Skipped) -> String {
    let id = &skipped.identity;
    format!(
        "{}/{}/{}/{}/{}/{}",
        id.api_version, id.kind, id.namespace, id.name, id.uid, skipped.reason
    )
}

async fn report(events: &Recorder, skipped: &Skipped) {
    let id = &skipped.identity;
    tracing::warn!(
        api_version = %id.api_version,
        kind = %id.kind,
        namespace = %id.namespace,
        name = %id.name,
        reason = %skipped.reason,
        "left an object out of what the operator reads; it is not served until it changes"
    );
    if id.name.is_empty() || id.kind.is_empty() {
        return;
    }
    let regarding = ObjectReference {
        api_version: Some(id.api_version.clone()).filter(|v| !v.is_empty()),
        kind: Some(id.kind.clone()),
        name: Some(id.name.clone()),
        namespace: Some(id.namespace.clone()).filter(|n| !n.is_empty()),
        uid: Some(id.uid.clone()).filter(|u| !u.is_empty()),
        ..Default::default()
    };
    let note = format!(
        "the operator cannot read this object, {}; it is left out of what the operator serves until it changes",
        skipped.reason
    );
    let event = Event {
        type_: EventType::Warning,
        reason: "Unreadable".into(),
        note: Some(note),
        action: "Read".into(),
        secondary: None,
    };
    if let Err(e) = events.publish(&event, &regarding).await {
        tracing::debug!(error = %crate::error_text::kube(&e), "cannot publish the Unreadable event");
    }
}
