//! The controller of one kind: the watch, the finalizer, per-object backoff,
//! and one reconcile (the apply path in `reconcile`, the deletion path in
//! `cleanup`).

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as FinalizerEvent;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use super::context::{Context, ReconcileError};
use super::finalizing::{add_finalizer, guarded, needs_finalizer};
use super::primer::Primer;
use super::triggers::Triggers;
use super::{apply_path, cleanup, traced};
use crate::engine::contract::{DynType, Handler};
use crate::engine::reconcile::runtime::{Engine, backoff};

/// Runs the controller for one kind until `shutdown` resolves.
pub async fn run<H: Handler>(
    engine: Arc<Engine>,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = engine.settings.namespace.clone();
    let api = handler.api(engine.reader.clone(), namespace.as_deref());
    let shard = crate::engine::model::shard::selector(engine.settings.shard.as_deref());
    let selector =
        crate::engine::model::shard::combine(handler.watch_selector(namespace.as_deref()), &shard);
    let watch = watcher::Config::default().any_semantic().labels(&selector);
    let dyn_type = handler.info().dyn_type.clone();
    // The controller's own reflector, fed objects without what no handler
    // reads: with many resources, managedFields and kubectl's
    // last-applied annotation are most of the cache.
    let writer = reflector::store::Writer::new(dyn_type.clone());
    let reader = writer.as_reader();
    let mut primer = Primer::new(engine.clone(), handler.clone());
    let triggers = Arc::new(Triggers::sharing(engine.settings.share.clone()));
    let admitted = triggers.clone();
    let cached = engine.clone();
    let share = engine.settings.share.clone();
    let objects = super::shared_watch::watch(api, watch, share)
        .modify(slim::<H::Resource>)
        .inspect(move |event| {
            if let Ok(event) = event {
                primer.see(event);
            }
        })
        .reflect(writer)
        .filter(move |event| {
            if let Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = event {
                // The cache holds this version now: a status written at it
                // need not be remembered (no reconcile may come to see it).
                cached.memo.cached(obj.meta());
            }
            let admit = event.as_ref().map_or(true, |e| admitted.admit(e));
            std::future::ready(admit)
        })
        .applied_objects();
    let owned_changed = owners_of_changed_objects::<H>(&engine, dyn_type.clone());
    let config =
        kube::runtime::controller::Config::default().concurrency(engine.settings.max_reconciles);
    let store = reader.clone();
    let controller = Controller::for_stream_with(objects, reader, dyn_type)
        .with_config(config)
        .reconcile_on(owned_changed);
    let controller = handler.configure(controller, &engine.client, namespace.as_deref());
    let name = handler.info().name.clone();
    let context = Arc::new(Context {
        engine,
        handler,
        triggers,
    });
    let shutdown = shutdown.shared();
    let running = controller
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_one::<H>, error_policy::<H>, context.clone())
        .for_each(|result| {
            let name = name.clone();
            async move {
                match result {
                    Ok((obj, _)) => tracing::debug!(kind = %name, object = %obj, "reconciled"),
                    Err(e) => tracing::debug!(kind = %name, error = %crate::error_text::any(&e), "reconcile error"),
                }
            }
        });
    tokio::select! {
        () = running => {}
        () = stopped_before_first_list(shutdown, store.clone()) => {
            tracing::debug!(kind = %name, "stopped before its first list: nothing ran");
        }
    }
    write_parked(&context, &store).await;
}

/// Resolves when `shutdown` comes before the controller's cache was ever
/// filled. kube-runtime holds its reconciles until then, and a graceful
/// shutdown stops the watch that would fill it: the controller would wait
/// forever. No reconcile has started then, so there is nothing to finish.
pub(crate) async fn stopped_before_first_list<K>(
    shutdown: impl Future<Output = ()>,
    store: reflector::Store<K>,
) where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    shutdown.await;
    if store.wait_until_ready().now_or_never().is_none() {
        return;
    }
    std::future::pending::<()>().await;
}

/// Writes the statuses still parked for this kind as they stand, once its
/// reconciles are over: a graceful stop loses no outcome.
async fn write_parked<H: Handler>(ctx: &Context<H>, store: &reflector::Store<H::Resource>) {
    let dyn_type = &ctx.handler.info().dyn_type;
    for (uid, parked) in ctx.engine.parked.take_of(&ctx.handler.info().name) {
        let mut key = ObjectRef::new_with(&parked.name, dyn_type.clone());
        if let Some(namespace) = &parked.namespace {
            key = key.within(namespace);
        }
        let Some(obj) = store
            .get(&key)
            .filter(|o| o.uid().as_deref() == Some(uid.as_str()))
        else {
            continue;
        };
        // Given up meanwhile (automatic sharding): its new owner writes.
        let Some(_entered) = ctx.engine.enter(Some(&uid)) else {
            continue;
        };
        let status = parked.status.value();
        if let Err(e) = super::status_writer::write(&ctx.engine, &*ctx.handler, &obj, status).await
        {
            tracing::warn!(object = %ctx.key(&obj), error = %crate::error_text::kube(&e), "could not write a parked status");
        }
    }
}

/// The resources of this kind whose owned objects changed (as the
/// watches of [`crate::engine::live::watch`] see them).
fn owners_of_changed_objects<H: Handler>(
    engine: &Engine,
    dyn_type: DynType<H::Resource>,
) -> impl futures::Stream<Item = ObjectRef<H::Resource>> + Send + 'static {
    let kind = H::Resource::kind(&dyn_type);
    let group = H::Resource::group(&dyn_type);
    let prefix = if group.is_empty() {
        format!("{kind}/")
    } else {
        format!("{kind}.{group}/")
    };
    engine.objects.changes().filter_map(move |owner| {
        let reference = owner_ref::<H::Resource>(&owner, &prefix, &dyn_type);
        async move { reference }
    })
}

/// The resource an owner annotation (`Kind.group/namespace/name`, or
/// `Kind.group/name` when cluster-scoped) names, if it is of this kind.
fn owner_ref<K: Resource>(
    annotation: &str,
    prefix: &str,
    dyn_type: &K::DynamicType,
) -> Option<ObjectRef<K>>
where
    K::DynamicType: Clone,
{
    let rest = annotation.strip_prefix(prefix)?;
    Some(match rest.split_once('/') {
        Some((namespace, name)) => ObjectRef::new_with(name, dyn_type.clone()).within(namespace),
        None => ObjectRef::new_with(rest, dyn_type.clone()),
    })
}

/// The annotation `kubectl apply` (client-side) keeps the whole last
/// applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object what the cache need not hold: its
/// managedFields and kubectl's last-applied annotation.
pub(crate) fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

pub(super) type FinalizerError = kube::runtime::finalizer::Error<ReconcileError>;

/// One reconcile of `obj`, in its span ([`traced::reconcile_span`]).
pub(super) async fn reconcile_one<H: Handler>(
    obj: Arc<H::Resource>,
    ctx: Arc<Context<H>>,
) -> Result<Action, FinalizerError> {
    let kind = H::Resource::kind(&ctx.handler.info().dyn_type);
    let span = traced::reconcile_span(&kind, obj.meta());
    reconcile_in_span(obj, ctx).instrument(span).await
}

async fn reconcile_in_span<H: Handler>(
    obj: Arc<H::Resource>,
    ctx: Arc<Context<H>>,
) -> Result<Action, FinalizerError> {
    let engine = &ctx.engine;
    // Sharing the work: only a resource in this replica's share, counted
    // as running in its slot until done (a slot given up waits for it).
    let Some(_entered) = engine.enter(obj.meta().uid.as_deref()) else {
        return Ok(Action::await_change());
    };
    let kind = ctx.handler.info().name.as_str();
    let _in_flight = engine.metrics.started(kind);
    let api = ctx
        .handler
        .api(engine.client.clone(), obj.namespace().as_deref());
    let finalizer_name = ctx.handler.info().finalizer.clone();
    // A new resource: add the finalizer and go on with the object the API
    // server returned, instead of waiting for the watch to bring it back.
    let obj = if needs_finalizer(&*obj, &finalizer_name) {
        // Its echo from the watch need not start this reconcile again: the
        // object as it will be is recorded before the patch (the echo may
        // come first), the object as it is after.
        let mut expected = obj.meta().clone();
        expected
            .finalizers
            .get_or_insert_default()
            .push(finalizer_name.clone());
        ctx.triggers.changed(&expected);
        let mut updated = add_finalizer(&api, &*obj, &finalizer_name)
            .await
            .map_err(FinalizerError::AddFinalizer)?;
        // Recorded as the watch will bring it: cut down as the cache is.
        slim(&mut updated);
        ctx.triggers.changed(updated.meta());
        Arc::new(updated)
    } else {
        obj
    };
    // Being deleted, its finalizer already removed by an earlier reconcile
    // whose result the cache has not caught up with: nothing to clean up.
    let deleting = obj.meta().deletion_timestamp.is_some();
    if deleting && ctx.triggers.is_finalized(obj.meta()) {
        return Ok(Action::await_change());
    }
    let finalizing = deleting && obj.finalizers().contains(&finalizer_name);
    let result = guarded(&api, &finalizer_name, obj.clone(), |event| async {
        match event {
            FinalizerEvent::Apply(obj) => apply_path::apply(&ctx, &obj).await,
            FinalizerEvent::Cleanup(obj) => cleanup::cleanup(&ctx, &obj).await,
        }
    })
    .await;
    if result.is_ok() {
        engine.failure_count(&ctx.key(&obj), false);
        if finalizing {
            ctx.triggers.finalized(obj.meta());
        }
    }
    result
}

pub(super) fn error_policy<H: Handler>(
    obj: Arc<H::Resource>,
    error: &FinalizerError,
    ctx: Arc<Context<H>>,
) -> Action {
    let kind = H::Resource::kind(&ctx.handler.info().dyn_type);
    let _inside = traced::reconcile_span(&kind, obj.meta()).entered();
    let engine = &ctx.engine;
    let kind = ctx.handler.info().name.as_str();
    engine.metrics.failed(kind);
    let permanent = match error {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => {
            matches!(
                e,
                ReconcileError::Failed {
                    permanent: true,
                    ..
                }
            )
        }
        _ => false,
    };
    let key = ctx.key(&obj);
    if permanent {
        tracing::info!(object = %key, error = %crate::error_text::any(error), "waiting for the resource to change");
        return Action::await_change();
    }
    let failures = engine.failure_count(&key, true);
    let delay = backoff(failures);
    tracing::warn!(object = %key, error = %crate::error_text::any(error), failures, retry_in_ms = delay.as_millis() as u64, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{ApiResource, DynamicObject};
    use serde_json::json;

    fn samples() -> ApiResource {
        ApiResource {
            group: "nuvolaris.org".into(),
            version: "v1".into(),
            api_version: "nuvolaris.org/v1".into(),
            kind: "Sample".into(),
            plural: "samples".into(),
        }
    }

    #[test]
    fn owner_annotations_name_resources_of_this_kind_only() {
        let prefix = "Sample.nuvolaris.org/";
        let r =
            owner_ref::<DynamicObject>("Sample.nuvolaris.org/ns/web", prefix, &samples()).unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref()),
            ("web", Some("ns"))
        );
        let r = owner_ref::<DynamicObject>("Sample.nuvolaris.org/web", prefix, &samples()).unwrap();
        assert_eq!((r.name.as_str(), r.namespace), ("web", None));
        assert!(
            owner_ref::<DynamicObject>("Samples.nuvolaris.org/ns/web", prefix, &samples())
                .is_none()
        );
        assert!(
            owner_ref::<DynamicObject>("CopyratorRule.flant.com/ns/web", prefix, &samples())
                .is_none()
        );
    }

    #[test]
    fn the_cache_holds_objects_without_managed_fields_or_last_applied() {
        let mut sample: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "nuvolaris.org/v1",
            "kind": "Sample",
            "metadata": {
                "name": "web",
                "annotations": {LAST_APPLIED: "{\"big\": true}", "keep": "me"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "finalizers": ["nuvolaris.org/kustomize-operator"],
            },
            "spec": {"count": 2},
        }))
        .unwrap();
        assert!(!needs_finalizer(
            &sample,
            "nuvolaris.org/kustomize-operator"
        ));
        slim(&mut sample);
        assert_eq!(sample.metadata.managed_fields, None);
        assert_eq!(
            sample.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
        sample.metadata.finalizers = None;
        assert!(needs_finalizer(&sample, "nuvolaris.org/kustomize-operator"));
    }
}
