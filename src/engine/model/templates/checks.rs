//! What a template may do, checked when it is parsed: only the functions
//! kinds need (no `get_env`, `now` or `get_random`: they read the
//! operator's environment or break the no-op skip), `throw` with a literal
//! message only (its text is the template's, never a value's), and no
//! recursion (a macro or an include that reaches itself again would
//! render until the stack overflows).

use std::collections::{BTreeMap, BTreeSet};

use tera::ast::{Expr, ExprVal, FunctionCall, Node};

/// The functions a template may call (Tera's own, as this operator
/// registers them: see `functions.rs`).
pub const ALLOWED_FUNCTIONS: [&str; 4] = ["range", "seeded_string", "kro_seeded_string", "throw"];

/// Why a template set is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A function that is not offered.
    #[error(
        "calls {0}(), which templates may not use (they may call {allowed})",
        allowed = ALLOWED_FUNCTIONS.join("(), ") + "()"
    )]
    Function(String),
    /// `throw` with a message that is not a literal string.
    #[error("throw() needs a literal message: its text must be the template's own")]
    ThrowMessage,
    /// A macro or include reaches itself again.
    #[error("recursion is not allowed: {0}")]
    Recursion(String),
}

/// Checks every template of `tera`; the first refusal, with the name of
/// the template it is in.
pub fn check(tera: &tera::Tera) -> Result<(), (String, Refusal)> {
    let mut graph = Graph::default();
    for (name, template) in &tera.templates {
        let file = Unit::File(name.clone());
        walk(
            &template.ast,
            &file,
            name,
            &template.imported_macro_files,
            &mut graph,
        )
        .map_err(|r| (name.clone(), r))?;
        for (macro_name, definition) in &template.macros {
            let unit = Unit::Macro(name.clone(), macro_name.clone());
            walk(
                &definition.body,
                &unit,
                name,
                &template.imported_macro_files,
                &mut graph,
            )
            .map_err(|r| (name.clone(), r))?;
            for default in definition.args.values().flatten() {
                expr(
                    default,
                    &unit,
                    name,
                    &template.imported_macro_files,
                    &mut graph,
                )
                .map_err(|r| (name.clone(), r))?;
            }
        }
    }
    match graph.cycle() {
        Some(cycle) => {
            let at = cycle.first().map(Unit::file).unwrap_or_default();
            let path: Vec<String> = cycle.iter().map(ToString::to_string).collect();
            Err((at, Refusal::Recursion(path.join(" -> "))))
        }
        None => Ok(()),
    }
}

/// A file's body or one of its macros: what calls and includes start from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    File(String),
    Macro(String, String),
}

impl Unit {
    fn file(&self) -> String {
        match self {
            Self::File(f) | Self::Macro(f, _) => f.clone(),
        }
    }
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(file) => write!(f, "{file}"),
            Self::Macro(file, name) => write!(f, "macro {name} of {file}"),
        }
    }
}

/// Who calls or includes whom.
#[derive(Default)]
struct Graph {
    edges: BTreeMap<Unit, BTreeSet<Unit>>,
}

impl Graph {
    fn add(&mut self, from: &Unit, to: Unit) {
        self.edges.entry(from.clone()).or_default().insert(to);
    }

    /// A cycle, as the units along it (the first repeated at the end).
    fn cycle(&self) -> Option<Vec<Unit>> {
        let mut done = BTreeSet::new();
        for start in self.edges.keys() {
            let mut path = Vec::new();
            if let Some(cycle) = self.visit(start, &mut path, &mut done) {
                return Some(cycle);
            }
        }
        None
    }

    /// Depth-first from `unit` (iterative over an explicit stack would be
    /// longer; the graph is as deep as the templates' own nesting of calls,
    /// which the kind's author wrote by hand).
    fn visit(
        &self,
        unit: &Unit,
        path: &mut Vec<Unit>,
        done: &mut BTreeSet<Unit>,
    ) -> Option<Vec<Unit>> {
        if let Some(at) = path.iter().position(|u| u == unit) {
            let mut cycle = path[at..].to_vec();
            cycle.push(unit.clone());
            return Some(cycle);
        }
        if done.contains(unit) {
            return None;
        }
        path.push(unit.clone());
        for next in self.edges.get(unit).into_iter().flatten() {
            if let Some(cycle) = self.visit(next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(unit.clone());
        None
    }
}

/// Where one template's names point: its imports (file, namespace).
type Imports = [(String, String)];

fn walk(
    nodes: &[Node],
    unit: &Unit,
    file: &str,
    imports: &Imports,
    graph: &mut Graph,
) -> Result<(), Refusal> {
    for node in nodes {
        match node {
            Node::VariableBlock(_, e) => expr(e, unit, file, imports, graph)?,
            Node::Set(_, set) => expr(&set.value, unit, file, imports, graph)?,
            Node::FilterSection(_, section, _) => {
                call_args(&section.filter, unit, file, imports, graph)?;
                walk(&section.body, unit, file, imports, graph)?;
            }
            Node::Block(_, block, _) => walk(&block.body, unit, file, imports, graph)?,
            Node::Forloop(_, forloop, _) => {
                expr(&forloop.container, unit, file, imports, graph)?;
                walk(&forloop.body, unit, file, imports, graph)?;
                if let Some(empty) = &forloop.empty_body {
                    walk(empty, unit, file, imports, graph)?;
                }
            }
            Node::If(branches, _) => {
                for (_, condition, body) in &branches.conditions {
                    expr(condition, unit, file, imports, graph)?;
                    walk(body, unit, file, imports, graph)?;
                }
                if let Some((_, body)) = &branches.otherwise {
                    walk(body, unit, file, imports, graph)?;
                }
            }
            Node::Include(_, names, _) => {
                for name in names {
                    graph.add(unit, Unit::File(name.clone()));
                }
            }
            // Macro definitions are walked from the template's `macros`.
            _ => {}
        }
    }
    Ok(())
}

fn expr(
    e: &Expr,
    unit: &Unit,
    file: &str,
    imports: &Imports,
    graph: &mut Graph,
) -> Result<(), Refusal> {
    for filter in &e.filters {
        call_args(filter, unit, file, imports, graph)?;
    }
    value(&e.val, unit, file, imports, graph)
}

fn value(
    val: &ExprVal,
    unit: &Unit,
    file: &str,
    imports: &Imports,
    graph: &mut Graph,
) -> Result<(), Refusal> {
    match val {
        ExprVal::Math(m) => {
            expr(&m.lhs, unit, file, imports, graph)?;
            expr(&m.rhs, unit, file, imports, graph)
        }
        ExprVal::Logic(l) => {
            expr(&l.lhs, unit, file, imports, graph)?;
            expr(&l.rhs, unit, file, imports, graph)
        }
        ExprVal::In(i) => {
            expr(&i.lhs, unit, file, imports, graph)?;
            expr(&i.rhs, unit, file, imports, graph)
        }
        ExprVal::Test(t) => t
            .args
            .iter()
            .try_for_each(|a| expr(a, unit, file, imports, graph)),
        ExprVal::Array(items) => items
            .iter()
            .try_for_each(|a| expr(a, unit, file, imports, graph)),
        ExprVal::StringConcat(c) => c
            .values
            .iter()
            .try_for_each(|v| value(v, unit, file, imports, graph)),
        ExprVal::FunctionCall(call) => function(call, unit, file, imports, graph),
        ExprVal::MacroCall(call) => {
            let target = if call.namespace == "self" {
                Some(file.to_string())
            } else {
                imports
                    .iter()
                    .find(|(_, namespace)| *namespace == call.namespace)
                    .map(|(f, _)| f.clone())
            };
            if let Some(target) = target {
                graph.add(unit, Unit::Macro(target, call.name.clone()));
            }
            call.args
                .values()
                .try_for_each(|a| expr(a, unit, file, imports, graph))
        }
        ExprVal::String(_)
        | ExprVal::Int(_)
        | ExprVal::Float(_)
        | ExprVal::Bool(_)
        | ExprVal::Ident(_) => Ok(()),
    }
}

fn function(
    call: &FunctionCall,
    unit: &Unit,
    file: &str,
    imports: &Imports,
    graph: &mut Graph,
) -> Result<(), Refusal> {
    if !ALLOWED_FUNCTIONS.contains(&call.name.as_str()) {
        return Err(Refusal::Function(call.name.clone()));
    }
    if call.name == "throw" {
        let literal = call.args.get("message").is_some_and(|m| {
            matches!(m.val, ExprVal::String(_)) && m.filters.is_empty() && !m.negated
        });
        if !literal || call.args.len() != 1 {
            return Err(Refusal::ThrowMessage);
        }
    }
    call_args(call, unit, file, imports, graph)
}

fn call_args(
    call: &FunctionCall,
    unit: &Unit,
    file: &str,
    imports: &Imports,
    graph: &mut Graph,
) -> Result<(), Refusal> {
    call.args
        .values()
        .try_for_each(|a| expr(a, unit, file, imports, graph))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(templates: &[(&str, &str)]) -> Result<(), (String, Refusal)> {
        let mut tera = tera::Tera::default();
        tera.add_raw_templates(templates.to_vec()).unwrap();
        check(&tera)
    }

    #[test]
    fn the_environment_the_clock_and_chance_are_not_offered() {
        for call in [
            "get_env(name='HOME')",
            "now()",
            "get_random(end=3)",
            "made_up()",
        ] {
            let template = format!("a: {{{{ {call} }}}}");
            let refused = checked(&[("t.yaml", &template)]).unwrap_err();
            assert_eq!(refused.0, "t.yaml");
            assert!(
                matches!(refused.1, Refusal::Function(_)),
                "{call}: {refused:?}"
            );
        }
        let hidden = "{% for x in [1] %}{% if true %}{{ [1, get_env(name='K')] | length }}{% endif %}{% endfor %}";
        assert!(checked(&[("t.yaml", hidden)]).is_err());
        let in_a_macro = "{% macro m() %}{{ get_env(name='K') }}{% endmacro m %}";
        assert!(checked(&[("t.yaml", in_a_macro)]).is_err());
    }

    #[test]
    fn throw_says_only_the_templates_own_text() {
        assert!(checked(&[("t.yaml", "{{ throw(message='spec.size must be set') }}")]).is_ok());
        for message in ["spec.secret", "'x' ~ spec.secret", "'x' | upper"] {
            let template = format!("{{{{ throw(message={message}) }}}}");
            assert_eq!(
                checked(&[("t.yaml", &template)]).unwrap_err().1,
                Refusal::ThrowMessage,
                "{message}"
            );
        }
    }

    #[test]
    fn ranges_and_loops_are_offered() {
        let template = "{% for i in range(end=spec.n) %}{{ i }}{% endfor %}";
        assert!(checked(&[("t.yaml", template)]).is_ok());
    }

    #[test]
    fn a_macro_calling_itself_is_refused() {
        let template = "{% macro m(n) %}{{ self::m(n=n) }}{% endmacro m %}{{ self::m(n=1) }}";
        let refused = checked(&[("t.yaml", template)]).unwrap_err();
        assert_eq!(refused.0, "t.yaml");
        assert_eq!(
            refused.1,
            Refusal::Recursion("macro m of t.yaml -> macro m of t.yaml".into())
        );
    }

    #[test]
    fn macros_calling_each_other_across_files_are_refused() {
        let a = "{% import 'b.yaml' as b %}{% macro ping() %}{{ b::pong() }}{% endmacro ping %}";
        let b = "{% import 'a.yaml' as a %}{% macro pong() %}{{ a::ping() }}{% endmacro pong %}";
        let refused = checked(&[("a.yaml", a), ("b.yaml", b)]).unwrap_err();
        assert!(matches!(refused.1, Refusal::Recursion(_)), "{refused:?}");
    }

    #[test]
    fn a_template_including_itself_is_refused() {
        let refused = checked(&[
            ("a.yaml", "{% include 'b.yaml' %}"),
            ("b.yaml", "{% include 'a.yaml' %}"),
        ])
        .unwrap_err();
        assert!(matches!(refused.1, Refusal::Recursion(_)));
    }

    #[test]
    fn macros_calling_other_macros_are_fine() {
        let template = "{% macro a() %}{{ self::b() }}{% endmacro a %}{% macro b() %}b{% endmacro b %}{{ self::a() }}{{ self::b() }}";
        assert!(checked(&[("t.yaml", template)]).is_ok());
    }
}
