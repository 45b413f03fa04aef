//! `kube::Resource` for the operator's compact object types (the engine's
//! `CompactObject`, the declared kinds' `DeclaredObject`), whose kind is
//! known at run time as an [`kube::api::ApiResource`] (as for a
//! `DynamicObject`).

/// Implements `kube::Resource` for `$type`, a struct with a `metadata:
/// ObjectMeta` field whose kind is an `ApiResource`.
macro_rules! dynamic_kind {
    ($type:ty) => {
        impl kube::Resource for $type {
            type DynamicType = kube::api::ApiResource;
            type Scope = kube::core::DynamicResourceScope;

            fn kind(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.kind.as_str().into()
            }

            fn group(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.group.as_str().into()
            }

            fn version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.version.as_str().into()
            }

            fn api_version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.api_version.as_str().into()
            }

            fn plural(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.plural.as_str().into()
            }

            fn meta(&self) -> &kube::api::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use dynamic_kind;
