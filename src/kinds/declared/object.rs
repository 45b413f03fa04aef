//! A resource of a declared kind as the engine holds it: its type, its
//! metadata, and every other top-level field (`spec`, `status`) kept as
//! one piece of compact JSON text.
//!
//! The controller caches every resource it serves. As a `DynamicObject` a
//! Sample took about five times its JSON in memory, every map a B-tree of
//! its own with a key allocated per field; kept as text it costs little
//! more than its JSON, and the few reads a reconcile makes (the spec for the
//! templates, the engine's status) parse just the part they need.

use std::fmt;

use kube::api::{ObjectMeta, TypeMeta};
use serde::de::{self, DeserializeOwned, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::dynamic_kind::dynamic_kind;

/// One resource of a declared kind; its kind is an [`ApiResource`](kube::core::ApiResource).
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredObject {
    /// `apiVersion` and `kind`, when the object names them.
    pub types: Option<TypeMeta>,
    /// Its metadata.
    pub metadata: ObjectMeta,
    /// The other top-level fields, as a serialized JSON object.
    fields: Box<str>,
}

impl DeclaredObject {
    /// `spec`, or an empty object when the resource has none; parses only
    /// `spec`, skipping the rest.
    pub fn spec(&self) -> Value {
        #[derive(Deserialize)]
        struct Only {
            spec: Option<Value>,
        }
        serde_json::from_str::<Only>(&self.fields)
            .ok()
            .and_then(|only| only.spec)
            .unwrap_or_else(|| Value::Object(Map::new()))
    }

    /// The `status` read as `T`: parses only `status`, skipping the rest.
    /// `None` when there is no status or it does not read as `T`.
    pub fn status_as<T: DeserializeOwned>(&self) -> Option<T> {
        #[derive(Deserialize)]
        struct Only<T> {
            status: Option<T>,
        }
        serde_json::from_str::<Only<T>>(&self.fields)
            .ok()
            .and_then(|only| only.status)
    }

    /// The same resource with the top-level field `name` set to `value`.
    pub fn with_field(&self, name: &str, value: Value) -> Self {
        let mut fields = self.fields();
        fields.insert(name.to_string(), value);
        Self {
            types: self.types.clone(),
            metadata: self.metadata.clone(),
            fields: to_text(fields),
        }
    }

    /// The same resource as a `DynamicObject`, its fields parsed whole.
    pub fn to_dynamic(&self) -> kube::api::DynamicObject {
        kube::api::DynamicObject {
            types: self.types.clone(),
            metadata: self.metadata.clone(),
            data: Value::Object(self.fields()),
        }
    }

    fn fields(&self) -> Map<String, Value> {
        // The text was written from a map, so it always reads back as one.
        serde_json::from_str(&self.fields).unwrap_or_default()
    }
}

/// `fields` as compact JSON text.
fn to_text(fields: Map<String, Value>) -> Box<str> {
    Value::Object(fields).to_string().into_boxed_str()
}

impl<'de> Deserialize<'de> for DeclaredObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// Reads an object's fields one by one: the type and metadata into their
/// own types, everything else into the text.
struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = DeclaredObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DeclaredObject, A::Error> {
        let mut api_version: Option<String> = None;
        let mut kind: Option<String> = None;
        let mut metadata: Option<ObjectMeta> = None;
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => api_version = map.next_value()?,
                "kind" => kind = map.next_value()?,
                "metadata" => metadata = map.next_value()?,
                _ => {
                    let value = map.next_value()?;
                    fields.insert(key, value);
                }
            }
        }
        let types = match (api_version, kind) {
            (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
            _ => None,
        };
        let metadata = metadata.ok_or_else(|| de::Error::missing_field("metadata"))?;
        Ok(DeclaredObject {
            types,
            metadata,
            fields: to_text(fields),
        })
    }
}

impl Serialize for DeclaredObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.fields();
        let mut map = serializer.serialize_map(None)?;
        if let Some(types) = &self.types {
            map.serialize_entry("apiVersion", &types.api_version)?;
            map.serialize_entry("kind", &types.kind)?;
        }
        map.serialize_entry("metadata", &self.metadata)?;
        for (key, value) in &fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

dynamic_kind!(DeclaredObject);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use kube::api::ApiResource;
    use serde_json::json;

    fn greeting() -> Value {
        json!({
            "apiVersion": "hello.example.com/v1",
            "kind": "Greeting",
            "metadata": {"name": "hi", "namespace": "ns", "uid": "u-1", "generation": 2},
            "spec": {"message": "hey", "replicas": 2},
            "status": {"observedGeneration": 1, "message": "applied"},
        })
    }

    #[test]
    fn it_reads_back_as_the_object_it_was_read_from() {
        let object: DeclaredObject = serde_json::from_value(greeting()).unwrap();
        assert_eq!(serde_json::to_value(&object).unwrap(), greeting());
        assert_eq!(object.metadata.name.as_deref(), Some("hi"));
        assert_eq!(object.types.as_ref().unwrap().kind, "Greeting");
        assert_eq!(object.spec(), json!({"message": "hey", "replicas": 2}));
    }

    #[test]
    fn it_reads_as_the_dynamic_object_it_stands_for() {
        let object: DeclaredObject = serde_json::from_value(greeting()).unwrap();
        let dynamic: kube::api::DynamicObject = serde_json::from_value(greeting()).unwrap();
        assert_eq!(object.to_dynamic(), dynamic);
    }

    #[test]
    fn it_reads_from_yaml_as_from_json() {
        let yaml = "apiVersion: hello.example.com/v1\nkind: Greeting\n\
                    metadata: {name: hi}\nspec: {message: hey}\n";
        let object: DeclaredObject = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(object.spec(), json!({"message": "hey"}));
        assert_eq!(object.status_as::<Value>(), None);
    }

    #[test]
    fn the_status_is_read_alone_and_a_wrong_one_reads_as_none() {
        #[derive(Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "camelCase")]
        struct Generation {
            observed_generation: i64,
        }
        let object: DeclaredObject = serde_json::from_value(greeting()).unwrap();
        assert_eq!(
            object.status_as::<Generation>(),
            Some(Generation {
                observed_generation: 1
            })
        );
        let bad = object.with_field("status", json!({"observedGeneration": "one"}));
        assert_eq!(bad.status_as::<Generation>(), None);
        let none = object.with_field("spec", json!({}));
        assert_eq!(none.spec(), json!({}));
    }

    #[test]
    fn an_object_without_type_or_metadata_is_told_apart() {
        let untyped: DeclaredObject =
            serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(untyped.types, None);
        assert_eq!(untyped.spec(), json!({}));
        let error = serde_json::from_value::<DeclaredObject>(json!({"spec": {}})).unwrap_err();
        assert!(error.to_string().contains("metadata"), "{error}");
    }

    #[test]
    fn its_kind_is_the_api_resource() {
        let resource = ApiResource {
            group: "hello.example.com".into(),
            version: "v1".into(),
            api_version: "hello.example.com/v1".into(),
            kind: "Greeting".into(),
            plural: "greetings".into(),
        };
        assert_eq!(DeclaredObject::kind(&resource), "Greeting");
        assert_eq!(DeclaredObject::plural(&resource), "greetings");
    }
}
