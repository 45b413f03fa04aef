//! Templates of kinds defined in the cluster render in the sandbox: child
//! processes of the operator (the same binary, `__render-worker`), each
//! with an empty environment, no file it may write, a memory limit, and a
//! deadline per render after which it is killed and replaced. A template
//! that recurses until the stack overflows, builds a gigabyte, loops for
//! an hour or reads the environment costs one render worker and gives its
//! resource `RenderFailed` (its definition `Accepted=False`, when the
//! example render at definition time already shows it); the operator, its
//! probes and every other resource carry on.
//!
//! Kind folders shipped with the operator (the kustomize directories it
//! starts with) are its administrator's configuration, like the Rust
//! kinds, and render in process, with the same functions and checks
//! (`engine::model::templates`).
//!
//! Renders are synchronous (a kind's plan is): a caller on a
//! multi-threaded tokio runtime hands its worker thread over
//! (`block_in_place`) while it waits, so a slow render never stalls the
//! runtime.

mod process;
mod protocol;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::engine::model::templates::{Isolation, TemplateError, TemplateSources};
use process::{Limits, Worker, WorkerError};
use protocol::{Request, Response};

/// A pool of render workers.
#[derive(Debug)]
pub struct Sandbox {
    exe: PathBuf,
    limits: Limits,
    slots: Vec<Mutex<Option<Worker>>>,
    next: AtomicUsize,
}

impl Sandbox {
    /// The argument that makes the binary a render worker.
    pub const WORKER_ARG: &str = worker::WORKER_ARG;
    /// How long one render may take unless the operator says.
    pub const DEFAULT_TIME: Duration = Limits::DEFAULT.time;
    /// The memory a worker may map unless the operator says, in bytes.
    pub const DEFAULT_MEMORY: u64 = Limits::DEFAULT.memory;

    /// A pool of `workers` (at least one) started from `exe` when first
    /// needed, each allowed `time` per render and `memory` bytes.
    pub fn new(exe: PathBuf, workers: usize, time: Duration, memory: u64) -> Self {
        Self {
            exe,
            limits: Limits { time, memory },
            slots: (0..workers.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs this process as a render worker (started with
    /// [`Sandbox::WORKER_ARG`]): serves its parent until it goes.
    pub fn serve_worker() -> ExitCode {
        worker::serve()
    }

    /// A free slot, or the next one in turn (waiting for it).
    fn slot(&self) -> MutexGuard<'_, Option<Worker>> {
        for slot in &self.slots {
            if let Ok(guard) = slot.try_lock() {
                return guard;
            }
        }
        let k = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        crate::sync::lock(&self.slots[k])
    }

    fn render_now(
        &self,
        set: &TemplateSources,
        name: &str,
        context: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        let failed = |reason: String| TemplateError::Render {
            name: name.to_string(),
            reason,
        };
        let mut slot = self.slot();
        if slot.as_mut().is_some_and(|worker| !worker.alive()) {
            *slot = None;
        }
        for _ in 0..2 {
            let worker = match slot.as_mut() {
                Some(worker) => worker,
                None => slot.insert(
                    Worker::start(&self.exe, self.limits).map_err(|e| failed(e.to_string()))?,
                ),
            };
            let result = load(worker, set, self.limits).and_then(|()| {
                let request = Request::Render {
                    id: set.id,
                    name: name.to_string(),
                    context: context.clone(),
                };
                Ok(worker.ask(&request, self.limits.time)?)
            });
            match result {
                Ok(Response::Rendered(text)) => return Ok(text),
                Ok(Response::Failed(reason)) => return Err(failed(reason)),
                // Forgotten (it keeps a bounded number of sets): load again.
                Ok(Response::UnknownSet) => {
                    worker.loaded.remove(&set.id);
                }
                Ok(Response::Loaded) => {
                    return Err(failed("the render worker answered out of turn".into()));
                }
                Err(LoadError::Failed(e)) => return Err(e),
                Err(LoadError::Worker(e)) => {
                    *slot = None;
                    return Err(failed(e.to_string()));
                }
            }
        }
        Err(failed(
            "the render worker keeps forgetting the templates".into(),
        ))
    }
}

/// Why loading a set failed.
enum LoadError {
    /// The set does not parse or is refused.
    Failed(TemplateError),
    /// The worker misbehaved (killed).
    Worker(WorkerError),
}

impl From<WorkerError> for LoadError {
    fn from(e: WorkerError) -> Self {
        Self::Worker(e)
    }
}

fn load(worker: &mut Worker, set: &TemplateSources, limits: Limits) -> Result<(), LoadError> {
    if worker.loaded.contains(&set.id) {
        return Ok(());
    }
    let request = Request::Load(set.clone());
    match worker.ask(&request, limits.time)? {
        Response::Loaded => {
            worker.loaded.insert(set.id);
            Ok(())
        }
        Response::Failed(reason) => Err(LoadError::Failed(TemplateError::Invalid {
            name: "the templates".into(),
            reason,
        })),
        other => Err(LoadError::Failed(TemplateError::Invalid {
            name: "the templates".into(),
            reason: format!("the render worker answered {other:?}"),
        })),
    }
}

impl Isolation for Sandbox {
    fn render(
        &self,
        set: &TemplateSources,
        name: &str,
        context: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        let multi_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_threaded {
            tokio::task::block_in_place(|| self.render_now(set, name, context))
        } else {
            self.render_now(set, name, context)
        }
    }
}
