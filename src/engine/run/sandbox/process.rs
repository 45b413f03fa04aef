//! One render worker process: started with limits, spoken to with a
//! deadline, killed when it overruns or misbehaves.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::protocol::{FRAME_LIMIT, Request, Response, write_frame};
use super::worker::WORKER_ARG;

/// The limits a worker runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest one request may take.
    pub time: Duration,
    /// Most memory the worker may map (RLIMIT_DATA), in bytes.
    pub memory: u64,
}

impl Limits {
    /// Two seconds per render, 256 MiB.
    pub const DEFAULT: Self = Self {
        time: Duration::from_secs(2),
        memory: 256 << 20,
    };
}

/// Why a request to a worker got no answer.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The worker could not be started.
    #[error("cannot start a render worker: {0}")]
    Start(std::io::Error),
    /// It did not answer in time (and was killed).
    #[error("the render took longer than {0:?}, the limit for one render")]
    Timeout(Duration),
    /// It died, or its pipe broke (and it was killed).
    #[error(
        "the render worker died ({0}): the template used more than the memory or stack a render may"
    )]
    Died(String),
}

/// A running worker.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// The template sets it holds parsed.
    pub loaded: std::collections::HashSet<u64>,
}

impl Worker {
    /// Starts `exe` as a worker under `limits`, with an empty environment
    /// and no file it may write.
    pub fn start(exe: &Path, limits: Limits) -> Result<Self, WorkerError> {
        let memory = limits.memory;
        let mut command = Command::new(exe);
        command
            .arg(WORKER_ARG)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (setrlimit, prctl) between
        // fork and exec.
        unsafe {
            command.pre_exec(move || confine(memory));
        }
        let mut child = command.spawn().map_err(WorkerError::Start)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(WorkerError::Start(std::io::Error::other("no pipes")));
        };
        Ok(Self {
            child,
            stdin,
            stdout,
            loaded: Default::default(),
        })
    }

    /// True while the process runs (a worker found dead between requests is
    /// replaced before it is asked anything).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `request` and waits at most `limit` for the answer. Any
    /// error leaves the worker unusable: the caller drops it (which kills it).
    pub fn ask(&mut self, request: &Request, limit: Duration) -> Result<Response, WorkerError> {
        let deadline = Instant::now() + limit;
        if let Err(e) = write_frame(&mut self.stdin, request) {
            return Err(self.died(e.to_string()));
        }
        let mut length = [0u8; 4];
        self.read_by(&mut length, deadline, limit)?;
        let length = u32::from_le_bytes(length) as usize;
        if length > FRAME_LIMIT {
            return Err(self.died(format!("an answer of {length} bytes")));
        }
        let mut bytes = vec![0u8; length];
        self.read_by(&mut bytes, deadline, limit)?;
        serde_json::from_slice(&bytes).map_err(|e| self.died(e.to_string()))
    }

    /// Fills `buf` from the worker's output before `deadline`.
    fn read_by(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), WorkerError> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !readable(&self.stdout, left) {
                return Err(WorkerError::Timeout(limit));
            }
            match self.stdout.read(&mut buf[filled..]) {
                Ok(0) => return Err(self.died("its output closed".into())),
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.died(e.to_string())),
            }
        }
        Ok(())
    }

    /// What became of the worker, for the error that ends it.
    fn died(&mut self, what: String) -> WorkerError {
        let _ = self.stdin.flush();
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .map(|s| {
                use std::os::unix::process::ExitStatusExt;
                match s.signal() {
                    Some(signal) => format!("signal {signal}"),
                    None => format!("exit {}", s.code().unwrap_or_default()),
                }
            })
            .unwrap_or(what);
        WorkerError::Died(status)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// True when `pipe` has something to read (or closed) within `wait`.
fn readable(pipe: &ChildStdout, wait: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: pipe.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd, for the length given.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    ready > 0
}

/// The worker's limits, set in the child before it runs: memory, no file
/// writes, no core dumps, few descriptors. (Not `PR_SET_PDEATHSIG`: it
/// fires when the *thread* that started the worker ends, and the runtime
/// retires its blocking threads; the worker watches its parent itself.)
fn confine(memory: u64) -> std::io::Result<()> {
    let set = |resource, value: u64| {
        let limit = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: a valid rlimit for a valid resource.
        if unsafe { libc::setrlimit(resource, &limit) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::RLIMIT_DATA, memory)?;
    set(libc::RLIMIT_FSIZE, 0)?;
    set(libc::RLIMIT_CORE, 0)?;
    set(libc::RLIMIT_NOFILE, 16)?;
    Ok(())
}
