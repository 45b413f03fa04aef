//! `plan`: what a changed kind would do to every resource of it in the
//! cluster, before any of them sees it. For each resource:
//!
//! 1. its render now, under the revision serving it ([`change::Current`])
//!    and under the change, in process, each built to objects (in memory
//!    where the engine can, else by `kubectl kustomize`, batched);
//! 2. for a change of versions, the stored object through the change's
//!    conversions and back ([`versions`]): the fields that would be lost;
//! 3. the difference ([`difference`]): objects added, changed (which
//!    fields), pruned;
//! 4. when something changes, a server-side dry run of every new object as
//!    the identity that would write it ([`dry_run`]).
//!
//! The counts, the failures and the breaking-change guard's verdict make
//! the [`Report`]; its exit code is 0 when nothing would fail, 1 when
//! something would. Resources are planned `--concurrency` at a time.

mod change;
mod difference;
mod dry_run;
mod fleet;
pub mod report;
mod versions;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use serde_json::Value;

pub(crate) use self::change::{Current, Loaded};
use self::dry_run::{DryRun, Writer};
use self::fleet::Right;
pub use self::report::Report;
use self::report::{Change, Failure, Outcome, Reason, ResourcePlan};
use crate::cli::PlanArgs;
use crate::engine::host::{Engine, Settings};
use crate::kind::Step;
use crate::kind::{KindInfo, ObjectId, Owner, Sandbox};
use crate::kinds::declared::{DeclaredKind, kind_info};
use crate::kinds::registry::Kind;
use crate::kinds::{KindOptions, OwnedObjects};
use crate::kubectl::{Kubectl, KubectlConfig, KubectlError};

/// Why there is no plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Nothing names the change.
    #[error(
        "name the changed kind: a kind folder or a packed KindDefinition file, or --kind NAME with --kustomize-dir or --kind-definition"
    )]
    NoChange,
    /// `--kind` names no folder or definition given.
    #[error("no kind {0:?} in --kind-definition or in a --kustomize-dir folder")]
    UnknownKind(String),
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A folder cannot be packed.
    #[error(transparent)]
    Pack(#[from] crate::kinds::declared::pack::PackError),
    /// A definition is not a kind the operator would serve.
    #[error("{what}: {reason}")]
    Invalid {
        /// Which.
        what: String,
        /// Why.
        reason: String,
    },
    /// Nothing says what serves the resources now.
    #[error(
        "the kind {0} is not a KindDefinition in the cluster: give --current with the kind folder (or packed file) the operator serves it from"
    )]
    NoCurrent(String),
    /// The kind's API is not served.
    #[error(
        "the API server serves no {0}: the kind is not installed (its CRD is not applied), so it has no resources to plan"
    )]
    NotServed(String),
    /// The caller may not read what the plan reads.
    #[error("the plan cannot read the cluster; missing rights: {}", .0.join("; "))]
    Rights(Vec<String>),
    /// The cluster could not be read.
    #[error("cannot read {what} from the cluster: {reason}")]
    Cluster {
        /// What.
        what: String,
        /// Why.
        reason: String,
    },
    /// No temporary directory.
    #[error("cannot make a temporary directory: {0}")]
    Work(#[source] std::io::Error),
    /// No kubectl to build the overlays with.
    #[error("a plan builds overlays with kubectl kustomize: {0}")]
    Kubectl(#[from] KubectlError),
}

impl PlanError {
    fn cluster(what: &str, e: &kube::Error) -> Self {
        Self::Cluster {
            what: what.to_string(),
            reason: crate::error_text::kube(e),
        }
    }
}

/// Plans the change `args` names against the cluster in KUBECONFIG.
pub async fn plan(args: &PlanArgs) -> Result<Report, PlanError> {
    let work = tempfile::Builder::new()
        .prefix("kustomize-operator-plan-")
        .tempdir()
        .map_err(PlanError::Work)?;
    let isolation = sandbox();
    let change = change::change(args, work.path(), isolation.clone())?;
    let client = client().await?;
    let setup = Setup::of(args, &client)?;
    let changed = &change.kind;
    let mut rights = vec![Right {
        group: changed.resource.group.clone(),
        resource: changed.resource.plural.clone(),
        verb: "list",
        namespace: args.namespace.clone(),
    }];
    if args.current.is_none() {
        let definitions = crate::definitions::resource::api_resource();
        rights.push(Right {
            group: definitions.group,
            resource: definitions.plural,
            verb: "get",
            namespace: None,
        });
    }
    fleet::rights(&client, &rights).await?;
    let current = match &args.current {
        Some(path) => change::folder(path, work.path(), isolation)?,
        None => {
            let namespace = args.common.operator_namespace.as_deref();
            change::definition(&client, changed.name(), namespace, work.path(), isolation).await?
        }
    };
    fleet(&client, &setup, &current, &change).await
}

/// How a plan builds objects, whose rights its dry runs use, and how
/// much of the fleet it plans at once.
pub(crate) struct Setup {
    /// The engine the plan is a dry run of: its settings (whose rights
    /// writes use, the namespace planned: `None`, all) and its queue
    /// building overlays with `kubectl kustomize`.
    pub engine: Arc<Engine>,
    /// The kinds' options.
    pub options: KindOptions,
    /// Resources planned at once.
    pub concurrency: usize,
}

impl Setup {
    /// The setup the command line gives, with an engine of its own that
    /// only plans.
    fn of(args: &PlanArgs, client: &Client) -> Result<Self, PlanError> {
        let mut config = KubectlConfig::one_shot(args.kubectl.as_deref())?;
        config.max_concurrent = 2;
        let settings = Settings {
            default_service_account: args.default_service_account.clone(),
            cluster_service_account: args.cluster_service_account.clone(),
            operator_namespace: args.common.operator_namespace.clone(),
            namespace: args.namespace.clone(),
            work_dir: std::env::temp_dir(),
            batch_window: std::time::Duration::from_millis(20),
            batch_max: 100,
            ..Settings::default()
        };
        let engine = Engine::planning(client.clone(), Kubectl::new(config), settings);
        Ok(Self {
            engine: Arc::new(engine),
            options: args.common.kind_options(None),
            concurrency: usize::from(args.concurrency),
        })
    }
}

/// Plans `change` against every live resource of the kind `current`
/// serves: the operator's in-cluster plan of a new generation and the
/// command's alike.
pub(crate) async fn fleet(
    client: &Client,
    setup: &Setup,
    current: &Current,
    change: &Loaded,
) -> Result<Report, PlanError> {
    let changed = &change.kind;
    let Some(served) = current.kind().cloned() else {
        return Err(PlanError::NoCurrent(changed.name().to_string()));
    };
    fleet::served(client, &served.resource).await?;
    let resources = fleet::list(
        client,
        &served.resource,
        served.namespaced(),
        setup.engine.settings().namespace.as_deref(),
    )
    .await?;
    let planner = Planner::new(setup, client.clone(), current, change, &served);
    // The futures made first: a stream mapping borrowed resources is not
    // `Send` for every lifetime, as the operator's reconcile needs.
    let planned: Vec<_> = resources.iter().map(|r| planner.one(r)).collect();
    let mut plans: Vec<ResourcePlan> = futures::stream::iter(planned)
        .buffer_unordered(setup.concurrency.max(1))
        .collect()
        .await;
    plans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut report = Report {
        kind: changed.name().to_string(),
        current: current.describe(),
        change: change.what.clone(),
        summary: report::Summary::default(),
        guard: versions::guard(&served, change),
        resources: plans,
        notes: current.notes().to_vec(),
    };
    report.count();
    Ok(report)
}

/// The kubeconfig's client, with the decoding guard.
async fn client() -> Result<Client, PlanError> {
    let failed = |reason: String| PlanError::Cluster {
        what: "the kubeconfig".into(),
        reason,
    };
    (crate::guard::kubeconfig_client().await).map_err(|e| failed(e.to_string()))
}

/// Render workers for the definitions' templates: this binary, under the
/// operator's default limits (`None`, rendered in process, when it cannot
/// be found again).
fn sandbox() -> Option<Arc<Sandbox>> {
    let exe = std::env::current_exe().ok()?;
    let (time, memory) = (Sandbox::DEFAULT_TIME, Sandbox::DEFAULT_MEMORY);
    Some(Arc::new(Sandbox::new(exe, 2, time, memory)))
}

/// A resource's objects, each with how it is written.
type Objects = Vec<(Value, Applied)>;

/// How an object is applied: its field manager, and whether it takes
/// fields other managers own.
#[derive(Debug, Clone)]
struct Applied {
    field_manager: String,
    force: bool,
}

/// What planning one resource needs.
struct Planner<'a> {
    client: Client,
    options: KindOptions,
    current: &'a Current,
    change: &'a Loaded,
    converts: bool,
    dry_run: DryRun,
    engine: Arc<Engine>,
    /// The changed kind, as the engine would serve it.
    info: KindInfo<kube::core::ApiResource>,
}

impl<'a> Planner<'a> {
    fn new(
        setup: &Setup,
        client: Client,
        current: &'a Current,
        change: &'a Loaded,
        served: &DeclaredKind,
    ) -> Self {
        Self {
            dry_run: DryRun::new(client.clone()),
            client,
            options: setup.options.clone(),
            current,
            change,
            converts: versions::converts(served, &change.kind),
            engine: setup.engine.clone(),
            info: kind_info(&change.kind),
        }
    }

    /// The plan of one resource.
    async fn one(&self, resource: &Value) -> ResourcePlan {
        let meta = &resource["metadata"];
        let mut plan = ResourcePlan {
            namespace: meta["namespace"].as_str().map(str::to_string),
            name: meta["name"].as_str().unwrap_or_default().to_string(),
            revision: None,
            outcome: Outcome::Unchanged,
            objects: Vec::new(),
            failures: Vec::new(),
            lost_fields: Vec::new(),
            notes: Vec::new(),
        };
        let before = self.now(resource, &mut plan).await;
        let after = self.changed(resource, &mut plan).await;
        if let Some(after) = after {
            let old: Vec<Value> = before.into_iter().flatten().map(|(o, _)| o).collect();
            let new: Vec<Value> = after.iter().map(|(o, _)| o.clone()).collect();
            plan.objects = difference::objects(&old, &new);
            if !plan.objects.is_empty() {
                self.dry_runs(resource, &after, &mut plan).await;
            }
        }
        plan.settle();
        plan
    }

    /// The resource's objects now (`None`, said in a note, when unknown).
    async fn now(&self, resource: &Value, plan: &mut ResourcePlan) -> Option<Objects> {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(resource["metadata"]["labels"].clone()).unwrap_or_default();
        let meta = &resource["metadata"];
        let (namespace, name) = (meta["namespace"].as_str(), meta["name"].as_str());
        let chosen = self
            .current
            .choose(namespace, name.unwrap_or_default(), &labels);
        let (revision, kind) = match chosen {
            Ok(chosen) => chosen,
            Err(why) => {
                plan.notes.push(format!("no revision serves it now: {why}"));
                return None;
            }
        };
        plan.revision = revision;
        match self.objects(&kind, resource).await {
            Ok(objects) => Some(objects),
            Err(failure) => {
                let note = format!("its render now fails: {}", failure.message);
                plan.notes.push(note);
                None
            }
        }
    }

    /// The resource's objects under the change (`None` when it would fail
    /// before a dry run: the failure is in `plan`).
    async fn changed(&self, resource: &Value, plan: &mut ResourcePlan) -> Option<Objects> {
        let converted;
        let doc = if self.converts {
            match versions::round_trip(&self.change.kind, resource) {
                Ok(round_trip) => {
                    plan.lost_fields = round_trip.lost;
                    plan.failures.extend(round_trip.failures);
                    converted = round_trip.object;
                    &converted
                }
                Err(failure) => {
                    plan.failures.push(failure);
                    return None;
                }
            }
        } else {
            resource
        };
        match self.objects(&self.change.kind, doc).await {
            Ok(objects) => Some(objects),
            Err(failure) => {
                plan.failures.push(failure);
                None
            }
        }
    }

    /// `resource` rendered by `kind` and built to objects.
    async fn objects(
        &self,
        kind: &Arc<DeclaredKind>,
        resource: &Value,
    ) -> Result<Objects, Failure> {
        let failed = |reason: Reason, message: String| Failure {
            object: None,
            reason,
            message,
        };
        let Some(dir) = kind.templates.clone() else {
            return Err(failed(
                Reason::RenderFailed,
                "the kind has no templates".into(),
            ));
        };
        let preview = Kind::Declared(kind.clone())
            .render_live(
                resource,
                &self.client,
                &self.options,
                &dir,
                OwnedObjects::Skip,
            )
            .await
            .map_err(|e| failed(Reason::RenderFailed, e.to_string()))?;
        let uid = resource["metadata"]["uid"].as_str().unwrap_or_default();
        let takes_back = preview.takes_back;
        let mut objects = Vec::new();
        for (step, overlay) in preview.steps.into_iter().zip(preview.overlays) {
            let applied = match step {
                Step::Apply { field_manager, .. } => Applied {
                    field_manager: field_manager
                        .unwrap_or_else(|| Engine::FIELD_MANAGER.to_string()),
                    force: takes_back,
                },
                Step::Patch { field_manager, .. } => Applied {
                    field_manager,
                    force: true,
                },
                Step::DeleteForeign { .. } => continue,
            };
            let Some(overlay) = overlay else { continue };
            let built = match overlay.prebuilt() {
                Some(manifests) => manifests.to_vec(),
                None => {
                    let built = self.engine.builds().build(overlay, uid.to_string()).await;
                    let built = built.ok_or_else(|| "the build queue stopped".to_string());
                    built
                        .and_then(|b| b.map_err(|e| e.to_string()))
                        .map_err(|why| failed(Reason::BuildFailed, why))?
                }
            };
            objects.extend(built.into_iter().map(|o| (o, applied.clone())));
        }
        Ok(objects)
    }

    /// Dry runs of every object of `objects`, as the identity that would
    /// write them for `resource`.
    async fn dry_runs(&self, resource: &Value, objects: &Objects, plan: &mut ResourcePlan) {
        let user = match self.writer(resource) {
            Ok(user) => user,
            Err(failure) => {
                plan.failures.push(failure);
                return;
            }
        };
        let runs = objects.iter().map(|(object, applied)| {
            let writer = Writer {
                field_manager: &applied.field_manager,
                force: applied.force,
                user: user.as_deref(),
            };
            self.dry_run.apply(object, writer)
        });
        let results = futures::future::join_all(runs).await;
        plan.failures
            .extend(results.into_iter().filter_map(Result::err));
        self.taken(resource, objects, plan).await;
    }

    /// Objects new to `resource` that exist already and are not its own:
    /// the engine would refuse them. Unchecked for a kind that adopts
    /// objects by label.
    async fn taken(&self, resource: &Value, objects: &Objects, plan: &mut ResourcePlan) {
        if !self.change.kind.file.spec.reconcile.adopt.is_empty() {
            return;
        }
        let uid = resource["metadata"]["uid"].as_str().unwrap_or_default();
        let added = (plan.objects.iter())
            .filter(|o| o.change == Change::Added)
            .filter_map(|o| {
                let same = |(v, _): &&(Value, Applied)| {
                    ObjectId::of_manifest(v).as_ref() == Some(&o.object)
                };
                objects.iter().find(same)
            });
        let checks = added.map(|(object, _)| self.dry_run.taken(object, uid));
        let taken = futures::future::join_all(checks).await;
        plan.failures.extend(taken.into_iter().flatten());
    }

    /// Whose rights the writes of `resource` use, as the operator decides
    /// (the user to act as; `None`: the operator's own account).
    fn writer(&self, resource: &Value) -> Result<Option<String>, Failure> {
        let meta = &resource["metadata"];
        let owner = Owner {
            api_version: resource["apiVersion"].as_str().unwrap_or_default().into(),
            kind: resource["kind"].as_str().unwrap_or_default().into(),
            namespace: meta["namespace"].as_str().map(str::to_string),
            name: meta["name"].as_str().unwrap_or_default().into(),
            uid: meta["uid"].as_str().unwrap_or_default().into(),
        };
        match self.engine.settings().writer_of(&owner, &self.info) {
            Ok(identity) => Ok(identity.username()),
            Err(refusal) => Err(Failure {
                object: None,
                reason: Reason::Refused,
                message: refusal.to_string(),
            }),
        }
    }
}
