//! What the runtime serves: one [`Reconciler`] per kind, whatever the
//! Rust type of its resources. A kind a
//! [`Handler`](crate::engine::contract::Handler) plans for is one
//! (`handled`); a KindDefinition is another (it plugs in from
//! `crate::definitions`).

use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::engine::contract::{Object, Watching};

/// A kind as the runtime serves it: how its resources are watched, what
/// an event of the watch does, one reconcile, and what else starts one.
pub(crate) trait Reconciler: Send + Sync + 'static {
    /// The kind's resources.
    type Resource: Object;

    /// The watch of the kind's resources: where, and which.
    fn watched(&self) -> (kube::Api<Self::Resource>, watcher::Config);

    /// True when every replica sharing the work (automatic sharding) sees
    /// every resource of the kind, not its share of them. Default: false.
    fn whole_on_every_replica(&self) -> bool {
        false
    }

    /// At most this many of the kind's reconciles run at once; the others
    /// wait their turn (in the runtime's queue, before their reconcile
    /// starts). Default: `None`, only the runtime's limit for all kinds.
    fn at_once(&self) -> Option<usize> {
        None
    }

    /// Looks at an event of the watch, and may cut its object down,
    /// before the store holds it; false when it starts no reconcile.
    /// Default: every event starts one.
    fn see(&self, _event: &mut watcher::Event<Self::Resource>) -> bool {
        true
    }

    /// A resource went (the watch saw it deleted).
    fn gone(&self, _resource: &Self::Resource) {}

    /// One reconcile of `resource`: what to do next, whether it succeeded
    /// or not (its error policy is the reconciler's own).
    fn reconcile(&self, resource: Arc<Self::Resource>) -> impl Future<Output = Action> + Send;

    /// What else starts a reconcile (watches of other objects).
    fn nudges(
        &self,
        _watching: Watching<Self::Resource>,
    ) -> Vec<BoxStream<'static, ObjectRef<Self::Resource>>> {
        Vec::new()
    }

    /// The resource of this kind an owner annotation names, if any.
    fn owner(&self, _annotation: &str) -> Option<ObjectRef<Self::Resource>> {
        None
    }

    /// Once the kind's last reconcile is over, with the resources it held:
    /// writes what is still waiting (a stop loses no outcome).
    fn finish(&self, _resources: Vec<Arc<Self::Resource>>) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// The kind is no longer served.
    fn stopped(&self) {}
}
