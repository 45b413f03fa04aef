//! The kinds served from definitions: each one a kind of the engine's one
//! runtime (a watch, not a controller of its own). Serving a
//! new generation replaces the kind's handler; the watch's first list
//! brings every resource of the kind to a reconcile with it, and those
//! whose overlay changed are applied again. The runtime also
//! counts each kind's resources in every namespace and shard, and the
//! definition is nudged when the count changes, so the count in its status
//! (which admission reads to refuse deleting a definition whose kind still
//! has resources) follows at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::generation::{Generation, Taken};
use super::revisions::History;
use crate::engine::host::Runtime;
use crate::kinds::declared::DeclaredHandler;
use crate::kinds::declared::rollout::{OnMove, Rollout, RolloutError, RolloutSpec};

/// Every kind served from a definition, by definition name.
pub struct Serving {
    runtime: Arc<Runtime>,
    served: Mutex<BTreeMap<String, Generation>>,
    /// Their revisions and the rollout serving them, by definition name.
    revisions: Mutex<BTreeMap<String, Revisions>>,
    /// Names of definitions whose kind's count changed.
    nudges: mpsc::Sender<String>,
    /// The definitions served as another replica serves them (automatic
    /// sharding): their kinds are not counted here.
    followed: Mutex<BTreeSet<String>>,
}

/// A definition's revisions, its rollout, and the rule serving them.
#[derive(Clone)]
pub struct Revisions {
    /// The revisions kept.
    pub history: History,
    /// The definition's `spec.rollout`.
    pub spec: RolloutSpec,
    /// The rule the kind's handler follows (and its counts).
    pub rollout: Arc<Rollout>,
}

/// What a kind is served from: a generation, the revisions kept with it,
/// the rollout over them, and its step.
pub struct ServedFrom {
    /// The generation served (the definition's latest accepted).
    pub generation: Generation,
    /// The revisions kept, `generation` among them.
    pub history: History,
    /// The definition's `spec.rollout`.
    pub spec: RolloutSpec,
    /// The automatic rollout's step reached (`None`: none).
    pub step: Option<usize>,
}

/// Whether this replica writes a definition or follows the one that does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Writer,
    Follower,
}

/// How many nudges may wait (more are dropped: the periodic look at each
/// definition counts again anyway).
pub const NUDGES_QUEUED: usize = 256;

impl Serving {
    /// An empty table over the runtime; changes of a kind's
    /// count are told on `nudges`.
    pub fn new(runtime: Arc<Runtime>, nudges: mpsc::Sender<String>) -> Self {
        Self {
            runtime,
            served: Mutex::default(),
            revisions: Mutex::default(),
            nudges,
            followed: Mutex::default(),
        }
    }

    /// The generation served for the definition `name`, if any.
    pub fn current(&self, name: &str) -> Option<Generation> {
        crate::sync::lock(&self.served).get(name).cloned()
    }

    /// True when the kind of `name` is served (its watch runs).
    pub fn running(&self, name: &str) -> bool {
        let kind = self.current(name).map(|g| g.kind.name().to_string());
        kind.is_some_and(|kind| self.runtime.running(&kind))
    }

    /// How many resources the kind served for `name` has, in every
    /// namespace, once its count watch listed them.
    pub fn resources(&self, name: &str) -> Option<u64> {
        let kind = self.current(name)?.kind.name().to_string();
        self.runtime.count(&kind)
    }

    /// The bytes of the definitions served (all their revisions), but
    /// for `name`'s.
    pub fn bytes_of_others(&self, name: &str) -> usize {
        let revisions = crate::sync::lock(&self.revisions);
        crate::sync::lock(&self.served)
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(other, g)| revisions.get(other).map_or(g.bytes, |r| r.history.bytes()))
            .sum()
    }

    /// The bytes `name` would hold with `generation` served beside the
    /// revisions it keeps (those `spec` drops left out): the new
    /// generation's own bytes when nothing was served for it before.
    pub fn bytes_kept_with(
        &self,
        name: &str,
        generation: &Generation,
        spec: &RolloutSpec,
    ) -> usize {
        let revisions = crate::sync::lock(&self.revisions);
        match revisions.get(name) {
            Some(r) => (r.history).bytes_with(generation, spec.keep(), spec.stable),
            None => generation.bytes,
        }
    }

    /// The revisions of `name` and the rollout serving them, once served.
    pub fn revisions(&self, name: &str) -> Option<Revisions> {
        crate::sync::lock(&self.revisions).get(name).cloned()
    }

    /// The names and CRDs of the kinds served for other definitions.
    pub fn taken_by_others(&self, name: &str) -> Vec<Taken> {
        crate::sync::lock(&self.served)
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(other, g)| Taken {
                name: g.kind.name().to_string(),
                crd: g.crd_name(),
                by: format!("the KindDefinition {other}"),
            })
            .collect()
    }

    /// Serves `generation` for `name`, the latest of `history`, each
    /// resource by the revision `spec` chooses (with steps, the latest to
    /// those of the steps up to `step`), in place of what served before;
    /// counts the kind's resources. Fails (and changes nothing) when the
    /// stable revision `spec` names is not kept, refused at restore or
    /// withdrawn, or its steps cannot run.
    pub async fn serve(
        &self,
        name: &str,
        generation: Generation,
        history: History,
        spec: RolloutSpec,
        step: Option<usize>,
    ) -> Result<(), RolloutError> {
        let served = ServedFrom {
            generation,
            history,
            spec,
            step,
        };
        self.serve_as(name, served, Role::Writer).await
    }

    /// Serves `name` as the replica writing its definition does ([`Serving::serve`]),
    /// without counting the kind's resources.
    pub async fn follow(&self, name: &str, served: ServedFrom) -> Result<(), RolloutError> {
        self.serve_as(name, served, Role::Follower).await
    }

    /// True when `name` is served as another replica serves it.
    pub fn follows(&self, name: &str) -> bool {
        crate::sync::lock(&self.followed).contains(name)
    }

    /// The names of the definitions served.
    pub fn names(&self) -> Vec<String> {
        crate::sync::lock(&self.served).keys().cloned().collect()
    }

    async fn serve_as(
        &self,
        name: &str,
        served: ServedFrom,
        role: Role,
    ) -> Result<(), RolloutError> {
        let ServedFrom {
            generation,
            history,
            spec,
            step,
        } = served;
        let nudge = self.nudge(name);
        let moved: OnMove = nudge.clone();
        let refused = history.refused_numbers();
        let rollout = Rollout::new(history.kinds(), &spec, &refused, Some(moved))?.at_step(step);
        let rollout = Arc::new(rollout);
        let revisions = Revisions {
            history,
            spec,
            rollout: rollout.clone(),
        };
        let handler = DeclaredHandler::with_rollout(rollout);
        let handler = handler.unwrap_or_else(|| DeclaredHandler::new(generation.kind.clone()));
        let on_count = (role == Role::Writer).then_some(nudge);
        self.replace(name, generation, handler, on_count).await;
        crate::sync::lock(&self.revisions).insert(name.to_string(), revisions);
        let mut followed = crate::sync::lock(&self.followed);
        match role {
            Role::Writer => followed.remove(name),
            Role::Follower => followed.insert(name.to_string()),
        };
        Ok(())
    }

    /// Serves `name` again as it was (its kind's watch had stopped).
    pub async fn serve_again(&self, name: &str) {
        let Some(generation) = self.current(name) else {
            return;
        };
        let Some(revisions) = self.revisions(name) else {
            return;
        };
        let step = revisions.rollout.step();
        let served = self
            .serve(name, generation, revisions.history, revisions.spec, step)
            .await;
        if let Err(e) = served {
            tracing::warn!(definition = name, error = %e, "cannot serve again");
        }
    }

    /// Serves `name` as it is, but with its automatic rollout's steps
    /// reached up to `step` (`None`: none), unless it serves so already.
    /// True when that moved the step.
    pub async fn serve_step(&self, name: &str, step: Option<usize>) -> bool {
        let (Some(generation), Some(revisions)) = (self.current(name), self.revisions(name)) else {
            return false;
        };
        if revisions.rollout.step() == step || revisions.rollout.steps().is_none() {
            return false;
        }
        let served = self
            .serve(name, generation, revisions.history, revisions.spec, step)
            .await;
        match served {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(definition = name, error = %e, "cannot serve the rollout's step");
                false
            }
        }
    }

    /// Asks the definition's controller to look at `name` now.
    pub fn nudge_now(&self, name: &str) {
        let _ = self.nudges.try_send(name.to_string());
    }

    /// Tells the definition's controller that `name` changed.
    fn nudge(&self, name: &str) -> Arc<dyn Fn() + Send + Sync> {
        let nudges = self.nudges.clone();
        let definition = name.to_string();
        Arc::new(move || {
            let _ = nudges.try_send(definition.clone());
        })
    }

    /// Serves `handler` for the kind of `generation`, stopping the kind
    /// served for `name` before if it is another.
    async fn replace(
        &self,
        name: &str,
        generation: Generation,
        handler: DeclaredHandler,
        on_count: Option<Arc<dyn Fn() + Send + Sync>>,
    ) {
        let previous = crate::sync::lock(&self.served).get(name).cloned();
        if let Some(previous) = previous.filter(|p| p.kind.name() != generation.kind.name()) {
            self.runtime.stop(previous.kind.name()).await;
        }
        tracing::info!(
            kind = generation.kind.name(),
            definition = name,
            generation = generation.number,
            "serving"
        );
        self.runtime.serve_kind(handler, on_count).await;
        crate::sync::lock(&self.served).insert(name.to_string(), generation);
    }

    /// Stops serving the kind of `name`, if it is served, and waits until
    /// its running reconciles finished.
    pub async fn stop(&self, name: &str) {
        let served = crate::sync::lock(&self.served).remove(name);
        crate::sync::lock(&self.revisions).remove(name);
        crate::sync::lock(&self.followed).remove(name);
        if let Some(generation) = served {
            self.runtime.stop(generation.kind.name()).await;
            tracing::info!(kind = generation.kind.name(), definition = name, "stopped");
        }
    }

    /// Stops every kind served from a definition.
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *crate::sync::lock(&self.served));
        crate::sync::lock(&self.revisions).clear();
        crate::sync::lock(&self.followed).clear();
        for generation in all.into_values() {
            self.runtime.stop(generation.kind.name()).await;
        }
    }
}
