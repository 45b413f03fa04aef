//! What can be known of a kind file's CEL before it runs: the fields it
//! reads from `spec` (checked against the kind's own schema) and the type
//! of its value (checked against the status field it fills, or `bool` for
//! a readiness rule).
//!
//! The check is partial by design. A child's or a reference's fields have
//! no schema here (they are any kind's), nor does anything under
//! `x-kubernetes-preserve-unknown-fields`: those read as "any type" and are
//! left to run time, where a wrong value becomes a condition. What the
//! check does know, it refuses when the kind is loaded: a misspelt
//! `spec.replicaz`, a status field of `type: integer` filled from a string.

use cel::common::ast::{Expr, IdedExpr, LiteralValue};
use serde_json::Value;

/// A value's type, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// `bool`.
    Bool,
    /// `int` or `uint`.
    Int,
    /// `double`.
    Number,
    /// `string`.
    String,
    /// `bytes`.
    Bytes,
    /// A list.
    List,
    /// A map (an object).
    Map,
    /// `null`.
    Null,
}

impl Type {
    /// The type as a message names it.
    pub fn described(self) -> &'static str {
        match self {
            Type::Bool => "a boolean",
            Type::Int => "an integer",
            Type::Number => "a number",
            Type::String => "a string",
            Type::Bytes => "bytes",
            Type::List => "a list",
            Type::Map => "an object",
            Type::Null => "null",
        }
    }

    /// Whether a value of this type can fill a status field of OpenAPI
    /// type `field` (a number or a boolean may be written as a string).
    pub fn fills(self, field: &str) -> bool {
        matches!(
            (field, self),
            (
                "string",
                Type::String | Type::Int | Type::Number | Type::Bool
            ) | ("integer", Type::Int)
                | ("number", Type::Int | Type::Number)
                | ("boolean", Type::Bool)
                | ("array", Type::List)
                | ("object", Type::Map)
        )
    }
}

/// Why a checked expression is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TypeError {
    /// It reads a `spec` field the schema does not declare.
    #[error("reads {path}, which the kind's schema does not declare (it declares: {declared})")]
    NoSuchField {
        /// The path read, `spec.replicaz`.
        path: String,
        /// The fields declared where it looked.
        declared: String,
    },
    /// Its value is of a type the field cannot hold.
    #[error("gives {is}, where {wanted} is wanted")]
    WrongType {
        /// What it gives.
        is: &'static str,
        /// What the field holds.
        wanted: String,
    },
}

/// What an expression must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation<'a> {
    /// A value for a status field of this OpenAPI type.
    Field(&'a str),
    /// A boolean: a readiness rule, a child's `readyWhen`.
    Boolean,
}

/// Checks `expression` against `spec_schema` (the fields it reads) and
/// against what it must give, where its type can be known.
pub fn check(
    expression: &IdedExpr,
    spec_schema: &Value,
    wanted: Expectation,
) -> Result<(), TypeError> {
    let Some(is) = infer(expression, spec_schema)? else {
        return Ok(());
    };
    let (fits, wanted) = match wanted {
        Expectation::Field(field) => (is.fills(field), format!("a value of type {field}")),
        Expectation::Boolean => (is == Type::Bool, "a boolean".to_string()),
    };
    if fits {
        Ok(())
    } else {
        Err(TypeError::WrongType {
            is: is.described(),
            wanted,
        })
    }
}

/// What an expression's value is known to be.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shape<'s> {
    /// Nothing is known.
    Any,
    /// A value of this type.
    Known(Type),
    /// A value the spec schema describes at this node (`path` names it).
    Schema(&'s Value),
    /// The whole resource (`schema`): its `spec` is known.
    Resource,
}

impl Shape<'_> {
    fn ty(self) -> Option<Type> {
        match self {
            Shape::Known(t) => Some(t),
            Shape::Schema(node) => schema_type(node),
            Shape::Resource => Some(Type::Map),
            Shape::Any => None,
        }
    }
}

/// The type of `expression`'s value where it can be known, after checking
/// every `spec` field it reads against `spec_schema`.
pub fn infer(expression: &IdedExpr, spec_schema: &Value) -> Result<Option<Type>, TypeError> {
    let mut checker = Checker {
        spec: spec_schema,
        scope: Vec::new(),
    };
    Ok(checker.shape(expression)?.ty())
}

struct Checker<'s> {
    spec: &'s Value,
    /// Names comprehensions bind, innermost last.
    scope: Vec<(String, Shape<'s>)>,
}

impl<'s> Checker<'s> {
    fn shape(&mut self, e: &IdedExpr) -> Result<Shape<'s>, TypeError> {
        Ok(match &e.expr {
            Expr::Literal(literal) => Shape::Known(literal_type(literal)),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(select) => {
                let operand = self.shape(&select.operand)?;
                let field = self.field(operand, &select.operand, &select.field)?;
                if select.test {
                    Shape::Known(Type::Bool)
                } else {
                    field
                }
            }
            Expr::Call(call) => {
                // kro's `hash.sha256(s)`: `hash` is no value, `s` its argument.
                let kro = super::kro_library::namespaced(call);
                let target = call.target.as_deref().filter(|_| kro.is_none());
                let mut args = Vec::with_capacity(call.args.len() + 1);
                for part in target.into_iter().chain(&call.args) {
                    args.push(self.shape(part)?);
                }
                call_shape(kro.unwrap_or(&call.func_name), &args)
            }
            Expr::Comprehension(c) => {
                let range = self.shape(&c.iter_range)?;
                let init = self.shape(&c.accu_init)?;
                let mut bound = vec![
                    (c.iter_var.clone(), element(range)),
                    (c.accu_var.clone(), init),
                ];
                bound.extend(c.iter_var2.iter().map(|v| (v.clone(), Shape::Any)));
                let before = self.scope.len();
                self.scope.extend(bound);
                let result = [&c.loop_cond, &c.loop_step]
                    .into_iter()
                    .try_for_each(|p| self.shape(p).map(drop))
                    .and_then(|()| self.shape(&c.result));
                self.scope.truncate(before);
                result?
            }
            Expr::List(list) => {
                for item in &list.elements {
                    self.shape(item)?;
                }
                Shape::Known(Type::List)
            }
            Expr::Map(_) | Expr::Struct(_) => Shape::Known(Type::Map),
            Expr::Unspecified => Shape::Any,
        })
    }

    fn ident(&self, name: &str) -> Shape<'s> {
        if let Some((_, shape)) = self.scope.iter().rev().find(|(n, _)| n == name) {
            return *shape;
        }
        match name {
            "spec" => Shape::Schema(self.spec),
            "schema" => Shape::Resource,
            _ => Shape::Any,
        }
    }

    /// `operand.field`, checked where the operand's schema lists its fields.
    fn field(
        &self,
        operand: Shape<'s>,
        operand_expr: &IdedExpr,
        field: &str,
    ) -> Result<Shape<'s>, TypeError> {
        match operand {
            Shape::Resource if field == "spec" => Ok(Shape::Schema(self.spec)),
            Shape::Schema(node) => {
                match closed_properties(node) {
                    Some(properties) => properties.get(field).map(Shape::Schema).ok_or_else(|| {
                        TypeError::NoSuchField {
                            path: format!("{}.{field}", path_of(operand_expr)),
                            declared: properties.keys().cloned().collect::<Vec<_>>().join(", "),
                        }
                    }),
                    None => Ok(map_value(node)),
                }
            }
            _ => Ok(Shape::Any),
        }
    }
}

/// The properties of an object node whose fields are all declared: not one
/// that keeps unknown fields or is a map.
fn closed_properties(node: &Value) -> Option<&serde_json::Map<String, Value>> {
    let open = node
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || node.get("additionalProperties").is_some();
    if open {
        return None;
    }
    match node.get("type").and_then(Value::as_str) {
        Some("object") | None => node.get("properties").and_then(Value::as_object),
        _ => None,
    }
}

/// The type a schema node declares.
fn schema_type(node: &Value) -> Option<Type> {
    if node.get("x-kubernetes-int-or-string").is_some() {
        return None;
    }
    match node.get("type").and_then(Value::as_str)? {
        "string" => Some(Type::String),
        "integer" => Some(Type::Int),
        "number" => Some(Type::Number),
        "boolean" => Some(Type::Bool),
        "array" => Some(Type::List),
        "object" => Some(Type::Map),
        _ => None,
    }
}

/// What one item of `range` is, as a comprehension's variable.
fn element(range: Shape<'_>) -> Shape<'_> {
    match range {
        Shape::Schema(node) => node.get("items").map_or(Shape::Any, Shape::Schema),
        _ => Shape::Any,
    }
}

/// What one value of a map node (`additionalProperties`) is.
fn map_value(node: &Value) -> Shape<'_> {
    node.get("additionalProperties")
        .filter(|a| a.is_object())
        .map_or(Shape::Any, Shape::Schema)
}

/// The dotted path an expression reads (`spec.ports`), for messages.
fn path_of(e: &IdedExpr) -> String {
    match &e.expr {
        Expr::Ident(name) => name.clone(),
        Expr::Select(select) => format!("{}.{}", path_of(&select.operand), select.field),
        Expr::Call(call) if call.func_name == "_[_]" => match call.args.as_slice() {
            [list, _] => format!("{}[…]", path_of(list)),
            _ => "…".into(),
        },
        _ => "…".into(),
    }
}

fn literal_type(literal: &LiteralValue) -> Type {
    match literal {
        LiteralValue::Boolean(_) => Type::Bool,
        LiteralValue::Bytes(_) => Type::Bytes,
        LiteralValue::Double(_) => Type::Number,
        LiteralValue::Int(_) | LiteralValue::UInt(_) => Type::Int,
        LiteralValue::Null => Type::Null,
        LiteralValue::String(_) => Type::String,
    }
}

/// The shape of a call's value, from its function and its arguments'.
fn call_shape<'s>(function: &str, args: &[Shape<'s>]) -> Shape<'s> {
    const BOOLEAN: [&str; 14] = [
        "_==_",
        "_!=_",
        "_<_",
        "_<=_",
        "_>_",
        "_>=_",
        "_&&_",
        "_||_",
        "!_",
        "@in",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
    ];
    const STRING: [&str; 7] = [
        "string",
        "sha256",
        "b64encode",
        "b64decode",
        "seeded_string",
        "lowerAscii",
        "upperAscii",
    ];
    const ARITHMETIC: [&str; 6] = ["_+_", "_-_", "_*_", "_/_", "_%_", "-_"];
    const KRO_STRING: [&str; 3] = ["random.seededString", "base64.encode", "json.marshal"];
    const KRO_BYTES: [&str; 3] = ["hash.fnv64a", "hash.sha256", "base64.decode"];
    let known = |t| Shape::Known(t);
    match function {
        f if BOOLEAN.contains(&f) => known(Type::Bool),
        f if STRING.contains(&f) || KRO_STRING.contains(&f) => known(Type::String),
        f if KRO_BYTES.contains(&f) => known(Type::Bytes),
        "random.seededInt" => known(Type::Int),
        "size" | "int" | "uint" => known(Type::Int),
        "double" | "quantity" => known(Type::Number),
        "bool" => known(Type::Bool),
        "_[_]" => match args {
            [Shape::Schema(node), _] => match schema_type(node) {
                Some(Type::List) => element(args[0]),
                Some(Type::Map) => map_value(node),
                _ => Shape::Any,
            },
            _ => Shape::Any,
        },
        "_?_:_" => match args {
            [_, a, b] => same(&[*a, *b]),
            _ => Shape::Any,
        },
        f if ARITHMETIC.contains(&f) => same(args),
        _ => Shape::Any,
    }
}

/// The type all of `shapes` share, if they share one.
fn same<'s>(shapes: &[Shape<'s>]) -> Shape<'s> {
    let types: Vec<Option<Type>> = shapes.iter().map(|s| s.ty()).collect();
    match types.first() {
        Some(Some(first)) if types.iter().all(|t| *t == Some(*first)) => Shape::Known(*first),
        _ => Shape::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "replicas": {"type": "integer"},
                "ports": {"type": "array", "items": {
                    "type": "object", "properties": {"port": {"type": "integer"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }
        })
    }

    fn infer_source(source: &str) -> Result<Option<Type>, TypeError> {
        let program = cel::Program::compile(source).unwrap();
        infer(program.expression(), &schema())
    }

    #[test]
    fn the_type_is_known_from_the_schema_literals_and_functions() {
        for (source, expected) in [
            ("spec.replicas", Some(Type::Int)),
            ("schema.spec.name", Some(Type::String)),
            ("spec.ports[0].port * 2", Some(Type::Int)),
            ("spec.labels['app']", Some(Type::String)),
            ("size(spec.ports) > 1", Some(Type::Bool)),
            ("has(spec.name)", Some(Type::Bool)),
            ("spec.ports.all(p, p.port > 80)", Some(Type::Bool)),
            ("spec.ports.map(p, p.port)", Some(Type::List)),
            ("quantity('1Gi')", Some(Type::Number)),
            ("spec.replicas > 1 ? 'many' : 'one'", Some(Type::String)),
            ("deployment.status.replicas", None),
            ("spec.extra.anything.deeper", None),
            ("spec.replicas > 1 ? 'many' : 1", None),
            ("base64.encode(hash.sha256(spec.name))", Some(Type::String)),
            ("hash.fnv64a(spec.name)", Some(Type::Bytes)),
            (
                "random.seededString(10, schema.metadata.uid)",
                Some(Type::String),
            ),
            ("random.seededInt(0, 10, spec.name)", Some(Type::Int)),
            ("json.unmarshal(spec.name).port", None),
        ] {
            assert_eq!(infer_source(source), Ok(expected), "{source}");
        }
    }

    #[test]
    fn a_field_the_schema_does_not_declare_is_named() {
        let error = infer_source("spec.replicaz + 1").unwrap_err();
        assert_eq!(
            error.to_string(),
            "reads spec.replicaz, which the kind's schema does not declare \
             (it declares: extra, labels, name, ports, replicas)"
        );
        let error = infer_source("spec.ports.exists(p, p.prot == 80)").unwrap_err();
        assert!(error.to_string().starts_with("reads p.prot,"), "{error}");
        let error = infer_source("schema.spec.nmae").unwrap_err();
        assert!(
            error.to_string().starts_with("reads schema.spec.nmae,"),
            "{error}"
        );
        assert!(infer_source("has(spec.nmae)").is_err());
        assert!(infer_source("hash.sha256(spec.nmae)").is_err());
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused_where_it_is_known() {
        let check_source = |source: &str, wanted| {
            let program = cel::Program::compile(source).unwrap();
            check(program.expression(), &schema(), wanted).map_err(|e| e.to_string())
        };
        assert_eq!(
            check_source("spec.name", Expectation::Field("integer")),
            Err("gives a string, where a value of type integer is wanted".into())
        );
        assert_eq!(
            check_source("size(spec.ports)", Expectation::Boolean),
            Err("gives an integer, where a boolean is wanted".into())
        );
        assert_eq!(
            check_source("spec.replicas", Expectation::Field("string")),
            Ok(())
        );
        assert_eq!(
            check_source("self.status.ready", Expectation::Boolean),
            Ok(())
        );
        assert_eq!(
            check_source("hash.sha256(spec.name)", Expectation::Field("string")),
            Err("gives bytes, where a value of type string is wanted".into())
        );
    }

    #[test]
    fn a_status_field_takes_the_types_it_can_be_written_as() {
        assert!(Type::Int.fills("string"));
        assert!(Type::Int.fills("number"));
        assert!(!Type::Number.fills("integer"));
        assert!(!Type::String.fills("integer"));
        assert!(!Type::List.fills("string"));
        assert!(Type::Map.fills("object"));
    }
}
