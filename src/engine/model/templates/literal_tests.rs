//! A string literal a template hands to a filter (or puts in a list, or
//! passes to a function, or compares with) renders as that string, escaped
//! once, in a YAML template and a JSON template alike: whatever the text,
//! for every filter Tera offers that the operator allows.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{CompiledTemplates, TemplateFlavor};

/// Where the literal goes in a case's expression.
const HOLE: &str = "@L@";

/// One way a template hands a literal back: the filter (or construct)
/// tested, an expression with [`HOLE`] where the literal is written, and
/// what the expression gives for the literal.
struct Case {
    filter: &'static str,
    expression: &'static str,
    gives: fn(&str) -> Value,
}

/// Every filter that takes a string argument it can return (or that
/// decides what it returns), and the other places a literal is evaluated
/// inside an expression: list items, an `in` test, a comparison, a
/// function's argument, a filter's input.
fn cases() -> Vec<Case> {
    vec![
        Case {
            filter: "default",
            expression: "missing | default(value=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "default",
            expression: "nothing | default(value=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "get",
            expression: "object | get(key=\"none\", default=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "replace",
            expression: "\"x\" | replace(from=\"x\", to=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "join",
            expression: "pair | join(sep=@L@)",
            gives: |l| json!(format!("a{}b", pattern(l))),
        },
        Case {
            filter: "concat",
            expression: "empty | concat(with=@L@)",
            gives: |l| json!([l]),
        },
        Case {
            filter: "truncate",
            expression: "\"ab\" | truncate(length=1, end=@L@)",
            gives: |l| json!(format!("a{l}")),
        },
        Case {
            filter: "indent",
            expression: "\"a\" | indent(prefix=@L@, first=true)",
            gives: |l| json!(format!("{l}a")),
        },
        Case {
            filter: "pluralize",
            expression: "1 | pluralize(singular=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "pluralize",
            expression: "2 | pluralize(plural=@L@)",
            gives: |l| json!(l),
        },
        Case {
            filter: "filter",
            expression: "items | filter(attribute=\"k\", value=@L@)",
            gives: |l| json!([{ "k": l }]),
        },
        Case {
            filter: "split",
            expression: "\"a\" ~ @L@ ~ \"b\" | split(pat=@L@)",
            gives: |l| json!(format!("a{l}b").split(&pattern(l)).collect::<Vec<_>>()),
        },
        Case {
            filter: "trim_start_matches",
            expression: "@L@ ~ \"x\" | trim_start_matches(pat=@L@)",
            gives: |l| json!(format!("{l}x").trim_start_matches(&pattern(l))),
        },
        Case {
            filter: "trim_end_matches",
            expression: "\"x\" ~ @L@ | trim_end_matches(pat=@L@)",
            gives: |l| json!(format!("x{l}").trim_end_matches(&pattern(l))),
        },
        Case {
            filter: "first",
            expression: "[@L@, \"b\"] | first",
            gives: |l| json!(l),
        },
        Case {
            filter: "last",
            expression: "[\"a\", @L@] | last",
            gives: |l| json!(l),
        },
        Case {
            filter: "nth",
            expression: "[\"a\", @L@] | nth(n=1)",
            gives: |l| json!(l),
        },
        Case {
            filter: "a list",
            expression: "[@L@]",
            gives: |l| json!([l]),
        },
        Case {
            filter: "json",
            expression: "[@L@] | json",
            gives: |l| json!([l]),
        },
        Case {
            filter: "in",
            expression: "@L@ in texts",
            gives: |_| json!(true),
        },
        Case {
            filter: "==",
            expression: "items.0.k == @L@",
            gives: |_| json!(true),
        },
        Case {
            filter: "the filter's input",
            expression: "@L@ | trim_start",
            gives: |l| json!(l.trim_start()),
        },
        Case {
            filter: "seeded_string",
            expression: "seeded_string(seed=@L@, length=8)",
            gives: |l| json!(crate::functions::seeded_string(l, 8).unwrap()),
        },
        Case {
            filter: "kro_seeded_string",
            expression: "kro_seeded_string(length=8, seed=@L@)",
            gives: |l| json!(crate::functions::kro::seeded_string(8, l).unwrap()),
        },
    ]
}

/// A separator or pattern as Tera's `join`, `split` and `trim_*_matches`
/// read it: `\n` and `\t` in it are a newline and a tab (Tera's own rule,
/// escaping aside).
fn pattern(literal: &str) -> String {
    literal.replace("\\n", "\n").replace("\\t", "\t")
}

/// The filters that take no string argument they could return, nor one
/// that decides what they return: their input alone (upper, b64encode,
/// ...), numbers (slice, round's method aside), attribute paths.
const NO_LITERAL_RETURNED: &[&str] = &[
    "abs",
    "addslashes",
    "as_str",
    "b64decode",
    "b64encode",
    "capitalize",
    "data",
    "escape",
    "escape_xml",
    "float",
    "from_json",
    "group_by",
    "int",
    "length",
    "linebreaksbr",
    "lower",
    "map",
    "quantity",
    "reverse",
    "round",
    "sha256",
    "slice",
    "sort",
    "spaceless",
    "striptags",
    "title",
    "trim",
    "trim_end",
    "trim_start",
    "unique",
    "upper",
    "wordcount",
];

/// Filters a template may not use (refused when it loads).
const REFUSED: &[&str] = &["json_encode", "safe"];

/// `literal` as a Tera string literal: Tera has no escapes in a literal,
/// so it is delimited by a quote it does not hold (none, if it holds all
/// three).
fn quoted(literal: &str) -> Option<String> {
    ['"', '\'', '`']
        .into_iter()
        .find(|q| !literal.contains(*q))
        .map(|q| format!("{q}{literal}{q}"))
}

/// What `expression` renders as, read back from a YAML and a JSON
/// template, for `literal`.
fn rendered(expression: &str, literal: &str) -> Result<(Value, Value), String> {
    let expression = expression.replace(HOLE, &quoted(literal).ok_or("no quote")?);
    let templates = [
        ("t.yaml".to_string(), format!("v: {{{{ {expression} }}}}\n")),
        (
            "t.json".to_string(),
            format!("{{\"v\": {{{{ {expression} }}}}}}"),
        ),
    ];
    let compiled =
        CompiledTemplates::compile(TemplateFlavor::Files, &templates).map_err(|e| e.to_string())?;
    let context = json!({
        "nothing": null,
        "object": {},
        "pair": ["a", "b"],
        "empty": [],
        "items": [{"k": literal}, {"k": format!("{literal}-not")}],
        "texts": [literal],
    });
    let render = |name: &str| compiled.render(name, &context).map_err(|e| e.to_string());
    let yaml = render("t.yaml")?;
    let json = render("t.json")?;
    let from_yaml: Value =
        serde_saphyr::from_str(&yaml).map_err(|e| format!("not YAML ({e}): {yaml}"))?;
    let from_json: Value =
        serde_json::from_str(&json).map_err(|e| format!("not JSON ({e}): {json}"))?;
    Ok((from_yaml["v"].clone(), from_json["v"].clone()))
}

fn literals() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\"'\\\\{}%#:\\- \\n\\tab]{0,16}",
        Just(String::new()),
        Just("blue".to_string()),
        Just("\\\"".to_string()),
    ]
    .prop_filter("a Tera literal holds one quote at most", |l| {
        quoted(l).is_some()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_literal_renders_as_itself_escaped_once(literal in literals()) {
        for case in cases() {
            let want = (case.gives)(&literal);
            let (yaml, json) = rendered(case.expression, &literal)
                .map_err(|e| TestCaseError::fail(format!("{}: {e}", case.expression)))?;
            prop_assert_eq!(&yaml, &want, "{} in YAML", case.expression);
            prop_assert_eq!(&json, &want, "{} in JSON", case.expression);
        }
    }
}

/// The docs' own idiom, as issue 59 found it written twice escaped.
#[test]
fn a_default_value_is_written_once() {
    let (yaml, json) = rendered("colors.data.color | default(value=@L@)", "blue").unwrap();
    assert_eq!(yaml, "blue");
    assert_eq!(json, "blue");
}

#[test]
fn every_filter_the_operator_allows_is_looked_at() {
    let tera = super::new_tera();
    let covered: Vec<&str> = cases().iter().map(|c| c.filter).collect();
    let mut unchecked: Vec<&str> = tera
        .filters
        .keys()
        .map(String::as_str)
        .chain(["default"])
        .filter(|f| {
            !covered.contains(f) && !NO_LITERAL_RETURNED.contains(f) && !REFUSED.contains(f)
        })
        .collect();
    unchecked.sort_unstable();
    assert!(
        unchecked.is_empty(),
        "filters neither tested with literals nor listed as returning none: {unchecked:?}"
    );
    for listed in NO_LITERAL_RETURNED {
        assert!(
            tera.filters.contains_key(*listed),
            "{listed} is listed but not offered"
        );
    }
}
