//! The one store of the dynamic controller holds resources of every kind
//! it serves. kube-runtime keys a store by name and namespace (its kind is
//! the store's own), so each resource is held under a key that adds its
//! kind to the namespace: two resources of different kinds that share a
//! name and namespace never share a key.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;

/// A resource as the dynamic controller's store holds it.
#[derive(Debug)]
pub(crate) struct Keyed<K> {
    /// The kind's name (`sample`, a definition's kind).
    pub kind: Arc<str>,
    /// The resource.
    pub object: Arc<K>,
    /// Its key: its name, and its namespace behind its kind.
    key: ObjectMeta,
}

impl<K> Clone for Keyed<K> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind.clone(),
            object: self.object.clone(),
            key: self.key.clone(),
        }
    }
}

impl<K: Resource> Keyed<K> {
    /// `object`, a resource of the kind `kind`.
    pub fn new(kind: Arc<str>, object: K) -> Self {
        let meta = object.meta();
        let key = ObjectMeta {
            name: meta.name.clone(),
            namespace: Some(scoped(&kind, meta.namespace.as_deref())),
            ..Default::default()
        };
        Self {
            kind,
            object: Arc::new(object),
            key,
        }
    }

    /// Its key in the store.
    pub fn key(&self) -> ObjectRef<Self> {
        ObjectRef::from_obj(self)
    }
}

/// The key of the resource `name` (in `namespace`) of the kind `kind`.
pub(crate) fn key<K: Resource>(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> ObjectRef<Keyed<K>> {
    ObjectRef::new(name).within(&scoped(kind, namespace))
}

/// The kind's name, then the namespace (`sample/team-a`, `sample/` when
/// cluster-scoped): no kind name holds a slash.
fn scoped(kind: &str, namespace: Option<&str>) -> String {
    format!("{kind}/{}", namespace.unwrap_or_default())
}

impl<K> kube::Resource for Keyed<K> {
    type DynamicType = ();
    type Scope = kube::core::DynamicResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("DeclaredResource")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("kustomize-operator.io")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("declaredresources")
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
        let a = Keyed::new("sample".into(), object(Some("t"), "web"));
        let b = Keyed::new("greeting".into(), object(Some("t"), "web"));
        assert_ne!(a.key(), b.key());
        assert_eq!(a.key(), key::<DynamicObject>("sample", Some("t"), "web"));
        let cluster = Keyed::new("tenant".into(), object(None, "acme"));
        assert_eq!(cluster.key(), key::<DynamicObject>("tenant", None, "acme"));
        assert_ne!(cluster.key(), key::<DynamicObject>("tenant", Some(""), "x"));
    }
}
