//! The span every log line of one reconcile carries: the kind, the
//! resource, its generation and, once the handler has chosen it, the
//! revision of the kind's files that renders it.

use kube::api::ObjectMeta;
use tracing::Span;

/// The span's field a handler fills in when it chooses a revision
/// ([`record_revision`]).
const REVISION: &str = "revision";

/// The span of one reconcile of the resource `meta` of `kind`: a root,
/// though kube-runtime starts each reconcile inside its own span, whose
/// object is the runtime's store key (a `ServedResource` of a made-up
/// group, the kind folded into the namespace), not the resource.
pub(crate) fn reconcile_span(kind: &str, meta: &ObjectMeta) -> Span {
    let object = match &meta.namespace {
        Some(namespace) => format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    };
    tracing::info_span!(
        parent: None,
        "reconcile",
        kind,
        object,
        generation = meta.generation,
        revision = tracing::field::Empty
    )
}

/// Says in the current reconcile's span which revision of the kind's files
/// renders the resource (a no-op outside a reconcile).
pub(crate) fn record_revision(number: u32) {
    Span::current().record(REVISION, number);
}

/// What a test's log says: the writer of a `fmt` layer, read back as text.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct LogLines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogLines {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("lines").clone()).expect("utf-8")
    }

    /// How many times `said` was written.
    pub(crate) fn count(&self, said: &str) -> usize {
        self.text().matches(said).count()
    }
}

#[cfg(test)]
impl std::io::Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lines").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// The resource `team-a/hello` at generation 3.
    fn hello() -> ObjectMeta {
        ObjectMeta {
            namespace: Some("team-a".into()),
            name: Some("hello".into()),
            generation: Some(3),
            ..ObjectMeta::default()
        }
    }

    /// The one JSON log line `log` writes, and the whole text.
    fn logged(log: impl FnOnce()) -> (serde_json::Value, String) {
        let lines = LogLines::default();
        let writer = lines.clone();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .with_writer(move || writer.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, log);
        let text = lines.text();
        let line = serde_json::from_str(text.trim()).expect(&text);
        (line, text)
    }

    #[test]
    fn a_log_line_inside_a_reconcile_names_the_kind_the_resource_its_generation_and_revision() {
        let (line, _) = logged(|| {
            let _inside = reconcile_span("Greeting", &hello()).entered();
            record_revision(2);
            tracing::warn!("applying failed");
        });
        assert_eq!(line["fields"]["message"], "applying failed");
        let span = &line["span"];
        assert_eq!(span["name"], "reconcile");
        assert_eq!(span["kind"], "Greeting");
        assert_eq!(span["object"], "team-a/hello");
        assert_eq!(span["generation"], 3);
        assert_eq!(span["revision"], 2);
    }

    /// Started inside kube-runtime's span for the store's key, a reconcile's
    /// log lines carry its own span alone: not the key, which names no
    /// real kind.
    #[test]
    fn a_reconcile_span_is_a_root_whatever_span_starts_it() {
        let (line, text) = logged(|| {
            let key = "ServedResource.v1.kustomize-operator.io/hello.greeting/team-a";
            let runtime = tracing::info_span!("reconciling object", "object.ref" = key);
            let reconcile = runtime.in_scope(|| reconcile_span("Greeting", &hello()));
            let _inside = reconcile.entered();
            tracing::warn!("applying failed");
        });
        let spans = line["spans"].as_array().expect(&text);
        assert_eq!(spans.len(), 1, "{text}");
        assert_eq!(spans[0]["name"], "reconcile", "{text}");
        assert!(!text.contains("ServedResource"), "{text}");
    }
}
