//! The kinds served from definitions: each one a kind of the engine's one
//! dynamic controller (a watch, not a controller of its own). Serving a
//! new generation replaces the kind's handler; the watch's first list
//! brings every resource of the kind to a reconcile with it, and those
//! whose overlay changed are applied again. The dynamic controller also
//! counts each kind's resources in every namespace and shard, and the
//! definition is nudged when the count changes, so the count in its status
//! (which admission reads to refuse deleting a definition whose kind still
//! has resources) follows at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::generation::{Generation, Taken};
use crate::engine::host::{Dynamic, OnCount};
use crate::kinds::declared::DeclaredHandler;

/// Every kind served from a definition, by definition name.
pub struct Serving {
    dynamic: Arc<Dynamic<DeclaredHandler>>,
    served: Mutex<BTreeMap<String, Generation>>,
    /// Names of definitions whose kind's count changed.
    nudges: mpsc::Sender<String>,
}

/// How many nudges may wait (more are dropped: the periodic look at each
/// definition counts again anyway).
pub const NUDGES_QUEUED: usize = 256;

impl Serving {
    /// An empty table over the dynamic controller; changes of a kind's
    /// count are told on `nudges`.
    pub fn new(dynamic: Arc<Dynamic<DeclaredHandler>>, nudges: mpsc::Sender<String>) -> Self {
        Self {
            dynamic,
            served: Mutex::default(),
            nudges,
        }
    }

    /// The generation served for the definition `name`, if any.
    pub fn current(&self, name: &str) -> Option<Generation> {
        crate::sync::lock(&self.served).get(name).cloned()
    }

    /// True when the kind of `name` is served (its watch runs).
    pub fn running(&self, name: &str) -> bool {
        let kind = self.current(name).map(|g| g.kind.name().to_string());
        kind.is_some_and(|kind| self.dynamic.running(&kind))
    }

    /// How many resources the kind served for `name` has, in every
    /// namespace, once its count watch listed them.
    pub fn resources(&self, name: &str) -> Option<u64> {
        let kind = self.current(name)?.kind.name().to_string();
        self.dynamic.count(&kind)
    }

    /// The bytes of the definitions served, but for `name`'s.
    pub fn bytes_of_others(&self, name: &str) -> usize {
        crate::sync::lock(&self.served)
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(_, g)| g.bytes)
            .sum()
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

    /// Serves `generation` for `name`, in place of the generation before.
    pub async fn serve(&self, name: &str, generation: Generation) {
        let nudges = self.nudges.clone();
        let definition = name.to_string();
        let on_count: OnCount = Arc::new(move || {
            let _ = nudges.try_send(definition.clone());
        });
        let previous = crate::sync::lock(&self.served).get(name).cloned();
        if let Some(previous) = previous.filter(|p| p.kind.name() != generation.kind.name()) {
            self.dynamic.stop(previous.kind.name()).await;
        }
        tracing::info!(
            kind = generation.kind.name(),
            definition = name,
            generation = generation.number,
            "serving"
        );
        let handler = DeclaredHandler::new(generation.kind.clone());
        self.dynamic.serve(handler, Some(on_count)).await;
        crate::sync::lock(&self.served).insert(name.to_string(), generation);
    }

    /// Stops serving the kind of `name`, if it is served, and waits until
    /// its running reconciles finished.
    pub async fn stop(&self, name: &str) {
        let served = crate::sync::lock(&self.served).remove(name);
        if let Some(generation) = served {
            self.dynamic.stop(generation.kind.name()).await;
            tracing::info!(kind = generation.kind.name(), definition = name, "stopped");
        }
    }

    /// Stops every kind served from a definition.
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *crate::sync::lock(&self.served));
        for generation in all.into_values() {
            self.dynamic.stop(generation.kind.name()).await;
        }
    }
}
