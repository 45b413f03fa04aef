//! The objects a resource applied, under the names its kind file gives
//! them (`spec.children`), as the variables of its CEL expressions: each
//! as the engine watches it (`metadata` with name, namespace, uid and
//! generation; `spec.replicas`, `spec.type`; the whole `status`), a child
//! without a name as the list of every such object; beside them the
//! resource's `spec` (defaults filled in), `metadata` and `schema` (the
//! whole resource). Every evaluation of one look spends from its
//! [`Budget`]; one refused is left out, named in [`Children::refused`].

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde_json::Value;

use super::DeclaredKind;
use super::evaluation::{Budget, Refusal};
use super::expressions::{EvalError, Expression, SELF};
use super::file::Child;
use super::object::DeclaredObject;
use crate::kind::ObjectId;

/// The variables of one resource's expressions.
pub struct Children<'a> {
    variables: BTreeMap<&'a str, Value>,
    /// Named children not applied (or not seen) yet: what each waits for.
    missing: BTreeMap<&'a str, String>,
    /// What this look may still spend.
    budget: RefCell<Budget>,
    /// The expressions refused (by kind file field), and why.
    refused: RefCell<BTreeMap<String, Refusal>>,
}

impl<'a> Children<'a> {
    /// The children of `resource` among `objects` (its applied objects'
    /// watched state), as `kind`'s file names them, beside what its
    /// references read (`read`, by reference name).
    pub fn of(
        kind: &'a DeclaredKind,
        resource: &DeclaredObject,
        objects: &BTreeMap<ObjectId, Value>,
        mut read: BTreeMap<String, Value>,
        budget: Budget,
    ) -> Self {
        let context = kind.recipe.context(resource);
        let mut variables = BTreeMap::from([
            ("spec", context["spec"].clone()),
            ("metadata", context["metadata"].clone()),
            ("schema", context),
        ]);
        let mut missing = BTreeMap::new();
        for name in kind.file.spec.references.keys() {
            match read.remove(name) {
                Some(value) => {
                    variables.insert(name.as_str(), value);
                }
                None => {
                    missing.insert(name.as_str(), "not read yet".to_string());
                }
            }
        }
        for (name, child) in &kind.file.spec.children {
            if child.name.is_none() {
                let all = matching(objects, child).map(|(_, o)| o.clone()).collect();
                variables.insert(name.as_str(), Value::Array(all));
                continue;
            }
            let wanted = kind.recipe.child_name(name, resource);
            let found = wanted
                .as_ref()
                .ok()
                .and_then(|wanted| matching(objects, child).find(|(id, _)| id.name == *wanted));
            match (found, wanted) {
                (Some((_, object)), _) => {
                    variables.insert(name.as_str(), object.clone());
                }
                (None, Ok(wanted)) => {
                    let object = format!("{}/{wanted}", child.kind.to_lowercase());
                    missing.insert(name.as_str(), format!("{object} not found yet"));
                }
                (None, Err(e)) => {
                    missing.insert(name.as_str(), e.to_string());
                }
            }
        }
        Self {
            variables,
            missing,
            budget: RefCell::new(budget),
            refused: RefCell::default(),
        }
    }

    /// The expressions refused so far, each as the kind file's field and
    /// why.
    pub fn refused(&self) -> Vec<String> {
        (self.refused.borrow().iter())
            .map(|(field, why)| format!("{field}: {why}"))
            .collect()
    }

    /// `expression` (the kind file's `field`) over `variables`, within
    /// the budget; `None` when refused (recorded).
    fn run(
        &self,
        expression: &Expression,
        field: &str,
        variables: &BTreeMap<&str, Value>,
    ) -> Option<Result<Value, EvalError>> {
        let mut budget = self.budget.borrow_mut();
        budget.look().entering(field);
        let ran = expression.eval_within(variables, &mut budget);
        match ran {
            Ok(result) => Some(result),
            Err(why) => {
                let mut refused = self.refused.borrow_mut();
                // One line for a look stopped, whichever expression it was in.
                if why != Refusal::Stopped || !refused.values().any(|r| *r == Refusal::Stopped) {
                    refused.entry(field.to_string()).or_insert(why);
                }
                None
            }
        }
    }

    /// What `expression` waits for, if it reads a named child not found.
    fn waiting(&self, expression: &Expression) -> Option<String> {
        expression
            .reads()
            .find_map(|name| self.missing.get(name).map(|why| format!("{name}: {why}")))
    }

    /// The value of `expression` (the kind file's `field`): `None` while a
    /// child it reads, or a field or index, is not there (kro leaves such
    /// a field out too), or when it is over budget (see
    /// [`Children::refused`]); an error in words (the expression quoted).
    pub fn eval(&self, expression: &Expression, field: &str) -> Result<Option<Value>, String> {
        if self.waiting(expression).is_some() {
            return Ok(None);
        }
        match self.run(expression, field, &self.variables) {
            None | Some(Err(EvalError::Missing(_))) => Ok(None),
            Some(Ok(value)) => Ok(Some(value)),
            Some(Err(EvalError::Failed(e))) => Err(format!("{} failed: {e}", expression.source())),
        }
    }

    /// `None` when `expression` (at `at`, the kind file's `field`) is true
    /// or over budget (see [`Children::refused`]), else what `Ready` waits
    /// for.
    pub fn holds(&self, expression: &Expression, at: &str, field: &str) -> Option<String> {
        if let Some(waiting) = self.waiting(expression) {
            return Some(format!("{at}: {waiting}"));
        }
        let result = self.run(expression, field, &self.variables)?;
        verdict(result, expression, at)
    }

    /// What the child `name`'s `readyWhen` waits for: one entry per object
    /// it does not hold for (each of a list), none when it holds for all
    /// (or when it is over budget: see [`Children::refused`]).
    pub fn ready_when(&self, name: &str, expression: &Expression) -> Vec<String> {
        let field = format!("spec.children.{name}.readyWhen");
        let at = format!("{name}.readyWhen");
        if let Some(why) = self.missing.get(name) {
            return vec![format!("{at}: {name}: {why}")];
        }
        if let Some(waiting) = self.waiting(expression) {
            return vec![format!("{at}: {waiting}")];
        }
        let objects: Vec<&Value> = match self.variables.get(name) {
            Some(Value::Array(all)) => all.iter().collect(),
            Some(one) => vec![one],
            None => Vec::new(),
        };
        // Only what the expression reads, not every child of the resource.
        let mut variables: BTreeMap<&str, Value> = (self.variables.iter())
            .filter(|(n, _)| expression.reads().any(|r| r == **n))
            .map(|(n, v)| (*n, v.clone()))
            .collect();
        let mut waits = Vec::new();
        for object in objects {
            let label = object["metadata"]["name"].as_str().unwrap_or(name);
            variables.insert(SELF, object.clone());
            // Refused for one object: the look has spent what it may.
            let Some(result) = self.run(expression, &field, &variables) else {
                break;
            };
            waits.extend(verdict(result, expression, &format!("{at} ({label})")));
        }
        waits
    }
}

/// The objects of `objects` of the child's kind (and apiVersion, if given).
fn matching<'o>(
    objects: &'o BTreeMap<ObjectId, Value>,
    child: &'o Child,
) -> impl Iterator<Item = (&'o ObjectId, &'o Value)> {
    objects.iter().filter(move |(id, _)| {
        id.kind == child.kind
            && child
                .api_version
                .as_ref()
                .is_none_or(|v| *v == id.api_version)
    })
}

/// `None` for `true`; else what a false, non-boolean or failed result says.
fn verdict(result: Result<Value, EvalError>, expression: &Expression, at: &str) -> Option<String> {
    let source = expression.source();
    match result {
        Ok(Value::Bool(true)) => None,
        Ok(Value::Bool(false)) => Some(format!("{at}: waiting for {source}")),
        Ok(other) => Some(format!("{at}: {source} gives {other}, not true or false")),
        Err(e) => Some(format!("{at}: {source} failed: {e}")),
    }
}
