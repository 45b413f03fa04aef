//! Waiting for one object to show up in a watch: right after an apply
//! creates an object, a run waits (briefly) for the watch to show it
//! rather than reading it from the API server. Each waiter is woken by
//! events about its own object only, so a burst of a thousand creations
//! does not wake every waiter for every event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;

/// An object's place in a watch: its namespace (`None` when
/// cluster-scoped) and name.
pub(crate) type Place = (Option<String>, String);

/// The objects of one watch that runs wait for, by place.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    waiting: Mutex<HashMap<Place, Weak<Notify>>>,
}

impl Arrivals {
    /// Starts waiting for the object at `place`; waiters for one place
    /// share one notify.
    pub fn expect(arrivals: &Arc<Self>, place: Place) -> Expected {
        let mut waiting = arrivals.lock();
        let notify = waiting.get(&place).and_then(Weak::upgrade);
        let notify = notify.unwrap_or_else(|| {
            let notify = Arc::new(Notify::new());
            waiting.insert(place.clone(), Arc::downgrade(&notify));
            notify
        });
        Expected {
            place,
            notify,
            arrivals: arrivals.clone(),
        }
    }

    /// Wakes whoever waits for the object at `place` (its event is in the
    /// store).
    pub fn arrived(&self, place: &Place) {
        let notify = self.lock().get(place).and_then(Weak::upgrade);
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter: a list ended, or the watch failed.
    pub fn wake_all(&self) {
        let notifies: Vec<Arc<Notify>> = self.lock().values().filter_map(Weak::upgrade).collect();
        for notify in notifies {
            notify.notify_waiters();
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Place, Weak<Notify>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A wait for one object; forgotten when the last waiter for its place
/// drops it.
#[derive(Debug)]
pub(crate) struct Expected {
    place: Place,
    notify: Arc<Notify>,
    arrivals: Arc<Arrivals>,
}

impl Expected {
    /// The notify to register (with `enable`) before looking at the store,
    /// so that an arrival in between still wakes the waiter.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        let mut waiting = self.arrivals.lock();
        // Counted under the lock, where `expect` takes its clones.
        let last = Arc::strong_count(&self.notify) == 1;
        let ours = waiting
            .get(&self.place)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.notify)));
        if last && ours {
            waiting.remove(&self.place);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn place(name: &str) -> Place {
        (Some("a".into()), name.into())
    }

    /// True when `expected` is woken within a second.
    async fn woken(expected: &Expected) -> bool {
        tokio::time::timeout(Duration::from_secs(1), expected.notify().notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_its_own_object_only() {
        let arrivals = Arc::new(Arrivals::default());
        let web = Arrivals::expect(&arrivals, place("web"));
        let (woken_web, ()) = tokio::join!(woken(&web), async {
            tokio::task::yield_now().await;
            arrivals.arrived(&place("db"));
        });
        assert!(!woken_web, "woken by another object");
        let (woken_web, ()) = tokio::join!(woken(&web), async {
            tokio::task::yield_now().await;
            arrivals.arrived(&place("web"));
        });
        assert!(woken_web);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_for_one_place_share_it_and_the_last_forgets_it() {
        let arrivals = Arc::new(Arrivals::default());
        let first = Arrivals::expect(&arrivals, place("web"));
        let second = Arrivals::expect(&arrivals, place("web"));
        let (a, b, ()) = tokio::join!(woken(&first), woken(&second), async {
            tokio::task::yield_now().await;
            arrivals.arrived(&place("web"));
        });
        assert!(a && b);
        drop(first);
        assert_eq!(arrivals.lock().len(), 1, "still awaited by the second");
        drop(second);
        assert!(arrivals.lock().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn wake_all_wakes_every_place() {
        let arrivals = Arc::new(Arrivals::default());
        let web = Arrivals::expect(&arrivals, place("web"));
        let db = Arrivals::expect(&arrivals, place("db"));
        let (a, b, ()) = tokio::join!(woken(&web), woken(&db), async {
            tokio::task::yield_now().await;
            arrivals.wake_all();
        });
        assert!(a && b);
    }
}
