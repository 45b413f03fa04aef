//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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

use crate::kubectl::KubectlStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnreadableLabel {
    kind: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DefinitionLabel {
    definition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabel {
    verb: String,
    exit_code: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    skipped: Family<KindLabel, Counter>,
    in_flight: Family<KindLabel, Gauge>,
    unreadable: Family<UnreadableLabel, Counter>,
    kubectl_runs: Family<RunLabel, Counter>,
    kubectl_seconds: Family<RunLabel, Histogram>,
    kubectl_waiting: Gauge,
    kubectl_running: Gauge,
    kubectl_stats: OnceLock<Arc<KubectlStats>>,
    leader: Gauge,
    rollout_steps: Family<DefinitionLabel, Gauge>,
    rollout_step: Family<DefinitionLabel, Gauge>,
    rollbacks: Family<DefinitionLabel, Counter>,
    sharing: Sharing,
    ready: AtomicBool,
    leading: AtomicBool,
    stopped: std::sync::Mutex<Vec<String>>,
    progress: Arc<Mutex<Progress>>,
    stall_after: OnceLock<Duration>,
}

/// The metrics of automatic sharding.
struct Sharing {
    members: Gauge,
    slots: Gauge,
    resources: Gauge,
    foreign: Gauge,
    handovers: Family<DirectionLabel, Counter>,
    unowned: Histogram,
}

impl Sharing {
    fn register(registry: &mut Registry) -> Self {
        let sharing = Self {
            members: Gauge::default(),
            slots: Gauge::default(),
            resources: Gauge::default(),
            foreign: Gauge::default(),
            handovers: Family::default(),
            unowned: Histogram::new(exponential_buckets(0.25, 2.0, 10)),
        };
        registry.register(
            "shard_members",
            "Live members of this replica's ring (--auto-shard), itself included",
            sharing.members.clone(),
        );
        registry.register(
            "shard_slots",
            "Slots of the ring (of 64) this replica holds",
            sharing.slots.clone(),
        );
        registry.register(
            "shard_resources",
            "Resources in this replica's share, as its watches hold them",
            sharing.resources.clone(),
        );
        registry.register(
            "shard_foreign_read",
            "Resources this replica's watches read outside its share and left out (none where the API server filters by shard at the source)",
            sharing.foreign.clone(),
        );
        registry.register(
            "shard_handovers",
            "Slots handed over by this replica, given back or taken",
            sharing.handovers.clone(),
        );
        registry.register(
            "shard_unowned_seconds",
            "How long each slot this replica took had been without a working owner (since given back, or since its gone owner last renewed)",
            sharing.unowned.clone(),
        );
        sharing
    }
}

/// Whether reconciles make progress: how many run now, and since when
/// none has finished (or since work started, when none ran before).
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    in_flight: u64,
    since: Instant,
}

impl Progress {
    /// No reconcile running, as of `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            in_flight: 0,
            since: now,
        }
    }

    /// A reconcile started at `now`.
    pub fn started(&mut self, now: Instant) {
        if self.in_flight == 0 {
            self.since = now;
        }
        self.in_flight += 1;
    }

    /// A reconcile finished at `now` (however it ended).
    pub fn finished(&mut self, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.since = now;
    }

    /// Why reconciles are stalled at `now`, if they are: some run, and
    /// none has finished for longer than `bound`. Idle is not stalled, and
    /// a long burst that finishes reconciles as it goes is not either.
    pub fn stalled(&self, now: Instant, bound: Duration) -> Option<String> {
        let quiet = now.saturating_duration_since(self.since);
        (self.in_flight > 0 && quiet > bound).then(|| {
            format!(
                "reconciles stalled: none finished for {}s while {} {} running (the bound is {}s)",
                quiet.as_secs(),
                self.in_flight,
                if self.in_flight == 1 { "is" } else { "are" },
                bound.as_secs()
            )
        })
    }
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
        let in_flight = Family::<KindLabel, Gauge>::default();
        let unreadable = Family::<UnreadableLabel, Counter>::default();
        let kubectl_runs = Family::<RunLabel, Counter>::default();
        let kubectl_seconds = Family::<RunLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.05, 2.0, 10))
        });
        let kubectl_waiting = Gauge::default();
        let kubectl_running = Gauge::default();
        let leader = Gauge::default();
        let rollout_steps = Family::<DefinitionLabel, Gauge>::default();
        let rollout_step = Family::<DefinitionLabel, Gauge>::default();
        let rollbacks = Family::<DefinitionLabel, Counter>::default();
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
            "reconciles_in_flight",
            "Reconciles running now, by kind, including those waiting for a kubectl slot (kube-runtime does not expose its own queue)",
            in_flight.clone(),
        );
        registry.register(
            "objects_unreadable",
            "Objects left out of what the operator reads (too deep, or not the shape of their kind), by kind and reason, each time one is read",
            unreadable.clone(),
        );
        registry.register(
            "kubectl_runs",
            "kubectl processes run, by verb and exit code",
            kubectl_runs.clone(),
        );
        registry.register(
            "kubectl_duration_seconds",
            "kubectl run time, by verb and exit code",
            kubectl_seconds.clone(),
        );
        registry.register(
            "kubectl_waiting",
            "kubectl runs waiting for a slot under --max-concurrent-kubectl (the engine's work queue)",
            kubectl_waiting.clone(),
        );
        registry.register(
            "kubectl_running",
            "kubectl processes running now",
            kubectl_running.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica runs the controllers (holds the leader Lease, or runs without --leader-elect)",
            leader.clone(),
        );
        registry.register(
            "rollout_steps",
            "The steps of a KindDefinition's automatic rollout (spec.rollout.steps), by definition",
            rollout_steps.clone(),
        );
        registry.register(
            "rollout_step",
            "The step an automatic rollout is at, from 1 (0: none under way), by definition",
            rollout_step.clone(),
        );
        registry.register(
            "rollout_rollbacks",
            "Automatic rollouts rolled back by a failed gate, by definition (counted by the replica that rolled back)",
            rollbacks.clone(),
        );
        let sharing = Sharing::register(&mut registry);
        Self {
            sharing,
            registry,
            reconciles,
            errors,
            skipped,
            in_flight,
            unreadable,
            kubectl_runs,
            kubectl_seconds,
            kubectl_waiting,
            kubectl_running,
            kubectl_stats: OnceLock::new(),
            leader,
            rollout_steps,
            rollout_step,
            rollbacks,
            ready: AtomicBool::new(false),
            leading: AtomicBool::new(false),
            stopped: std::sync::Mutex::default(),
            progress: Arc::new(Mutex::new(Progress::new(Instant::now()))),
            stall_after: OnceLock::new(),
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

    /// Reconciles of `kind` so far.
    pub fn reconcile_count(&self, kind: &str) -> u64 {
        self.reconciles
            .get_or_create(&KindLabel { kind: kind.into() })
            .get()
    }

    /// Reconciles of `kind` that were skipped so far.
    pub fn skipped_count(&self, kind: &str) -> u64 {
        self.skipped
            .get_or_create(&KindLabel { kind: kind.into() })
            .get()
    }

    /// Counts a reconcile of `kind` as running until the guard is dropped
    /// (its end is progress, for [`Metrics::health`]).
    pub fn reconcile_in_flight(&self, kind: &str) -> InFlight {
        let gauge = self
            .in_flight
            .get_or_create(&KindLabel { kind: kind.into() })
            .clone();
        gauge.inc();
        crate::sync::lock(&self.progress).started(Instant::now());
        InFlight {
            gauge,
            progress: self.progress.clone(),
        }
    }

    /// Makes `/healthz` fail once reconciles run and none has finished for
    /// longer than `bound` (set once, by the operator).
    pub fn stall_after(&self, bound: Duration) {
        let _ = self.stall_after.set(bound);
    }

    /// Counts an object of `kind` left out of what the operator reads.
    pub fn unreadable(&self, kind: &str, reason: &crate::guard::SkipReason) {
        let reason = match reason {
            crate::guard::SkipReason::TooDeep(_) => "too_deep",
            crate::guard::SkipReason::WrongShape(_) => "wrong_shape",
        };
        self.unreadable
            .get_or_create(&UnreadableLabel {
                kind: kind.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records a finished kubectl run.
    pub fn kubectl_run(&self, verb: &str, exit_code: Option<i32>, duration: Duration) {
        let label = RunLabel {
            verb: verb.into(),
            exit_code: exit_code.map_or_else(|| "killed".to_string(), |c| c.to_string()),
        };
        self.kubectl_runs.get_or_create(&label).inc();
        self.kubectl_seconds
            .get_or_create(&label)
            .observe(duration.as_secs_f64());
    }

    /// Records where the automatic rollout of `definition` is: at `step`
    /// (from 1; 0 when none is under way) of `steps`.
    pub fn rollout_at(&self, definition: &str, step: u32, steps: u32) {
        let label = DefinitionLabel {
            definition: definition.into(),
        };
        self.rollout_steps
            .get_or_create(&label)
            .set(i64::from(steps));
        self.rollout_step.get_or_create(&label).set(i64::from(step));
    }

    /// Counts an automatic rollback of `definition`.
    pub fn rolled_back(&self, definition: &str) {
        let label = DefinitionLabel {
            definition: definition.into(),
        };
        self.rollbacks.get_or_create(&label).inc();
    }

    /// Forgets the rollout gauges of `definition` (no steps any more, or
    /// gone); its rollbacks stay counted.
    pub fn rollout_gone(&self, definition: &str) {
        let label = DefinitionLabel {
            definition: definition.into(),
        };
        self.rollout_steps.remove(&label);
        self.rollout_step.remove(&label);
    }

    /// Reads the kubectl waiting/running gauges from `stats` at every scrape.
    pub fn attach_kubectl(&self, stats: Arc<KubectlStats>) {
        let _ = self.kubectl_stats.set(stats);
    }

    /// Marks the operator ready (started, not shutting down) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// What this replica sees of its ring (`--auto-shard`): live members,
    /// the slots it holds, the resources in them.
    pub fn shard_view(&self, members: usize, slots: usize, resources: u64) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.sharing.members.set(gauge(members as u64));
        self.sharing.slots.set(gauge(slots as u64));
        self.sharing.resources.set(gauge(resources));
    }

    /// Resources this replica's watches read outside its share so far.
    pub fn shard_foreign(&self, read: u64) {
        self.sharing
            .foreign
            .set(i64::try_from(read).unwrap_or(i64::MAX));
    }

    /// `slots` slots handed over (`given` back or `taken`).
    pub fn handed_over(&self, direction: &str, slots: usize) {
        self.sharing
            .handovers
            .get_or_create(&DirectionLabel {
                direction: direction.into(),
            })
            .inc_by(slots as u64);
    }

    /// A slot taken had been without a working owner for `unowned`.
    pub fn unowned_for(&self, unowned: Duration) {
        self.sharing.unowned.observe(unowned.as_secs_f64());
    }

    /// Marks this replica as running the controllers (leading) or standing by.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
        self.leader.set(i64::from(leading));
    }

    /// Records that the controller of `kind` stopped while it should run
    /// (its watch stream ended): `/healthz` fails from then on, so the
    /// kubelet restarts the process.
    pub fn controller_stopped(&self, kind: &str) {
        let mut stopped = crate::sync::lock(&self.stopped);
        stopped.push(kind.to_string());
    }

    /// The `/healthz` answer: healthy while every controller that should
    /// run does, and reconciles make progress ([`Progress::stalled`]).
    pub fn health(&self) -> (bool, String) {
        let stopped = crate::sync::lock(&self.stopped);
        if !stopped.is_empty() {
            return (
                false,
                format!("controllers stopped unexpectedly: {}", stopped.join(", ")),
            );
        }
        let progress = *crate::sync::lock(&self.progress);
        let stalled = (self.stall_after.get()).and_then(|b| progress.stalled(Instant::now(), *b));
        match stalled {
            Some(why) => (false, why),
            None => (true, "ok".into()),
        }
    }

    /// The `/readyz` answer: ready replicas say whether they lead or stand by.
    /// A standby replica is ready too: it serves metrics and is needed for a
    /// rolling update to make progress while the old leader holds the Lease.
    pub fn readiness(&self) -> (bool, &'static str) {
        match (
            self.ready.load(Ordering::Relaxed),
            self.leading.load(Ordering::Relaxed),
        ) {
            (true, true) => (true, "ready: leading"),
            (true, false) => (true, "ready: standing by for the leader lease"),
            (false, _) => (false, "not ready: starting or shutting down"),
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        if let Some(stats) = self.kubectl_stats.get() {
            self.kubectl_waiting
                .set(i64::try_from(stats.waiting()).unwrap_or(i64::MAX));
            self.kubectl_running
                .set(i64::try_from(stats.running()).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Decrements the in-flight gauge of a reconcile, and records its end as
/// progress, when dropped.
#[derive(Debug)]
pub struct InFlight {
    gauge: Gauge,
    progress: Arc<Mutex<Progress>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
        crate::sync::lock(&self.progress).finished(Instant::now());
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
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

async fn health_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.health() {
        (true, text) => (StatusCode::OK, text),
        (false, text) => (StatusCode::SERVICE_UNAVAILABLE, text),
    }
}

async fn ready_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.readiness() {
        (true, text) => (StatusCode::OK, text),
        (false, text) => (StatusCode::SERVICE_UNAVAILABLE, text),
    }
}

impl crate::engine::host::ReconcileMetrics for Metrics {
    fn started(&self, kind: &str) -> Box<dyn Send> {
        self.reconcile(kind);
        Box::new(self.reconcile_in_flight(kind))
    }

    fn failed(&self, kind: &str) {
        self.reconcile_error(kind);
    }

    fn skipped(&self, kind: &str) {
        Metrics::skipped(self, kind);
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
        assert!(
            text.contains(
                "kustomize_operator_kubectl_duration_seconds_count{verb=\"apply\",exit_code=\"0\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn in_flight_reconciles_are_counted_while_the_guard_lives() {
        let m = Metrics::new();
        let guard = m.reconcile_in_flight("sample");
        let _second = m.reconcile_in_flight("sample");
        assert!(
            m.encode()
                .contains("kustomize_operator_reconciles_in_flight{kind=\"sample\"} 2")
        );
        drop(guard);
        assert!(
            m.encode()
                .contains("kustomize_operator_reconciles_in_flight{kind=\"sample\"} 1")
        );
    }

    #[test]
    fn kubectl_queue_gauges_follow_the_runner() {
        let m = Metrics::new();
        m.attach_kubectl(Arc::new(KubectlStats::default()));
        let text = m.encode();
        assert!(
            text.contains("kustomize_operator_kubectl_waiting 0"),
            "{text}"
        );
        assert!(
            text.contains("kustomize_operator_kubectl_running 0"),
            "{text}"
        );
    }

    #[test]
    fn readiness_names_the_role() {
        let m = Metrics::new();
        assert!(!m.readiness().0);
        m.set_ready(true);
        assert_eq!(
            m.readiness(),
            (true, "ready: standing by for the leader lease")
        );
        m.set_leading(true);
        assert_eq!(m.readiness(), (true, "ready: leading"));
        assert!(m.encode().contains("kustomize_operator_leader 1"));
    }

    #[test]
    fn health_fails_when_reconciles_run_and_none_finishes_within_the_bound() {
        let bound = Duration::from_secs(250);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Progress::new(t0);
        // Idle for an hour: not stalled.
        assert_eq!(p.stalled(at(3600), bound), None);
        // One starts, nothing finishes: stalled past the bound only.
        p.started(at(3600));
        assert_eq!(p.stalled(at(3600 + 250), bound), None);
        let why = p.stalled(at(3600 + 251), bound).unwrap();
        assert!(
            why.contains("none finished for 251s while 1 is running"),
            "{why}"
        );
        // A long burst: 500 running for an hour, one finishing every 30 s.
        let mut burst = Progress::new(t0);
        for _ in 0..500 {
            burst.started(t0);
        }
        for i in 1..=120 {
            burst.finished(at(30 * i));
            burst.started(at(30 * i));
            assert_eq!(burst.stalled(at(30 * i + 29), bound), None, "at {i}");
        }
        // Once they stop finishing, it is stalled.
        assert!(burst.stalled(at(3600 + 251), bound).is_some());
    }

    #[test]
    fn health_follows_the_reconciles_the_guards_count() {
        let m = Metrics::new();
        m.stall_after(Duration::ZERO);
        assert_eq!(m.health(), (true, "ok".to_string()), "idle");
        let running = m.reconcile_in_flight("sample");
        std::thread::sleep(Duration::from_millis(5));
        assert!(!m.health().0, "running, none finished within a zero bound");
        drop(running);
        assert_eq!(m.health(), (true, "ok".to_string()));
    }

    #[test]
    fn health_fails_once_a_controller_stopped() {
        let m = Metrics::new();
        assert_eq!(m.health(), (true, "ok".to_string()));
        m.controller_stopped("sample");
        let (healthy, text) = m.health();
        assert!(!healthy);
        assert!(text.contains("sample"), "{text}");
    }

    #[test]
    fn a_rollout_shows_its_step_and_counts_its_rollbacks() {
        let m = Metrics::new();
        m.rollout_at("greeting", 2, 4);
        m.rolled_back("greeting");
        let text = m.encode();
        for line in [
            "kustomize_operator_rollout_steps{definition=\"greeting\"} 4",
            "kustomize_operator_rollout_step{definition=\"greeting\"} 2",
            "kustomize_operator_rollout_rollbacks_total{definition=\"greeting\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        m.rollout_gone("greeting");
        let text = m.encode();
        assert!(!text.contains("rollout_step{"), "{text}");
        assert!(text.contains("rollout_rollbacks_total{definition=\"greeting\"} 1"));
    }
}
