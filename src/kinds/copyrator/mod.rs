//! CopyratorRule (`flant.com/v1`): the Copyrator article's copy operator.
//!
//! Recipe: every ConfigMap or Secret in the rule's namespace whose labels
//! match the selector is copied into each target namespace. The copies are
//! one overlay of whole objects (data, binaryData, type and labels of the
//! source, plus a marker naming the rule and the source), applied with one
//! `kubectl apply -k --server-side` per reconcile. Copies no longer wanted
//! are deleted with one label-selected `kubectl delete` (unless the rule
//! retains them); a same-named object without the rule's marker is never
//! touched, only reported. Deleting the rule deletes its copies the same way.
//!
//! - [`resource`]: the CRD type (spec and the article's top-level form);
//! - [`observe`]: the cluster reads;
//! - [`plan`]: resource + observations → plan (pure);
//! - [`marker`]: the labels and annotations copies carry;
//! - [`scope`]: the namespaces it may touch (`--copyrator-namespaces`);
//! - `watch`: the triggers (sources, copies, namespaces).

pub mod marker;
pub mod observe;
pub mod plan;
pub mod resource;
pub mod scope;
mod watch;

pub use resource::{
    CopiesStatus, CopyratorRule, CopyratorRuleSpec, CopyratorRuleStatus, DeletionPolicy, RuleType,
    TargetStatus,
};
pub use scope::Scope;

use kube::runtime::Controller;

use crate::handler::{Handler, HandlerError, Kind, Plan, namespaced_api};
use crate::kinds::{FromOptions, KindOptions};
use crate::status::CommonStatus;

/// The kind's short name (`--kinds copyrator`, `kustomize/copyrator`).
pub const NAME: &str = "copyrator";

impl Kind for CopyratorRule {
    const NAME: &'static str = NAME;
    const FINALIZER: &'static str = "flant.com/kustomize-operator";

    fn common_status(&self) -> Option<&CommonStatus> {
        self.status.as_ref().map(|s| &s.common)
    }

    fn api(client: kube::Client, namespace: Option<&str>) -> kube::Api<Self> {
        namespaced_api(client, namespace)
    }
}

/// Plans CopyratorRules.
#[derive(Debug, Default)]
pub struct CopyratorHandler {
    /// Only namespaces matching this label selector are targets.
    pub namespace_selector: Option<String>,
    /// The namespaces it may touch ConfigMaps and Secrets in.
    pub scope: Scope,
}

impl FromOptions for CopyratorHandler {
    fn from_options(options: &KindOptions) -> Self {
        Self {
            namespace_selector: options.copyrator_namespace_selector.clone(),
            scope: Scope::new(&options.copyrator_namespaces),
        }
    }
}

impl Handler for CopyratorHandler {
    type Resource = CopyratorRule;
    type Observed = observe::Observed;

    async fn observe(
        &self,
        rule: &CopyratorRule,
        client: &kube::Client,
    ) -> Result<observe::Observed, HandlerError> {
        let resolved = rule.resolve()?;
        self.scope.check_rule_namespace(&resolved.namespace)?;
        observe::observe(
            client,
            &resolved,
            self.namespace_selector.as_deref(),
            &self.scope,
        )
        .await
    }

    fn observe_offline(
        &self,
        rule: &CopyratorRule,
        documents: &[serde_json::Value],
    ) -> Result<observe::Observed, HandlerError> {
        observe::observe_offline(&rule.resolve()?, documents)
    }

    fn plan(
        &self,
        rule: &CopyratorRule,
        observed: &observe::Observed,
    ) -> Result<Plan, HandlerError> {
        let last_digest = rule
            .status
            .as_ref()
            .and_then(|s| s.common.applied_digest.as_deref());
        Ok(plan::plan(
            &rule.resolve()?,
            observed,
            last_digest,
            &self.scope,
        ))
    }

    fn cleanup(&self, rule: &CopyratorRule) -> Result<Plan, HandlerError> {
        Ok(plan::cleanup(rule, &self.scope))
    }

    fn configure(
        &self,
        controller: Controller<CopyratorRule>,
        client: &kube::Client,
        namespace: Option<&str>,
    ) -> Controller<CopyratorRule> {
        if let Some(ns) = namespace.filter(|ns| !self.scope.contains(ns)) {
            tracing::warn!(
                namespace = ns,
                "the watched namespace is not among --copyrator-namespaces: its rules will report NamespaceNotServed"
            );
        }
        watch::configure(
            controller,
            client,
            namespace,
            self.namespace_selector.as_deref(),
            &self.scope,
        )
    }
}
