//! One suite's tests at a time on the cluster-wide state.
//!
//! The integration tests are built into a few binaries, each holding
//! several suites (one module per file of `tests/`). The tests of one
//! suite were written to run side by side; two suites may not be: one
//! installs the operator cluster-wide while another serves the same kinds
//! from a process, one turns on an admission guard for every
//! KindDefinition while another deletes its own. So a test enters its
//! suite's *area* before it touches the cluster ([`crate::TestNamespace`]
//! does so for it): any number of tests of one suite are inside at once,
//! and a test of another suite waits until the last of them has left.
//! Within a binary the harness starts tests in the order of their names,
//! so the suites follow one another and only meet at their boundary.

use std::sync::Mutex;

use tokio::sync::Notify;

/// Which suite is inside, and how many of its tests.
struct Inside {
    suite: Option<String>,
    tests: usize,
}

static INSIDE: Mutex<Inside> = Mutex::new(Inside {
    suite: None,
    tests: 0,
});
static LEFT: Notify = Notify::const_new();

/// A test inside its suite's area; leaves it when dropped.
#[must_use = "the area is left when this is dropped"]
pub struct Area {
    entered: bool,
}

/// Enters the area of the running test's suite (the first segment of its
/// name, `sample` of `sample::create_update`), waiting while another
/// suite's tests are inside. Off a test's thread (no suite in the name)
/// nothing is entered.
pub async fn enter() -> Area {
    match suite_of(std::thread::current().name()) {
        Some(suite) => enter_suite(&suite).await,
        None => Area { entered: false },
    }
}

/// Enters the area of `suite`, waiting while another suite's tests are
/// inside ([`enter`] names the running test's suite).
pub async fn enter_suite(suite: &str) -> Area {
    loop {
        // Registered before the look, so that no leaving is missed.
        let left = LEFT.notified();
        if try_enter(suite) {
            return Area { entered: true };
        }
        left.await;
    }
}

/// The suite of a test named `suite::test` (or `suite::module::test`).
pub fn suite_of(thread: Option<&str>) -> Option<String> {
    let (suite, _) = thread?.split_once("::")?;
    Some(suite.to_string())
}

fn try_enter(suite: &str) -> bool {
    let mut inside = INSIDE.lock().unwrap_or_else(|e| e.into_inner());
    match inside.suite.as_deref() {
        None => inside.suite = Some(suite.to_string()),
        Some(current) if current == suite => {}
        Some(_) => return false,
    }
    inside.tests += 1;
    true
}

impl Drop for Area {
    fn drop(&mut self) {
        if !self.entered {
            return;
        }
        let mut inside = INSIDE.lock().unwrap_or_else(|e| e.into_inner());
        inside.tests = inside.tests.saturating_sub(1);
        if inside.tests == 0 {
            inside.suite = None;
            drop(inside);
            LEFT.notify_waiters();
        }
    }
}
