//! A [`Reconciler`] seen without its type, as the runtime holds every
//! kind in one table: what it is asked goes through the store's
//! [`Keyed`] resources.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use super::count::Tally;
use super::keyed::{self, Keyed};
use super::reconciler::Reconciler;
use super::{Held, Shared};
use crate::engine::contract::{Resources, Watching};

/// A [`Reconciler`] without its type: what the runtime's table holds.
pub(super) trait Served: Send + Sync + 'static {
    /// Watches the resources of the kind `kind` into the store and the
    /// queue of `shared` until `stop` is cancelled, counting them in
    /// `tally` if given; the keys it held.
    fn watch(
        self: Arc<Self>,
        shared: Arc<Shared>,
        kind: Arc<str>,
        stop: CancellationToken,
        tally: Option<Tally>,
    ) -> BoxFuture<'static, Held>;

    /// The kind's nudges, as keys of the store.
    fn nudges(
        &self,
        shared: &Arc<Shared>,
        kind: &Arc<str>,
    ) -> Vec<BoxStream<'static, ObjectRef<Keyed>>>;

    /// One reconcile of `held`.
    fn reconcile(self: Arc<Self>, held: &Keyed) -> BoxFuture<'static, Action>;

    /// The key of the resource an owner annotation names, if of this kind.
    fn owner(&self, kind: &str, annotation: &str) -> Option<ObjectRef<Keyed>>;

    /// [`Reconciler::finish`] with the resources the kind held.
    fn finish(self: Arc<Self>, held: Vec<Keyed>) -> BoxFuture<'static, ()>;

    /// [`Reconciler::stopped`].
    fn stopped(&self);
}

impl<R: Reconciler> Served for R {
    fn watch(
        self: Arc<Self>,
        shared: Arc<Shared>,
        kind: Arc<str>,
        stop: CancellationToken,
        tally: Option<Tally>,
    ) -> BoxFuture<'static, Held> {
        super::watch::resources(shared, kind, self, stop, tally).boxed()
    }

    fn nudges(
        &self,
        shared: &Arc<Shared>,
        kind: &Arc<str>,
    ) -> Vec<BoxStream<'static, ObjectRef<Keyed>>> {
        let (store, of) = (shared.store.clone(), kind.clone());
        let resources = Resources::new(move || {
            let held = store.state().into_iter();
            held.filter(|k| k.kind == of)
                .filter_map(|k| k.object::<R::Resource>())
                .collect()
        });
        let kind = kind.clone();
        let watching = Watching {
            client: shared.engine.client.clone(),
            namespace: shared.engine.settings.namespace.clone(),
            resources,
        };
        Reconciler::nudges(self, watching)
            .into_iter()
            .map(|nudges| {
                let kind = kind.clone();
                nudges
                    .map(move |r| keyed::key(&kind, r.namespace.as_deref(), &r.name))
                    .boxed()
            })
            .collect()
    }

    fn reconcile(self: Arc<Self>, held: &Keyed) -> BoxFuture<'static, Action> {
        let object = held.object::<R::Resource>();
        async move {
            match object {
                Some(object) => Reconciler::reconcile(&*self, object).await,
                None => Action::await_change(),
            }
        }
        .boxed()
    }

    fn owner(&self, kind: &str, annotation: &str) -> Option<ObjectRef<Keyed>> {
        let r = Reconciler::owner(self, annotation)?;
        Some(keyed::key(kind, r.namespace.as_deref(), &r.name))
    }

    fn finish(self: Arc<Self>, held: Vec<Keyed>) -> BoxFuture<'static, ()> {
        let resources = held
            .iter()
            .filter_map(Keyed::object::<R::Resource>)
            .collect();
        async move { Reconciler::finish(&*self, resources).await }.boxed()
    }

    fn stopped(&self) {
        Reconciler::stopped(self);
    }
}
