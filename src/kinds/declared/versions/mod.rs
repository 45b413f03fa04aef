//! A kind's versions: the one it stores (`spec.version`, the hub, which
//! templates and expressions read) and the older ones it still serves,
//! each converted to and from the hub as its kind file declares
//! (hub-and-spoke: one older version converts to another through the hub).
//!
//! [`Versions::convert`] is what the operator's conversion webhook runs
//! for every object the API server sends it; [`round_trip::check`] is what
//! a kind is checked with when it is loaded: a field that one direction
//! would drop is refused unless the kind file says it is lossy.

pub mod round_trip;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::expressions::{EvalError, Expression, ExpressionError, SELF};
use super::file::{KindSpec, OlderVersion};

/// Why an object could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    /// The object is not one of the kind's.
    #[error("{api_version} {kind} is not a version of {group} {expected}")]
    NotThisKind {
        /// The object's `apiVersion`.
        api_version: String,
        /// The object's `kind`.
        kind: String,
        /// The kind's group.
        group: String,
        /// The kind's kind.
        expected: String,
    },
    /// A version the kind does not serve.
    #[error("{group} serves no version {version} of {kind}")]
    UnknownVersion {
        /// The kind's group.
        group: String,
        /// The kind.
        kind: String,
        /// The version asked for.
        version: String,
    },
}

/// A kind's versions and their conversions, their computed fields
/// compiled. Built only compiled, whatever it is built from (a kind file,
/// or the annotation of the CRD the operator applied, whose JSON is
/// [`Declared`]): one whose computed field does not compile is not built
/// at all, never built without it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Declared", into = "Declared")]
pub struct Versions {
    declared: Declared,
    /// Their computed fields' CEL, compiled.
    computed: Computed,
}

/// A kind's versions as declared: what [`Versions`] is built from, and
/// what it is written as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The API group.
    pub group: String,
    /// The kind (`Greeting`).
    pub kind: String,
    /// The stored version.
    pub hub: String,
    /// The older versions, as declared.
    pub older: Vec<OlderVersion>,
}

/// Why versions could not be built: a computed field that does not
/// compile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{version}.conversion.{direction}.{field}: {reason}")]
pub struct NotCompiled {
    /// The older version.
    pub version: String,
    /// `up` or `down`.
    pub direction: &'static str,
    /// The computed field.
    pub field: String,
    /// Why (the CEL's error).
    pub reason: String,
}

impl TryFrom<Declared> for Versions {
    type Error = NotCompiled;

    fn try_from(declared: Declared) -> Result<Self, NotCompiled> {
        let computed = Computed::of(&declared.older)?;
        Ok(Self { declared, computed })
    }
}

impl From<Versions> for Declared {
    fn from(versions: Versions) -> Self {
        versions.declared
    }
}

/// Which way a conversion goes: to the stored version, or from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    /// From an older version to the stored one.
    Up,
    /// From the stored version to an older one.
    Down,
}

impl Direction {
    /// The field of a conversion that declares it (`up`, `down`).
    fn field(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
        }
    }
}

/// The compiled CEL of every computed field: by older version, direction
/// and field.
#[derive(Debug, Clone, Default, PartialEq)]
struct Computed(Arc<BTreeMap<(String, Direction), Fields>>);

/// Computed fields: each a dotted path and its CEL.
type Fields = Vec<(String, Expression)>;

/// Compiles the computed field `field` of a conversion: CEL reading
/// `self` only.
pub fn compile(source: &str) -> Result<Expression, ExpressionError> {
    let known = BTreeSet::from([SELF.to_string()]);
    Expression::compile(source, &known)
}

impl Computed {
    /// The computed fields of `older`, every one compiled.
    fn of(older: &[OlderVersion]) -> Result<Self, NotCompiled> {
        let mut all = BTreeMap::new();
        for version in older {
            let conversion = &version.conversion;
            for (direction, fields) in [
                (Direction::Up, &conversion.up),
                (Direction::Down, &conversion.down),
            ] {
                let compiled = (fields.iter())
                    .map(|(field, source)| {
                        let expression = compile(source).map_err(|e| NotCompiled {
                            version: version.name.clone(),
                            direction: direction.field(),
                            field: field.clone(),
                            reason: e.to_string(),
                        })?;
                        Ok((field.clone(), expression))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if !compiled.is_empty() {
                    all.insert((version.name.clone(), direction), compiled);
                }
            }
        }
        Ok(Self(Arc::new(all)))
    }

    /// The values of the computed fields of `version` going `direction`,
    /// over `object` as it is before the conversion. A field whose
    /// expression reads what is not there, or fails, is left out (the
    /// log says which, never with the object's values).
    fn values(&self, version: &str, direction: Direction, object: &Value) -> Vec<(String, Value)> {
        let Some(fields) = self.0.get(&(version.to_string(), direction)) else {
            return Vec::new();
        };
        let variables = BTreeMap::from([(SELF, object.clone())]);
        let mut values = Vec::with_capacity(fields.len());
        for (field, expression) in fields {
            match expression.eval(&variables) {
                Ok(value) => values.push((field.clone(), value)),
                Err(EvalError::Missing(_)) => {}
                Err(EvalError::Failed(_)) => {
                    tracing::warn!(
                        version,
                        ?direction,
                        field,
                        "a computed field of a conversion failed: left out"
                    );
                }
            }
        }
        values
    }
}

impl Versions {
    /// The versions `spec` declares, compiled.
    pub fn of(spec: &KindSpec) -> Result<Self, NotCompiled> {
        let names = &spec.names;
        Self::new(
            &spec.group,
            &names.kind,
            &spec.version,
            spec.versions.clone(),
        )
    }

    /// The versions of the kind `kind` of `group`, compiled: `hub` stored,
    /// `older` served and converted as each declares.
    pub fn new(
        group: &str,
        kind: &str,
        hub: &str,
        older: Vec<OlderVersion>,
    ) -> Result<Self, NotCompiled> {
        Self::try_from(Declared {
            group: group.into(),
            kind: kind.into(),
            hub: hub.into(),
            older,
        })
    }

    /// The API group.
    pub fn group(&self) -> &str {
        &self.declared.group
    }

    /// The kind (`Greeting`).
    pub fn kind(&self) -> &str {
        &self.declared.kind
    }

    /// The stored version.
    pub fn hub(&self) -> &str {
        &self.declared.hub
    }

    /// The older versions, as declared.
    pub fn older(&self) -> &[OlderVersion] {
        &self.declared.older
    }

    /// True when the kind serves more than one version.
    pub fn several(&self) -> bool {
        !self.declared.older.is_empty()
    }

    /// Every version served, the hub first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.hub()).chain(self.older().iter().map(|v| v.name.as_str()))
    }

    fn older_version(&self, version: &str) -> Result<&OlderVersion, ConversionError> {
        self.older()
            .iter()
            .find(|v| v.name == version)
            .ok_or_else(|| ConversionError::UnknownVersion {
                group: self.group().to_string(),
                kind: self.kind().to_string(),
                version: version.to_string(),
            })
    }

    /// `object` (one of the kind's, at any version it serves) at `to`:
    /// up to the hub through its version's conversion, then down to `to`
    /// through that version's. Fields the target version does not declare
    /// are left in: the webhook prunes them by the CRD's schemas
    /// (`conversion::filed`).
    pub fn convert(&self, mut object: Value, to: &str) -> Result<Value, ConversionError> {
        let from = self.version_of(&object)?;
        if from != to {
            let target = (to != self.hub())
                .then(|| self.older_version(to))
                .transpose()?;
            if from != self.hub() {
                let computed = self.computed.values(&from, Direction::Up, &object);
                up(&mut object, self.older_version(&from)?);
                put_all(&mut object, computed);
            }
            if let Some(target) = target {
                let computed = self.computed.values(&target.name, Direction::Down, &object);
                down(&mut object, target);
                put_all(&mut object, computed);
            }
        }
        object["apiVersion"] = format!("{}/{to}", self.group()).into();
        Ok(object)
    }

    /// The version `object` is at, if it is one of the kind's.
    fn version_of(&self, object: &Value) -> Result<String, ConversionError> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        match api_version.split_once('/') {
            Some((group, version)) if group == self.group() && kind == self.kind() => {
                Ok(version.to_string())
            }
            _ => Err(ConversionError::NotThisKind {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                group: self.group().to_string(),
                expected: self.kind().to_string(),
            }),
        }
    }
}

/// An older version's object, made the hub's: its moves, then the hub's
/// defaults for what it lacks.
fn up(object: &mut Value, version: &OlderVersion) {
    let moves = &version.conversion.moves;
    let taken: Vec<_> = moves.iter().map(|m| take(object, &m.from)).collect();
    for (m, value) in moves.iter().zip(taken) {
        if let Some(value) = value {
            put(object, &m.to, value);
        }
    }
    for (field, value) in &version.conversion.defaults {
        if get(object, field).is_none() {
            put(object, field, value.clone());
        }
    }
}

/// A hub object, made an older version's: its moves back.
fn down(object: &mut Value, version: &OlderVersion) {
    let moves = &version.conversion.moves;
    let taken: Vec<_> = moves.iter().map(|m| take(object, &m.to)).collect();
    for (m, value) in moves.iter().zip(taken) {
        if let Some(value) = value {
            put(object, &m.from, value);
        }
    }
}

/// Sets each computed field.
fn put_all(object: &mut Value, computed: Vec<(String, Value)>) {
    for (field, value) in computed {
        put(object, &field, value);
    }
}

/// The value at the dotted `path`, if there is one.
fn get<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(object, |node, key| node.as_object()?.get(key))
}

/// Removes and returns the value at the dotted `path`.
fn take(object: &mut Value, path: &str) -> Option<Value> {
    let (parent, last) = path.rsplit_once('.')?;
    let node = parent
        .split('.')
        .try_fold(object, |node, key| node.as_object_mut()?.get_mut(key))?;
    node.as_object_mut()?.remove(last)
}

/// Sets the value at the dotted `path`, making the objects on the way (a
/// value on the way that is not an object is replaced by one).
fn put(object: &mut Value, path: &str, value: Value) {
    let mut node = object;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Some(map) = node.as_object_mut() else {
            return;
        };
        if keys.peek().is_none() {
            map.insert(key.to_string(), value);
            return;
        }
        node = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

#[cfg(test)]
mod tests;
