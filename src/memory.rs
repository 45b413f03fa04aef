//! Handing freed memory back to the system.
//!
//! glibc's allocator keeps what a burst of reconciles freed (rendered
//! overlays, kubectl output, list responses) in its arenas, so after a burst
//! or a restart with many resources the resident size stays near the peak.
//! `malloc_trim` returns those free pages; run every few seconds it costs
//! microseconds and keeps the idle footprint close to what is in use.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often free memory is handed back.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(5);

/// Trims the allocator's free memory every `interval` until `stop`.
pub async fn trim_until(interval: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => release_free_memory(),
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim only returns free pages of the allocator's own
    // heaps to the kernel; it touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}
