use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// `{"a":{"a":...{"a":1}}}`, `levels` objects deep.
fn nested(levels: usize) -> String {
    let mut text = String::from("1");
    for _ in 0..levels {
        text = format!("{{\"a\":{text}}}");
    }
    text
}

fn parsed(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("the scanned document decodes")
}

/// `value` with every object's `metadata.managedFields` removed, at the
/// places the scanner looks (the object itself, or a list's items).
fn without_managed(mut value: Value, shape: Shape) -> Value {
    let strip = |object: &mut Value| {
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    };
    match shape {
        Shape::Object => strip(&mut value),
        Shape::List => {
            if let Some(items) = value.get_mut("items").and_then(Value::as_array_mut) {
                items.iter_mut().for_each(strip);
            }
        }
        Shape::Events => {
            if let Some(object) = value.get_mut("object") {
                strip(object);
            }
        }
    }
    value
}

fn configmap(name: &str, managed: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"t","uid":"u-{name}","resourceVersion":"7","managedFields":{managed}}},"data":{{"k":"v"}}}}"#
    )
}

#[test]
fn an_object_read_alone_keeps_its_managed_fields_unless_too_deep() {
    let shallow = r#"{"metadata":{"name":"a","managedFields":[{"manager":"kubectl-create"}]}}"#;
    assert_eq!(
        scan(shallow.as_bytes(), Shape::Object, None).bytes,
        shallow.as_bytes()
    );
    let deep = format!(
        r#"{{"metadata":{{"name":"a","managedFields":[{{"fieldsV1":{}}}]}}}}"#,
        nested(200)
    );
    let scanned = scan(deep.as_bytes(), Shape::Object, None);
    assert_eq!(parsed(&scanned.bytes), json!({"metadata": {"name": "a"}}));
}

#[test]
fn managed_fields_are_cut_wherever_they_stand_in_metadata() {
    let docs = [
        r#"{"metadata":{"managedFields":[{"x":1}],"name":"a"}}"#,
        r#"{"metadata":{"name":"a","managedFields":[{"x":1}]}}"#,
        r#"{"metadata":{"name":"a","managedFields":[{"x":1}],"uid":"u"}}"#,
        r#"{"metadata":{"managedFields":[{"x":1}]}}"#,
        "{ \"metadata\" : { \"name\" : \"a\" ,\n \"managedFields\" : [ ] } , \"spec\" : 1 }",
    ];
    for doc in docs {
        let list = format!(r#"{{"items":[{doc}]}}"#);
        let scanned = scan(list.as_bytes(), Shape::List, None);
        let expected = without_managed(parsed(list.as_bytes()), Shape::List);
        assert_eq!(parsed(&scanned.bytes), expected, "{doc}");
        assert!(scanned.skipped.is_empty());
    }
}

#[test]
fn a_deep_managed_fields_entry_no_longer_stops_a_list() {
    let deep = format!(r#"[{{"fieldsV1":{}}}]"#, nested(200));
    let doc = format!(
        r#"{{"kind":"ConfigMapList","items":[{},{}],"metadata":{{}}}}"#,
        configmap("a", &deep),
        configmap("b", "[]")
    );
    assert!(
        serde_json::from_str::<Value>(&doc).is_err(),
        "the decoder's own limit"
    );
    let scanned = scan(doc.as_bytes(), Shape::List, None);
    let list = parsed(&scanned.bytes);
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(list["items"][0]["metadata"].get("managedFields").is_none());
    assert_eq!(list["items"][0]["data"]["k"], "v");
    assert!(scanned.skipped.is_empty());
}

#[test]
fn an_object_too_deep_of_its_own_is_left_out_of_a_list_and_named() {
    for (position, names) in [(0, ["b", "c"]), (1, ["a", "c"]), (2, ["a", "b"])] {
        let mut items: Vec<String> = ["a", "b", "c"].iter().map(|n| configmap(n, "[]")).collect();
        let name = ["a", "b", "c"][position];
        items[position] = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"t","uid":"u-{name}"}},"spec":{}}}"#,
            nested(150)
        );
        let doc = format!(
            r#"{{"apiVersion":"v1","items":[{}],"kind":"List"}}"#,
            items.join(",")
        );
        let scanned = scan(doc.as_bytes(), Shape::List, None);
        let list = parsed(&scanned.bytes);
        let kept: Vec<_> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kept, names);
        assert_eq!(scanned.skipped.len(), 1);
        let skipped = &scanned.skipped[0];
        assert_eq!(skipped.identity.name, name);
        assert_eq!(skipped.identity.namespace, "t");
        assert_eq!(skipped.identity.uid, format!("u-{name}"));
        assert_eq!(skipped.identity.kind, "ConfigMap");
        assert_eq!(skipped.reason, SkipReason::TooDeep(151));
    }
}

#[test]
fn runs_of_items_left_out_keep_the_list_valid() {
    let good = configmap("g", "[]");
    let bad = format!(r#"{{"metadata":{{"name":"x"}},"spec":{}}}"#, nested(120));
    let patterns: [&[bool]; 6] = [
        &[true],
        &[true, true],
        &[false, true, true],
        &[true, true, false],
        &[true, false, true],
        &[false, true, false, true, true],
    ];
    for pattern in patterns {
        let items: Vec<&str> = pattern
            .iter()
            .map(|b| if *b { bad.as_str() } else { good.as_str() })
            .collect();
        let doc = format!("{{\"items\": [ {} ] }}", items.join(" ,\n "));
        let scanned = scan(doc.as_bytes(), Shape::List, None);
        let kept = parsed(&scanned.bytes)["items"].as_array().unwrap().len();
        assert_eq!(kept, pattern.iter().filter(|b| !**b).count(), "{pattern:?}");
    }
}

#[test]
fn the_limit_counts_from_the_object() {
    // `{"spec": <nested(n)>}` is n + 1 deep.
    for (levels, kept) in [(MAX_DEPTH - 1, true), (MAX_DEPTH, false)] {
        let doc = format!(r#"{{"items":[{{"spec":{}}}]}}"#, nested(levels));
        let scanned = scan(doc.as_bytes(), Shape::List, None);
        assert_eq!(scanned.skipped.is_empty(), kept, "{levels}");
        parsed(&scanned.bytes);
    }
}

#[test]
fn a_watch_event_too_deep_becomes_a_bookmark_at_its_version() {
    let object = format!(
        r#"{{"apiVersion":"nuvolaris.org/v1","kind":"Sample","metadata":{{"name":"s","namespace":"t","uid":"u","resourceVersion":"42"}},"spec":{}}}"#,
        nested(130)
    );
    let line = format!(r#"{{"type":"MODIFIED","object":{object}}}"#);
    let scanned = scan(line.as_bytes(), Shape::Events, None);
    assert_eq!(
        parsed(&scanned.bytes),
        json!({"type": "BOOKMARK", "object": {"apiVersion": "nuvolaris.org/v1", "kind": "Sample", "metadata": {"resourceVersion": "42"}}})
    );
    assert_eq!(scanned.skipped[0].identity.name, "s");
}

#[test]
fn a_watch_event_loses_only_its_managed_fields() {
    let line = format!(
        r#"{{"type":"ADDED","object":{}}}"#,
        configmap("a", &format!("[{}]", nested(140)))
    );
    let scanned = scan(line.as_bytes(), Shape::Events, None);
    let event = parsed(&scanned.bytes);
    assert_eq!(event["type"], "ADDED");
    assert!(event["object"]["metadata"].get("managedFields").is_none());
    assert_eq!(event["object"]["metadata"]["name"], "a");
}

#[test]
fn a_shape_check_leaves_out_what_it_refuses() {
    let check: &ShapeCheck = &|bytes: &[u8]| {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        assert!(
            v["metadata"].get("managedFields").is_none(),
            "checked without them"
        );
        match v["spec"]["count"] {
            Value::Number(_) => Ok(()),
            _ => Err("spec.count: not a number".into()),
        }
    };
    let doc = r#"{"items":[{"metadata":{"name":"a","managedFields":[]},"spec":{"count":1}},{"metadata":{"name":"b"},"spec":{"count":"x"}}]}"#;
    let scanned = scan(doc.as_bytes(), Shape::List, Some(check));
    assert_eq!(parsed(&scanned.bytes)["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        scanned.skipped[0].reason,
        SkipReason::WrongShape("spec.count: not a number".into())
    );
    let line = r#"{"type":"ADDED","object":{"metadata":{"name":"b","resourceVersion":"3"},"spec":{"count":"x"}}}"#;
    let scanned = scan(line.as_bytes(), Shape::Events, Some(check));
    assert_eq!(parsed(&scanned.bytes)["type"], "BOOKMARK");
}

#[test]
fn errors_and_bookmarks_pass_unchecked() {
    let refuse: &ShapeCheck = &|_: &[u8]| Err("no".into());
    for line in [
        r#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#,
        r#"{"type":"BOOKMARK","object":{"kind":"Sample","metadata":{"resourceVersion":"9"}}}"#,
    ] {
        let scanned = scan(line.as_bytes(), Shape::Events, Some(refuse));
        assert_eq!(scanned.bytes, line.as_bytes());
    }
}

#[test]
fn strings_may_hold_anything() {
    let doc = r#"{"type":"ADDED","object":{"metadata":{"name":"a\"]}{[","managedFields":["\\",{"}":"]"}]},"data":{"k":"{[\"\\\\"}}}"#;
    let scanned = scan(doc.as_bytes(), Shape::Events, None);
    assert_eq!(
        parsed(&scanned.bytes),
        without_managed(parsed(doc.as_bytes()), Shape::Events)
    );
}

#[test]
fn what_is_not_json_passes_unchanged() {
    for doc in [
        "",
        "{",
        "{\"a\":}",
        "[1,2]x",
        "{\"metadata\":{\"name\":\"a\"}} {}",
        "not json",
    ] {
        for shape in [Shape::Object, Shape::List, Shape::Events] {
            let scanned = scan(doc.as_bytes(), shape, None);
            assert_eq!(scanned.bytes, doc.as_bytes(), "{doc:?}");
            assert!(scanned.skipped.is_empty());
        }
    }
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[ -~\\\\\"{}\\[\\]\u{80}-\u{10ffff}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z\"\\\\]{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object with metadata (managedFields maybe) and other members.
fn any_object() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map("[a-z]{1,5}", any_json(), 0..4),
        prop::option::of(any_json()),
        any::<usize>(),
        prop::collection::btree_map("[a-z]{1,5}", any_json(), 0..3),
    )
        .prop_map(|(meta, managed, at, rest)| {
            let mut entries: Vec<(String, Value)> = meta.into_iter().collect();
            if let Some(managed) = managed {
                let at = at % (entries.len() + 1);
                entries.insert(at, ("managedFields".into(), managed));
            }
            let mut object = serde_json::Map::new();
            object.insert(
                "metadata".into(),
                Value::Object(entries.into_iter().collect()),
            );
            object.extend(rest.into_iter().filter(|(k, _)| k != "metadata"));
            Value::Object(object)
        })
}

fn texts(value: &Value) -> [String; 2] {
    [
        value.to_string(),
        serde_json::to_string_pretty(value).unwrap(),
    ]
}

proptest! {
    #[test]
    fn an_object_read_alone_decodes_as_itself(object in any_object()) {
        for text in texts(&object) {
            let scanned = scan(text.as_bytes(), Shape::Object, None);
            prop_assert_eq!(scanned.bytes, text.as_bytes());
        }
    }

    #[test]
    fn a_list_decodes_as_itself_without_managed_fields(items in prop::collection::vec(any_object(), 0..5)) {
        let list = json!({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {}});
        for text in texts(&list) {
            let expected = without_managed(parsed(text.as_bytes()), Shape::List);
            let scanned = scan(text.as_bytes(), Shape::List, None);
            prop_assert!(scanned.skipped.is_empty());
            prop_assert_eq!(parsed(&scanned.bytes), expected);
        }
    }

    #[test]
    fn an_event_decodes_as_itself_without_managed_fields(object in any_object()) {
        let text = json!({"type": "MODIFIED", "object": object}).to_string();
        let expected = without_managed(parsed(text.as_bytes()), Shape::Events);
        let scanned = scan(text.as_bytes(), Shape::Events, None);
        prop_assert_eq!(parsed(&scanned.bytes), expected);
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        for shape in [Shape::Object, Shape::List, Shape::Events] {
            scan(&bytes, shape, None);
        }
    }
}

#[test]
fn depth_is_found_without_recursion_and_trailing_bytes_are_malformed() {
    assert_eq!(depth(b" 1 "), Ok(0));
    assert_eq!(depth(br#"{"a":[1,{"b":[]}]}"#), Ok(4));
    let deep = format!("{}1{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
    assert_eq!(depth(deep.as_bytes()), Ok(1_000_000));
    assert_eq!(depth(b"[1] [2]"), Err(Malformed));
    assert_eq!(depth(b"[1"), Err(Malformed));
}
