//! What a kind file's CEL may cost, in the API server's own units
//! (cel-go's cost model, as Kubernetes bounds a CRD's validation rules):
//! reading a name or a field costs 1, a comparison or a string joined
//! costs a tenth of the characters it goes over, a list built costs 10,
//! and a loop (`all`, `exists`, `filter`, `map`) costs its body's cost
//! times the items it goes over. How many items, and how long a string,
//! comes from a [`Bound`]: the kind's schema when the kind loads (an
//! expression whose estimate is over [`STATIC_LIMIT`] is refused then,
//! naming what would bound it), the values themselves before each
//! evaluation (one over [`PER_CALL_LIMIT`] is not run).
//!
//! The estimate is a ceiling, not a count: a condition costs its dearer
//! branch, a loop every item even when it stops early.

pub mod bound;

use std::collections::{BTreeMap, BTreeSet};

use cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, operators,
};

pub use bound::{Bound, Hint, MAX_REQUEST};

/// The most one expression may be estimated to cost when its kind loads:
/// the API server's limit for one validation rule of a CRD
/// (`StaticEstimatedCostLimit`).
pub const STATIC_LIMIT: u64 = 10_000_000;
/// The most one evaluation may cost, estimated over the values it reads:
/// the API server's limit per call (`PerCallLimit`, about 0.1 s of its
/// CPU).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// The most one look at a resource may spend on all its expressions: the
/// API server's budget per custom resource (`RuntimeCELCostBudget`).
pub const PER_LOOK_LIMIT: u64 = 10_000_000;

/// The estimated cost of an expression, and what makes it large.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Estimate {
    /// Its cost at most, in the API server's units.
    pub cost: u64,
    /// The sizes it depends on that nothing declared bounds.
    pub hints: BTreeSet<Hint>,
}

impl Estimate {
    /// The estimate of running it `times` times.
    pub fn times(self, times: u64) -> Self {
        Self {
            cost: self.cost.saturating_mul(times),
            ..self
        }
    }

    /// What would make it fit, in words: the keywords the schema lacks
    /// (as the API server advises), or a simpler expression.
    pub fn advice(&self) -> String {
        if self.hints.is_empty() {
            return "simplify the expression, or lower the maxItems, maxLength and maxProperties of what it reads".into();
        }
        let keywords: Vec<String> = (self.hints.iter())
            .map(|h| format!("{} to {}", h.keyword, h.path))
            .collect();
        format!("add {} (or simplify the expression)", keywords.join(", "))
    }
}

/// The estimated cost of `tree` with each name it reads within its bound
/// in `variables` (a name not there is [`Bound::unknown`]).
pub fn estimate(tree: &IdedExpr, variables: &BTreeMap<&str, Bound>) -> Estimate {
    let mut coster = Coster {
        variables,
        locals: Vec::new(),
        hints: BTreeSet::new(),
    };
    let (cost, _) = coster.visit(tree);
    Estimate {
        cost,
        hints: coster.hints,
    }
}

/// `n` with its thousands grouped: `10,000,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A node's cost, and its value's bound.
type Node = (u64, Bound);

struct Coster<'a> {
    variables: &'a BTreeMap<&'a str, Bound>,
    /// Names comprehensions bind, innermost last.
    locals: Vec<(&'a str, Bound)>,
    hints: BTreeSet<Hint>,
}

/// A tenth of `n`, rounded up: the cost of going over `n` characters.
fn traversal(n: u64) -> u64 {
    n.div_ceil(10)
}

impl<'a> Coster<'a> {
    fn visit(&mut self, e: &'a IdedExpr) -> Node {
        match &e.expr {
            Expr::Literal(literal) => (0, literal_bound(literal)),
            Expr::Ident(name) => (1, self.lookup(name)),
            Expr::Select(select) => {
                let (cost, operand) = self.visit(&select.operand);
                let bound = if select.test {
                    Bound::scalar()
                } else {
                    operand.field(&select.field)
                };
                (cost.saturating_add(1), bound)
            }
            Expr::Call(call) => self.call(call),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::List(list) => {
                let mut cost = 10u64;
                let mut item = Bound::default();
                for element in &list.elements {
                    let (c, b) = self.visit(element);
                    cost = cost.saturating_add(c);
                    item.merge(b);
                }
                (cost, Bound::list(list.elements.len() as u64, item))
            }
            Expr::Map(map) => self.map(&map.entries, 30),
            Expr::Struct(s) => self.map(&s.entries, 40),
            Expr::Unspecified => (0, Bound::scalar()),
        }
    }

    /// The bound of `name`: the innermost comprehension's binding, else
    /// the variable's.
    fn lookup(&self, name: &str) -> Bound {
        let local = self.locals.iter().rev().find(|(n, _)| *n == name);
        match local.map(|(_, b)| b).or_else(|| self.variables.get(name)) {
            Some(bound) => bound.clone(),
            None => Bound::unknown(),
        }
    }

    /// `bound`'s items, noting what makes them many.
    fn items(&mut self, bound: &Bound) -> u64 {
        self.note(bound);
        bound.items
    }

    /// `bound`'s length, noting what makes it long.
    fn length(&mut self, bound: &Bound) -> u64 {
        self.note(bound);
        bound.length
    }

    /// `bound`'s size (`size()`, comparisons), noting what makes it large.
    fn size(&mut self, bound: &Bound) -> u64 {
        self.note(bound);
        bound.size()
    }

    fn note(&mut self, bound: &Bound) {
        if let Some(hint) = &bound.hint {
            self.hints.insert(hint.clone());
        }
    }

    /// A map or struct literal: `base`, and its entries.
    fn map(&mut self, entries: &'a [cel::common::ast::IdedEntryExpr], base: u64) -> Node {
        let mut cost = base;
        let mut bound = Bound {
            items: entries.len() as u64,
            ..Bound::default()
        };
        let mut fields = BTreeMap::new();
        for entry in entries {
            let (key, value) = match &entry.expr {
                EntryExpr::MapEntry(m) => (Some(&m.key), &m.value),
                EntryExpr::StructField(f) => (None, &f.value),
            };
            if let Some(key) = key {
                let (c, k) = self.visit(key);
                cost = cost.saturating_add(c);
                bound.keys = bound.keys.max(k.length);
            }
            let (c, v) = self.visit(value);
            cost = cost.saturating_add(c);
            match key.map(|k| &k.expr) {
                Some(Expr::Literal(LiteralValue::String(name))) => {
                    fields.insert(name.inner().to_string(), v);
                }
                _ => bound.merge(Bound {
                    parts: bound::Parts::Of(std::sync::Arc::new(v)),
                    ..Bound::default()
                }),
            }
        }
        bound.fields = std::sync::Arc::new(fields);
        (cost, bound)
    }

    fn call(&mut self, call: &'a CallExpr) -> Node {
        if call.func_name == operators::CONDITIONAL
            && let [condition, yes, no] = call.args.as_slice()
        {
            let (c, _) = self.visit(condition);
            let (y, yes) = self.visit(yes);
            let (n, no) = self.visit(no);
            return (c.saturating_add(y.max(n)), yes.union(&no));
        }
        let mut cost = 0u64;
        let mut bounds = Vec::with_capacity(call.args.len() + 1);
        let parts = call.target.iter().map(|t| t.as_ref()).chain(&call.args);
        for part in parts {
            let (c, b) = self.visit(part);
            cost = cost.saturating_add(c);
            bounds.push(b);
        }
        let (own, bound) = self.function(call, &bounds);
        (cost.saturating_add(own), bound)
    }

    /// The cost of the function `call` itself (its arguments aside) over
    /// arguments (the target first) of `bounds`, and its value's bound.
    fn function(&mut self, call: &CallExpr, bounds: &[Bound]) -> Node {
        let arg = |i: usize| bounds.get(i).cloned().unwrap_or_default();
        let (first, second) = (arg(0), arg(1));
        match call.func_name.as_str() {
            operators::LOGICAL_AND | operators::LOGICAL_OR => (0, Bound::scalar()),
            operators::ADD => {
                let length = self.length(&first).saturating_add(self.length(&second));
                (traversal(length).max(1), first.joined(&second))
            }
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS => {
                let smaller = self.size(&first).min(self.size(&second));
                (traversal(smaller).max(1), Bound::scalar())
            }
            operators::IN => (self.size(&second), Bound::scalar()),
            operators::INDEX | operators::OPT_INDEX => {
                let key = call.args.get(1).map(|k| &k.expr);
                let bound = match key {
                    Some(Expr::Literal(LiteralValue::String(name))) => first.field(name.inner()),
                    _ => first.part(),
                };
                (1, bound)
            }
            "contains" => {
                let within = traversal(self.length(&first)).max(1);
                let sought = traversal(self.length(&second)).max(1);
                (within.saturating_mul(sought), Bound::scalar())
            }
            "startsWith" | "endsWith" => (traversal(self.length(&second)).max(1), Bound::scalar()),
            "matches" => {
                let text = traversal(self.length(&first).saturating_add(1));
                let pattern = self.length(&second).div_ceil(4).max(1);
                (text.saturating_mul(pattern), Bound::scalar())
            }
            "string" | "bytes" => {
                let length = self.size(&first);
                (traversal(length).max(1), Bound::string(length.max(32)))
            }
            "int" | "uint" | "double" | "bool" | "quantity" => {
                (traversal(self.length(&first)).max(1), Bound::scalar())
            }
            "dyn" => (1, first),
            "b64encode" => {
                let length = self.length(&first);
                (
                    traversal(length).max(1),
                    Bound::string(length.div_ceil(3) * 4),
                )
            }
            "b64decode" => {
                let length = self.length(&first);
                (traversal(length).max(1), Bound::string(length / 4 * 3 + 3))
            }
            "sha256" => (traversal(self.length(&first)).max(1), Bound::string(64)),
            // Parsing builds a value every few bytes: it costs each byte.
            "from_json" => {
                let length = self.length(&first);
                let hint = first.hint.clone();
                (length.max(1), Bound::within(length.saturating_add(2), hint))
            }
            "seeded_string" => {
                let limit = crate::functions::SEEDED_STRING_LIMIT;
                let length = match call.args.get(1).map(|a| &a.expr) {
                    Some(Expr::Literal(LiteralValue::Int(n))) => {
                        u64::try_from(*n.inner()).unwrap_or(0).min(limit)
                    }
                    _ => limit,
                };
                // One hash of the seed for every 16 characters, at most.
                let blocks = length.div_ceil(16).max(1);
                let seed = traversal(self.length(&first)).max(1);
                (seed.saturating_mul(blocks), Bound::string(length))
            }
            // The evaluator counts a string's characters one by one.
            "size" => (traversal(self.length(&first)).max(1), Bound::scalar()),
            // Arithmetic, `type`, negation, `@not_strictly_false` and the
            // optional functions: one step, their value within their
            // arguments'.
            _ => {
                let bound = bounds.iter().fold(Bound::scalar(), |a, b| a.union(b));
                let bound = match call.func_name.as_str() {
                    "type" => Bound::scalar(),
                    _ => bound,
                };
                (1, bound)
            }
        }
    }

    fn comprehension(&mut self, c: &'a ComprehensionExpr) -> Node {
        let (range_cost, range) = self.visit(&c.iter_range);
        let (init_cost, init) = self.visit(&c.accu_init);
        let items = self.items(&range);
        let before = self.locals.len();
        self.locals.push((c.accu_var.as_str(), init.clone()));
        match &c.iter_var2 {
            Some(second) => {
                self.locals
                    .push((c.iter_var.as_str(), Bound::string(range.keys)));
                self.locals.push((second.as_str(), range.part()));
            }
            None => self.locals.push((c.iter_var.as_str(), range.element())),
        }
        let (cond_cost, _) = self.visit(&c.loop_cond);
        let (step_cost, step) = self.visit(&c.loop_step);
        self.locals.truncate(before + 1);
        let (result_cost, result) = self.visit(&c.result);
        self.locals.truncate(before);
        let body = cond_cost.saturating_add(step_cost);
        let cost = range_cost
            .saturating_add(init_cost)
            .saturating_add(result_cost)
            .saturating_add(items.saturating_mul(body));
        let bound = match &c.accu_init.expr {
            // `map`, `filter`: at most one item per item gone over.
            Expr::List(_) | Expr::Map(_) => Bound::list(items, step.part()),
            Expr::Literal(_) => init,
            _ => result,
        };
        (cost, bound)
    }
}

/// A literal's bound: a string's or bytes' length.
fn literal_bound(literal: &LiteralValue) -> Bound {
    match literal {
        LiteralValue::String(s) => Bound::string(s.inner().len() as u64),
        LiteralValue::Bytes(b) => Bound::string(b.inner().len() as u64),
        _ => Bound::scalar(),
    }
}

#[cfg(test)]
mod tests;
