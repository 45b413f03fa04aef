use serde_json::{Value, json};

use super::round_trip;
use super::*;
use crate::kinds::declared::file::Move;

/// v2 (the hub): `greeting.text` was v1's `message`; `color` is new.
fn versions() -> Versions {
    serde_json::from_value::<OlderVersion>(json!({
        "name": "v1",
        "schema": v1_schema(),
        "conversion": {
            "moves": [{"from": "spec.message", "to": "spec.greeting.text"}],
            "defaults": {"spec.color": "blue"},
            "lossy": ["spec.color"],
        },
    }))
    .map(|older| hub_and(vec![older]))
    .unwrap()
}

/// The Greeting's versions: the hub v2 and `older`.
fn hub_and(older: Vec<OlderVersion>) -> Versions {
    Versions::new("hello.example.com", "Greeting", "v2", older).unwrap()
}

/// v1 says how big (`size`), v2 how many (`replicas`): each computed from
/// the other.
fn sized(up: &str, down: Option<&str>) -> OlderVersion {
    let mut conversion = json!({"up": {"spec.replicas": up}});
    if let Some(down) = down {
        conversion["down"] = json!({"spec.size": down});
    }
    serde_json::from_value(json!({
        "name": "v1",
        "schema": {"type": "object", "properties": {
            "name": {"type": "string"},
            "size": {"type": "string"},
        }},
        "conversion": conversion,
    }))
    .unwrap()
}

fn sized_hub() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "replicas": {"type": "integer"},
    }})
}

const UP: &str = "self.spec.size == 'large' ? 3 : 1";
const DOWN: &str = "self.spec.replicas >= 3 ? 'large' : 'small'";

#[test]
fn computed_fields_are_cel_over_the_object_before_the_conversion() {
    let versions = hub_and(vec![sized(UP, Some(DOWN))]);
    let large = object("v1", json!({"name": "a", "size": "large"}));
    let up = versions.convert(large, "v2").unwrap();
    assert_eq!(up["spec"]["replicas"], 3);
    let one = object("v2", json!({"name": "a", "replicas": 1}));
    let down = versions.convert(one, "v1").unwrap();
    assert_eq!(down["spec"]["size"], "small");
    assert_eq!(down["spec"]["name"], "a");
    round_trip::check(&sized_hub(), "v2", &versions.older()[0], 0).unwrap();
}

#[test]
fn a_computed_field_that_fails_or_reads_nothing_is_left_out() {
    let versions = hub_and(vec![sized("self.spec.name / 2", None)]);
    let up = versions
        .convert(object("v1", json!({"name": "a"})), "v2")
        .unwrap();
    assert_eq!(up["spec"].get("replicas"), None, "{up}");
    let versions = hub_and(vec![sized(UP, Some(DOWN))]);
    let down = versions
        .convert(object("v2", json!({"name": "a"})), "v1")
        .unwrap();
    assert_eq!(down["spec"].get("size"), None, "{down}");
}

#[test]
fn a_field_dropped_one_way_must_be_computed_on_the_way_back_in_cel_reading_self() {
    let err = round_trip::check(&sized_hub(), "v2", &sized(UP, None), 0).unwrap_err();
    assert!(
        err.contains("spec.size of v1 has no place in v2") && err.contains("conversion.down"),
        "{err}"
    );
    let err = round_trip::check(
        &sized_hub(),
        "v2",
        &sized("self.spec.size +", Some(DOWN)),
        0,
    )
    .unwrap_err();
    assert!(
        err.starts_with("spec.versions[0].conversion.up.spec.replicas: not CEL"),
        "{err}"
    );
    let err =
        round_trip::check(&sized_hub(), "v2", &sized("spec.size", Some(DOWN)), 0).unwrap_err();
    assert!(err.contains(r#"reads "spec""#), "{err}");
}

fn v1_schema() -> Value {
    json!({"type": "object", "properties": {
        "message": {"type": "string"},
        "replicas": {"type": "integer"},
    }})
}

fn v2_schema() -> Value {
    json!({"type": "object", "properties": {
        "greeting": {"type": "object", "properties": {"text": {"type": "string"}}},
        "replicas": {"type": "integer"},
        "color": {"type": "string"},
    }})
}

fn object(version: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("hello.example.com/{version}"),
        "kind": "Greeting",
        "metadata": {"name": "hi", "namespace": "a"},
        "spec": spec,
        "status": {"message": "ok"},
    })
}

#[test]
fn an_older_object_converts_up_with_its_moves_and_the_defaults() {
    let v1 = object("v1", json!({"message": "hello", "replicas": 2}));
    let v2 = versions().convert(v1, "v2").unwrap();
    assert_eq!(
        v2,
        object(
            "v2",
            json!({"greeting": {"text": "hello"}, "replicas": 2, "color": "blue"})
        )
    );
}

#[test]
fn a_hub_object_converts_down_and_back_to_itself() {
    let versions = versions();
    let v2 = object(
        "v2",
        json!({"greeting": {"text": "hello"}, "replicas": 2, "color": "blue"}),
    );
    let v1 = versions.convert(v2.clone(), "v1").unwrap();
    assert_eq!(v1["apiVersion"], "hello.example.com/v1");
    assert_eq!(v1["spec"]["message"], "hello");
    assert_eq!(v1["spec"]["greeting"], json!({}));
    assert_eq!(v1["status"], json!({"message": "ok"}));
    assert_eq!(versions.convert(v1, "v2").unwrap(), v2);
}

#[test]
fn a_conversion_to_its_own_version_changes_nothing_and_others_are_refused() {
    let versions = versions();
    let v1 = object("v1", json!({"message": "hello"}));
    assert_eq!(versions.convert(v1.clone(), "v1").unwrap(), v1);
    assert!(matches!(
        versions.convert(v1.clone(), "v3"),
        Err(ConversionError::UnknownVersion { .. })
    ));
    let mut other = v1;
    other["kind"] = "Farewell".into();
    assert!(matches!(
        versions.convert(other, "v2"),
        Err(ConversionError::NotThisKind { .. })
    ));
}

#[test]
fn moves_that_swap_two_fields_take_both_before_putting_either() {
    let mut older = versions().older().to_vec();
    older[0].conversion.moves = serde_json::from_value(json!([
        {"from": "spec.a", "to": "spec.b"},
        {"from": "spec.b", "to": "spec.a"},
    ]))
    .unwrap();
    let versions = hub_and(older);
    let v1 = object("v1", json!({"a": 1, "b": 2}));
    let v2 = versions.convert(v1, "v2").unwrap();
    assert_eq!(v2["spec"]["a"], 2);
    assert_eq!(v2["spec"]["b"], 1);
}

#[test]
fn a_declared_conversion_round_trips() {
    let versions = versions();
    let older = &versions.older()[0];
    round_trip::check(&v2_schema(), "v2", older, 0).unwrap();
}

#[test]
fn a_field_one_direction_drops_is_refused_unless_lossy() {
    let mut older = versions().older()[0].clone();
    older.conversion.lossy.clear();
    let err = round_trip::check(&v2_schema(), "v2", &older, 0).unwrap_err();
    assert!(
        err.starts_with("spec.versions[0]: spec.color of v2 has no place in v1"),
        "{err}"
    );
    assert!(err.contains("conversion.lossy"), "{err}");
    let mut older = versions().older()[0].clone();
    older.conversion.moves.clear();
    let err = round_trip::check(&v2_schema(), "v2", &older, 0).unwrap_err();
    assert!(
        err.contains("spec.message of v1 has no place in v2"),
        "{err}"
    );
}

#[test]
fn what_a_conversion_names_must_exist_and_a_move_keeps_its_type() {
    let mut older = versions().older()[0].clone();
    older.conversion.moves[0].to = "spec.greeting.txt".into();
    let err = round_trip::check(&v2_schema(), "v2", &older, 0).unwrap_err();
    assert_eq!(
        err,
        "spec.versions[0].conversion.moves[0].to: spec.greeting.txt is not a field of the stored version"
    );
    let mut older = versions().older()[0].clone();
    older.conversion.moves[0].from = "spec.replicas".into();
    older.conversion.lossy.push("spec.message".into());
    let err = round_trip::check(&v2_schema(), "v2", &older, 0).unwrap_err();
    assert!(err.contains("spec.replicas is \"integer\" in v1"), "{err}");
}

#[test]
fn a_field_under_an_object_that_keeps_unknown_fields_has_a_place() {
    let mut older = versions().older()[0].clone();
    older.schema["properties"]["extra"] =
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    older.schema["properties"]["extra"]["properties"] = json!({"color": {"type": "string"}});
    older.conversion.moves.push(Move {
        from: "spec.extra".into(),
        to: "spec.greeting".into(),
    });
    let mut hub = v2_schema();
    hub["properties"]["greeting"]["x-kubernetes-preserve-unknown-fields"] = true.into();
    round_trip::check(&hub, "v2", &older, 0).unwrap();
}

#[test]
fn versions_read_from_their_json_compute_as_those_built_from_the_kind_file() {
    let built = hub_and(vec![sized(UP, Some(DOWN))]);
    let written = serde_json::to_string(&built).unwrap();
    let read: Versions = serde_json::from_str(&written).unwrap();
    assert_eq!(read, built, "the same, computed fields and all");
    let large = object("v1", json!({"name": "a", "size": "large"}));
    assert_eq!(read.convert(large, "v2").unwrap()["spec"]["replicas"], 3);
}

#[test]
fn versions_whose_computed_field_does_not_compile_are_not_read_at_all() {
    let written = serde_json::to_value(hub_and(vec![sized(UP, Some(DOWN))])).unwrap();
    let mut broken = written.clone();
    broken["older"][0]["conversion"]["up"]["spec.replicas"] = "self.spec.size +".into();
    let err = serde_json::from_value::<Versions>(broken).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("v1.conversion.up.spec.replicas: not CEL"),
        "{err}"
    );
    let mut unknown = written;
    unknown["computed"] = json!({});
    assert!(serde_json::from_value::<Versions>(unknown).is_err());
    assert!(Versions::new("g.io", "K", "v2", vec![sized("self.", None)]).is_err());
}
