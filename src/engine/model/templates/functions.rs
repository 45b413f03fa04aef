//! The functions templates get, as this operator registers them: `range`
//! capped at [`RANGE_LIMIT`] values (Tera's own would make a list of any
//! length: `range(end=30000000)` took a gigabyte), and the functions that
//! read the world refused at render time too, behind the parse-time check
//! of `checks.rs`.

use std::collections::HashMap;

use tera::{Tera, Value};

/// The most values one `range` call gives.
pub const RANGE_LIMIT: usize = 10_000;

/// Registers the functions on `tera`, over Tera's own.
pub fn register(tera: &mut Tera) {
    tera.register_function("range", range);
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
}
