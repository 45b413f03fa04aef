//! The kind file's CEL: the `expression`s of status fields and readiness
//! rules and the children's `readyWhen`, compiled when the kind is loaded
//! (an error names the kind file's field) and evaluated over the resource
//! and the live state of the objects it applied.
//!
//! A definition is hostile input like any other: an expression is at most
//! [`MAX_SOURCE`] characters, the parser refuses nesting past its own
//! recursion limit, comprehensions (`all`, `exists`, `filter`, `map`) do
//! not nest (a tenant decides how many children there are: a loop in a loop
//! over ten thousand would be a hundred million steps), and a value is
//! converted back to JSON within [`MAX_VALUE_NODES`] nodes and
//! [`MAX_VALUE_BYTES`] of text (a list of lists shares its parts in CEL,
//! and would multiply them in JSON).
//!
//! What an expression may cost is bounded twice, in the API server's own
//! units ([`super::cost`]): when the kind loads, its estimate over the
//! bounds of the kind's schema must be within [`STATIC_LIMIT`] (else it is
//! refused, naming the field, the estimate and what would bound it); and
//! before each evaluation, its estimate over the values it reads must be
//! within the [`Budget`] (else it does not run). Variables are read
//! through a resolver that stops the evaluation once its look at the
//! resource is cancelled ([`super::evaluation`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Program};
use serde_json::Value;

use super::cost::{self, Bound, STATIC_LIMIT, thousands};
use super::evaluation::{Budget, Look, Refusal};
use super::file::KindSpec;
use super::kro_library;
use super::typing::{self, Expectation};
use crate::kind::CommonStatus;

/// The longest expression, in characters.
pub const MAX_SOURCE: usize = 2048;
/// How deep comprehensions may nest: one loop, never a loop in a loop.
pub const MAX_NESTED_LOOPS: usize = 1;
/// The most JSON nodes (values, list items, map entries) a value may
/// convert to.
pub const MAX_VALUE_NODES: usize = 100_000;
/// The most bytes of text a value may convert to: 1 MiB (no object the
/// API server stores holds more than 1.5 MiB).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// How deep an expression's tree may be (a macro counts several levels).
pub const MAX_DEPTH: usize = 64;
/// The stack of the thread that parses one expression: enough for the
/// parser's recursion over [`MAX_SOURCE`] characters of nesting.
const COMPILE_STACK: usize = 256 * 1024 * 1024;
/// The names every expression may read besides the children: the
/// resource's `spec` (defaults filled in) and `metadata`, `schema` (the
/// whole resource, as kro names it) and, in a `readyWhen`, `self`.
pub const RESOURCE_NAMES: [&str; 3] = ["spec", "metadata", "schema"];
/// The child itself, in its `readyWhen`.
pub const SELF: &str = "self";

/// Why an expression is refused when the kind is loaded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExpressionError {
    /// Too long.
    #[error("longer than {MAX_SOURCE} characters")]
    TooLong,
    /// Not CEL (or nested past the parser's limit).
    #[error("not CEL: {0}")]
    Parse(String),
    /// Its tree is too deep.
    #[error("nests more than {MAX_DEPTH} levels deep")]
    TooDeep,
    /// Comprehensions nested too deep.
    #[error("comprehensions (all, exists, filter, map) may not nest")]
    TooNested,
    /// A name that is neither the resource's nor a child's.
    #[error("reads {name:?}, which is not one of {known}")]
    Unknown {
        /// The name.
        name: String,
        /// What it may read.
        known: String,
    },
}

/// One compiled expression.
#[derive(Debug)]
pub struct Expression {
    source: String,
    program: Program,
    /// The names it reads (children, `spec`, ...).
    reads: BTreeSet<String>,
}

impl PartialEq for Expression {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Expression {
    /// Compiles `source`, which may read `known` names only. The parser
    /// recurses as deep as the source nests: it runs on a thread of its
    /// own with a stack large enough for the longest source, and a tree
    /// deeper than [`MAX_DEPTH`] is refused, so that evaluating it (on any
    /// thread) recurses little.
    pub fn compile(source: &str, known: &BTreeSet<String>) -> Result<Self, ExpressionError> {
        if source.chars().count() > MAX_SOURCE {
            return Err(ExpressionError::TooLong);
        }
        let owned = source.to_string();
        let (program, reads) = std::thread::Builder::new()
            .name("cel-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || parse(&owned))
            .map_err(|e| ExpressionError::Parse(format!("cannot start the parser: {e}")))?
            .join()
            .map_err(|_| ExpressionError::Parse("the parser failed".into()))??;
        if let Some(name) = reads.iter().find(|n| !known.contains(*n)) {
            return Err(ExpressionError::Unknown {
                name: name.clone(),
                known: known.iter().cloned().collect::<Vec<_>>().join(", "),
            });
        }
        Ok(Self {
            source: source.to_string(),
            program,
            reads,
        })
    }

    /// Its estimated cost with the names it reads within `variables`.
    pub fn estimate(&self, variables: &BTreeMap<&str, Bound>) -> cost::Estimate {
        cost::estimate(self.tree(), variables)
    }

    /// Its estimated cost over the values it would read from `variables`
    /// now.
    fn estimate_over(&self, variables: &BTreeMap<&str, Value>) -> u64 {
        let bounds: BTreeMap<&str, Bound> = (self.reads.iter())
            .filter_map(|name| {
                Some((
                    name.as_str(),
                    Bound::of_value(variables.get(name.as_str())?),
                ))
            })
            .collect();
        self.estimate(&bounds).cost
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its syntax tree.
    pub fn tree(&self) -> &IdedExpr {
        self.program.expression()
    }

    /// The names it reads.
    pub fn reads(&self) -> impl Iterator<Item = &str> {
        self.reads.iter().map(String::as_str)
    }

    /// Its value with `variables` bound (each a JSON value), as JSON,
    /// within the limit of one evaluation (one over it fails, saying so).
    pub fn eval(&self, variables: &BTreeMap<&str, Value>) -> Result<Value, EvalError> {
        self.eval_within(variables, &mut Budget::one_call())
            .unwrap_or_else(|refused| Err(EvalError::Failed(refused.to_string())))
    }

    /// Its value with `variables` bound, when its estimated cost over
    /// them fits in `budget` (which it then spends); else why it did not
    /// run. It stops (refused) once the budget's look is cancelled.
    pub fn eval_within(
        &self,
        variables: &BTreeMap<&str, Value>,
        budget: &mut Budget,
    ) -> Result<Result<Value, EvalError>, Refusal> {
        if budget.look().is_cancelled() {
            return Err(Refusal::Stopped);
        }
        budget.spend(self.estimate_over(variables))?;
        let resolver = Variables {
            values: (self.reads.iter())
                .filter_map(|name| {
                    let value = to_cel(variables.get(name.as_str())?);
                    Some((name.clone(), Box::<dyn Val>::try_from(value).ok()?))
                })
                .collect(),
            look: budget.look().clone(),
        };
        let mut context = Context::with_env(kro_library::env());
        add_functions(&mut context);
        context.set_variable_resolver(&resolver);
        let executed = self.program.execute(&context);
        if budget.look().is_cancelled() {
            return Err(Refusal::Stopped);
        }
        let value = match executed {
            Ok(value) => value,
            Err(
                e @ (cel::ExecutionError::NoSuchKey(_) | cel::ExecutionError::IndexOutOfBounds(_)),
            ) => {
                return Ok(Err(EvalError::Missing(e.to_string())));
            }
            Err(other) => return Ok(Err(EvalError::Failed(other.to_string()))),
        };
        Ok(to_json(&value, &mut Room::new()))
    }
}

/// The variables of one evaluation, read through the resolver: none once
/// its look is cancelled, which stops the evaluation at its next read.
struct Variables {
    values: BTreeMap<String, Box<dyn Val>>,
    look: Look,
}

impl VariableResolver for Variables {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        if self.look.is_cancelled() {
            return None;
        }
        let value = self.values.get(variable)?;
        Some(CowVal::Borrowed(value.as_ref()))
    }
}

/// The functions templates have too (`crate::functions`), under the same
/// names: `b64encode(s)`, `b64decode(s)`, `sha256(s)`, `from_json(s)`,
/// `seeded_string(seed, length)`, `quantity(s)`. kro's, under kro's names,
/// are [`kro_library::FUNCTIONS`].
pub const FUNCTIONS: [&str; 6] = [
    "b64encode",
    "b64decode",
    "sha256",
    "from_json",
    "seeded_string",
    "quantity",
];

/// Registers [`FUNCTIONS`] and kro's ([`kro_library`]) on `context`.
fn add_functions(context: &mut Context) {
    add_kro_functions(context);
    use crate::functions as f;
    use std::sync::Arc;
    type Answer = Result<cel::Value, cel::ExecutionError>;
    let failed = |name: &str, e: f::FunctionError| cel::ExecutionError::function_error(name, e);
    // The names are not CEL's own: registering them cannot conflict.
    let _ = context.add_function("b64encode", |s: Arc<String>| f::b64encode(&s));
    let _ = context.add_function("b64decode", move |s: Arc<String>| -> Answer {
        f::b64decode(&s)
            .map(cel::Value::from)
            .map_err(|e| failed("b64decode", e))
    });
    let _ = context.add_function("sha256", |s: Arc<String>| f::sha256(&s));
    let _ = context.add_function("from_json", move |s: Arc<String>| -> Answer {
        f::from_json(&s)
            .map(|v| to_cel(&v))
            .map_err(|e| failed("from_json", e))
    });
    let _ = context.add_function(
        "seeded_string",
        move |seed: Arc<String>, length: i64| -> Answer {
            let length = u64::try_from(length).unwrap_or(0);
            f::seeded_string(&seed, length)
                .map(cel::Value::from)
                .map_err(|e| failed("seeded_string", e))
        },
    );
    let _ = context.add_function("quantity", move |s: Arc<String>| -> Answer {
        f::quantity(&s)
            .map(cel::Value::Float)
            .map_err(|e| failed("quantity", e))
    });
}

/// Registers kro's functions ([`kro_library::FUNCTIONS`], with
/// `crate::functions::kro`'s values) on `context`; the encoders
/// (`base64.*`) are the environment's ([`kro_library::env`]).
fn add_kro_functions(context: &mut Context) {
    use crate::functions::{FunctionError, kro};
    use std::sync::Arc;
    type Answer = Result<cel::Value, cel::ExecutionError>;
    let failed = |name: &str, e: FunctionError| cel::ExecutionError::function_error(name, e);
    let bytes = |b: Vec<u8>| cel::Value::Bytes(Arc::new(b));
    // None of these names is CEL's own: registering them cannot conflict.
    let _ = context.add_function(
        "random.seededString",
        move |length: i64, seed: Arc<String>| -> Answer {
            kro::seeded_string(length, &seed)
                .map(cel::Value::from)
                .map_err(|e| failed("random.seededString", e))
        },
    );
    let _ = context.add_function(
        "random.seededInt",
        move |min: i64, max: i64, seed: Arc<String>| -> Answer {
            kro::seeded_int(min, max, &seed)
                .map(cel::Value::Int)
                .map_err(|e| failed("random.seededInt", e))
        },
    );
    let _ = context.add_function("hash.fnv64a", move |s: Arc<String>| {
        bytes(kro::fnv64a(&s).to_vec())
    });
    let _ = context.add_function("hash.sha256", move |s: Arc<String>| bytes(kro::sha256(&s)));
    let _ = context.add_function("json.unmarshal", move |s: Arc<String>| -> Answer {
        kro::json_unmarshal(&s)
            .map(|v| to_cel(&v))
            .map_err(|e| failed("json.unmarshal", e))
    });
    let _ = context.add_function("json.marshal", move |v: cel::Value| -> Answer {
        let json = to_json(&v, &mut Room::new())
            .map_err(|e| cel::ExecutionError::function_error("json.marshal", e))?;
        Ok(cel::Value::from(kro::json_marshal(&json)))
    });
}

/// Why an expression gave no value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// It reads a field or an index that is not there (yet): a status
    /// field a controller has not written, an empty list.
    #[error("{0}")]
    Missing(String),
    /// Anything else: a type mismatch, a division by zero.
    #[error("{0}")]
    Failed(String),
}

/// Every expression of a kind file, compiled: by position in `status` and
/// `readiness` (`None` where the entry reads a path instead), and by child.
#[derive(Debug, Default)]
pub struct Compiled {
    /// `spec.status[i].expression`.
    pub status: Vec<Option<Expression>>,
    /// `spec.readiness[i].expression`.
    pub readiness: Vec<Option<Expression>>,
    /// `spec.children.<name>.readyWhen`.
    pub ready_when: BTreeMap<String, Expression>,
}

impl Compiled {
    /// True when the kind file has no expression.
    pub fn is_empty(&self) -> bool {
        self.status.iter().all(Option::is_none)
            && self.readiness.iter().all(Option::is_none)
            && self.ready_when.is_empty()
    }

    /// Compiles the expressions of `spec` and checks them against its
    /// schema and the fields they fill (`typing`); an error is the field
    /// and why.
    pub fn of(spec: &KindSpec) -> Result<Self, (String, String)> {
        let mut known: BTreeSet<String> = RESOURCE_NAMES.iter().map(|n| n.to_string()).collect();
        known.extend(spec.children.keys().cloned());
        known.extend(spec.references.keys().cloned());
        let mut bounds = load_bounds(spec);
        let compile = |source: &Option<String>,
                       field: String,
                       known: &BTreeSet<String>,
                       wanted: Expectation,
                       (bounds, times): (&BTreeMap<&str, Bound>, u64)|
         -> Result<Option<Expression>, (String, String)> {
            let Some(source) = source.as_deref() else {
                return Ok(None);
            };
            let expression =
                Expression::compile(source, known).map_err(|e| (field.clone(), e.to_string()))?;
            typing::check(expression.tree(), &spec.schema, wanted)
                .map_err(|e| (field.clone(), e.to_string()))?;
            let estimate = expression.estimate(bounds).times(times);
            if estimate.cost > STATIC_LIMIT {
                return Err((field, too_costly(&estimate, times)));
            }
            Ok(Some(expression))
        };
        let once = (&bounds, 1);
        let status = (spec.status.iter().enumerate())
            .map(|(i, s)| {
                let field = format!("spec.status[{i}].expression");
                compile(
                    &s.expression,
                    field,
                    &known,
                    Expectation::Field(&s.type_),
                    once,
                )
            })
            .collect::<Result<_, _>>()?;
        let readiness = (spec.readiness.iter().enumerate())
            .map(|(i, r)| {
                let field = format!("spec.readiness[{i}].expression");
                compile(&r.expression, field, &known, Expectation::Boolean, once)
            })
            .collect::<Result<_, _>>()?;
        let mut with_self = known.clone();
        with_self.insert(SELF.to_string());
        // `self` is one object, of a list as many times as it has.
        bounds.insert(SELF, Bound::unknown());
        let mut ready_when = BTreeMap::new();
        for (name, child) in &spec.children {
            let field = format!("spec.children.{name}.readyWhen");
            let times = if child.name.is_none() {
                CommonStatus::MAX_OBJECTS as u64
            } else {
                1
            };
            let source = &child.ready_when;
            if let Some(e) = compile(
                source,
                field,
                &with_self,
                Expectation::Boolean,
                (&bounds, times),
            )? {
                ready_when.insert(name.clone(), e);
            }
        }
        Ok(Self {
            status,
            readiness,
            ready_when,
        })
    }
}

/// What the expressions of `spec` read, as bounded when the kind loads:
/// `spec` by the kind's schema, `metadata` by Kubernetes' own limits, a
/// child or a reference (no schema here) as [`Bound::unknown`], a child
/// without a name as the most objects a resource may own.
fn load_bounds(spec: &KindSpec) -> BTreeMap<&str, Bound> {
    let own = Bound::of_schema(&spec.schema, "spec");
    let mut bounds = BTreeMap::from([
        ("spec", own.clone()),
        ("metadata", Bound::metadata()),
        ("schema", Bound::resource(own)),
    ]);
    for (name, child) in &spec.children {
        let bound = match child.name {
            Some(_) => Bound::unknown(),
            None => Bound::list(CommonStatus::MAX_OBJECTS as u64, Bound::unknown()),
        };
        bounds.insert(name.as_str(), bound);
    }
    for name in spec.references.keys() {
        bounds.insert(name.as_str(), Bound::unknown());
    }
    bounds
}

/// Why an expression estimated at `estimate` (run `times` times for each
/// look) is refused, and what would make it fit.
fn too_costly(estimate: &cost::Estimate, times: u64) -> String {
    let each = if times > 1 {
        format!(
            " ({} for each of up to {} objects)",
            thousands(estimate.cost / times),
            thousands(times)
        )
    } else {
        String::new()
    };
    format!(
        "its estimated cost, {}{each}, is over the limit of {} for one expression (the API server's for a CRD's validation rule): {}",
        thousands(estimate.cost),
        thousands(STATIC_LIMIT),
        estimate.advice()
    )
}

/// Parses `source` and checks its shape: its depth, its loops; returns
/// the program and the names it reads.
fn parse(source: &str) -> Result<(Program, BTreeSet<String>), ExpressionError> {
    let program = Program::compile(source).map_err(|e| {
        ExpressionError::Parse(e.to_string().lines().next().unwrap_or_default().into())
    })?;
    if depth(program.expression()) > MAX_DEPTH {
        return Err(ExpressionError::TooDeep);
    }
    if loop_depth(program.expression()) > MAX_NESTED_LOOPS {
        return Err(ExpressionError::TooNested);
    }
    let mut reads = BTreeSet::new();
    free_names(program.expression(), &mut Vec::new(), &mut reads);
    Ok((program, reads))
}

/// How deep the tree of `e` is.
fn depth(e: &IdedExpr) -> usize {
    1 + parts(e)
        .into_iter()
        .map(|(p, _)| depth(p))
        .max()
        .unwrap_or(0)
}

/// What a value converted back to JSON may still take: nodes, and bytes
/// of text (a list of one string a hundred times shares it in CEL, and
/// would copy it in JSON).
struct Room {
    nodes: usize,
    bytes: usize,
}

impl Room {
    fn new() -> Self {
        Self {
            nodes: MAX_VALUE_NODES,
            bytes: MAX_VALUE_BYTES,
        }
    }

    /// Takes a node of `bytes` bytes of text.
    fn take(&mut self, bytes: usize) -> Result<(), EvalError> {
        self.nodes = self.nodes.checked_sub(1).ok_or_else(|| {
            EvalError::Failed(format!("the value has more than {MAX_VALUE_NODES} parts"))
        })?;
        self.bytes = self.bytes.checked_sub(bytes).ok_or_else(|| {
            EvalError::Failed(format!(
                "the value holds more than {} KiB of text",
                MAX_VALUE_BYTES >> 10
            ))
        })?;
        Ok(())
    }
}

/// `value` as JSON, within `room`.
fn to_json(value: &cel::Value, room: &mut Room) -> Result<Value, EvalError> {
    let text = match value {
        cel::Value::String(s) => s.len(),
        cel::Value::Bytes(b) => b.len().saturating_mul(2),
        _ => 0,
    };
    room.take(text)?;
    Ok(match value {
        cel::Value::List(items) => Value::Array(
            items
                .iter()
                .map(|v| to_json(v, room))
                .collect::<Result<_, _>>()?,
        ),
        cel::Value::Map(map) => {
            let mut object = serde_json::Map::new();
            for (k, v) in map.map.iter() {
                let key = k.to_string();
                room.take(key.len())?;
                object.insert(key, to_json(v, room)?);
            }
            Value::Object(object)
        }
        scalar => scalar
            .json()
            .map_err(|e| EvalError::Failed(e.to_string()))?,
    })
}

/// A JSON value as CEL's: every whole number that fits is an `int`
/// (serde would make positive ones `uint`, which CEL does not compare with
/// an `int` literal).
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::from(s.as_str()),
        Value::Array(items) => {
            cel::Value::List(std::sync::Arc::new(items.iter().map(to_cel).collect()))
        }
        Value::Object(map) => {
            let map: HashMap<String, cel::Value> =
                map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            cel::Value::from(map)
        }
    }
}

/// The sub-expressions of `e`, with the names a comprehension binds in
/// them (its iteration variables and accumulator).
fn parts(e: &IdedExpr) -> Vec<(&IdedExpr, Vec<&str>)> {
    match &e.expr {
        Expr::Call(call) => call
            .target
            .iter()
            .map(|t| t.as_ref())
            .chain(call.args.iter())
            .map(|p| (p, Vec::new()))
            .collect(),
        Expr::Comprehension(c) => {
            let mut bound = vec![c.iter_var.as_str(), c.accu_var.as_str()];
            bound.extend(c.iter_var2.as_deref());
            vec![
                (&c.iter_range, Vec::new()),
                (&c.accu_init, Vec::new()),
                (&c.loop_cond, bound.clone()),
                (&c.loop_step, bound.clone()),
                (&c.result, bound),
            ]
        }
        Expr::List(list) => list.elements.iter().map(|p| (p, Vec::new())).collect(),
        Expr::Map(map) => entries(&map.entries),
        Expr::Struct(st) => entries(&st.entries),
        Expr::Select(select) => vec![(select.operand.as_ref(), Vec::new())],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

fn entries(entries: &[cel::common::ast::IdedEntryExpr]) -> Vec<(&IdedExpr, Vec<&str>)> {
    entries
        .iter()
        .flat_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => vec![(&m.key, Vec::new()), (&m.value, Vec::new())],
            EntryExpr::StructField(f) => vec![(&f.value, Vec::new())],
        })
        .collect()
}

/// How deep comprehensions nest in `e` (the loop body only: the range of a
/// comprehension is evaluated once).
fn loop_depth(e: &IdedExpr) -> usize {
    let own = usize::from(matches!(e.expr, Expr::Comprehension(_)));
    let inner = match &e.expr {
        Expr::Comprehension(c) => [&c.loop_step, &c.loop_cond, &c.result]
            .into_iter()
            .map(loop_depth)
            .max()
            .unwrap_or(0)
            .max(loop_depth(&c.iter_range).saturating_sub(own))
            .max(loop_depth(&c.accu_init).saturating_sub(own)),
        _ => parts(e)
            .into_iter()
            .map(|(p, _)| loop_depth(p))
            .max()
            .unwrap_or(0),
    };
    own + inner
}

/// The names `e` reads that no comprehension around them binds.
fn free_names<'a>(e: &'a IdedExpr, bound: &mut Vec<&'a str>, out: &mut BTreeSet<String>) {
    if let Expr::Ident(name) = &e.expr
        && !bound.contains(&name.as_str())
    {
        out.insert(name.clone());
    }
    // `hash` in `hash.sha256(s)` names kro's function, not a value.
    let namespace = match &e.expr {
        Expr::Call(call) if kro_library::namespaced(call).is_some() => call.target.as_deref(),
        _ => None,
    };
    for (part, binds) in parts(e) {
        if namespace.is_some_and(|n| std::ptr::eq(n, part)) {
            continue;
        }
        let before = bound.len();
        bound.extend(binds);
        free_names(part, bound, out);
        bound.truncate(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn eval(source: &str, variables: &[(&str, Value)]) -> Result<Value, String> {
        let names: Vec<&str> = variables.iter().map(|(n, _)| *n).collect();
        let expression = Expression::compile(source, &known(&names)).map_err(|e| e.to_string())?;
        expression
            .eval(&variables.iter().cloned().collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn reads_children_lists_indexes_and_arithmetic() {
        let web = json!({"status": {"availableReplicas": 2, "conditions": [
            {"type": "Available", "status": "True"},
            {"type": "Progressing", "status": "True"},
        ]}});
        let spec = json!({"replicas": 2});
        let vars = [("web", web), ("spec", spec)];
        assert_eq!(
            eval("web.status.availableReplicas >= spec.replicas", &vars),
            Ok(json!(true))
        );
        assert_eq!(
            eval("web.status.availableReplicas * 10 + 1", &vars),
            Ok(json!(21))
        );
        assert_eq!(
            eval("web.status.conditions[1].type", &vars),
            Ok(json!("Progressing"))
        );
        assert_eq!(
            eval(
                "web.status.conditions.filter(c, c.status == 'True').size()",
                &vars
            ),
            Ok(json!(2))
        );
        assert_eq!(
            eval("web.status.conditions", &vars)
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            eval(
                "has(web.status.readyReplicas) ? web.status.readyReplicas : 0",
                &vars
            ),
            Ok(json!(0))
        );
    }

    #[test]
    fn aggregates_over_a_collection() {
        let workers = json!([
            {"metadata": {"name": "a"}, "status": {"readyReplicas": 1}},
            {"metadata": {"name": "b"}, "status": {}},
        ]);
        let vars = [("workers", workers)];
        assert_eq!(
            eval(
                "workers.filter(w, has(w.status.readyReplicas) && w.status.readyReplicas > 0).size()",
                &vars
            ),
            Ok(json!(1))
        );
        assert_eq!(
            eval("workers.all(w, has(w.status.readyReplicas))", &vars),
            Ok(json!(false))
        );
        assert_eq!(
            eval("workers.exists(w, w.metadata.name == 'b')", &vars),
            Ok(json!(true))
        );
        assert_eq!(
            eval("workers.map(w, w.metadata.name)", &vars),
            Ok(json!(["a", "b"]))
        );
    }

    #[test]
    fn the_templates_functions_are_cel_functions_too() {
        let vars = [
            ("metadata", json!({"uid": "u-1"})),
            (
                "spec",
                json!({"memory": "1Gi", "config": "{\"port\": 8080}"}),
            ),
        ];
        assert_eq!(
            eval("b64encode(\"user:pw\")", &vars),
            Ok(json!("dXNlcjpwdw=="))
        );
        assert_eq!(
            eval("b64decode(\"dXNlcjpwdw==\")", &vars),
            Ok(json!("user:pw"))
        );
        assert_eq!(eval("sha256(\"abc\").size()", &vars), Ok(json!(64)));
        assert_eq!(eval("from_json(spec.config).port", &vars), Ok(json!(8080)));
        assert_eq!(
            eval("quantity(spec.memory) / 2.0", &vars),
            Ok(json!(536_870_912.0))
        );
        assert_eq!(
            eval("seeded_string(metadata.uid, 12)", &vars),
            Ok(json!(crate::functions::seeded_string("u-1", 12).unwrap()))
        );
        let names = known(&["spec"]);
        let bad = Expression::compile("b64decode(\"***\")", &names).unwrap();
        let err = bad.eval(&BTreeMap::new()).unwrap_err();
        assert!(
            matches!(&err, EvalError::Failed(m) if m.contains("b64decode")),
            "{err:?}"
        );
    }

    #[test]
    fn a_missing_field_is_told_from_a_failure() {
        let names = known(&["web"]);
        let missing = |source: &str, web: Value| {
            let e = Expression::compile(source, &names).unwrap();
            e.eval(&BTreeMap::from([("web", web)]))
        };
        let lb = "web.status.loadBalancer.ingress[0].hostname";
        let no_key = missing(lb, json!({"status": {}})).unwrap_err();
        assert!(
            matches!(&no_key, EvalError::Missing(m) if m.contains("loadBalancer")),
            "{no_key:?}"
        );
        let empty = json!({"status": {"loadBalancer": {"ingress": []}}});
        assert!(matches!(missing(lb, empty), Err(EvalError::Missing(_))));
        let failed = missing(
            "web.status.replicas / 0",
            json!({"status": {"replicas": 1}}),
        );
        assert!(matches!(failed, Err(EvalError::Failed(_))), "{failed:?}");
    }

    #[test]
    fn refused_when_loaded() {
        let names = known(&["web", "spec"]);
        let unknown = Expression::compile("db.status.ready", &names).unwrap_err();
        assert!(matches!(&unknown, ExpressionError::Unknown { name, .. } if name == "db"));
        assert!(unknown.to_string().contains("spec, web"), "{unknown}");
        assert!(matches!(
            Expression::compile("web.status.(", &names),
            Err(ExpressionError::Parse(_))
        ));
        let long = format!("{} == 1", "1 + ".repeat(MAX_SOURCE));
        assert_eq!(
            Expression::compile(&long, &names),
            Err(ExpressionError::TooLong)
        );
        let deep = format!("{}1{}", "(".repeat(1000), ")".repeat(1000));
        assert!(matches!(
            Expression::compile(&deep, &names),
            Err(ExpressionError::Parse(_) | ExpressionError::TooDeep)
        ));
        let deep = format!("{}1{}", "[".repeat(80), "]".repeat(80));
        assert_eq!(
            Expression::compile(&deep, &names),
            Err(ExpressionError::TooDeep)
        );
        let nested = "[1].all(a, [2].exists(b, a < b))";
        assert_eq!(
            Expression::compile(nested, &names),
            Err(ExpressionError::TooNested)
        );
        let in_a_row = "[1, 2].filter(a, a > 1).all(b, b > 0)";
        assert!(
            Expression::compile(in_a_row, &names).is_ok(),
            "one after the other"
        );
    }

    #[test]
    fn a_value_that_multiplies_its_parts_is_refused() {
        let list: Vec<Value> = (0..400).map(|i| json!({"i": i})).collect();
        let e = Expression::compile("web.map(w, web)", &known(&["web"])).unwrap();
        let refused = e.eval(&BTreeMap::from([("web", Value::Array(list))]));
        assert!(
            matches!(&refused, Err(EvalError::Failed(m)) if m.contains("more than 100000 parts")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_value_that_copies_a_string_past_a_mebibyte_is_refused() {
        let e = Expression::compile("spec.items.map(i, spec.big)", &known(&["spec"])).unwrap();
        let spec = json!({"items": vec![1; 30], "big": "y".repeat(50_000)});
        let refused = e.eval(&BTreeMap::from([("spec", spec)]));
        assert!(
            matches!(&refused, Err(EvalError::Failed(m)) if m.contains("more than 1024 KiB of text")),
            "{refused:?}"
        );
    }

    #[test]
    fn comprehension_variables_are_not_names_to_declare() {
        let names = known(&["web"]);
        let e = Expression::compile("web.items.exists(i, i.ok)", &names).unwrap();
        assert_eq!(e.reads().collect::<Vec<_>>(), ["web"]);
    }

    /// The parser's and the evaluator's recursion stay within a small
    /// stack for the longest expression allowed.
    #[test]
    fn the_longest_expressions_fit_a_small_stack() {
        let worst = [
            "!".repeat(MAX_SOURCE - 4) + "true",
            "-".repeat(MAX_SOURCE - 1) + "1",
            "1".to_string() + &" + 1".repeat((MAX_SOURCE - 1) / 4),
            "a".to_string() + &".b".repeat((MAX_SOURCE - 1) / 2),
            "[".repeat(MAX_SOURCE / 2) + &"]".repeat(MAX_SOURCE / 2),
        ];
        let handle = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                for source in worst {
                    if let Ok(e) = Expression::compile(&source, &known(&["a"])) {
                        let _ = e.eval(&BTreeMap::from([("a", json!({}))]));
                    }
                }
            })
            .unwrap();
        handle.join().expect("no stack overflow");
    }

    #[test]
    fn an_evaluation_over_the_limit_of_one_is_not_run() {
        let names = known(&["spec"]);
        let e = Expression::compile(
            "spec.items.filter(i, (i + spec.big).size() > 0).size()",
            &names,
        )
        .unwrap();
        let spec = json!({"items": vec!["x"; 300], "big": "y".repeat(40_000)});
        let refused = e.eval(&BTreeMap::from([("spec", spec)])).unwrap_err();
        assert!(
            matches!(&refused, EvalError::Failed(m) if m.contains("over the limit of 1,000,000 for one evaluation")),
            "{refused:?}"
        );
        let mut budget = Budget::per_look(Look::default());
        let spec = json!({"items": vec!["x"; 300], "big": "y"});
        let ran = e.eval_within(&BTreeMap::from([("spec", spec)]), &mut budget);
        assert_eq!(ran, Ok(Ok(json!(300))));
    }

    /// A look cancelled (past its deadline) stops the evaluation at its
    /// next read of a variable, long before its end.
    #[test]
    fn a_cancelled_look_stops_its_evaluation() {
        let names = known(&["xs", "k"]);
        let e = Expression::compile("xs.filter(x, x == k).size()", &names).unwrap();
        let xs = Value::Array((0..50_000).map(Value::from).collect());
        let variables = BTreeMap::from([("xs", xs), ("k", json!(3))]);
        let started = std::time::Instant::now();
        let whole = e.eval_within(&variables, &mut Budget::per_look(Look::default()));
        let whole_took = started.elapsed();
        assert_eq!(whole, Ok(Ok(json!(1))));
        let look = Look::default();
        let mut budget = Budget::per_look(look.clone());
        let stop = std::thread::spawn(move || {
            std::thread::sleep(whole_took / 10);
            look.cancel();
        });
        let started = std::time::Instant::now();
        let stopped = e.eval_within(&variables, &mut budget);
        let stopped_took = started.elapsed();
        stop.join().unwrap();
        assert_eq!(stopped, Err(Refusal::Stopped));
        assert!(
            stopped_took < whole_took / 2,
            "{stopped_took:?} of {whole_took:?}"
        );
    }
}
