//! Runs kubectl: an argv vector (never a shell), a timeout after which the
//! process and its children are killed, a global concurrency limit, and
//! stdout/stderr captured up to a cap (the tail is kept). kubectl's own
//! cache (discovery and HTTP) is kept under one directory between runs;
//! [`cache`] says when its discovery is forgotten.

mod cache;

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tracing::Instrument;

pub use self::cache::{group_of, unserved_resources};

/// An error that prevented kubectl from running at all.
#[derive(Debug, thiserror::Error)]
pub enum KubectlError {
    /// No kubectl executable was found.
    #[error("kubectl not found on PATH; install it or pass --kubectl / KUBECTL")]
    NotFound,
    /// The configured kubectl path is not an executable file.
    #[error("kubectl at {0} is not an executable file")]
    NotExecutable(PathBuf),
    /// The process could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The executable.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// How kubectl is run.
#[derive(Debug, Clone)]
pub struct KubectlConfig {
    /// The executable.
    pub path: PathBuf,
    /// After this long the process group is killed.
    pub timeout: Duration,
    /// At most this many kubectl processes run at once.
    pub max_concurrent: usize,
    /// kubectl's `--cache-dir` (discovery and HTTP cache), kept between runs.
    pub cache_dir: Option<PathBuf>,
    /// Bytes kept of each of stdout and stderr (the tail).
    pub output_cap: usize,
}

impl KubectlConfig {
    /// The configuration of a one-shot command (`diff`, `crd`, `rbac`):
    /// the kubectl at `explicit` or on PATH, one run at a time, a minute
    /// each, no cache, 64 KiB of each stream kept.
    pub fn one_shot(explicit: Option<&Path>) -> Result<Self, KubectlError> {
        Ok(Self {
            path: Self::locate(explicit)?,
            timeout: Duration::from_secs(60),
            max_concurrent: 1,
            cache_dir: None,
            output_cap: 64 * 1024,
        })
    }

    /// Finds kubectl: `explicit` if given (it must be executable), else on PATH.
    pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, KubectlError> {
        match explicit {
            Some(path) => {
                let resolved = which::which(path)
                    .map_err(|_| KubectlError::NotExecutable(path.to_path_buf()))?;
                Ok(resolved)
            }
            None => which::which("kubectl").map_err(|_| KubectlError::NotFound),
        }
    }
}

/// Bytes the operator keeps of each stream of a run (the tail): four
/// times what a status records of it (2 KiB; checked where the status
/// says it).
pub const RUN_OUTPUT_CAP: usize = 8 * 1024;

/// The most a `kubectl kustomize` (a larger overlay is refused) or a
/// `kubectl diff` may print.
pub const BUILD_OUTPUT_CAP: usize = 64 * 1024 * 1024;

/// A kubectl command the engine runs. Every command line the operator runs
/// is built here, from data: values never become flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `kubectl kustomize DIR`: builds an overlay.
    Build {
        /// The overlay directory.
        dir: PathBuf,
    },
    /// `kubectl apply --server-side --field-manager=M [--force-conflicts] -f -`:
    /// applies the objects given on standard input.
    Apply {
        /// The field manager.
        field_manager: String,
        /// Take fields owned by other managers.
        force_conflicts: bool,
        /// The user to act as (`--as`); `None`: the operator itself.
        impersonate: Option<String>,
    },
    /// `kubectl [--as=USER] delete [--namespace=NS] --ignore-not-found=true --wait=false -- TYPE/NAME...`.
    Delete {
        /// The namespace of the objects; `None` for cluster-scoped ones.
        namespace: Option<String>,
        /// `resource.group/name` of each object.
        objects: Vec<String>,
        /// The user to act as (`--as`); `None`: the operator itself.
        impersonate: Option<String>,
    },
    /// `kubectl [--as=USER] delete --raw=PATH -f -`: deletes one object by
    /// its API path, with the `DeleteOptions` given on standard input (a
    /// UID precondition: an object replaced since it was read is not
    /// deleted). kubectl prints the API server's answer, which may hold
    /// the deleted object's data: the runner keeps none of it.
    DeleteObject {
        /// The object's API path (`/apis/apps/v1/namespaces/a/deployments/web`).
        path: String,
        /// The user to act as (`--as`); `None`: the operator itself.
        impersonate: Option<String>,
    },
    /// `kubectl diff --server-side --field-manager=M [--force-conflicts]
    /// (-k DIR | -f -)`: what an apply would change (a server-side dry
    /// run). Exits 0 when nothing would, 1 when something would.
    Diff {
        /// The field manager.
        field_manager: String,
        /// Take fields owned by other managers.
        force_conflicts: bool,
        /// The overlay directory; `None`: the objects on standard input.
        dir: Option<PathBuf>,
    },
}

impl Invocation {
    /// The verb, for metrics and messages.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Build { .. } => "kustomize",
            Self::Apply { .. } => "apply",
            Self::Delete { .. } | Self::DeleteObject { .. } => "delete",
            Self::Diff { .. } => "diff",
        }
    }

    /// The arguments after `kubectl`.
    pub fn args(&self) -> Vec<String> {
        match self {
            Self::Build { dir } => vec!["kustomize".into(), dir.display().to_string()],
            Self::Apply {
                field_manager,
                force_conflicts,
                impersonate,
            } => {
                let mut args = as_user(impersonate.as_deref());
                args.extend([
                    "apply".to_string(),
                    "--server-side".into(),
                    format!("--field-manager={field_manager}"),
                ]);
                if *force_conflicts {
                    args.push("--force-conflicts".into());
                }
                args.extend(["-f".into(), "-".into()]);
                args
            }
            Self::Delete {
                namespace,
                objects,
                impersonate,
            } => {
                let mut args = as_user(impersonate.as_deref());
                args.push("delete".to_string());
                if let Some(ns) = namespace {
                    args.push(format!("--namespace={ns}"));
                }
                args.extend([
                    "--ignore-not-found=true".into(),
                    "--wait=false".into(),
                    "--".into(),
                ]);
                args.extend(objects.iter().cloned());
                args
            }
            Self::DeleteObject { path, impersonate } => {
                let mut args = as_user(impersonate.as_deref());
                args.extend([
                    "delete".to_string(),
                    format!("--raw={path}"),
                    "-f".into(),
                    "-".into(),
                ]);
                args
            }
            Self::Diff {
                field_manager,
                force_conflicts,
                dir,
            } => {
                let mut args = vec![
                    "diff".to_string(),
                    "--server-side".into(),
                    format!("--field-manager={field_manager}"),
                ];
                if *force_conflicts {
                    args.push("--force-conflicts".into());
                }
                match dir {
                    Some(dir) => args.extend(["-k".into(), dir.display().to_string()]),
                    None => args.extend(["-f".into(), "-".into()]),
                }
                args
            }
        }
    }

    /// True when standard output may hold object data the runner must not
    /// keep (a raw delete prints the deleted object, Secret data included).
    pub fn discards_stdout(&self) -> bool {
        matches!(self, Self::DeleteObject { .. })
    }
}

/// `--as=USER`, when acting as someone.
fn as_user(user: Option<&str>) -> Vec<String> {
    user.map(|u| vec![format!("--as={u}")]).unwrap_or_default()
}

/// Where a Pod's ServiceAccount credentials are mounted.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// In a Pod without a kubeconfig, writes `dir/in-cluster.kubeconfig`, which
/// says what kubectl's in-cluster configuration says (the API server from
/// `KUBERNETES_SERVICE_HOST`/`_PORT`, the mounted CA and token, by path: no
/// secret in the file, and a rotated token is read again by each run), and
/// returns its path; None outside a Pod or with a kubeconfig. kubectl uses
/// its in-cluster configuration only when no flag configures the client, so
/// `--as` (writing as a tenant's account) would otherwise send it to
/// http://localhost:8080 (kubernetes/kubernetes#93474).
pub fn in_cluster_kubeconfig(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let home_config = std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube/config"));
    let token = Path::new(SERVICE_ACCOUNT_DIR).join("token");
    let (Ok(host), Ok(port)) = (
        std::env::var("KUBERNETES_SERVICE_HOST"),
        std::env::var("KUBERNETES_SERVICE_PORT"),
    ) else {
        return Ok(None);
    };
    if std::env::var_os("KUBECONFIG").is_some()
        || home_config.is_some_and(|c| c.exists())
        || !token.exists()
    {
        return Ok(None);
    }
    let document = in_cluster_document(&host, &port, Path::new(SERVICE_ACCOUNT_DIR));
    std::fs::create_dir_all(dir)?;
    let path = dir.join("in-cluster.kubeconfig");
    std::fs::write(&path, document.to_string())?;
    Ok(Some(path))
}

/// The kubeconfig of [`in_cluster_kubeconfig`], as data (JSON is YAML).
fn in_cluster_document(host: &str, port: &str, service_account: &Path) -> serde_json::Value {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority": service_account.join("ca.crt"),
        }}],
        "users": [{"name": "service-account", "user": {"tokenFile": service_account.join("token")}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    })
}

/// What one kubectl run did. Stored (trimmed) in every resource's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandRecord {
    /// The command line, quoted for reading (it was run without a shell).
    pub command: String,
    /// The exit code; absent when the process was killed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The tail of standard output.
    pub stdout: String,
    /// The tail of standard error.
    pub stderr: String,
    /// When the process started.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub started_at: jiff::Timestamp,
    /// How long it ran.
    pub duration_ms: u64,
    /// True when it was killed at the timeout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// When the run applied several resources' overlays at once: how many.
    /// `stdout` then holds only the lines about this resource's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    /// More was printed than the runner keeps (never stored).
    #[serde(skip)]
    #[schemars(skip)]
    pub output_truncated: bool,
}

impl CommandRecord {
    /// True when kubectl exited with code 0.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// A one-line summary of the outcome: the first meaningful output line.
    pub fn summary(&self) -> String {
        if self.timed_out {
            return format!("kubectl timed out after {} ms", self.duration_ms);
        }
        let preferred = if self.succeeded() {
            [&self.stdout, &self.stderr]
        } else {
            [&self.stderr, &self.stdout]
        };
        preferred
            .iter()
            .flat_map(|s| s.lines())
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("Warning:") && !l.starts_with("[output"))
            .map(str::to_string)
            .unwrap_or_else(|| match self.exit_code {
                Some(code) => format!("kubectl exited with code {code}"),
                None => "kubectl was killed".into(),
            })
    }
}

/// Counts of kubectl runs, for metrics and tests.
#[derive(Debug, Default)]
pub struct KubectlStats {
    spawned: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    waiting: AtomicU64,
    running: AtomicU64,
}

/// Counts one in a live gauge of [`KubectlStats`] while it exists.
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl KubectlStats {
    /// Processes started since the operator started.
    pub fn spawned(&self) -> u64 {
        self.spawned.load(Ordering::Relaxed)
    }
    /// Runs that did not exit 0.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Runs killed at the timeout.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }
    /// Runs waiting for a concurrency slot now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }
    /// kubectl processes running now.
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }
}

/// A callback told about every finished run: verb, exit code, duration.
pub type RunObserver = Arc<dyn Fn(&str, Option<i32>, Duration) + Send + Sync>;

/// The kubectl runner shared by every controller.
#[derive(Clone)]
pub struct Kubectl {
    config: Arc<KubectlConfig>,
    permits: Arc<Semaphore>,
    stats: Arc<KubectlStats>,
    observer: Option<RunObserver>,
    running: Arc<std::sync::Mutex<std::collections::HashSet<u32>>>,
    /// `KUBECONFIG` for the children ([`in_cluster_kubeconfig`]).
    kubeconfig: Option<PathBuf>,
}

impl std::fmt::Debug for Kubectl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubectl")
            .field("config", &self.config)
            .finish()
    }
}

impl Kubectl {
    /// A runner with the given configuration.
    pub fn new(config: KubectlConfig) -> Self {
        let permits = Arc::new(Semaphore::new(config.max_concurrent.max(1)));
        Self {
            config: Arc::new(config),
            permits,
            stats: Arc::default(),
            observer: None,
            running: Arc::default(),
            kubeconfig: None,
        }
    }

    /// Runs kubectl with `KUBECONFIG=path` ([`in_cluster_kubeconfig`]).
    pub fn with_kubeconfig(mut self, path: PathBuf) -> Self {
        self.kubeconfig = Some(path);
        self
    }

    /// Kills every kubectl process group running now (shutdown past its
    /// grace period). Their runs end as killed and are recorded as such.
    pub fn kill_all(&self) {
        let running = crate::sync::lock(&self.running);
        for pid in running.iter() {
            ProcessGroup(Some(*pid)).kill();
        }
    }

    /// kubectl processes running now.
    pub fn running(&self) -> usize {
        crate::sync::lock(&self.running).len()
    }

    /// Calls `observer` after every run (used for metrics).
    pub fn with_observer(mut self, observer: RunObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Forgets what kubectl's discovery cache knows of the API group
    /// `group` (`""`: the core group), so that the next run asks the API
    /// server how it serves the group's kinds now (a CRD of the group
    /// changed, or kubectl was told a resource is not served).
    pub fn forget_discovery_of(&self, group: &str) {
        let Some(dir) = &self.config.cache_dir else {
            return;
        };
        match cache::forget_group(dir, group) {
            Ok(0) => {}
            Ok(_) => tracing::debug!(group, "forgot kubectl's discovery of the group"),
            Err(e) => {
                tracing::warn!(group, dir = %dir.display(), error = %e, "cannot forget kubectl's discovery of the group: kubectl may use it for up to 6 hours");
            }
        }
    }

    /// Forgets kubectl's whole discovery cache (at start: what a run
    /// before this one cached may be hours old).
    pub fn forget_all_discovery(&self) {
        let Some(dir) = &self.config.cache_dir else {
            return;
        };
        if let Err(e) = cache::forget_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot forget kubectl's discovery cache: kubectl may use it for up to 6 hours");
        }
    }

    /// Run counters.
    pub fn stats(&self) -> &KubectlStats {
        &self.stats
    }

    /// Run counters, shared (e.g. with the metrics endpoint).
    pub fn shared_stats(&self) -> Arc<KubectlStats> {
        self.stats.clone()
    }

    /// Runs `invocation`, feeding `stdin` if given. Waits for a concurrency
    /// permit first. A non-zero exit or a timeout is a normal outcome
    /// recorded in the returned [`CommandRecord`]; only a failure to start
    /// the process is an error.
    pub async fn run(
        &self,
        invocation: &Invocation,
        stdin: Option<Vec<u8>>,
    ) -> Result<CommandRecord, KubectlError> {
        let waiting = Counted::new(&self.stats.waiting);
        let permit = self.acquire().await;
        drop(waiting);
        self.run_with(permit, invocation, stdin).await
    }

    /// Waits for a concurrency slot.
    pub async fn acquire(&self) -> Slot {
        Slot {
            _permit: self.permits.clone().acquire_owned().await.ok(),
        }
    }

    /// Like [`Kubectl::run`], with a slot already held (released when the run ends).
    /// Its log lines carry a `kubectl` span naming the verb.
    pub async fn run_with(
        &self,
        slot: Slot,
        invocation: &Invocation,
        stdin: Option<Vec<u8>>,
    ) -> Result<CommandRecord, KubectlError> {
        let span = tracing::info_span!("kubectl", verb = invocation.verb());
        let record = self
            .run_in_span(slot, invocation, stdin)
            .instrument(span.clone())
            .await?;
        span.in_scope(|| {
            tracing::debug!(
                exit_code = record.exit_code,
                duration_ms = record.duration_ms,
                timed_out = record.timed_out,
                "kubectl ran"
            );
        });
        Ok(record)
    }

    async fn run_in_span(
        &self,
        slot: Slot,
        invocation: &Invocation,
        stdin: Option<Vec<u8>>,
    ) -> Result<CommandRecord, KubectlError> {
        let _slot = slot;
        let _running = Counted::new(&self.stats.running);
        let argv = self.argv(invocation);
        let started_at = jiff::Timestamp::now();
        let start = Instant::now();
        let mut child = self.spawn(&argv, stdin.is_some())?;
        self.stats.spawned.fetch_add(1, Ordering::Relaxed);
        let group = ProcessGroup(child.id());
        let _registered = child.id().map(|pid| Registered::new(&self.running, pid));
        let stdout_cap = match invocation {
            Invocation::Build { .. } | Invocation::Diff { .. } => BUILD_OUTPUT_CAP,
            i if i.discards_stdout() => 0,
            _ => self.config.output_cap,
        };
        let stdout = child
            .stdout
            .take()
            .map(|s| tokio::spawn(read_tail(s, stdout_cap)));
        let stderr = child
            .stderr
            .take()
            .map(|s| tokio::spawn(read_tail(s, self.config.output_cap)));
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            tokio::spawn(async move {
                let _ = pipe.write_all(&input).await;
            });
        }
        let (exit_code, timed_out) = self.wait(&mut child, &group).await;
        let (out, err) = tokio::join!(collect(stdout), collect(stderr));
        let duration = start.elapsed();
        let record = CommandRecord {
            command: display_command(&self.config.path, &argv),
            exit_code,
            output_truncated: out.total > out.bytes.len() as u64,
            stdout: out.into_string(),
            stderr: err.into_string(),
            started_at,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            timed_out,
            batch_size: None,
        };
        self.count(&record, invocation, duration);
        Ok(record)
    }

    /// The full argument vector: the shared cache dir, then the invocation's.
    fn argv(&self, invocation: &Invocation) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some(dir) = &self.config.cache_dir {
            argv.push(format!("--cache-dir={}", dir.display()).into());
        }
        argv.extend(invocation.args().into_iter().map(OsString::from));
        argv
    }

    fn spawn(&self, argv: &[OsString], with_stdin: bool) -> Result<Child, KubectlError> {
        let mut command = Command::new(&self.config.path);
        if let Some(kubeconfig) = &self.kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        command
            .args(argv)
            .stdin(if with_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|source| KubectlError::Spawn {
                path: self.config.path.clone(),
                source,
            })
    }

    /// Waits for the process up to the timeout; then kills its group.
    /// Returns the exit code (none when killed) and whether it timed out.
    async fn wait(&self, child: &mut Child, group: &ProcessGroup) -> (Option<i32>, bool) {
        let waited = tokio::time::timeout(self.config.timeout, child.wait()).await;
        let result = match waited {
            Ok(Ok(status)) => (status.code(), false),
            Ok(Err(_)) => (None, false),
            Err(_) => {
                group.kill();
                let _ = child.kill().await;
                (None, true)
            }
        };
        // The direct child is gone; anything it left behind goes with the group.
        group.kill();
        result
    }

    fn count(&self, record: &CommandRecord, invocation: &Invocation, duration: Duration) {
        if !record.succeeded() {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        if record.timed_out {
            self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(observer) = &self.observer {
            observer(invocation.verb(), record.exit_code, duration);
        }
    }
}

/// The output a reader task gathered (empty if it did not finish in time).
async fn collect(task: Option<tokio::task::JoinHandle<Tail>>) -> Tail {
    match task {
        Some(t) => tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default(),
        None => Tail::default(),
    }
}

/// Keeps a running process group in the runner's registry while it lives.
struct Registered {
    set: Arc<std::sync::Mutex<std::collections::HashSet<u32>>>,
    pid: u32,
}

impl Registered {
    fn new(set: &Arc<std::sync::Mutex<std::collections::HashSet<u32>>>, pid: u32) -> Self {
        crate::sync::lock(set).insert(pid);
        Self {
            set: set.clone(),
            pid,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        crate::sync::lock(&self.set).remove(&self.pid);
    }
}

/// A held kubectl concurrency slot.
#[derive(Debug)]
pub struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Kills a process group when asked or when dropped (a cancelled reconcile
/// must not leave kubectl or its children running).
struct ProcessGroup(Option<u32>);

impl ProcessGroup {
    fn kill(&self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: killpg only sends a signal; the group was created for
            // this child by process_group(0), so no foreign process is hit.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `cap` bytes of a stream and how many bytes it carried in all.
#[derive(Debug, Default)]
struct Tail {
    bytes: VecDeque<u8>,
    total: u64,
}

impl Tail {
    fn into_string(self) -> String {
        let kept = self.bytes.len() as u64;
        let text = String::from_utf8_lossy(&Vec::from(self.bytes)).into_owned();
        if self.total > kept {
            format!(
                "[output truncated: {} of {} bytes omitted]\n{text}",
                self.total - kept,
                self.total
            )
        } else {
            text
        }
    }
}

async fn read_tail(mut stream: impl AsyncRead + Unpin, cap: usize) -> Tail {
    let mut tail = Tail::default();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.total += n as u64;
                tail.bytes.extend(&chunk[..n]);
                let excess = tail.bytes.len().saturating_sub(cap);
                tail.bytes.drain(..excess);
            }
        }
    }
    tail
}

/// The command line as a reader would type it (POSIX-shell quoting).
pub fn display_command(program: &Path, argv: &[OsString]) -> String {
    let program = program
        .file_name()
        .map_or_else(|| program.to_string_lossy(), |n| n.to_string_lossy());
    std::iter::once(program.into_owned())
        .chain(argv.iter().map(|a| shell_quote(&a.to_string_lossy())))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Stand-ins for kubectl in unit tests: shell scripts.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Writes `dir/kubectl`, a shell script running `body`.
    ///
    /// The executable is written by a child process (`install`), not by this
    /// one: a file this process held open for writing could be inherited by
    /// a process another test forks at that moment, and executing it would
    /// then fail with "text file busy" (ETXTBSY).
    pub(crate) fn script(dir: &Path, body: &str) -> PathBuf {
        let source = dir.join("kubectl.sh");
        std::fs::write(&source, format!("#!/bin/sh\n{body}\n")).unwrap();
        let path = dir.join("kubectl");
        let installed = std::process::Command::new("install")
            .args(["-m", "755"])
            .arg(&source)
            .arg(&path)
            .status()
            .unwrap();
        assert!(installed.success(), "install {}", path.display());
        path
    }

    /// A runner of the script at `path`.
    pub(crate) fn runner(path: PathBuf, timeout: Duration, cap: usize) -> Kubectl {
        Kubectl::new(KubectlConfig {
            path,
            timeout,
            max_concurrent: 2,
            cache_dir: None,
            output_cap: cap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{runner, script};
    use super::*;

    #[test]
    fn the_in_cluster_kubeconfig_names_the_service_and_the_mounted_credentials() {
        let sa = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
        let doc = in_cluster_document("10.96.0.1", "443", sa);
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"],
            "https://10.96.0.1:443"
        );
        assert_eq!(
            doc["clusters"][0]["cluster"]["certificate-authority"],
            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
        );
        assert_eq!(
            doc["users"][0]["user"]["tokenFile"],
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        );
        assert_eq!(doc["current-context"], "in-cluster");
        let v6 = in_cluster_document("fd00::1", "6443", sa);
        assert_eq!(
            v6["clusters"][0]["cluster"]["server"],
            "https://[fd00::1]:6443"
        );
    }

    fn build(dir: &str) -> Invocation {
        Invocation::Build { dir: dir.into() }
    }

    fn apply() -> Invocation {
        Invocation::Apply {
            field_manager: "m".into(),
            force_conflicts: false,
            impersonate: None,
        }
    }

    #[tokio::test]
    async fn success_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(
                dir.path(),
                r#"echo "deployment.apps/x configured"; echo "$@" >&2"#,
            ),
            Duration::from_secs(10),
            1024,
        );
        let r = k.run(&build("/tmp/a b"), None).await.unwrap();
        assert!(r.succeeded());
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(r.summary(), "deployment.apps/x configured");
        assert_eq!(r.stderr.trim(), "kustomize /tmp/a b");
        assert_eq!(r.command, "kubectl kustomize '/tmp/a b'");
        assert_eq!(k.stats().spawned(), 1);
    }

    #[tokio::test]
    async fn failure_keeps_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(dir.path(), "echo 'error: boom' >&2; exit 3"),
            Duration::from_secs(10),
            1024,
        );
        let r = k.run(&apply(), None).await.unwrap();
        assert!(!r.succeeded());
        assert_eq!(r.exit_code, Some(3));
        assert_eq!(r.summary(), "error: boom");
        assert_eq!(k.stats().failed(), 1);
    }

    #[tokio::test]
    async fn hanging_process_and_children_are_killed_at_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child.pid");
        let k = runner(
            script(
                dir.path(),
                &format!("sleep 30 & echo $! > {}; wait", marker.display()),
            ),
            Duration::from_millis(300),
            1024,
        );
        let start = Instant::now();
        let r = k.run(&apply(), None).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(r.timed_out);
        assert!(!r.succeeded());
        assert!(r.summary().contains("timed out"));
        let child: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The grandchild (sleep) must be gone too.
        let alive = unsafe { libc::kill(child, 0) } == 0
            && !std::fs::read_to_string(format!("/proc/{child}/stat"))
                .unwrap_or_default()
                .contains(") Z");
        assert!(!alive, "child {child} survived the timeout");
        assert_eq!(k.stats().timed_out(), 1);
    }

    #[tokio::test]
    async fn huge_output_is_capped_to_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(
                dir.path(),
                "head -c 5000000 /dev/zero | tr '\\0' 'a'; echo END",
            ),
            Duration::from_secs(20),
            2048,
        );
        let r = k.run(&apply(), None).await.unwrap();
        assert!(r.stdout.len() < 2200, "{}", r.stdout.len());
        assert!(r.stdout.starts_with("[output truncated"));
        assert!(r.stdout.ends_with("END\n"));
    }

    #[tokio::test]
    async fn waiting_and_running_runs_are_counted_while_they_last() {
        let dir = tempfile::tempdir().unwrap();
        let gate = dir.path().join("go");
        let k = Kubectl::new(KubectlConfig {
            path: script(
                dir.path(),
                &format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display()),
            ),
            timeout: Duration::from_secs(20),
            max_concurrent: 1,
            cache_dir: None,
            output_cap: 1024,
        });
        let runs: Vec<_> = (0..3)
            .map(|_| {
                let k = k.clone();
                tokio::spawn(async move { k.run(&apply(), None).await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while (k.stats().running(), k.stats().waiting()) != (1, 2) {
            assert!(
                Instant::now() < deadline,
                "never saw 1 running and 2 waiting"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::write(&gate, "").unwrap();
        for run in runs {
            assert!(run.await.unwrap().unwrap().succeeded());
        }
        assert_eq!((k.stats().running(), k.stats().waiting()), (0, 0));
        assert_eq!(k.stats().spawned(), 3);
    }

    #[tokio::test]
    async fn stdin_is_fed() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(script(dir.path(), "cat"), Duration::from_secs(10), 1024);
        let r = k.run(&apply(), Some(b"hello".to_vec())).await.unwrap();
        assert_eq!(r.stdout, "hello");
    }

    #[tokio::test]
    async fn kill_all_ends_running_processes() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(dir.path(), "sleep 30"),
            Duration::from_secs(60),
            1024,
        );
        let k2 = k.clone();
        let run = tokio::spawn(async move { k2.run(&apply(), None).await });
        while k.running() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let start = Instant::now();
        k.kill_all();
        let r = run.await.unwrap().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(r.exit_code, None);
        assert_eq!(k.running(), 0);
    }

    #[test]
    fn every_command_line_is_built_from_data() {
        assert_eq!(
            Invocation::Apply {
                field_manager: "copyrator.a.b".into(),
                force_conflicts: true,
                impersonate: None,
            }
            .args(),
            [
                "apply",
                "--server-side",
                "--field-manager=copyrator.a.b",
                "--force-conflicts",
                "-f",
                "-"
            ]
        );
        assert_eq!(
            Invocation::Delete {
                namespace: Some("ns".into()),
                objects: vec!["deployments.apps/--all".into()],
                impersonate: None,
            }
            .args(),
            [
                "delete",
                "--namespace=ns",
                "--ignore-not-found=true",
                "--wait=false",
                "--",
                "deployments.apps/--all"
            ]
        );
        assert_eq!(build("/d").verb(), "kustomize");
    }

    #[test]
    fn writes_as_a_tenant_carry_as_and_a_raw_delete_reads_its_options_from_stdin() {
        let user = Some("system:serviceaccount:t:deployer".to_string());
        let apply = Invocation::Apply {
            field_manager: "m".into(),
            force_conflicts: false,
            impersonate: user.clone(),
        };
        assert_eq!(apply.args()[0], "--as=system:serviceaccount:t:deployer");
        let delete = Invocation::DeleteObject {
            path: "/apis/apps/v1/namespaces/t/deployments/web".into(),
            impersonate: user,
        };
        assert_eq!(
            delete.args(),
            [
                "--as=system:serviceaccount:t:deployer",
                "delete",
                "--raw=/apis/apps/v1/namespaces/t/deployments/web",
                "-f",
                "-"
            ]
        );
        assert!(delete.discards_stdout() && !apply.discards_stdout());
        let foreign = Invocation::Delete {
            namespace: None,
            objects: vec!["pods/p".into()],
            impersonate: Some("system:serviceaccount:ops:chaos".into()),
        };
        assert_eq!(
            foreign.args()[..2],
            ["--as=system:serviceaccount:ops:chaos", "delete"]
        );
    }

    #[tokio::test]
    async fn a_raw_delete_keeps_none_of_what_kubectl_printed() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(dir.path(), "echo '{\"data\":{\"password\":\"c2VjcmV0\"}}'"),
            Duration::from_secs(10),
            1024,
        );
        let delete = Invocation::DeleteObject {
            path: "/api/v1/namespaces/t/secrets/s".into(),
            impersonate: None,
        };
        let r = k.run(&delete, Some(b"{}".to_vec())).await.unwrap();
        assert!(r.succeeded());
        assert!(!r.stdout.contains("c2VjcmV0"), "{}", r.stdout);
        assert!(!r.stdout.contains("password"), "{}", r.stdout);
    }

    #[tokio::test]
    async fn a_build_keeps_all_of_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let k = runner(
            script(dir.path(), "head -c 100000 /dev/zero | tr '\\0' 'a'"),
            Duration::from_secs(10),
            1024,
        );
        let r = k.run(&build("/d"), None).await.unwrap();
        assert_eq!(r.stdout.len(), 100_000);
        assert!(!r.output_truncated);
        let r = k.run(&apply(), None).await.unwrap();
        assert!(r.output_truncated, "other runs keep the tail only");
    }

    #[test]
    fn locate_reports_a_missing_binary() {
        let err = KubectlConfig::locate(Some(Path::new("/nonexistent/kubectl"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/kubectl"));
    }
}
