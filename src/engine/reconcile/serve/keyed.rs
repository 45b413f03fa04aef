//! The one store of the runtime holds the resources of every kind it
//! serves, each as its kind's Rust type. kube-runtime keys a store by name
//! and namespace (its kind is the store's own), so each resource is held
//! under a key that adds its kind to the namespace: two resources of
//! different kinds that share a name and namespace never share a key.

use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;

/// A resource as the runtime's store holds it, whatever its Rust type.
#[derive(Clone)]
pub(crate) struct Keyed {
    /// The kind's name (`sample`, `copyrator`, a definition's kind).
    pub kind: Arc<str>,
    /// The resource, of its kind's Rust type.
    pub object: Arc<dyn Any + Send + Sync>,
    /// Its key: its name, and its namespace behind its kind.
    key: ObjectMeta,
}

impl std::fmt::Debug for Keyed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed")
            .field("kind", &self.kind)
            .field("name", &self.key.name)
            .field("namespace", &self.key.namespace)
            .finish_non_exhaustive()
    }
}

impl Keyed {
    /// `object`, a resource of the kind `kind`.
    pub fn new<K: Resource + Send + Sync + 'static>(kind: Arc<str>, object: Arc<K>) -> Self {
        let meta = object.meta();
        let key = ObjectMeta {
            name: meta.name.clone(),
            namespace: Some(scoped(&kind, meta.namespace.as_deref())),
            ..Default::default()
        };
        Self { kind, object, key }
    }

    /// Its key in the store.
    pub fn key(&self) -> ObjectRef<Self> {
        ObjectRef::from_obj(self)
    }

    /// The resource as its kind's Rust type `K` (`None`: another type).
    pub fn object<K: Send + Sync + 'static>(&self) -> Option<Arc<K>> {
        self.object.clone().downcast::<K>().ok()
    }
}

/// The key of the resource `name` (in `namespace`) of the kind `kind`.
pub(crate) fn key(kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef<Keyed> {
    ObjectRef::new(name).within(&scoped(kind, namespace))
}

/// The kind's name, then the namespace (`sample/team-a`, `sample/` when
/// cluster-scoped): no kind name holds a slash.
fn scoped(kind: &str, namespace: Option<&str>) -> String {
    format!("{kind}/{}", namespace.unwrap_or_default())
}

impl kube::Resource for Keyed {
    type DynamicType = ();
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("ServedResource")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("kustomize-operator.io")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("servedresources")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.key
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;

    fn object(namespace: Option<&str>, name: &str) -> DynamicObject {
        let mut o = DynamicObject {
            types: None,
            metadata: ObjectMeta::default(),
            data: serde_json::Value::Null,
        };
        o.metadata.name = Some(name.into());
        o.metadata.namespace = namespace.map(str::to_string);
        o
    }

    #[test]
    fn resources_of_two_kinds_never_share_a_key() {
        let a = Keyed::new("sample".into(), Arc::new(object(Some("t"), "web")));
        let b = Keyed::new("greeting".into(), Arc::new(object(Some("t"), "web")));
        assert_ne!(a.key(), b.key());
        assert_eq!(a.key(), key("sample", Some("t"), "web"));
        let cluster = Keyed::new("tenant".into(), Arc::new(object(None, "acme")));
        assert_eq!(cluster.key(), key("tenant", None, "acme"));
        assert_ne!(cluster.key(), key("tenant", Some(""), "x"));
    }
}
