//! ChaosAgent (`blackadder.io/v1beta1`): the Blackadder article's chaos
//! agent, with the safety rails real chaos tools ship.
//!
//! Recipe: every `pauseDuration` seconds an agent runs a round. `observe`
//! lists the Pods, Deployments and ConfigMaps the agent may touch; `plan`
//! draws with a seeded RNG which of them to hit (each with probability
//! `eagerness`%), keeps at most `maxActionsPerRound`, and turns the choice
//! into typed steps: Pod deletions, and one overlay of partial Deployments
//! (`spec.replicas`) and ConfigMaps (`data`) applied with server-side apply,
//! so nothing else of those objects changes. Between rounds the plan is
//! idle: no kubectl, no status write.
//!
//! Never touched, whatever the spec says: `kube-system`, `kube-public`,
//! `kube-node-lease` and the operator's own namespace. An agent labelled
//! [`SCOPE_LABEL`]`=NS` acts only in `NS`; an operator started with
//! `--namespace NS` watches only the agents labelled for `NS`.

mod lorem;
mod round;
pub mod targets;

use std::time::Duration;

use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kind::{CommonStatus, Handler, HandlerError, KindInfo, Plan, Reason};
use crate::kinds::{KindContext, NoFlags, RustKind};
use targets::{Targets, ToList};

/// Namespaces no agent ever touches.
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];
/// The label that confines an agent to one namespace.
pub const SCOPE_LABEL: &str = "blackadder.io/namespace";
/// The field manager of the server-side applies of a round.
pub const FIELD_MANAGER: &str = "chaos-agent";
/// Cancer never scales a Deployment beyond this many replicas.
pub const MAX_REPLICAS: i32 = 128;
/// The longest an idle agent waits before looking again.
const MAX_IDLE: Duration = Duration::from_secs(3600);

/// A chaos agent: what havoc to cause, how eagerly and how often.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "blackadder.io",
    version = "v1beta1",
    kind = "ChaosAgent",
    plural = "chaosagents",
    singular = "chaosagent",
    shortname = "ca",
    status = "ChaosAgentStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Tantrum","type":"boolean","description":"Kills Pods randomly","jsonPath":".spec.tantrumMode"}"#,
    printcolumn = r#"{"name":"Tolerance","type":"integer","description":"Total number of Pods to tolerate before randomly killing Pods","jsonPath":".spec.podTolerance"}"#,
    printcolumn = r#"{"name":"Cancer","type":"boolean","description":"Scales Deployments randomly","jsonPath":".spec.cancerMode"}"#,
    printcolumn = r#"{"name":"Ipsum","type":"boolean","description":"Writes Lorem Ipsum into ConfigMaps randomly","jsonPath":".spec.ipsumMode"}"#,
    printcolumn = r#"{"name":"Eagerness","type":"integer","description":"The probability (%) of acting on each object","jsonPath":".spec.eagerness"}"#,
    printcolumn = r#"{"name":"Pause","type":"integer","description":"Seconds between rounds","jsonPath":".spec.pauseDuration"}"#,
    printcolumn = r#"{"name":"Excluded","type":"string","description":"Namespaces left alone","jsonPath":".spec.excludedNamespaces"}"#,
    printcolumn = r#"{"name":"DryRun","type":"boolean","priority":1,"jsonPath":".spec.dryRun"}"#,
    printcolumn = r#"{"name":"Round","type":"integer","priority":1,"jsonPath":".status.round"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ChaosAgentSpec {
    /// Kill Running Pods: when at least `podTolerance` are running where the
    /// agent may act, each with probability `eagerness`%.
    #[serde(default)]
    pub tantrum_mode: bool,
    /// Fewer Running Pods than this and a tantrum kills none.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pod_tolerance: i32,
    /// Double the replicas of Deployments (at least 1, at most 128), each
    /// with probability `eagerness`%.
    #[serde(default)]
    pub cancer_mode: bool,
    /// Replace the data values of mutable ConfigMaps with Lorem Ipsum, each
    /// with probability `eagerness`%.
    #[serde(default)]
    pub ipsum_mode: bool,
    /// The probability, in percent, of acting on each eligible object.
    #[schemars(range(min = 1, max = 100))]
    pub eagerness: i32,
    /// Seconds between two rounds.
    #[schemars(range(min = 1))]
    pub pause_duration: i64,
    /// Namespaces this agent leaves alone (besides the protected ones).
    #[serde(default)]
    pub excluded_namespaces: Vec<String>,
    /// Report what a round would do (status and events) and change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// At most this many actions per round, all types together.
    #[serde(default = "default_max_actions")]
    #[schemars(range(min = 1, max = 100))]
    pub max_actions_per_round: i32,
    /// Seed for the random choices: each round draws from this seed and its
    /// round number, so a fixed seed gives reproducible rounds. Unset: a
    /// random seed per round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

fn default_max_actions() -> i32 {
    10
}

/// Counts of actions by type.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActionCounts {
    /// Pods killed.
    #[serde(default)]
    pub tantrum: i64,
    /// Deployments scaled up.
    #[serde(default)]
    pub cancer: i64,
    /// ConfigMaps rewritten with Lorem Ipsum.
    #[serde(default)]
    pub ipsum: i64,
}

/// What the last round did (or, in dry run, would have done).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoundReport {
    /// The round was a dry run: nothing was changed.
    #[serde(default)]
    pub dry_run: bool,
    /// The seed the round's choices were drawn with.
    #[serde(default)]
    pub seed: i64,
    /// Actions by type.
    #[serde(default)]
    pub counts: ActionCounts,
    /// Running Pods a tantrum could choose from.
    #[serde(default)]
    pub eligible_pods: i64,
    /// Fewer Running Pods than `podTolerance`: no tantrum.
    #[serde(default)]
    pub tantrum_held: bool,
    /// Actions drawn but dropped by `maxActionsPerRound`.
    #[serde(default)]
    pub capped: i64,
    /// The actions, one line each (at most 20).
    #[serde(default)]
    pub actions: Vec<String>,
    /// One line for humans.
    #[serde(default)]
    pub summary: String,
}

/// A failed round (or a failed attempt to run one).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoundError {
    /// The round it happened in.
    #[serde(default)]
    pub round: i64,
    /// When it was reported.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub at: jiff::Timestamp,
    /// The condition reason, e.g. `ActionFailed`.
    #[schemars(with = "String")]
    pub reason: Reason,
    /// What went wrong (trimmed).
    #[serde(default)]
    pub message: String,
}

/// The status of a ChaosAgent: the shared fields plus its rounds.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChaosAgentStatus {
    /// Conditions, last command, message.
    #[serde(flatten)]
    pub common: CommonStatus,
    /// Its rounds.
    #[serde(flatten)]
    pub round: RoundStatus,
}

/// What the rounds did, as recorded in status.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoundStatus {
    /// The number of the last round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<i64>,
    /// When the last round started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub last_round_at: Option<jiff::Timestamp>,
    /// What the last round did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_round: Option<RoundReport>,
    /// Actions of every round so far (dry runs excluded).
    #[serde(default)]
    pub total: ActionCounts,
    /// The last few errors, oldest first.
    #[serde(default)]
    pub last_errors: Vec<RoundError>,
}

/// Where an agent may act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Only in this namespace.
    Namespace(String),
    /// In every namespace that is neither protected nor excluded.
    Cluster,
}

/// What a reconcile found.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// No round is due yet: look again after this long.
    Idle(Duration),
    /// A round is due.
    Round(Box<RoundInput>),
}

/// Everything a round is planned from.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundInput {
    /// The agent, read afresh (its spec and status are authoritative).
    pub agent: ChaosAgent,
    /// When the round starts.
    pub now: jiff::Timestamp,
    /// The base seed (the spec's, or a random one).
    pub seed: u64,
    /// What the round may hit.
    pub targets: Targets,
}

/// Runs ChaosAgent rounds.
#[derive(Debug, Clone)]
pub struct ChaosAgentHandler {
    info: KindInfo<()>,
    /// The operator's own namespace: never touched.
    pub operator_namespace: Option<String>,
    /// The namespace the operator was started for (`--namespace`): the only
    /// one its agents act in.
    pub watch_namespace: Option<String>,
}

impl Default for ChaosAgentHandler {
    fn default() -> Self {
        Self::new(None, None)
    }
}

impl RustKind for ChaosAgentHandler {
    type Flags = NoFlags;

    fn from_flags(_: &NoFlags, context: &KindContext) -> Self {
        Self::new(
            context.operator_namespace.clone(),
            context.watch_namespace.clone(),
        )
    }
}

impl ChaosAgentHandler {
    /// A round's input: the targets in the agent's scope, listed now.
    async fn round_input(
        &self,
        agent: &ChaosAgent,
        client: &kube::Client,
        now: jiff::Timestamp,
    ) -> Result<Observed, HandlerError> {
        let scope = self.scope(agent)?;
        let wanted = ToList {
            pods: agent.spec.tantrum_mode,
            deployments: agent.spec.cancer_mode,
            config_maps: agent.spec.ipsum_mode,
            namespace: match &scope {
                Scope::Namespace(ns) => Some(ns.as_str()),
                Scope::Cluster => None,
            },
        };
        let targets = Targets::list(client, wanted, |ns| self.may_touch(agent, &scope, ns))
            .await
            .map_err(|e| {
                HandlerError::transient(Reason::ListFailed, crate::error_text::kube(&e))
            })?;
        let seed = agent
            .spec
            .seed
            .map_or_else(rand::random, i64::cast_unsigned);
        Ok(Observed::Round(Box::new(RoundInput {
            agent: agent.clone(),
            now,
            seed,
            targets,
        })))
    }

    /// The kind's short name.
    pub const NAME: &'static str = "chaosagent";

    /// A handler that never touches `operator_namespace` and, with
    /// `watch_namespace`, acts only there.
    pub fn new(operator_namespace: Option<String>, watch_namespace: Option<String>) -> Self {
        Self {
            info: KindInfo {
                // An agent owns nothing: its steps act on others' objects.
                // It owns nothing that has a health of its own.
                health: false,
                ..KindInfo::new(Self::NAME, "blackadder.io/kustomize-operator", ())
            },
            operator_namespace,
            watch_namespace,
        }
    }

    /// Where `agent` may act: its [`SCOPE_LABEL`] namespace if labelled,
    /// else the whole cluster; with `--namespace NS` only agents labelled
    /// for `NS` are acted on.
    pub fn scope(&self, agent: &ChaosAgent) -> Result<Scope, HandlerError> {
        let label = agent.labels().get(SCOPE_LABEL);
        match (&self.watch_namespace, label) {
            (Some(watch), Some(l)) if watch == l => Ok(Scope::Namespace(watch.clone())),
            (Some(watch), _) => Err(HandlerError::Invalid(format!(
                "this operator acts only in namespace {watch}: label the agent {SCOPE_LABEL}={watch}"
            ))),
            (None, Some(l)) => Ok(Scope::Namespace(l.clone())),
            (None, None) => Ok(Scope::Cluster),
        }
    }

    /// True when `agent` (acting in `scope`) may touch objects in `namespace`.
    pub fn may_touch(&self, agent: &ChaosAgent, scope: &Scope, namespace: &str) -> bool {
        let in_scope = match scope {
            Scope::Namespace(ns) => ns == namespace,
            Scope::Cluster => true,
        };
        in_scope
            && !namespace.is_empty()
            && !PROTECTED_NAMESPACES.contains(&namespace)
            && self.operator_namespace.as_deref() != Some(namespace)
            && !agent
                .spec
                .excluded_namespaces
                .iter()
                .any(|n| n == namespace)
    }
}

/// How long until the next round of `agent` is due, or `None` when it is due now.
pub fn next_round_in(agent: &ChaosAgent, now: jiff::Timestamp) -> Option<Duration> {
    let last = agent.status.as_ref().and_then(|s| s.round.last_round_at)?;
    let pause = pause(agent);
    let elapsed = now.duration_since(last);
    if elapsed.is_negative() {
        // The last round is in the future (clock skew): wait a full pause.
        return Some(pause.min(MAX_IDLE));
    }
    let remaining = pause.saturating_sub(elapsed.unsigned_abs());
    (!remaining.is_zero()).then(|| remaining.min(MAX_IDLE))
}

/// The agent's pause between rounds.
fn pause(agent: &ChaosAgent) -> Duration {
    Duration::from_secs(agent.spec.pause_duration.max(1).unsigned_abs())
}

impl Handler for ChaosAgentHandler {
    type Resource = ChaosAgent;
    type Observed = Observed;
    type Status = RoundStatus;

    fn info(&self) -> &KindInfo<()> {
        &self.info
    }

    fn api(&self, client: kube::Client, _namespace: Option<&str>) -> kube::Api<ChaosAgent> {
        // Cluster-scoped: the same API whatever namespace the operator watches.
        kube::Api::all(client)
    }

    fn watch_selector(&self, namespace: Option<&str>) -> Option<String> {
        namespace.map(|ns| format!("{SCOPE_LABEL}={ns}"))
    }

    fn common_status(&self, agent: &ChaosAgent) -> Option<CommonStatus> {
        agent.status.as_ref().map(|s| s.common.clone())
    }

    async fn observe(
        &self,
        agent: &ChaosAgent,
        client: &kube::Client,
    ) -> Result<Observed, HandlerError> {
        let now = jiff::Timestamp::now();
        if let Some(wait) = next_round_in(agent, now) {
            return Ok(Observed::Idle(wait));
        }
        self.round_input(agent, client, now).await
    }

    /// The next round as if it were due now (`diff` and `render` show it;
    /// they never carry it out).
    async fn observe_preview(
        &self,
        agent: &ChaosAgent,
        client: &kube::Client,
    ) -> Result<Observed, HandlerError> {
        self.round_input(agent, client, jiff::Timestamp::now())
            .await
    }

    fn observe_offline(
        &self,
        agent: &ChaosAgent,
        documents: &[serde_json::Value],
    ) -> Result<Observed, HandlerError> {
        Ok(Observed::Round(Box::new(RoundInput {
            agent: agent.clone(),
            now: jiff::Timestamp::now(),
            seed: agent.spec.seed.map_or(0, i64::cast_unsigned),
            targets: Targets::from_documents(documents)?,
        })))
    }

    fn plan(&self, _: &ChaosAgent, observed: &Observed) -> Result<Plan<RoundStatus>, HandlerError> {
        match observed {
            Observed::Idle(wait) => Ok(Plan::idle(*wait)),
            Observed::Round(input) => {
                let scope = self.scope(&input.agent)?;
                let mut plan = round::plan(input, |ns| self.may_touch(&input.agent, &scope, ns));
                plan.requeue_after = Some(pause(&input.agent).min(MAX_IDLE));
                Ok(plan)
            }
        }
    }

    /// A round leaves nothing of the agent's own behind to undo.
    fn retains(&self, _: &ChaosAgent) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
