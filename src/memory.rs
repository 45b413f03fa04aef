//! Handing freed memory back to the system.
//!
//! Hash maps keep the room their busiest moment needed:
//! [`shrink_after_burst`] gives it back.
//!
//! glibc's allocator keeps what a burst of reconciles freed (rendered
//! overlays, kubectl output, list responses) in its arenas, so after a burst
//! or a restart with many resources the resident size stays near the peak.
//! The binary uses jemalloc (feature `jemalloc`, configured in `main.rs`),
//! which hands freed pages back on its own. Built without it,
//! `release_free_memory` runs `malloc_trim`, every few seconds ([`every`]):
//! it costs microseconds and returns glibc's whole free pages.

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

#[cfg(not(feature = "jemalloc"))]
pub use trim::{TRIM_INTERVAL, release_free_memory};

/// Table capacity below which [`shrink_after_burst`] keeps a map as it is.
const MIN_CAPACITY: usize = 64;

/// Gives back most of `map`'s table once it holds a quarter of what it has
/// room for: a hash map keeps the capacity its busiest moment needed, so a
/// burst of a thousand entries would otherwise keep its table for good.
pub fn shrink_after_burst<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    let len = map.len();
    if map.capacity() > MIN_CAPACITY && len < map.capacity() / 4 {
        map.shrink_to(len * 2);
    }
}

/// Runs `housekeeping` every `interval` (the first time at once) until `stop`.
pub async fn every(interval: Duration, stop: CancellationToken, mut housekeeping: impl FnMut()) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => housekeeping(),
            () = stop.cancelled() => return,
        }
    }
}

/// glibc's free pages handed back (builds without jemalloc).
#[cfg(not(feature = "jemalloc"))]
mod trim {
    use std::time::Duration;

    /// How often free memory is handed back.
    pub const TRIM_INTERVAL: Duration = Duration::from_secs(5);

    /// Returns the allocator's whole free pages to the kernel.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn release_free_memory() {
        // SAFETY: malloc_trim only returns free pages of the allocator's own
        // heaps to the kernel; it touches no memory in use.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Nothing to return on other allocators.
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub fn release_free_memory() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_after_a_burst_gives_its_table_back() {
        let mut map: HashMap<u32, u32> = (0..1000).map(|n| (n, n)).collect();
        let burst = map.capacity();
        map.retain(|n, _| *n < 10);
        shrink_after_burst(&mut map);
        assert!(map.capacity() < burst / 4, "capacity {}", map.capacity());
        assert_eq!(map.len(), 10);
    }

    #[test]
    fn a_small_or_busy_map_keeps_its_table() {
        let mut small: HashMap<u32, u32> = (0..50).map(|n| (n, n)).collect();
        small.retain(|n, _| *n < 2);
        let capacity = small.capacity();
        shrink_after_burst(&mut small);
        assert_eq!(small.capacity(), capacity);
        let mut busy: HashMap<u32, u32> = (0..1000).map(|n| (n, n)).collect();
        busy.retain(|n, _| *n < 600);
        let capacity = busy.capacity();
        shrink_after_burst(&mut busy);
        assert_eq!(busy.capacity(), capacity);
    }
}
