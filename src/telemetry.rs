//! Where the operator's logs and traces go: log lines on standard error
//! (text or JSON), and, given an OTLP endpoint (`--otlp-endpoint`), every
//! span (one per reconcile, one per kubectl run inside it) exported to an
//! OpenTelemetry collector over OTLP/HTTP.
//!
//! The exporter runs on a thread of its own (the SDK's batch processor,
//! through reqwest's blocking client), so [`Telemetry::start`] and
//! [`Telemetry::stop`] are called outside the async runtime.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::LogFormat;

/// The service name the collector sees on every span.
const SERVICE: &str = "kustomize-operator";
/// The path of traces under an OTLP/HTTP endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// How long one export to the collector may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the traces cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The HTTPS client could not be built (the system's roots, a thread).
    #[error("cannot build the OTLP client: {0}")]
    Client(String),
    /// The exporter refused its configuration (the endpoint).
    #[error("cannot export traces to {endpoint}: {reason}")]
    Exporter {
        /// The endpoint given.
        endpoint: String,
        /// The exporter's reason.
        reason: String,
    },
}

/// The logging and, when an endpoint was given, the trace export, started
/// for the process; [`Telemetry::stop`] sends the spans still buffered.
#[must_use = "stop() sends the spans still buffered"]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the process's subscriber: log lines in `format` on standard
    /// error, filtered by `RUST_LOG` (default `info`), and spans exported to
    /// the OTLP/HTTP `endpoint` (its base URL: `http://collector:4318`).
    pub fn start(format: LogFormat, endpoint: Option<&str>) -> Result<Self, TelemetryError> {
        let traces = endpoint.map(tracer_provider).transpose()?;
        let otel = traces
            .as_ref()
            .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE)));
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        tracing_subscriber::registry()
            .with(filter)
            .with(log_lines(format))
            .with(otel)
            .init();
        Ok(Self { traces })
    }

    /// Sends the spans still buffered and stops the export.
    pub fn stop(self) {
        if let Some(provider) = self.traces
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: the last traces were not exported: {e}");
        }
    }
}

/// Log lines on standard error; colours only for a terminal, so that a log
/// file keeps plain text.
fn log_lines<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(colours)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => lines.json().boxed(),
        LogFormat::Text => lines.boxed(),
    }
}

/// The SDK's provider, exporting in batches to `endpoint`.
fn tracer_provider(endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let url = traces_url(endpoint);
    let exporter = SpanExporter::builder()
        .with_http()
        .with_http_client(blocking_client()?)
        .with_endpoint(url.as_str())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: url.clone(),
            reason: e.to_string(),
        })?;
    let service = Resource::builder().with_service_name(SERVICE).build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(service)
        .build())
}

/// Where traces go under an OTLP/HTTP base URL.
fn traces_url(endpoint: &str) -> String {
    format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
}

/// reqwest's blocking client, trusting what the operator's other clients
/// trust ([`crate::trust`]). Built on a thread of its own, as the client
/// keeps a runtime of its own.
fn blocking_client() -> Result<reqwest::blocking::Client, TelemetryError> {
    let tls = crate::trust::client_tls().map_err(TelemetryError::Client)?;
    std::thread::spawn(move || {
        reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(EXPORT_TIMEOUT)
            .build()
    })
    .join()
    .map_err(|_| TelemetryError::Client("the thread building it panicked".into()))?
    .map_err(|e| TelemetryError::Client(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_that_is_no_url_is_refused_naming_it() {
        let Err(err) = tracer_provider("http://not a host:4318") else {
            panic!("accepted");
        };
        assert!(
            matches!(&err, TelemetryError::Exporter { endpoint, .. } if endpoint == "http://not a host:4318/v1/traces"),
            "{err}"
        );
    }

    #[test]
    fn the_traces_path_is_added_to_the_base_url_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    }

    #[test]
    fn a_base_url_gives_a_provider_that_stops_with_nothing_to_send() {
        let provider = tracer_provider("http://127.0.0.1:4318").expect("a provider");
        provider.shutdown().expect("nothing to send");
    }
}
