//! A kind a [`Handler`] plans for, as the runtime serves it: the watch of
//! its resources (cut down, its owned kinds' watches primed from the first
//! list, only changes of a resource's input starting a reconcile), the
//! finalizer, per-object backoff, and one reconcile (the apply path in
//! `apply_path`, the deletion path in `cleanup`).

use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use kube::api::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::Event as FinalizerEvent;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use super::context::{Context, ReconcileError};
use super::finalizing::{add_finalizer, needs_finalizer};
use super::primer::Primer;
use super::serve::{Counted, OnCount, Reconciler, Runtime, slim};
use super::triggers::Triggers;
use super::{apply_path, cleanup, traced};
use crate::engine::contract::{Handler, Watching};
use crate::engine::reconcile::runtime::{Engine, backoff};

/// A handler's kind, served.
pub(crate) struct Handled<H: Handler> {
    ctx: Arc<Context<H>>,
    primer: Mutex<Primer<H>>,
    /// What owner annotations naming this kind's resources start with
    /// (`Kind.group/`, `Kind/` in the core group).
    owner_prefix: String,
}

impl<H: Handler> Handled<H> {
    /// The kind of `handler`, served on `engine`.
    pub fn new(engine: Arc<Engine>, handler: H) -> Self {
        let handler = Arc::new(handler);
        let dyn_type = &handler.info().dyn_type;
        let (kind, group) = (H::Resource::kind(dyn_type), H::Resource::group(dyn_type));
        let owner_prefix = if group.is_empty() {
            format!("{kind}/")
        } else {
            format!("{kind}.{group}/")
        };
        Self {
            primer: Mutex::new(Primer::new(engine.clone(), handler.clone())),
            ctx: Arc::new(Context {
                triggers: Arc::new(Triggers::sharing(engine.settings.share.clone())),
                engine,
                handler,
            }),
            owner_prefix,
        }
    }

    fn resource(&self) -> ApiResource {
        ApiResource::erase::<H::Resource>(&self.ctx.handler.info().dyn_type)
    }
}

impl Runtime {
    /// Serves the kind of `handler` (by its name), replacing the kind
    /// served under that name if any. With `on_count`, its resources in
    /// every namespace and shard are counted ([`Runtime::count`]) and
    /// `on_count` is called when the count changes.
    pub async fn serve_kind<H: Handler>(&self, handler: H, on_count: Option<OnCount>) {
        let engine = self.engine().clone();
        let kind = handler.info().name.clone();
        let handled = Handled::new(engine.clone(), handler);
        // Its CRD may be new or changed: what kubectl and the engine
        // cached of its group may say another scope or other versions.
        let resource = handled.resource();
        engine.forget_discovery(&resource.group);
        let settings = &engine.settings;
        let whole = settings.namespace.is_none()
            && settings.shard.is_none()
            && settings.share.is_none()
            && handled.ctx.handler.watch_selector(None).is_none();
        let counted = on_count.map(|on_count| Counted {
            resource,
            on_count,
            by_resource_watch: whole,
        });
        self.serve(&kind, handled, counted).await;
    }
}

impl<H: Handler> Reconciler for Handled<H> {
    type Resource = H::Resource;

    fn watched(&self) -> (kube::Api<H::Resource>, watcher::Config) {
        let (engine, handler) = (&self.ctx.engine, &self.ctx.handler);
        let namespace = engine.settings.namespace.as_deref();
        let api = handler.api(engine.reader.clone(), namespace);
        let shard = crate::partition::shard::selector(engine.settings.shard.as_deref());
        let selector = crate::partition::shard::combine(handler.watch_selector(namespace), &shard);
        (
            api,
            watcher::Config::default().any_semantic().labels(&selector),
        )
    }

    fn see(&self, event: &mut watcher::Event<H::Resource>) -> bool {
        if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = event {
            // The store holds this version now: a status written at it
            // need not be remembered (no reconcile may come to see it).
            self.ctx.engine.memo.cached(obj.meta());
        }
        crate::sync::lock(&self.primer).see(event);
        self.ctx.triggers.admit(event)
    }

    fn gone(&self, resource: &H::Resource) {
        self.ctx.handler.forget(resource);
    }

    async fn reconcile(&self, resource: Arc<H::Resource>) -> Action {
        match reconcile_one(resource.clone(), self.ctx.clone()).await {
            Ok(action) => action,
            Err(e) => error_policy(resource, &e, self.ctx.clone()),
        }
    }

    fn nudges(
        &self,
        watching: Watching<H::Resource>,
    ) -> Vec<BoxStream<'static, ObjectRef<H::Resource>>> {
        self.ctx.handler.nudges(watching)
    }

    fn owner(&self, annotation: &str) -> Option<ObjectRef<H::Resource>> {
        owner_ref::<H::Resource>(
            annotation,
            &self.owner_prefix,
            &self.ctx.handler.info().dyn_type,
        )
    }

    async fn finish(&self, resources: Vec<Arc<H::Resource>>) {
        write_parked(&self.ctx, &resources).await;
    }

    fn stopped(&self) {
        self.ctx.engine.kind_stopped(&self.resource());
    }
}

/// Writes the statuses still parked for this kind as they stand, once its
/// reconciles are over: a stop loses no outcome.
async fn write_parked<H: Handler>(ctx: &Context<H>, resources: &[Arc<H::Resource>]) {
    for (uid, parked) in ctx.engine.parked.take_of(&ctx.handler.info().name) {
        let Some(obj) = resources
            .iter()
            .find(|o| o.uid().as_deref() == Some(uid.as_str()))
        else {
            continue;
        };
        // Given up meanwhile (automatic sharding): its new owner writes.
        let Some(_entered) = ctx.engine.enter(Some(&uid)) else {
            continue;
        };
        let status = parked.status.value();
        if let Err(e) = super::status_writer::write(&ctx.engine, &*ctx.handler, obj, status).await {
            tracing::warn!(object = %ctx.key(obj), error = %crate::error_text::kube(&e), "could not write a parked status");
        }
    }
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
    let result = engine
        .guarded(&api, &finalizer_name, obj.clone(), |event| async {
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
        tracing::info!(object = %key, error = %crate::error_text::finalizer(error), "waiting for the resource to change");
        return Action::await_change();
    }
    let failures = engine.failure_count(&key, true);
    let delay = backoff(failures);
    tracing::warn!(object = %key, error = %crate::error_text::finalizer(error), failures, retry_in_ms = delay.as_millis() as u64, "reconcile failed");
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
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}", "keep": "me"},
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
