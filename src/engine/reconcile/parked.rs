//! Applies whose status waits for their objects' first look, held outside
//! the reconcile.
//!
//! Right after an apply, a Deployment waits for its controller's first
//! look; a status written before it says `Ready=Unknown` and is written
//! again a moment later with `Ready=True`. So the status of such an apply
//! is parked here instead, and the reconcile ends (its slot goes to the
//! next resource). The change the first look makes wakes the resource, and
//! that reconcile writes the one status that says both what was applied and
//! that it is healthy; so does the one at the parking's deadline, if the
//! look never comes.
//!
//! Until it is written, a parked status is what every reconcile of the
//! resource reads as its status ([`super::status_writer::current`]), so a
//! new apply prunes and a deletion deletes what the parked apply created;
//! any status write releases it. A controller that stops gracefully writes
//! what is still parked for its kind as it stands; one killed loses it, as
//! a status an apply had not written yet always was: the next run applies
//! again (nothing changes) and writes it.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::time::{Duration, Instant};

use super::expiring::Expiring;
use crate::engine::model::outcome::Applied;
use crate::engine::model::status::{CommonStatus, StatusText};

/// When the objects started becoming healthy, from the status before:
/// `None` when they were already found stalled for the same desired state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Since this moment.
    Since(jiff::Timestamp),
    /// They already were stalled.
    Stalled,
}

/// A parked status is dropped this long after its deadline at the latest
/// (its resource went away, or this process stopped reconciling it).
const FORGET_AFTER: Duration = Duration::from_secs(300);

/// What a successful apply did, for its status: written at once, or
/// parked until its objects' first look.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApplyRecord {
    /// The engine's fields as last written, before the apply.
    pub written: CommonStatus,
    /// What the apply did (its health is decided when the status is written).
    pub applied: Applied,
    /// The kind's fields from the plan.
    pub kind: Option<Value>,
    /// Since when its objects are becoming healthy.
    pub waiting: Waiting,
    /// The generation of the resource it applied.
    pub generation: Option<i64>,
    /// How soon the resource is looked at again once it is written.
    pub requeue: Duration,
}

/// A successful apply whose status is not written yet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parked {
    /// The name of the resource's kind (as the engine serves it).
    pub kind: String,
    /// The resource's namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// The resource's name.
    pub name: String,
    /// The whole status as written if nothing changed (`Ready=Unknown`,
    /// waiting for the first look), read as the resource's status meanwhile.
    pub status: StatusText,
    /// The apply.
    pub record: ApplyRecord,
    /// When the status is written even if the first look has not come.
    pub until: Instant,
}

/// The parked statuses, by the UID of their resource.
#[derive(Debug, Default)]
pub(crate) struct ParkedStatuses {
    entries: Mutex<Expiring<String, Arc<Parked>>>,
}

impl ParkedStatuses {
    /// Parks `parked` for `uid`, replacing what was parked for it.
    pub fn park(&self, uid: String, parked: Parked) {
        let forget = parked.until + FORGET_AFTER;
        self.lock()
            .insert(uid, Arc::new(parked), forget, Instant::now());
    }

    /// What is parked for `uid`.
    pub fn get(&self, uid: &str) -> Option<Arc<Parked>> {
        self.lock().get(uid, Instant::now()).cloned()
    }

    /// Releases what is parked for `uid` (a status was written, or the
    /// resource is gone).
    pub fn release(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Takes every status parked for resources of `kind`, by UID.
    pub fn take_of(&self, kind: &str) -> Vec<(String, Arc<Parked>)> {
        self.lock().take_where(|p| p.kind == kind)
    }

    /// Forgets what was parked long past its deadline (see
    /// [`Expiring::forget_expired`]).
    pub fn forget_expired(&self, now: Instant) {
        self.lock().forget_expired(now);
    }

    /// How many statuses are parked.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Expiring<String, Arc<Parked>>> {
        crate::sync::lock(&self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::inventory::Inventory;
    use crate::engine::model::outcome::HealthState;
    use serde_json::json;

    fn parked(message: &str, until: Instant) -> Parked {
        Parked {
            kind: "sample".into(),
            namespace: Some("ns".into()),
            name: message.into(),
            status: StatusText::of(&json!({ "message": message })),
            record: ApplyRecord {
                written: CommonStatus::default(),
                applied: Applied {
                    summary: "deployment.apps/web serverside-applied".into(),
                    record: None,
                    digest: "sha256:1".into(),
                    inventory: Inventory::default(),
                    health: HealthState::Healthy,
                },
                kind: None,
                waiting: Waiting::Stalled,
                generation: Some(1),
                requeue: Duration::from_secs(300),
            },
            until,
        }
    }

    #[test]
    fn a_parked_status_is_read_until_released_and_replaced_by_the_next() {
        let statuses = ParkedStatuses::default();
        let soon = Instant::now() + Duration::from_secs(10);
        assert!(statuses.get("u").is_none());
        statuses.park("u".into(), parked("first", soon));
        statuses.park("u".into(), parked("second", soon));
        assert_eq!(
            statuses.get("u").unwrap().status.value()["message"],
            "second"
        );
        statuses.release("u");
        assert!(statuses.get("u").is_none());
    }

    #[test]
    fn a_stopping_controller_takes_the_statuses_parked_for_its_kind() {
        let statuses = ParkedStatuses::default();
        let soon = Instant::now() + Duration::from_secs(10);
        statuses.park("u".into(), parked("web", soon));
        let mut other = parked("rate", soon);
        other.kind = "exchangerate".into();
        statuses.park("v".into(), other);
        let taken = statuses.take_of("sample");
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, "u");
        assert!(statuses.get("u").is_none());
        assert!(statuses.get("v").is_some(), "another kind's is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_parked_long_past_its_deadline_is_forgotten() {
        let statuses = ParkedStatuses::default();
        statuses.park("old".into(), parked("old", Instant::now()));
        tokio::time::advance(FORGET_AFTER + Duration::from_secs(1)).await;
        statuses.park("new".into(), parked("new", Instant::now()));
        assert!(statuses.get("old").is_none());
        assert_eq!(statuses.len(), 1);
    }
}
