//! kro's CEL functions in the kind file's expressions, under kro's names and
//! with kro's results: `random.seededString(length, seed)`,
//! `random.seededInt(min, max, seed)`, `hash.fnv64a(s)` and `hash.sha256(s)`
//! (bytes), `base64.encode(bytes)` and `base64.decode(s)` (bytes; the `cel`
//! crate's encoders extension, cel-go's as kro has it), `json.unmarshal(s)`
//! (numbers as doubles) and `json.marshal(v)` (Go's JSON). The values are
//! `crate::functions::kro`'s.
//!
//! A call `hash.sha256(s)` is, to the parser, `sha256` called on the name
//! `hash`; the `cel` crate calls the function named `hash.sha256` instead,
//! as cel-go does, and [`namespaced`] tells the kind file's checks that
//! `hash` there is no name the expression reads.

use std::sync::{Arc, LazyLock};

use cel::common::ast::{CallExpr, Expr};
use cel::{Context, Env, ExecutionError, Value};

use crate::functions::kro;

/// kro's functions offered, by their qualified names.
pub const FUNCTIONS: [&str; 8] = [
    "random.seededString",
    "random.seededInt",
    "hash.fnv64a",
    "hash.sha256",
    "base64.encode",
    "base64.decode",
    "json.unmarshal",
    "json.marshal",
];

/// CEL's standard library and the encoders extension (`base64.*`), built
/// once for every expression.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Its names are the extension's own: they cannot clash.
    let _ = env.add_extension(cel::extensions::encoders);
    Arc::new(env)
});

/// The environment every expression is evaluated in.
pub fn env() -> Arc<Env> {
    ENV.clone()
}

/// The qualified name of kro's function `call` calls (`hash.sha256(s)`),
/// whose target is then a namespace, not a value.
pub fn namespaced(call: &CallExpr) -> Option<&'static str> {
    let Some(Expr::Ident(namespace)) = call.target.as_deref().map(|t| &t.expr) else {
        return None;
    };
    FUNCTIONS.into_iter().find(|f| {
        f.split_once('.')
            .is_some_and(|(n, name)| n == namespace && name == call.func_name)
    })
}

/// Registers kro's functions on `context` (the encoders are the
/// environment's: [`env`]).
pub fn add(context: &mut Context) {
    type Answer = Result<Value, ExecutionError>;
    let failed =
        |name: &str, e: crate::functions::FunctionError| ExecutionError::function_error(name, e);
    let bytes = |b: Vec<u8>| Value::Bytes(Arc::new(b));
    // None of these names is CEL's own: registering them cannot conflict.
    let _ = context.add_function(
        "random.seededString",
        move |length: i64, seed: Arc<String>| -> Answer {
            kro::seeded_string(length, &seed)
                .map(Value::from)
                .map_err(|e| failed("random.seededString", e))
        },
    );
    let _ = context.add_function(
        "random.seededInt",
        move |min: i64, max: i64, seed: Arc<String>| -> Answer {
            kro::seeded_int(min, max, &seed)
                .map(Value::Int)
                .map_err(|e| failed("random.seededInt", e))
        },
    );
    let _ = context.add_function("hash.fnv64a", move |s: Arc<String>| {
        bytes(kro::fnv64a(&s).to_vec())
    });
    let _ = context.add_function("hash.sha256", move |s: Arc<String>| bytes(kro::sha256(&s)));
    let _ = context.add_function("json.unmarshal", move |s: Arc<String>| -> Answer {
        kro::json_unmarshal(&s)
            .map(|v| super::expressions::to_cel(&v))
            .map_err(|e| failed("json.unmarshal", e))
    });
    let _ = context.add_function("json.marshal", move |v: Value| -> Answer {
        let mut budget = super::expressions::MAX_VALUE_NODES;
        let json = super::expressions::to_json(&v, &mut budget)
            .map_err(|e| ExecutionError::function_error("json.marshal", e))?;
        Ok(Value::from(kro::json_marshal(&json)))
    });
}

#[cfg(test)]
mod tests {
    //! kro's expressions, with values computed as `functions/kro.rs`'s tests
    //! say (kro's published algorithms, checked independently).
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::{Value, json};

    use super::super::expressions::Expression;

    fn eval(source: &str) -> Result<Value, String> {
        let known: BTreeSet<String> = ["schema".to_string()].into();
        let expression = Expression::compile(source, &known).map_err(|e| e.to_string())?;
        let schema = json!({"metadata": {"uid": "test-seed"}, "spec": {"name": "app"}});
        let variables = BTreeMap::from([("schema", schema)]);
        expression.eval(&variables).map_err(|e| e.to_string())
    }

    #[test]
    fn kros_expressions_give_kros_values() {
        for (source, want) in [
            (
                "random.seededString(10, schema.metadata.uid)",
                json!("5czheg3o5c"),
            ),
            ("random.seededInt(0, 100, 'test-seed')", json!(56)),
            (
                "base64.encode(hash.sha256('hello world'))",
                json!("uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="),
            ),
            (
                "base64.encode(hash.fnv64a('hello world'))",
                json!("d5pl5wI80uc="),
            ),
            (
                "base64.encode(hash.fnv64a(schema.spec.name))",
                json!("50+nGQVqg4w="),
            ),
            ("size(hash.sha256('x'))", json!(32)),
            ("string(base64.decode('aGVsbG8='))", json!("hello")),
            ("string(base64.decode('aGVsbG8'))", json!("hello")),
            (
                "json.unmarshal('{\"exampleJSONKey\": \"exampleJSONValue\"}').exampleJSONKey",
                json!("exampleJSONValue"),
            ),
            ("json.unmarshal('[1, 2, 3]')[1]", json!(2.0)),
            ("json.unmarshal('[1, 2, 3]')[1] == 2", json!(true)),
            (
                "json.marshal({'name': schema.spec.name})",
                json!("{\"name\":\"app\"}"),
            ),
            (
                "json.marshal(json.unmarshal('{\"name\":\"test\",\"count\":42}'))",
                json!("{\"count\":42,\"name\":\"test\"}"),
            ),
            ("json.marshal(b'hello')", json!("\"aGVsbG8=\"")),
        ] {
            assert_eq!(eval(source), Ok(want), "{source}");
        }
    }

    #[test]
    fn kros_errors_are_kros() {
        let refused = eval("random.seededString(0, 'x')").unwrap_err();
        assert!(refused.contains("length must be positive"), "{refused}");
        let refused = eval("random.seededInt(5, 5, 'x')").unwrap_err();
        assert!(refused.contains("min must be less than max"), "{refused}");
        let refused = eval("json.unmarshal('{')").unwrap_err();
        assert!(refused.contains("failed to parse JSON"), "{refused}");
        assert!(eval("base64.decode('***')").is_err());
        assert!(
            eval("base64.encode('text')").is_err(),
            "bytes only, as cel-go"
        );
    }

    #[test]
    fn a_namespace_is_not_a_name_the_expression_reads() {
        let known = BTreeSet::new();
        let e = Expression::compile("base64.encode(hash.sha256('x'))", &known).unwrap();
        assert_eq!(e.reads().count(), 0);
        let unknown = Expression::compile("hash.status", &known).unwrap_err();
        assert!(unknown.to_string().contains("\"hash\""), "{unknown}");
    }
}
