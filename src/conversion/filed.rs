//! What the webhook answers one kind with, and where it comes from: the
//! kind's own CRD, as the operator applied it. The CRD's annotation
//! ([`ANNOTATION`]) holds the conversions, compiled as they are read; the
//! CRD's versions hold the schema each converted object must fit. Every
//! replica files a kind from its CRD this one way ([`Filed::from_crd`]):
//! the leader from the CRD it is about to apply, every replica from the
//! CRDs it follows.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use serde_json::Value;

use super::ANNOTATION;
use crate::kinds::declared::conforms::{self, Misfit};
use crate::kinds::declared::versions::{ConversionError, Versions};

/// Why a CRD's conversions are not filed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unfiled {
    /// It carries no conversions.
    #[error("the CRD {crd} carries no conversions (annotation {ANNOTATION})")]
    NoConversions {
        /// The CRD.
        crd: String,
    },
    /// Its annotation does not parse, or a computed field does not compile.
    #[error("the CRD {crd}: its conversions (annotation {ANNOTATION}) cannot be read: {reason}")]
    Unreadable {
        /// The CRD.
        crd: String,
        /// Why.
        reason: String,
    },
    /// Its annotation declares the conversions of another kind.
    #[error(
        "the CRD {crd} serves {own_kind} of {own_group}, but its conversions (annotation {ANNOTATION}) are for {kind} of {group}"
    )]
    AnotherKind {
        /// The CRD.
        crd: String,
        /// Its own group.
        own_group: String,
        /// Its own kind.
        own_kind: String,
        /// The group the annotation names.
        group: String,
        /// The kind the annotation names.
        kind: String,
    },
    /// The conversions name a version the CRD does not serve, or another
    /// stored version than the CRD's.
    #[error(
        "the CRD {crd} does not serve {version} as its conversions (annotation {ANNOTATION}) say"
    )]
    AnotherVersion {
        /// The CRD.
        crd: String,
        /// The version.
        version: String,
    },
    /// It carries no marker naming a definition.
    #[error("the CRD {crd} carries no marker naming a KindDefinition")]
    Unmarked {
        /// The CRD.
        crd: String,
    },
    /// Its marker names a definition this operator does not serve (another
    /// operator's, or one gone).
    #[error(
        "the CRD {crd} is not one this operator serves: its marker names the KindDefinition {definition}, which it does not serve"
    )]
    NotServed {
        /// The CRD.
        crd: String,
        /// The definition its marker names.
        definition: String,
    },
    /// Its marker names a definition served here that declares another
    /// CRD: a decoy.
    #[error(
        "the CRD {crd} is not one this operator serves: its marker names the KindDefinition {definition}, which declares the CRD {declared} of kind {kind}"
    )]
    NotDeclared {
        /// The CRD.
        crd: String,
        /// The definition its marker names.
        definition: String,
        /// The CRD the definition declares.
        declared: String,
        /// Its kind.
        kind: String,
    },
}

impl Unfiled {
    /// True when the CRD claims what is not its own, or its conversions
    /// cannot be read: worth a warning. A CRD of one version, or of a
    /// definition another operator serves, is refused quietly.
    pub fn suspect(&self) -> bool {
        !matches!(
            self,
            Self::NoConversions { .. } | Self::Unmarked { .. } | Self::NotServed { .. }
        )
    }
}

/// Why an object was not converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unconverted {
    /// The conversion itself refused.
    #[error(transparent)]
    Conversion(#[from] ConversionError),
    /// What it made does not fit the schema of the version asked for.
    #[error("{object}: {}", .misfits.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Misfit {
        /// `namespace/name`, or the name of a cluster-scoped object.
        object: String,
        /// Where it does not fit (the first few).
        misfits: Vec<Misfit>,
    },
}

/// A kind's conversions, filed from its CRD.
#[derive(Debug, Clone, PartialEq)]
pub struct Filed {
    /// The CRD they were read from.
    crd: String,
    /// The conversions.
    versions: Versions,
    /// The schema of `spec` at each version the CRD serves.
    schemas: BTreeMap<String, Value>,
}

impl Filed {
    /// The conversions `crd` declares for its own kind, compiled, with the
    /// schema of each of its versions; refused when the annotation is
    /// missing or unreadable, names another group or kind, or versions
    /// the CRD does not serve as the annotation says.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Result<Self, Unfiled> {
        let name = crd.name_any();
        let text = (crd.annotations().get(ANNOTATION))
            .ok_or_else(|| Unfiled::NoConversions { crd: name.clone() })?;
        let versions: Versions = serde_json::from_str(text).map_err(|e| Unfiled::Unreadable {
            crd: name.clone(),
            reason: e.to_string(),
        })?;
        let (own_group, own_kind) = (&crd.spec.group, &crd.spec.names.kind);
        if versions.group() != own_group || versions.kind() != own_kind {
            return Err(Unfiled::AnotherKind {
                crd: name,
                own_group: own_group.clone(),
                own_kind: own_kind.clone(),
                group: versions.group().to_string(),
                kind: versions.kind().to_string(),
            });
        }
        let schemas = schemas(crd);
        let stored = crd.spec.versions.iter().find(|v| v.storage);
        let unserved = std::iter::once(versions.hub())
            .filter(|hub| stored.is_none_or(|s| s.name != *hub))
            .chain(versions.names().filter(|v| !schemas.contains_key(*v)))
            .next();
        if let Some(version) = unserved {
            return Err(Unfiled::AnotherVersion {
                crd: name,
                version: version.to_string(),
            });
        }
        Ok(Self {
            crd: name,
            versions,
            schemas,
        })
    }

    /// The CRD they were read from.
    pub fn crd(&self) -> &str {
        &self.crd
    }

    /// The API group and the kind.
    pub fn key(&self) -> (String, String) {
        let versions = &self.versions;
        (versions.group().to_string(), versions.kind().to_string())
    }

    /// The conversions.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    /// `object` at `version`, as its kind's conversions make it, its
    /// `spec` pruned to that version's schema and checked against it (the
    /// types, the required fields) unless it was at `version` already.
    pub fn convert(&self, object: Value, version: &str) -> Result<Value, Unconverted> {
        let before = object["apiVersion"].clone();
        let mut converted = self.versions.convert(object, version)?;
        if converted["apiVersion"] == before {
            return Ok(converted);
        }
        let schema = self.schemas.get(version).unwrap_or(&Value::Null);
        // What the version does not declare is dropped here, as the API
        // server prunes: it does not in every path (the live object of a
        // server-side apply at that version), and an undeclared field there
        // fails the apply ("field not declared in schema").
        if schema.is_object()
            && let Some(spec) = converted.get_mut("spec")
        {
            conforms::prune(spec, schema);
        }
        let spec = converted.get("spec");
        let fits = match spec {
            Some(spec) => conforms::check(spec, schema, "spec"),
            None => Err(vec![Misfit::Required("spec".into())]),
        };
        fits.map_err(|misfits| Unconverted::Misfit {
            object: object_name(&converted),
            misfits,
        })?;
        Ok(converted)
    }
}

/// The schema of `spec` at each version `crd` serves.
fn schemas(crd: &CustomResourceDefinition) -> BTreeMap<String, Value> {
    (crd.spec.versions.iter())
        .map(|v| {
            let whole = (v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
                .unwrap_or_default();
            (v.name.clone(), whole["properties"]["spec"].clone())
        })
        .collect()
}

/// `namespace/name` of `object`, or its name when it has no namespace.
fn object_name(object: &Value) -> String {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or_default();
    match metadata["namespace"].as_str() {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{name}"),
        _ => name.to_string(),
    }
}
