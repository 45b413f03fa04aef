//! The CRD of a declared kind: its names and scope, the schema of `spec`
//! from the kind file, the status every kind shares (the same schema the
//! Rust kinds get) plus the kind's status fields, a status subresource, and
//! its printer columns.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::DeclaredKind;
use super::file::{Move, PrinterColumn, Scope};
use super::versions::Versions;
use crate::kind::CommonStatus;

/// A CRD type whose only purpose is to lend its status schema (the shared
/// status, processed by kube exactly as the Rust kinds' are).
#[derive(
    kube::CustomResource, serde::Deserialize, serde::Serialize, Clone, Debug, schemars::JsonSchema,
)]
#[kube(
    group = "kustomize-operator.io",
    version = "v1",
    kind = "StatusShape",
    status = "CommonStatus"
)]
struct StatusShapeSpec {}

/// The shared status schema.
fn common_status_schema() -> Value {
    let crd = serde_json::to_value(StatusShape::crd()).unwrap_or_default();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].clone()
}

/// The printer columns when a kind file lists none.
fn default_columns() -> Vec<PrinterColumn> {
    let column = |name: &str, type_: &str, json_path: &str| PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        json_path: json_path.into(),
        priority: None,
        description: None,
    };
    vec![
        column(
            "Ready",
            "string",
            r#".status.conditions[?(@.type=="Ready")].status"#,
        ),
        column("Message", "string", ".status.message"),
        column("Age", "date", ".metadata.creationTimestamp"),
    ]
}

impl DeclaredKind {
    /// Its versions and their conversions.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    /// Its CRD's name (`<plural>.<group>`).
    pub fn crd_name(&self) -> String {
        let spec = &self.file.spec;
        format!("{}.{}", spec.names.plural, spec.group)
    }

    /// The CRD (without a conversion webhook: whoever applies a CRD of
    /// several versions adds its own).
    pub fn crd(&self) -> CustomResourceDefinition {
        let spec = &self.file.spec;
        let names = &spec.names;
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some(self.crd_name()),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: spec.group.clone(),
                names: CustomResourceDefinitionNames {
                    kind: names.kind.clone(),
                    plural: names.plural.clone(),
                    singular: Some(
                        names
                            .singular
                            .clone()
                            .unwrap_or_else(|| names.kind.to_lowercase()),
                    ),
                    short_names: (!names.short_names.is_empty()).then(|| names.short_names.clone()),
                    ..Default::default()
                },
                scope: match spec.scope {
                    Scope::Namespaced => "Namespaced".into(),
                    Scope::Cluster => "Cluster".into(),
                },
                versions: self.crd_versions(),
                ..Default::default()
            },
            status: None,
        }
    }

    /// Every version the CRD serves: the stored one first, then the older.
    fn crd_versions(&self) -> Vec<CustomResourceDefinitionVersion> {
        let spec = &self.file.spec;
        let version = |name: &str, schema: &Value, storage: bool, moves: &[Move]| {
            CustomResourceDefinitionVersion {
                name: name.to_string(),
                served: true,
                storage,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: self.schema(schema),
                }),
                subresources: Some(CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(json!({}))),
                    ..Default::default()
                }),
                additional_printer_columns: Some(moved_back(self.columns(), moves)),
                ..Default::default()
            }
        };
        let older =
            (spec.versions.iter()).map(|v| version(&v.name, &v.schema, false, &v.conversion.moves));
        std::iter::once(version(&spec.version, &spec.schema, true, &[]))
            .chain(older)
            .collect()
    }

    /// The whole object's schema: `spec` as given, the status.
    fn schema(&self, spec: &Value) -> Option<JSONSchemaProps> {
        let mut status = common_status_schema();
        if self.templates.is_some() {
            // A kind defined in the cluster: served from revisions.
            status["properties"][super::REVISION_FIELD] = json!({
                "type": "integer",
                "description": "The revision of the kind's definition serving this resource."
            });
        }
        for field in &self.file.spec.status {
            let description = match (&field.from, &field.path, &field.expression) {
                (Some(from), Some(path), _) => {
                    format!("Copied from the {} it applied ({path}).", from.kind)
                }
                (_, _, Some(expression)) => format!("Computed: {expression}"),
                _ => String::new(),
            };
            let mut schema = json!({"type": field.type_, "description": description});
            match field.type_.as_str() {
                "object" => schema["x-kubernetes-preserve-unknown-fields"] = json!(true),
                "array" => schema["items"] = json!({"x-kubernetes-preserve-unknown-fields": true}),
                _ => {}
            }
            status["properties"][&field.field] = schema;
        }
        let schema = json!({
            "type": "object",
            "description": format!("{} (declared by the kustomize folder {}).", self.file.spec.names.kind, self.name()),
            "required": ["spec"],
            "properties": {
                "spec": spec,
                "status": status,
            },
        });
        serde_json::from_value(schema).ok()
    }

    fn columns(&self) -> Vec<CustomResourceColumnDefinition> {
        self.file
            .spec
            .printer_columns
            .clone()
            .unwrap_or_else(default_columns)
            .into_iter()
            .map(|c| CustomResourceColumnDefinition {
                name: c.name,
                type_: c.type_,
                json_path: c.json_path,
                priority: c.priority,
                description: c.description,
                format: None,
            })
            .collect()
    }
}

/// `columns` (written for the stored version) for an older version whose
/// conversion makes `moves`: a column reading a field a move puts reads it
/// where the older version has it (`.spec.text` is `.spec.message` at v1).
fn moved_back(
    columns: Vec<CustomResourceColumnDefinition>,
    moves: &[Move],
) -> Vec<CustomResourceColumnDefinition> {
    let back = |path: &str| {
        let deepest = (moves.iter())
            .filter_map(|m| {
                let to = format!(".{}", m.to);
                let rest = path.strip_prefix(&to)?;
                (rest.is_empty() || rest.starts_with(['.', '[']))
                    .then(|| (to.len(), format!(".{}{rest}", m.from)))
            })
            .max_by_key(|(len, _)| *len);
        deepest.map_or_else(|| path.to_string(), |(_, moved)| moved)
    };
    columns
        .into_iter()
        .map(|c| CustomResourceColumnDefinition {
            json_path: back(&c.json_path),
            ..c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(path: &str) -> CustomResourceColumnDefinition {
        CustomResourceColumnDefinition {
            name: "c".into(),
            type_: "string".into(),
            json_path: path.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_column_follows_the_deepest_move_of_its_field_and_no_other() {
        let moves = [
            Move {
                from: "spec.old".into(),
                to: "spec.new".into(),
            },
            Move {
                from: "spec.inner".into(),
                to: "spec.new.deep".into(),
            },
        ];
        let paths: Vec<String> = [
            ".spec.new",
            ".spec.new.x",
            ".spec.new.deep.y",
            ".spec.newer",
            ".spec.new[0]",
        ]
        .into_iter()
        .map(|p| moved_back(vec![column(p)], &moves).remove(0).json_path)
        .collect();
        assert_eq!(
            paths,
            [
                ".spec.old",
                ".spec.old.x",
                ".spec.inner.y",
                ".spec.newer",
                ".spec.old[0]"
            ]
        );
    }
}
