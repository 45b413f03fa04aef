//! The kinds this operator reconciles: the Rust kinds (one module each,
//! registered by one line in the `kinds!` invocation below) and the kinds
//! declared as folders ([`declared`]); [`registry`] serves both.

pub mod chaos_agent;
pub mod copyrator;
pub mod declared;
pub mod exchange_rate;
pub(crate) mod pruning;
pub mod registry;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::ListParams;

use crate::engine::host::{Engine, Marking, OverlayError, Owner, Rendered, render_plan};
use crate::kind::{FieldConflicts, Handler, HandlerError, KustomizeDir, Step};

/// Settings handlers take from the command line.
#[derive(Debug, Clone)]
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
    /// CopyratorRule: `kube-system`, `kube-public`, `kube-node-lease` and the
    /// operator's namespace may be targets.
    pub copyrator_allow_system_namespaces: bool,
    /// CopyratorRule: the most bytes of copies one rule may want.
    pub copyrator_max_bytes: usize,
    /// CopyratorRule: the bytes all rules together may hold while reading.
    pub copyrator_read_budget: usize,
}

impl Default for KindOptions {
    fn default() -> Self {
        Self {
            operator_namespace: None,
            exchange_rate: exchange_rate::ExchangeRateOptions::default(),
            watch_namespace: None,
            copyrator_namespace_selector: None,
            copyrator_namespaces: Vec::new(),
            copyrator_allow_system_namespaces: false,
            copyrator_max_bytes: copyrator::plan::DEFAULT_MAX_BYTES,
            copyrator_read_budget: copyrator::budget::DEFAULT_READ_BUDGET,
        }
    }
}

/// Whether rendering a resource read from the cluster also reads the
/// metadata of the objects it owns, to tell what a run would prune
/// (`diff` does; `render` writes overlays only and does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedObjects {
    /// Leave them unread.
    Skip,
    /// Read them ([`RenderOutput`]'s pruning).
    Read,
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
    Overlay(#[from] OverlayError),
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
                match self { $(KindName::$variant => <$handler>::NAME,)* }
            }

            /// The CRD, generated from the Rust type.
            pub fn crd(self) -> CustomResourceDefinition {
                match self { $(KindName::$variant => crd_of::<$handler>(),)* }
            }

            /// True when the CRD is installed and its resources can be listed.
            pub async fn is_installed(self, client: &kube::Client, namespace: Option<&str>) -> Result<bool, kube::Error> {
                match self { $(KindName::$variant => is_installed(&<$handler as FromOptions>::from_options(&KindOptions::default()), client, namespace).await,)* }
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
                        crate::engine::host::run_controller(engine, handler, shutdown).await
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

            /// Renders the plan `run` would execute now for `doc`, a
            /// resource read from the cluster, observing it there read-only.
            pub async fn render_live(
                self,
                doc: &serde_json::Value,
                client: &kube::Client,
                options: &KindOptions,
                dir: &KustomizeDir,
                owned: OwnedObjects,
            ) -> Result<RenderOutput, RenderError> {
                match self {
                    $(KindName::$variant => render_live_with(&<$handler as FromOptions>::from_options(options), doc, client, dir, owned).await,)*
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

pub(crate) async fn is_installed<H: Handler>(
    handler: &H,
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<bool, kube::Error> {
    let api = handler.api(client.clone(), namespace);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
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

/// A plan's steps and their rendering, as `render` produces them.
#[derive(Debug)]
pub struct RenderOutput {
    /// The steps.
    pub steps: Vec<Step>,
    /// Each step's overlay, rendered (`None` for steps without one).
    pub overlays: Vec<Option<crate::engine::host::RenderedOverlay>>,
    /// The kind's own status fields the plan writes, as JSON.
    pub status: Option<serde_json::Value>,
    /// The engine takes back fields other managers changed on the
    /// resource's existing objects ([`FieldConflicts::TakeBack`]).
    pub takes_back: bool,
    /// What a run would prune from.
    pub(crate) pruning: pruning::Pruning,
}

/// The UID `render` uses in the ownership marker of a resource that has
/// none (a file written by hand rather than read from the cluster).
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

pub(crate) fn render_with<H: Handler>(
    handler: &H,
    doc: &serde_json::Value,
    rest: &[serde_json::Value],
    dir: &KustomizeDir,
) -> Result<RenderOutput, RenderError> {
    let resource = resource_of(handler, doc)?;
    let observed = handler.observe_offline(&resource, rest)?;
    finish_render(handler, &resource, &observed, dir)
}

/// [`render_with`] for a resource read from the cluster: the kind observes
/// it there, without side effects ([`Handler::observe_preview`]).
pub(crate) async fn render_live_with<H: Handler>(
    handler: &H,
    doc: &serde_json::Value,
    client: &kube::Client,
    dir: &KustomizeDir,
    owned: OwnedObjects,
) -> Result<RenderOutput, RenderError> {
    let resource = resource_of(handler, doc)?;
    let observed = handler.observe_preview(&resource, client).await?;
    let mut output = finish_render(handler, &resource, &observed, dir)?;
    if owned == OwnedObjects::Read {
        let adopts = |meta: &kube::api::ObjectMeta| handler.adopts(&resource, meta);
        output.pruning.look(client, &adopts).await;
    }
    Ok(output)
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

fn finish_render<H: Handler>(
    handler: &H,
    resource: &H::Resource,
    observed: &H::Observed,
    dir: &KustomizeDir,
) -> Result<RenderOutput, RenderError> {
    use kube::{Resource, ResourceExt};
    let dt = &handler.info().dyn_type;
    let plan = handler.plan(resource, observed)?;
    let marking = Marking {
        owner: Owner {
            api_version: H::Resource::api_version(dt).into_owned(),
            kind: H::Resource::kind(dt).into_owned(),
            namespace: resource.namespace(),
            name: resource.name_any(),
            uid: resource
                .uid()
                .unwrap_or_else(|| PLACEHOLDER_UID.to_string()),
        },
        owner_references: handler.info().policy.owner_references,
    };
    let Rendered { overlays, .. } = render_plan(&plan, dir, &marking)?;
    let mut candidates: BTreeSet<_> = handler
        .inventory(resource)
        .map(|i| i.ids())
        .unwrap_or_default();
    candidates.extend(plan.stale.iter().cloned());
    let pruning = pruning::Pruning {
        prunes: plan.prune,
        owner: Some(marking.owner),
        declared: plan.inventory.map(|d| d.into_iter().collect()),
        candidates,
        looked: None,
    };
    Ok(RenderOutput {
        pruning,
        status: plan
            .status
            .as_ref()
            .and_then(|s| serde_json::to_value(s).ok()),
        steps: plan.steps,
        overlays,
        takes_back: handler.info().policy.conflicts == FieldConflicts::TakeBack,
    })
}
