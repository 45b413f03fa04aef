//! Where and within what a kind file's CEL runs: a [`Budget`] per look at
//! a resource (what each evaluation may cost, estimated over the values it
//! reads, and what all of them may cost together), and a small pool of
//! threads off the async runtime ([`Evaluations`]) with a deadline, past
//! which the look gives up, the evaluation is told to stop, and the
//! resource reports it over budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::cost::{PER_CALL_LIMIT, PER_LOOK_LIMIT, thousands};

/// The longest one look at a resource may spend in its expressions
/// (waiting for a thread included). Ten times what the API server gives
/// its own budget of [`PER_LOOK_LIMIT`] (about a second), for a machine
/// busier than an API server's.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Why an expression was not run (or not to its end).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// Over the limit of one evaluation.
    #[error(
        "its cost over the values it reads now is estimated at {}, over the limit of {} for one evaluation",
        thousands(*estimate),
        thousands(PER_CALL_LIMIT)
    )]
    OverCall {
        /// The estimate.
        estimate: u64,
    },
    /// Over what the look at the resource has left.
    #[error(
        "its cost over the values it reads now is estimated at {}, over the {} left of the {} one look at a resource may spend",
        thousands(*estimate),
        thousands(*left),
        thousands(PER_LOOK_LIMIT)
    )]
    OverLook {
        /// The estimate.
        estimate: u64,
        /// What was left.
        left: u64,
    },
    /// The look ran past its deadline and was stopped.
    #[error("stopped: the look at this resource took longer than {}s", DEADLINE.as_secs())]
    Stopped,
}

/// Set when the look an evaluation belongs to has given up: the evaluation
/// stops at its next read of a variable.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Tells the evaluations to stop.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether they should.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a look at one resource may still spend on its expressions.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    cancel: Cancel,
}

impl Budget {
    /// The budget of one look: [`PER_LOOK_LIMIT`], stopped by `cancel`.
    pub fn per_look(cancel: Cancel) -> Self {
        Self {
            left: PER_LOOK_LIMIT,
            cancel,
        }
    }

    /// The budget of one evaluation alone.
    pub fn one_call() -> Self {
        Self {
            left: PER_CALL_LIMIT,
            cancel: Cancel::default(),
        }
    }

    /// Spends `estimate` on one evaluation, or says why it may not run.
    pub fn spend(&mut self, estimate: u64) -> Result<(), Refusal> {
        if self.cancel.is_set() {
            return Err(Refusal::Stopped);
        }
        if estimate > PER_CALL_LIMIT {
            return Err(Refusal::OverCall { estimate });
        }
        if estimate > self.left {
            return Err(Refusal::OverLook {
                estimate,
                left: self.left,
            });
        }
        self.left -= estimate;
        Ok(())
    }

    /// The flag that stops the evaluations.
    pub fn cancel(&self) -> &Cancel {
        &self.cancel
    }
}

/// A few threads off the async runtime for CEL: at most `slots`
/// evaluations at once; a look waits for one within its deadline.
#[derive(Debug)]
pub struct Evaluations {
    slots: Arc<Semaphore>,
    deadline: Duration,
}

/// Why a look at a resource's expressions gave no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Overdue {
    /// It ran (or waited for a thread) past the deadline.
    #[error("the look at this resource's expressions took longer than {0:?}; stopped")]
    Deadline(Duration),
    /// The evaluation panicked.
    #[error("the look at this resource's expressions failed")]
    Failed,
}

impl Evaluations {
    /// A pool of `slots` threads (at least one), each look within `deadline`.
    pub fn new(slots: usize, deadline: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            deadline,
        }
    }

    /// The operator's: as many threads as cores (at least two), within
    /// [`DEADLINE`].
    pub fn shared() -> &'static Self {
        static SHARED: std::sync::OnceLock<Evaluations> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            Self::new(cores.max(2), DEADLINE)
        })
    }

    /// Runs `job` on a thread of the pool with a fresh [`Cancel`], and
    /// waits for it until the deadline; past it, the job is told to stop
    /// (its thread is freed when it does) and the look gives up.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(Cancel) -> T + Send + 'static,
    ) -> Result<T, Overdue> {
        let started = tokio::time::Instant::now();
        let overdue = Overdue::Deadline(self.deadline);
        let slot = tokio::time::timeout(self.deadline, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| overdue.clone())?
            .map_err(|_| Overdue::Failed)?;
        let cancel = Cancel::default();
        let stop = cancel.clone();
        let handle = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job(cancel)
        });
        let left = self.deadline.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, handle).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(Overdue::Failed),
            Err(_) => {
                stop.set();
                Err(overdue)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_one_evaluation_over_the_limit_and_a_look_past_its_total() {
        let mut budget = Budget::per_look(Cancel::default());
        assert_eq!(
            budget.spend(PER_CALL_LIMIT + 1),
            Err(Refusal::OverCall {
                estimate: PER_CALL_LIMIT + 1
            })
        );
        for _ in 0..10 {
            budget.spend(PER_CALL_LIMIT).unwrap();
        }
        assert_eq!(
            budget.spend(1),
            Err(Refusal::OverLook {
                estimate: 1,
                left: 0
            })
        );
        let message = Refusal::OverCall {
            estimate: 2_500_000,
        }
        .to_string();
        assert!(
            message.contains("2,500,000") && message.contains("1,000,000"),
            "{message}"
        );
        let stopped = Budget::per_look(Cancel::default());
        stopped.cancel().set();
        assert_eq!(stopped.clone().spend(1), Err(Refusal::Stopped));
    }

    #[tokio::test]
    async fn a_look_past_its_deadline_gives_up_and_tells_the_job_to_stop() {
        let pool = Evaluations::new(1, Duration::from_millis(200));
        let (told, heard) = std::sync::mpsc::channel();
        let started = std::time::Instant::now();
        let result = pool
            .run(move |cancel| {
                while !cancel.is_set() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                told.send(()).unwrap();
            })
            .await;
        assert_eq!(result, Err(Overdue::Deadline(Duration::from_millis(200))));
        assert!(started.elapsed() < Duration::from_secs(2));
        heard
            .recv_timeout(Duration::from_secs(2))
            .expect("the job was told to stop");
        // Its thread is free again: the next look runs.
        assert_eq!(pool.run(|_| 42).await, Ok(42));
    }

    #[tokio::test]
    async fn a_look_waiting_for_a_busy_pool_gives_up_at_its_deadline_too() {
        let pool = Arc::new(Evaluations::new(1, Duration::from_millis(300)));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = pool.clone();
        let first = tokio::spawn(async move {
            busy.run(move |_| wait.recv_timeout(Duration::from_secs(5)))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = pool.run(|_| ()).await;
        assert_eq!(second, Err(Overdue::Deadline(Duration::from_millis(300))));
        release.send(()).unwrap();
        let _ = first.await;
    }
}
