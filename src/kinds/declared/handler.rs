//! The handler serving a declared kind: its resources are [`DeclaredObject`]s,
//! its plan is the kind file's recipe, and the engine does the rest as for
//! any kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;

use super::DeclaredKind;
use super::children::Children;
use super::evaluation::{Budget, Evaluations, Overdue};
use super::file::{Deletion, FieldConflicts, ObjectSelector, ReadinessRule, Scope};
use super::object::DeclaredObject;
use super::reach::{Beyond, Reach};
use super::recipe::ValueRule;
use super::references::{self, Readers};
/// The status field a resource served from revisions shows its revision in.
pub use super::rollout::REVISION_FIELD;
use super::rollout::Rollout;
use crate::kind::{
    CommonStatus, FromObjects, Handler, HandlerError, KindInfo, KustomizeDir, ObjectId, Plan,
    PlannedEvent, Watching,
};

/// The finalizer the resources of a declared kind of API group `group`
/// carry (`<group>/kustomize-operator`).
pub fn finalizer(group: &str) -> String {
    format!("{group}/kustomize-operator")
}

/// What the engine knows of `kind`: its name, finalizer and API, and
/// its policy (field conflicts, owner references, whose rights its writes
/// use).
pub fn kind_info(kind: &DeclaredKind) -> KindInfo<ApiResource> {
    let reconcile = &kind.file.spec.reconcile;
    KindInfo {
        templates: kind.templates.clone(),
        takes_back: reconcile.field_conflicts == FieldConflicts::TakeBack,
        owner_references: reconcile.owner_references,
        health: true,
        tenant_writes: kind.namespaced(),
        service_account: reconcile.service_account_name.clone(),
        ..KindInfo::new(
            kind.name(),
            finalizer(&kind.file.spec.group),
            kind.resource.clone(),
        )
    }
}

/// Serves one declared kind.
#[derive(Debug, Clone)]
pub struct DeclaredHandler {
    kind: Arc<DeclaredKind>,
    info: KindInfo<ApiResource>,
    /// Where its resources' objects may be.
    reach: Reach,
    /// Who read which references at their last reconcile.
    readers: Arc<Readers>,
    /// The revisions of a kind defined in the cluster, and which serves
    /// which resource (`None`: `kind` serves every resource).
    rollout: Option<Arc<Rollout>>,
}

impl DeclaredHandler {
    /// The handler of `kind`.
    pub fn new(kind: Arc<DeclaredKind>) -> Self {
        Self {
            reach: reach(&kind),
            info: kind_info(&kind),
            kind,
            readers: Arc::default(),
            rollout: None,
        }
    }

    /// The handler of a kind served from revisions: the latest gives the
    /// kind's API and policy, `rollout` chooses each resource's revision.
    pub fn with_rollout(rollout: Arc<Rollout>) -> Option<Self> {
        let mut handler = Self::new(rollout.latest_kind()?.clone());
        handler.rollout = Some(rollout);
        Some(handler)
    }

    /// The kind it serves.
    pub fn kind(&self) -> &DeclaredKind {
        &self.kind
    }

    /// Its revisions, when it is served from several.
    pub fn rollout(&self) -> Option<&Arc<Rollout>> {
        self.rollout.as_ref()
    }

    /// The revision serving `resource` (its number, `None` without
    /// revisions) and its kind.
    fn kind_for(
        &self,
        resource: &DeclaredObject,
    ) -> Result<(Option<u32>, &Arc<DeclaredKind>), HandlerError> {
        let Some(rollout) = &self.rollout else {
            return Ok((None, &self.kind));
        };
        let namespace = resource.namespace();
        let (number, kind) = rollout
            .choose(
                namespace.as_deref(),
                &resource.name_any(),
                resource.labels(),
            )
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        Ok((Some(number), kind))
    }
}

/// Where a declared kind's objects may be: a namespaced kind's in each
/// resource's namespace and what its `reach` declares; a cluster-scoped
/// kind's wherever its writer may write.
fn reach(kind: &DeclaredKind) -> Reach {
    if !kind.namespaced() {
        return Reach::Anywhere;
    }
    let beyond = kind.file.spec.reach.iter().map(|rule| Beyond {
        group: rule
            .api_version
            .rsplit_once('/')
            .map_or_else(String::new, |(g, _)| g.to_string()),
        kind: rule.kind.clone(),
        namespaces: rule.namespaces.clone(),
    });
    Reach::Confined(beyond.collect())
}

impl Handler for DeclaredHandler {
    type Resource = DeclaredObject;
    /// What the resource's references read, by reference name.
    type Observed = BTreeMap<String, Value>;
    type Status = ();

    fn info(&self) -> &KindInfo<ApiResource> {
        &self.info
    }

    fn api(&self, client: Client, namespace: Option<&str>) -> Api<DeclaredObject> {
        match (self.kind.file.spec.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &self.kind.resource),
            _ => Api::all_with(client, &self.kind.resource),
        }
    }

    fn common_status(&self, resource: &DeclaredObject) -> Option<CommonStatus> {
        resource.status_as()
    }

    fn status(&self, resource: &DeclaredObject) -> Option<Value> {
        resource.status_as()
    }

    /// The references, read with the client's own rights (`diff` and
    /// `render KIND/NAME`: the requester's).
    async fn observe(
        &self,
        resource: &DeclaredObject,
        client: &Client,
    ) -> Result<Read, HandlerError> {
        let (_, kind) = self.kind_for(resource)?;
        let wanted = kind.recipe.references(&kind.file.spec, resource)?;
        references::read(client, None, &wanted).await
    }

    /// The references, read as the identity the resource's writes use;
    /// remembered, so a change to what was read reconciles the resource.
    async fn observe_as(
        &self,
        resource: &DeclaredObject,
        client: &Client,
        user: Option<&str>,
    ) -> Result<Read, HandlerError> {
        let (_, kind) = self.kind_for(resource)?;
        if kind.file.spec.references.is_empty() {
            return Ok(Read::new());
        }
        let wanted = kind.recipe.references(&kind.file.spec, resource)?;
        let key = key(resource);
        // Remembered before the read: a reference not there yet reconciles
        // the resource when it comes.
        self.readers.reads(key.clone(), wanted.clone());
        let read = references::read(client, user, &wanted).await?;
        self.readers.saw(&key, references::for_expressions(&read));
        Ok(read)
    }

    /// The references, from the documents after the resource in the file.
    fn observe_offline(
        &self,
        resource: &DeclaredObject,
        documents: &[Value],
    ) -> Result<Read, HandlerError> {
        let (_, kind) = self.kind_for(resource)?;
        let wanted = kind.recipe.references(&kind.file.spec, resource)?;
        Ok(references::from_documents(&wanted, documents))
    }

    fn plan(&self, resource: &DeclaredObject, read: &Read) -> Result<Plan<()>, HandlerError> {
        let (revision, kind) = self.kind_for(resource)?;
        let mut overlay = (kind.recipe).overlay(kind.name(), &kind.file.spec, resource, read)?;
        // A Secret's data may be anywhere in it now: never kept on disk.
        overlay.sensitive |= (kind.file.spec.references.values()).any(|r| r.kind == "Secret");
        let mut events = Vec::new();
        if let (Some(rollout), Some(revision)) = (&self.rollout, revision) {
            rollout.record(key(resource), revision);
            // Told once, when the move is applied.
            events.extend(
                rollout
                    .withdrawn_pin(resource.labels())
                    .map(|note| PlannedEvent::warning("RevisionWithdrawn", note)),
            );
        }
        Ok(Plan {
            requeue_after: kind.interval,
            events,
            ..Plan::apply(overlay)
        })
    }

    /// A change of an object any kept revision reads starts the
    /// reconciles of the resources that read it: the stable revision
    /// serves most resources while the latest has a canary, and a change
    /// of what either reads must start their reconciles.
    fn nudges(
        &self,
        watching: Watching<DeclaredObject>,
    ) -> Vec<BoxStream<'static, ObjectRef<DeclaredObject>>> {
        let kind = &self.info.dyn_type;
        (self.referenced().into_iter())
            .map(|read| references::nudges(&watching, read, self.readers.clone(), kind.clone()))
            .collect()
    }

    fn forget(&self, resource: &DeclaredObject) {
        self.readers.forget(&key(resource));
        if let Some(rollout) = &self.rollout {
            rollout.forget(&key(resource));
        }
    }

    fn reaches(&self, resource: &DeclaredObject, object: &ObjectId) -> bool {
        let home = resource.meta().namespace.as_deref();
        let namespace = object.namespace.as_deref();
        self.reach
            .allows(home, &object.api_version, &object.kind, namespace)
    }

    fn retains(&self, resource: &DeclaredObject) -> bool {
        let kind = self.kind_for(resource).map_or(&self.kind, |(_, kind)| kind);
        kind.file.spec.reconcile.deletion_policy == Deletion::Retain
    }

    fn revision_for(&self, resource: &DeclaredObject) -> Option<u32> {
        self.kind_for(resource).ok()?.0
    }

    fn templates_for(&self, resource: &DeclaredObject) -> Option<Arc<KustomizeDir>> {
        self.rollout.as_ref()?;
        self.kind_for(resource).ok()?.1.templates.clone()
    }

    /// Objects carrying every `reconcile.adopt` label (values rendered for
    /// the resource) are its own.
    fn adopts(&self, resource: &DeclaredObject, live: &ObjectMeta) -> bool {
        let kind = self.kind_for(resource).map_or(&self.kind, |(_, kind)| kind);
        let Some(wanted) = kind.recipe.adoption(&kind.file.spec, resource) else {
            return false;
        };
        let labels = live.labels.clone().unwrap_or_default();
        wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// The kind file's status fields, readiness rules and children's
    /// `readyWhen`, on the objects the resource applied. A kind with CEL
    /// reads them on a thread of [`Evaluations`], within the budget of one
    /// look and its deadline; one without (Sample among them) here, paying
    /// nothing for CEL at each look at its health.
    async fn read_objects(
        &self,
        resource: &DeclaredObject,
        objects: &BTreeMap<ObjectId, Value>,
    ) -> FromObjects {
        let (revision, kind) = match self.kind_for(resource) {
            Ok(chosen) => chosen,
            Err(_) => (None, &self.kind),
        };
        if kind.expressions.is_empty() {
            return read_objects(kind, revision, resource, objects, None);
        }
        let kind = kind.clone();
        let (resource, objects) = (resource.clone(), objects.clone());
        let seen = self.readers.seen(&key(&resource));
        let read = Evaluations::shared().run(move |look| {
            look.entering("the kind file's expressions");
            let budget = Budget::per_look(look);
            let children = Children::of(&kind, &resource, &objects, seen, budget);
            read_objects(&kind, revision, &resource, &objects, Some(&children))
        });
        match read.await {
            Ok(read) => read,
            // Nothing of its own was run: it waits, and is looked at again.
            Err(busy @ Overdue::Busy(_)) => FromObjects {
                not_ready: vec![busy.to_string()],
                ..FromObjects::default()
            },
            Err(overdue) => FromObjects {
                over_budget: vec![overdue.to_string()],
                ..FromObjects::default()
            },
        }
    }
}

/// What `kind` (revision `revision`, if served from revisions) reads from
/// `objects` for `resource`: its status fields, readiness rules and
/// children's `readyWhen`, the CEL ones over `children` (a kind with
/// expressions).
fn read_objects(
    kind: &DeclaredKind,
    revision: Option<u32>,
    resource: &DeclaredObject,
    objects: &BTreeMap<ObjectId, Value>,
    children: Option<&Children>,
) -> FromObjects {
    let spec = &kind.file.spec;
    let compiled = &kind.expressions;
    let mut read = FromObjects::default();
    if !spec.status.is_empty() {
        read.status = Some(status_fields(
            kind,
            children,
            resource,
            objects,
            &mut read.not_ready,
        ));
    }
    if let Some(revision) =
        revision.filter(|_| !spec.status.iter().any(|f| f.field == REVISION_FIELD))
    {
        let fields = read.status.get_or_insert_default();
        fields.insert(REVISION_FIELD.into(), revision.into());
    }
    for (i, rule) in spec.readiness.iter().enumerate() {
        let expression = compiled.readiness.get(i).and_then(Option::as_ref);
        let unmet = match expression.zip(children) {
            Some((expression, children)) => {
                let field = format!("spec.readiness[{i}].expression");
                children.holds(expression, &format!("readiness[{i}]"), &field)
            }
            None => readiness(&kind.recipe, i, rule, resource, objects),
        };
        read.not_ready.extend(unmet);
    }
    if let Some(children) = children {
        for (name, expression) in &compiled.ready_when {
            read.not_ready.extend(children.ready_when(name, expression));
        }
        read.over_budget = children.refused();
    }
    read
}

/// What a resource's references read, by reference name.
type Read = BTreeMap<String, Value>;

impl DeclaredHandler {
    /// The kinds of every kept revision's references.
    pub(super) fn referenced(&self) -> Vec<ApiResource> {
        let kinds: Vec<&Arc<DeclaredKind>> = match &self.rollout {
            Some(rollout) => rollout.kinds().collect(),
            None => vec![&self.kind],
        };
        let declared = kinds.iter().flat_map(|k| k.file.spec.references.values());
        let mut types: Vec<ApiResource> = declared
            .map(|r| references::api_resource(&r.api_version, &r.kind))
            .collect();
        types.sort_by(|a, b| (&a.group, &a.kind).cmp(&(&b.group, &b.kind)));
        types.dedup_by(|a, b| a.group == b.group && a.kind == b.kind);
        types
    }
}

/// A resource's key among the readers.
fn key(resource: &DeclaredObject) -> references::Key {
    (resource.namespace(), resource.name_any())
}

/// The kind file's status fields of `resource`, computed (`children`, for a
/// kind with expressions) or copied from its objects; what cannot be said
/// goes to `not_ready`.
fn status_fields(
    kind: &DeclaredKind,
    children: Option<&Children>,
    resource: &DeclaredObject,
    objects: &BTreeMap<ObjectId, Value>,
    not_ready: &mut Vec<String>,
) -> serde_json::Map<String, Value> {
    let mut fields = serde_json::Map::new();
    for (i, field) in kind.file.spec.status.iter().enumerate() {
        let expression = kind.expressions.status.get(i).and_then(Option::as_ref);
        let value = match expression.zip(children) {
            Some((expression, children)) => match children.eval(expression, &expression_field(i)) {
                Ok(value) => value,
                Err(why) => {
                    not_ready.push(format!("status.{}: {why}", field.field));
                    None
                }
            },
            None => copied(kind, i, field, resource, objects),
        };
        match value.map(|v| fit(&v, &field.type_)) {
            Some(Ok(value)) => {
                fields.insert(field.field.clone(), value);
            }
            // Written as it is, the API server would refuse the whole
            // status: the field is left out and Ready says why.
            Some(Err(what)) => not_ready.push(format!(
                "status.{}: the kind file's status[{i}] gives {what}, not the {} it declares; left out",
                field.field, field.type_
            )),
            None => {}
        }
    }
    fields
}

/// The kind file's field of status field `i`'s expression.
fn expression_field(i: usize) -> String {
    format!("spec.status[{i}].expression")
}

/// Status field `i`, copied from the object `from` names (by `path`).
fn copied(
    kind: &DeclaredKind,
    i: usize,
    field: &super::file::StatusField,
    resource: &DeclaredObject,
    objects: &BTreeMap<ObjectId, Value>,
) -> Option<Value> {
    let (from, path) = (field.from.as_ref()?, field.path.as_deref()?);
    let name = kind.recipe.status_source(i, resource).ok()?;
    find(objects, from, &name)
        .and_then(|(_, o)| dotted(o, path))
        .cloned()
}

/// `value` as a status field of OpenAPI type `type_` (a number or a
/// boolean may be written as a string); else what it is.
fn fit(value: &Value, type_: &str) -> Result<Value, &'static str> {
    let what = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    match (type_, value) {
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(value.clone()),
        ("number", Value::Number(_))
        | ("boolean", Value::Bool(_))
        | ("string", Value::String(_)) => Ok(value.clone()),
        ("string", Value::Number(_) | Value::Bool(_)) => Ok(Value::String(value.to_string())),
        ("array", Value::Array(_)) | ("object", Value::Object(_)) => Ok(value.clone()),
        _ => Err(what),
    }
}

/// The object of `objects` that `from` names (`name` rendered).
fn find<'a>(
    objects: &'a BTreeMap<ObjectId, Value>,
    from: &ObjectSelector,
    name: &str,
) -> Option<(&'a ObjectId, &'a Value)> {
    objects.iter().find(|(id, _)| {
        id.kind == from.kind
            && id.name == name
            && from
                .api_version
                .as_ref()
                .is_none_or(|v| *v == id.api_version)
    })
}

/// `None` when readiness rule `i` holds for `resource`, else what it waits for.
fn readiness(
    recipe: &super::recipe::Recipe,
    i: usize,
    rule: &ReadinessRule,
    resource: &DeclaredObject,
    objects: &BTreeMap<ObjectId, Value>,
) -> Option<String> {
    let (from, path) = (rule.from.as_ref()?, rule.path.as_deref()?);
    let rendered = match recipe.readiness(i, rule, resource) {
        Ok(r) => r,
        Err(e) => return Some(format!("readiness rule {i}: {e}")),
    };
    let label = format!("{}/{}", from.kind.to_lowercase(), rendered.name);
    let Some((_, object)) = find(objects, from, &rendered.name) else {
        return Some(format!("{label}: not found"));
    };
    let value = dotted(object, path);
    let shown = value.map_or_else(|| "unset".to_string(), Value::to_string);
    match rendered.wanted {
        ValueRule::Equals(want) => {
            let text = value.map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
            (text.as_deref() != Some(want.as_str()))
                .then(|| format!("{label}: {path} is {shown}, waiting for {want}"))
        }
        ValueRule::AtLeast(want) => {
            // Kubernetes leaves zero counts out of a status: unset reads as 0.
            let have = value.map_or(Some(0.0), Value::as_f64);
            let Ok(min) = want.trim().parse::<f64>() else {
                return Some(format!("{label}: atLeast {want:?} is not a number"));
            };
            (have.is_none_or(|h| h < min))
                .then(|| format!("{label}: {path} is {shown}, waiting for at least {want}"))
        }
    }
}

/// The value at a dotted path (`.status.availableReplicas`).
pub fn dotted<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
        .try_fold(value, |v, part| v.get(part))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_status_value_is_written_only_in_its_declared_type() {
        assert_eq!(fit(&json!(2), "integer"), Ok(json!(2)));
        assert_eq!(fit(&json!(2.5), "number"), Ok(json!(2.5)));
        assert_eq!(fit(&json!(2), "string"), Ok(json!("2")));
        assert_eq!(fit(&json!(true), "boolean"), Ok(json!(true)));
        assert_eq!(fit(&json!([{"type": "Ready"}]), "string"), Err("a list"));
        assert_eq!(fit(&json!(2.5), "integer"), Err("a number"));
        assert_eq!(fit(&json!("x"), "integer"), Err("a string"));
    }

    #[test]
    fn dotted_paths_read_nested_fields() {
        let v = json!({"status": {"availableReplicas": 2}});
        assert_eq!(dotted(&v, ".status.availableReplicas"), Some(&json!(2)));
        assert_eq!(dotted(&v, ".status.missing"), None);
        assert_eq!(dotted(&v, "status"), Some(&json!({"availableReplicas": 2})));
    }
}
