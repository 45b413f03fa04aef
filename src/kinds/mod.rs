//! The kinds this operator reconciles: the Rust kinds (one module each,
//! registered by one line in the `kinds!` invocation below) and the kinds
//! declared as folders ([`declared`]); [`registry`] serves both.
//!
//! # Adding a Rust kind
//!
//! A Rust kind `Foo` (short name `foo`) takes:
//!
//! 1. Its module, `src/kinds/foo.rs` or `src/kinds/foo/`, declared here with
//!    `pub mod foo;`, holding:
//!    - the resource type (`#[derive(CustomResource)]`), whose CRD
//!      `crd` prints;
//!    - the handler, `FooHandler`, with an inherent `const NAME: &str =
//!      "foo"`, implementing [`Handler`] (observe and
//!      plan) and [`RustKind`];
//!    - its flags, if it has any: one `#[derive(clap::Args)]` struct (by
//!      convention `foo::Flags` in `foo/flags.rs`) with a unique
//!      `#[group(id = "foo_flags")]`, every flag named `--foo-*` with an
//!      environment variable, and a `Default` equal to what the defaults
//!      parse to; [`RustKind::Flags`] names it ([`NoFlags`] for none), and
//!      [`RustKind::from_flags`] gets it whole, with the [`KindContext`].
//! 2. One registration line in the `kinds!` invocation below:
//!    `Foo => foo::FooHandler,` (the module name becomes the field of
//!    [`KindFlags`], which `run`, `render` and `diff` flatten, so the flags
//!    reach every command with nothing else edited).
//! 3. Its `kustomize/foo/` folder (base, patches, resources).
//!
//! Nothing else changes: `--kinds`, `crd`, `render`, `diff` and `run` find
//! the kind through [`KindName`] and [`registry::Kind`].

pub mod chaos_agent;
pub mod copyrator;
pub mod declared;
pub mod exchange_rate;
pub mod registry;

use futures::future::BoxFuture;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::Resource;
use kube::api::ApiResource;

pub use crate::engine::host::Preview;
use crate::engine::host::Runtime;
use crate::kind::{Handler, HandlerError, KustomizeDir};

/// What every kind is told about where the operator runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindContext {
    /// The namespace the operator runs in (from the downward API), if known.
    pub operator_namespace: Option<String>,
    /// The namespace the operator watches (`--namespace`), if only one.
    pub watch_namespace: Option<String>,
}

/// Settings handlers take from the command line.
#[derive(Debug, Clone, Default)]
pub struct KindOptions {
    /// Where the operator runs.
    pub context: KindContext,
    /// Each Rust kind's own flags.
    pub flags: KindFlags,
}

/// Whether rendering a resource read from the cluster also reads the
/// metadata of the objects it owns, to tell what a run would prune
/// (`diff` does; `render` writes overlays only and does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedObjects {
    /// Leave them unread.
    Skip,
    /// Read them ([`Preview`]'s pruning).
    Read,
}

/// A kind written in Rust: a handler built from the kind's own flags.
pub trait RustKind: Handler + Sized {
    /// The kind's command-line flags, flattened into `run`, `render` and
    /// `diff` ([`NoFlags`] for a kind without any). Its `Default` is what
    /// the flags' defaults parse to.
    type Flags: clap::Args + Clone + std::fmt::Debug + Default;

    /// Builds the handler.
    fn from_flags(flags: &Self::Flags, context: &KindContext) -> Self;
}

/// The flags of a Rust kind that has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
#[group(skip)]
pub struct NoFlags {}

/// Something done with a kind's handler, whatever its type: the kinds are
/// turned into handlers in one place ([`KindName::with_handler`] and
/// [`registry::Kind`]), and each thing done with one is written once.
pub(crate) trait WithHandler {
    /// What it gives.
    type Output;

    /// Does it with `handler`.
    fn with<H: Handler>(self, handler: H) -> Self::Output;
}

/// An error from `render`.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The document is not a resource of a known kind.
    #[error("{0}")]
    UnknownKind(String),
    /// The document does not deserialize as its kind.
    #[error("invalid {kind}: {reason}")]
    Invalid {
        /// The kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// The kind refused the resource, or its overlay did not render
    /// (`RenderFailed`): what its reconcile would report.
    #[error(transparent)]
    Unrendered(#[from] HandlerError),
}

impl RenderError {
    /// Why the resource did not render, as its reconcile would report it:
    /// the kind's refusal, or its overlay's render failure (`RenderFailed`).
    pub fn unrendered(&self) -> Option<&HandlerError> {
        match self {
            Self::Unrendered(e) => Some(e),
            _ => None,
        }
    }
}

macro_rules! kinds {
    ($($variant:ident => $module:ident :: $handler:ident),* $(,)?) => {
        /// Every Rust kind's flags (`run`, `render` and `diff` take them all).
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct KindFlags {
            $(
                #[doc = concat!("`", stringify!($variant), "`'s flags.")]
                #[command(flatten)]
                pub $module: <$module::$handler as RustKind>::Flags,
            )*
        }

        /// A kind's name on the command line (`--kinds`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum KindName {
            $(#[doc = stringify!($variant)] $variant,)*
        }

        impl KindName {
            /// Every kind.
            pub const ALL: &'static [KindName] = &[$(KindName::$variant,)*];

            /// The short name (`sample`, ...), as in `--kinds` and `kustomize/<name>`.
            pub fn as_str(self) -> &'static str {
                match self { $(KindName::$variant => <$module::$handler>::NAME,)* }
            }

            /// The CRD, generated from the Rust type.
            pub fn crd(self) -> CustomResourceDefinition {
                match self { $(KindName::$variant => crd_of::<$module::$handler>(),)* }
            }

            /// The kind whose apiVersion and kind `doc` carries.
            pub fn of_document(doc: &serde_json::Value) -> Option<KindName> {
                $(if matches_kind::<$module::$handler>(doc) { return Some(KindName::$variant); })*
                None
            }

            /// Does `action` with this kind's handler, built from `options`.
            pub(crate) fn with_handler<A: WithHandler>(self, options: &KindOptions, action: A) -> A::Output {
                match self {
                    $(KindName::$variant => action.with(<$module::$handler as RustKind>::from_flags(
                        &options.flags.$module,
                        &options.context,
                    )),)*
                }
            }
        }
    };
}

kinds! {
    ExchangeRate => exchange_rate::ExchangeRateHandler,
    ChaosAgent => chaos_agent::ChaosAgentHandler,
    Copyrator => copyrator::CopyratorHandler,
}

impl std::str::FromStr for KindName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let known: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown kind {s:?}; known kinds: {}", known.join(", "))
            })
    }
}

impl std::fmt::Display for KindName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn crd_of<H: Handler>() -> CustomResourceDefinition
where
    H::Resource: CustomResourceExt,
{
    <H::Resource as CustomResourceExt>::crd()
}

/// Whether the API server serves `resource` (its CRD is installed and
/// established), and whether this client may list and watch it (in
/// `namespace`, or across the cluster). Asked of discovery and of a
/// SelfSubjectAccessReview: no object of any tenant is read, so none can
/// keep the operator from starting.
pub async fn served(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Result<Availability, kube::Error> {
    let listed = if resource.group.is_empty() {
        client.list_core_api_resources(&resource.version).await
    } else {
        client.list_api_group_resources(&resource.api_version).await
    };
    let resources = match listed {
        Ok(list) => list.resources,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Availability::NotInstalled),
        Err(e) => return Err(e),
    };
    if !resources.iter().any(|r| r.name == resource.plural) {
        return Ok(Availability::NotInstalled);
    }
    for verb in ["list", "watch"] {
        if !may(client, resource, namespace, verb).await? {
            return Ok(Availability::Forbidden(verb));
        }
    }
    Ok(Availability::Yes)
}

/// Whether the API serves a kind to this client, as [`served`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Served, and this client may list and watch it.
    Yes,
    /// Not served: the CRD is missing (or not established yet).
    NotInstalled,
    /// Served, but this client may not do this.
    Forbidden(&'static str),
}

async fn may(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    verb: &str,
) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(resource.group.clone()),
                resource: Some(resource.plural.clone()),
                namespace: namespace.map(str::to_string),
                verb: Some(verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = kube::Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Tells the client's guard the Rust type a kind's resources are read as,
/// so one that does not decode as it is left out of lists and watches
/// (declared kinds are read as `DynamicObject`, which any object is).
pub(crate) struct CheckShape<'a> {
    /// The guard of the operator's client.
    pub guard: &'a crate::guard::Guard,
    /// Where the kind is served.
    pub resource: &'a ApiResource,
}

impl WithHandler for CheckShape<'_> {
    type Output = ();

    fn with<H: Handler>(self, _handler: H) -> Self::Output {
        use std::any::TypeId;
        if TypeId::of::<H::Resource>() != TypeId::of::<kube::api::DynamicObject>() {
            self.guard
                .check_shape::<H::Resource>(&self.resource.group, &self.resource.plural);
        }
    }
}

/// Serves the kind in the runtime.
pub(crate) struct ServeIn<'a> {
    /// The runtime serving it.
    pub runtime: &'a Runtime,
}

impl<'a> WithHandler for ServeIn<'a> {
    type Output = BoxFuture<'a, ()>;

    fn with<H: Handler>(self, handler: H) -> Self::Output {
        Box::pin(self.runtime.serve_kind(handler, None))
    }
}

/// Renders the plan `run` would carry out for a resource, offline.
pub(crate) struct Render<'a> {
    /// The resource.
    pub doc: &'a serde_json::Value,
    /// The documents that follow it in the file.
    pub rest: &'a [serde_json::Value],
    /// The kind folders.
    pub dir: &'a KustomizeDir,
}

impl WithHandler for Render<'_> {
    type Output = Result<Preview, RenderError>;

    fn with<H: Handler>(self, handler: H) -> Self::Output {
        let resource = resource_of(&handler, self.doc)?;
        let observed = handler.observe_offline(&resource, self.rest)?;
        Ok(Preview::of(&handler, &resource, &observed, self.dir)?)
    }
}

/// [`Render`] for a resource read from the cluster: the kind observes it
/// there, without side effects ([`Handler::observe_preview`]).
pub(crate) struct RenderLive<'a> {
    /// The resource.
    pub doc: &'a serde_json::Value,
    /// The cluster.
    pub client: &'a kube::Client,
    /// The kind folders.
    pub dir: &'a KustomizeDir,
    /// Whether the objects it owns are read too.
    pub owned: OwnedObjects,
}

impl<'a> WithHandler for RenderLive<'a> {
    type Output = BoxFuture<'a, Result<Preview, RenderError>>;

    fn with<H: Handler>(self, handler: H) -> Self::Output {
        Box::pin(async move {
            let resource = resource_of(&handler, self.doc)?;
            let observed = handler.observe_preview(&resource, self.client).await?;
            let mut output = Preview::of(&handler, &resource, &observed, self.dir)?;
            if self.owned == OwnedObjects::Read {
                let adopts = |meta: &kube::api::ObjectMeta| handler.adopts(&resource, meta);
                output.pruning.look(self.client, &adopts).await;
            }
            Ok(output)
        })
    }
}

fn matches_kind<H: Handler>(doc: &serde_json::Value) -> bool
where
    H::Resource: kube::Resource<DynamicType = ()>,
{
    use kube::Resource;
    doc.get("apiVersion").and_then(|v| v.as_str()) == Some(H::Resource::api_version(&()).as_ref())
        && doc.get("kind").and_then(|v| v.as_str()) == Some(H::Resource::kind(&()).as_ref())
}

fn resource_of<H: Handler>(
    handler: &H,
    doc: &serde_json::Value,
) -> Result<H::Resource, RenderError> {
    serde_json::from_value(doc.clone()).map_err(|e| RenderError::Invalid {
        kind: handler.info().name.clone(),
        reason: e.to_string(),
    })
}

/// [`Handler::api`](crate::kind::Handler::api) for a typed namespaced kind:
/// the namespace's, or every namespace's.
pub(crate) fn namespaced_api<K>(client: kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    }
}
