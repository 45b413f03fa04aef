//! The training labs (`training/[0-9]*.md`) run as executable transcripts.
//!
//! Every ```` ```console ```` block of every lab is run, in file order, in one
//! persistent bash per lab (cwd: the repository root; PATH: the built
//! `kustomize-operator` and the pinned kubectl first), and each command's
//! output must match the expected output written under it. The format is
//! described in `training/README.md` and in `tests/training/transcript.rs`.
//!
//! - `TRAINING_LABS=03,04` runs only the labs whose file name contains one of
//!   the words;
//! - `TRAINING_RECORD=1` prints every command with its real output (for
//!   writing a lab) and goes on after a mismatch.
//!
//! The labs are written for the project's control plane and its three fake
//! nodes (kwok: Pods run, but no container does). On a cluster with other
//! nodes the outputs differ: the run is skipped with a message naming what
//! differs, and under CI (`CI` set, and not `0` or `false`) it fails instead.
//! The plane's real node (`KO_REAL_NODE=1`) is not "other": blocks marked
//! `real-node` (lab 05's rollout) run on it, and without it they are
//! skipped saying so, or fail the run under CI.

use ko_test_support as common;
#[path = "training/shell.rs"]
mod shell;
#[path = "training/transcript.rs"]
mod transcript;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shell::Shell;
use transcript::{Lab, Step};

/// The longest a single lab command may run (a first `cargo build` included).
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// Steps slower than this are reported (the whole training should stay
/// within a couple of minutes).
const SLOW_STEP: Duration = Duration::from_secs(5);

/// Environment variables of the operator's flags: a developer's shell may
/// set them, and the labs must see the defaults they describe.
const OPERATOR_ENV: &[&str] = &[
    "WATCH_NAMESPACE",
    "KINDS",
    "SERVE_KIND_DEFINITIONS",
    "KIND_DEFINITION_SELECTOR",
    "NAMESPACE",
    "KUBECTL_TIMEOUT",
    "MAX_CONCURRENT_KUBECTL",
    "RESYNC_INTERVAL",
    "KEEP_OVERLAYS",
    "WORK_DIR",
    "BATCH_WINDOW",
    "BATCH_MAX",
    "MAX_CONCURRENT_RECONCILES",
    "SHUTDOWN_GRACE",
    "METRICS_ADDR",
    "KUSTOMIZE_DIR",
    "LOG_FORMAT",
    "COPYRATOR_NAMESPACES",
    "COPYRATOR_NAMESPACE_SELECTOR",
];

/// Variables cargo sets for a test process (not a user's terminal). A
/// `cargo` run by a lab would pass them on to build scripts, which track
/// some of them (ring: `CARGO_MANIFEST_DIR`): the dependencies would be
/// rebuilt, then rebuilt again by the next ordinary cargo command.
fn cargo_test_env(name: &str) -> bool {
    name == "CARGO"
        || name == "OUT_DIR"
        || name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// The variables a lab's shell must not inherit.
fn removed_env() -> Vec<String> {
    let mut names: Vec<String> = OPERATOR_ENV.iter().map(|s| s.to_string()).collect();
    names.extend(
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| cargo_test_env(k)),
    );
    names
}

fn training_dir() -> PathBuf {
    common::repo().join("training")
}

/// Writes to the real stderr: not captured by the test harness, so skip
/// reasons and per-lab timings show in CI logs.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn load_labs() -> Vec<Lab> {
    let paths = transcript::discover(&training_dir()).expect("read training/");
    assert!(!paths.is_empty(), "no labs found in training/");
    paths
        .iter()
        .map(|p| transcript::load(p).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn relative(path: &Path) -> String {
    path.strip_prefix(common::repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn labs_parse_and_their_links_resolve() {
    for lab in load_labs() {
        assert!(
            lab.blocks.iter().any(|b| b.skip.is_none()),
            "{}: no runnable ```console block",
            relative(&lab.path)
        );
        let dir = lab.path.parent().expect("lab dir");
        for (line, target) in &lab.links {
            assert!(
                dir.join(target).exists(),
                "{}:{line}: link to {target}, which does not exist",
                relative(&lab.path)
            );
        }
    }
}

#[test]
fn readme_lists_every_lab_and_its_links_resolve() {
    let path = training_dir().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README");
    let parsed = transcript::parse(&path, &readme).unwrap_or_else(|e| panic!("{e}"));
    for (line, target) in &parsed.links {
        assert!(
            training_dir().join(target).exists(),
            "training/README.md:{line}: link to {target}, which does not exist"
        );
    }
    for lab in load_labs() {
        let name = lab.path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            readme.contains(&format!("({name})")),
            "training/README.md does not link to {name}"
        );
    }
}

/// Lab 05 runs the operator's rollout on the plane's real node: its
/// `real-node` blocks include the rollout, and it skips nothing (what
/// needs Docker or kind is a listing for another machine; the uninstall
/// is a server-side dry run).
#[test]
fn lab05_runs_its_rollout_on_the_real_node_and_skips_nothing() {
    let lab = transcript::load(&training_dir().join("05-deploy.md")).expect("lab 05");
    let skipped: Vec<&str> = lab
        .blocks
        .iter()
        .filter_map(|b| b.skip.as_deref())
        .collect();
    assert!(skipped.is_empty(), "lab 05 skips blocks: {skipped:?}");
    let on_node: Vec<&str> = lab
        .blocks
        .iter()
        .filter(|b| b.real_node)
        .flat_map(|b| b.steps.iter().map(|s| s.command.as_str()))
        .collect();
    for command in [
        "hack/control-plane/control-plane load-image kustomize-operator:dev",
        "kubectl rollout status deployment/kustomize-operator -n kustomize-operator-system --timeout=180s",
    ] {
        assert!(
            on_node.contains(&command),
            "lab 05 does not run `{command}` on the real node"
        );
    }
}

/// Lab 06 declares its kind without Rust, so every one of its steps runs
/// in CI: it has no skipped block; its kind folder loads and checks.
#[test]
fn lab06_runs_every_step_and_its_kind_folder_loads() {
    let text = std::fs::read_to_string(training_dir().join("06-your-own-kind.md")).unwrap();
    assert!(
        !text.contains("console skip="),
        "lab 06 skips a step: a declared kind needs no source change"
    );
    let dir = training_dir().join("06-your-own-kind");
    let loaded = kustomize_operator::kind::KustomizeDir::load(&dir).expect("lab 06's folder loads");
    let registry = kustomize_operator::kinds::registry::Registry::load(&loaded)
        .expect("lab 06's kind file checks");
    let greeting = registry
        .select(&["greeting".to_string()])
        .expect("greeting");
    assert_eq!(
        greeting[0].crd().metadata.name.as_deref(),
        Some("greetings.hello.nuvolaris.org")
    );
}

/// The runner on a lab of its own (no cluster): state carries over, a
/// mismatch fails naming the file, the line and the command, later blocks
/// are not run except `cleanup` ones, skipped blocks are not run, and a
/// background job does not outlive the lab.
#[test]
fn the_runner_checks_transcripts_and_names_the_failing_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("ran");
    let pid = dir.path().join("pid");
    let path = dir.path().join("01-self-test.md");
    let text = format!(
        "# Self test\n\n```console\n$ export X=1 && cd /tmp\n$ echo \"$X $PWD\"; sleep 300 & echo $! > {pid}\n1 /tmp\n$ printf 'a\\nb\\n'\na\n[[anything]]\n```\n\n```console\n$ echo actual\nexpected\n$ echo after >> {log}\n```\n\n```console skip=\"not today\"\n$ echo skipped >> {log}\n```\n\n```console\n$ echo later >> {log}\n```\n\n```console cleanup\n$ echo cleanup >> {log}\nnot checked after a failure\n```\n",
        pid = pid.display(),
        log = log.display()
    );
    std::fs::write(&path, text).expect("write the lab");
    let lab = transcript::load(&path).expect("parse");
    let failures = run_lab(&lab, false, false, true);
    assert_eq!(failures.len(), 1, "{failures:#?}");
    let f = &failures[0];
    assert!(
        f.contains("01-self-test.md:13: output of `echo actual`"),
        "{f}"
    );
    assert!(
        f.contains("  | expected") && f.contains("  | actual"),
        "{f}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default(),
        "cleanup\n"
    );
    let pid = std::fs::read_to_string(&pid).expect("pid file");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next());
    assert!(
        state.is_none_or(|s| s == "Z"),
        "the lab's background job {} is still running",
        pid.trim()
    );
}

/// JSON with `//` and `/* */` comments (devcontainer.json's dialect) made
/// plain JSON: comments outside strings removed.
fn strip_json_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                '\\' => out.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn json_comments_are_stripped_outside_strings() {
    let text = "// head\n{ \"a\": \"http://x/*y*/\", /* c */ \"b\": \"q\\\"//\" // tail\n}";
    let v: serde_json::Value = serde_json::from_str(&strip_json_comments(text)).unwrap();
    assert_eq!(v, serde_json::json!({"a": "http://x/*y*/", "b": "q\"//"}));
}

/// `major.minor` of a version string such as `1.95`, `1.25.0`, `go 1.25.0`.
fn major_minor(version: &str) -> (u32, u32) {
    let digits = version.trim_start_matches(|c: char| !c.is_ascii_digit());
    let mut parts = digits.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// The devcontainer cannot be built here (no container registry to pull its
/// base from); this checks what can be checked without building it: the
/// files parse, and what they name exists and fits the project.
#[test]
fn devcontainer_is_consistent_with_the_repository() {
    let repo = common::repo();
    let dir = training_dir().join(".devcontainer");
    let text = std::fs::read_to_string(dir.join("devcontainer.json")).expect("devcontainer.json");
    let config: serde_json::Value = serde_json::from_str(&strip_json_comments(&text))
        .expect("devcontainer.json is JSON (with comments, without trailing commas)");
    let str_of = |v: &serde_json::Value, what: &str| -> String {
        v.as_str()
            .unwrap_or_else(|| panic!("devcontainer.json: {what} must be a string"))
            .to_string()
    };

    // The build: the Dockerfile and the context exist.
    let dockerfile = dir.join(str_of(&config["build"]["dockerfile"], "build.dockerfile"));
    let context = dir.join(str_of(&config["build"]["context"], "build.context"));
    assert!(dockerfile.is_file(), "{} is missing", dockerfile.display());
    assert!(context.is_dir(), "{} is missing", context.display());

    // The whole repository is mounted where workspaceFolder says: the parent
    // of training/ (the folder opened in VS Code) is the repository root.
    let folder = str_of(&config["workspaceFolder"], "workspaceFolder");
    let mount = str_of(&config["workspaceMount"], "workspaceMount");
    assert!(
        mount.contains("source=${localWorkspaceFolder}/..,")
            && mount.contains(&format!("target={folder},")),
        "workspaceMount {mount:?} must mount the parent of training/ at {folder}"
    );
    assert!(training_dir().join("..").join("Cargo.toml").is_file());
    assert_eq!(config["containerEnv"]["KO_WORKSPACE"], folder.as_str());

    // The lifecycle commands run in the repository root: the repository
    // files they name exist.
    for key in ["postCreateCommand", "postStartCommand"] {
        let command = str_of(&config[key], key);
        assert!(
            command.contains("hack/control-plane/control-plane"),
            "{key}: {command}"
        );
        for word in command.split_whitespace() {
            if word.contains('/') && !word.starts_with(['/', '-', '>', '$']) {
                assert!(
                    repo.join(word).exists(),
                    "{key} names {word}, which does not exist"
                );
            }
        }
    }

    // Every metrics port the labs use is forwarded.
    let forwarded: Vec<u64> = config["forwardPorts"]
        .as_array()
        .expect("forwardPorts")
        .iter()
        .map(|p| p.as_u64().expect("forwardPorts are numbers"))
        .collect();
    for lab in load_labs() {
        let text = std::fs::read_to_string(&lab.path).unwrap();
        for (i, _) in text.match_indices("--metrics-addr 127.0.0.1:") {
            let port: u64 = text[i + 25..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("a port");
            assert!(
                forwarded.contains(&port),
                "{} uses port {port}, which forwardPorts lacks",
                relative(&lab.path)
            );
        }
    }

    // The Dockerfile: COPY sources exist in the context, the tools the
    // control-plane script needs are installed, and the images are recent
    // enough for the project (Rust) and the control plane's Go modules (Go).
    let docker = std::fs::read_to_string(&dockerfile).expect("Dockerfile");
    for line in docker.lines().map(str::trim) {
        if let Some(args) = line.strip_prefix("COPY ")
            && !args.starts_with("--from")
        {
            let words: Vec<&str> = args.split_whitespace().collect();
            for src in &words[..words.len() - 1] {
                assert!(
                    context.join(src).exists(),
                    "Dockerfile copies {src}, which is missing"
                );
            }
        }
    }
    for tool in ["python3", "openssl", "curl", "git"] {
        assert!(
            docker.contains(&format!(" {tool} ")),
            "the Dockerfile does not install {tool}"
        );
    }
    let image = |name: &str| -> (u32, u32) {
        let from = docker
            .lines()
            .find_map(|l| l.strip_prefix("FROM ")?.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no FROM {name}:<version> in the Dockerfile"));
        major_minor(from)
    };
    let cargo = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let rust_version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version"))
        .expect("rust-version in Cargo.toml");
    assert!(
        image("rust") >= major_minor(rust_version),
        "rust image older than rust-version"
    );
    let kubernetes = std::fs::read_dir(repo.join("hack/control-plane/kubernetes"))
        .expect("the pinned Kubernetes minors")
        .map(|e| {
            format!(
                "hack/control-plane/kubernetes/{}",
                e.unwrap().file_name().to_string_lossy()
            )
        });
    for module in kubernetes.chain(
        [
            "hack/control-plane/etcd",
            "hack/control-plane/kwok",
            "hack/helm",
        ]
        .map(String::from),
    ) {
        let gomod = std::fs::read_to_string(repo.join(format!("{module}/go.mod"))).expect("go.mod");
        let go = gomod
            .lines()
            .find(|l| l.starts_with("go "))
            .expect("go line");
        assert!(
            image("golang") >= major_minor(go),
            "golang image older than {module}'s {go}"
        );
    }

    // The shell setup asks the control-plane script for its environment.
    let shell = std::fs::read_to_string(dir.join("lab-shell.sh")).expect("lab-shell.sh");
    assert!(shell.contains("hack/control-plane/control-plane"));
    assert!(
        shell.contains("hack/helm/helm"),
        "lab-shell.sh puts helm on PATH"
    );
    assert!(
        shell.contains(&folder),
        "lab-shell.sh's default workspace is {folder}"
    );
}

/// An exclusive lock per cluster, so two runs of the labs on one machine
/// (several worktrees against one shared control plane) take turns: the
/// labs use fixed namespace names.
struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    fn take() -> RunLock {
        use sha2::Digest;
        use std::os::fd::AsRawFd;
        let key = std::env::var("KUBECONFIG").unwrap_or_default();
        let hash = hex::encode(&sha2::Sha256::digest(key.as_bytes())[..8]);
        let path = std::env::temp_dir().join(format!("kustomize-operator-training-{hash}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .expect("open the lock file");
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            say(&format!(
                "[training] waiting for another run of the labs ({})",
                path.display()
            ));
            // SAFETY: as above.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            assert_eq!(rc, 0, "flock {}", path.display());
        }
        RunLock { _file: file }
    }
}

fn lab_env() -> Vec<(String, String)> {
    let mut path: Vec<PathBuf> = Vec::new();
    let operator = PathBuf::from(env!("CARGO_BIN_EXE_kustomize-operator"));
    path.extend(operator.parent().map(Path::to_path_buf));
    if let Some(k) = std::env::var_os("KUBECTL") {
        path.extend(Path::new(&k).parent().map(Path::to_path_buf));
    }
    // Lab 05's chart step runs the pinned helm.
    if let Ok(helm) = common::find_helm() {
        path.extend(helm.parent().map(Path::to_path_buf));
    }
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).expect("PATH");
    vec![
        ("PATH".into(), path.to_string_lossy().into_owned()),
        ("LC_ALL".into(), "C".into()),
    ]
}

fn indent(text: &str) -> String {
    let lines = transcript::trimmed_lines(text);
    if lines.is_empty() {
        return "  (nothing)".into();
    }
    lines
        .iter()
        .map(|l| format!("  | {l}\n"))
        .collect::<String>()
        .trim_end()
        .to_string()
}

fn mismatch(lab: &Lab, step: &Step, actual: &str, status: i32) -> String {
    let expected = step.expected.join("\n");
    let hint = transcript::first_difference(&step.expected, actual)
        .map(|n| format!("\nfirst difference at output line {n}"))
        .unwrap_or_default();
    format!(
        "{}:{}: output of `{}` (exit status {status}) does not match\nexpected:\n{}\nactual:\n{}{hint}",
        relative(&lab.path),
        step.line,
        step.command,
        indent(&expected),
        indent(actual),
    )
}

/// Why a `real-node` block is skipped on a plane without one.
const NO_REAL_NODE: &str = "needs the control plane's real node: start it with \
     `KO_REAL_NODE=1 hack/control-plane/control-plane up` (root)";

/// Runs one lab; returns its failures (the first mismatch stops it, except
/// when recording). `report` prints skipped blocks, slow steps and a summary;
/// `real_node` says whether the plane has its real node (else the blocks
/// that need it are skipped).
fn run_lab(lab: &Lab, record: bool, report: bool, real_node: bool) -> Vec<String> {
    let say = |msg: &str| {
        if report || record {
            say(msg)
        }
    };
    let name = relative(&lab.path);
    let started = Instant::now();
    let mut sh = Shell::start(&common::repo(), &lab_env(), &removed_env())
        .unwrap_or_else(|e| panic!("{name}: cannot start bash: {e}"));
    let mut failures = Vec::new();
    let (mut ran, mut skipped) = (0, 0);
    for block in &lab.blocks {
        let skip = block
            .skip
            .as_deref()
            .or((block.real_node && !real_node).then_some(NO_REAL_NODE));
        if let Some(reason) = skip {
            skipped += 1;
            say(&format!(
                "[training] {name}:{}: skipped: {reason}",
                block.line
            ));
            continue;
        }
        let failed = !failures.is_empty() && !record;
        if failed && !block.cleanup {
            continue;
        }
        for step in &block.steps {
            if record {
                say(&format!("$ {}", step.command));
            }
            let step_started = Instant::now();
            let result = sh.run(&step.command, STEP_TIMEOUT);
            let took = step_started.elapsed();
            if took > SLOW_STEP {
                say(&format!(
                    "[training] {name}:{}: slow step ({:.1}s): {}",
                    step.line,
                    took.as_secs_f64(),
                    step.command.lines().next().unwrap_or_default()
                ));
            }
            match result {
                Ok((output, status)) => {
                    ran += 1;
                    if record {
                        say(output.trim_end());
                    }
                    if !failed && !transcript::output_matches(&step.expected, &output) {
                        failures.push(mismatch(lab, step, &output, status));
                        if record {
                            say(&format!("[training] ^ mismatch ({name}:{})", step.line));
                        } else if !block.cleanup {
                            break;
                        }
                    }
                }
                Err(e) => {
                    failures.push(format!("{name}:{}: `{}`: {e}", step.line, step.command));
                    if matches!(e, shell::RunError::Exited(_)) {
                        return failures;
                    }
                    if !record {
                        break;
                    }
                }
            }
        }
    }
    drop(sh);
    say(&format!(
        "[training] {name}: {} ({ran} commands run, {skipped} blocks skipped, {:.1}s)",
        if failures.is_empty() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    ));
    failures
}

/// The nodes the labs' transcripts show: the local control plane's default
/// fake nodes, each annotated `kwok.x-k8s.io/node=fake`.
const RECORDED_NODES: [&str; 3] = ["kwok-node-1", "kwok-node-2", "kwok-node-3"];

/// The names of the cluster's nodes, a node that kwok does not fake as
/// `<name> (not kwok's)`, but for the control plane's real node (labelled
/// `kustomize-operator.io/real-node=true`); and whether there is one.
fn cluster_nodes() -> (Vec<String>, bool) {
    let (ok, out, err) = common::kubectl(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.annotations.kwok\.x-k8s\.io/node} {.metadata.labels.kustomize-operator\.io/real-node}{"\n"}{end}"#,
    ]);
    assert!(ok, "kubectl get nodes: {err}");
    let mut real_node = false;
    let nodes = out
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                [name, "fake", _] => Some(name.to_string()),
                [_, "", "true"] => {
                    real_node = true;
                    None
                }
                _ => Some(format!("{} (not kwok's)", words[0])),
            }
        })
        .collect();
    (nodes, real_node)
}

/// Why the labs cannot run as written on a cluster with `nodes`: None when
/// they are the recorded ones, else what differs from them.
fn nodes_differ(nodes: &[String]) -> Option<String> {
    if nodes == RECORDED_NODES {
        return None;
    }
    let missing: Vec<&str> = RECORDED_NODES
        .iter()
        .copied()
        .filter(|n| !nodes.iter().any(|m| m == n))
        .collect();
    let extra: Vec<&str> = nodes
        .iter()
        .map(String::as_str)
        .filter(|n| !RECORDED_NODES.contains(n))
        .collect();
    Some(format!(
        "this cluster's nodes are {nodes:?}, the labs' transcripts are recorded with \
         {RECORDED_NODES:?} (the local control plane's default kwok nodes): missing {missing:?}, \
         not recorded {extra:?}"
    ))
}

#[test]
fn a_cluster_with_other_nodes_is_named_by_what_differs() {
    let recorded: Vec<String> = RECORDED_NODES.iter().map(|n| n.to_string()).collect();
    assert_eq!(nodes_differ(&recorded), None);
    let other = vec!["kwok-node-1".to_string(), "worker (not kwok's)".to_string()];
    let why = nodes_differ(&other).expect("other nodes differ");
    assert!(
        why.contains(r#"missing ["kwok-node-2", "kwok-node-3"]"#)
            && why.contains(r#"not recorded ["worker (not kwok's)"]"#),
        "{why}"
    );
}

/// Every lab, run against the cluster. The labs' outputs hold only on the
/// recorded nodes: on other nodes a developer's run (USE_EXISTING_CLUSTER,
/// KO_NODES) is skipped saying why, and a run under CI fails, naming what
/// differs ([`common::skip`]).
#[test]
fn labs_run_as_written() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Fails, naming `hack/test`, when no cluster is reachable.
    drop(runtime.block_on(common::cluster()));
    drop(runtime);
    let (nodes, real_node) = cluster_nodes();
    if let Some(why) = nodes_differ(&nodes) {
        common::skip(&format!(
            "the training labs cannot run as written: {why}; run them with hack/test \
                 without USE_EXISTING_CLUSTER or KO_NODES"
        ));
        return;
    }
    let only: Vec<String> = std::env::var("TRAINING_LABS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let record = std::env::var_os("TRAINING_RECORD").is_some_and(|v| v == "1");
    let labs: Vec<Lab> = load_labs()
        .into_iter()
        .filter(|lab| {
            let file = lab.path.file_name().unwrap().to_string_lossy().into_owned();
            only.is_empty() || only.iter().any(|w| file.contains(w.as_str()))
        })
        .collect();
    assert!(!labs.is_empty(), "TRAINING_LABS={only:?} selects no lab");
    let needs_node: Vec<String> = labs
        .iter()
        .filter(|lab| lab.blocks.iter().any(|b| b.real_node && b.skip.is_none()))
        .map(|lab| relative(&lab.path))
        .collect();
    if !real_node && !needs_node.is_empty() {
        assert!(!common::in_ci(), "under CI, {needs_node:?} {NO_REAL_NODE}");
        say(&format!(
            "\n*** {needs_node:?}: the blocks that need a real node will be skipped (not a failure \
             outside CI): {NO_REAL_NODE}.\n"
        ));
    }
    let _lock = RunLock::take();
    let started = Instant::now();
    let failures: Vec<String> = labs
        .iter()
        .flat_map(|lab| run_lab(lab, record, true, real_node))
        .collect();
    say(&format!(
        "[training] {} labs in {:.1}s",
        labs.len(),
        started.elapsed().as_secs_f64()
    ));
    assert!(
        failures.is_empty(),
        "{} lab step(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
