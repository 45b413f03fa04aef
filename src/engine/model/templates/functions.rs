//! The functions and filters templates get, as this operator registers
//! them: `range` capped at [`RANGE_LIMIT`] values (Tera's own would make a
//! list of any length: `range(end=30000000)` took a gigabyte); the
//! functions that read the world refused at render time too, behind the
//! parse-time check of `checks.rs`; and what kinds need that Tera lacks
//! (kro's CEL library has them): base64, SHA-256, JSON parsing, a random
//! string that a seed fixes and Kubernetes quantities, the same functions
//! CEL expressions get (`crate::functions`); and kro's seeded string,
//! `kro_seeded_string`, the value kro's `random.seededString` gives.

use std::collections::HashMap;

use tera::{Tera, Value};

use crate::functions;

/// The most values one `range` call gives.
pub const RANGE_LIMIT: usize = 10_000;

/// Registers the functions and filters on `tera`, over Tera's own.
pub fn register(tera: &mut Tera) {
    tera.register_function("range", range);
    tera.register_function("seeded_string", seeded_string);
    tera.register_function("kro_seeded_string", kro_seeded_string);
    tera.register_filter("b64encode", b64encode);
    tera.register_filter("b64decode", b64decode);
    tera.register_filter("sha256", sha256);
    tera.register_filter("from_json", from_json);
    tera.register_filter("quantity", quantity);
    for name in ["get_env", "now", "get_random"] {
        tera.register_function(name, move |_: &HashMap<String, Value>| {
            Err(tera::Error::msg(format!(
                "{name}() is not available to templates"
            )))
        });
    }
}

fn number(args: &HashMap<String, Value>, name: &str, default: Option<u64>) -> tera::Result<u64> {
    match args.get(name) {
        Some(value) => value.as_u64().ok_or_else(|| {
            tera::Error::msg(format!(
                "range(): {name}={value} is not a whole number of at least 0"
            ))
        }),
        None => default.ok_or_else(|| tera::Error::msg(format!("range(): {name} is missing"))),
    }
}

/// `range(end, start=0, step_by=1)`: `start`, `start + step_by`, ... below `end`.
fn range(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let start = number(args, "start", Some(0))?;
    let end = number(args, "end", None)?;
    let step = number(args, "step_by", Some(1))?;
    if step == 0 {
        return Err(tera::Error::msg("range(): step_by must be at least 1"));
    }
    if start > end {
        return Err(tera::Error::msg("range(): start is greater than end"));
    }
    let count = (end - start).div_ceil(step);
    if count > RANGE_LIMIT as u64 {
        return Err(tera::Error::msg(format!(
            "range(): {count} values, more than the {RANGE_LIMIT} a template may make"
        )));
    }
    let values: Vec<Value> = (start..end)
        .step_by(step as usize)
        .map(Value::from)
        .collect();
    Ok(Value::Array(values))
}

/// The text a filter was given, or an error naming the filter.
fn text<'a>(value: &'a Value, filter: &str) -> tera::Result<&'a str> {
    value
        .as_str()
        .ok_or_else(|| tera::Error::msg(format!("{filter}: {value} is not a string")))
}

/// A filter's value, or its error as Tera's.
fn filtered<T: Into<Value>>(result: Result<T, functions::FunctionError>) -> tera::Result<Value> {
    result
        .map(Into::into)
        .map_err(|e| tera::Error::msg(e.to_string()))
}

/// `{{ s | b64encode }}`: the UTF-8 bytes of `s` in standard base64.
fn b64encode(value: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    Ok(Value::String(functions::b64encode(text(
        value,
        "b64encode",
    )?)))
}

/// `{{ s | b64decode }}`: standard base64 decoded; the result must be text.
fn b64decode(value: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    filtered(functions::b64decode(text(value, "b64decode")?))
}

/// `{{ s | sha256 }}`: the SHA-256 of the UTF-8 bytes of `s`, in hex.
fn sha256(value: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    Ok(Value::String(functions::sha256(text(value, "sha256")?)))
}

/// `{{ s | from_json }}`: the value `s` holds as JSON (an object, a list,
/// a scalar), to read fields from.
fn from_json(value: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    filtered(functions::from_json(text(value, "from_json")?))
}

/// `{{ s | quantity }}`: a Kubernetes quantity as a number of base units
/// (a whole one as an integer, so it writes back as a quantity).
fn quantity(value: &Value, _: &HashMap<String, Value>) -> tera::Result<Value> {
    if let Value::Number(_) = value {
        return Ok(value.clone());
    }
    let number = functions::quantity(text(value, "quantity")?)
        .map_err(|e| tera::Error::msg(e.to_string()))?;
    let whole = number.fract() == 0.0 && number.abs() < 9e15;
    Ok(if whole {
        Value::from(number as i64)
    } else {
        Value::from(number)
    })
}

/// `seeded_string(seed, length)`: `length` letters and digits that look
/// random but depend on `seed` alone (`seed=metadata.uid` gives each
/// resource its own, the same at every reconcile).
fn seeded_string(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let seed = match args.get("seed") {
        Some(Value::String(seed)) => seed.as_str(),
        Some(other) => {
            return Err(tera::Error::msg(format!(
                "seeded_string(): seed={other} is not a string"
            )));
        }
        None => return Err(tera::Error::msg("seeded_string(): seed is missing")),
    };
    let length = args
        .get("length")
        .and_then(Value::as_u64)
        .ok_or_else(|| tera::Error::msg("seeded_string(): length must be a whole number"))?;
    filtered(functions::seeded_string(seed, length))
}

/// `kro_seeded_string(length, seed)`: what kro's
/// `random.seededString(length, seed)` gives (letters and digits, repeating
/// every 8), so that a kro instance moved here keeps its generated strings.
fn kro_seeded_string(args: &HashMap<String, Value>) -> tera::Result<Value> {
    let seed = match args.get("seed") {
        Some(Value::String(seed)) => seed.as_str(),
        Some(other) => {
            return Err(tera::Error::msg(format!(
                "kro_seeded_string(): seed={other} is not a string"
            )));
        }
        None => return Err(tera::Error::msg("kro_seeded_string(): seed is missing")),
    };
    let length = args
        .get("length")
        .and_then(Value::as_i64)
        .ok_or_else(|| tera::Error::msg("kro_seeded_string(): length must be a whole number"))?;
    filtered(functions::kro::seeded_string(length, seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str) -> Result<String, String> {
        let mut tera = Tera::default();
        register(&mut tera);
        tera.render_str(template, &tera::Context::new())
            .map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn quantities_are_numbers_to_compute_with() {
        assert_eq!(
            render("{% set m = \"1Gi\" | quantity %}{{ m * 2 }}").unwrap(),
            "2147483648"
        );
        assert_eq!(render("{{ \"250m\" | quantity }}").unwrap(), "0.25");
        assert!(render("{{ \"1Gb\" | quantity }}").is_err());
    }

    #[test]
    fn range_counts_as_teras_does() {
        assert_eq!(
            render("{% for i in range(end=3) %}{{ i }}{% endfor %}").unwrap(),
            "012"
        );
        assert_eq!(
            render("{% for i in range(start=1, end=8, step_by=3) %}{{ i }}{% endfor %}").unwrap(),
            "147"
        );
        assert_eq!(render("{{ range(end=0) | length }}").unwrap(), "0");
    }

    #[test]
    fn range_stops_at_its_limit() {
        assert!(render("{{ range(end=10000) | length }}").is_ok());
        let refused = render("{{ range(end=30000000) | length }}").unwrap_err();
        assert!(refused.contains("more than the 10000"), "{refused}");
    }

    #[test]
    fn the_environment_is_refused_at_render_time_too() {
        let refused = render("{{ get_env(name='HOME') }}").unwrap_err();
        assert!(refused.contains("get_env() is not available"), "{refused}");
    }

    #[test]
    fn base64_both_ways() {
        assert_eq!(
            render("{{ 'admin:s3cret' | b64encode }}").unwrap(),
            "YWRtaW46czNjcmV0"
        );
        assert_eq!(
            render("{{ 'YWRtaW46czNjcmV0' | b64decode }}").unwrap(),
            "admin:s3cret"
        );
        let refused = render("{{ '%%%' | b64decode }}").unwrap_err();
        assert!(refused.contains("not base64"), "{refused}");
        let binary = render("{{ '/w==' | b64decode }}").unwrap_err();
        assert!(binary.contains("not UTF-8"), "{binary}");
        assert!(
            render("{{ 3 | b64encode }}")
                .unwrap_err()
                .contains("not a string")
        );
        // As docs/kind-file.md writes it: the filter takes the whole concatenation.
        assert_eq!(render("{{ 'a' ~ ':' ~ 'b' | b64encode }}").unwrap(), "YTpi");
    }

    #[test]
    fn sha256_in_hex() {
        assert_eq!(
            render("{{ 'abc' | sha256 }}").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn json_parsed_and_read() {
        let template =
            r#"{% set v = '{"a": [1, {"b": "x"}]}' | from_json %}{{ v.a.1.b }}{{ v.a | length }}"#;
        assert_eq!(render(template).unwrap(), "x2");
        assert!(
            render("{{ '{' | from_json }}")
                .unwrap_err()
                .contains("not JSON")
        );
        let deep = "[".repeat(200) + &"]".repeat(200);
        let refused = render(&format!("{{{{ '{deep}' | from_json }}}}")).unwrap_err();
        assert!(refused.contains("recursion limit"), "{refused}");
    }

    #[test]
    fn a_seeded_string_depends_on_its_seed_alone() {
        let one = render("{{ seeded_string(seed='uid-1', length=40) }}").unwrap();
        assert_eq!(one.len(), 40);
        assert!(
            one.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{one}"
        );
        assert_eq!(
            render("{{ seeded_string(seed='uid-1', length=40) }}").unwrap(),
            one
        );
        let other = render("{{ seeded_string(seed='uid-2', length=40) }}").unwrap();
        assert_ne!(other, one);
        let short = render("{{ seeded_string(seed='uid-1', length=8) }}").unwrap();
        assert!(one.starts_with(&short), "a prefix of the longer one");
        let refused = render("{{ seeded_string(seed='x', length=100000) }}").unwrap_err();
        assert!(refused.contains("between 1 and 256"), "{refused}");
    }

    /// The value kro's `random.seededString(10, 'test-seed')` gives,
    /// computed from kro's algorithm (see `functions/kro.rs`).
    #[test]
    fn kros_seeded_string_is_kros() {
        assert_eq!(
            render("{{ kro_seeded_string(length=10, seed='test-seed') }}").unwrap(),
            "5czheg3o5c"
        );
        let refused = render("{{ kro_seeded_string(length=0, seed='x') }}").unwrap_err();
        assert!(refused.contains("must be positive"), "{refused}");
    }
}
