//! Which changes to a resource start a reconcile.
//!
//! A reconcile's input is what the resource's author writes: its spec
//! (counted by `metadata.generation`), labels, annotations, finalizers and
//! deletion. A change to its status alone (the operator's own status
//! writes above all) starts nothing: otherwise a failing reconcile's status
//! write would start the next one at once, ahead of the backoff, and a
//! slow or failing provider would be asked again within milliseconds.
//! Resync, backoff and the kind's own interval come from the controller's
//! requeues, which this filter never sees.
//!
//! Per resource the filter keeps two hashes (16 bytes of payload): of its
//! UID, and of what starts a reconcile as last seen. With replicas sharing
//! the work, the second also hashes how many times this replica's share
//! changed: after a change every resource passes once, since one seen
//! before may have been skipped, or been another replica's, meanwhile.
//!
//! It also remembers the resources being deleted whose finalizer the
//! operator has removed: until the watch brings that removal, the cache
//! still shows the finalizer, and a reconcile started meanwhile (by the
//! deletion of an object it owned) would run the cleanup a second time.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher::Event;

use crate::partition::share::Share;

/// The last seen fingerprint of each resource's reconcile input.
#[derive(Debug, Default)]
pub(crate) struct Triggers {
    seen: Mutex<HashMap<u64, u64>>,
    finalized: Mutex<HashSet<u64>>,
    share: Option<Arc<Share>>,
}

impl Triggers {
    /// The filter of a controller whose watches follow `share` (if any).
    pub fn sharing(share: Option<Arc<Share>>) -> Self {
        Self {
            share,
            ..Self::default()
        }
    }

    /// True when `event` should reach the controller: a resource seen for
    /// the first time, or whose reconcile input changed; list markers and
    /// deletions pass (a deletion is forgotten here).
    pub fn admit<K: Resource>(&self, event: &Event<K>) -> bool {
        match event {
            Event::Apply(obj) | Event::InitApply(obj) => self.changed(obj.meta()),
            Event::Delete(obj) => {
                self.forget(obj.meta());
                true
            }
            Event::Init | Event::InitDone => true,
        }
    }

    /// Records `meta` as seen (the operator's own write of it, e.g. its
    /// finalizer, whose echo then starts nothing); true when it differs
    /// from what was seen before.
    pub fn changed(&self, meta: &ObjectMeta) -> bool {
        let epoch = self.share.as_ref().map_or(0, |s| s.epoch());
        let (key, print) = (identity(meta), fingerprint(meta, epoch));
        let mut seen = crate::sync::lock(&self.seen);
        seen.insert(key, print) != Some(print)
    }

    /// Records that the operator removed its finalizer from the resource
    /// `meta` describes, which is being deleted: nothing is left to do for
    /// it, whatever a stale cache says.
    pub fn finalized(&self, meta: &ObjectMeta) {
        crate::sync::lock(&self.finalized).insert(identity(meta));
    }

    /// True when the operator removed its finalizer from this resource.
    pub fn is_finalized(&self, meta: &ObjectMeta) -> bool {
        crate::sync::lock(&self.finalized).contains(&identity(meta))
    }

    fn forget(&self, meta: &ObjectMeta) {
        let key = identity(meta);
        let mut seen = crate::sync::lock(&self.seen);
        seen.remove(&key);
        if seen.is_empty() {
            seen.shrink_to_fit();
        }
        drop(seen);
        let mut finalized = crate::sync::lock(&self.finalized);
        if finalized.remove(&key) && finalized.is_empty() {
            finalized.shrink_to_fit();
        }
    }
}

/// The resource's UID (its namespace and name when it has none), hashed.
fn identity(meta: &ObjectMeta) -> u64 {
    let mut hasher = DefaultHasher::new();
    match &meta.uid {
        Some(uid) => uid.hash(&mut hasher),
        None => (&meta.namespace, &meta.name).hash(&mut hasher),
    }
    hasher.finish()
}

/// A hash of what starts a reconcile. Without a generation (a resource
/// with no status subresource counts every write), every version differs.
fn fingerprint(meta: &ObjectMeta, epoch: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    epoch.hash(&mut hasher);
    match meta.generation {
        Some(generation) => generation.hash(&mut hasher),
        None => meta.resource_version.hash(&mut hasher),
    }
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

    fn sample(generation: i64, version: &str, status: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "nuvolaris.org/v1",
            "kind": "Sample",
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "u-1",
                "generation": generation, "resourceVersion": version,
            },
            "spec": {"count": generation},
            "status": {"message": status},
        }))
        .unwrap()
    }

    #[test]
    fn a_finalized_resource_is_remembered_until_its_deletion() {
        let triggers = Triggers::default();
        let obj = sample(1, "10", "");
        assert!(!triggers.is_finalized(&obj.metadata));
        triggers.finalized(&obj.metadata);
        assert!(triggers.is_finalized(&obj.metadata));
        assert!(triggers.admit(&Event::Delete(obj.clone())));
        assert!(!triggers.is_finalized(&obj.metadata));
    }

    #[test]
    fn a_status_write_starts_nothing_a_spec_change_does() {
        let triggers = Triggers::default();
        assert!(triggers.admit(&Event::InitApply(sample(1, "10", ""))));
        // The operator's own status write: same generation, new version.
        assert!(!triggers.admit(&Event::Apply(sample(1, "11", "failed"))));
        assert!(!triggers.admit(&Event::Apply(sample(1, "12", "failed again"))));
        assert!(triggers.admit(&Event::Apply(sample(2, "13", "failed again"))));
    }

    #[test]
    fn metadata_the_author_writes_starts_a_reconcile() {
        let triggers = Triggers::default();
        let mut obj = sample(1, "10", "");
        assert!(triggers.admit(&Event::Apply(obj.clone())));
        obj.metadata.annotations = Some([("refresh".into(), "now".into())].into());
        assert!(triggers.admit(&Event::Apply(obj.clone())));
        obj.metadata.labels = Some([("shard".into(), "b".into())].into());
        assert!(triggers.admit(&Event::Apply(obj.clone())));
        obj.metadata.finalizers = Some(vec!["x".into()]);
        assert!(triggers.admit(&Event::Apply(obj.clone())));
        obj.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-25T00:00:00Z".parse().unwrap(),
            ));
        assert!(triggers.admit(&Event::Apply(obj)));
    }

    #[test]
    fn an_own_write_recorded_first_starts_nothing_and_deletions_are_forgotten() {
        let triggers = Triggers::default();
        let obj = sample(1, "10", "");
        assert!(triggers.admit(&Event::InitApply(obj.clone())));
        let mut with_finalizer = sample(1, "11", "");
        with_finalizer.metadata.finalizers = Some(vec!["mine".into()]);
        assert!(triggers.changed(&with_finalizer.metadata));
        assert!(!triggers.admit(&Event::Apply(with_finalizer.clone())));
        assert!(triggers.admit(&Event::Delete(with_finalizer.clone())));
        assert!(triggers.seen.lock().unwrap().is_empty());
        // The same name again (a new UID) is new.
        assert!(triggers.admit(&Event::Apply(with_finalizer)));
    }

    #[test]
    fn without_a_generation_every_version_counts() {
        let triggers = Triggers::default();
        let mut obj = sample(1, "10", "");
        obj.metadata.generation = None;
        assert!(triggers.admit(&Event::Apply(obj.clone())));
        obj.metadata.resource_version = Some("11".into());
        assert!(triggers.admit(&Event::Apply(obj)));
    }

    #[test]
    fn after_the_share_changes_every_resource_passes_once() {
        let share = Arc::new(Share::new());
        let triggers = Triggers::sharing(Some(share.clone()));
        let meta = ObjectMeta {
            uid: Some("u".into()),
            generation: Some(1),
            ..Default::default()
        };
        assert!(triggers.changed(&meta), "seen first");
        assert!(!triggers.changed(&meta), "unchanged");
        share.set(crate::partition::share::Slots::ALL);
        assert!(triggers.changed(&meta), "the share changed: it passes once");
        assert!(!triggers.changed(&meta));
        share.set(crate::partition::share::Slots::ALL);
        assert!(!triggers.changed(&meta), "the same slots: no change");
    }
}
