//! Shared helpers for the integration tests: reaching the cluster in
//! KUBECONFIG, a fresh namespace per test, an operator started in-process
//! or as a process. A crate of its own (`ko-test-support`), compiled once
//! for every test binary; each test file names it `common`:
//! `use ko_test_support as common;`.

pub mod api;
pub mod area;
pub mod deploy;
pub mod greeting;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::ResourceExt;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use kustomize_operator::Operator;
use kustomize_operator::cli::{Cli, Command, RunArgs};
use tokio::sync::OnceCell;

pub mod sample;
mod tokens;
pub mod webhook;
pub use tokens::TokenKubeconfig;

/// The test's declared kinds (`tests/fixtures/kinds`).
pub fn fixture_kinds() -> PathBuf {
    repo().join("tests/fixtures/kinds")
}

/// The repo's kind folders and the test's declared kinds, loaded.
pub fn kustomize_dirs() -> kustomize_operator::kind::KustomizeDir {
    let dirs = [repo().join("kustomize"), fixture_kinds()];
    kustomize_operator::kind::KustomizeDir::load_all(&dirs).expect("the kinds load")
}

/// The kind of the resource `doc` (its apiVersion and kind), among the
/// repo's kinds and the test's declared kinds.
pub fn kind_of(doc: &serde_json::Value) -> kustomize_operator::kinds::registry::Kind {
    kustomize_operator::kinds::registry::Registry::load(&kustomize_dirs())
        .expect("the kinds load")
        .of_document(doc)
        .cloned()
        .unwrap_or_else(|| panic!("no kind serves {} {}", doc["apiVersion"], doc["kind"]))
}

/// Every kind of this repo: the built-in ones and those declared in
/// `kustomize/`.
pub fn all_kinds() -> Vec<kustomize_operator::kinds::registry::Kind> {
    let dir = kustomize_operator::kind::KustomizeDir::load(&repo().join("kustomize"))
        .expect("the repo's kustomize dir loads");
    kustomize_operator::kinds::registry::Registry::load(&dir)
        .expect("the repo's kinds load")
        .all()
        .to_vec()
}

/// The repository root (this crate is its `tests/support`).
pub fn repo() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize()
        .unwrap_or_else(|e| panic!("the repository root {}: {e}", root.display()))
}

/// The wrapper module of the newest Kubernetes minor the local plane
/// supports (`hack/control-plane/kubernetes/<minor>`), relative to the
/// repository: the kubectl the image ships is built from it.
pub fn newest_kubernetes_module() -> String {
    let dir = repo().join("hack/control-plane/kubernetes");
    let minors = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some((name.strip_prefix("1.")?.parse::<u32>().ok()?, name)));
    let (_, newest) = minors.max().expect("a pinned Kubernetes minor");
    format!("hack/control-plane/kubernetes/{newest}")
}

/// The operator binary the tests run: `$KO_OPERATOR_BINARY` if set, else
/// the `kustomize-operator` cargo built beside the running test binary
/// (`<target>/<profile>/deps/<test>-<hash>` runs, the operator is
/// `<target>/<profile>/kustomize-operator`; cargo builds a package's
/// binaries before its integration tests). `CARGO_BIN_EXE_kustomize-operator`
/// is set only when compiling those tests, not this library.
pub fn operator_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("KO_OPERATOR_BINARY").filter(|b| !b.is_empty()) {
        return PathBuf::from(binary);
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let binary = test
        .parent()
        .and_then(Path::parent)
        .map(|profile| {
            profile.join(format!(
                "kustomize-operator{}",
                std::env::consts::EXE_SUFFIX
            ))
        })
        .unwrap_or_else(|| panic!("no target directory above {}", test.display()));
    assert!(
        binary.is_file(),
        "no operator binary at {} (beside the test binary {}): run the tests with `cargo test`, \
         which builds it, or set KO_OPERATOR_BINARY to it",
        binary.display(),
        test.display()
    );
    binary
}

/// The kubectl the tests use: $KUBECTL, else kubectl on PATH.
pub fn kubectl_path() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| which::which("kubectl").expect("kubectl on PATH"))
}

/// Runs kubectl synchronously; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(kubectl_path())
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits (up to 60 s) until the CRDs named are established; the last
/// thing seen when one is not.
pub fn wait_established(crds: &[&str]) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for name in crds {
        loop {
            let read = api::get(&api::crds(), None, name);
            let conditions = read.map(|c| c.map(|c| c["status"]["conditions"].clone()));
            let established = conditions.as_ref().is_ok_and(|c| {
                let all = c.iter().flat_map(|c| c.as_array()).flatten();
                all.clone()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            });
            if established {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("{name}: {conditions:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The documents `kubectl kustomize <dir>` builds (`dir` in the repo).
pub fn kustomize_documents(dir: &str) -> Vec<serde_json::Value> {
    let path = repo().join(dir).display().to_string();
    let (ok, out, err) = kubectl(&["kustomize", &path]);
    assert!(ok, "kubectl kustomize {dir}: {err}");
    serde_saphyr::from_multiple(&out).expect("YAML")
}

/// The namespaces in `COPYRATOR_NAMESPACES` of the Deployment among `docs`.
pub fn copyrator_namespaces_env(docs: &[serde_json::Value]) -> Vec<String> {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env");
    let list = env
        .iter()
        .find(|e| e["name"] == "COPYRATOR_NAMESPACES")
        .and_then(|e| e["value"].as_str())
        .expect("COPYRATOR_NAMESPACES");
    list.split(',').map(str::to_string).collect()
}

static CRDS_INSTALLED: OnceCell<Result<(), String>> = OnceCell::const_new();

/// A client for the cluster in KUBECONFIG with the CRDs installed. A
/// cluster test without a cluster fails (panics), naming the command that
/// provides one: it never reports "passed" for what it did not check. Each
/// test gets its own client: a client's connections belong to the test's
/// runtime.
pub async fn cluster() -> Client {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let reachable = async {
        let client = Client::try_default().await.map_err(|e| e.to_string())?;
        client
            .apiserver_version()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(client)
    }
    .await;
    let client = match reachable {
        Ok(client) => client,
        Err(e) => panic!(
            "this test needs a cluster and none is reachable in KUBECONFIG ({e}); run the tests with `hack/test`, which starts the local control plane"
        ),
    };
    let installed = CRDS_INSTALLED
        .get_or_init(|| async {
            let crds = repo().join("deploy/crds").display().to_string();
            let (ok, _, err) = kubectl(&["apply", "-k", &crds]);
            if !ok {
                return Err(format!("installing CRDs failed: {err}"));
            }
            for kind in all_kinds() {
                let name = kind.crd().metadata.name.unwrap_or_default();
                if let Err(err) = wait_established(&[&name]) {
                    return Err(format!("CRD {name} not established: {err}"));
                }
            }
            Ok(())
        })
        .await;
    if let Err(e) = installed {
        panic!("{e}");
    }
    client
}

/// A namespace that is deleted when dropped. While it lives its test is
/// inside its suite's [`area`].
pub struct TestNamespace {
    pub name: String,
    _area: Option<area::Area>,
}

impl TestNamespace {
    /// Creates `ko-<prefix>-<random>`, once the test has entered its
    /// suite's [`area`].
    pub async fn new(client: &Client, prefix: &str) -> Self {
        let area = area::enter().await;
        let name = format!("ko-{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "kustomize-operator-test": "true" } }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        // The ServiceAccount admission plugin wants the default SA before Pods.
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &name);
        wait_until(
            Duration::from_secs(30),
            format!("the default ServiceAccount of {name}"),
            || async { accounts.get_opt("default").await.is_ok_and(|a| a.is_some()) },
        )
        .await;
        Self {
            name,
            _area: Some(area),
        }
    }

    /// The namespace `name`, which the test creates itself (from within
    /// its area), deleted when dropped.
    pub fn adopt(name: String) -> Self {
        Self { name, _area: None }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TEST_NAMESPACES").is_none() {
            // The test's operator is gone by now: without this, resources
            // holding our finalizer would keep the namespace terminating.
            tear_down(&self.name);
        }
    }
}

/// How often [`wait_until`] and [`wait_for`] look again at first.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// How often they look again at most, once a wait is long.
const POLL_AT_MOST: Duration = Duration::from_millis(500);

/// How long to sleep before the next look of a wait that began at
/// `started`: 100 ms at first, an eighth of the time waited so far after
/// that, up to 500 ms. Most checks run a kubectl, about 0.1 s of CPU each:
/// a long wait looked at every 100 ms kept a core busy.
fn poll_after(started: tokio::time::Instant) -> Duration {
    (started.elapsed() / 8).clamp(POLL_EVERY, POLL_AT_MOST)
}

/// Polls `check` ([`poll_after`]) until it is true. After `timeout` the test
/// fails, naming `what` it waited for (say "the Sample Ready", not "a
/// condition").
pub async fn wait_until(
    timeout: Duration,
    what: impl std::fmt::Display,
    mut check: impl AsyncFnMut() -> bool,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(poll_after(started)).await;
    }
}

/// Polls `check` ([`poll_after`]) until it returns `Ok`, and returns the value.
/// Until then `check` returns `Err` with what it saw instead: after
/// `timeout` the test fails, naming `what` it waited for and showing the
/// last thing seen.
pub async fn wait_for<T, Seen: std::fmt::Debug>(
    timeout: Duration,
    what: impl std::fmt::Display,
    mut check: impl AsyncFnMut() -> Result<T, Seen>,
) -> T {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; last seen: {seen:#?}"
            ),
        }
        tokio::time::sleep(poll_after(started)).await;
    }
}

/// True when a test's flags say how KindDefinitions are served. By
/// default a test's operator serves none: definitions are cluster-wide,
/// and tests/kind_definitions.rs serves only its own (by label).
fn serves_definitions(extra: &[&str]) -> bool {
    extra
        .iter()
        .any(|a| a.starts_with("--serve-kind-definitions"))
}

/// `run` arguments for an operator watching only `namespace`.
pub fn run_args(namespace: &str, extra: &[&str]) -> RunArgs {
    let kustomize = repo().join("kustomize");
    let kubectl = kubectl_path();
    let mut argv = vec![
        "kustomize-operator".to_string(),
        "run".into(),
        "--namespace".into(),
        namespace.into(),
        "--kustomize-dir".into(),
        kustomize.display().to_string(),
    ];
    if !extra.contains(&"--metrics-addr") {
        argv.extend(["--metrics-addr".into(), String::new()]);
    }
    if !extra.contains(&"--kubectl") {
        argv.extend(["--kubectl".into(), kubectl.display().to_string()]);
    }
    // In process, the running binary is the test's: workers run the operator's.
    argv.extend([
        "--render-worker".into(),
        operator_binary().display().to_string(),
    ]);
    if !serves_definitions(extra) {
        argv.push("--serve-kind-definitions=false".into());
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    match Cli::parse_from(argv).command {
        Command::Run(args) => *args,
        _ => unreachable!(),
    }
}

/// The flags `render` sees by default, with the repository's kustomize dir.
pub fn render_args() -> kustomize_operator::cli::CommonArgs {
    let kustomize = format!(
        "{},{}",
        repo().join("kustomize").display(),
        fixture_kinds().display()
    );
    render_args_with(&kustomize)
}

/// The flags `render` sees with `--kustomize-dir kustomize_dirs`.
pub fn render_args_with(kustomize_dirs: &str) -> kustomize_operator::cli::CommonArgs {
    let argv = [
        "kustomize-operator",
        "render",
        "-f",
        "-",
        "--out",
        "-",
        "--kustomize-dir",
        kustomize_dirs,
    ];
    match Cli::parse_from(argv).command {
        Command::Render(args) => *args.common,
        _ => unreachable!(),
    }
}

/// Starts an operator in-process, watching only `namespace`.
pub async fn start_operator(namespace: &str, extra: &[&str]) -> Operator {
    Operator::start(&run_args(namespace, extra))
        .await
        .expect("operator starts")
}

/// Writes an executable script.
///
/// A child process (`install`) writes the executable: a file this process
/// held open for writing could be inherited by a process another test forks
/// at that moment, and running it would then fail with "text file busy".
pub fn write_script(path: &Path, body: &str) {
    let source = path.with_extension("source");
    std::fs::write(&source, format!("#!/bin/sh\n{body}\n")).unwrap();
    let installed = std::process::Command::new("install")
        .args(["-m", "755"])
        .arg(&source)
        .arg(path)
        .status()
        .unwrap();
    assert!(installed.success(), "install {}", path.display());
}

/// Runs kubectl with `input` on stdin; returns (success, stdout, stderr).
pub fn kubectl_stdin(args: &[&str], input: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(kubectl_path())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The operator binary, run as a child process (for tests that need separate
/// processes: another identity, leader election, being killed).
pub struct OperatorProcess {
    child: std::process::Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl OperatorProcess {
    /// Starts `kustomize-operator run --namespace <namespace> <extra>` with the
    /// repo's kustomize dir and the tests' kubectl; `env` is added to (and
    /// `KUBECONFIG` may replace) the test's environment.
    pub fn spawn(namespace: &str, env: &[(&str, &str)], extra: &[&str]) -> Self {
        Self::start(Some(namespace), env, extra)
    }

    /// Like [`Self::spawn`], watching every namespace: give it a `--shard`
    /// of the test's own, and label the test's resources with it, so that
    /// it leaves everything else on the shared cluster alone.
    pub fn spawn_all_namespaces(env: &[(&str, &str)], extra: &[&str]) -> Self {
        assert!(extra.contains(&"--shard"), "a shard of the test's own");
        Self::start(None, env, extra)
    }

    fn start(namespace: Option<&str>, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("operator.log");
        let mut cmd = std::process::Command::new(operator_binary());
        cmd.arg("run");
        if let Some(namespace) = namespace {
            cmd.args(["--namespace", namespace]);
        }
        cmd.arg("--kustomize-dir").arg(repo().join("kustomize"));
        if !extra.contains(&"--kubectl") {
            cmd.arg("--kubectl").arg(kubectl_path());
        }
        if !extra.contains(&"--work-dir") {
            cmd.arg("--work-dir").arg(dir.path().join("work"));
        }
        if !serves_definitions(extra) {
            cmd.arg("--serve-kind-definitions=false");
        }
        cmd.args(extra);
        for var in [
            "WATCH_NAMESPACE",
            "KINDS",
            "SERVE_KIND_DEFINITIONS",
            "KIND_DEFINITION_SELECTOR",
            "NAMESPACE",
            "POD_NAME",
            "METRICS_ADDR",
            "LEADER_ELECT",
            "LEADER_ELECT_NAMESPACE",
            "COPYRATOR_NAMESPACES",
            "COPYRATOR_NAMESPACE_SELECTOR",
            "CONVERSION_WEBHOOK_ADDR",
            "CONVERSION_WEBHOOK_URL",
            "CONVERSION_WEBHOOK_SERVICE",
            // The roots an HTTPS client trusts instead of the system's: a
            // test gives them when it means to (tests/exchange_rate.rs).
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            // Traces go where a test says (tests/traced.rs).
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("start the operator binary");
        Self {
            child,
            log,
            _dir: dir,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many TCP connections the process holds established (read from
    /// /proc: its socket descriptors, found in its network namespace's
    /// tables).
    pub fn established_connections(&self) -> usize {
        let pid = self.child.id();
        let sockets: std::collections::HashSet<String> =
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(
                        link.strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_string(),
                    )
                })
                .collect();
        ["tcp", "tcp6"]
            .iter()
            .flat_map(|table| {
                let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"));
                let rows: Vec<String> = text
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .map(str::to_string)
                    .collect();
                rows
            })
            .filter(|row| {
                let fields: Vec<&str> = row.split_whitespace().collect();
                // st 01 is ESTABLISHED; the inode is the tenth field.
                fields.get(3) == Some(&"01")
                    && fields.get(9).is_some_and(|inode| sockets.contains(*inode))
            })
            .count()
    }

    /// Sends `signal` (libc::SIGTERM, libc::SIGKILL, ...).
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Everything it logged so far (its standard error, `RUST_LOG=info`),
    /// read whole: for counting lines such as the start line.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines it logged (for failure messages only).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for OperatorProcess {
    /// Kills the process; when the test is failing, first shows whether it
    /// was still running and the end of its log, so that a wait that timed
    /// out says what the operator was doing (or that it had exited).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let state = match self.child.try_wait() {
                Ok(None) => "still running".to_string(),
                Ok(Some(status)) => format!("exited ({status})"),
                Err(e) => format!("state unknown ({e})"),
            };
            eprintln!(
                "the operator (pid {}, {state}); its log's last lines:\n{}",
                self.child.id(),
                self.log_tail()
            );
        }
        if self.running() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET http://127.0.0.1:<port><path>`: the status code and body, or None
/// when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// The sum of the samples of `metric` whose labels contain every `label`
/// (e.g. `verb="apply"`) in a Prometheus text exposition.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            (name == metric && labels.iter().all(|label| rest.contains(label)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Removes the finalizers of every resource of every kind left in
/// `namespace`, so that deleting the namespace does not hang once the
/// operator that would have run their cleanup is gone.
pub(crate) fn strip_finalizers(namespace: &str) {
    on_own_runtime(release_all(namespace.to_string()));
}

/// [`strip_finalizers`], then deletes `namespace` (without waiting).
fn tear_down(namespace: &str) {
    let namespace = namespace.to_string();
    on_own_runtime(async move {
        let client = release_all(namespace.clone()).await?;
        let namespaces = Api::<Namespace>::all(client);
        let deleted = namespaces
            .delete(&namespace, &DeleteParams::default())
            .await;
        deleted.ok().map(|_| ())
    });
}

/// Runs `work` to its end on a runtime of its own, on a thread of its
/// own: a `drop` inside a test's runtime may not block on that runtime.
/// Teardown through the API, not kubectl: each kubectl costs about 0.1 s
/// of CPU, and a namespace's teardown once ran six.
fn on_own_runtime<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) {
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the teardown");
        runtime.block_on(work);
    });
    let _ = thread.join();
}

/// Removes the finalizers of the resources of every namespaced kind in
/// `namespace` (a kind whose CRD is not installed lists nothing); the
/// client, when there is one.
async fn release_all(namespace: String) -> Option<Client> {
    let client = Client::try_default().await.ok()?;
    let released = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    for resource in namespaced_kinds() {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, resource);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        let held = |o: &&DynamicObject| {
            o.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
        };
        for object in list.items.iter().filter(held) {
            let _ = api
                .patch(&object.name_any(), &PatchParams::default(), &released)
                .await;
        }
    }
    Some(client)
}

/// Every namespaced kind of the registry, at its storage version; loaded
/// once.
fn namespaced_kinds() -> &'static [ApiResource] {
    static KINDS: std::sync::OnceLock<Vec<ApiResource>> = std::sync::OnceLock::new();
    KINDS.get_or_init(|| {
        let kinds = kustomize_operator::kinds::registry::Registry::load(&kustomize_dirs())
            .expect("the kinds load");
        (kinds.all().iter().map(|k| k.crd()))
            .filter(|crd| crd.spec.scope == "Namespaced")
            .filter_map(|crd| {
                let stored = crd.spec.versions.iter().find(|v| v.storage)?;
                let (group, kind) = (&crd.spec.group, &crd.spec.names.kind);
                let gvk = GroupVersionKind::gvk(group, &stored.name, kind);
                Some(ApiResource::from_gvk_with_plural(
                    &gvk,
                    &crd.spec.names.plural,
                ))
            })
            .collect()
    })
}

/// A finalizer of the test's own: a resource holding it stays after its
/// deletion (with a deletionTimestamp) until [`release`] removes it.
pub const TEST_HOLD: &str = "test.kustomize-operator.io/hold";

/// Adds [`TEST_HOLD`] to the finalizers of `resource` (`sample/web`,
/// `exchangerate/pln`) in `ns`. While it holds a deleted resource, the
/// garbage collector leaves the objects whose ownerReference names it:
/// an owned object that goes meanwhile was deleted by someone else (the
/// operator, for a test that shows the engine deletes what it owns).
pub fn hold(ns: &str, resource: &str) {
    let patch =
        format!(r#"[{{"op":"add","path":"/metadata/finalizers/-","value":"{TEST_HOLD}"}}]"#);
    let (ok, _, err) = kubectl(&["-n", ns, "patch", resource, "--type", "json", "-p", &patch]);
    assert!(ok, "holding {resource}: {err}");
}

/// Removes [`TEST_HOLD`] from `resource`, leaving its other finalizers.
pub fn release(ns: &str, resource: &str) {
    let Some(finalizers) = finalizers(ns, resource) else {
        return;
    };
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != TEST_HOLD).collect();
    let patch = serde_json::json!({"metadata": {"finalizers": kept}}).to_string();
    let (ok, _, err) = kubectl(&["-n", ns, "patch", resource, "--type", "merge", "-p", &patch]);
    assert!(ok, "releasing {resource}: {err}");
}

/// The finalizers of `resource` in `ns`, None when it is gone.
pub fn finalizers(ns: &str, resource: &str) -> Option<Vec<String>> {
    let (ok, out, err) = kubectl(&[
        "-n",
        ns,
        "get",
        resource,
        "-o",
        "json",
        "--ignore-not-found",
    ]);
    assert!(ok, "kubectl get {resource}: {err}");
    if out.trim().is_empty() {
        return None;
    }
    let object: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    Some(serde_json::from_value(object["metadata"]["finalizers"].clone()).unwrap_or_default())
}

/// A kubectl that notes each run's arguments (one line per run, in
/// `runs`) before running the tests' kubectl: what an operator ran, and
/// as whom (`--as=...`), for `--kubectl`.
pub struct RecordingKubectl {
    pub path: PathBuf,
    runs: PathBuf,
    _dir: tempfile::TempDir,
}

impl RecordingKubectl {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (path, runs) = (dir.path().join("kubectl"), dir.path().join("runs"));
        write_script(
            &path,
            &format!(
                "echo \"$*\" >> '{}'\nexec '{}' \"$@\"",
                runs.display(),
                kubectl_path().display()
            ),
        );
        Self {
            path,
            runs,
            _dir: dir,
        }
    }

    /// The argument lines of the runs so far.
    pub fn runs(&self) -> Vec<String> {
        std::fs::read_to_string(&self.runs)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Default for RecordingKubectl {
    fn default() -> Self {
        Self::new()
    }
}

/// Deletes the objects it names (`kind/name`, or `kind.group/name`) when
/// dropped, whatever the test's outcome: what a test made outside its
/// namespace (a policy, a ClusterRole).
pub struct DeleteOnDrop(pub Vec<String>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        for object in &self.0 {
            let _ = kubectl(&["delete", object, "--ignore-not-found"]);
        }
    }
}

/// Calls [`strip_finalizers`] when dropped: declare it after the
/// [`TestNamespace`] and before the operators, so that it runs after the
/// operators stopped and before the namespace is deleted, even on failure.
pub struct StripFinalizersOnDrop(pub String);

impl Drop for StripFinalizersOnDrop {
    fn drop(&mut self) {
        strip_finalizers(&self.0);
    }
}

/// The helm CLI: `$HELM`, else the one `hack/helm/helm path` reports as
/// built (`hack/helm/helm build` builds it; `hack/test` and `.ci/run` do);
/// the error says why there is none.
pub fn find_helm() -> Result<PathBuf, String> {
    find_built("HELM", "hack/helm/helm")
}

/// A tool `hack/<tool>` builds and caches: `$<var>` when set, else what
/// `script path` prints.
fn find_built(var: &str, script: &str) -> Result<PathBuf, String> {
    if let Some(tool) = std::env::var_os(var).filter(|t| !t.is_empty()) {
        return Ok(PathBuf::from(tool));
    }
    let out = std::process::Command::new(repo().join(script))
        .arg("path")
        .output()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    if out.status.success() {
        Ok(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The helm CLI for the chart tests ([`find_helm`]), or None, loudly, when
/// there is none; under CI that is a failure instead ([`skip`]).
pub fn helm_path() -> Option<PathBuf> {
    match find_helm() {
        Ok(helm) => Some(helm),
        Err(why) => {
            skip(&format!("no helm: {why}"));
            None
        }
    }
}

/// The OpenTelemetry Collector `hack/otelcol/otelcol build` builds
/// (`$OTELCOL` when set; `hack/test` sets it), or None, loudly, when there
/// is none; under CI that is a failure instead ([`skip`]).
pub fn otelcol_path() -> Option<PathBuf> {
    match find_built("OTELCOL", "hack/otelcol/otelcol") {
        Ok(otelcol) => Some(otelcol),
        Err(why) => {
            skip(&format!("no OpenTelemetry Collector: {why}"));
            None
        }
    }
}

/// True when the tests run in CI: `CI` is set to anything but an empty
/// string, `0`, `false`, `no` or `off` (any case). CI runners set `true`
/// or `1`; whatever they set, a missing prerequisite fails there.
pub fn in_ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

/// [`in_ci`] for the value `value` of `CI`.
pub fn ci_value(value: Option<&str>) -> bool {
    let value = value.unwrap_or_default().trim().to_ascii_lowercase();
    !matches!(value.as_str(), "" | "0" | "false" | "no" | "off")
}

/// The test running on this thread, with its binary:
/// `install::image::runs_read_only`. The test harness names each test's thread
/// after the test (with `--test-threads=1` too); the binary is cargo's,
/// without the hash it appends. `<binary>::?` off a test's thread.
pub fn current_test() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_deref()
        .and_then(Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let binary = match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name,
        _ => &stem,
    };
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("?");
    format!("{binary}::{test}")
}

/// The running test ([`current_test`]) cannot run here, for want of `why`
/// (podman, the image, helm, the recorded nodes): under CI ([`in_ci`])
/// that fails the test; elsewhere the caller returns early and this says
/// so where it cannot be missed, on the real standard error (shown without
/// `--nocapture`) and, when `hack/test` set `KO_TEST_SKIPS`, in that file,
/// which `hack/test` lists at the end of the run, under the test's name.
pub fn skip(why: &str) {
    let test = current_test();
    assert!(
        !in_ci(),
        "{test}: cannot run, and CI={:?} makes that a failure: {why}",
        std::env::var("CI").unwrap_or_default()
    );
    use std::io::Write;
    let line = format!("SKIPPED {test}: {why}");
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {line} (not a failure outside CI)\n"
    );
    if let Some(file) = std::env::var_os("KO_TEST_SKIPS").filter(|f| !f.is_empty()) {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = appended {
            let _ = writeln!(std::io::stderr(), "cannot note the skip in {file:?}: {e}");
        }
    }
}

/// Runs the operator binary's `verb` (`render`, `diff`, ...) with the
/// repository's kustomize dir and the tests' kubectl; returns (exit code,
/// stdout, stderr).
pub fn operator_command(verb: &str, args: &[&str]) -> (Option<i32>, String, String) {
    operator_command_as(verb, args, None)
}

/// [`operator_command`] with `kubeconfig` (e.g. a ServiceAccount token's)
/// instead of the test's.
pub fn operator_command_as(
    verb: &str,
    args: &[&str],
    kubeconfig: Option<&Path>,
) -> (Option<i32>, String, String) {
    let mut command = std::process::Command::new(operator_binary());
    if let Some(kubeconfig) = kubeconfig {
        command.env("KUBECONFIG", kubeconfig);
    }
    let out = command
        .arg(verb)
        .arg("--kustomize-dir")
        .arg(repo().join("kustomize"))
        .args(args)
        .env("KUBECTL", kubectl_path())
        .env_remove("KUSTOMIZE_DIR")
        .output()
        .expect("run the operator binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// True when an event with `reason` about `name` in `ns` was published.
pub async fn has_event(client: &Client, ns: &str, name: &str, reason: &str) -> bool {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
}
