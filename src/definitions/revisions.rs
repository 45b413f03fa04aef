//! A definition's revisions: every accepted change of its kind and files,
//! numbered from 1, the newest `rollout.keep` of them kept. In memory each
//! is a whole [`Generation`]; in the cluster each is a `ControllerRevision`
//! in the operator's namespace (its spec, digest and generation), owned by
//! the definition and carrying its marker, so a restarted operator serves
//! the same revisions and a rollback renders what it rendered before.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::generation::Generation;
use super::resource::{self, RevisionStatus};
use crate::kinds::declared::DeclaredKind;

/// One revision: its number and the generation that made it.
#[derive(Debug, Clone)]
pub struct Revision {
    /// From 1.
    pub number: u32,
    /// The generation accepted (its digest is the revision's).
    pub generation: Generation,
}

/// The revisions of one definition, oldest first.
#[derive(Debug, Clone, Default)]
pub struct History(Vec<Revision>);

impl History {
    /// The revisions, oldest first.
    pub fn revisions(&self) -> &[Revision] {
        &self.0
    }

    /// The revisions given (kept before), by number.
    pub fn from_revisions(mut revisions: Vec<Revision>) -> Self {
        revisions.sort_by_key(|r| r.number);
        revisions.dedup_by_key(|r| r.number);
        Self(revisions)
    }

    /// The latest revision.
    pub fn latest(&self) -> Option<&Revision> {
        self.0.last()
    }

    /// Adds `generation` as the next revision unless its kind and files are
    /// the latest's (then the latest takes its generation's number); keeps
    /// the newest `keep` and `stable`. Returns the revisions dropped.
    pub fn add(&mut self, generation: Generation, keep: u32, stable: Option<u32>) -> Vec<u32> {
        match self.0.last_mut() {
            Some(latest) if latest.generation.digest == generation.digest => {
                latest.generation.number = generation.number;
            }
            latest => {
                let number = latest.map_or(1, |r| r.number + 1);
                self.0.push(Revision { number, generation });
            }
        }
        let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX);
        let mut dropped = Vec::new();
        while self.0.len() > keep {
            let Some(oldest) = self.0.iter().position(|r| Some(r.number) != stable) else {
                break;
            };
            if oldest + 1 == self.0.len() {
                break;
            }
            dropped.push(self.0.remove(oldest).number);
        }
        dropped
    }

    /// The kinds of the revisions, by number.
    pub fn kinds(&self) -> BTreeMap<u32, Arc<DeclaredKind>> {
        (self.0.iter())
            .map(|r| (r.number, r.generation.kind.clone()))
            .collect()
    }

    /// The bytes the revisions hold together.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|r| r.generation.bytes).sum()
    }

    /// The bytes the revisions would hold with `generation` added as
    /// [`add`](Self::add) adds it (those it would drop left out).
    pub fn bytes_with(&self, generation: &Generation, keep: u32, stable: Option<u32>) -> usize {
        let mut after = self.clone();
        after.add(generation.clone(), keep, stable);
        after.bytes()
    }

    /// The revisions as the definition's status lists them, with how many
    /// resources each serves.
    pub fn status(&self, counts: &BTreeMap<u32, u64>) -> Vec<RevisionStatus> {
        (self.0.iter())
            .map(|r| RevisionStatus {
                revision: r.number,
                digest: r.generation.digest.chars().take(DIGEST_SHOWN).collect(),
                generation: r.generation.number,
                resources: counts.get(&r.number).copied().unwrap_or_default(),
            })
            .collect()
    }
}

/// How many hex digits of a revision's digest its status shows.
const DIGEST_SHOWN: usize = 12;

/// `1:99 2:1`: how many resources each revision serves, those serving
/// none left out.
pub fn on_revisions(counts: &BTreeMap<u32, u64>) -> String {
    let serving = counts.iter().filter(|(_, n)| **n > 0);
    let words: Vec<String> = serving.map(|(r, n)| format!("{r}:{n}")).collect();
    words.join(" ")
}

/// A revision as it is stored: what rebuilds its generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// Its number.
    pub number: u32,
    /// The definition's generation it was accepted at.
    pub generation: i64,
    /// The definition's spec then (without its rollout).
    pub spec: Value,
}

/// The ControllerRevisions of definitions, in one namespace.
#[derive(Debug, Clone)]
pub struct Store {
    api: Api<ControllerRevision>,
}

/// The field manager of the revisions' writes.
const MANAGER: &str = "kustomize-operator";

impl Store {
    /// The revisions kept in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }

    /// Writes `revision` of `definition` (server-side apply: writing it
    /// again changes nothing).
    pub async fn save(
        &self,
        definition: &kube::api::DynamicObject,
        revision: &Revision,
        spec: &Value,
    ) -> Result<(), kube::Error> {
        let name = object_name(&definition.name_any(), revision.number);
        let mut spec = spec.clone();
        if let Some(fields) = spec.as_object_mut() {
            fields.remove(crate::kinds::declared::pack::ROLLOUT_FIELD);
        }
        let object = ControllerRevision {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    resource::MARKER_LABEL.to_string(),
                    definition.name_any(),
                )])),
                owner_references: owner(definition).map(|o| vec![o]),
                ..Default::default()
            },
            revision: i64::from(revision.number),
            data: Some(RawExtension(json!({
                "digest": revision.generation.digest,
                "generation": revision.generation.number,
                "spec": spec,
            }))),
        };
        let params = PatchParams::apply(MANAGER).force();
        self.api
            .patch(&name, &params, &Patch::Apply(&object))
            .await?;
        Ok(())
    }

    /// The revisions stored for `definition` (this very object: one of an
    /// earlier definition of the same name is left out), oldest first.
    pub async fn load(
        &self,
        definition: &kube::api::DynamicObject,
    ) -> Result<Vec<Stored>, kube::Error> {
        let selector = format!("{}={}", resource::MARKER_LABEL, definition.name_any());
        let list = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let uid = definition.uid();
        let mut stored: Vec<Stored> = (list.items.into_iter())
            .filter(|r| {
                r.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
            })
            .filter_map(|r| {
                let data = r.data?.0;
                Some(Stored {
                    number: u32::try_from(r.revision).ok()?,
                    generation: data["generation"].as_i64().unwrap_or_default(),
                    spec: data.get("spec")?.clone(),
                })
            })
            .collect();
        stored.sort_by_key(|s| s.number);
        Ok(stored)
    }

    /// Deletes revision `number` of `definition`, if it is still there.
    pub async fn delete(&self, definition: &str, number: u32) -> Result<(), kube::Error> {
        let name = object_name(definition, number);
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The ControllerRevision of revision `number` of `definition`.
fn object_name(definition: &str, number: u32) -> String {
    format!("kinddefinition-{definition}-{number}")
}

/// The definition as the owner of its revisions (the garbage collector
/// removes them with it).
fn owner(definition: &kube::api::DynamicObject) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: format!("{}/{}", resource::GROUP, resource::VERSION),
        kind: resource::KIND.into(),
        name: definition.name_any(),
        uid: definition.uid()?,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    fn generation(number: i64, digest: &str) -> Generation {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("training/06-your-own-kind/greeting");
        let templates = ["resources/configmap.yaml".to_string()];
        let kind = DeclaredKind::load(&dir, &templates).expect("the lab's Greeting folder loads");
        Generation {
            number,
            crd: kind.crd(),
            kind: Arc::new(kind),
            object_types: BTreeSet::new(),
            bytes: 10,
            digest: digest.into(),
            conversions: None,
        }
    }

    fn numbers(history: &History) -> Vec<u32> {
        history.revisions().iter().map(|r| r.number).collect()
    }

    #[test]
    fn a_change_of_files_is_a_new_revision_and_a_change_of_rollout_is_not() {
        let mut history = History::default();
        assert!(history.add(generation(1, "a"), 5, None).is_empty());
        history.add(generation(2, "a"), 5, None);
        assert_eq!(numbers(&history), [1]);
        assert_eq!(history.latest().map(|r| r.generation.number), Some(2));
        history.add(generation(3, "b"), 5, None);
        assert_eq!(numbers(&history), [1, 2]);
        // Back to the first files: a new revision, not the old one again.
        history.add(generation(4, "a"), 5, None);
        assert_eq!(numbers(&history), [1, 2, 3]);
    }

    #[test]
    fn the_oldest_go_beyond_keep_but_never_the_stable_nor_the_latest() {
        let mut history = History::default();
        for (i, digest) in ["a", "b", "c", "d"].iter().enumerate() {
            history.add(generation(i as i64 + 1, digest), 2, Some(1));
        }
        assert_eq!(numbers(&history), [1, 4]);
        assert_eq!(history.add(generation(5, "e"), 1, None), [1, 4]);
        assert_eq!(numbers(&history), [5]);
        assert_eq!(history.bytes(), 10);
    }

    #[test]
    fn the_bytes_with_a_new_revision_count_those_kept_beside_it() {
        let mut history = History::default();
        for (i, digest) in ["a", "b", "c"].iter().enumerate() {
            history.add(generation(i as i64 + 1, digest), 5, None);
        }
        assert_eq!(history.bytes_with(&generation(4, "d"), 5, None), 40);
        assert_eq!(history.bytes_with(&generation(4, "d"), 2, None), 20);
        assert_eq!(history.bytes_with(&generation(4, "d"), 1, None), 10);
        // The stable one is kept beyond `keep`.
        assert_eq!(history.bytes_with(&generation(4, "d"), 1, Some(1)), 20);
        // The latest's files again: no new revision.
        assert_eq!(history.bytes_with(&generation(4, "c"), 5, None), 30);
        assert_eq!(history.bytes(), 30, "the history itself is unchanged");
    }

    #[test]
    fn the_status_counts_each_revision_and_the_column_those_serving() {
        let mut history = History::default();
        history.add(generation(1, "0123456789abcdef"), 5, None);
        history.add(generation(2, "fedcba9876543210"), 5, None);
        let counts = BTreeMap::from([(2, 1), (1, 99)]);
        let status = history.status(&counts);
        assert_eq!(status[0].digest, "0123456789ab");
        assert_eq!((status[0].resources, status[1].resources), (99, 1));
        assert_eq!(on_revisions(&counts), "1:99 2:1");
        assert_eq!(on_revisions(&BTreeMap::from([(1, 0), (2, 3)])), "2:3");
    }
}
