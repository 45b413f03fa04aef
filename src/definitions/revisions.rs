//! A definition's revisions: every accepted change of its kind and files,
//! numbered from 1, the newest `rollout.keep` of them kept. In memory each
//! is a whole [`Generation`]; in the cluster each is a `ControllerRevision`
//! in the operator's namespace (its spec, digest, generation and
//! signature), owned by the definition and carrying its marker, so a
//! restarted operator serves the same revisions and a rollback renders
//! what it rendered before.
//!
//! A restarted operator serves a stored revision only if it is one it
//! kept ([`verify`]): the digest of its spec is the one it claims, the
//! operator's key signed it ([`super::signing`]), and the definition's
//! status records it with that digest. Any other is refused ([`Refused`]),
//! reported, and never served.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::generation::{self, Generation};
use super::resource::{self, RevisionStatus};
use super::signing::{Claim, KeyError, Signer};
use crate::kinds::declared::DeclaredKind;

/// One revision: its number and the generation that made it.
#[derive(Debug, Clone)]
pub struct Revision {
    /// From 1.
    pub number: u32,
    /// The generation accepted (its digest is the revision's).
    pub generation: Generation,
}

/// The revisions of one definition, oldest first, and those refused
/// when they were restored.
#[derive(Debug, Clone, Default)]
pub struct History {
    revisions: Vec<Revision>,
    refused: Vec<Refused>,
}

/// A stored revision the operator does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The ControllerRevision's name.
    pub name: String,
    /// The number it claims.
    pub number: u32,
    /// Why.
    pub why: Tampered,
}

impl History {
    /// The revisions, oldest first.
    pub fn revisions(&self) -> &[Revision] {
        &self.revisions
    }

    /// The revisions given (kept before), by number, and those `refused`.
    pub fn from_revisions(mut revisions: Vec<Revision>, refused: Vec<Refused>) -> Self {
        revisions.sort_by_key(|r| r.number);
        revisions.dedup_by_key(|r| r.number);
        Self { revisions, refused }
    }

    /// The latest revision.
    pub fn latest(&self) -> Option<&Revision> {
        self.revisions.last()
    }

    /// The stored revisions refused at restore.
    pub fn refused(&self) -> &[Refused] {
        &self.refused
    }

    /// Why each refused number was refused (numbers kept left out).
    pub fn refused_numbers(&self) -> BTreeMap<u32, String> {
        let kept = |n: u32| self.revisions.iter().any(|r| r.number == n);
        (self.refused.iter())
            .filter(|r| !kept(r.number))
            .map(|r| (r.number, r.why.to_string()))
            .collect()
    }

    /// Adds `generation` as the next revision unless its kind and files are
    /// the latest's (then the latest takes its generation's number); keeps
    /// the newest `keep` and `stable`. Returns the revisions dropped. A new
    /// revision's number is above every number stored, refused ones too.
    pub fn add(&mut self, generation: Generation, keep: u32, stable: Option<u32>) -> Vec<u32> {
        let highest = (self.revisions.iter().map(|r| r.number))
            .chain(self.refused.iter().map(|r| r.number))
            .max()
            .unwrap_or(0);
        match self.revisions.last_mut() {
            Some(latest) if latest.generation.digest == generation.digest => {
                latest.generation.number = generation.number;
            }
            _ => {
                let number = highest.saturating_add(1);
                // Written under its name, the genuine one replaces it.
                self.refused.retain(|r| r.number != number);
                self.revisions.push(Revision { number, generation });
            }
        }
        let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX);
        let mut dropped = Vec::new();
        while self.revisions.len() > keep {
            let Some(oldest) = self.revisions.iter().position(|r| Some(r.number) != stable) else {
                break;
            };
            if oldest + 1 == self.revisions.len() {
                break;
            }
            dropped.push(self.revisions.remove(oldest).number);
        }
        dropped
    }

    /// The kinds of the revisions, by number.
    pub fn kinds(&self) -> BTreeMap<u32, Arc<DeclaredKind>> {
        (self.revisions.iter())
            .map(|r| (r.number, r.generation.kind.clone()))
            .collect()
    }

    /// The bytes the revisions hold together.
    pub fn bytes(&self) -> usize {
        self.revisions.iter().map(|r| r.generation.bytes).sum()
    }

    /// The bytes the revisions would hold with `generation` added as
    /// [`add`](Self::add) adds it (those it would drop left out).
    pub fn bytes_with(&self, generation: &Generation, keep: u32, stable: Option<u32>) -> usize {
        let mut after = self.clone();
        after.add(generation.clone(), keep, stable);
        after.bytes()
    }

    /// The revisions as the definition's status lists them (the whole
    /// digest: a restarted operator compares it), with how many resources
    /// each serves.
    pub fn status(&self, counts: &BTreeMap<u32, u64>) -> Vec<RevisionStatus> {
        (self.revisions.iter())
            .map(|r| RevisionStatus {
                revision: r.number,
                digest: r.generation.digest.clone(),
                generation: r.generation.number,
                resources: counts.get(&r.number).copied().unwrap_or_default(),
            })
            .collect()
    }
}

/// `1:99 2:1`: how many resources each revision serves, those serving
/// none left out.
pub fn on_revisions(counts: &BTreeMap<u32, u64>) -> String {
    let serving = counts.iter().filter(|(_, n)| **n > 0);
    let words: Vec<String> = serving.map(|(r, n)| format!("{r}:{n}")).collect();
    words.join(" ")
}

/// A revision as it is stored: what rebuilds its generation, and what
/// it claims to be.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The ControllerRevision's name.
    pub name: String,
    /// Its number.
    pub number: u32,
    /// The definition's generation it was accepted at.
    pub generation: i64,
    /// The definition's spec then (without its rollout).
    pub spec: Value,
    /// The digest it claims for its spec.
    pub digest: Option<String>,
    /// The operator's signature, if it has one.
    pub signature: Option<String>,
}

/// Why a stored revision is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Tampered {
    /// The digest of its spec is not the one it claims.
    #[error("its spec's digest is not the one it claims")]
    Digest,
    /// It carries no signature.
    #[error(
        "it carries no signature (written by someone else, or kept by an operator that did not sign revisions)"
    )]
    Unsigned,
    /// Its signature is not the operator's key's.
    #[error(
        "its signature is not the operator's (written or changed by someone without the operator's key, or signed with a key since replaced)"
    )]
    Signature,
    /// The definition's status does not list it with its digest.
    #[error("the definition's status records no revision {number} of digest {digest}")]
    NotRecorded {
        /// The number it claims.
        number: u32,
        /// Its spec's digest (its first 12 hex digits).
        digest: String,
    },
    /// The operator cannot read its key.
    #[error("the operator cannot check it: {0}")]
    NoKey(String),
    /// It does not load as a kind any more.
    #[error("it does not load: {0}")]
    DoesNotLoad(String),
}

/// Checks that `stored` is a revision the operator kept for the
/// definition of UID `definition_uid`: its spec's digest is the one it
/// claims, `signer` signed that digest for this definition and number,
/// and the definition's status (`recorded`) lists that number with that
/// digest.
pub fn verify(
    stored: &Stored,
    definition_uid: &str,
    recorded: &[RevisionStatus],
    signer: &Signer,
) -> Result<(), Tampered> {
    let digest = generation::digest(&stored.spec);
    if stored.digest.as_deref() != Some(digest.as_str()) {
        return Err(Tampered::Digest);
    }
    let signature = stored.signature.as_deref().ok_or(Tampered::Unsigned)?;
    let claim = Claim {
        definition_uid,
        number: stored.number,
        generation: stored.generation,
        digest: &digest,
    };
    if !signer.verify(&claim, signature) {
        return Err(Tampered::Signature);
    }
    let listed = (recorded.iter()).any(|r| r.revision == stored.number && r.digest == digest);
    if !listed {
        return Err(Tampered::NotRecorded {
            number: stored.number,
            digest: digest.chars().take(12).collect(),
        });
    }
    Ok(())
}

/// Why a revision could not be kept or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The key that signs revisions cannot be had.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// The ControllerRevisions of definitions, in one namespace, and the key
/// that signs them.
pub struct Store {
    client: Client,
    namespace: String,
    api: Api<ControllerRevision>,
    signer: tokio::sync::OnceCell<Signer>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// The field manager of the revisions' writes.
const MANAGER: &str = "kustomize-operator";

impl Store {
    /// The revisions kept in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            signer: tokio::sync::OnceCell::new(),
        }
    }

    /// The key that signs the revisions (read, or made, once; tried again
    /// after a failure).
    pub async fn signer(&self) -> Result<&Signer, KeyError> {
        (self.signer)
            .get_or_try_init(|| Signer::shared(&self.client, &self.namespace))
            .await
    }

    /// Writes `revision` of `definition`, signed (server-side apply:
    /// writing it again changes nothing).
    pub async fn save(
        &self,
        definition: &kube::api::DynamicObject,
        revision: &Revision,
        spec: &Value,
    ) -> Result<(), StoreError> {
        let name = object_name(&definition.name_any(), revision.number);
        let mut spec = spec.clone();
        if let Some(fields) = spec.as_object_mut() {
            fields.remove(crate::kinds::declared::pack::ROLLOUT_FIELD);
        }
        // The digest of what is stored, as a restarted operator computes it.
        let digest = generation::digest(&spec);
        let uid = definition.uid().unwrap_or_default();
        let claim = Claim {
            definition_uid: &uid,
            number: revision.number,
            generation: revision.generation.number,
            digest: &digest,
        };
        let signature = self.signer().await?.sign(&claim);
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
                "digest": digest,
                "generation": revision.generation.number,
                "signature": signature,
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
    /// earlier definition of the same name is left out), oldest first,
    /// not yet checked.
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
                let name = r.name_any();
                let data = r.data?.0;
                let text = |field: &str| data.get(field)?.as_str().map(str::to_string);
                Some(Stored {
                    name,
                    number: u32::try_from(r.revision).ok()?,
                    generation: data["generation"].as_i64().unwrap_or_default(),
                    digest: text("digest"),
                    signature: text("signature"),
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

    /// `namespace/name` of a stored revision, as messages name it.
    pub fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.namespace)
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
            crd: crate::definitions::generation::KeptCrd::new(&kind.crd()),
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
        assert_eq!(status[0].digest, "0123456789abcdef", "the whole digest");
        assert_eq!((status[0].resources, status[1].resources), (99, 1));
        assert_eq!(on_revisions(&counts), "1:99 2:1");
        assert_eq!(on_revisions(&BTreeMap::from([(1, 0), (2, 3)])), "2:3");
    }

    fn signer(byte: u8) -> Signer {
        Signer::for_tests(&[byte; 32])
    }

    /// A revision stored as the operator stores it: its spec, its digest,
    /// signed with `signer` for definition `uid-1`.
    fn stored(number: u32, spec: Value, signer: &Signer) -> Stored {
        let digest = generation::digest(&spec);
        let claim = Claim {
            definition_uid: "uid-1",
            number,
            generation: 3,
            digest: &digest,
        };
        Stored {
            name: format!("kinddefinition-greeting-{number}"),
            number,
            generation: 3,
            signature: Some(signer.sign(&claim)),
            digest: Some(digest),
            spec,
        }
    }

    fn recorded(stored: &Stored) -> RevisionStatus {
        RevisionStatus {
            revision: stored.number,
            digest: generation::digest(&stored.spec),
            generation: stored.generation,
            resources: 0,
        }
    }

    #[test]
    fn a_stored_revision_is_served_only_if_signed_claimed_and_recorded_as_it_is() {
        let key = signer(1);
        let spec = json!({"files": {"resources/configmap.yaml": "a: b"}});
        let genuine = stored(2, spec.clone(), &key);
        let status = [recorded(&genuine)];
        assert_eq!(verify(&genuine, "uid-1", &status, &key), Ok(()));
        // Its template changed, digest and all, signature copied.
        let mut forged = genuine.clone();
        forged.spec["files"]["resources/configmap.yaml"] = json!("a: c");
        forged.digest = Some(generation::digest(&forged.spec));
        assert_eq!(
            verify(&forged, "uid-1", &status, &key),
            Err(Tampered::Signature)
        );
        // The digest left as it was: it does not match its spec.
        forged.digest = genuine.digest.clone();
        assert_eq!(
            verify(&forged, "uid-1", &status, &key),
            Err(Tampered::Digest)
        );
        // Copied under another number, or for another definition.
        let mut renumbered = genuine.clone();
        renumbered.number = 7;
        assert_eq!(
            verify(&renumbered, "uid-1", &status, &key),
            Err(Tampered::Signature)
        );
        assert_eq!(
            verify(&genuine, "uid-2", &status, &key),
            Err(Tampered::Signature)
        );
        // Unsigned, or signed with another key.
        let unsigned = Stored {
            signature: None,
            ..genuine.clone()
        };
        assert_eq!(
            verify(&unsigned, "uid-1", &status, &key),
            Err(Tampered::Unsigned)
        );
        assert_eq!(
            verify(&genuine, "uid-1", &status, &signer(2)),
            Err(Tampered::Signature)
        );
        // Signed, but not recorded in the status (dropped, then written back).
        let err = verify(&genuine, "uid-1", &[], &key).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the definition's status records no revision 2 of digest {}",
                &generation::digest(&spec)[..12]
            )
        );
        let shortened = RevisionStatus {
            digest: status[0].digest[..12].to_string(),
            ..status[0].clone()
        };
        assert!(verify(&genuine, "uid-1", &[shortened], &key).is_err());
    }

    #[test]
    fn a_new_revision_numbers_above_the_refused_ones_and_replaces_its_namesake() {
        let refused = |number: u32| Refused {
            name: format!("kinddefinition-greeting-{number}"),
            number,
            why: Tampered::Signature,
        };
        let kept = Revision {
            number: 2,
            generation: generation(1, "a"),
        };
        let mut history = History::from_revisions(vec![kept], vec![refused(7), refused(3)]);
        assert_eq!(
            history
                .refused_numbers()
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [3, 7]
        );
        // The latest's files again: no new revision.
        history.add(generation(2, "a"), 5, None);
        assert_eq!(numbers(&history), [2]);
        history.add(generation(3, "b"), 5, None);
        assert_eq!(numbers(&history), [2, 8]);
        assert_eq!(history.refused().len(), 2);
        let mut history = History::from_revisions(Vec::new(), vec![refused(1)]);
        history.add(generation(1, "a"), 5, None);
        assert_eq!(numbers(&history), [2]);
        let mut history = History::from_revisions(Vec::new(), vec![refused(u32::MAX)]);
        history.add(generation(1, "a"), 5, None);
        assert_eq!(numbers(&history), [u32::MAX]);
        assert!(history.refused().is_empty(), "its namesake replaced");
    }
}
