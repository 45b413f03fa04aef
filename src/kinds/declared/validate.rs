//! Every check of a kind file, at start-up: its shape (unknown fields,
//! types), its names, its schema, its recipe. Each error names the file and
//! the field.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::Value;

use super::KindFileError;
use super::file::{self, KindFile};
use super::versions::round_trip;

use crate::kind::CommonStatus;
use crate::kind::ObjectId;
use crate::names::is_dns_label;

type Result<T> = std::result::Result<T, KindFileError>;

fn invalid(path: &Path, field: impl Into<String>, reason: impl Into<String>) -> KindFileError {
    KindFileError::Invalid {
        file: path.to_path_buf(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// Parses the kind file; an unknown or missing field, or one of the wrong
/// type, is an error naming it.
pub fn parse(path: &Path, text: &str) -> Result<KindFile> {
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| invalid(path, "(file)", format!("not YAML: {e}")))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." {
            "(top level)".into()
        } else {
            field
        };
        invalid(path, field, e.inner().to_string())
    })
}

/// Checks what parsing cannot: identity, names, schema, recipe.
pub fn check(path: &Path, file: &KindFile, folder: &str, templates: &[String]) -> Result<()> {
    if file.api_version != file::API_VERSION {
        return Err(invalid(
            path,
            "apiVersion",
            format!("must be {}", file::API_VERSION),
        ));
    }
    if file.kind != file::KIND {
        return Err(invalid(path, "kind", format!("must be {}", file::KIND)));
    }
    if file.metadata.name != folder {
        return Err(invalid(
            path,
            "metadata.name",
            format!(
                "{:?} must be the kind folder's name, {folder:?}",
                file.metadata.name
            ),
        ));
    }
    check_names(path, file)?;
    check_schema(path, &file.spec.schema, "spec.schema")?;
    check_versions(path, file)?;
    check_columns(path, file)?;
    check_recipe(path, file, templates)?;
    check_status(path, file)?;
    check_readiness(path, file)?;
    check_children(path, file)?;
    check_reach(path, file)?;
    check_references(path, file)?;
    check_reconcile(path, file)
}

/// The older versions: each named once and not the stored version, each
/// schema structural, each conversion a lossless round trip but for what
/// it declares lossy.
fn check_versions(path: &Path, file: &KindFile) -> Result<()> {
    let spec = &file.spec;
    let mut seen = vec![spec.version.as_str()];
    for (i, older) in spec.versions.iter().enumerate() {
        if seen.contains(&older.name.as_str()) {
            return Err(invalid(
                path,
                format!("spec.versions[{i}].name"),
                format!("{:?} is listed twice (or is spec.version)", older.name),
            ));
        }
        seen.push(&older.name);
        check_schema(path, &older.schema, &format!("spec.versions[{i}].schema"))?;
        round_trip::check(&spec.schema, &spec.version, older, i).map_err(|message| {
            let (field, reason) = message
                .split_once(": ")
                .unwrap_or(("spec.versions", &message));
            invalid(path, field, reason)
        })?;
    }
    Ok(())
}

fn check_names(path: &Path, file: &KindFile) -> Result<()> {
    let spec = &file.spec;
    let group_ok = spec.group.contains('.')
        && spec.group.len() <= 253
        && spec.group.split('.').all(is_dns_label);
    if !group_ok {
        return Err(invalid(
            path,
            "spec.group",
            format!(
                "{:?} is not a DNS subdomain with a dot (example.com)",
                spec.group
            ),
        ));
    }
    let version_ok = spec.version.starts_with('v')
        && spec.version[1..].starts_with(|c: char| c.is_ascii_digit())
        && is_dns_label(&spec.version);
    if !version_ok {
        return Err(invalid(
            path,
            "spec.version",
            format!(
                "{:?} is not a Kubernetes version (v1, v1beta1)",
                spec.version
            ),
        ));
    }
    let kind = &spec.names.kind;
    if !kind.starts_with(|c: char| c.is_ascii_uppercase())
        || !kind.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Err(invalid(
            path,
            "spec.names.kind",
            format!("{kind:?} must be UpperCamelCase letters and digits"),
        ));
    }
    let lower = [
        ("spec.names.plural", Some(&spec.names.plural)),
        ("spec.names.singular", spec.names.singular.as_ref()),
    ];
    for (field, value) in lower {
        if let Some(v) = value
            && !is_dns_label(v)
        {
            return Err(invalid(
                path,
                field,
                format!("{v:?} must be lowercase letters, digits and '-'"),
            ));
        }
    }
    for (i, short) in spec.names.short_names.iter().enumerate() {
        if !is_dns_label(short) {
            return Err(invalid(
                path,
                format!("spec.names.shortNames[{i}]"),
                format!("{short:?} must be lowercase letters, digits and '-'"),
            ));
        }
    }
    Ok(())
}

/// A structural schema, as the API server wants it: every node has a type
/// (or says it holds anything), objects describe their properties, arrays
/// their items; and every node is a valid OpenAPI v3 schema.
fn check_schema(path: &Path, schema: &Value, at: &str) -> Result<()> {
    serde_json::from_value::<JSONSchemaProps>(schema.clone())
        .map_err(|e| invalid(path, at, format!("not an OpenAPI v3 schema: {e}")))?;
    if at.ends_with(".schema") && schema["type"] != "object" {
        return Err(invalid(
            path,
            at,
            "the schema of spec must be of type object",
        ));
    }
    walk_schema(path, schema, at)
}

fn walk_schema(path: &Path, schema: &Value, at: &str) -> Result<()> {
    let Some(node) = schema.as_object() else {
        return Err(invalid(path, at, "a schema must be a mapping"));
    };
    if node.contains_key("$ref") {
        return Err(invalid(path, at, "$ref is not allowed in a CRD schema"));
    }
    let open = node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let Some(type_) = node.get("type").and_then(Value::as_str) else {
        if open {
            return Ok(());
        }
        return Err(invalid(
            path,
            at,
            "every schema needs a type (or x-kubernetes-preserve-unknown-fields: true)",
        ));
    };
    match type_ {
        "object" => {
            for (name, child) in node
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                walk_schema(path, child, &format!("{at}.properties.{name}"))?;
            }
            if let Some(extra) = node.get("additionalProperties").filter(|v| v.is_object()) {
                walk_schema(path, extra, &format!("{at}.additionalProperties"))?;
            }
            Ok(())
        }
        "array" => match node.get("items") {
            Some(items) => walk_schema(path, items, &format!("{at}.items")),
            None => Err(invalid(path, at, "an array schema needs items")),
        },
        "string" | "integer" | "number" | "boolean" => Ok(()),
        other => Err(invalid(
            path,
            format!("{at}.type"),
            format!("{other:?} is not an OpenAPI type"),
        )),
    }
}

fn check_columns(path: &Path, file: &KindFile) -> Result<()> {
    for (i, c) in file.spec.printer_columns.iter().flatten().enumerate() {
        let at = format!("spec.printerColumns[{i}]");
        if !file::COLUMN_TYPES.contains(&c.type_.as_str()) {
            return Err(invalid(
                path,
                format!("{at}.type"),
                format!(
                    "{:?} is not one of string, integer, number, boolean, date",
                    c.type_
                ),
            ));
        }
        if !c.json_path.starts_with('.') {
            return Err(invalid(
                path,
                format!("{at}.jsonPath"),
                "must start with '.'",
            ));
        }
    }
    Ok(())
}

fn check_recipe(path: &Path, file: &KindFile, templates: &[String]) -> Result<()> {
    let overlay = &file.spec.overlay;
    let has = |dir: &str, t: &str| templates.iter().any(|x| *x == format!("{dir}/{t}"));
    for (i, p) in overlay.patches.iter().enumerate() {
        if !has("patches", &p.template) {
            return Err(invalid(
                path,
                format!("spec.overlay.patches[{i}].template"),
                format!("no template patches/{} in the kind folder", p.template),
            ));
        }
    }
    for (i, r) in overlay.resources.iter().enumerate() {
        if !has("resources", &r.template) {
            return Err(invalid(
                path,
                format!("spec.overlay.resources[{i}].template"),
                format!("no template resources/{} in the kind folder", r.template),
            ));
        }
    }
    if file.spec.scope == file::Scope::Namespaced && overlay.namespace.is_some() {
        return Err(invalid(
            path,
            "spec.overlay.namespace",
            "a namespaced kind's objects always go to the resource's namespace: leave it out",
        ));
    }
    Ok(())
}

fn check_status(path: &Path, file: &KindFile) -> Result<()> {
    for (i, s) in file.spec.status.iter().enumerate() {
        let at = format!("spec.status[{i}]");
        let identifier = s.field.starts_with(|c: char| c.is_ascii_lowercase())
            && s.field.chars().all(|c| c.is_ascii_alphanumeric());
        if !identifier {
            return Err(invalid(
                path,
                format!("{at}.field"),
                format!("{:?} must be a lowerCamelCase field name", s.field),
            ));
        }
        if CommonStatus::ENGINE_FIELDS.contains(&s.field.as_str()) {
            return Err(invalid(
                path,
                format!("{at}.field"),
                format!("{:?} is one of the engine's own status fields", s.field),
            ));
        }
        if !file::STATUS_TYPES.contains(&s.type_.as_str()) {
            return Err(invalid(
                path,
                format!("{at}.type"),
                format!(
                    "{:?} is not one of {}",
                    s.type_,
                    file::STATUS_TYPES.join(", ")
                ),
            ));
        }
        match (&s.expression, &s.from, &s.path) {
            (Some(_), None, None) => {}
            (None, Some(from), Some(field_path)) => {
                if matches!(s.type_.as_str(), "array" | "object") {
                    return Err(invalid(
                        path,
                        format!("{at}.type"),
                        "a list or an object comes from an expression only",
                    ));
                }
                check_source(path, &at, from, field_path)?;
            }
            _ => {
                return Err(invalid(
                    path,
                    at,
                    "needs either expression, or from and path",
                ));
            }
        }
    }
    Ok(())
}

/// A status field or readiness rule reads the status of a watched object.
fn check_source(
    path: &Path,
    at: &str,
    from: &file::ObjectSelector,
    field_path: &str,
) -> Result<()> {
    let ok = field_path.starts_with(".status.")
        && field_path.len() > ".status.".len()
        && field_path[1..].split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
    if !ok {
        return Err(invalid(
            path,
            format!("{at}.path"),
            format!(
                "{field_path:?} must be a dotted path into the object's status, such as .status.availableReplicas"
            ),
        ));
    }
    watched(
        path,
        &format!("{at}.from.kind"),
        from.api_version.as_deref(),
        &from.kind,
    )
}

/// Objects of kinds without a status are not watched: nothing reads them.
fn watched(path: &Path, at: &str, api_version: Option<&str>, kind: &str) -> Result<()> {
    let group = api_version
        .and_then(|v| v.rsplit_once('/'))
        .map_or("", |(g, _)| g);
    if ObjectId::always_current_kind(group, kind) {
        return Err(invalid(
            path,
            at,
            format!("{kind} objects have no status to read"),
        ));
    }
    Ok(())
}

fn check_readiness(path: &Path, file: &KindFile) -> Result<()> {
    for (i, r) in file.spec.readiness.iter().enumerate() {
        let at = format!("spec.readiness[{i}]");
        match (&r.expression, &r.from, &r.path) {
            (Some(_), None, None) if r.equals.is_none() && r.at_least.is_none() => {}
            (None, Some(from), Some(field_path)) => {
                if r.equals.is_some() == r.at_least.is_some() {
                    return Err(invalid(path, at, "needs exactly one of equals and atLeast"));
                }
                check_source(path, &at, from, field_path)?;
            }
            _ => {
                return Err(invalid(
                    path,
                    at,
                    "needs either expression, or from, path and one of equals and atLeast",
                ));
            }
        }
    }
    Ok(())
}

/// Words CEL keeps for itself, which cannot name a child.
const CEL_RESERVED: [&str; 21] = [
    "as",
    "break",
    "const",
    "continue",
    "else",
    "false",
    "for",
    "function",
    "if",
    "import",
    "in",
    "let",
    "loop",
    "namespace",
    "null",
    "package",
    "return",
    "true",
    "var",
    "void",
    "while",
];

fn check_children(path: &Path, file: &KindFile) -> Result<()> {
    for (name, child) in &file.spec.children {
        let at = format!("spec.children.{name}");
        if !is_free_name(name) {
            return Err(invalid(
                path,
                at,
                format!(
                    "{name:?} must be a name expressions can use: lower case first, letters, digits and _, not spec, metadata, schema, self or a CEL keyword"
                ),
            ));
        }
        watched(
            path,
            &format!("{at}.kind"),
            child.api_version.as_deref(),
            &child.kind,
        )?;
    }
    Ok(())
}

/// A name expressions and templates can use for a child or a reference:
/// lower case first, letters, digits and `_`, and none the resource, CEL
/// or another entry takes.
fn is_free_name(name: &str) -> bool {
    let identifier = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let taken = super::expressions::RESOURCE_NAMES.contains(&name)
        || name == super::expressions::SELF
        || name == "kind"
        || CEL_RESERVED.contains(&name);
    identifier && !taken
}

fn check_references(path: &Path, file: &KindFile) -> Result<()> {
    let spec = &file.spec;
    if spec.references.len() > file::MAX_REFERENCES {
        return Err(invalid(
            path,
            "spec.references",
            format!("at most {} references", file::MAX_REFERENCES),
        ));
    }
    for (name, r) in &spec.references {
        let at = format!("spec.references.{name}");
        if !is_free_name(name) || spec.children.contains_key(name) {
            return Err(invalid(
                path,
                at,
                format!(
                    "{name:?} must be a name templates and expressions can use: lower case first, letters, digits and _, not spec, metadata, kind, schema, self, a CEL keyword or a child's name"
                ),
            ));
        }
        let selects = r.selector.as_ref().is_some_and(|s| !s.is_empty());
        if r.name.is_some() == selects {
            return Err(invalid(
                path,
                at,
                "needs exactly one of name and a non-empty selector",
            ));
        }
        if !is_kind_name(&r.kind) || r.api_version.is_empty() {
            return Err(invalid(
                path,
                format!("{at}.kind"),
                "needs an apiVersion and a kind (`ConfigMap`)",
            ));
        }
        match (spec.scope, &r.namespace) {
            (file::Scope::Namespaced, Some(_)) => {
                return Err(invalid(
                    path,
                    format!("{at}.namespace"),
                    "a namespaced kind reads in each resource's own namespace",
                ));
            }
            (file::Scope::Cluster, None) => {
                return Err(invalid(
                    path,
                    format!("{at}.namespace"),
                    "a cluster-scoped kind's resources have no namespace: name the one to read in",
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A kind's name: an upper-case letter, then letters and digits.
fn is_kind_name(kind: &str) -> bool {
    kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
}

fn check_reach(path: &Path, file: &KindFile) -> Result<()> {
    for (i, rule) in file.spec.reach.iter().enumerate() {
        let at = format!("spec.reach[{i}]");
        if file.spec.scope == file::Scope::Cluster {
            return Err(invalid(
                path,
                at,
                "a cluster-scoped kind is not confined to a namespace: reach is for namespaced kinds",
            ));
        }
        if !is_kind_name(&rule.kind) {
            return Err(invalid(
                path,
                format!("{at}.kind"),
                "must be a kind (`ClusterRole`)",
            ));
        }
        for (j, pattern) in rule.namespaces.iter().flatten().enumerate() {
            if !is_namespace_pattern(pattern) {
                return Err(invalid(
                    path,
                    format!("{at}.namespaces[{j}]"),
                    format!("{pattern:?} is not a namespace name, a prefix ending in *, or *"),
                ));
            }
        }
    }
    Ok(())
}

/// A namespace name, a prefix of one followed by `*`, or `*`.
fn is_namespace_pattern(pattern: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => is_dns_label(&format!("{prefix}x")),
        None => is_dns_label(pattern),
    }
}

fn check_reconcile(path: &Path, file: &KindFile) -> Result<()> {
    if let Some(account) = &file.spec.reconcile.service_account_name {
        let field = "spec.reconcile.serviceAccountName";
        crate::names::check_account_name(account).map_err(|e| invalid(path, field, e))?;
        if file.spec.scope == file::Scope::Cluster {
            return Err(invalid(
                path,
                field,
                "a cluster-scoped kind has no namespace to take an account from",
            ));
        }
    }
    if let Some(interval) = &file.spec.reconcile.interval {
        let parsed = crate::duration::parse_duration(interval)
            .map_err(|e| invalid(path, "spec.reconcile.interval", e.to_string()))?;
        if parsed < std::time::Duration::from_secs(10) {
            return Err(invalid(
                path,
                "spec.reconcile.interval",
                format!("{interval:?} is below the minimum of 10s"),
            ));
        }
    }
    Ok(())
}
