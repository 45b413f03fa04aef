//! Where and within what a kind file's CEL runs: a [`Budget`] per look at
//! a resource (what each evaluation may cost, estimated over the values it
//! reads, and what all of them may cost together), and a small pool of
//! threads off the async runtime ([`Evaluations`]) with a deadline, past
//! which the look gives up, the evaluation is told to stop, and the
//! resource reports it over budget, naming the field it was in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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

/// One look at a resource's expressions, as its evaluations and its pool
/// share it: given up or not (an evaluation stops at its next read of a
/// variable once it is), and which of the kind file's fields it is in.
#[derive(Debug, Clone, Default)]
pub struct Look {
    cancelled: Arc<AtomicBool>,
    at: Arc<Mutex<String>>,
}

impl Look {
    /// Gives the look up: its evaluations stop.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether it was given up.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Records that it evaluates the kind file's `field` now.
    pub fn entering(&self, field: &str) {
        let mut at = crate::sync::lock(&self.at);
        at.clear();
        at.push_str(field);
    }

    /// The field it evaluates now (empty before the first).
    pub fn at(&self) -> String {
        crate::sync::lock(&self.at).clone()
    }
}

/// What a look at one resource may still spend on its expressions.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    look: Look,
}

impl Budget {
    /// The budget of `look`: [`PER_LOOK_LIMIT`].
    pub fn per_look(look: Look) -> Self {
        Self {
            left: PER_LOOK_LIMIT,
            look,
        }
    }

    /// The budget of one evaluation alone.
    pub fn one_call() -> Self {
        Self {
            left: PER_CALL_LIMIT,
            look: Look::default(),
        }
    }

    /// Spends `estimate` on one evaluation, or says why it may not run.
    pub fn spend(&mut self, estimate: u64) -> Result<(), Refusal> {
        if self.look.is_cancelled() {
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

    /// The look it belongs to.
    pub fn look(&self) -> &Look {
        &self.look
    }
}

/// A few threads off the async runtime for CEL: at most `slots` looks
/// at once; a look waits for one, then runs, each within the deadline.
#[derive(Debug)]
pub struct Evaluations {
    slots: Arc<Semaphore>,
    deadline: Duration,
}

/// Why a look at a resource's expressions gave no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Overdue {
    /// Every thread stayed busy with other looks for the whole deadline:
    /// nothing of this resource's was run; it is looked at again.
    #[error("waiting for a thread to evaluate its expressions: all were busy for {}s", .0.as_secs())]
    Busy(Duration),
    /// It ran past the deadline, in the kind file's field `at`, and was
    /// given up.
    #[error("{at}: stopped: the look at this resource's expressions ran past its deadline of {}s", after.as_secs())]
    Deadline {
        /// The deadline.
        after: Duration,
        /// The field it was in.
        at: String,
    },
    /// It panicked.
    #[error("the look at this resource's expressions failed (the CEL evaluator panicked)")]
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

    /// Runs `job` on a thread of the pool with a fresh [`Look`], once one
    /// is free (within the deadline), and waits for it until the deadline;
    /// past it, the look is given up (its thread is freed when the job
    /// stops).
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(Look) -> T + Send + 'static,
    ) -> Result<T, Overdue> {
        let slot = tokio::time::timeout(self.deadline, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| Overdue::Busy(self.deadline))?
            .map_err(|_| Overdue::Failed)?;
        let look = Look::default();
        let given = look.clone();
        let handle = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job(given)
        });
        match tokio::time::timeout(self.deadline, handle).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(Overdue::Failed),
            Err(_) => {
                look.cancel();
                Err(Overdue::Deadline {
                    after: self.deadline,
                    at: look.at(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_one_evaluation_over_the_limit_and_a_look_past_its_total() {
        let mut budget = Budget::per_look(Look::default());
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
        let stopped = Budget::per_look(Look::default());
        stopped.look().cancel();
        assert_eq!(stopped.clone().spend(1), Err(Refusal::Stopped));
    }

    #[tokio::test]
    async fn a_look_past_its_deadline_gives_up_and_tells_the_job_to_stop() {
        let pool = Evaluations::new(1, Duration::from_millis(200));
        let (told, heard) = std::sync::mpsc::channel();
        let started = std::time::Instant::now();
        let result = pool
            .run(move |look| {
                look.entering("spec.status[0].expression");
                while !look.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                told.send(()).unwrap();
            })
            .await;
        let overdue = Overdue::Deadline {
            after: Duration::from_millis(200),
            at: "spec.status[0].expression".into(),
        };
        assert_eq!(result, Err(overdue));
        assert!(started.elapsed() < Duration::from_secs(2));
        heard
            .recv_timeout(Duration::from_secs(2))
            .expect("the job was told to stop");
        // Its thread is free again: the next look runs.
        assert_eq!(pool.run(|_| 42).await, Ok(42));
    }

    #[tokio::test]
    async fn a_look_waiting_for_a_busy_pool_gives_up_at_its_deadline_without_running() {
        let pool = Arc::new(Evaluations::new(1, Duration::from_millis(300)));
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = pool.clone();
        let first = tokio::spawn(async move {
            busy.run(move |_| wait.recv_timeout(Duration::from_secs(5)))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = pool.run(|_| ()).await;
        assert_eq!(second, Err(Overdue::Busy(Duration::from_millis(300))));
        release.send(()).unwrap();
        let _ = first.await;
    }
}
