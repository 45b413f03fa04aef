//! The ring's table: which member holds which slot, in one ConfigMap
//! (`<ring>-shards`) a person can read. Every change is a compare-and-swap
//! on its resourceVersion, so no two members ever hold a slot at once: a
//! member takes a slot only from the table as it stands, free or held by
//! a member no longer live, and gives one back only once no reconcile of
//! its runs in it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::members::RING_LABEL;
use crate::partition::share::Slots;

/// The prefix of a member's key in the table's data.
const OWNER_PREFIX: &str = "owner.";
/// The key of the slots free and since when.
const FREED_KEY: &str = "freed";

/// Who holds what, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The slots each member holds.
    pub owners: BTreeMap<String, Slots>,
    /// When each free slot was given back.
    pub freed: BTreeMap<usize, Timestamp>,
}

impl Table {
    /// The table in a ConfigMap's data (what does not parse is left out:
    /// its slots count as free).
    pub fn from_data(data: &BTreeMap<String, String>) -> Self {
        let owners = data
            .iter()
            .filter_map(|(key, value)| {
                let member = key.strip_prefix(OWNER_PREFIX)?;
                Some((member.to_string(), value.parse().ok()?))
            })
            .collect();
        let freed = data
            .get(FREED_KEY)
            .map(|text| {
                text.split(',')
                    .filter_map(|entry| {
                        let (slot, at) = entry.trim().split_once('@')?;
                        Some((slot.parse().ok()?, at.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self { owners, freed }
    }

    /// The table as a ConfigMap's data.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let mut data: BTreeMap<String, String> = self
            .owners
            .iter()
            .filter(|(_, slots)| !slots.is_empty())
            .map(|(member, slots)| (format!("{OWNER_PREFIX}{member}"), slots.to_string()))
            .collect();
        if !self.freed.is_empty() {
            let freed: Vec<String> = self
                .freed
                .iter()
                .map(|(s, at)| format!("{s}@{at}"))
                .collect();
            data.insert(FREED_KEY.into(), freed.join(","));
        }
        data
    }

    /// The slots `member` holds.
    pub fn held_by(&self, member: &str) -> Slots {
        self.owners.get(member).copied().unwrap_or_default()
    }

    /// The member holding `slot`, if any.
    pub fn owner_of(&self, slot: usize) -> Option<&str> {
        self.owners
            .iter()
            .find(|(_, slots)| slots.has(slot))
            .map(|(member, _)| member.as_str())
    }

    /// The slots of `wanted` that `member` may take now: free, or held by
    /// a member not in `live`.
    pub fn takeable(&self, wanted: Slots, live: &BTreeSet<String>) -> Slots {
        wanted
            .iter()
            .filter(|&s| self.owner_of(s).is_none_or(|owner| !live.contains(owner)))
            .fold(Slots::NONE, Slots::with)
    }

    /// Gives `slots` of `member` back, free from `at`.
    pub fn give_back(&mut self, member: &str, slots: Slots, at: Timestamp) {
        if let Some(held) = self.owners.get_mut(member) {
            *held = held.minus(slots);
        }
        for slot in slots.iter() {
            self.freed.insert(slot, at);
        }
        self.owners.retain(|_, held| !held.is_empty());
    }

    /// `member` takes `slots`; returns since when each was without a
    /// working owner: when it was given back, or when its last owner
    /// (gone) last renewed, as `renewed` says.
    pub fn take(
        &mut self,
        member: &str,
        slots: Slots,
        renewed: &BTreeMap<String, Timestamp>,
    ) -> Vec<Option<Timestamp>> {
        let mut since = Vec::new();
        for slot in slots.iter() {
            let previous = self.owner_of(slot).map(str::to_string);
            since.push(match previous {
                Some(owner) => renewed.get(&owner).copied(),
                None => self.freed.get(&slot).copied(),
            });
            for held in self.owners.values_mut() {
                *held = held.minus(Slots::NONE.with(slot));
            }
            self.freed.remove(&slot);
        }
        let held = self.owners.entry(member.to_string()).or_default();
        *held = held.union(slots);
        self.owners.retain(|_, held| !held.is_empty());
        since
    }

    /// The slots no member holds.
    pub fn free(&self) -> Slots {
        let held = self.owners.values().fold(Slots::NONE, |a, s| a.union(*s));
        Slots::ALL.minus(held)
    }
}

/// The ConfigMap holding `ring`'s table.
pub fn config_map_name(ring: &str) -> String {
    format!("{ring}-shards")
}

/// Reads and writes the table.
#[derive(Debug, Clone)]
pub struct TableStore {
    api: Api<ConfigMap>,
    ring: String,
}

/// The table as read, with the object it came from (absent: none yet).
pub type Read = (Table, Option<ConfigMap>);

impl TableStore {
    /// The table of `ring` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, ring: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            ring: ring.to_string(),
        }
    }

    /// Reads the table (empty when there is none yet).
    pub async fn read(&self) -> Result<Read, kube::Error> {
        let found = self.api.get_opt(&config_map_name(&self.ring)).await?;
        let table = found
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .map(Table::from_data)
            .unwrap_or_default();
        Ok((table, found))
    }

    /// Writes `table` over `base` (the object it was read from) if nobody
    /// changed it since; false when somebody did (read again).
    pub async fn write(&self, table: &Table, base: Option<ConfigMap>) -> Result<bool, kube::Error> {
        let written = match base {
            Some(mut cm) => {
                cm.data = Some(table.to_data());
                // Its resourceVersion makes the replace a compare-and-swap.
                self.api
                    .replace(&config_map_name(&self.ring), &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(config_map_name(&self.ring)),
                        labels: Some([(RING_LABEL.to_string(), self.ring.clone())].into()),
                        ..Default::default()
                    },
                    data: Some(table.to_data()),
                    ..Default::default()
                };
                self.api.create(&PostParams::default(), &cm).await
            }
        };
        match written {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::share::SLOTS;

    fn live(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_slot_is_taken_only_free_or_from_a_member_gone() {
        let mut table = Table::default();
        let first = Slots::NONE.with(0).with(1).with(2);
        assert_eq!(table.takeable(first, &live(&["a"])), first);
        table.take("a", first, &BTreeMap::new());
        assert_eq!(table.held_by("a"), first);
        assert_eq!(
            table.takeable(first, &live(&["a", "b"])),
            Slots::NONE,
            "a is live"
        );
        assert_eq!(table.takeable(first, &live(&["b"])), first, "a is gone");
        let at: Timestamp = "2026-11-28T06:00:00Z".parse().unwrap();
        table.give_back("a", Slots::NONE.with(2), at);
        assert_eq!(
            table.takeable(first, &live(&["a", "b"])),
            Slots::NONE.with(2)
        );
        let since = table.take("b", Slots::NONE.with(2), &BTreeMap::new());
        assert_eq!(since, vec![Some(at)], "unowned since it was given back");
        assert_eq!(table.owner_of(2), Some("b"));
        assert_eq!(table.free().len(), SLOTS - 3);
    }

    #[test]
    fn the_table_reads_back_what_it_wrote() {
        let mut table = Table::default();
        table.take("op-1", Slots::NONE.with(0).with(1), &BTreeMap::new());
        table.give_back(
            "op-1",
            Slots::NONE.with(1),
            "2026-11-28T06:00:00Z".parse().unwrap(),
        );
        let data = table.to_data();
        assert_eq!(data["owner.op-1"], "0");
        assert_eq!(data["freed"], "1@2026-11-28T06:00:00Z");
        assert_eq!(Table::from_data(&data), table);
    }
}
