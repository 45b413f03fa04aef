//! The memory of the plans a definition's changes were given
//! ([`super::planning`]): a plan that passed stands while the change is
//! the same, one that failed for [`PLAN_AGAIN`]. A leaf: the context holds
//! it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::resource::PlanStatus;

/// How long a plan that failed stands before it is made again.
pub const PLAN_AGAIN: Duration = Duration::from_secs(20);

/// The last plan made of each definition's change.
#[derive(Default)]
pub(super) struct Plans(Mutex<HashMap<String, Made>>);

impl Plans {
    /// Keeps `made` as the last plan of `name`.
    pub fn keep(&self, name: String, made: Made) {
        crate::sync::lock(&self.0).insert(name, made);
    }

    /// The last plan of `name`, if it was of the change `digest`.
    pub fn made(&self, name: &str, digest: &str) -> Option<Made> {
        let plans = crate::sync::lock(&self.0);
        plans.get(name).filter(|m| m.digest == digest).cloned()
    }

    /// Forgets the plans of `name` (its definition is gone).
    pub fn forget(&self, name: &str) {
        crate::sync::lock(&self.0).remove(name);
    }
}

/// A plan made: of which change, when, what it found.
#[derive(Clone)]
pub(super) struct Made {
    /// The digest of the change planned.
    pub digest: String,
    /// When.
    pub at: Instant,
    /// What it found.
    pub summary: PlanStatus,
    /// Nothing would fail, and it was made.
    pub passed: bool,
}

/// The plan made of `digest` for `name`, if it stands: one that passed
/// stands as long as the change is the same, one that failed for
/// [`PLAN_AGAIN`].
pub(super) fn recent(plans: &Plans, name: &str, digest: &str) -> Option<Made> {
    let plans = crate::sync::lock(&plans.0);
    let made = plans.get(name).filter(|m| m.digest == digest)?;
    (made.passed || made.at.elapsed() < PLAN_AGAIN).then(|| made.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_plan_stands_for_a_while_and_a_passed_one_while_the_change_is_the_same() {
        let plans = Plans::default();
        let made = |passed, at| Made {
            digest: "d1".into(),
            at,
            summary: PlanStatus::default(),
            passed,
        };
        let long_ago = Instant::now() - PLAN_AGAIN - Duration::from_secs(1);
        crate::sync::lock(&plans.0).insert("k".into(), made(false, Instant::now()));
        assert!(recent(&plans, "k", "d1").is_some());
        assert!(recent(&plans, "k", "d2").is_none(), "another change");
        crate::sync::lock(&plans.0).insert("k".into(), made(false, long_ago));
        assert!(recent(&plans, "k", "d1").is_none(), "planned again");
        crate::sync::lock(&plans.0).insert("k".into(), made(true, long_ago));
        assert!(recent(&plans, "k", "d1").is_some());
        plans.forget("k");
        assert!(
            plans.made("k", "d1").is_none(),
            "a deleted definition's plan goes"
        );
    }
}
