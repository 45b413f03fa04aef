//! A declared kind's recipe, compiled: the templated strings of its kind
//! file (label values, name prefix and suffix, generator names and values,
//! status sources, adoption labels) parsed once, and the overlay built for a
//! resource. Their results are data (serialized, never pasted into YAML).

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use serde_json::{Value, json};
use tera::Context;

use super::file::{GeneratorSpec, KindSpec, ReadinessRule, Scope};
use super::object::DeclaredObject;
use super::references::{By, Lookup, api_resource};
use crate::kind::{
    ConfigMapGenerator, HandlerError, Labels, Overlay, PatchTarget, PatchTemplate, Sandbox,
    TemplateError, Templates,
};

/// The compiled templated strings of one kind file.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The templated strings, and where they render.
    templates: Templates,
    /// The schema of `spec`, for its defaults.
    schema: Value,
}

/// A template name for a kind file field.
fn key(parts: &[&str]) -> String {
    parts.join("/")
}

impl Recipe {
    /// Parses every templated string of `spec`; an error names the field.
    pub fn compile(spec: &KindSpec) -> Result<Self, (String, String)> {
        let mut fields = BTreeMap::new();
        let mut texts = Vec::new();
        let mut add = |name: String, field: String, text: &str| {
            texts.push((name.clone(), text.to_string()));
            fields.insert(name, field);
        };
        let o = &spec.overlay;
        for (i, labels) in o.labels.iter().enumerate() {
            for (k, v) in &labels.pairs {
                add(
                    key(&["labels", &i.to_string(), k]),
                    format!("spec.overlay.labels[{i}].pairs.{k}"),
                    v,
                );
            }
        }
        for (field, value) in [
            ("namePrefix", &o.name_prefix),
            ("nameSuffix", &o.name_suffix),
            ("namespace", &o.namespace),
        ] {
            if let Some(v) = value {
                add(key(&[field]), format!("spec.overlay.{field}"), v);
            }
        }
        for (list, generators) in [
            ("configMapGenerator", &o.config_map_generator),
            ("secretGenerator", &o.secret_generator),
        ] {
            for (i, g) in generators.iter().enumerate() {
                let at = format!("spec.overlay.{list}[{i}]");
                add(
                    key(&[list, &i.to_string(), "name"]),
                    format!("{at}.name"),
                    &g.name,
                );
                for (k, v) in &g.literals {
                    add(
                        key(&[list, &i.to_string(), "literals", k]),
                        format!("{at}.literals.{k}"),
                        v,
                    );
                }
            }
        }
        for (i, from) in spec
            .status
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.from.as_ref()?)))
        {
            add(
                key(&["status", &i.to_string()]),
                format!("spec.status[{i}].from.name"),
                &from.name,
            );
        }
        for (name, child) in &spec.children {
            if let Some(template) = &child.name {
                add(
                    key(&["children", name]),
                    format!("spec.children.{name}.name"),
                    template,
                );
            }
        }
        for (name, r) in &spec.references {
            let at = format!("spec.references.{name}");
            for (part, text) in [("name", &r.name), ("namespace", &r.namespace)] {
                if let Some(text) = text {
                    add(
                        key(&["references", name, part]),
                        format!("{at}.{part}"),
                        text,
                    );
                }
            }
            for (k, v) in r.selector.iter().flatten() {
                add(
                    key(&["references", name, "selector", k]),
                    format!("{at}.selector.{k}"),
                    v,
                );
            }
        }
        for (k, v) in &spec.reconcile.adopt {
            add(key(&["adopt", k]), format!("spec.reconcile.adopt.{k}"), v);
        }
        for (i, r) in spec.readiness.iter().enumerate() {
            let Some(from) = &r.from else { continue };
            let at = format!("spec.readiness[{i}]");
            add(
                key(&["readiness", &i.to_string(), "name"]),
                format!("{at}.from.name"),
                &from.name,
            );
            if let Some(v) = r.equals.as_ref().or(r.at_least.as_ref()) {
                add(
                    key(&["readiness", &i.to_string(), "value"]),
                    format!("{at}.value"),
                    v,
                );
            }
        }
        let templates = Templates::strings(texts).map_err(|e| match e {
            TemplateError::Invalid { name, reason } => (
                fields.get(&name).cloned().unwrap_or(name),
                format!("not a valid template: {reason}"),
            ),
            other => ("spec".to_string(), other.to_string()),
        })?;
        Ok(Self {
            templates,
            schema: spec.schema.clone(),
        })
    }

    /// Renders the templated strings in `isolation` from now on.
    pub fn isolate(&mut self, isolation: Arc<Sandbox>) {
        self.templates.isolate(isolation);
    }

    /// What templates see of `resource`: [`context`], with the defaults of
    /// the schema filled in where `spec` leaves a field out (the API server
    /// does the same for a live resource; `render` reads files).
    pub fn context(&self, resource: &DeclaredObject) -> Value {
        let mut values = context(resource);
        apply_defaults(&self.schema, &mut values["spec"]);
        values
    }

    /// Renders the templated string `name` for a resource's `context`.
    pub fn render(&self, name: &str, context: &Context) -> Result<String, HandlerError> {
        self.templates.render(name, context).map_err(|e| {
            let reason = match e {
                TemplateError::Render { reason, .. } => reason,
                other => other.to_string(),
            };
            HandlerError::Invalid(format!(
                "the kind file's {name} does not render for this resource: {reason}"
            ))
        })
    }

    /// What `resource` reads (`spec.references`), rendered for it.
    pub fn references(
        &self,
        spec: &KindSpec,
        resource: &DeclaredObject,
    ) -> Result<Vec<Lookup>, HandlerError> {
        let context = Context::from_value(self.context(resource))
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        let mut wanted = Vec::with_capacity(spec.references.len());
        for (name, r) in &spec.references {
            let namespace = match (&r.namespace, resource.namespace()) {
                (Some(_), _) => self.render(&key(&["references", name, "namespace"]), &context)?,
                (None, Some(own)) => own,
                (None, None) => {
                    return Err(HandlerError::Invalid(format!(
                        "spec.references.{name} names no namespace, and the resource has none"
                    )));
                }
            };
            let by = match &r.name {
                Some(_) => By::Name(self.render(&key(&["references", name, "name"]), &context)?),
                None => {
                    let mut labels = BTreeMap::new();
                    for k in r.selector.iter().flat_map(BTreeMap::keys) {
                        let at = key(&["references", name, "selector", k]);
                        labels.insert(k.clone(), self.render(&at, &context)?);
                    }
                    By::Labels(labels)
                }
            };
            wanted.push(Lookup {
                name: name.clone(),
                resource: api_resource(&r.api_version, &r.kind),
                namespace,
                by,
                optional: r.optional,
            });
        }
        Ok(wanted)
    }

    /// The overlay of `resource`, for a kind folder named `folder`, with
    /// what its references read (by reference name).
    pub fn overlay(
        &self,
        folder: &str,
        spec: &KindSpec,
        resource: &DeclaredObject,
        read: &BTreeMap<String, Value>,
    ) -> Result<Overlay, HandlerError> {
        let mut values = self.context(resource);
        for (name, value) in read {
            values[name.as_str()] = value.clone();
        }
        if let Some((at, c)) = refused_text(&values, "") {
            return Err(HandlerError::Invalid(format!(
                "{at} contains U+{:04X}, a character kustomize cannot carry in a value",
                u32::from(c)
            )));
        }
        let context = Context::from_value(values.clone()).map_err(|e| {
            HandlerError::Invalid(format!("the resource cannot be a template context: {e}"))
        })?;
        let o = &spec.overlay;
        let optional = |name: &str, set: bool| -> Result<Option<String>, HandlerError> {
            set.then(|| self.render(name, &context)).transpose()
        };
        let namespace = match spec.scope {
            Scope::Namespaced => Some(resource.namespace().ok_or_else(|| {
                HandlerError::Invalid("a namespaced resource must have a namespace".into())
            })?),
            Scope::Cluster => optional("namespace", o.namespace.is_some())?,
        };
        Ok(Overlay {
            base: Some(folder.to_string()),
            namespace,
            // A kind that reaches beyond the resource's namespace keeps the
            // namespaces its objects name (the engine checks them).
            namespace_unset_only: !spec.reach.is_empty(),
            name_prefix: optional("namePrefix", o.name_prefix.is_some())?,
            name_suffix: optional("nameSuffix", o.name_suffix.is_some())?,
            labels: self.labels(spec, &context)?,
            patches: o
                .patches
                .iter()
                .map(|p| PatchTemplate {
                    template: p.template.clone(),
                    target: p.target.as_ref().map(|t| PatchTarget {
                        group: t.group.clone(),
                        version: t.version.clone(),
                        kind: t.kind.clone(),
                        name: t.name.clone(),
                    }),
                    allow_name_change: false,
                })
                .collect(),
            resource_templates: o.resources.iter().map(|r| r.template.clone()).collect(),
            config_map_generators: self.generators(
                "configMapGenerator",
                &o.config_map_generator,
                &context,
            )?,
            secret_generators: self.generators("secretGenerator", &o.secret_generator, &context)?,
            values,
            ..Default::default()
        })
    }

    fn labels(&self, spec: &KindSpec, context: &Context) -> Result<Vec<Labels>, HandlerError> {
        spec.overlay
            .labels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let pairs = l
                    .pairs
                    .keys()
                    .map(|k| {
                        let value = self.render(&key(&["labels", &i.to_string(), k]), context)?;
                        check_label_value(k, &value)?;
                        Ok((k.clone(), value))
                    })
                    .collect::<Result<BTreeMap<_, _>, HandlerError>>()?;
                Ok(Labels {
                    pairs,
                    include_selectors: l.include_selectors,
                    include_templates: l.include_templates,
                })
            })
            .collect()
    }

    fn generators(
        &self,
        list: &str,
        specs: &[GeneratorSpec],
        context: &Context,
    ) -> Result<Vec<ConfigMapGenerator>, HandlerError> {
        specs
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let index = i.to_string();
                let at = |parts: &[&str]| {
                    let mut all = vec![list, index.as_str()];
                    all.extend_from_slice(parts);
                    key(&all)
                };
                let data = g
                    .literals
                    .keys()
                    .map(|k| Ok((k.clone(), self.render(&at(&["literals", k]), context)?)))
                    .collect::<Result<BTreeMap<_, _>, HandlerError>>()?;
                Ok(ConfigMapGenerator {
                    name: self.render(&at(&["name"]), context)?,
                    namespace: None,
                    data,
                    disable_name_suffix_hash: g.disable_name_suffix_hash,
                })
            })
            .collect()
    }

    /// The name of the object status field `i` is read from, for `resource`.
    pub fn status_source(
        &self,
        i: usize,
        resource: &DeclaredObject,
    ) -> Result<String, HandlerError> {
        let context = Context::from_value(self.context(resource))
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        self.render(&key(&["status", &i.to_string()]), &context)
    }

    /// The name of the child `name` (of `spec.children`) for `resource`.
    pub fn child_name(
        &self,
        name: &str,
        resource: &DeclaredObject,
    ) -> Result<String, HandlerError> {
        let context = Context::from_value(self.context(resource))
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        self.render(&key(&["children", name]), &context)
    }

    /// Readiness rule `i` rendered for `resource`.
    pub fn readiness(
        &self,
        i: usize,
        rule: &ReadinessRule,
        resource: &DeclaredObject,
    ) -> Result<RenderedRule, HandlerError> {
        let context = Context::from_value(self.context(resource))
            .map_err(|e| HandlerError::Invalid(e.to_string()))?;
        let at = |part: &str| key(&["readiness", &i.to_string(), part]);
        let name = self.render(&at("name"), &context)?;
        let value = self.render(&at("value"), &context)?;
        let wanted = if rule.equals.is_some() {
            ValueRule::Equals(value)
        } else {
            ValueRule::AtLeast(value)
        };
        Ok(RenderedRule { name, wanted })
    }

    /// The adoption labels (`reconcile.adopt`) rendered for `resource`.
    pub fn adoption(
        &self,
        spec: &KindSpec,
        resource: &DeclaredObject,
    ) -> Option<BTreeMap<String, String>> {
        if spec.reconcile.adopt.is_empty() {
            return None;
        }
        let context = Context::from_value(self.context(resource)).ok()?;
        spec.reconcile
            .adopt
            .keys()
            .map(|k| Some((k.clone(), self.render(&key(&["adopt", k]), &context).ok()?)))
            .collect()
    }
}

/// A label value must be at most 63 characters of `[A-Za-z0-9-_.]`,
/// beginning and ending with a letter or digit (or be empty): what the API
/// server would refuse is an invalid spec, said before kubectl runs.
fn check_label_value(key: &str, value: &str) -> Result<(), HandlerError> {
    if crate::label::is_value(value) {
        return Ok(());
    }
    Err(HandlerError::Invalid(format!(
        "the label {key} would be {value:?}, which is not a label value (at most 63 characters: letters, digits, '-', '_', '.', beginning and ending with a letter or digit)"
    )))
}

/// A readiness rule, rendered for one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedRule {
    /// The object's name.
    pub name: String,
    /// What its value must be.
    pub wanted: ValueRule,
}

/// What a readiness rule wants of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueRule {
    /// This text.
    Equals(String),
    /// A number at least this.
    AtLeast(String),
}

/// What templates see of a resource: its identity, labels and spec.
pub fn context(resource: &DeclaredObject) -> Value {
    let m = &resource.metadata;
    json!({
        "apiVersion": resource.types.as_ref().map(|t| t.api_version.clone()),
        "kind": resource.types.as_ref().map(|t| t.kind.clone()),
        "metadata": {
            "name": m.name,
            "namespace": m.namespace,
            "uid": m.uid,
            "generation": m.generation,
            "labels": m.labels.clone().unwrap_or_default(),
            "annotations": m.annotations.clone().unwrap_or_default(),
        },
        "spec": resource.spec(),
    })
}

/// The first string in `value` holding a character kustomize refuses, with
/// where it is (`spec.greeting`).
fn refused_text(value: &Value, at: &str) -> Option<(String, char)> {
    let child = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match value {
        Value::String(s) => s
            .chars()
            .find(|c| Overlay::kustomize_refuses(*c))
            .map(|c| (at.to_string(), c)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| refused_text(v, &format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            refused_text(v, &child(k)).or_else(|| {
                k.chars()
                    .find(|c| Overlay::kustomize_refuses(*c))
                    .map(|c| (child(k), c))
            })
        }),
        _ => None,
    }
}

/// Fills in the `default` of every property of `schema` that `value`
/// leaves out, at every depth (as the API server defaults a resource).
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    if value.is_null()
        && let Some(default) = schema.get("default")
    {
        *value = default.clone();
    }
    if let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, property) in properties {
            match object.get_mut(name) {
                Some(child) => apply_defaults(property, child),
                None => {
                    if let Some(default) = property.get("default") {
                        let mut child = default.clone();
                        apply_defaults(property, &mut child);
                        object.insert(name.clone(), child);
                    }
                }
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array_mut()) {
        for item in array {
            apply_defaults(items, item);
        }
    }
}
