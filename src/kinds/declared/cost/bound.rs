//! How large a value CEL reads may be ([`Bound`]): from the kind's schema
//! when it loads (`maxLength`, `maxItems`, `maxProperties`, `enum`, or,
//! without them, the largest request the API server accepts divided by the
//! smallest element, as the API server estimates), or from the value itself
//! when an expression is about to run.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

/// The largest request the API server accepts, in bytes
/// (`k8s.io/apiserver`'s `MaxRequestSizeBytes`): no object it stores, and
/// so no value read from one, is larger.
pub const MAX_REQUEST: u64 = 3 * 1024 * 1024;

/// Why a bound is as large as it is: a field of the kind's schema without
/// the keyword that would bound it (`spec.items`, `maxItems`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hint {
    /// The field, as an expression reads it.
    pub path: String,
    /// What would bound it.
    pub keyword: &'static str,
}

/// What is known of how large a value may be. Its parts are merged: the
/// bound of a list's items is the largest any item may be.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Bound {
    /// The most bytes, if it is a string or bytes.
    pub length: u64,
    /// The most items (a list) or entries (a map).
    pub items: u64,
    /// The longest key, if it is a map.
    pub keys: u64,
    /// Any item of a list or value of a map.
    pub parts: Parts,
    /// Fields known by name (an object's properties), each tighter than
    /// `parts`.
    pub fields: Arc<BTreeMap<String, Bound>>,
    /// Why `length` or `items` is large, when nothing declared bounds it.
    pub hint: Option<Hint>,
}

/// The bound of a value's parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Parts {
    /// It has none (a scalar, a string), or none known beyond its fields.
    #[default]
    None,
    /// Each part is within this bound.
    Of(Arc<Bound>),
    /// Each part is any value whose JSON takes at most this many bytes.
    Within(u64),
    /// Each part is [`Bound::unknown`].
    Unknown,
}

impl Bound {
    /// A number, a boolean or null.
    pub fn scalar() -> Self {
        Self::default()
    }

    /// A string of at most `length` bytes.
    pub fn string(length: u64) -> Self {
        Self {
            length,
            ..Self::default()
        }
    }

    /// A list of at most `items` items, each within `item`.
    pub fn list(items: u64, item: Bound) -> Self {
        Self {
            items,
            parts: Parts::Of(Arc::new(item)),
            ..Self::default()
        }
    }

    /// Any value whose JSON takes at most `bytes` bytes, as the API server
    /// estimates it: a string of `bytes - 2` characters, a list of
    /// `(bytes - 2) / 2` items (`0,` each), parts within the same.
    pub fn within(bytes: u64, hint: Option<Hint>) -> Self {
        let inner = bytes.saturating_sub(2);
        Self {
            length: inner,
            items: inner / 2,
            keys: inner,
            parts: Parts::Within(bytes),
            fields: Arc::default(),
            hint,
        }
    }

    /// A value no schema of the kind file describes (a child, a
    /// reference): counted as one short item when the kind loads, and
    /// costed over what it holds when it is read.
    pub fn unknown() -> Self {
        Self {
            length: 1,
            items: 1,
            keys: 1,
            parts: Parts::Unknown,
            ..Self::default()
        }
    }

    /// The resource's `metadata`, within Kubernetes' own limits: a name of
    /// 253 characters, a namespace of 63, label keys of 317 and values of
    /// 63, annotations of 256 KiB together.
    pub fn metadata() -> Self {
        let labels = Bound {
            items: (MAX_REQUEST - 2) / 8,
            keys: 317,
            parts: Parts::Of(Arc::new(Self::string(63))),
            ..Self::default()
        };
        let fields = [
            ("name", Self::string(253)),
            ("namespace", Self::string(63)),
            ("uid", Self::string(36)),
            ("generation", Self::scalar()),
            ("labels", labels),
            ("annotations", Self::within(256 << 10, None)),
        ];
        Self::object(fields)
    }

    /// The whole resource (`schema`) whose `spec` is within `spec`.
    pub fn resource(spec: Bound) -> Self {
        Self::object([
            ("apiVersion", Self::string(317)),
            ("kind", Self::string(63)),
            ("metadata", Self::metadata()),
            ("spec", spec),
        ])
    }

    /// An object of these fields.
    fn object<const N: usize>(fields: [(&str, Bound); N]) -> Self {
        let keys = fields.iter().map(|(k, _)| k.len() as u64).max();
        Self {
            items: N as u64,
            keys: keys.unwrap_or(0),
            fields: Arc::new(
                fields
                    .into_iter()
                    .map(|(k, b)| (k.to_string(), b))
                    .collect(),
            ),
            ..Self::default()
        }
    }

    /// Its size as `size()` and the comparisons count it: the longest of
    /// its length and items, at least 1.
    pub fn size(&self) -> u64 {
        self.length.max(self.items).max(1)
    }

    /// The bound of any one part (a list's item, a map's value).
    pub fn part(&self) -> Bound {
        match &self.parts {
            Parts::Of(part) => part.as_ref().clone(),
            Parts::Within(bytes) => Self::within(*bytes, self.hint.clone()),
            Parts::Unknown => Self::unknown(),
            Parts::None => {
                let mut any = Bound::default();
                for field in self.fields.values() {
                    any.merge(field.clone());
                }
                any
            }
        }
    }

    /// The bound of field `name` (or of the value at key `name`).
    pub fn field(&self, name: &str) -> Bound {
        match self.fields.get(name) {
            Some(field) => field.clone(),
            None => match &self.parts {
                Parts::None => Self::scalar(),
                _ => self.part(),
            },
        }
    }

    /// The bound of what a loop over it binds: an item of a list, or a key
    /// of a map (a string).
    pub fn element(&self) -> Bound {
        let key = Self::string(self.keys);
        match (&self.parts, self.fields.is_empty()) {
            (Parts::None, true) => key,
            _ => self.part().union(&key),
        }
    }

    /// A bound holding both `self` and `other`.
    pub fn union(&self, other: &Bound) -> Bound {
        let mut merged = self.clone();
        merged.merge(other.clone());
        merged
    }

    /// Widens `self` to hold `other` too.
    pub fn merge(&mut self, other: Bound) {
        self.length = self.length.max(other.length);
        self.items = self.items.max(other.items);
        self.keys = self.keys.max(other.keys);
        self.parts = match (std::mem::take(&mut self.parts), other.parts) {
            (Parts::None, p) | (p, Parts::None) => p,
            (Parts::Within(a), Parts::Within(b)) => Parts::Within(a.max(b)),
            (Parts::Unknown, Parts::Unknown) => Parts::Unknown,
            (Parts::Unknown, p) | (p, Parts::Unknown) => Parts::Of(Arc::new(
                Self::unknown().union(
                    &Bound {
                        parts: p,
                        ..Bound::default()
                    }
                    .part(),
                ),
            )),
            (Parts::Within(a), Parts::Of(b)) | (Parts::Of(b), Parts::Within(a)) => {
                Parts::Of(Arc::new(Self::within(a, None).union(&b)))
            }
            (Parts::Of(mut a), Parts::Of(b)) => {
                Arc::make_mut(&mut a).merge(Arc::unwrap_or_clone(b));
                Parts::Of(a)
            }
        };
        if !other.fields.is_empty() {
            let fields = Arc::make_mut(&mut self.fields);
            for (name, bound) in Arc::unwrap_or_clone(other.fields) {
                match fields.get_mut(&name) {
                    Some(mine) => mine.merge(bound),
                    None => {
                        fields.insert(name, bound);
                    }
                }
            }
        }
        if self.hint.is_none() {
            self.hint = other.hint;
        }
    }

    /// The bound of `self + other` (strings, bytes or lists joined).
    pub fn joined(&self, other: &Bound) -> Bound {
        let mut parts = self.clone();
        parts.fields = Arc::default();
        parts.merge(Bound {
            fields: Arc::default(),
            ..other.clone()
        });
        Bound {
            length: self.length.saturating_add(other.length),
            items: self.items.saturating_add(other.items),
            keys: 0,
            ..parts
        }
    }

    /// The bound of `value` itself: its lengths, its items merged.
    pub fn of_value(value: &Value) -> Bound {
        match value {
            Value::String(s) => Self::string(s.len() as u64),
            Value::Array(items) => {
                let mut item = Bound::default();
                for value in items {
                    item.merge(Self::of_value(value));
                }
                Self::list(items.len() as u64, item)
            }
            Value::Object(map) => Bound {
                length: 0,
                items: map.len() as u64,
                keys: map.keys().map(|k| k.len() as u64).max().unwrap_or(0),
                parts: Parts::None,
                fields: Arc::new(
                    (map.iter())
                        .map(|(k, v)| (k.clone(), Self::of_value(v)))
                        .collect(),
                ),
                hint: None,
            },
            Value::Null | Value::Bool(_) | Value::Number(_) => Self::scalar(),
        }
    }

    /// The bound of a value of OpenAPI `schema`, read at `path`
    /// (`spec.items`): what its keywords declare, else what fits in the
    /// largest request, as the API server estimates it (a string of
    /// `maxLength` characters may take 4 bytes each).
    pub fn of_schema(schema: &Value, path: &str) -> Bound {
        let hint = |keyword| {
            Some(Hint {
                path: path.to_string(),
                keyword,
            })
        };
        let int = |key: &str| schema.get(key).and_then(Value::as_u64);
        if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return match int("maxLength") {
                Some(n) => Self::string(n.saturating_mul(4)),
                None => Bound {
                    hint: hint("maxLength"),
                    ..Self::string(MAX_REQUEST - 2)
                },
            };
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => string_of_schema(schema, hint("maxLength")),
            Some("array") => {
                let items = schema.get("items").unwrap_or(&Value::Null);
                let item = Self::of_schema(items, &format!("{path}[]"));
                match int("maxItems") {
                    Some(n) => Self::list(n, item),
                    None => Bound {
                        hint: hint("maxItems"),
                        ..Self::list((MAX_REQUEST - 2) / (min_size(items) + 1), item)
                    },
                }
            }
            Some("object") => object_of_schema(schema, path),
            Some("integer" | "number" | "boolean") => Self::scalar(),
            _ => Self::within(MAX_REQUEST, hint("a type")),
        }
    }
}

/// A string of `schema`: `maxLength` (4 bytes a character), an `enum`'s
/// longest value, a format's own length, else the largest request.
fn string_of_schema(schema: &Value, unbounded: Option<Hint>) -> Bound {
    if let Some(n) = schema.get("maxLength").and_then(Value::as_u64) {
        return Bound::string(n.saturating_mul(4));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let longest = values.iter().filter_map(Value::as_str).map(str::len).max();
        return Bound::string(longest.unwrap_or(0) as u64);
    }
    match schema.get("format").and_then(Value::as_str) {
        Some("date") => Bound::string(12),
        Some("date-time" | "duration") => Bound::string(32),
        _ => Bound {
            hint: unbounded,
            ..Bound::string(MAX_REQUEST - 2)
        },
    }
}

/// An object of `schema`: its properties by name; a map's values
/// (`additionalProperties`), at most `maxProperties`; anything under
/// `x-kubernetes-preserve-unknown-fields`.
fn object_of_schema(schema: &Value, path: &str) -> Bound {
    let mut fields = BTreeMap::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            fields.insert(
                name.clone(),
                Bound::of_schema(property, &format!("{path}.{name}")),
            );
        }
    }
    let declared = Bound {
        items: fields.len() as u64,
        keys: fields.keys().map(|k| k.len() as u64).max().unwrap_or(0),
        fields: Arc::new(fields),
        ..Bound::default()
    };
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let part = Bound::of_schema(values, &format!("{path}[]"));
        let (items, hint) = match schema.get("maxProperties").and_then(Value::as_u64) {
            Some(n) => (n, None),
            None => (
                (MAX_REQUEST - 2) / (min_size(values) + 6),
                Some(Hint {
                    path: path.to_string(),
                    keyword: "maxProperties",
                }),
            ),
        };
        return Bound {
            items,
            keys: MAX_REQUEST - 2,
            parts: Parts::Of(Arc::new(part)),
            hint,
            ..declared
        };
    }
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        let any = Bound::within(
            MAX_REQUEST,
            Some(Hint {
                path: path.to_string(),
                keyword: "properties (it preserves unknown fields)",
            }),
        );
        return Bound {
            fields: declared.fields,
            ..any
        };
    }
    declared
}

/// The fewest bytes a value of `schema` takes in JSON, as the API server
/// counts them: `""`, `0`, `true`, `[]`, `{}` and an object's required
/// fields without a default.
fn min_size(schema: &Value) -> u64 {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return 1;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => match schema.get("format").and_then(Value::as_str) {
            Some("date") => 12,
            Some("date-time") => 21,
            Some("duration") => 3,
            _ => 2,
        },
        Some("boolean") => 4,
        Some("integer" | "number") => 1,
        Some("array") => 2,
        Some("object") => {
            let required = schema.get("required").and_then(Value::as_array);
            let properties = schema.get("properties").and_then(Value::as_object);
            let fields = required.into_iter().flatten().filter_map(Value::as_str);
            let sizes = fields.filter_map(|name| {
                let property = properties?.get(name)?;
                let defaulted = property.get("default").is_some();
                (!defaulted).then(|| name.len() as u64 + min_size(property) + 4)
            });
            2 + sizes.sum::<u64>()
        }
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_bounds_what_it_declares_and_the_request_size_the_rest() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "size": {"type": "string", "enum": ["small", "large"]},
            "big": {"type": "string"},
            "items": {"type": "array", "maxItems": 300, "items": {"type": "string", "maxLength": 8}},
            "free": {"type": "array", "items": {"type": "integer"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }});
        let spec = Bound::of_schema(&schema, "spec");
        assert_eq!(spec.field("name").length, 40);
        assert_eq!(spec.field("size").length, 5);
        let big = spec.field("big");
        assert_eq!(big.length, MAX_REQUEST - 2);
        assert_eq!(
            big.hint,
            Some(Hint {
                path: "spec.big".into(),
                keyword: "maxLength"
            })
        );
        let items = spec.field("items");
        assert_eq!(
            (items.items, items.part().length, items.hint),
            (300, 32, None)
        );
        // `0,` at least per integer: (3 MiB - 2) / 2.
        assert_eq!(spec.field("free").items, (MAX_REQUEST - 2) / 2);
        // `"k":"",` at least per entry: (3 MiB - 2) / 8.
        assert_eq!(spec.field("labels").items, (MAX_REQUEST - 2) / 8);
    }

    #[test]
    fn a_value_bounds_itself_its_items_merged() {
        let value =
            json!({"items": [{"a": "xyz"}, {"a": "x", "b": [1, 2, 3]}], "big": "0123456789"});
        let bound = Bound::of_value(&value);
        assert_eq!(bound.field("big").length, 10);
        let items = bound.field("items");
        assert_eq!(items.items, 2);
        let item = items.part();
        assert_eq!(item.field("a").length, 3);
        assert_eq!(item.field("b").items, 3);
    }

    /// Two values of unknown parts merged stay unknown (this recursed
    /// without end, overflowing the stack of whichever thread estimated
    /// `hash.fnv64a(schema.spec.name)`).
    #[test]
    fn unknown_parts_merged_with_unknown_parts_stay_unknown() {
        let merged = Bound::unknown().union(&Bound::unknown());
        assert_eq!(merged.parts, Parts::Unknown);
        let nested = Bound {
            parts: Parts::Of(Arc::new(Bound::unknown())),
            ..Bound::default()
        };
        assert!(matches!(
            Bound::unknown().union(&nested).parts,
            Parts::Of(_)
        ));
    }

    #[test]
    fn joining_adds_lengths_and_keeps_the_widest_parts() {
        let a = Bound::string(5);
        let b = Bound::string(7);
        assert_eq!(a.joined(&b).length, 12);
        let list = Bound::list(3, Bound::string(2)).joined(&Bound::list(4, Bound::string(9)));
        assert_eq!((list.items, list.part().length), (7, 9));
    }
}
