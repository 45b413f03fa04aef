//! Starting the watches of owned objects early. When the operator starts
//! with resources already in the cluster, the kinds their inventories name
//! are watched while the resources are still being listed, so the two
//! lists run at once instead of one after the other.

use std::collections::HashSet;
use std::sync::Arc;

use kube::runtime::watcher;

use crate::engine::contract::Handler;
use crate::engine::model::inventory::{Inventory, ObjectId};
use crate::engine::reconcile::runtime::Engine;

/// A kind of owned object in one namespace: `apps/v1`, `Deployment`, namespace.
type KindIn = (String, String, Option<String>);

/// Reads the inventories of the resources in a controller's first list and
/// starts the watch of each kind they name, once.
pub(crate) struct Primer<H: Handler> {
    engine: Arc<Engine>,
    handler: Arc<H>,
    started: HashSet<KindIn>,
}

impl<H: Handler> Primer<H> {
    /// A primer for the controller of `handler`'s kind.
    pub fn new(engine: Arc<Engine>, handler: Arc<H>) -> Self {
        Self {
            engine,
            handler,
            started: HashSet::new(),
        }
    }

    /// Looks at one event of the controller's watch: objects of its first
    /// list start the watches their inventory needs. Later events are left
    /// to the reconciles, which start watches as they need them.
    pub fn see(&mut self, event: &watcher::Event<H::Resource>) {
        let watcher::Event::InitApply(resource) = event else {
            return;
        };
        let Some(inventory) = (self.handler.common_status(resource)).and_then(|s| s.inventory)
        else {
            return;
        };
        for id in new_kinds(&mut self.started, inventory) {
            let engine = self.engine.clone();
            tokio::spawn(async move { engine.objects.prime(&id).await });
        }
    }
}

/// One object of each kind (in each namespace) that `inventory` names and
/// `started` does not hold yet; `started` holds them afterwards.
fn new_kinds(started: &mut HashSet<KindIn>, inventory: Inventory) -> Vec<ObjectId> {
    inventory
        .objects
        .into_iter()
        .filter_map(|group| {
            let name = group.names.into_iter().next()?;
            let kind_in = (group.api_version, group.kind, group.namespace);
            started.insert(kind_in.clone()).then_some(ObjectId {
                api_version: kind_in.0,
                kind: kind_in.1,
                namespace: kind_in.2,
                name,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::inventory::InventoryGroup;

    fn group(kind: &str, namespace: &str, names: &[&str]) -> InventoryGroup {
        InventoryGroup {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some(namespace.into()),
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn inventory(groups: Vec<InventoryGroup>) -> Inventory {
        Inventory {
            count: 0,
            objects: groups,
        }
    }

    #[test]
    fn each_kind_in_each_namespace_is_started_once() {
        let mut started = HashSet::new();
        let first = inventory(vec![
            group("Service", "a", &["web", "api"]),
            group("ConfigMap", "a", &["conf"]),
        ]);
        let ids = new_kinds(&mut started, first);
        let named: Vec<_> = ids
            .iter()
            .map(|id| (id.kind.as_str(), id.name.as_str()))
            .collect();
        assert_eq!(named, [("Service", "web"), ("ConfigMap", "conf")]);

        let second = inventory(vec![
            group("Service", "a", &["db"]),
            group("Service", "b", &["db"]),
        ]);
        let ids = new_kinds(&mut started, second);
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].namespace.as_deref(), Some("b"));
    }

    #[test]
    fn a_group_without_names_starts_nothing() {
        let mut started = HashSet::new();
        assert!(new_kinds(&mut started, inventory(vec![group("Service", "a", &[])])).is_empty());
        assert!(started.is_empty());
    }
}
