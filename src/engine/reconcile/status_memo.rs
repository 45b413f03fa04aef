//! The memory that hides the watch cache's lag behind the status writes:
//! the status last written per UID, until the watch shows it or a few
//! minutes passed ([`super::status_writer`] writes, reconciles read).

use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tokio::time::{Duration, Instant};

use super::expiring::Expiring;
use crate::engine::model::status::StatusText;

/// How long a written status is remembered at most.
const MEMO_TTL: Duration = Duration::from_secs(300);
/// How long a written status is still remembered once the watch brought
/// it: longer than a reconcile takes from reading the cache to asking for
/// its freshest status.
const SEEN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Memo {
    resource_version: Option<String>,
    status: StatusText,
}

/// The statuses the engine wrote that the watch may not show yet.
#[derive(Debug, Default)]
pub(crate) struct StatusMemo {
    entries: Mutex<Expiring<String, Memo>>,
}

impl StatusMemo {
    /// The status last written for `uid`, if the cached object (at
    /// `cached_version`) may not show it yet.
    pub fn fresher(&self, uid: &str, cached_version: Option<&str>) -> Option<Value> {
        let mut entries = self.lock();
        let memo = entries.get(uid, Instant::now())?;
        if memo.resource_version.as_deref() == cached_version {
            // The watch caught up.
            entries.remove(uid);
            return None;
        }
        Some(memo.status.value())
    }

    /// The watch's cache holds the resource `meta` describes at its
    /// version: a status written at that version is forgotten soon (it is
    /// in the cache now). Without this, a status would be held until
    /// [`MEMO_TTL`], since its own write starts no reconcile to look.
    ///
    /// Soon, not at once: a reconcile may have taken the resource from
    /// the cache just before the watch brought the written version, and
    /// has yet to ask [`StatusMemo::fresher`]. Forgotten now, its
    /// status would be the one before the write (a resource whose spec
    /// changed during a reconcile would then be reconciled against the
    /// inventory before the last apply, and prune nothing).
    pub fn cached(&self, meta: &ObjectMeta) {
        let (Some(uid), Some(version)) = (meta.uid.as_deref(), meta.resource_version.as_deref())
        else {
            return;
        };
        let mut entries = self.lock();
        let now = Instant::now();
        let written_at = entries.get(uid, now);
        if written_at.is_some_and(|memo| memo.resource_version.as_deref() == Some(version)) {
            entries.renew(uid, now + SEEN_GRACE, now);
        }
    }

    /// Remembers a status written for `uid`.
    pub fn remember(&self, uid: String, resource_version: Option<String>, status: &Value) {
        let memo = Memo {
            resource_version,
            status: StatusText::of(status),
        };
        let now = Instant::now();
        self.lock().insert(uid, memo, now + MEMO_TTL, now);
    }

    /// Forgets the statuses written too long ago to matter (see
    /// [`Expiring::forget_expired`]).
    pub fn forget_expired(&self, now: Instant) {
        self.lock().forget_expired(now);
    }

    /// Forgets `uid` (its resource is gone).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Expiring<String, Memo>> {
        crate::sync::lock(&self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_watch_showing_the_written_version_forgets_it_soon_without_a_reconcile() {
        let memo = StatusMemo::default();
        memo.remember("u".into(), Some("5".into()), &json!({"message": "new"}));
        let at = |version: &str| ObjectMeta {
            uid: Some("u".into()),
            resource_version: Some(version.into()),
            ..Default::default()
        };
        memo.cached(&at("4"));
        assert!(memo.lock().get("u", Instant::now()).is_some(), "not yet");
        memo.cached(&at("5"));
        assert_eq!(
            memo.fresher("u", Some("4")),
            Some(json!({"message": "new"})),
            "a reconcile that read the cache before the watch brought the write still gets it"
        );
        let later = Instant::now() + SEEN_GRACE + Duration::from_millis(1);
        assert!(
            memo.lock().get("u", later).is_none(),
            "forgotten once the grace is over"
        );
    }

    #[test]
    fn the_memo_answers_until_the_watch_catches_up() {
        let memo = StatusMemo::default();
        assert_eq!(memo.fresher("u", Some("1")), None);
        memo.remember("u".into(), Some("5".into()), &json!({"message": "new"}));
        assert_eq!(
            memo.fresher("u", Some("4")),
            Some(json!({"message": "new"}))
        );
        assert_eq!(memo.fresher("u", Some("5")), None, "caught up");
        assert_eq!(memo.fresher("u", Some("4")), None, "forgotten once seen");
        memo.remember("v".into(), Some("7".into()), &json!({}));
        memo.forget("v");
        assert_eq!(memo.fresher("v", Some("6")), None);
    }
}
