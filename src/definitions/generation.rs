//! One generation of a definition, checked as a kind folder is at start:
//! unpacked into a private directory, its templates parsed, its kind file
//! validated, its base built, its names free, its schema compatible with
//! what is served. What fails is a [`Rejection`] naming the file and the
//! field.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::resource::{self, Reason};
use crate::conversion::{Filed, Webhook};
use crate::engine::host::Engine;
use crate::kind::KustomizeDir;
use crate::kind::Sandbox;
use crate::kinds::declared::breaking::{self, BreakingChange};
use crate::kinds::declared::rbac::{self, ObjectType};
use crate::kinds::declared::{DeclaredKind, pack};

/// A generation that passed every check.
#[derive(Debug, Clone)]
pub struct Generation {
    /// `metadata.generation`.
    pub number: i64,
    /// The kind, with its own templates.
    pub kind: Arc<DeclaredKind>,
    /// The CRD it declares, carrying the definition's marker.
    pub crd: KeptCrd,
    /// The object types its overlays can produce.
    pub object_types: BTreeSet<ObjectType>,
    /// The size of the definition, in bytes (as JSON).
    pub bytes: usize,
    /// The sha256 of what makes the kind (the spec but its rollout): two
    /// generations of the same digest are one revision.
    pub digest: String,
    /// What the conversion webhook answers for the kind with, read from
    /// its CRD as every replica reads it (a kind of several versions).
    pub conversions: Option<Arc<Filed>>,
}

impl Generation {
    /// The CRD's name.
    pub fn crd_name(&self) -> String {
        self.crd.name.to_string()
    }

    /// The CRD it declares, carrying the definition's marker.
    pub fn crd(&self) -> Result<CustomResourceDefinition, serde_json::Error> {
        self.crd.read(&self.kind)
    }
}

/// A CRD as a generation keeps it, shared by every copy of the
/// generation (the table of what is served, its revisions, the rollout).
/// Typed, a CRD's schema weighs ten times its text, and a definition's
/// CRD is only read when it is applied or compared: a kind of one version
/// keeps none (some 4.5 KiB of text for the lab's Greeting), its CRD built
/// again from the kind when read; a kind of several keeps its JSON text,
/// which carries the conversion webhook attached to it.
#[derive(Clone, Debug)]
pub struct KeptCrd {
    /// The CRD's name.
    pub name: Arc<str>,
    kept: Kept,
}

/// How a [`KeptCrd`] is kept.
#[derive(Clone, Debug)]
enum Kept {
    /// Built from the kind when read, marked as the definition's (its name).
    Built { marker: Arc<str> },
    /// As JSON text.
    Text(Arc<str>),
}

impl KeptCrd {
    /// The CRD of a kind, built again from it when read, marked as the
    /// definition `marker`'s.
    fn built(kind: &DeclaredKind, marker: &str) -> Self {
        Self {
            name: kind.crd_name().into(),
            kept: Kept::Built {
                marker: marker.into(),
            },
        }
    }

    /// Keeps `crd` as it is.
    pub fn new(crd: &CustomResourceDefinition) -> Self {
        Self {
            name: crd.metadata.name.as_deref().unwrap_or_default().into(),
            kept: Kept::Text(serde_json::to_string(crd).unwrap_or_default().into()),
        }
    }

    /// The CRD of `kind`, read back.
    fn read(&self, kind: &DeclaredKind) -> Result<CustomResourceDefinition, serde_json::Error> {
        match &self.kept {
            Kept::Text(json) => serde_json::from_str(json),
            Kept::Built { marker } => {
                let mut crd = kind.crd();
                crd.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(resource::MARKER_LABEL.into(), marker.to_string());
                Ok(crd)
            }
        }
    }
}

/// Why a generation is not served.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Rejection {
    /// A file or field is wrong, or the definition cannot be unpacked.
    #[error("{0}")]
    Invalid(String),
    /// The kind's name or CRD is another kind's.
    #[error("{0}")]
    Clash(String),
    /// The kind's base does not build.
    #[error("the kind's base does not build: {0}")]
    Base(String),
    /// Serving it would take the definitions served past their budget.
    #[error("{0}")]
    TooLarge(String),
    /// The schema or identity changed in ways stored resources break on.
    #[error(
        "breaking change{}: {}; set the annotation {} to \"true\" to allow it",
        if .0.len() == 1 { "" } else { "s" },
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        resource::ALLOW_BREAKING_ANNOTATION
    )]
    Breaking(Vec<BreakingChange>),
}

impl Rejection {
    /// The `Accepted` condition's reason.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Invalid(_) => Reason::Invalid,
            Self::Clash(_) => Reason::Clash,
            Self::Base(_) => Reason::BaseFailed,
            Self::TooLarge(_) => Reason::TooLarge,
            Self::Breaking(_) => Reason::BreakingChange,
        }
    }
}

/// A name or CRD another kind has.
#[derive(Debug, Clone)]
pub struct Taken {
    /// Its short name.
    pub name: String,
    /// Its CRD's name.
    pub crd: String,
    /// Who has it (`the built-in kind sample`, `the KindDefinition x`).
    pub by: String,
}

/// Unpacks and checks `definition` (offline: files, templates, kind
/// file) in a private directory under `work_dir`, removed on return. Its
/// templates render in `isolation` (the example at once, then every
/// resource's), when given.
pub fn load(
    definition: &DynamicObject,
    work_dir: &Path,
    isolation: Option<Arc<Sandbox>>,
) -> Result<Generation, Rejection> {
    let name = definition.name_any();
    let text = serde_json::to_string(definition).map_err(|e| Rejection::Invalid(e.to_string()))?;
    let tmp = tempfile::Builder::new()
        .prefix("definition-")
        .tempdir_in(work_dir)
        .map_err(|e| Rejection::Invalid(format!("cannot unpack: {e}")))?;
    let root = tmp.path();
    let local = |message: String| Rejection::Invalid(relative(&message, root));
    let folder = pack::unpack(&text, &format!("KindDefinition {name}"), root)
        .map_err(|e| local(e.to_string()))?;
    let mut dir = KustomizeDir::load(root).map_err(|e| local(e.to_string()))?;
    let mut kind =
        DeclaredKind::load(&folder, &dir.templates_of(&name)).map_err(|e| local(e.to_string()))?;
    if let Some(isolation) = isolation {
        dir.isolate(isolation.clone());
        kind.isolate(isolation);
    }
    kind.render_example(&dir).map_err(|e| {
        Rejection::Invalid(format!(
            "{name}: the overlay of an example resource does not render: {e}"
        ))
    })?;
    kind.path = PathBuf::from(format!("KindDefinition {name}"));
    kind.templates = Some(Arc::new(dir));
    let crd = KeptCrd::built(&kind, &name);
    Ok(Generation {
        number: definition.metadata.generation.unwrap_or_default(),
        kind: Arc::new(kind),
        crd,
        object_types: BTreeSet::new(),
        bytes: text.len(),
        digest: digest(&definition.data["spec"]),
        conversions: None,
    })
}

/// The sha256 (hex) of a definition's `spec` but its rollout: its kind
/// and files.
pub fn digest(spec: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let mut kind = spec.clone();
    if let Some(fields) = kind.as_object_mut() {
        fields.remove(pack::ROLLOUT_FIELD);
    }
    hex::encode(Sha256::digest(kind.to_string().as_bytes()))
}

/// Gives the CRD of a kind of several versions the operator's conversion
/// webhook, or refuses it when the operator serves none.
pub fn attach_webhook(
    generation: &mut Generation,
    webhook: Option<&Webhook>,
) -> Result<(), Rejection> {
    if !generation.kind.versions().several() {
        return Ok(());
    }
    let Some(webhook) = webhook else {
        return Err(Rejection::Invalid(format!(
            "{}/kind.yaml: spec.versions: the kind serves older versions, and this operator serves no conversion webhook to convert them (run it with --conversion-webhook-addr and --conversion-webhook-url or --conversion-webhook-service)",
            generation.kind.name()
        )));
    };
    let kind = generation.kind.clone();
    let unreadable = |e: serde_json::Error| Rejection::Invalid(format!("its CRD: {e}"));
    let mut crd = generation.crd().map_err(unreadable)?;
    let filed = webhook
        .attach(&mut crd, kind.versions())
        .map_err(|e| Rejection::Invalid(e.to_string()))?;
    generation.crd = KeptCrd::new(&crd);
    generation.conversions = Some(Arc::new(filed));
    Ok(())
}

/// Builds the kind's base (`kubectl kustomize`), and notes the object
/// types its overlays can produce.
pub async fn build_base(engine: &Engine, generation: &mut Generation) -> Result<(), Rejection> {
    let kind = &generation.kind;
    let base = engine
        .build_base(kind.templates.as_deref(), kind.name())
        .await
        .map_err(|failure| Rejection::Base(failure.to_string()))?;
    generation.object_types = rbac::object_types(kind, &base);
    Ok(())
}

/// Refuses a generation that would take the bytes of the definitions
/// served (`others`, and its own: `kept`, the generation with the
/// revisions kept beside it) past `budget`: each revision is held in
/// memory (its files, parsed templates, CRD) and loaded at every start.
pub fn check_budget(
    generation: &Generation,
    kept: usize,
    others: usize,
    budget: usize,
) -> Result<(), Rejection> {
    let total = others + kept.max(generation.bytes);
    if total <= budget {
        return Ok(());
    }
    Err(Rejection::TooLarge(format!(
        "serving this definition ({} KiB, {} KiB with the revisions it keeps) would make the definitions served {} KiB, more than the operator's --kind-definitions-budget of {} KiB; make it smaller, keep fewer revisions (spec.rollout.keep), remove another, or raise the budget",
        generation.bytes.div_ceil(1024),
        kept.max(generation.bytes).div_ceil(1024),
        total.div_ceil(1024),
        budget / 1024
    )))
}

/// Refuses a kind whose short name or CRD is already `taken`.
pub fn check_clash(generation: &Generation, taken: &[Taken]) -> Result<(), Rejection> {
    let name = generation.kind.name();
    let crd = generation.crd_name();
    for other in taken {
        if other.name.eq_ignore_ascii_case(name) {
            return Err(Rejection::Clash(format!(
                "metadata.name: the kind name {name:?} is taken by {}",
                other.by
            )));
        }
        if other.crd == crd {
            return Err(Rejection::Clash(format!(
                "spec.names.plural, spec.group: the CRD {crd} is served by {}",
                other.by
            )));
        }
    }
    Ok(())
}

/// Refuses changes from `served` that stored resources break on, unless
/// the definition allows them.
pub fn check_compatible(
    definition: &DynamicObject,
    served: &CustomResourceDefinition,
    generation: &Generation,
) -> Result<(), Rejection> {
    let unreadable = |e: serde_json::Error| Rejection::Invalid(format!("its CRD: {e}"));
    let changes = breaking::breaking_changes(served, &generation.crd().map_err(unreadable)?);
    if changes.is_empty() || breaking_allowed(definition) {
        return Ok(());
    }
    Err(Rejection::Breaking(changes))
}

/// True when the definition carries the annotation allowing breaking changes.
pub fn breaking_allowed(definition: &DynamicObject) -> bool {
    definition
        .annotations()
        .get(resource::ALLOW_BREAKING_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// `message` with the private directory `root` left out of its paths
/// (`/tmp/…/greeting/kind.yaml` → `greeting/kind.yaml`).
fn relative(message: &str, root: &Path) -> String {
    message.replace(&format!("{}/", root.display()), "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(path: &str) -> DynamicObject {
        let text = pack::pack(&Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
        let mut value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        value["metadata"]["generation"] = 3.into();
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_budget_counts_the_revisions_a_definition_keeps() {
        let work = tempfile::tempdir().unwrap();
        let mut generation = load(&definition("kustomize/sample"), work.path(), None).unwrap();
        generation.bytes = 10 << 10;
        assert!(check_budget(&generation, 10 << 10, 20 << 10, 30 << 10).is_ok());
        let Err(Rejection::TooLarge(message)) = check_budget(&generation, 30 << 10, 0, 20 << 10)
        else {
            panic!("three kept revisions of 10 KiB are past a budget of 20 KiB");
        };
        assert!(
            message.contains("(10 KiB, 30 KiB with the revisions it keeps)"),
            "{message}"
        );
        assert!(message.contains("spec.rollout.keep"), "{message}");
    }

    #[test]
    fn a_packed_folder_loads_with_its_own_templates_and_a_marked_crd() {
        let work = tempfile::tempdir().unwrap();
        let generation = load(&definition("kustomize/sample"), work.path(), None).unwrap();
        assert_eq!(generation.number, 3);
        assert_eq!(generation.kind.name(), "sample");
        let templates = generation.kind.templates.as_ref().unwrap();
        assert!(templates.base("sample").is_some());
        assert_eq!(
            generation.crd().unwrap().metadata.labels.unwrap()[resource::MARKER_LABEL],
            "sample"
        );
        assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_error_names_the_file_and_the_field_without_the_private_directory() {
        let work = tempfile::tempdir().unwrap();
        let mut object = definition("kustomize/sample");
        object.data["spec"]["overlays"] = serde_json::json!({});
        let err = load(&object, work.path(), None).unwrap_err().to_string();
        assert!(err.starts_with("sample/kind.yaml: spec.overlays"), "{err}");
        assert!(!err.contains(&work.path().display().to_string()), "{err}");
    }

    #[test]
    fn a_template_that_cannot_render_is_refused_naming_it() {
        let work = tempfile::tempdir().unwrap();
        let mut object = definition("kustomize/sample");
        let file = &mut object.data["spec"]["files"]["patches/deployment.yaml"];
        *file = format!(
            "{}\n# {{{{ spec.count | nosuchfilter }}}}\n",
            file.as_str().unwrap()
        )
        .into();
        let err = load(&object, work.path(), None).unwrap_err().to_string();
        assert!(err.contains("sample/patches/deployment.yaml"), "{err}");
        assert!(err.contains("nosuchfilter"), "{err}");
    }

    #[test]
    fn a_kind_of_several_versions_needs_the_webhook_which_its_crd_then_names() {
        let work = tempfile::tempdir().unwrap();
        let mut object = definition("kustomize/sample");
        let schema = object.data["spec"]["schema"].clone();
        object.data["spec"]["version"] = "v2".into();
        object.data["spec"]["versions"] = serde_json::json!([{"name": "v1", "schema": schema}]);
        let mut generation = load(&object, work.path(), None).unwrap();
        let refused = attach_webhook(&mut generation, None).unwrap_err();
        assert_eq!(refused.reason(), Reason::Invalid);
        assert!(refused.to_string().contains("spec.versions"), "{refused}");
        let endpoint = crate::conversion::Endpoint::Url("https://127.0.0.1:9443".into());
        let webhook = Webhook::new(endpoint, "CA".into(), Default::default());
        attach_webhook(&mut generation, Some(&webhook)).unwrap();
        let crd = generation.crd().unwrap();
        let conversion = crd.spec.conversion.as_ref().unwrap();
        assert_eq!(conversion.strategy, "Webhook");
        let config = conversion
            .webhook
            .as_ref()
            .unwrap()
            .client_config
            .as_ref()
            .unwrap();
        assert_eq!(
            config.url.as_deref(),
            Some("https://127.0.0.1:9443/convert")
        );
        assert_eq!(config.ca_bundle.as_ref().unwrap().0, b"CA");
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.storage))
            .collect();
        assert_eq!(versions, [("v2", true), ("v1", false)]);
    }

    #[test]
    fn a_taken_name_or_crd_is_a_clash() {
        let work = tempfile::tempdir().unwrap();
        let generation = load(&definition("kustomize/sample"), work.path(), None).unwrap();
        let taken = |name: &str, crd: &str| Taken {
            name: name.into(),
            crd: crd.into(),
            by: "the built-in kind".into(),
        };
        assert!(check_clash(&generation, &[taken("other", "x.io")]).is_ok());
        let by_name = check_clash(&generation, &[taken("Sample", "x.io")]).unwrap_err();
        assert!(by_name.to_string().starts_with("metadata.name"));
        let by_crd =
            check_clash(&generation, &[taken("other", "samples.nuvolaris.org")]).unwrap_err();
        assert_eq!(by_crd.reason(), Reason::Clash);
    }
}
