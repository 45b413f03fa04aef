//! The suites' areas (`ko_test_support::area`): the tests of one suite are
//! inside together, another suite's test waits until the last has left.

use std::time::Duration;

use futures::FutureExt;
use ko_test_support::area;

#[test]
fn a_suite_is_the_first_segment_of_a_test_name() {
    assert_eq!(area::suite_of(Some("helm::installs")), Some("helm".into()));
    assert_eq!(area::suite_of(Some("a::b::c")), Some("a".into()));
    assert_eq!(area::suite_of(Some("main")), None);
    assert_eq!(area::suite_of(None), None);
}

#[tokio::test]
async fn another_suite_waits_until_the_last_test_of_the_suite_inside_has_left() {
    // Suite names of this test's own: no other test enters them.
    let first = area::enter_suite("areas-a").await;
    // The same suite is let in at once, beside the first.
    let second = area::enter_suite("areas-a")
        .now_or_never()
        .expect("a second test of the suite inside enters at once");

    let mut other = Box::pin(area::enter_suite("areas-b"));
    assert!(
        (&mut other).now_or_never().is_none(),
        "kept out while two are inside"
    );
    drop(first);
    assert!(
        (&mut other).now_or_never().is_none(),
        "kept out while one is inside"
    );
    drop(second);
    let inside = tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .expect("let in once the last has left");

    // Now the first suite waits for the other.
    let mut back = Box::pin(area::enter_suite("areas-a"));
    assert!(
        (&mut back).now_or_never().is_none(),
        "the first suite kept out in turn"
    );
    drop(inside);
    let again = tokio::time::timeout(Duration::from_secs(10), back)
        .await
        .expect("the first suite let in again");
    drop(again);
}
