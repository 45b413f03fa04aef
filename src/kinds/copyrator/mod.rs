//! CopyratorRule (`flant.com/v1`): the Copyrator article's copy operator.
//!
//! Recipe: every ConfigMap or Secret in the rule's namespace whose labels
//! match the selector is copied into each target namespace. The copies are
//! one overlay of whole objects (data, binaryData, type and labels of the
//! source, plus a marker naming the rule and the source), applied with one
//! server-side apply per reconcile under the rule's own field manager. The
//! copies are the rule's inventory: copies no longer wanted are deleted by
//! the engine (by name, only while they carry the rule's marker) unless the
//! rule retains them; a same-named object without the marker is never
//! touched, only reported. Deleting the rule deletes its copies the same way.
//! The rails (never the cluster's own namespaces or credentials, a size
//! cap) are in [`plan::Rails`].
//!
//! - [`resource`]: the CRD type (spec and the article's top-level form);
//! - [`reads`]: the cluster reads, page by page ([`paging`]) within a
//!   process-wide read budget ([`budget`]);
//! - [`plan`]: resource + observations → plan (pure);
//! - [`marker`]: the labels and annotations copies carry;
//! - [`scope`]: the namespaces it may touch (`--copyrator-namespaces`);
//! - `watch`: the triggers (sources, copies, namespaces).

pub mod budget;
mod flags;
pub mod inputs;
pub mod marker;
pub mod paging;
pub mod plan;
pub mod reads;
pub mod resource;
pub mod scope;
mod watch;

pub use flags::Flags;
pub use resource::{
    CopiesStatus, CopyratorRule, CopyratorRuleSpec, CopyratorRuleStatus, DeletionPolicy, RuleType,
    TargetStatus,
};
pub use scope::Scope;

use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use kube::runtime::reflector::ObjectRef;

use crate::kind::{CommonStatus, Handler, HandlerError, KindInfo, Plan, Watching};
use crate::kinds::{KindContext, RustKind, namespaced_api};
use plan::Rails;

// The default read budget holds two rules at the default byte cap
// (budget.rs, plan.rs).
const _: () = assert!(budget::DEFAULT_READ_BUDGET >= 2 * plan::DEFAULT_MAX_BYTES);

/// The kind's short name (`--kinds copyrator`, `kustomize/copyrator`).
pub const NAME: &str = "copyrator";

/// Plans CopyratorRules.
#[derive(Debug)]
pub struct CopyratorHandler {
    info: KindInfo<()>,
    /// Only namespaces matching this label selector are targets.
    pub namespace_selector: Option<String>,
    /// The rails every rule runs within.
    pub rails: Rails,
    /// What all rules together may hold while reading
    /// (`--copyrator-read-budget`): one per handler, and the operator runs
    /// one CopyratorRule controller, so one per process.
    budget: budget::Budget,
}

impl Default for CopyratorHandler {
    fn default() -> Self {
        Self::new(None, Rails::default(), budget::DEFAULT_READ_BUDGET)
    }
}

impl CopyratorHandler {
    /// The kind's short name.
    pub const NAME: &'static str = NAME;

    /// A handler with these settings and a read budget of `read_budget` bytes.
    pub fn new(namespace_selector: Option<String>, rails: Rails, read_budget: usize) -> Self {
        Self {
            info: KindInfo {
                // A copy follows its source: an edited copy is taken back
                // (new copies are still created without force).
                takes_back: true,
                // Copies live in other namespaces.
                owner_references: false,
                // With impersonation on, copies are written as an
                // account of the rule's namespace: revoking its right
                // to write a target stops the copies there.
                tenant_writes: true,
                ..KindInfo::new(NAME, "flant.com/kustomize-operator", ())
            },
            namespace_selector,
            rails,
            budget: budget::Budget::new(read_budget),
        }
    }
}

impl RustKind for CopyratorHandler {
    type Flags = Flags;

    fn from_flags(flags: &Flags, context: &KindContext) -> Self {
        Self::new(
            flags.namespace_selector.clone(),
            Rails {
                scope: Scope::new(&flags.namespaces),
                operator_namespace: context.operator_namespace.clone(),
                allow_system_namespaces: flags.allow_system_namespaces,
                max_bytes: flags.max_bytes,
            },
            flags.read_budget,
        )
    }
}

impl Handler for CopyratorHandler {
    type Resource = CopyratorRule;
    type Observed = inputs::Observed;
    type Status = CopiesStatus;

    fn info(&self) -> &KindInfo<()> {
        &self.info
    }

    fn api(&self, client: kube::Client, namespace: Option<&str>) -> kube::Api<CopyratorRule> {
        namespaced_api(client, namespace)
    }

    fn common_status(&self, rule: &CopyratorRule) -> Option<CommonStatus> {
        rule.status.as_ref().map(|s| s.common.clone())
    }

    async fn observe(
        &self,
        rule: &CopyratorRule,
        client: &kube::Client,
    ) -> Result<inputs::Observed, HandlerError> {
        let resolved = rule.resolve()?;
        self.rails.scope.check_rule_namespace(&resolved.namespace)?;
        reads::observe(
            client,
            &resolved,
            self.namespace_selector.as_deref(),
            &self.rails,
            &self.budget,
        )
        .await
    }

    fn observe_offline(
        &self,
        rule: &CopyratorRule,
        documents: &[serde_json::Value],
    ) -> Result<inputs::Observed, HandlerError> {
        reads::observe_offline(&rule.resolve()?, documents)
    }

    fn plan(
        &self,
        rule: &CopyratorRule,
        observed: &inputs::Observed,
    ) -> Result<Plan<CopiesStatus>, HandlerError> {
        let last_digest = rule
            .status
            .as_ref()
            .and_then(|s| s.common.applied_digest.as_deref());
        plan::plan(&rule.resolve()?, observed, last_digest, &self.rails)
    }

    fn retains(&self, rule: &CopyratorRule) -> bool {
        rule.cleanup_policy() == DeletionPolicy::Retain
    }

    /// Copies made by versions before the ownership marker carry the rule's
    /// own marker (annotation and label naming it): those are its own.
    fn adopts(&self, rule: &CopyratorRule, live: &ObjectMeta) -> bool {
        let namespace = kube::ResourceExt::namespace(rule).unwrap_or_default();
        let name = kube::ResourceExt::name_any(rule);
        let annotation = live.annotations.as_ref().and_then(|a| a.get(marker::RULE));
        let label = live.labels.as_ref().and_then(|l| l.get(marker::RULE));
        annotation == Some(&marker::rule_annotation(&namespace, &name))
            && label == Some(&marker::rule_label(&namespace, &name))
    }

    fn nudges(
        &self,
        watching: Watching<CopyratorRule>,
    ) -> Vec<BoxStream<'static, ObjectRef<CopyratorRule>>> {
        let namespace = watching.namespace.as_deref();
        if let Some(ns) = namespace.filter(|ns| !self.rails.scope.contains(ns)) {
            tracing::warn!(
                namespace = ns,
                "the watched namespace is not among --copyrator-namespaces: its rules will report NamespaceNotServed"
            );
        }
        watch::nudges(
            watching,
            self.namespace_selector.as_deref(),
            &self.rails.scope,
        )
    }
}
