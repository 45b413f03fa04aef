//! A plan's steps carried out: owned applies (build, ownership check,
//! server-side apply), patches and deletions of objects the resource acts
//! on, and the deletion of the resource's own objects (prune, cleanup),
//! which only ever touches objects that still carry its marker.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::applier::{ApplyJob, Document};
use super::build::BuildJob;
use super::inventory::{MAX_INVENTORY, ObjectId, Owner};
use super::kubectl::{CommandRecord, Invocation};
use super::outcome::Failure;
use super::overlay::RenderedOverlay;
use super::ownership::{self, Inspected, Verdict};
use super::status::Reason;
use super::{Engine, FIELD_MANAGER};
use crate::kind::{FieldConflicts, api_message};

/// Objects per `kubectl apply` (larger applies are split).
const APPLY_CHUNK: usize = 500;
/// Bytes of manifests per `kubectl apply` (larger applies are split).
const APPLY_CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// Objects per `kubectl delete`.
const DELETE_CHUNK: usize = 100;

/// Who a step runs for.
pub(crate) struct Actor<'a> {
    /// The resource, as an owner.
    pub owner: &'a Owner,
    /// The kind's field-conflict policy.
    pub conflicts: FieldConflicts,
    /// The kind's adoption rule for the resource.
    pub adopts: &'a (dyn Fn(&ObjectMeta) -> bool + Sync),
    /// Every object must be namespaced and in the owner's namespace.
    pub confined: bool,
}

/// What the steps did so far.
#[derive(Debug, Default)]
pub(crate) struct Done {
    /// The last kubectl run.
    pub record: Option<CommandRecord>,
    /// kubectl's output lines, in order.
    pub lines: Vec<String>,
    /// The objects owned applies produced.
    pub applied: BTreeSet<ObjectId>,
    /// Those of them that did not exist before (the apply created them).
    pub created: BTreeSet<ObjectId>,
    /// The objects owned applies were about to create or update (a failed
    /// apply may have created some of them).
    pub attempted: BTreeSet<ObjectId>,
    /// Events the engine itself has to report (prune).
    pub events: Vec<crate::kind::PlannedEvent>,
}

impl Done {
    fn ran(&mut self, record: CommandRecord) {
        self.lines.extend(
            record
                .stdout
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
        self.record = Some(record);
    }
}

/// Applies the objects an overlay the resource owns built to (see
/// [`build_owned`]).
pub(crate) async fn apply_owned(
    engine: &Engine,
    actor: &Actor<'_>,
    manifests: &[Value],
    field_manager: Option<&str>,
    done: &mut Done,
) -> Result<(), Failure> {
    let ids = identify(actor.owner, manifests)?;
    let inspected = ownership::inspect(
        &engine.client,
        &engine.discovery,
        actor.owner,
        ids.iter().cloned(),
        actor.adopts,
    )
    .await
    .map_err(|e| {
        Failure::new(
            Reason::ApiError,
            format!("cannot read the objects to apply: {}", api_message(&e)),
        )
    })?;
    if actor.confined {
        confinement(actor.owner, &inspected)?;
    }
    if let Some(message) = ownership::conflicts(&inspected, &actor.owner.kind) {
        return Err(Failure::new(Reason::OwnershipConflict, message));
    }
    done.attempted
        .extend(inspected.iter().map(|i| i.id.clone()));
    let field_manager = field_manager.unwrap_or(FIELD_MANAGER);
    for (documents, force) in split_by_ownership(manifests, &inspected, actor.conflicts) {
        let record = apply(engine, documents, field_manager, force).await?;
        if !record.succeeded() {
            return Err(apply_failure(record, Reason::ApplyFailed));
        }
        done.ran(record);
    }
    done.created.extend(
        inspected
            .iter()
            .filter(|i| i.verdict == Verdict::Absent)
            .map(|i| i.id.clone()),
    );
    done.applied.extend(inspected.into_iter().map(|i| i.id));
    Ok(())
}

/// Refuses objects outside the owner's namespace (for kinds whose
/// resources may be created by anyone who may write in a namespace).
fn confinement(owner: &Owner, inspected: &[Inspected]) -> Result<(), Failure> {
    let outside: Vec<String> = inspected
        .iter()
        .filter(|i| !i.served.namespaced || i.id.namespace != owner.namespace)
        .map(|i| i.id.to_string())
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        Reason::RenderFailed,
        format!(
            "the overlay builds objects outside the resource's namespace, which a namespaced kind may not create: {}",
            outside.join(", ")
        ),
    ))
}

/// The overlay's manifests: built in memory when it needs no kustomize
/// (borrowed from the overlay, which keeps them), else by `kubectl
/// kustomize` (coalesced with other resources' builds).
pub(crate) async fn build_owned<'a>(
    engine: &Engine,
    owner: &Owner,
    overlay: &'a RenderedOverlay,
) -> Result<Cow<'a, [Value]>, Failure> {
    if let Some(manifests) = overlay.prebuilt() {
        return Ok(Cow::Borrowed(manifests));
    }
    let job = BuildJob {
        overlay: overlay.clone(),
        owner_uid: owner.uid.clone(),
    };
    match engine.builds.submit(job).await {
        Some(Ok(manifests)) => Ok(Cow::Owned(manifests)),
        Some(Err(failure)) => Err(Failure {
            reason: Reason::RenderFailed,
            message: failure.message,
            record: failure.record.map(Box::new),
            inventory: None,
        }),
        None => Err(Failure::new(
            Reason::RenderFailed,
            "the build queue stopped",
        )),
    }
}

/// The identity of each built object, checked: every one carries the
/// owner's marker, and there are not too many.
fn identify(owner: &Owner, manifests: &[Value]) -> Result<Vec<ObjectId>, Failure> {
    if manifests.len() > MAX_INVENTORY {
        return Err(Failure::new(
            Reason::TooLarge,
            format!(
                "the overlay builds to {} objects; one resource may own at most {MAX_INVENTORY}",
                manifests.len()
            ),
        ));
    }
    manifests
        .iter()
        .map(|m| {
            let id = ObjectId::of_manifest(m).ok_or_else(|| {
                Failure::new(
                    Reason::RenderFailed,
                    "the overlay builds an object without apiVersion, kind or name",
                )
            })?;
            if !owner.marks_manifest(m) {
                return Err(Failure::new(
                    Reason::RenderFailed,
                    format!(
                        "{id} does not carry the ownership marker (does the overlay remove labels?)"
                    ),
                ));
            }
            Ok(id)
        })
        .collect()
}

/// The applies to run: with [`FieldConflicts::TakeBack`], objects that
/// exist (and carry the marker) apply with `--force-conflicts` and new
/// ones without; else everything without.
fn split_by_ownership(
    manifests: &[Value],
    inspected: &[Inspected],
    conflicts: FieldConflicts,
) -> Vec<(Vec<Document>, bool)> {
    if conflicts == FieldConflicts::Report {
        return vec![(manifests.iter().map(Document::of).collect(), false)];
    }
    let (mut new, mut existing) = (Vec::new(), Vec::new());
    for (m, i) in manifests.iter().zip(inspected) {
        let document = Document::of(m);
        match i.verdict {
            Verdict::Absent => new.push(document),
            _ => existing.push(document),
        }
    }
    [(new, false), (existing, true)]
        .into_iter()
        .filter(|(m, _)| !m.is_empty())
        .collect()
}

/// Applies `manifests` in chunks; returns the last run (the first failed
/// one, if any failed).
async fn apply(
    engine: &Engine,
    documents: Vec<Document>,
    field_manager: &str,
    force_conflicts: bool,
) -> Result<CommandRecord, Failure> {
    let mut last = None;
    for chunk in chunks(documents) {
        let job = ApplyJob {
            documents: chunk,
            field_manager: field_manager.to_string(),
            force_conflicts,
        };
        let record = match engine.applies.submit(job).await {
            Some(Ok(record)) => record,
            Some(Err(e)) => return Err(Failure::new(Reason::ApplyFailed, e)),
            None => return Err(Failure::new(Reason::ApplyFailed, "the apply queue stopped")),
        };
        let failed = !record.succeeded();
        last = Some(record);
        if failed {
            break;
        }
    }
    last.ok_or_else(|| Failure::new(Reason::ApplyFailed, "nothing to apply"))
}

fn chunks(documents: Vec<Document>) -> Vec<Vec<Document>> {
    let mut out: Vec<Vec<Document>> = Vec::new();
    let mut bytes = 0;
    for m in documents {
        let size = m.size();
        let full = out
            .last()
            .is_none_or(|c| c.len() >= APPLY_CHUNK || bytes + size > APPLY_CHUNK_BYTES);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(chunk) = out.last_mut() {
            chunk.push(m);
        }
    }
    out
}

/// The failure for a kubectl apply that did not succeed: `FieldConflict`
/// when another field manager owns a field, else `fallback`.
pub(crate) fn apply_failure(record: CommandRecord, fallback: Reason) -> Failure {
    let conflict =
        record.stderr.contains("Apply failed with") && record.stderr.contains("conflict");
    Failure {
        reason: if conflict {
            Reason::FieldConflict
        } else {
            fallback
        },
        message: failure_message(&record),
        record: Some(Box::new(record)),
        inventory: None,
    }
}

/// The message for a failed run: the summary line plus the stderr tail.
pub(crate) fn failure_message(record: &CommandRecord) -> String {
    let summary = record.summary();
    let tail = super::status::keep_tail(record.stderr.trim(), 512);
    let tail: String = tail
        .lines()
        .filter(|l| !l.starts_with("Warning:"))
        .collect::<Vec<_>>()
        .join("\n");
    if tail.starts_with(&summary) || tail.is_empty() {
        if tail.is_empty() { summary } else { tail }
    } else {
        format!("{summary}\n{tail}")
    }
}

/// Server-side applies partial objects the resource does not own.
pub(crate) async fn patch_foreign(
    engine: &Engine,
    overlay: &RenderedOverlay,
    field_manager: &str,
    done: &mut Done,
) -> Result<(), Failure> {
    let Some(manifests) = overlay.prebuilt().filter(|_| overlay.is_plain()) else {
        return Err(Failure::new(
            Reason::RenderFailed,
            "a patch takes whole objects only",
        ));
    };
    let documents = manifests.iter().map(Document::of).collect();
    let record = apply(engine, documents, field_manager, true).await?;
    if !record.succeeded() {
        return Err(apply_failure(record, Reason::ActionFailed));
    }
    done.ran(record);
    Ok(())
}

/// Deletes objects the resource does not own (objects already gone count).
pub(crate) async fn delete_foreign(
    engine: &Engine,
    objects: &[ObjectId],
    done: &mut Done,
) -> Result<(), Failure> {
    let mut resolved = Vec::with_capacity(objects.len());
    for id in objects {
        let served = engine
            .discovery
            .resolve(&engine.client, id)
            .await
            .map_err(|e| {
                Failure::new(
                    Reason::ApiError,
                    format!("cannot resolve {id}: {}", api_message(&e)),
                )
            })?;
        resolved.push((id.clone(), served.kubectl_arg(&id.name), served.namespaced));
    }
    run_deletes(engine, resolved, Reason::ActionFailed, done).await
}

/// What deleting a resource's own objects did.
#[derive(Debug, Default)]
pub(crate) struct Deleted {
    /// The objects deleted (or already gone).
    pub deleted: Vec<ObjectId>,
    /// Objects left alone: they no longer carry the resource's marker.
    pub left: Vec<String>,
}

/// Deletes those of `ids` that still carry the owner's marker (or that the
/// kind adopts); the others are left and reported.
pub(crate) async fn delete_owned(
    engine: &Engine,
    actor: &Actor<'_>,
    ids: Vec<ObjectId>,
    reason: Reason,
    done: &mut Done,
) -> Result<Deleted, Failure> {
    let inspected = ownership::inspect(
        &engine.client,
        &engine.discovery,
        actor.owner,
        ids,
        actor.adopts,
    )
    .await
    .map_err(|e| {
        Failure::new(
            Reason::ApiError,
            format!("cannot read the objects to delete: {}", api_message(&e)),
        )
    })?;
    let mut report = Deleted::default();
    let mut targets = Vec::new();
    for i in inspected {
        match &i.verdict {
            Verdict::Absent => report.deleted.push(i.id),
            Verdict::Ours | Verdict::Adopted => {
                targets.push((
                    i.id.clone(),
                    i.served.kubectl_arg(&i.id.name),
                    i.served.namespaced,
                ));
                report.deleted.push(i.id);
            }
            Verdict::Foreign(who) => report.left.push(format!("{} ({who})", i.id)),
        }
    }
    run_deletes(engine, targets, reason, done).await?;
    Ok(report)
}

/// One `kubectl delete` per namespace (and chunk of names).
async fn run_deletes(
    engine: &Engine,
    targets: Vec<(ObjectId, String, bool)>,
    reason: Reason,
    done: &mut Done,
) -> Result<(), Failure> {
    let mut by_namespace: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for (id, arg, namespaced) in targets {
        let ns = if namespaced { id.namespace } else { None };
        by_namespace.entry(ns).or_default().push(arg);
    }
    for (namespace, objects) in by_namespace {
        for chunk in objects.chunks(DELETE_CHUNK) {
            let invocation = Invocation::Delete {
                namespace: namespace.clone(),
                objects: chunk.to_vec(),
            };
            let record = engine
                .kubectl
                .run(&invocation, None)
                .await
                .map_err(|e| Failure::new(reason, e.to_string()))?;
            if !record.succeeded() {
                return Err(Failure {
                    reason,
                    message: failure_message(&record),
                    record: Some(Box::new(record)),
                    inventory: None,
                });
            }
            done.ran(record);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failure_message_has_summary_and_stderr_without_warnings() {
        let r = CommandRecord {
            exit_code: Some(1),
            stderr: "Warning: deprecated\nerror: one\nerror: two\n".into(),
            ..Default::default()
        };
        assert_eq!(failure_message(&r), "error: one\nerror: two");
    }

    #[test]
    fn a_field_conflict_is_told_from_other_failures() {
        let conflict = CommandRecord {
            exit_code: Some(1),
            stderr: "error: Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"scale\" using apps/v1: .spec.replicas\n".into(),
            ..Default::default()
        };
        assert_eq!(
            apply_failure(conflict, Reason::ApplyFailed).reason,
            Reason::FieldConflict
        );
        let other = CommandRecord {
            exit_code: Some(1),
            stderr: "error: the namespace from the provided object does not match\n".into(),
            ..Default::default()
        };
        assert_eq!(
            apply_failure(other, Reason::ApplyFailed).reason,
            Reason::ApplyFailed
        );
    }

    #[test]
    fn every_built_object_must_carry_the_marker() {
        let owner = Owner {
            api_version: "v1".into(),
            kind: "Thing".into(),
            namespace: Some("a".into()),
            name: "t".into(),
            uid: "u".into(),
        };
        let marked = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "a", "labels": {super::super::inventory::OWNER_LABEL: "u"}}});
        let unmarked = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y"}});
        assert_eq!(
            identify(&owner, std::slice::from_ref(&marked))
                .unwrap()
                .len(),
            1
        );
        let err = identify(&owner, &[marked, unmarked]).unwrap_err();
        assert_eq!(err.reason, Reason::RenderFailed);
        assert!(err.message.contains("configmap/y"), "{}", err.message);
    }

    #[test]
    fn large_applies_are_split() {
        let many: Vec<Document> = (0..1200).map(|i| Document::of(&json!({"i": i}))).collect();
        let sizes: Vec<usize> = chunks(many).iter().map(Vec::len).collect();
        assert_eq!(sizes, [500, 500, 200]);
        let big = "x".repeat(3 * 1024 * 1024);
        let heavy: Vec<Document> = (0..4)
            .map(|_| Document::of(&json!({"data": big})))
            .collect();
        let sizes: Vec<usize> = chunks(heavy).iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2]);
    }
}
