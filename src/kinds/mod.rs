//! The kinds this operator reconciles. Each module holds one kind's resource
//! type and its handler; this file registers them (one line per kind in the
//! `kinds!` invocation below).

pub mod chaos_agent;
pub mod copyrator;
pub mod exchange_rate;
pub mod sample;

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::ListParams;

use crate::controller::Engine;
use crate::handler::{Handler, HandlerError, Kind, Plan, RenderedPlan};
use crate::templates::KustomizeDir;

/// Settings handlers take from the command line.
#[derive(Debug, Clone, Default)]
pub struct KindOptions {
    /// The namespace the operator runs in (from the downward API), if known.
    pub operator_namespace: Option<String>,
    /// ExchangeRate: the rate provider and refresh limits.
    pub exchange_rate: exchange_rate::ExchangeRateOptions,
    /// The namespace the operator watches (`--namespace`), if only one.
    pub watch_namespace: Option<String>,
    /// CopyratorRule: only namespaces matching this label selector are targets.
    pub copyrator_namespace_selector: Option<String>,
    /// CopyratorRule: the namespaces it may touch ConfigMaps and Secrets in
    /// (empty: every namespace).
    pub copyrator_namespaces: Vec<String>,
}

/// A handler built from the command-line settings.
pub trait FromOptions {
    /// Builds the handler.
    fn from_options(options: &KindOptions) -> Self;
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
    /// The handler refused the resource.
    #[error(transparent)]
    Handler(#[from] HandlerError),
    /// Rendering failed.
    #[error(transparent)]
    Overlay(#[from] crate::overlay::OverlayError),
}

macro_rules! kinds {
    ($($variant:ident => $handler:ty),* $(,)?) => {
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
                match self { $(KindName::$variant => <<$handler as Handler>::Resource as Kind>::NAME,)* }
            }

            /// The CRD, generated from the Rust type.
            pub fn crd(self) -> CustomResourceDefinition {
                match self { $(KindName::$variant => crd_of::<$handler>(),)* }
            }

            /// True when the CRD is installed and its resources can be listed.
            pub async fn is_installed(self, client: &kube::Client, namespace: Option<&str>) -> Result<bool, kube::Error> {
                match self { $(KindName::$variant => is_installed::<$handler>(client, namespace).await,)* }
            }

            /// Runs this kind's controller until `shutdown` resolves.
            pub async fn run(
                self,
                engine: Arc<Engine>,
                options: &KindOptions,
                shutdown: impl Future<Output = ()> + Send + Sync + 'static,
            ) {
                match self {
                    $(KindName::$variant => {
                        let handler = Arc::new(<$handler as FromOptions>::from_options(options));
                        crate::controller::run(engine, handler, shutdown).await
                    })*
                }
            }

            /// The kind whose apiVersion and kind `doc` carries.
            pub fn of_document(doc: &serde_json::Value) -> Option<KindName> {
                $(if matches_kind::<$handler>(doc) { return Some(KindName::$variant); })*
                None
            }

            /// Renders the plan `run` would execute for `doc`, offline.
            pub fn render(
                self,
                doc: &serde_json::Value,
                rest: &[serde_json::Value],
                options: &KindOptions,
                dir: &KustomizeDir,
            ) -> Result<RenderOutput, RenderError> {
                match self {
                    $(KindName::$variant => render_with(&<$handler as FromOptions>::from_options(options), doc, rest, dir),)*
                }
            }
        }
    };
}

kinds! {
    Sample => sample::SampleHandler,
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

async fn is_installed<H: Handler>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<bool, kube::Error> {
    let api = H::Resource::api(client.clone(), namespace);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

fn matches_kind<H: Handler>(doc: &serde_json::Value) -> bool {
    use kube::Resource;
    doc.get("apiVersion").and_then(|v| v.as_str()) == Some(H::Resource::api_version(&()).as_ref())
        && doc.get("kind").and_then(|v| v.as_str()) == Some(H::Resource::kind(&()).as_ref())
}

/// A plan and its rendering, as `render` produces them.
#[derive(Debug)]
pub struct RenderOutput {
    /// The plan.
    pub plan: Plan,
    /// Its overlays, rendered.
    pub rendered: RenderedPlan,
}

fn render_with<H: Handler>(
    handler: &H,
    doc: &serde_json::Value,
    rest: &[serde_json::Value],
    dir: &KustomizeDir,
) -> Result<RenderOutput, RenderError> {
    let resource: H::Resource =
        serde_json::from_value(doc.clone()).map_err(|e| RenderError::Invalid {
            kind: <H::Resource as Kind>::NAME.to_string(),
            reason: e.to_string(),
        })?;
    let observed = handler.observe_offline(&resource, rest)?;
    let plan = handler.plan(&resource, &observed)?;
    let rendered = plan.render(dir)?;
    Ok(RenderOutput { plan, rendered })
}
