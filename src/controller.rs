//! The generic reconcile loop shared by every kind: finalizer, no-op skip,
//! overlay in a temp dir, kubectl, status patch, events, per-object backoff.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::batch::{BatchOutcome, BatchSettings, Batcher};
use crate::handler::{Handler, HandlerError, Kind, Plan, RenderedPlan, Step, event_type};
use crate::kubectl::{CommandRecord, Kubectl, KubectlError};
use crate::metrics::Metrics;
use crate::overlay::OverlayError;
use crate::status::{self, CommonStatus, READY, RECONCILING};
use crate::templates::KustomizeDir;

/// Shortest and longest retry delay after a failure.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How the engine behaves, shared by every controller.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Re-apply unchanged resources this often, to correct drift.
    pub resync_interval: Duration,
    /// Keep the last overlay of each resource under this directory.
    pub keep_overlays: Option<PathBuf>,
    /// Where per-reconcile temp dirs are created.
    pub work_dir: PathBuf,
    /// Watch only this namespace (namespaced kinds).
    pub namespace: Option<String>,
    /// Name reported on events.
    pub reporter: String,
    /// Parallel reconciles per kind (0 = unlimited).
    pub concurrency: u16,
    /// Coalesce applies (None: one kubectl run per resource).
    pub batch: Option<BatchSettings>,
}

/// Everything a reconcile needs, shared by every controller.
pub struct Engine {
    /// The API client.
    pub client: Client,
    /// The kubectl runner.
    pub kubectl: Kubectl,
    /// Parsed templates and bases.
    pub templates: Arc<KustomizeDir>,
    /// Settings.
    pub settings: Settings,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    applied: Mutex<HashMap<String, Applied>>,
    batcher: Option<Batcher>,
}

/// What the engine last applied successfully for an object (by UID). The
/// status says the same, but the watch cache may lag behind the engine's own
/// status patch; this keeps a reconcile triggered by that patch quiet.
#[derive(Debug, Clone, PartialEq)]
struct Applied {
    generation: Option<i64>,
    digest: String,
    at: std::time::Instant,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings)
            .finish()
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The handler could not plan.
    #[error(transparent)]
    Handler(#[from] HandlerError),
    /// The overlay could not be rendered or written.
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    /// kubectl could not be started.
    #[error(transparent)]
    KubectlStart(#[from] KubectlError),
    /// kubectl ran and failed.
    #[error("kubectl {verb} failed: {summary}")]
    Kubectl {
        /// apply, delete, ...
        verb: String,
        /// Its first error line.
        summary: String,
    },
    /// An API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A temp dir could not be created.
    #[error("cannot create a work directory: {0}")]
    WorkDir(std::io::Error),
}

impl ReconcileError {
    /// True when retrying cannot help until the resource changes.
    fn is_permanent(&self) -> bool {
        matches!(self, Self::Handler(HandlerError::Invalid(_)))
    }
}

impl Engine {
    /// Builds the engine.
    pub fn new(
        client: Client,
        kubectl: Kubectl,
        templates: Arc<KustomizeDir>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: settings.reporter.clone(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let batcher = settings
            .batch
            .filter(|b| b.max > 1)
            .map(|b| Batcher::start(kubectl.clone(), settings.work_dir.clone(), b));
        Self {
            batcher,
            client,
            kubectl,
            templates,
            settings,
            metrics,
            recorder,
            failures: Mutex::default(),
            applied: Mutex::default(),
        }
    }

    fn remember_applied(&self, uid: Option<String>, applied: Option<Applied>) {
        let Some(uid) = uid else { return };
        let mut map = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        match applied {
            Some(a) => map.insert(uid, a),
            None => map.remove(&uid),
        };
    }

    fn recently_applied(&self, uid: Option<String>, generation: Option<i64>, digest: &str) -> bool {
        let Some(uid) = uid else { return false };
        let map = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&uid).is_some_and(|a| {
            a.generation == generation
                && a.digest == digest
                && a.at.elapsed() < self.settings.resync_interval
        })
    }

    fn failure_count(&self, key: &str, bump: bool) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if bump {
            let n = failures.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        } else {
            failures.remove(key);
            0
        }
    }
}

/// The retry delay after `failures` consecutive failures: exponential from
/// one second, capped at five minutes, with up to 10% jitter.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_MIN.saturating_mul(1 << exp).min(BACKOFF_MAX);
    let jitter = base.mul_f64(rand::random::<f64>() * 0.1);
    base + jitter
}

struct Context<H: Handler> {
    engine: Arc<Engine>,
    handler: Arc<H>,
}

fn object_key<K: Kind>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::NAME,
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// Runs the controller for one kind until `shutdown` resolves.
pub async fn run<H: Handler>(
    engine: Arc<Engine>,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = engine.settings.namespace.clone();
    let api = H::Resource::api(engine.client.clone(), namespace.as_deref());
    let config =
        kube::runtime::controller::Config::default().concurrency(engine.settings.concurrency);
    let mut watch = watcher::Config::default().any_semantic();
    if let Some(selector) = H::Resource::watch_selector(namespace.as_deref()) {
        watch = watch.labels(&selector);
    }
    // The controller's own reflector, fed objects without what no handler
    // reads: with many resources, managedFields and kubectl's
    // last-applied annotation are most of the cache.
    let (reader, writer) = reflector::store();
    let objects = watcher(api, watch)
        .modify(slim::<H::Resource>)
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream(objects, reader).with_config(config);
    let controller = handler.configure(controller, &engine.client, namespace.as_deref());
    let context = Arc::new(Context { engine, handler });
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<H>, error_policy::<H>, context)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => {
                    tracing::debug!(kind = H::Resource::NAME, object = %obj, "reconciled")
                }
                Err(e) => tracing::debug!(kind = H::Resource::NAME, error = %e, "reconcile error"),
            }
        })
        .await;
}

/// The annotation `kubectl apply` (client-side) keeps the whole last
/// applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object what the cache need not hold: its
/// managedFields and kubectl's last-applied annotation. Handlers read
/// spec, status, names, labels and their own annotations only.
fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

type FinalizerError = kube::runtime::finalizer::Error<ReconcileError>;

async fn reconcile<H: Handler>(
    obj: Arc<H::Resource>,
    ctx: Arc<Context<H>>,
) -> Result<Action, FinalizerError> {
    let engine = &ctx.engine;
    let api = H::Resource::api(engine.client.clone(), obj.namespace().as_deref());
    let key = object_key(&*obj);
    engine.metrics.reconcile(H::Resource::NAME);
    let _in_flight = engine.metrics.reconcile_in_flight(H::Resource::NAME);
    // A new resource: add the finalizer and go on with the object the API
    // server returned, instead of waiting for the watch to bring it back.
    let obj = if needs_finalizer(&*obj) {
        Arc::new(add_finalizer(&api, &*obj).await?)
    } else {
        obj
    };
    let result = finalizer(&api, H::Resource::FINALIZER, obj, |event| async {
        match event {
            FinalizerEvent::Apply(obj) => apply(&ctx, &obj).await,
            FinalizerEvent::Cleanup(obj) => cleanup(&ctx, &obj).await,
        }
    })
    .await;
    if result.is_ok() {
        engine.failure_count(&key, false);
    }
    result
}

/// True when `obj` is not being deleted and lacks our finalizer.
fn needs_finalizer<K: Kind>(obj: &K) -> bool {
    obj.meta().deletion_timestamp.is_none() && !obj.finalizers().iter().any(|f| f == K::FINALIZER)
}

/// Adds our finalizer with the JSON patch kube-runtime's `finalizer` uses:
/// a `test` of the current list first, so a concurrent change makes the
/// patch fail (and the reconcile retry) rather than duplicate or drop an
/// entry. Returns the updated object.
async fn add_finalizer<K: Kind>(api: &kube::Api<K>, obj: &K) -> Result<K, FinalizerError> {
    let operations = if obj.finalizers().is_empty() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [K::FINALIZER]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": obj.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": K::FINALIZER},
        ])
    };
    let patch: Patch<()> = Patch::Json(
        serde_json::from_value(operations).map_err(|_| FinalizerError::InvalidFinalizer)?,
    );
    let name = obj
        .meta()
        .name
        .as_deref()
        .ok_or(FinalizerError::UnnamedObject)?;
    api.patch(name, &PatchParams::default(), &patch)
        .await
        .map_err(FinalizerError::AddFinalizer)
}

fn error_policy<H: Handler>(
    obj: Arc<H::Resource>,
    error: &FinalizerError,
    ctx: Arc<Context<H>>,
) -> Action {
    let engine = &ctx.engine;
    engine.metrics.reconcile_error(H::Resource::NAME);
    let inner = match error {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => Some(e),
        _ => None,
    };
    if inner.is_some_and(ReconcileError::is_permanent) {
        tracing::info!(kind = H::Resource::NAME, object = %object_key(&*obj), error = %error, "waiting for the resource to change");
        return Action::await_change();
    }
    let failures = engine.failure_count(&object_key(&*obj), true);
    let delay = backoff(failures);
    tracing::warn!(kind = H::Resource::NAME, object = %object_key(&*obj), error = %error, failures, retry_in_ms = delay.as_millis() as u64, "reconcile failed");
    Action::requeue(delay)
}

/// When the resource should be re-applied even if unchanged.
fn resync_remaining(status: &CommonStatus, interval: Duration) -> Duration {
    let Some(last) = status
        .last_applied_at
        .as_deref()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    else {
        return Duration::ZERO;
    };
    let elapsed = jiff::Timestamp::now().duration_since(last).unsigned_abs();
    interval.saturating_sub(elapsed)
}

async fn apply<H: Handler>(ctx: &Context<H>, obj: &H::Resource) -> Result<Action, ReconcileError> {
    let engine = &ctx.engine;
    let generation = obj.meta().generation;
    let mut status = obj.common_status().cloned().unwrap_or_default();

    let planned = match ctx.handler.observe(obj, &engine.client).await {
        Ok(observed) => ctx.handler.plan(obj, &observed),
        Err(e) => Err(e),
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => {
            let warn = format!("{e}");
            status.set_condition(READY, false, e.reason(), &warn, generation);
            status.set_condition(RECONCILING, false, e.reason(), "", generation);
            status.set_message(&warn);
            status.observed_generation = generation;
            patch_status(engine, obj, &status, &serde_json::Map::new()).await?;
            publish(engine, obj, true, e.reason(), &warn).await;
            return Err(e.into());
        }
    };
    if plan.idle {
        engine.metrics.skipped(H::Resource::NAME);
        let next = plan
            .requeue_after
            .unwrap_or(engine.settings.resync_interval);
        return Ok(Action::requeue(next));
    }
    let rendered = match plan.render(&engine.templates) {
        Ok(r) => r,
        Err(e) => {
            let msg = e.to_string();
            status.set_condition(READY, false, "RenderFailed", &msg, generation);
            status.set_message(&msg);
            patch_status(engine, obj, &status, &serde_json::Map::new()).await?;
            publish(engine, obj, true, "RenderFailed", &msg).await;
            return Err(e.into());
        }
    };

    let digest = plan
        .digest
        .clone()
        .unwrap_or_else(|| rendered.digest.clone());
    let resync_in = resync_remaining(&status, engine.settings.resync_interval);
    let unchanged_in_status = status.observed_generation == generation
        && status.applied_digest.as_deref() == Some(digest.as_str())
        && status.is_ready()
        && !resync_in.is_zero();
    let unchanged = !plan.always_run
        && (unchanged_in_status || engine.recently_applied(obj.uid(), generation, &digest));
    if unchanged {
        let resync_in = if resync_in.is_zero() {
            engine.settings.resync_interval
        } else {
            resync_in
        };
        engine.metrics.skipped(H::Resource::NAME);
        let next = plan.requeue_after.map_or(resync_in, |r| r.min(resync_in));
        return Ok(Action::requeue(next));
    }

    // `Reconciling=True` is written while kubectl runs, not before: the
    // final status patch still comes after both.
    let marked = status
        .condition(RECONCILING)
        .is_none_or(|c| c.status != "True")
        .then(|| {
            let mut marked = status.clone();
            marked.set_condition(RECONCILING, true, "Applying", "running kubectl", generation);
            marked
        });
    let mark = async {
        match &marked {
            Some(marked) => patch_status(engine, obj, marked, &serde_json::Map::new()).await,
            None => Ok(()),
        }
    };
    let (mark_result, outcome) = tokio::join!(mark, run_steps(engine, obj, &plan, &rendered));
    if let Err(e) = mark_result {
        tracing::warn!(kind = H::Resource::NAME, object = %object_key(obj), error = %e, "could not mark the resource Reconciling");
    }
    if let Some(marked) = marked {
        status = marked;
    }
    status.observed_generation = generation;
    match outcome {
        Ok(record) => {
            let summary = record
                .as_ref()
                .map_or_else(|| "nothing to do".to_string(), CommandRecord::summary);
            status.set_condition(READY, true, "Applied", &summary, generation);
            status.set_condition(RECONCILING, false, "Applied", "", generation);
            status.set_message(&summary);
            if let Some(r) = &record {
                status.record_command(r);
            }
            status.applied_digest = Some(digest.clone());
            status.last_applied_at = Some(jiff::Timestamp::now().to_string());
            engine.remember_applied(
                obj.uid(),
                Some(Applied {
                    generation,
                    digest: digest.clone(),
                    at: std::time::Instant::now(),
                }),
            );
            patch_status(engine, obj, &status, &plan.status).await?;
            if !plan.always_run {
                publish(engine, obj, false, "Applied", &summary).await;
            }
            for ev in &plan.events {
                publish_related(engine, obj, ev.warning, &ev.reason, &ev.note, &ev.related).await;
            }
            let next = plan
                .requeue_after
                .unwrap_or(engine.settings.resync_interval);
            Ok(Action::requeue(next))
        }
        Err((verb, record, error)) => {
            let summary = record
                .as_ref()
                .map_or_else(|| error.to_string(), failure_message);
            engine.remember_applied(obj.uid(), None);
            let reason = if verb == "delete" {
                "DeleteFailed"
            } else {
                "ApplyFailed"
            };
            status.set_condition(READY, false, reason, &summary, generation);
            status.set_condition(RECONCILING, false, reason, "", generation);
            status.set_message(&summary);
            if let Some(r) = &record {
                status.record_command(r);
            }
            let kind_status = plan.status_on_failure.as_ref().unwrap_or(&plan.status);
            patch_status(engine, obj, &status, kind_status).await?;
            publish(engine, obj, true, reason, &summary).await;
            Err(error)
        }
    }
}

async fn cleanup<H: Handler>(
    ctx: &Context<H>,
    obj: &H::Resource,
) -> Result<Action, ReconcileError> {
    let engine = &ctx.engine;
    let plan = match ctx.handler.cleanup(obj) {
        Ok(plan) => plan,
        Err(HandlerError::Invalid(msg)) => {
            // Nothing valid was ever applied for this spec: nothing to delete.
            tracing::info!(object = %object_key(obj), %msg, "no cleanup possible for an invalid spec");
            return Ok(Action::await_change());
        }
        Err(e) => return Err(e.into()),
    };
    let rendered = plan.render(&engine.templates)?;
    match run_steps(engine, obj, &plan, &rendered).await {
        Ok(record) => {
            let summary = record
                .as_ref()
                .map_or_else(|| "deleted".to_string(), CommandRecord::summary);
            publish(engine, obj, false, "Deleted", &summary).await;
            engine.remember_applied(obj.uid(), None);
            Ok(Action::await_change())
        }
        Err((_, record, error)) => {
            let mut status = obj.common_status().cloned().unwrap_or_default();
            let summary = record
                .as_ref()
                .map_or_else(|| error.to_string(), failure_message);
            let generation = obj.meta().generation;
            status.set_condition(READY, false, "DeleteFailed", &summary, generation);
            status.set_message(&summary);
            if let Some(r) = &record {
                status.record_command(r);
            }
            patch_status(engine, obj, &status, &serde_json::Map::new()).await?;
            publish(engine, obj, true, "DeleteFailed", &summary).await;
            Err(error)
        }
    }
}

/// The message for a failed run: the summary line plus the stderr tail.
fn failure_message(record: &CommandRecord) -> String {
    let summary = record.summary();
    let tail = status::keep_tail(record.stderr.trim(), 512);
    if tail.contains(&summary) {
        tail
    } else if tail.is_empty() {
        summary
    } else {
        format!("{summary}\n{tail}")
    }
}

type StepFailure = (&'static str, Option<CommandRecord>, ReconcileError);

/// Runs a plan's steps in order; returns the last record, or the failing one.
async fn run_steps<K: Kind>(
    engine: &Engine,
    obj: &K,
    plan: &Plan,
    rendered: &RenderedPlan,
) -> Result<Option<CommandRecord>, StepFailure> {
    if let (Some(batcher), [Step::Apply { extra_args, .. }], [Some(overlay)]) = (
        &engine.batcher,
        plan.steps.as_slice(),
        rendered.overlays.as_slice(),
    ) && extra_args.is_empty()
        && !plan.batch_names.is_empty()
    {
        if let Some(keep) = &engine.settings.keep_overlays {
            keep_overlay(keep, obj, overlay);
        }
        if let BatchOutcome::Done(record) = batcher
            .apply(overlay.clone(), plan.batch_names.clone())
            .await
        {
            if record.succeeded() {
                return Ok(Some(record));
            }
            let summary = record.summary();
            return Err((
                "apply",
                Some(record),
                ReconcileError::Kubectl {
                    verb: "apply".into(),
                    summary,
                },
            ));
        }
    }
    let mut last = None;
    for (step, overlay) in plan.steps.iter().zip(&rendered.overlays) {
        let dir = match overlay {
            Some(r) => {
                let dir = tempfile::Builder::new()
                    .prefix("overlay-")
                    .tempdir_in(&engine.settings.work_dir)
                    .map_err(|e| ("apply", None, ReconcileError::WorkDir(e)))?;
                r.write_to(dir.path())
                    .map_err(|e| ("apply", None, ReconcileError::Overlay(e)))?;
                if let Some(keep) = &engine.settings.keep_overlays {
                    keep_overlay(keep, obj, r);
                }
                Some(dir)
            }
            None => None,
        };
        let dir_arg = dir
            .as_ref()
            .map(|d| d.path().display().to_string())
            .unwrap_or_default();
        let (verb, args): (&'static str, Vec<String>) = match step {
            Step::Apply { extra_args, .. } => {
                let mut a = vec!["apply".into(), "-k".into(), dir_arg];
                a.extend(extra_args.iter().cloned());
                ("apply", a)
            }
            Step::Delete { .. } => (
                "delete",
                vec![
                    "delete".into(),
                    "-k".into(),
                    dir_arg,
                    "--ignore-not-found=true".into(),
                ],
            ),
            Step::Run { args } => ("run", args.clone()),
        };
        let record = engine
            .kubectl
            .run(&args, None)
            .await
            .map_err(|e| (verb, None, ReconcileError::KubectlStart(e)))?;
        // The temp dir is removed here, on every path.
        drop(dir);
        if !record.succeeded() {
            let summary = record.summary();
            return Err((
                verb,
                Some(record),
                ReconcileError::Kubectl {
                    verb: verb.to_string(),
                    summary,
                },
            ));
        }
        last = Some(record);
    }
    Ok(last)
}

fn keep_overlay<K: Kind>(root: &Path, obj: &K, rendered: &crate::overlay::RenderedOverlay) {
    let ns = obj.namespace().unwrap_or_else(|| "_cluster".into());
    let dir = root.join(K::NAME).join(ns).join(obj.name_any());
    let _ = std::fs::remove_dir_all(&dir);
    if rendered.is_sensitive() {
        tracing::info!(object = %object_key(obj), "not keeping an overlay that holds Secret data");
        return;
    }
    let result = std::fs::create_dir_all(&dir)
        .map_err(|source| OverlayError::Write {
            path: dir.display().to_string(),
            source,
        })
        .and_then(|()| rendered.write_to(&dir));
    if let Err(e) = result {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot keep overlay");
    }
}

async fn patch_status<K: Kind>(
    engine: &Engine,
    obj: &K,
    common: &CommonStatus,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), kube::Error> {
    let mut body = serde_json::to_value(common).unwrap_or_else(|_| json!({}));
    if let Some(map) = body.as_object_mut() {
        for (k, v) in extra {
            map.insert(k.clone(), v.clone());
        }
    }
    let api = K::api(engine.client.clone(), obj.namespace().as_deref());
    api.patch_status(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": body })),
    )
    .await
    .map(|_| ())
}

async fn publish<K: Kind>(engine: &Engine, obj: &K, warning: bool, reason: &str, note: &str) {
    publish_related(engine, obj, warning, reason, note, &None).await;
}

async fn publish_related<K: Kind>(
    engine: &Engine,
    obj: &K,
    warning: bool,
    reason: &str,
    note: &str,
    related: &Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    let event = Event {
        type_: event_type(warning),
        reason: reason.to_string(),
        note: Some(status::truncate(note, 1000)),
        action: "Reconcile".into(),
        secondary: related.clone(),
    };
    if let Err(e) = engine.recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(object = %object_key(obj), error = %e, "cannot publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_holds_objects_without_managed_fields_or_last_applied() {
        let mut sample: crate::kinds::sample::Sample = serde_json::from_value(json!({
            "apiVersion": "nuvolaris.org/v1",
            "kind": "Sample",
            "metadata": {
                "name": "web",
                "annotations": {LAST_APPLIED: "{\"big\": true}", "keep": "me"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "finalizers": [crate::kinds::sample::Sample::FINALIZER],
            },
            "spec": {"count": 2},
        }))
        .unwrap();
        assert!(!needs_finalizer(&sample));
        slim(&mut sample);
        assert_eq!(sample.metadata.managed_fields, None);
        assert_eq!(
            sample.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
        assert_eq!(sample.spec.count, 2);
        sample.metadata.finalizers = None;
        assert!(needs_finalizer(&sample));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let d1 = backoff(1);
        assert!(d1 >= Duration::from_secs(1) && d1 < Duration::from_millis(1100));
        let d4 = backoff(4);
        assert!(d4 >= Duration::from_secs(8) && d4 < Duration::from_millis(8900));
        let d30 = backoff(30);
        assert!(d30 >= BACKOFF_MAX && d30 <= BACKOFF_MAX.mul_f64(1.1));
    }

    #[test]
    fn resync_is_due_without_a_previous_apply() {
        let s = CommonStatus::default();
        assert_eq!(
            resync_remaining(&s, Duration::from_secs(60)),
            Duration::ZERO
        );
        let s = CommonStatus {
            last_applied_at: Some(jiff::Timestamp::now().to_string()),
            ..Default::default()
        };
        assert!(resync_remaining(&s, Duration::from_secs(60)) > Duration::from_secs(58));
    }

    #[test]
    fn failure_message_has_summary_and_stderr() {
        let r = CommandRecord {
            exit_code: Some(1),
            stderr: "error: one\nerror: two\n".into(),
            ..Default::default()
        };
        assert_eq!(failure_message(&r), "error: one\nerror: two");
    }
}
