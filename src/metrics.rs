//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabel {
    verb: String,
    exit_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    skipped: Family<KindLabel, Counter>,
    kubectl_runs: Family<RunLabel, Counter>,
    kubectl_seconds: Family<VerbLabel, Histogram>,
    in_flight: Gauge,
    ready: AtomicBool,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kustomize_operator");
        let reconciles = Family::<KindLabel, Counter>::default();
        let errors = Family::<KindLabel, Counter>::default();
        let skipped = Family::<KindLabel, Counter>::default();
        let kubectl_runs = Family::<RunLabel, Counter>::default();
        let kubectl_seconds = Family::<VerbLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.05, 2.0, 10))
        });
        let in_flight = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciles started, by kind",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_skipped",
            "Reconciles that found nothing changed and spawned no kubectl, by kind",
            skipped.clone(),
        );
        registry.register(
            "kubectl_runs",
            "kubectl processes run, by verb and exit code",
            kubectl_runs.clone(),
        );
        registry.register(
            "kubectl_duration_seconds",
            "kubectl run time, by verb",
            kubectl_seconds.clone(),
        );
        registry.register(
            "kubectl_in_flight",
            "kubectl processes running or waiting for a slot (the work queue of the engine)",
            in_flight.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            skipped,
            kubectl_runs,
            kubectl_seconds,
            in_flight,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts a reconcile of `kind`.
    pub fn reconcile(&self, kind: &str) {
        self.reconciles
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Counts a failed reconcile of `kind`.
    pub fn reconcile_error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Counts a reconcile that found nothing to do.
    pub fn skipped(&self, kind: &str) {
        self.skipped
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Reconciles of `kind` that were skipped so far.
    pub fn skipped_count(&self, kind: &str) -> u64 {
        self.skipped
            .get_or_create(&KindLabel { kind: kind.into() })
            .get()
    }

    /// Records a finished kubectl run.
    pub fn kubectl_run(&self, verb: &str, exit_code: Option<i32>, duration: Duration) {
        let exit_code = exit_code.map_or_else(|| "killed".to_string(), |c| c.to_string());
        self.kubectl_runs
            .get_or_create(&RunLabel {
                verb: verb.into(),
                exit_code,
            })
            .inc();
        self.kubectl_seconds
            .get_or_create(&VerbLabel { verb: verb.into() })
            .observe(duration.as_secs_f64());
    }

    /// The gauge of kubectl runs in flight.
    pub fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }

    /// Marks the operator ready (controllers started) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn ready_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_by_label() {
        let m = Metrics::new();
        m.reconcile("sample");
        m.skipped("sample");
        m.kubectl_run("apply", Some(0), Duration::from_millis(200));
        let text = m.encode();
        assert!(
            text.contains("kustomize_operator_reconciles_total{kind=\"sample\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kustomize_operator_kubectl_runs_total{verb=\"apply\",exit_code=\"0\"} 1"
            ),
            "{text}"
        );
        assert_eq!(m.skipped_count("sample"), 1);
    }
}
