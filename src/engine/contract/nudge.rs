//! What starts a reconcile besides a change of the resource itself: a kind
//! watches other objects and names the resources a change concerns
//! ([`Handler::nudges`](super::Handler::nudges)), each by its
//! `ObjectRef`.

use std::sync::Arc;

/// The resources of a kind as the runtime holds them now.
pub(crate) struct Resources<K>(Arc<dyn Fn() -> Vec<Arc<K>> + Send + Sync>);

impl<K> Clone for Resources<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> Resources<K> {
    /// The resources `all` lists each time it is called.
    pub(crate) fn new(all: impl Fn() -> Vec<Arc<K>> + Send + Sync + 'static) -> Self {
        Self(Arc::new(all))
    }

    /// Every resource of the kind held now.
    fn all(&self) -> Vec<Arc<K>> {
        (self.0)()
    }
}

/// What a kind's nudges may watch with: the operator's client, the
/// namespace it runs for (`--namespace`), and the kind's resources.
pub struct Watching<K> {
    /// The operator's own client.
    pub client: kube::Client,
    /// The one namespace watched, if any.
    pub namespace: Option<String>,
    /// The kind's resources held now.
    pub(crate) resources: Resources<K>,
}

impl<K> Clone for Watching<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            resources: self.resources.clone(),
        }
    }
}

impl<K> Watching<K> {
    /// Every resource of the kind the runtime holds now.
    pub fn resources(&self) -> Vec<Arc<K>> {
        self.resources.all()
    }
}
