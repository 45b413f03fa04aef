//! A kind's logic: resource in, plan out.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;

use super::{FromObjects, HandlerError, KindInfo, Object, Plan, Watching};
use crate::engine::model::inventory::ObjectId;
use crate::engine::model::status::CommonStatus;
use crate::engine::model::templates::KustomizeDir;

/// The dynamic type of a kind's resources (`()` for typed kinds).
pub type DynType<K> = <K as Resource>::DynamicType;

/// A kind's logic: resource in, plan out.
pub trait Handler: Send + Sync + 'static {
    /// The custom resource.
    type Resource: Object;
    /// What the plan depends on besides the resource (cluster reads, external data).
    type Observed: Send + Sync + 'static;
    /// The kind's own status fields, written beside the engine's.
    type Status: Serialize + Clone + Debug + PartialEq + Send + Sync + 'static;

    /// The kind's identity and engine policy.
    fn info(&self) -> &KindInfo<DynType<Self::Resource>>;

    /// The API for these resources: in `namespace` if given (namespaced
    /// kinds), else across the cluster.
    fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<Self::Resource>;

    /// A label selector narrowing which resources the controller watches
    /// when the operator runs for `namespace` (`--namespace`).
    fn watch_selector(&self, _namespace: Option<&str>) -> Option<String> {
        None
    }

    /// The engine's status fields of a resource.
    fn common_status(&self, resource: &Self::Resource) -> Option<CommonStatus>;

    /// A resource's whole status as JSON, if it has one. (Kinds that keep
    /// their resources as JSON text may read just this field.)
    fn status(&self, resource: &Self::Resource) -> Option<serde_json::Value> {
        serde_json::to_value(resource)
            .ok()?
            .get_mut("status")
            .map(serde_json::Value::take)
    }

    /// Gathers what [`Handler::plan`] needs from the world.
    fn observe(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send;

    /// [`Handler::observe`], for a kind that reads objects it does not own:
    /// those reads impersonate `user` (`system:serviceaccount:NS:NAME`), the
    /// identity the resource's writes use, so they never reach beyond its
    /// rights; `None`: the operator's own account, which its writes use
    /// too. (A resource whose writes are refused is not observed at all.)
    /// Default: [`Handler::observe`].
    fn observe_as(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
        _user: Option<&str>,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send {
        self.observe(resource, client)
    }

    /// The same inputs for `diff` and `render KIND/NAME`, read from the
    /// cluster without side effects: no write, no external fetch, no timer
    /// (what `run` would plan if it looked now). Default: [`Handler::observe`],
    /// for kinds whose observation only reads the cluster.
    fn observe_preview(
        &self,
        resource: &Self::Resource,
        client: &kube::Client,
    ) -> impl Future<Output = Result<Self::Observed, HandlerError>> + Send {
        self.observe(resource, client)
    }

    /// The same inputs without a cluster, for `render`: taken from the
    /// documents that follow the resource in the file.
    fn observe_offline(
        &self,
        resource: &Self::Resource,
        documents: &[serde_json::Value],
    ) -> Result<Self::Observed, HandlerError>;

    /// The plan for a resource that exists (created or changed). Pure.
    fn plan(
        &self,
        resource: &Self::Resource,
        observed: &Self::Observed,
    ) -> Result<Plan<Self::Status>, HandlerError>;

    /// True when `object` may be one of `resource`'s objects (its
    /// `namespace` is `None` for a cluster-scoped kind): the engine applies
    /// no overlay that builds any other, and never prunes or deletes one.
    /// Default: anywhere the resource's writer may write (kinds whose
    /// resources only the operator's administrator makes).
    fn reaches(&self, _resource: &Self::Resource, _object: &ObjectId) -> bool {
        true
    }

    /// True when the resource's objects stay when it is deleted (they keep
    /// its marker). Default: false, every object of its inventory that
    /// still carries the marker is deleted with it.
    fn retains(&self, _resource: &Self::Resource) -> bool {
        false
    }

    /// True when an existing object without the resource's marker is the
    /// resource's all the same and may be taken over (for example one made
    /// by an earlier version of this operator). Default: never.
    fn adopts(&self, _resource: &Self::Resource, _live: &ObjectMeta) -> bool {
        false
    }

    /// What the kind reads from the live state of the objects the resource
    /// owns (each cut down to its metadata, `spec.replicas` and `status`),
    /// whenever the engine looks at their health. A kind whose reading
    /// may cost much does it off the async runtime's threads, within a
    /// deadline. Default: nothing.
    fn read_objects(
        &self,
        _resource: &Self::Resource,
        _objects: &BTreeMap<ObjectId, serde_json::Value>,
    ) -> impl Future<Output = FromObjects> + Send {
        std::future::ready(FromObjects::default())
    }

    /// What else starts a reconcile of the kind's resources: streams of
    /// the resources to reconcile, each usually fed by a watch of other
    /// objects (a declared kind's references, the sources a copyrator rule
    /// copies). Default: none, only changes of the resources and of the
    /// objects they own.
    fn nudges(
        &self,
        _watching: Watching<Self::Resource>,
    ) -> Vec<BoxStream<'static, ObjectRef<Self::Resource>>> {
        Vec::new()
    }

    /// Forgets what the kind remembers of a resource that is gone.
    fn forget(&self, _resource: &Self::Resource) {}

    /// The revision of the kind's files that renders the resource, where
    /// the kind has several (a declared kind's resource served by one
    /// revision of its definition): its number, which the reconcile's span
    /// records. Default: none.
    fn revision_for(&self, _resource: &Self::Resource) -> Option<u32> {
        None
    }

    /// The templates that render the resource when they are not the
    /// kind's own (those of the revision [`Handler::revision_for`] names).
    /// Default: the kind's own.
    fn templates_for(&self, _resource: &Self::Resource) -> Option<Arc<KustomizeDir>> {
        None
    }
}
