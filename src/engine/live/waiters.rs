//! Runs waiting for something a watch will show, by key: a created
//! object's arrival (by its place). Each waiter is woken by events about
//! its own key only, so a burst of a thousand runs does not wake every
//! waiter for every event.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;

/// The waiters of one kind of event, by key.
#[derive(Debug)]
pub(crate) struct Waiters<K> {
    waiting: Mutex<HashMap<K, Weak<Notify>>>,
}

impl<K> Default for Waiters<K> {
    fn default() -> Self {
        Self {
            waiting: Mutex::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> Waiters<K> {
    /// Starts waiting for `key`; waiters for one key share one notify.
    pub fn wait_for(waiters: &Arc<Self>, key: K) -> Waiter<K> {
        let mut waiting = waiters.lock();
        let notify = waiting.get(&key).and_then(Weak::upgrade);
        let notify = notify.unwrap_or_else(|| {
            let notify = Arc::new(Notify::new());
            waiting.insert(key.clone(), Arc::downgrade(&notify));
            notify
        });
        Waiter {
            key,
            notify,
            waiters: waiters.clone(),
        }
    }

    /// Wakes every waiter for `key` waiting now (registered with
    /// `enable` before it looks, none is missed).
    pub fn wake(&self, key: &K) {
        if let Some(notify) = self.notify(key) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter of every key.
    pub fn wake_all(&self) {
        let notifies: Vec<Arc<Notify>> = self.lock().values().filter_map(Weak::upgrade).collect();
        for notify in notifies {
            notify.notify_waiters();
        }
    }

    /// True when nobody waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn notify(&self, key: &K) -> Option<Arc<Notify>> {
        self.lock().get(key).and_then(Weak::upgrade)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Weak<Notify>>> {
        crate::sync::lock(&self.waiting)
    }
}

/// One wait for a key; the key is forgotten when its last waiter drops.
#[derive(Debug)]
pub(crate) struct Waiter<K: Eq + Hash + Clone> {
    key: K,
    notify: Arc<Notify>,
    waiters: Arc<Waiters<K>>,
}

impl<K: Eq + Hash + Clone> Waiter<K> {
    /// What wakes this waiter.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl<K: Eq + Hash + Clone> Drop for Waiter<K> {
    fn drop(&mut self) {
        let mut waiting = self.waiters.lock();
        // Counted under the lock, where `wait_for` takes its clones.
        let last = Arc::strong_count(&self.notify) == 1;
        let ours = waiting
            .get(&self.key)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.notify)));
        if last && ours {
            waiting.remove(&self.key);
            crate::memory::shrink_after_burst(&mut *waiting);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// True when `waiter` is woken within a second.
    async fn woken(waiter: &Waiter<&'static str>) -> bool {
        tokio::time::timeout(Duration::from_secs(1), waiter.notify().notified())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_its_own_key_only() {
        let waiters = Arc::new(Waiters::default());
        let web = Waiters::wait_for(&waiters, "web");
        let (woken_web, ()) = tokio::join!(woken(&web), async {
            tokio::task::yield_now().await;
            waiters.wake(&"db");
        });
        assert!(!woken_web, "woken by another key");
        let (woken_web, ()) = tokio::join!(woken(&web), async {
            tokio::task::yield_now().await;
            waiters.wake(&"web");
        });
        assert!(woken_web);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_for_one_key_share_it_and_the_last_forgets_it() {
        let waiters = Arc::new(Waiters::default());
        let first = Waiters::wait_for(&waiters, "web");
        let second = Waiters::wait_for(&waiters, "web");
        let (a, b, ()) = tokio::join!(woken(&first), woken(&second), async {
            tokio::task::yield_now().await;
            waiters.wake(&"web");
        });
        assert!(a && b);
        drop(first);
        assert!(!waiters.is_empty(), "still awaited by the second");
        drop(second);
        assert!(waiters.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn wake_all_wakes_every_key() {
        let waiters = Arc::new(Waiters::default());
        let web = Waiters::wait_for(&waiters, "web");
        let db = Waiters::wait_for(&waiters, "db");
        let (a, b, ()) = tokio::join!(woken(&web), woken(&db), async {
            tokio::task::yield_now().await;
            waiters.wake_all();
        });
        assert!(a && b);
    }

    #[test]
    fn a_burst_of_waiters_gives_its_table_back_when_they_are_gone() {
        let waiters = Arc::new(Waiters::default());
        let burst: Vec<_> = (0..1000).map(|n| Waiters::wait_for(&waiters, n)).collect();
        let capacity = waiters.lock().capacity();
        drop(burst);
        assert!(waiters.is_empty());
        let after = waiters.lock().capacity();
        assert!(
            after < capacity / 4,
            "capacity {after} after a burst of {capacity}"
        );
    }
}
