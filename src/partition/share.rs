//! A replica's share of the resources when replicas share the work by
//! themselves (automatic sharding): the hash space of resource UIDs is cut
//! into [`SLOTS`] equal ranges, and this replica reconciles the resources
//! whose UID falls into a slot it holds. The host's sharding loop decides
//! which slots it holds; the engine's watches keep only those resources,
//! and every reconcile enters its slot first ([`Share::enter`]), so that a
//! slot given up can be waited on until no reconcile runs in it
//! ([`Share::drained`]).
//!
//! The hash is the API server's own (64-bit FNV-1a of the UID, as
//! KEP-5866's `shardRange` computes it), so a slot is also a range a
//! server-side shard selector can name.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How many slots the hash space is cut into (one bit each in a `u64`).
pub const SLOTS: usize = 64;

/// Bits of the hash that number the slot (the top ones): 2^6 = 64.
const SLOT_BITS: u32 = 6;

/// 64-bit FNV-1a, as `k8s.io/apimachinery/pkg/sharding.HashField`.
pub fn fnv1a64(value: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    value
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The slot of the resource with this UID.
pub fn slot_of(uid: &str) -> usize {
    (fnv1a64(uid) >> (64 - SLOT_BITS)) as usize
}

/// The first hash of `slot` (inclusive) and the first past it
/// (exclusive, 2^64 for the last slot).
pub fn hash_range(slot: usize) -> (u128, u128) {
    let width = 1u128 << (64 - SLOT_BITS);
    let start = width * slot as u128;
    (start, start + width)
}

/// A hash bound as the API server writes one: `0x` and 16 hex digits
/// (17 for 2^64), compared by length first.
fn hex(bound: u128) -> String {
    format!("0x{bound:016x}")
}

/// A set of slots, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Slots(pub u64);

impl Slots {
    /// No slot.
    pub const NONE: Slots = Slots(0);
    /// Every slot.
    pub const ALL: Slots = Slots(u64::MAX);

    /// Whether `slot` is in the set.
    pub fn has(self, slot: usize) -> bool {
        slot < SLOTS && self.0 & (1 << slot) != 0
    }

    /// The set with `slot` added.
    pub fn with(self, slot: usize) -> Slots {
        Slots(self.0 | (1 << slot))
    }

    /// The slots of `self` not in `other`.
    pub fn minus(self, other: Slots) -> Slots {
        Slots(self.0 & !other.0)
    }

    /// The slots in either.
    pub fn union(self, other: Slots) -> Slots {
        Slots(self.0 | other.0)
    }

    /// How many slots.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The slots, in order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..SLOTS).filter(move |&s| self.has(s))
    }

    /// The slots as runs of neighbours, `(first, last)` inclusive.
    pub fn runs(self) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for slot in self.iter() {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == slot => *last = slot,
                _ => runs.push((slot, slot)),
            }
        }
        runs
    }
}

impl std::fmt::Display for Slots {
    /// `0-9,21,30-33`; `-` for none.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let runs: Vec<String> = self
            .runs()
            .into_iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        f.write_str(&runs.join(","))
    }
}

impl std::str::FromStr for Slots {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text == "-" || text.is_empty() {
            return Ok(Slots::NONE);
        }
        let slot = |s: &str| match s.trim().parse::<usize>() {
            Ok(n) if n < SLOTS => Ok(n),
            _ => Err(format!("{s:?} is not a slot (0 to {})", SLOTS - 1)),
        };
        let mut slots = Slots::NONE;
        for part in text.split(',') {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (slot(a)?, slot(b)?),
                None => (slot(part)?, slot(part)?),
            };
            for s in a..=b {
                slots = slots.with(s);
            }
        }
        Ok(slots)
    }
}

/// This replica's slots, and the reconciles running in each.
#[derive(Debug)]
pub struct Share {
    held: AtomicU64,
    running: [AtomicU32; SLOTS],
    resources: std::sync::atomic::AtomicI64,
    collections: std::sync::Mutex<std::collections::HashSet<String>>,
    foreign: AtomicU64,
    epoch: AtomicU64,
    changed: tokio::sync::watch::Sender<Slots>,
}

impl Default for Share {
    fn default() -> Self {
        Self::new()
    }
}

impl Share {
    /// A share holding no slot yet.
    pub fn new() -> Self {
        Self {
            held: AtomicU64::new(0),
            running: std::array::from_fn(|_| AtomicU32::new(0)),
            resources: std::sync::atomic::AtomicI64::new(0),
            collections: std::sync::Mutex::default(),
            foreign: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            changed: tokio::sync::watch::Sender::new(Slots::NONE),
        }
    }

    /// The slots held now.
    pub fn held(&self) -> Slots {
        Slots(self.held.load(Ordering::SeqCst))
    }

    /// Holds `slots` from now on; the watches start again with them.
    pub fn set(&self, slots: Slots) {
        self.held.store(slots.0, Ordering::SeqCst);
        self.changed.send_if_modified(|held| {
            let changed = *held != slots;
            if changed {
                self.epoch.fetch_add(1, Ordering::SeqCst);
            }
            *held = slots;
            changed
        });
    }

    /// How many times the slots held changed: a resource seen before a
    /// change may have been another replica's since, or skipped while it
    /// was, so the watches' filter of unchanged resources starts afresh.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Counts `n` more (or fewer) resources held in the watches' stores.
    pub fn count_resources(&self, n: i64) {
        self.resources.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a resource read by a watch but outside the share (what a
    /// shard selector at the source would have left out).
    pub fn count_foreign(&self) {
        self.foreign.fetch_add(1, Ordering::Relaxed);
    }

    /// Resources read outside the share so far.
    pub fn foreign(&self) -> u64 {
        self.foreign.load(Ordering::Relaxed)
    }

    /// The resources in the share, as the watches hold them.
    pub fn resources(&self) -> u64 {
        self.resources.load(Ordering::Relaxed).max(0) as u64
    }

    /// Follows the slots held (the current set first).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Slots> {
        self.changed.subscribe()
    }

    /// Asks for the lists and watches of the collection at `path` (an
    /// API path, as `Api::resource_url` gives it) to name the share.
    pub fn filter_collection(&self, path: &str) {
        crate::sync::lock(&self.collections).insert(path.to_string());
    }

    /// The shard selector a list or watch of the collection at `path`
    /// sends (KEP-5866's `shardSelector`): the slots held as ranges of the
    /// UID's hash. None for another collection, or while nothing is held.
    pub fn selector_for(&self, path: &str) -> Option<String> {
        if !crate::sync::lock(&self.collections).contains(path) {
            return None;
        }
        let held = self.held();
        if held.is_empty() {
            return None;
        }
        let ranges: Vec<String> = held
            .runs()
            .into_iter()
            .map(|(first, last)| {
                let (start, end) = (hash_range(first).0, hash_range(last).1);
                format!(
                    "shardRange(object.metadata.uid, '{}', '{}')",
                    hex(start),
                    hex(end)
                )
            })
            .collect();
        Some(ranges.join(" || "))
    }

    /// Whether the resource with this UID is in the share.
    pub fn owns(&self, uid: &str) -> bool {
        self.held().has(slot_of(uid))
    }

    /// Enters the slot of `uid` for one reconcile, if it is held: the slot
    /// counts the reconcile as running until the guard drops.
    pub fn enter(&self, uid: &str) -> Option<Entered<'_>> {
        let slot = slot_of(uid);
        // Counted first, checked second: a slot given up meanwhile
        // either sees this reconcile running or is seen given up here.
        self.running[slot].fetch_add(1, Ordering::SeqCst);
        let entered = Entered { share: self, slot };
        self.held().has(slot).then_some(entered)
    }

    /// Reconciles running now in `slots`.
    pub fn running_in(&self, slots: Slots) -> u32 {
        slots
            .iter()
            .map(|s| self.running[s].load(Ordering::SeqCst))
            .sum()
    }

    /// Resolves once no reconcile runs in `slots` (which are no longer
    /// held, so none starts).
    pub async fn drained(&self, slots: Slots) {
        while self.running_in(slots) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One reconcile running in a slot (see [`Share::enter`]).
#[derive(Debug)]
pub struct Entered<'a> {
    share: &'a Share,
    slot: usize,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.share.running[self.slot].fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_api_servers() {
        // k8s.io/apimachinery/pkg/sharding's hash_test.go values.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(format!("{:016x}", fnv1a64("a")), "af63dc4c8601ec8c");
        assert_eq!(slot_of("a"), 0xaf >> 2);
        assert_eq!(hash_range(0), (0, 1 << 58));
        assert_eq!(hash_range(SLOTS - 1).1, 1u128 << 64);
    }

    #[test]
    fn a_share_names_its_slots_as_hash_ranges_for_its_collections_only() {
        let share = Share::new();
        share.filter_collection("/apis/nuvolaris.org/v1/samples");
        assert_eq!(
            share.selector_for("/apis/nuvolaris.org/v1/samples"),
            None,
            "nothing held"
        );
        share.set(Slots::NONE.with(0).with(1).with(63));
        assert_eq!(
            share
                .selector_for("/apis/nuvolaris.org/v1/samples")
                .as_deref(),
            Some(
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x0800000000000000') || shardRange(object.metadata.uid, '0xfc00000000000000', '0x10000000000000000')"
            )
        );
        assert_eq!(share.selector_for("/apis/apps/v1/deployments"), None);
    }

    #[test]
    fn slots_print_as_runs_and_parse_back() {
        let slots = Slots::NONE.with(0).with(1).with(2).with(5).with(63);
        assert_eq!(slots.to_string(), "0-2,5,63");
        assert_eq!("0-2,5,63".parse::<Slots>(), Ok(slots));
        assert_eq!("-".parse::<Slots>(), Ok(Slots::NONE));
        assert_eq!(Slots::ALL.to_string(), "0-63");
        assert!("64".parse::<Slots>().is_err());
        assert!("x".parse::<Slots>().is_err());
    }

    #[test]
    fn a_reconcile_enters_only_a_held_slot_and_is_waited_for() {
        let share = Share::new();
        assert!(share.enter("a").is_none(), "nothing held yet");
        assert_eq!(
            share.running_in(Slots::ALL),
            0,
            "a refused entry leaves no count"
        );
        share.set(Slots::NONE.with(slot_of("a")));
        let entered = share.enter("a").expect("held");
        assert!(share.owns("a"));
        assert_eq!(share.running_in(share.held()), 1);
        drop(entered);
        assert_eq!(share.running_in(Slots::ALL), 0);
    }
}
