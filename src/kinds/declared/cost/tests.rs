use super::*;
use serde_json::{Value, json};

fn tree(source: &str) -> IdedExpr {
    cel::Program::compile(source)
        .expect("CEL")
        .expression()
        .clone()
}

fn cost(source: &str, variables: &[(&str, Bound)]) -> Estimate {
    let variables: BTreeMap<&str, Bound> = variables.iter().cloned().collect();
    estimate(&tree(source), &variables)
}

fn spec(schema: Value) -> Bound {
    Bound::of_schema(&schema, "spec")
}

/// The finding's shape: one `filter` over the items, each joined to a
/// long string.
const FINDING: &str = "spec.items.filter(i, (i + spec.big).size() > 0).size()";

#[test]
fn a_filter_over_a_bounded_list_fits() {
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 300, "items": {"type": "string", "maxLength": 16}},
    }});
    let estimate = cost(
        "spec.items.filter(i, i.startsWith('a')).size()",
        &[("spec", spec(schema))],
    );
    assert!(estimate.cost < 10_000, "{estimate:?}");
    assert!(estimate.hints.is_empty());
}

#[test]
fn the_findings_shape_over_unbounded_inputs_is_far_over_the_limit_and_says_what_bounds_it() {
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "string"}},
        "big": {"type": "string"},
    }});
    let estimate = cost(FINDING, &[("spec", spec(schema))]);
    assert!(estimate.cost > 1000 * STATIC_LIMIT, "{estimate:?}");
    let advice = estimate.advice();
    assert!(
        advice.contains("maxItems to spec.items") && advice.contains("maxLength to spec.big"),
        "{advice}"
    );
}

#[test]
fn bounds_that_fit_the_static_limit_may_still_be_over_the_per_call_limit() {
    // 300 items of 16 characters (64 bytes), a string of 40,000 (160,000
    // bytes, 4 a character): each of 300 joins goes over 160,064 bytes, a
    // tenth of that, and so does its size(): 9.6 million.
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 300, "items": {"type": "string", "maxLength": 16}},
        "big": {"type": "string", "maxLength": 40_000},
    }});
    let loaded = cost(FINDING, &[("spec", spec(schema))]);
    assert!(loaded.cost <= STATIC_LIMIT, "{loaded:?}");
    // At its bounds the input (ASCII: a byte a character) is over the
    // per-call limit: 300 joins over 40,016 bytes, 2.4 million.
    let big = json!({"items": vec!["x".repeat(16); 300], "big": "y".repeat(40_000)});
    let running = cost(FINDING, &[("spec", Bound::of_value(&big))]);
    assert!(running.cost > PER_CALL_LIMIT, "{running:?}");
    assert!(
        running.cost < loaded.cost,
        "actual sizes are within the bounds"
    );
    // A small input costs little.
    let small = json!({"items": ["a", "b"], "big": "y"});
    let running = cost(FINDING, &[("spec", Bound::of_value(&small))]);
    assert!(running.cost < 100, "{running:?}");
}

#[test]
fn a_loop_costs_its_body_times_its_items() {
    let items = |n: usize| Bound::of_value(&json!(vec![1; n]));
    let ten = cost("xs.all(x, x > 0)", &[("xs", items(10))]).cost;
    let thousand = cost("xs.all(x, x > 0)", &[("xs", items(1000))]).cost;
    assert_eq!(
        (ten, thousand),
        (2 + 10 * 5, 2 + 1000 * 5),
        "5 an item: a name, a comparison, the fold"
    );
    // Joining strings costs a tenth of their bytes; comparing them a tenth
    // of the shorter.
    let s = |n: usize| Bound::of_value(&json!("x".repeat(n)));
    assert_eq!(
        cost("a + b", &[("a", s(1000)), ("b", s(2000))]).cost,
        2 + 300
    );
    assert_eq!(cost("a == b", &[("a", s(1000)), ("b", s(20))]).cost, 2 + 2);
    // A condition costs its dearer branch.
    let dear = cost("c ? a + a : 1", &[("a", s(1000)), ("c", Bound::scalar())]).cost;
    assert_eq!(dear, 1 + 2 + 200);
}

#[test]
fn what_a_loop_builds_is_bounded_by_its_items() {
    // `map` makes one item per item: the next loop goes over as many.
    let xs = Bound::of_value(&json!(vec!["abc"; 100]));
    let once = cost("xs.map(x, x + x).size()", &[("xs", xs.clone())]).cost;
    let twice = cost(
        "xs.map(x, x + x).filter(y, y.size() > 1).size()",
        &[("xs", xs)],
    )
    .cost;
    assert!(twice > once + 100, "{once} {twice}");
}

#[test]
fn children_count_as_the_objects_a_resource_may_own_and_their_fields_as_short() {
    let workers = Bound::list(10_000, Bound::unknown());
    let readiness = "workers.filter(w, has(w.status.readyReplicas) && w.status.readyReplicas == w.spec.replicas).size()";
    let estimate = cost(readiness, &[("workers", workers)]);
    assert!(estimate.cost > 10_000, "{estimate:?}");
    assert!(estimate.cost < STATIC_LIMIT, "{estimate:?}");
}

#[test]
fn metadata_is_within_kubernetes_own_limits() {
    let over_labels = cost(
        "metadata.labels.all(k, metadata.labels[k].size() < 64)",
        &[("metadata", Bound::metadata())],
    );
    assert!(over_labels.cost > 100_000, "{over_labels:?}");
    let name = cost("metadata.name + '-web'", &[("metadata", Bound::metadata())]);
    assert!(name.cost < 100, "{name:?}");
}

#[test]
fn parsed_json_is_bounded_by_the_text_it_came_from() {
    let schema = json!({"type": "object", "properties": {
        "config": {"type": "string", "maxLength": 1000},
    }});
    let estimate = cost(
        "from_json(spec.config).all(x, x == 1)",
        &[("spec", spec(schema))],
    );
    // 4,000 bytes parsed, then at most 1,999 items.
    assert!(estimate.cost > 4000 + 1999, "{estimate:?}");
    assert!(estimate.cost < 100_000, "{estimate:?}");
}

#[test]
fn numbers_are_grouped_by_thousands() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1000), "1,000");
    assert_eq!(thousands(10_000_000), "10,000,000");
}
