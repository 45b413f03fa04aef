//! Revisions of a kind defined in the cluster, and which one serves each
//! resource. Every accepted change of a definition's files is a revision
//! (numbered from 1); the definition's `rollout` says which revision is
//! stable and which resources try the latest first:
//!
//! 1. a resource labelled [`PIN_LABEL`] is served by that revision;
//! 2. one carrying every `canary` label, by the latest;
//! 3. every other one, by `stable` (default: the latest).
//!
//! A revision is the whole kind as it was accepted (its templates, recipe
//! and expressions), so a resource moved back to it renders byte for byte
//! what it rendered then.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DeclaredKind;
use super::references::Key;

/// The label that pins a resource to one revision of its definition
/// (`"3"`).
pub const PIN_LABEL: &str = "kustomize-operator.io/revision";

/// How many revisions a definition keeps unless its rollout says.
pub const KEEP_DEFAULT: u32 = 5;
/// The most revisions a definition may keep.
pub const KEEP_MAX: u32 = 10;

/// A definition's `spec.rollout`: which revision serves which resources.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutSpec {
    /// The revision serving every resource neither pinned nor in the
    /// canary (default: the latest). An older kept revision rolls back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub stable: Option<u32>,
    /// Labels: a resource carrying all of them is served by the latest
    /// revision while `stable` stays where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<BTreeMap<String, String>>,
    /// How many revisions are kept, the latest among them (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = KEEP_MAX))]
    pub keep: Option<u32>,
}

impl RolloutSpec {
    /// How many revisions are kept.
    pub fn keep(&self) -> u32 {
        self.keep.unwrap_or(KEEP_DEFAULT).clamp(1, KEEP_MAX)
    }
}

/// A pinned or stable revision that is not kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is not a kept revision (kept: {})", kept_list(.kept))]
pub struct NotKept {
    /// What asked for it (`the label kustomize-operator.io/revision=9`).
    pub what: String,
    /// The revisions kept.
    pub kept: Vec<u32>,
}

fn kept_list(kept: &[u32]) -> String {
    let numbers: Vec<String> = kept.iter().map(ToString::to_string).collect();
    numbers.join(", ")
}

/// Told when a resource moved to another revision.
pub type OnMove = Arc<dyn Fn() + Send + Sync>;

/// The revisions a kind is served from and the rule choosing among them;
/// remembers which revision each resource was last planned with.
pub struct Rollout {
    revisions: BTreeMap<u32, Arc<DeclaredKind>>,
    latest: u32,
    stable: u32,
    canary: BTreeMap<String, String>,
    on: Mutex<HashMap<Key, u32>>,
    moved: Option<OnMove>,
}

impl std::fmt::Debug for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout")
            .field("kept", &self.revisions.keys().collect::<Vec<_>>())
            .field("latest", &self.latest)
            .field("stable", &self.stable)
            .field("canary", &self.canary)
            .finish_non_exhaustive()
    }
}

impl Rollout {
    /// The rule of `spec` over the kept `revisions` (by number; not empty).
    /// Fails when `spec.stable` is not kept.
    pub fn new(
        revisions: BTreeMap<u32, Arc<DeclaredKind>>,
        spec: &RolloutSpec,
        moved: Option<OnMove>,
    ) -> Result<Self, NotKept> {
        let latest = revisions.keys().next_back().copied().unwrap_or_default();
        let stable = spec.stable.unwrap_or(latest);
        if !revisions.contains_key(&stable) {
            return Err(NotKept {
                what: format!("spec.rollout.stable {stable}"),
                kept: revisions.keys().copied().collect(),
            });
        }
        Ok(Self {
            revisions,
            latest,
            stable,
            canary: spec.canary.clone().unwrap_or_default(),
            on: Mutex::default(),
            moved,
        })
    }

    /// The latest revision's number.
    pub fn latest(&self) -> u32 {
        self.latest
    }

    /// The latest revision.
    pub fn latest_kind(&self) -> Option<&Arc<DeclaredKind>> {
        self.revisions.get(&self.latest)
    }

    /// Every kept revision, oldest first: each may serve a resource (the
    /// stable one, the latest for the canary, any for a pinned resource).
    pub fn kinds(&self) -> impl Iterator<Item = &Arc<DeclaredKind>> {
        self.revisions.values()
    }

    /// The stable revision's number.
    pub fn stable(&self) -> u32 {
        self.stable
    }

    /// The revision serving a resource with these labels.
    pub fn choose(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<(u32, &Arc<DeclaredKind>), NotKept> {
        let number = match labels.get(PIN_LABEL) {
            Some(pinned) => pinned
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| self.revisions.contains_key(n))
                .ok_or_else(|| NotKept {
                    what: format!("the label {PIN_LABEL}={pinned:?}"),
                    kept: self.revisions.keys().copied().collect(),
                })?,
            None if self.in_canary(labels) => self.latest,
            None => self.stable,
        };
        let kind = self.revisions.get(&number).ok_or_else(|| NotKept {
            what: format!("revision {number}"),
            kept: self.revisions.keys().copied().collect(),
        })?;
        Ok((number, kind))
    }

    fn in_canary(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.canary.is_empty() && self.canary.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// Records that the resource `key` was planned with `revision`; tells
    /// when that moved it.
    pub fn record(&self, key: Key, revision: u32) {
        let before = crate::sync::lock(&self.on).insert(key, revision);
        if before != Some(revision)
            && let Some(moved) = &self.moved
        {
            moved();
        }
    }

    /// Forgets a resource that is gone.
    pub fn forget(&self, key: &Key) {
        crate::sync::lock(&self.on).remove(key);
    }

    /// How many resources each revision served at their last plan.
    pub fn counts(&self) -> BTreeMap<u32, u64> {
        let mut counts = BTreeMap::new();
        for revision in crate::sync::lock(&self.on).values() {
            *counts.entry(*revision).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(numbers: &[u32]) -> BTreeMap<u32, Arc<DeclaredKind>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("training/06-your-own-kind/greeting");
        let templates = ["resources/configmap.yaml".to_string()];
        let kind = DeclaredKind::load(&dir, &templates).expect("the lab's Greeting folder loads");
        let kind = Arc::new(kind);
        numbers.iter().map(|n| (*n, kind.clone())).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn chosen(rollout: &Rollout, pairs: &[(&str, &str)]) -> Result<u32, NotKept> {
        rollout.choose(&labels(pairs)).map(|(n, _)| n)
    }

    #[test]
    fn the_latest_serves_all_unless_told_otherwise() {
        let rollout = Rollout::new(kinds(&[1, 2, 3]), &RolloutSpec::default(), None).unwrap();
        assert_eq!((rollout.latest(), rollout.stable()), (3, 3));
        assert_eq!(chosen(&rollout, &[]), Ok(3));
        assert_eq!(chosen(&rollout, &[("track", "canary")]), Ok(3));
    }

    #[test]
    fn the_canary_takes_the_latest_the_rest_the_stable_a_pin_its_own() {
        let spec = RolloutSpec {
            stable: Some(1),
            canary: Some(labels(&[("track", "canary"), ("team", "a")])),
            keep: None,
        };
        let rollout = Rollout::new(kinds(&[1, 2, 3]), &spec, None).unwrap();
        assert_eq!(chosen(&rollout, &[]), Ok(1));
        assert_eq!(chosen(&rollout, &[("track", "canary")]), Ok(1));
        assert_eq!(
            chosen(&rollout, &[("track", "canary"), ("team", "a")]),
            Ok(3)
        );
        let pinned = [(PIN_LABEL, "2"), ("track", "canary"), ("team", "a")];
        assert_eq!(chosen(&rollout, &pinned), Ok(2));
    }

    #[test]
    fn a_revision_not_kept_is_refused_naming_what_asked_and_what_is_kept() {
        let spec = RolloutSpec {
            stable: Some(9),
            ..RolloutSpec::default()
        };
        let err = Rollout::new(kinds(&[4, 5]), &spec, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.rollout.stable 9 is not a kept revision (kept: 4, 5)"
        );
        let rollout = Rollout::new(kinds(&[4, 5]), &RolloutSpec::default(), None).unwrap();
        let err = chosen(&rollout, &[(PIN_LABEL, "two")]).unwrap_err();
        assert!(err.to_string().contains(r#"revision="two""#), "{err}");
        assert!(chosen(&rollout, &[(PIN_LABEL, "3")]).is_err());
    }

    #[test]
    fn a_move_is_told_and_counted_once() {
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = told.clone();
        let moved: OnMove = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let rollout = Rollout::new(kinds(&[1, 2]), &RolloutSpec::default(), Some(moved)).unwrap();
        let key = |name: &str| (Some("ns".to_string()), name.to_string());
        rollout.record(key("a"), 2);
        rollout.record(key("a"), 2);
        rollout.record(key("b"), 1);
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(rollout.counts(), BTreeMap::from([(1, 1), (2, 1)]));
        rollout.forget(&key("b"));
        assert_eq!(rollout.counts(), BTreeMap::from([(2, 1)]));
        assert_eq!(RolloutSpec::default().keep(), KEEP_DEFAULT);
    }
}
