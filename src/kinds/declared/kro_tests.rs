//! kro's expressions in a kind file's CEL ([`super::kro_library`]), with
//! values computed as `functions/kro.rs`'s tests say (kro's published
//! algorithms, checked independently).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::expressions::Expression;

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
