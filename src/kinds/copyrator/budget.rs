//! The bytes CopyratorRule reconciles may hold at once while they read
//! ConfigMaps and Secrets (`--copyrator-read-budget`), shared by every rule
//! of the process, so that many rules reading at once cannot hold many
//! times one rule's cap.
//!
//! The budget is a semaphore whose permits are KiB. What it counts:
//! - a page being read counts [`PAGE_COST`] (its response may take up to
//!   [`PAGE_BYTES`], and its parsed form about as much again) until it is
//!   parsed and either dropped or kept;
//! - data kept for a plan (a rule's sources) counts the response bytes it
//!   came in, until the reconcile drops what it observed.
//!
//! No deadlock: a reconcile waits for budget only while it holds none (it
//! reads its copies and measures its sources page by page, each page taken
//! and given back alone; it waits for what its sources need only after
//! that, holding nothing). Waiters are served in order (tokio's semaphore is
//! fair), so a rule waiting for much is not starved by rules wanting little.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most bytes one page of a list response may take: every page is read
/// with this cap. A ConfigMap or Secret holds at most 1 MiB of data, and
/// its JSON, even with every character escaped (`\u003c`, 6 bytes for 1),
/// stays near 6 MiB with its metadata: one object always fits.
pub const PAGE_BYTES: usize = 8 * 1024 * 1024;

/// What a page counts while it is read: its response and its parsed form.
pub const PAGE_COST: usize = 2 * PAGE_BYTES;

/// The default of `--copyrator-read-budget`: 64 MiB. Twice the default
/// `--copyrator-max-bytes` (32 MiB): a rule at the cap copying into one
/// namespace holds its 32 MiB of sources (a little more as JSON) and other
/// rules still read a page at a time beside it. Four pages in flight at
/// most; with the operator's own ~50 MiB that keeps a flood of oversized
/// rules near 100 MiB resident, far below the Deployment's 512 Mi limit
/// (docs/security.md, "Bounded reading").
pub const DEFAULT_READ_BUDGET: usize = 64 * 1024 * 1024;

/// The smallest budget: one page must fit.
pub const MIN_READ_BUDGET: usize = PAGE_COST;

/// KiB, rounded up (what the semaphore counts), saturating.
pub fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// Why budget could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// More than the whole budget was asked for: it would never come.
    #[error(
        "{wanted} bytes are more than the operator's whole read budget of {capacity} bytes (--copyrator-read-budget)"
    )]
    Exceeds {
        /// What was asked for.
        wanted: usize,
        /// The whole budget.
        capacity: usize,
    },
    /// The semaphore was closed (never done: kept for completeness).
    #[error("the operator's read budget is closed")]
    Closed,
}

/// The process-wide read budget.
#[derive(Debug)]
pub struct Budget {
    semaphore: Arc<Semaphore>,
    capacity_kib: u32,
}

impl Budget {
    /// A budget of `bytes` (rounded up to KiB, at least [`MIN_READ_BUDGET`]).
    pub fn new(bytes: usize) -> Self {
        let capacity_kib = kib(bytes.max(MIN_READ_BUDGET));
        Self {
            semaphore: Arc::new(Semaphore::new(capacity_kib as usize)),
            capacity_kib,
        }
    }

    /// The whole budget in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity_kib as usize * 1024
    }

    /// Bytes nobody holds now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits() * 1024
    }

    /// Waits until `bytes` are free and holds them. Call it only while
    /// holding nothing else from this budget (see the module's docs).
    pub async fn acquire(&self, bytes: usize) -> Result<Hold, BudgetError> {
        let wanted = kib(bytes);
        if wanted > self.capacity_kib {
            return Err(BudgetError::Exceeds {
                wanted: bytes,
                capacity: self.capacity(),
            });
        }
        let permit = self
            .semaphore
            .clone()
            .acquire_many_owned(wanted)
            .await
            .map_err(|_| BudgetError::Closed)?;
        Ok(Hold { permit })
    }
}

/// Bytes held from a [`Budget`]; given back when dropped.
pub struct Hold {
    permit: OwnedSemaphorePermit,
}

impl Hold {
    /// The bytes held (a multiple of 1 KiB).
    pub fn bytes(&self) -> usize {
        self.permit.num_permits() * 1024
    }

    /// Gives back what is held beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        let keep = kib(bytes) as usize;
        let held = self.permit.num_permits();
        if keep < held {
            drop(self.permit.split(held - keep));
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("bytes", &self.bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn kib_rounds_up() {
        assert_eq!(kib(0), 0);
        assert_eq!(kib(1), 1);
        assert_eq!(kib(1024), 1);
        assert_eq!(kib(1025), 2);
        assert_eq!(kib(usize::MAX), u32::MAX);
    }

    #[test]
    fn a_budget_holds_at_least_one_page() {
        assert_eq!(Budget::new(0).capacity(), MIN_READ_BUDGET);
        assert_eq!(Budget::new(DEFAULT_READ_BUDGET).capacity(), 64 * MIB);
    }

    #[tokio::test]
    async fn a_second_reader_waits_until_the_first_gives_back() {
        let budget = Budget::new(64 * MIB);
        let first = budget.acquire(48 * MIB).await.unwrap();
        assert_eq!(budget.available(), 16 * MIB);
        assert!(
            budget.acquire(32 * MIB).now_or_never().is_none(),
            "it must wait: only 16 MiB are free"
        );
        let small = budget.acquire(16 * MIB).now_or_never();
        assert!(matches!(small, Some(Ok(_))), "what is free can be had");
        drop(small);
        drop(first);
        let second = budget.acquire(32 * MIB).now_or_never();
        assert_eq!(second.unwrap().unwrap().bytes(), 32 * MIB);
    }

    #[tokio::test]
    async fn waiters_are_served_in_order() {
        let budget = Budget::new(64 * MIB);
        let held = budget.acquire(60 * MIB).await.unwrap();
        let mut big = Box::pin(budget.acquire(40 * MIB));
        assert!(futures::poll!(&mut big).is_pending());
        // Only 4 MiB are free, and the big waiter is first in line.
        assert!(budget.acquire(MIB).now_or_never().is_none());
        drop(held);
        assert_eq!(big.await.unwrap().bytes(), 40 * MIB);
    }

    #[tokio::test]
    async fn more_than_the_whole_budget_is_refused_at_once() {
        let budget = Budget::new(64 * MIB);
        let err = budget.acquire(64 * MIB + 1).await.unwrap_err();
        assert_eq!(
            err,
            BudgetError::Exceeds {
                wanted: 64 * MIB + 1,
                capacity: 64 * MIB
            }
        );
        assert!(err.to_string().contains("--copyrator-read-budget"), "{err}");
    }

    #[tokio::test]
    async fn shrinking_gives_back_the_rest() {
        let budget = Budget::new(64 * MIB);
        let mut hold = budget.acquire(PAGE_COST).await.unwrap();
        hold.shrink_to(3000);
        assert_eq!(hold.bytes(), 3 * 1024);
        assert_eq!(budget.available(), 64 * MIB - 3 * 1024);
        hold.shrink_to(PAGE_COST);
        assert_eq!(hold.bytes(), 3 * 1024, "shrinking never grows");
        drop(hold);
        assert_eq!(budget.available(), 64 * MIB);
    }
}
