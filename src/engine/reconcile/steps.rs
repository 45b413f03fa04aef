//! A plan's steps carried out: owned applies (build, ownership check,
//! server-side apply), patches and deletions of objects the resource acts
//! on, and the deletion of the resource's own objects (prune, cleanup),
//! which only ever touches objects that still carry its marker.

use std::borrow::Cow;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::engine::live::crds::ESTABLISH_TIMEOUT;
use crate::engine::live::ownership::{self, ApiKind, Inspected, Verdict};
use crate::engine::model::identity::Identity;
use crate::engine::model::inventory::{ObjectId, Owner};
use crate::engine::model::outcome::Failure;
use crate::engine::model::overlay::RenderedOverlay;
use crate::engine::model::status::{CommonStatus, Reason};
use crate::engine::reconcile::runtime::Engine;
use crate::engine::run::kubectl_apply::{ApplyJob, Document};
use crate::kubectl::{self, CommandRecord, Invocation};

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
    pub takes_back: bool,
    /// The kind's adoption rule for the resource.
    pub adopts: &'a (dyn Fn(&ObjectMeta) -> bool + Sync),
    /// True when an object may be the owner's (its kind's
    /// [`Handler::reaches`](crate::engine::contract::Handler::reaches)).
    pub reaches: &'a (dyn Fn(&ObjectId) -> bool + Sync),
    /// Whose rights the writes use.
    pub identity: &'a Identity,
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
    pub events: Vec<crate::engine::contract::PlannedEvent>,
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
/// [`build_owned`]). An empty build is a valid state: nothing is applied,
/// and the prune that follows removes what the resource owned before.
///
/// Namespaces and CustomResourceDefinitions go first, on their own, when
/// the build holds other objects too: those may live in the namespace or be
/// of the kind (whose API does not exist until its CRD is established, so
/// neither the ownership check nor kubectl could map them before).
pub(crate) async fn apply_owned(
    engine: &Engine,
    actor: &Actor<'_>,
    manifests: &[Value],
    field_manager: Option<&str>,
    done: &mut Done,
) -> Result<(), Failure> {
    let foundations = manifests.iter().filter(|m| is_foundation(m)).count();
    if foundations == 0 || foundations == manifests.len() {
        return apply_stage(engine, actor, manifests, field_manager, done).await;
    }
    let (first, then): (Vec<Value>, Vec<Value>) =
        manifests.iter().cloned().partition(is_foundation);
    apply_stage(engine, actor, &first, field_manager, done).await?;
    established(engine, &first).await?;
    apply_stage(engine, actor, &then, field_manager, done).await
}

/// A Namespace or a CustomResourceDefinition: what other objects of the
/// same build may need to exist first.
fn is_foundation(manifest: &Value) -> bool {
    matches!(
        (manifest["apiVersion"].as_str(), manifest["kind"].as_str()),
        (Some("v1"), Some("Namespace"))
            | (
                Some("apiextensions.k8s.io/v1"),
                Some("CustomResourceDefinition")
            )
    )
}

/// Waits until every CRD of `applied` is established (its API served).
async fn established(engine: &Engine, applied: &[Value]) -> Result<(), Failure> {
    let names = applied
        .iter()
        .filter(|m| m["kind"] == "CustomResourceDefinition")
        .filter_map(|m| m["metadata"]["name"].as_str());
    for name in names {
        match engine.wait_established(name).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(Failure::new(
                    Reason::ApplyFailed,
                    format!(
                        "the CustomResourceDefinition {name} was not established within {}s",
                        ESTABLISH_TIMEOUT.as_secs()
                    ),
                ));
            }
            // The operator's own account may not read CRDs (a
            // locked-down install): go on unwaited; the next stage's
            // apply says what is missing, and the retry converges.
            Err(kube::Error::Api(e)) if e.code == 403 => break,
            Err(e) => {
                return Err(Failure::new(
                    Reason::ApiError,
                    format!(
                        "cannot read the CustomResourceDefinition {name}: {}",
                        crate::error_text::kube(&e)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Applies one stage of a build (see [`apply_owned`]).
async fn apply_stage(
    engine: &Engine,
    actor: &Actor<'_>,
    manifests: &[Value],
    field_manager: Option<&str>,
    done: &mut Done,
) -> Result<(), Failure> {
    if manifests.is_empty() {
        return Ok(());
    }
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
            format!("cannot read the objects to apply: {e}"),
        )
    })?;
    confinement(actor, &inspected)?;
    if let Some(message) = ownership::conflicts(&inspected, &actor.owner.kind) {
        return Err(Failure::new(Reason::OwnershipConflict, message));
    }
    done.attempted
        .extend(inspected.iter().map(|i| i.id.clone()));
    let field_manager = field_manager.unwrap_or(Engine::FIELD_MANAGER);
    for (documents, force) in split_by_ownership(manifests, &inspected, actor.takes_back) {
        let record = apply(engine, documents, field_manager, force, actor.identity).await?;
        if !record.succeeded() {
            let failure = apply_failure(record, Reason::ApplyFailed, actor.identity);
            return Err(explain_forbidden(engine, actor.identity, failure).await);
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

/// Refuses objects outside the owner's reach (for kinds whose resources
/// may be created by anyone who may write in a namespace): its namespace,
/// and what the kind declares beyond it.
fn confinement(actor: &Actor<'_>, inspected: &[Inspected]) -> Result<(), Failure> {
    let outside: Vec<String> = inspected
        .iter()
        .filter(|i| !within(actor, &i.id, i.served.namespaced))
        .map(|i| i.id.to_string())
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        Reason::RenderFailed,
        format!(
            "the overlay builds objects outside the resource's namespace that its kind does not declare in `reach`: {}",
            outside.join(", ")
        ),
    ))
}

/// True when the object `id` (namespaced or not, as the API serves its
/// kind) may be the actor's owner's.
fn within(actor: &Actor<'_>, id: &ObjectId, namespaced: bool) -> bool {
    match (namespaced, &id.namespace) {
        (true, None) => false,
        (false, Some(_)) => (actor.reaches)(&ObjectId {
            namespace: None,
            ..id.clone()
        }),
        _ => (actor.reaches)(id),
    }
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
    match engine
        .builds
        .build(overlay.clone(), owner.uid.clone())
        .await
    {
        Some(Ok(manifests)) => Ok(Cow::Owned(manifests)),
        Some(Err(failure)) => Err(Failure {
            reason: Reason::RenderFailed,
            message: match overlay.build_hint() {
                Some(hint) => format!("{hint}; {}", failure.message),
                None => failure.message,
            },
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
    if manifests.len() > CommonStatus::MAX_OBJECTS {
        return Err(Failure::new(
            Reason::TooLarge,
            format!(
                "the overlay builds to {} objects; one resource may own at most {}",
                manifests.len(),
                CommonStatus::MAX_OBJECTS
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

/// The applies to run: when the kind takes fields back, objects that
/// exist (and carry the marker) apply with `--force-conflicts` and new
/// ones without; else everything without.
fn split_by_ownership(
    manifests: &[Value],
    inspected: &[Inspected],
    takes_back: bool,
) -> Vec<(Vec<Document>, bool)> {
    if !takes_back {
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
    identity: &Identity,
) -> Result<CommandRecord, Failure> {
    let mut last = None;
    for chunk in chunks(documents) {
        let job = |documents| ApplyJob {
            documents,
            field_manager: field_manager.to_string(),
            force_conflicts,
            identity: identity.clone(),
        };
        let mut record = submit(engine, job(chunk.clone())).await?;
        if forgot_unserved(engine, &record) {
            // kubectl's discovery of a kind was stale (its CRD was created
            // again with another scope, or lost the version): once more,
            // with the API server asked afresh.
            record = submit(engine, job(chunk)).await?;
        }
        let failed = !record.succeeded();
        last = Some(record);
        if failed {
            break;
        }
    }
    last.ok_or_else(|| Failure::new(Reason::ApplyFailed, "nothing to apply"))
}

/// Runs `job` in the apply queue.
async fn submit(engine: &Engine, job: ApplyJob) -> Result<CommandRecord, Failure> {
    match engine.applies.submit(job).await {
        Some(Ok(record)) => Ok(record),
        Some(Err(e)) => Err(Failure::new(Reason::ApplyFailed, e.to_string())),
        None => Err(Failure::new(Reason::ApplyFailed, "the apply queue stopped")),
    }
}

/// When a failed run was told that the API server serves no resource at
/// the path kubectl asked (`the server could not find the requested
/// resource (patch things.example.com a)`), forgets what kubectl's cache
/// and the engine's discovery know of those resources' groups; true then.
fn forgot_unserved(engine: &Engine, record: &CommandRecord) -> bool {
    if record.succeeded() {
        return false;
    }
    let unserved = kubectl::unserved_resources(&record.stderr);
    for resource in &unserved {
        engine.forget_discovery(kubectl::group_of(resource));
    }
    !unserved.is_empty()
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
/// when another field manager owns a field, `Forbidden` when the API
/// server refused `identity`, else `fallback`.
pub(crate) fn apply_failure(
    record: CommandRecord,
    fallback: Reason,
    identity: &Identity,
) -> Failure {
    let conflict =
        record.stderr.contains("Apply failed with") && record.stderr.contains("conflict");
    if conflict {
        return Failure {
            reason: Reason::FieldConflict,
            message: failure_message(&record),
            record: Some(Box::new(record)),
            inventory: None,
        };
    }
    run_failure(record, fallback, identity)
}

/// The message for a failed run: the summary line plus the stderr tail.
pub(crate) fn failure_message(record: &CommandRecord) -> String {
    let summary = record.summary();
    let tail = crate::engine::model::status::keep_tail(record.stderr.trim(), 512);
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

/// Server-side applies partial objects the resource does not own, as
/// `identity`.
pub(crate) async fn patch_foreign(
    engine: &Engine,
    overlay: &RenderedOverlay,
    field_manager: &str,
    identity: &Identity,
    done: &mut Done,
) -> Result<(), Failure> {
    let Some(manifests) = overlay.prebuilt().filter(|_| overlay.is_plain()) else {
        return Err(Failure::new(
            Reason::RenderFailed,
            "a patch takes whole objects only",
        ));
    };
    let documents = manifests.iter().map(Document::of).collect();
    let record = apply(engine, documents, field_manager, true, identity).await?;
    if !record.succeeded() {
        let failure = apply_failure(record, Reason::ActionFailed, identity);
        return Err(explain_forbidden(engine, identity, failure).await);
    }
    done.ran(record);
    Ok(())
}

/// Deletes objects the resource does not own, as `identity` (objects
/// already gone count).
pub(crate) async fn delete_foreign(
    engine: &Engine,
    objects: &[ObjectId],
    identity: &Identity,
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
                    format!("cannot resolve {id}: {}", crate::error_text::kube(&e)),
                )
            })?;
        resolved.push((id.clone(), served.kubectl_arg(&id.name), served.namespaced));
    }
    run_deletes(engine, resolved, Reason::ActionFailed, identity, done).await
}

/// What deleting a resource's own objects did.
#[derive(Debug, Default)]
pub(crate) struct Deleted {
    /// Its objects, deleted (or gone since they were read).
    pub deleted: Vec<ObjectId>,
    /// Listed objects that are absent or not its own: forgotten, never
    /// named, and never told apart (the resource learns nothing of objects
    /// it does not own).
    pub forgotten: usize,
    /// Listed entries it can never own (outside its namespace, of a kind
    /// the API does not serve, or with a name no object can have):
    /// dropped without being looked at.
    pub invalid: usize,
}

/// Deletes those of `ids` whose live object carries the owner's marker,
/// as the actor's identity, each with a UID precondition. The list (an
/// inventory from status, which tenants can write) is a hint, never an
/// authority: entries the owner could not own are dropped unread, and
/// objects without the marker are left, whoever holds them.
pub(crate) async fn delete_owned(
    engine: &Engine,
    actor: &Actor<'_>,
    ids: Vec<ObjectId>,
    reason: Reason,
    done: &mut Done,
) -> Result<Deleted, Failure> {
    let mut report = Deleted::default();
    let candidates = candidates(engine, actor, ids, &mut report).await?;
    let never = |_: &ObjectMeta| false;
    let inspected = ownership::inspect(
        &engine.client,
        &engine.discovery,
        actor.owner,
        candidates,
        &never,
    )
    .await
    .map_err(|e| {
        Failure::new(
            Reason::ApiError,
            format!("cannot read the objects to delete: {e}"),
        )
    })?;
    let mut targets = Vec::new();
    for i in inspected {
        match (i.verdict, i.uid) {
            (Verdict::Ours, Some(uid)) => targets.push(Doomed {
                path: api_path(&i.served, &i.id),
                id: i.id,
                uid,
            }),
            _ => report.forgotten += 1,
        }
    }
    let outcomes: Vec<_> = futures::stream::iter(targets)
        .map(|t| delete_one(engine, actor.identity, t, reason))
        .buffered(DELETE_CONCURRENCY)
        .collect()
        .await;
    let mut failure = None;
    for outcome in outcomes {
        match outcome {
            Ok(Gone::Deleted(id, record)) => {
                done.ran(*record);
                report.deleted.push(id);
            }
            Ok(Gone::Replaced) => report.forgotten += 1,
            Err(f) => failure = failure.or(Some(f)),
        }
    }
    match failure {
        Some(f) => Err(explain_forbidden(engine, actor.identity, f).await),
        None => Ok(report),
    }
}

/// What a delete left of the list it was given, in words that name no
/// object: `None` when it left nothing.
pub(crate) fn dropped_entries(report: &Deleted) -> Option<String> {
    let mut parts = Vec::new();
    if report.forgotten > 0 {
        parts.push(format!(
            "forgot {} listed object(s) that are gone or not its own (left untouched)",
            report.forgotten
        ));
    }
    if report.invalid > 0 {
        parts.push(format!(
            "ignored {} inventory entr{} it could never own (outside its namespace, an unknown kind or an impossible name; not looked at)",
            report.invalid,
            if report.invalid == 1 { "y" } else { "ies" }
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Deletes of one resource's objects running at once (each waits for a
/// kubectl slot as well).
const DELETE_CONCURRENCY: usize = 4;

/// The entries worth looking at: valid names, within the owner's reach,
/// of a kind the API serves. The rest are counted as invalid.
async fn candidates(
    engine: &Engine,
    actor: &Actor<'_>,
    ids: Vec<ObjectId>,
    report: &mut Deleted,
) -> Result<Vec<ObjectId>, Failure> {
    let mut kept = Vec::with_capacity(ids.len());
    for id in ids {
        if !plausible(actor, &id) {
            report.invalid += 1;
            continue;
        }
        match engine.discovery.resolve(&engine.client, &id).await {
            Ok(served) if !within(actor, &id, served.namespaced) => {
                report.invalid += 1;
            }
            Ok(_) => kept.push(id),
            Err(e) if unknown_kind(&e) => report.invalid += 1,
            Err(e) => {
                return Err(Failure::new(
                    Reason::ApiError,
                    format!(
                        "cannot resolve the kinds to delete: {}",
                        crate::error_text::kube(&e)
                    ),
                ));
            }
        }
    }
    Ok(kept)
}

/// True when an inventory entry names an object the owner could own: a
/// name and namespace an object can have (they become an API path), and
/// within the owner's reach as far as the entry tells.
fn plausible(actor: &Actor<'_>, id: &ObjectId) -> bool {
    id.namespace.as_deref().is_none_or(is_namespace_name)
        && (actor.reaches)(id)
        && is_object_name(&id.name)
}

/// A name an object can have: 1 to 253 of `[A-Za-z0-9._:@-]`, not `.` or
/// `..` (what any kind allows, and nothing that changes an API path).
fn is_object_name(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '@'))
}

/// A namespace name: a DNS label.
fn is_namespace_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// True when discovery says the API serves no such kind.
fn unknown_kind(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

/// One object to delete: carries the marker, with this UID.
struct Doomed {
    id: ObjectId,
    path: String,
    uid: String,
}

/// What became of one object to delete.
enum Gone {
    /// Deleted (or gone already), by this run.
    Deleted(ObjectId, Box<CommandRecord>),
    /// Replaced by another object since it was read: left alone.
    Replaced,
}

/// Deletes one object by its API path, on condition that it is still the
/// object read (its UID): `kubectl delete` itself cannot express a
/// precondition, `kubectl delete --raw` sends the `DeleteOptions` given.
async fn delete_one(
    engine: &Engine,
    identity: &Identity,
    target: Doomed,
    reason: Reason,
) -> Result<Gone, Failure> {
    let invocation = Invocation::DeleteObject {
        path: target.path,
        impersonate: identity.username(),
    };
    let options = serde_json::json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Background",
        "preconditions": {"uid": target.uid},
    });
    let mut record = engine
        .kubectl
        .run(&invocation, Some(options.to_string().into_bytes()))
        .await
        .map_err(|e| Failure::new(reason, e.to_string()))?;
    if record.succeeded() || record.stderr.contains("(NotFound)") {
        record.stdout = format!("{} deleted\n", target.id.kubectl_name());
        return Ok(Gone::Deleted(target.id, Box::new(record)));
    }
    if record.stderr.contains("(Conflict)") && record.stderr.contains("precondition") {
        return Ok(Gone::Replaced);
    }
    Err(run_failure(record, reason, identity))
}

/// The API path of an object (`/apis/apps/v1/namespaces/a/deployments/web`).
fn api_path(served: &ApiKind, id: &ObjectId) -> String {
    let r = &served.resource;
    let root = if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    };
    match id.namespace.as_deref().filter(|_| served.namespaced) {
        Some(ns) => format!("{root}/namespaces/{ns}/{}/{}", r.plural, id.name),
        None => format!("{root}/{}/{}", r.plural, id.name),
    }
}

/// The failure of a kubectl run that did not succeed: `Forbidden` when
/// the API server refused the identity, else `reason`.
fn run_failure(record: CommandRecord, reason: Reason, identity: &Identity) -> Failure {
    let forbidden = is_forbidden(&record);
    let mut message = failure_message(&record);
    if forbidden && *identity != Identity::Operator {
        message = format!("acting as {identity}: {message}");
    }
    Failure {
        reason: if forbidden { Reason::Forbidden } else { reason },
        message,
        record: Some(Box::new(record)),
        inventory: None,
    }
}

/// True when the API server refused a run's request for lack of rights.
fn is_forbidden(record: &CommandRecord) -> bool {
    record.stderr.contains("(Forbidden)") || record.stderr.contains(" is forbidden: ")
}

/// A `Forbidden` failure while acting as a ServiceAccount says so when the
/// account does not exist (impersonating one that does not exist is
/// allowed, and every write is then refused).
async fn explain_forbidden(engine: &Engine, identity: &Identity, mut failure: Failure) -> Failure {
    let Identity::ServiceAccount(account) = identity else {
        return failure;
    };
    if failure.reason != Reason::Forbidden {
        return failure;
    }
    let accounts: kube::Api<ServiceAccount> =
        kube::Api::namespaced(engine.client.clone(), &account.namespace);
    if let Ok(None) = accounts.get_metadata_opt(&account.name).await {
        failure.message = format!(
            "ServiceAccount {account} does not exist: create it and grant it the rights this kind's objects need ({})",
            failure.message
        );
    }
    failure
}

/// One `kubectl delete` per namespace (and chunk of names).
async fn run_deletes(
    engine: &Engine,
    targets: Vec<(ObjectId, String, bool)>,
    reason: Reason,
    identity: &Identity,
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
                impersonate: identity.username(),
            };
            let record = engine
                .kubectl
                .run(&invocation, None)
                .await
                .map_err(|e| Failure::new(reason, e.to_string()))?;
            if !record.succeeded() {
                // As a ServiceAccount, a refusal names it (`Forbidden`).
                if *identity != Identity::Operator {
                    let failure = run_failure(record, reason, identity);
                    return Err(explain_forbidden(engine, identity, failure).await);
                }
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
            apply_failure(conflict, Reason::ApplyFailed, &Identity::Operator).reason,
            Reason::FieldConflict
        );
        let other = CommandRecord {
            exit_code: Some(1),
            stderr: "error: the namespace from the provided object does not match\n".into(),
            ..Default::default()
        };
        assert_eq!(
            apply_failure(other, Reason::ApplyFailed, &Identity::Operator).reason,
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
            "metadata": {"name": "x", "namespace": "a", "labels": {crate::engine::model::inventory::Owner::LABEL: "u"}}});
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

    fn owner(namespace: Option<&str>) -> Owner {
        Owner::sample_web(namespace)
    }

    fn deployment(namespace: Option<&str>, name: &str) -> ObjectId {
        ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    type Reaches<'a> = &'a (dyn Fn(&ObjectId) -> bool + Sync);

    fn actor<'a>(owner: &'a Owner, reaches: Reaches<'a>, identity: &'a Identity) -> Actor<'a> {
        Actor {
            owner,
            takes_back: false,
            adopts: &|_| false,
            reaches,
            identity,
        }
    }

    #[test]
    fn an_entry_outside_a_confined_owners_namespace_is_never_looked_at() {
        let (o, id) = (owner(Some("attacker")), Identity::Operator);
        let home = |object: &ObjectId| object.namespace.as_deref() == Some("attacker");
        let confined = actor(&o, &home, &id);
        assert!(plausible(&confined, &deployment(Some("attacker"), "web")));
        assert!(!plausible(&confined, &deployment(Some("victim"), "web")));
        assert!(!plausible(&confined, &deployment(None, "web")));
        let declared = |object: &ObjectId| {
            home(object)
                || object.kind == "Deployment" && object.namespace.as_deref() == Some("victim")
        };
        let reaching = actor(&o, &declared, &id);
        assert!(plausible(&reaching, &deployment(Some("victim"), "web")));
        assert!(!plausible(&reaching, &deployment(Some("other"), "web")));
        let free = actor(&o, &|_| true, &id);
        assert!(plausible(&free, &deployment(Some("victim"), "web")));
        assert!(plausible(&free, &deployment(None, "web")));
    }

    #[test]
    fn an_object_of_a_cluster_scoped_kind_is_asked_about_without_its_namespace() {
        let (o, id) = (owner(Some("a")), Identity::Operator);
        let cluster_scoped = |object: &ObjectId| object.namespace.is_none();
        let only = actor(&o, &cluster_scoped, &id);
        assert!(within(&only, &deployment(Some("a"), "web"), false));
        assert!(within(&only, &deployment(None, "web"), false));
        assert!(!within(&only, &deployment(None, "web"), true));
    }

    #[test]
    fn names_that_would_change_an_api_path_are_invalid() {
        let (o, id) = (owner(Some("a")), Identity::Operator);
        let free = actor(&o, &|_| true, &id);
        for bad in ["", ".", "..", "web/../x", "web?x", "web#x", "we b", "%2e"] {
            assert!(!plausible(&free, &deployment(Some("a"), bad)), "{bad:?}");
        }
        assert!(!plausible(&free, &deployment(Some("A/b"), "web")));
        assert!(!plausible(&free, &deployment(Some("a"), &"x".repeat(254))));
        for good in ["web", "system:aggregate-to-edit", "a.b-c_d@e"] {
            assert!(plausible(&free, &deployment(Some("a"), good)), "{good:?}");
        }
    }

    #[test]
    fn api_paths_address_one_object() {
        let namespaced = ApiKind {
            resource: kube::api::ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
            namespaced: true,
        };
        assert_eq!(
            api_path(&namespaced, &deployment(Some("a"), "web")),
            "/apis/apps/v1/namespaces/a/deployments/web"
        );
        let cluster = ApiKind {
            resource: kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()),
            namespaced: false,
        };
        let ns = ObjectId {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            namespace: Some("ignored".into()),
            name: "team".into(),
        };
        assert_eq!(api_path(&cluster, &ns), "/api/v1/namespaces/team");
    }

    #[test]
    fn what_a_delete_left_is_told_without_naming_anything() {
        assert_eq!(dropped_entries(&Deleted::default()), None);
        let report = Deleted {
            deleted: vec![deployment(Some("a"), "web")],
            forgotten: 2,
            invalid: 1,
        };
        let note = dropped_entries(&report).unwrap();
        assert!(note.contains("forgot 2 listed object(s)"), "{note}");
        assert!(note.contains("ignored 1 inventory entry"), "{note}");
        assert!(!note.contains("web"), "{note}");
    }

    #[test]
    fn a_refusal_of_the_tenants_account_is_forbidden_and_says_whose() {
        let record = CommandRecord {
            exit_code: Some(1),
            stderr: "Error from server (Forbidden): deployments.apps \"web\" is forbidden: User \"system:serviceaccount:t:deployer\" cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"t\"\n".into(),
            ..Default::default()
        };
        let identity = Identity::ServiceAccount(crate::names::ServiceAccount {
            namespace: "t".into(),
            name: "deployer".into(),
        });
        let failure = apply_failure(record, Reason::ApplyFailed, &identity);
        assert_eq!(failure.reason, Reason::Forbidden);
        assert!(
            failure
                .message
                .starts_with("acting as ServiceAccount t/deployer: Error from server (Forbidden)"),
            "{}",
            failure.message
        );
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
