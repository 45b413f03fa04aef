//! A map whose entries expire: what the engine remembers about resources
//! for a few minutes (events' series, parked statuses, written statuses).
//!
//! Expired entries are never returned. They are swept out at most once a
//! second, on an access or when the owner asks ([`Expiring::forget_expired`]),
//! so an access costs O(1) however many resources a burst brought, and
//! after a sweep the table gives back the room a burst made it grow to
//! ([`crate::memory::shrink_after_burst`]).
//!
//! Time is passed in, never read, so the owners decide which clock counts
//! and tests need no waiting. (A caching crate such as moka would bring
//! its own clock, threads and eviction policy for three small tables.)

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use tokio::time::{Duration, Instant};

/// The least time between two sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires: Instant,
}

/// Entries by key, each with the moment it expires.
#[derive(Debug)]
pub(crate) struct Expiring<K, V> {
    entries: HashMap<K, Entry<V>>,
    next_sweep: Option<Instant>,
}

impl<K, V> Default for Expiring<K, V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            next_sweep: None,
        }
    }
}

impl<K: Eq + Hash, V> Expiring<K, V> {
    /// Keeps `value` for `key` until `expires`, replacing what was kept.
    pub fn insert(&mut self, key: K, value: V, expires: Instant, now: Instant) {
        self.forget_expired(now);
        self.entries.insert(key, Entry { value, expires });
    }

    /// The value kept for `key`, unless it expired.
    pub fn get<Q: Eq + Hash + ?Sized>(&mut self, key: &Q, now: Instant) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.forget_expired(now);
        self.live(key, now).map(|entry| &entry.value)
    }

    /// The value kept for `key`, unless it expired, now kept until `expires`.
    pub fn renew<Q: Eq + Hash + ?Sized>(
        &mut self,
        key: &Q,
        expires: Instant,
        now: Instant,
    ) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.forget_expired(now);
        let entry = self.live(key, now)?;
        entry.expires = expires;
        Some(&mut entry.value)
    }

    /// Removes what is kept for `key`.
    pub fn remove<Q: Eq + Hash + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.entries.remove(key).map(|entry| entry.value)
    }

    /// Removes and returns every entry, expired or not, whose value matches.
    pub fn take_where(&mut self, mut matches: impl FnMut(&V) -> bool) -> Vec<(K, V)> {
        self.entries
            .extract_if(|_, entry| matches(&entry.value))
            .map(|(key, entry)| (key, entry.value))
            .collect()
    }

    /// How many entries are held (expired ones not swept yet included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Room in the table.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    fn live<Q: Eq + Hash + ?Sized>(&mut self, key: &Q, now: Instant) -> Option<&mut Entry<V>>
    where
        K: Borrow<Q>,
    {
        self.entries
            .get_mut(key)
            .filter(|entry| entry.expires > now)
    }

    /// Drops the expired entries and gives back the room they took; does
    /// nothing if it last ran less than a second before `now`.
    pub fn forget_expired(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|next| now < next) {
            return;
        }
        self.next_sweep = Some(now + SWEEP_EVERY);
        self.entries.retain(|_, entry| entry.expires > now);
        crate::memory::shrink_after_burst(&mut self.entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn an_entry_is_returned_until_it_expires() {
        let t0 = Instant::now();
        let mut map = Expiring::default();
        map.insert("u", 1, t0 + MINUTE, t0);
        assert_eq!(map.get(&"u", t0), Some(&1));
        assert_eq!(map.get(&"u", t0 + MINUTE), None, "expired");
        assert_eq!(map.get(&"v", t0), None);
    }

    #[test]
    fn a_renewed_entry_lives_on_and_can_be_changed() {
        let t0 = Instant::now();
        let mut map = Expiring::default();
        map.insert("u", 1, t0 + MINUTE, t0);
        *map.renew(&"u", t0 + 2 * MINUTE, t0).unwrap() += 1;
        assert_eq!(map.get(&"u", t0 + MINUTE), Some(&2));
        assert!(map.renew(&"u", t0 + 3 * MINUTE, t0 + 2 * MINUTE).is_none());
    }

    #[test]
    fn removed_and_taken_entries_are_gone() {
        let t0 = Instant::now();
        let mut map = Expiring::default();
        for (key, value) in [("a", 1), ("b", 2), ("c", 3)] {
            map.insert(key, value, t0 + MINUTE, t0);
        }
        assert_eq!(map.remove(&"a"), Some(1));
        assert_eq!(map.take_where(|v| *v == 2), vec![("b", 2)]);
        assert_eq!(map.get(&"b", t0), None);
        assert_eq!(map.get(&"c", t0), Some(&3));
    }

    #[test]
    fn expired_entries_are_swept_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut map = Expiring::default();
        map.insert(0, 0, t0 + MINUTE, t0);
        map.insert(1, 1, t0 + 2 * MINUTE, t0);
        let later = t0 + MINUTE;
        assert_eq!(map.get(&1, later), Some(&1));
        assert_eq!(map.len(), 1, "the first access after a second sweeps");
        map.insert(2, 2, later, later);
        assert_eq!(map.get(&2, later + Duration::from_millis(10)), None);
        assert_eq!(map.len(), 2, "not swept again within the second");
    }

    #[test]
    fn a_burst_gives_its_table_back_once_it_expired() {
        let t0 = Instant::now();
        let mut map = Expiring::default();
        for n in 0..1000 {
            map.insert(n, n, t0 + MINUTE, t0);
        }
        let burst = map.capacity();
        assert_eq!(map.get(&0, t0 + MINUTE), None);
        assert!(map.capacity() < burst / 4, "{} of {burst}", map.capacity());
    }
}
