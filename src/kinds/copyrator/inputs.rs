//! What a rule's plan depends on, as data: the objects observed (reduced to
//! what the plan needs, Secret data kept out of `Debug`) and the namespaces.
//! A leaf: [`reads`](super::reads) fills it, [`plan`](super::plan) and
//! [`paging`](super::paging) read it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};

use super::budget::Hold;
use super::marker;
use super::resource::RuleType;

/// A ConfigMap or Secret, reduced to what the plan needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    /// ConfigMap or Secret.
    pub kind: RuleType,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its copyrator marker annotations (other annotations are not kept).
    pub annotations: BTreeMap<String, String>,
    /// Its content (sources); `None` when read as metadata only or kept
    /// as a fingerprint.
    pub content: Option<Content>,
    /// Its content as digests (the rule's copies, [`Object::fingerprinted`]).
    pub fingerprint: Option<Fingerprint>,
}

impl Object {
    /// An object with no labels, annotations or content.
    pub fn new(kind: RuleType, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            content: None,
            fingerprint: None,
        }
    }

    /// Bytes its content takes (keys and values, binary data as base64):
    /// what `--copyrator-max-bytes` counts.
    pub fn content_bytes(&self) -> usize {
        self.content.as_ref().map_or(0, |c| {
            c.data
                .iter()
                .chain(&c.binary_data)
                .map(|(k, v)| k.len() + v.len())
                .sum()
        })
    }

    /// The object with its content replaced by its fingerprint.
    pub fn fingerprinted(mut self) -> Self {
        if let Some(content) = self.content.take() {
            self.fingerprint = Some(Fingerprint::of(&content));
        }
        self
    }

    /// The fingerprint of what it holds: kept as read, or taken from its
    /// content.
    pub fn fingerprint(&self) -> Option<std::borrow::Cow<'_, Fingerprint>> {
        match (&self.fingerprint, &self.content) {
            (Some(f), _) => Some(std::borrow::Cow::Borrowed(f)),
            (None, Some(c)) => Some(std::borrow::Cow::Owned(Fingerprint::of(c))),
            (None, None) => None,
        }
    }
}

/// The content of a ConfigMap or Secret. `Debug` shows key names only.
#[derive(Clone, Default, PartialEq)]
pub struct Content {
    /// ConfigMap `data` (text), or Secret `data` (base64, as in the API).
    pub data: BTreeMap<String, String>,
    /// ConfigMap `binaryData` (base64).
    pub binary_data: BTreeMap<String, String>,
    /// Secret `type`.
    pub type_: Option<String>,
}

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_keys(f, "Content", &self.data, &self.binary_data, &self.type_)
    }
}

/// `Debug` of what a ConfigMap or Secret holds: its key names and type,
/// never its values.
fn debug_keys<V>(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    data: &BTreeMap<String, V>,
    binary_data: &BTreeMap<String, V>,
    type_: &Option<String>,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("data_keys", &data.keys().collect::<Vec<_>>())
        .field("binary_data_keys", &binary_data.keys().collect::<Vec<_>>())
        .field("type", type_)
        .finish()
}

/// sha256 of one value.
type ValueDigest = [u8; 32];

fn digests(values: &BTreeMap<String, String>) -> BTreeMap<String, ValueDigest> {
    values
        .iter()
        .map(|(k, v)| (k.clone(), Sha256::digest(v.as_bytes()).into()))
        .collect()
}

/// The content of a copy as a sha256 per value: enough to tell whether it
/// holds what its source would put there, without holding the data (a copy
/// can be large, and a rule has one per source and target). `Debug` shows
/// key names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    data: BTreeMap<String, ValueDigest>,
    binary_data: BTreeMap<String, ValueDigest>,
    type_: Option<String>,
}

impl Fingerprint {
    /// The fingerprint of `content`.
    pub fn of(content: &Content) -> Self {
        Self {
            data: digests(&content.data),
            binary_data: digests(&content.binary_data),
            type_: content.type_.clone(),
        }
    }

    /// True when every value of `want` is here, the same (keys others added
    /// are not drift: server-side apply leaves them), and the type is the
    /// one `want` sets, if it sets one.
    pub fn holds(&self, want: &Content) -> bool {
        let subset = |want: &BTreeMap<String, String>, have: &BTreeMap<String, ValueDigest>| {
            want.iter().all(|(k, v)| {
                have.get(k)
                    .is_some_and(|d| *d == <[u8; 32]>::from(Sha256::digest(v.as_bytes())))
            })
        };
        subset(&want.data, &self.data)
            && subset(&want.binary_data, &self.binary_data)
            && (want.type_.is_none() || want.type_ == self.type_)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_keys(f, "Fingerprint", &self.data, &self.binary_data, &self.type_)
    }
}

/// A namespace as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceState {
    /// Its name.
    pub name: String,
    /// Phase `Active` (not `Terminating`).
    pub active: bool,
    /// It matches the operator's namespace selector (always true without one).
    pub eligible: bool,
}

/// Everything the plan of one rule depends on.
#[derive(Debug, Default)]
pub struct Observed {
    /// Matching sources in the rule's namespace.
    pub sources: Vec<Object>,
    /// What the sources hold of the operator's read budget, given back when
    /// the reconcile drops what it observed (none offline).
    pub hold: Option<Hold>,
    /// Every namespace.
    pub namespaces: Vec<NamespaceState>,
    /// Objects of either kind carrying the rule's marker label.
    pub copies: Vec<Object>,
    /// `(namespace, name)` of objects of the rule's kind found in target
    /// namespaces (looked up only where a wanted copy is missing).
    pub existing: BTreeSet<(String, String)>,
}

fn marker_annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(marker::PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub(super) fn object(kind: RuleType, meta: &ObjectMeta, content: Option<Content>) -> Object {
    Object {
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: marker_annotations(meta),
        content,
        ..Object::new(
            kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

/// Base64 strings, as the API writes byte fields.
fn base64_map(bytes: Option<BTreeMap<String, ByteString>>) -> BTreeMap<String, String> {
    bytes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| match serde_json::to_value(v) {
            Ok(serde_json::Value::String(s)) => Some((k, s)),
            _ => None,
        })
        .collect()
}

impl From<ConfigMap> for Object {
    fn from(cm: ConfigMap) -> Self {
        let content = Content {
            data: cm.data.unwrap_or_default(),
            binary_data: base64_map(cm.binary_data),
            type_: None,
        };
        object(RuleType::Configmap, &cm.metadata, Some(content))
    }
}

impl From<Secret> for Object {
    fn from(secret: Secret) -> Self {
        let content = Content {
            data: base64_map(secret.data),
            binary_data: BTreeMap::new(),
            type_: secret.type_,
        };
        object(RuleType::Secret, &secret.metadata, Some(content))
    }
}
