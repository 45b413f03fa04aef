//! The change `plan` plans (a kind folder or a packed `KindDefinition`,
//! checked as the operator checks a new generation), and what serves the
//! resources now: a folder (`--current`), or the `KindDefinition` of the
//! same name in the cluster, its kept revisions chosen for each resource
//! by its rollout, as the operator chooses.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::PlanError;
use crate::cli::PlanArgs;
use crate::definitions::generation;
use crate::definitions::resource as definition;
use crate::kind::Sandbox;
use crate::kinds::declared::DeclaredKind;
use crate::kinds::declared::pack::{self, ROLLOUT_FIELD};
use crate::kinds::declared::rollout::{Rollout, RolloutSpec};

/// A kind loaded from a definition.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The kind, with its own templates.
    pub kind: Arc<DeclaredKind>,
    /// The definition it was loaded from.
    pub definition: DynamicObject,
    /// Where it came from, in words.
    pub what: String,
}

/// The change the command line names: the folder or file argument, else
/// `--kind` among `--kind-definition` files and `--kustomize-dir` folders,
/// else the one `--kind-definition` file.
pub fn change(
    args: &PlanArgs,
    work: &Path,
    isolation: Option<Arc<Sandbox>>,
) -> Result<Loaded, PlanError> {
    let (text, what) = match (&args.change, &args.kind) {
        (Some(path), _) => read(path)?,
        (None, Some(name)) => by_name(args, name)?,
        (None, None) => match args.common.dirs.kind_definition.as_slice() {
            [file] => read(file)?,
            _ => return Err(PlanError::NoChange),
        },
    };
    load(&text, what, work, isolation)
}

/// What `--current` names, as one kind serving every resource.
pub fn folder(
    path: &Path,
    work: &Path,
    isolation: Option<Arc<Sandbox>>,
) -> Result<Current, PlanError> {
    let (text, what) = read(path)?;
    let loaded = load(&text, what, work, isolation)?;
    Ok(Current::Folder(Box::new(loaded)))
}

/// The packed definition at `path`: a kind folder packed, or a file.
fn read(path: &Path) -> Result<(String, String), PlanError> {
    if path.is_dir() {
        let text = pack::pack(path)?;
        return Ok((text, format!("the folder {}", path.display())));
    }
    let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((text, format!("the file {}", path.display())))
}

/// The definition of the kind `name`: a `--kind-definition` file of that
/// name, else the folder `name` of a kustomize directory.
fn by_name(args: &PlanArgs, name: &str) -> Result<(String, String), PlanError> {
    for file in &args.common.dirs.kind_definition {
        let (text, what) = read(file)?;
        let named = serde_saphyr::from_str::<Value>(&text)
            .is_ok_and(|d| d["metadata"]["name"].as_str() == Some(name));
        if named {
            return Ok((text, what));
        }
    }
    let folder = (args.common.dirs.kustomize_dir.iter())
        .map(|dir| dir.join(name))
        .find(|folder| folder.join("kind.yaml").is_file())
        .ok_or_else(|| PlanError::UnknownKind(name.to_string()))?;
    read(&folder)
}

/// The packed definition `text`, checked as a new generation is (its
/// files, templates and kind file; the example rendered).
fn load(
    text: &str,
    what: String,
    work: &Path,
    isolation: Option<Arc<Sandbox>>,
) -> Result<Loaded, PlanError> {
    let invalid = |reason: String| PlanError::Invalid {
        what: what.clone(),
        reason,
    };
    let value: Value = serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let definition: DynamicObject =
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
    let loaded =
        generation::load(&definition, work, isolation).map_err(|e| invalid(e.to_string()))?;
    Ok(Loaded {
        kind: loaded.kind,
        definition,
        what,
    })
}

/// What serves the resources now.
#[derive(Debug)]
pub enum Current {
    /// One kind serves every resource (`--current`).
    Folder(Box<Loaded>),
    /// A definition's kept revisions, chosen by its rollout.
    Definition {
        /// The definition's name.
        name: String,
        /// Its revisions and rule.
        rollout: Arc<Rollout>,
        /// What could not be loaded, in words.
        notes: Vec<String>,
    },
}

impl Current {
    /// The revision serving the resource `namespace/name` with `labels`
    /// (`None` for a folder) and its kind.
    pub fn choose(
        &self,
        namespace: Option<&str>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(Option<u32>, Arc<DeclaredKind>), String> {
        match self {
            Self::Folder(loaded) => Ok((None, loaded.kind.clone())),
            Self::Definition { rollout, .. } => rollout
                .choose(namespace, name, labels)
                .map(|(n, kind)| (Some(n), kind.clone()))
                .map_err(|e| e.to_string()),
        }
    }

    /// The kind whose API the resources are served at now (the latest
    /// revision's).
    pub fn kind(&self) -> Option<&Arc<DeclaredKind>> {
        match self {
            Self::Folder(loaded) => Some(&loaded.kind),
            Self::Definition { rollout, .. } => rollout.latest_kind(),
        }
    }

    /// What serves now, in words.
    pub fn describe(&self) -> String {
        match self {
            Self::Folder(loaded) => loaded.what.clone(),
            Self::Definition { name, rollout, .. } => format!(
                "the KindDefinition {name} in the cluster (latest revision {}, stable {})",
                rollout.latest(),
                rollout.stable()
            ),
        }
    }

    /// What could not be loaded.
    pub fn notes(&self) -> &[String] {
        match self {
            Self::Folder(_) => &[],
            Self::Definition { notes, .. } => notes,
        }
    }
}

/// The `KindDefinition` `name` in the cluster, served from the revisions
/// the operator keeps of it (ControllerRevisions in `namespace`, or in
/// any namespace), each loaded again; without any, from its own spec.
pub async fn definition(
    client: &Client,
    name: &str,
    namespace: Option<&str>,
    work: &Path,
    isolation: Option<Arc<Sandbox>>,
) -> Result<Current, PlanError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &definition::api_resource());
    let def = match api.get_opt(name).await {
        Ok(Some(def)) => def,
        Ok(None) => return Err(PlanError::NoCurrent(name.to_string())),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Err(PlanError::NoCurrent(name.to_string()));
        }
        Err(e) => return Err(PlanError::cluster("the KindDefinition", &e)),
    };
    let mut notes = Vec::new();
    let mut kinds = BTreeMap::new();
    match stored(client, &def, namespace).await {
        Ok(stored) if stored.is_empty() => notes.push(
            "no kept revisions of it in the cluster (the operator keeps them with --operator-namespace): every resource is compared with the definition as it is".into(),
        ),
        Ok(stored) => {
            for (number, spec, generation) in stored {
                let mut then = def.clone();
                then.data["spec"] = spec;
                then.metadata.generation = Some(generation);
                match generation::load(&then, work, isolation.clone()) {
                    Ok(loaded) => {
                        kinds.insert(number, loaded.kind);
                    }
                    Err(e) => notes.push(format!("revision {number} does not load: {e}")),
                }
            }
        }
        Err(e) => notes.push(format!(
            "the kept revisions could not be read ({}): every resource is compared with the definition as it is",
            crate::error_text::kube(&e)
        )),
    }
    if kinds.is_empty() {
        let number = def.data["status"]["revision"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1);
        let loaded = generation::load(&def, work, isolation).map_err(|e| PlanError::Invalid {
            what: format!("the KindDefinition {name} in the cluster"),
            reason: e.to_string(),
        })?;
        kinds.insert(number, loaded.kind);
    }
    let spec: RolloutSpec = (def.data["spec"].get(ROLLOUT_FIELD))
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default();
    let rollout = match Rollout::new(kinds.clone(), &spec, &BTreeMap::new(), None) {
        Ok(rollout) => rollout,
        Err(e) => {
            notes.push(format!("{e}: the latest serves every resource not pinned"));
            let latest = RolloutSpec {
                stable: None,
                ..spec
            };
            Rollout::new(kinds, &latest, &BTreeMap::new(), None).map_err(|e| {
                PlanError::Invalid {
                    what: format!("the KindDefinition {name} in the cluster"),
                    reason: e.to_string(),
                }
            })?
        }
    };
    Ok(Current::Definition {
        name: name.to_string(),
        rollout: Arc::new(rollout),
        notes,
    })
}

/// The revisions kept of `def` (its number, spec and generation), oldest
/// first: the ControllerRevisions carrying its marker and owned by it.
async fn stored(
    client: &Client,
    def: &DynamicObject,
    namespace: Option<&str>,
) -> Result<Vec<(u32, Value, i64)>, kube::Error> {
    let api: Api<ControllerRevision> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let selector = format!("{}={}", definition::MARKER_LABEL, def.name_any());
    let list = api.list(&ListParams::default().labels(&selector)).await?;
    let uid = def.uid();
    let mut kept: Vec<(u32, Value, i64)> = (list.items.into_iter())
        .filter(|r| (r.owner_references().iter()).any(|o| Some(&o.uid) == uid.as_ref()))
        .filter_map(|r| {
            let data = r.data?.0;
            let number = u32::try_from(r.revision).ok()?;
            let generation = data["generation"].as_i64().unwrap_or_default();
            Some((number, data.get("spec")?.clone(), generation))
        })
        .collect();
    kept.sort_by_key(|(number, _, _)| *number);
    Ok(kept)
}
