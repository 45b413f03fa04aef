//! Faults: the operator keeps working and loses nothing. Each case asserts on
//! the cluster's final state.
//!
//! The API server outage runs on a dedicated control plane started by the
//! test (stopping the shared one would break every other test); the other
//! cases run on the cluster in KUBECONFIG with their own namespace and their
//! own operator (a process when it must be killed, in-process otherwise).

use ko_test_support as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::sample::{Sample, SampleSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kustomize_operator::kind::{ConditionStatus, ConditionType, Reason};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
/// How long convergence may take once the API server is back. Two clients
/// must reconnect first: the operator's watches and kube-controller-manager's
/// informers (Ready waits for the Deployment controller to observe the
/// Deployment). Both back off exponentially to 30 s, with jitter, while the
/// server is away.
const RECOVERY: Duration = Duration::from_secs(180);

fn sample(name: &str, count: i32) -> Sample {
    Sample::new(name, SampleSpec { count })
}

/// Waits up to `timeout` for `name` to be Ready; on timeout fails with its
/// status, its Deployment's status and the operator's log.
async fn wait_ready_or_explain(
    samples: &Api<Sample>,
    name: &str,
    operator: &common::OperatorProcess,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !is_ready(samples, name).await {
        if tokio::time::Instant::now() >= deadline {
            let status = samples.get_opt(name).await.ok().flatten().map(|s| s.status);
            let deployments: Api<Deployment> = Api::namespaced(
                samples.clone().into_client(),
                samples.namespace().unwrap_or("default"),
            );
            let deployment = deployments
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .map(|d| d.status);
            panic!(
                "{name} not Ready within {timeout:?}: {status:#?}\nits deployment: {deployment:#?}\noperator log:\n{}",
                operator.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn is_ready(samples: &Api<Sample>, name: &str) -> bool {
    samples
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| {
            let generation = s.metadata.generation;
            s.status
                .map(|st| st.is_ready() && st.observed_generation == generation)
        })
        .unwrap_or(false)
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec)
        .and_then(|s| s.replicas)
}

/// The operator binary as a child process, running only the Sample
/// controller in `namespace`, against `kubeconfig` if given.
fn operator_process(
    kubeconfig: Option<&Path>,
    namespace: &str,
    extra: &[&str],
) -> common::OperatorProcess {
    let kubeconfig = kubeconfig.map(|k| k.display().to_string());
    let env: Vec<(&str, &str)> = kubeconfig
        .iter()
        .map(|k| ("KUBECONFIG", k.as_str()))
        .collect();
    let mut args = vec!["--kinds", "sample", "--metrics-addr", ""];
    args.extend_from_slice(extra);
    common::OperatorProcess::spawn(namespace, &env, &args)
}

/// With `--max-concurrent-reconciles 3` and applies that take a second,
/// eight new Samples never have more than three reconciles running, and
/// the limit is reached (so a missing limit would show: eight at once).
#[tokio::test]
async fn no_more_reconciles_run_at_once_than_the_limit() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "limit").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let tmp = tempfile::tempdir().unwrap();
    let slow = kubectl_wrapper(tmp.path(), "case \"$*\" in *apply*) sleep 1;; esac");
    let limit = ["--max-concurrent-reconciles", "3"];
    let args = [&["--kubectl", slow.to_str().unwrap()][..], &limit[..]].concat();
    let operator = common::start_operator(&ns.name, &args).await;
    let names: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    for name in &names {
        samples
            .create(&PostParams::default(), &sample(name, 0))
            .await
            .unwrap();
    }
    let mut most = 0.0_f64;
    common::wait_for(TIMEOUT, "every Sample Ready", async || {
        let metrics = operator.metrics().encode();
        most = most.max(common::metric_sum(
            &metrics,
            "kustomize_operator_reconciles_in_flight",
            &[],
        ));
        let ready = futures::future::join_all(names.iter().map(|n| is_ready(&samples, n))).await;
        if ready.iter().all(|r| *r) {
            Ok(())
        } else {
            Err(ready)
        }
    })
    .await;
    assert_eq!(most, 3.0, "the most reconciles seen running at once");
    operator.stop().await;
}

/// An operator whose `kubectl apply` writes its process id to a marker
/// file and then sleeps `sleep_secs` (in a child, `sleep`); returns it
/// with the pid of that kubectl run, once a Sample's apply is in flight.
/// The engine starts each kubectl in a process group of its own, so the
/// pid is also the group of the run and its children.
async fn operator_with_slow_apply(
    client: &Client,
    prefix: &str,
    sleep_secs: u32,
    grace: &str,
) -> (
    common::TestNamespace,
    Api<Sample>,
    common::OperatorProcess,
    i32,
    tempfile::TempDir,
) {
    let ns = common::TestNamespace::new(client, prefix).await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("applying");
    let slow = kubectl_wrapper(
        tmp.path(),
        &format!(
            "case \"$*\" in *apply*) echo $$ > {m}.new && mv {m}.new {m}; sleep {sleep_secs};; esac",
            m = marker.display()
        ),
    );
    let operator = operator_process(
        None,
        &ns.name,
        &[
            "--kubectl",
            slow.to_str().unwrap(),
            "--shutdown-grace",
            grace,
        ],
    );
    samples
        .create(&PostParams::default(), &sample("web", 1))
        .await
        .unwrap();
    common::wait_until(
        TIMEOUT,
        "the first kubectl apply to start (its marker file)",
        || async { marker.exists() },
    )
    .await;
    let pid = std::fs::read_to_string(&marker).unwrap();
    let pid = pid.trim().parse().expect("the kubectl run's pid");
    (ns, samples, operator, pid, tmp)
}

/// Kills process group `group` when dropped: a test that finds the run
/// outliving the operator fails without leaving it running.
struct KillGroupOnDrop(i32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        // SAFETY: killpg only sends a signal, to the group of the test's
        // own kubectl stand-in (its pid, which the engine made a group).
        unsafe {
            libc::killpg(self.0, libc::SIGKILL);
        }
    }
}

/// The processes of process group `group` that are alive (not zombies:
/// a zombie has exited, and only waits for its parent to read its
/// status), as "pid state command" lines, read from /proc.
fn alive_in_group(group: i32) -> Vec<String> {
    let mut alive = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (state, pgrp) = (fields[0], fields[2].parse::<i32>().unwrap_or(0));
        if pgrp == group && state != "Z" {
            let command = head.split_once('(').map_or("", |(_, c)| c);
            alive.push(format!("{pid} {state} {command}"));
        }
    }
    alive
}

/// A kubectl stand-in: runs `body` (sh) before handing over to the real
/// kubectl. `$in` is a file holding what the operator wrote to its standard
/// input (the objects of an apply).
fn kubectl_wrapper(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("kubectl");
    common::write_script(
        &path,
        &format!(
            "in=$(mktemp)\ntrap 'rm -f \"$in\"' EXIT\ncase \"$*\" in *' -f -'*) cat > \"$in\";; esac\n{body}\n{} \"$@\" < \"$in\"",
            common::kubectl_path().display()
        ),
    );
    path
}

/// A control plane of the test's own, stopped when dropped.
struct OwnPlane {
    env: Vec<(String, String)>,
    kubeconfig: PathBuf,
}

impl OwnPlane {
    fn script() -> PathBuf {
        common::repo().join("hack/control-plane/control-plane")
    }

    /// The script, for this plane only: never with a real node (one
    /// machine has room for one kubelet, and the shared plane may run it).
    fn command(env: &[(String, String)]) -> Command {
        let mut command = Command::new(Self::script());
        command.env_remove("KO_REAL_NODE").envs(env.iter().cloned());
        command
    }

    fn up(state: &Path) -> Self {
        let env = vec![(
            "KO_CONTROL_PLANE_DIR".to_string(),
            state.display().to_string(),
        )];
        // `up`, then `crds`: the project's CRDs applied and established.
        for verb in ["up", "crds"] {
            let out = Self::command(&env)
                .arg(verb)
                .output()
                .unwrap_or_else(|e| panic!("control-plane {verb}: {e}"));
            assert!(
                out.status.success(),
                "control-plane {verb}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let kubeconfig = state.join("kubeconfig");
        Self { env, kubeconfig }
    }

    fn component(&self, verb: &str, name: &str) {
        let out = Self::command(&self.env)
            .args([verb, name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{verb} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    async fn client(&self) -> Client {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        Client::try_from(config).unwrap()
    }
}

impl Drop for OwnPlane {
    fn drop(&mut self) {
        let _ = Self::command(&self.env).arg("down").output();
    }
}

#[tokio::test]
async fn api_server_outage_and_dropped_watches_converge_without_restart() {
    // Needs a cluster to exist at all (and kubectl); otherwise skip like the rest.
    let _ = common::cluster().await;
    // Longer than the operator's kubectl timeout (10 s, below): a run in
    // flight when the API server goes times out during the outage. The
    // watches' backoff (0.8 s doubling to 30 s, as client-go's) grows with
    // it: 30 s of outage took the test 122 s, 15 s took 81 s.
    let outage = std::env::var("FAULT_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let state = tempfile::tempdir().unwrap();
    let plane = OwnPlane::up(&state.path().join("plane"));
    let client = plane.client().await;
    let ns = "outage";
    common::wait_until(
        TIMEOUT,
        format!("the namespace {ns} created on the own control plane"),
        || async {
            Command::new(common::kubectl_path())
                .args(["create", "namespace", ns])
                .env("KUBECONFIG", &plane.kubeconfig)
                .output()
                .is_ok_and(|o| o.status.success())
        },
    )
    .await;
    common::wait_until(
        TIMEOUT,
        format!("the default ServiceAccount of {ns}"),
        || async {
            Command::new(common::kubectl_path())
                .args(["-n", ns, "get", "serviceaccount", "default"])
                .env("KUBECONFIG", &plane.kubeconfig)
                .output()
                .is_ok_and(|o| o.status.success())
        },
    )
    .await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut operator = operator_process(Some(&plane.kubeconfig), ns, &["--kubectl-timeout", "10s"]);
    for name in ["a", "b", "c"] {
        samples
            .create(&PostParams::default(), &sample(name, 1))
            .await
            .unwrap();
    }
    for name in ["a", "b", "c"] {
        common::wait_until(TIMEOUT, format!("the Sample {name} Ready"), || {
            is_ready(&samples, name)
        })
        .await;
    }

    // Changes land, then the API server goes away before the operator is done.
    samples
        .create(&PostParams::default(), &sample("d", 2))
        .await
        .unwrap();
    samples
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 3}})),
        )
        .await
        .unwrap();
    samples.delete("b", &DeleteParams::default()).await.unwrap();
    plane.component("stop-component", "kube-apiserver");
    tokio::time::sleep(Duration::from_secs(outage)).await;
    plane.component("start-component", "kube-apiserver");

    wait_ready_or_explain(&samples, "d", &operator, RECOVERY).await;
    common::wait_until(TIMEOUT, "the Deployment a at 3 replicas", || async {
        replicas(&deployments, "a").await == Some(3)
    })
    .await;
    wait_ready_or_explain(&samples, "a", &operator, TIMEOUT).await;
    common::wait_until(TIMEOUT, "the Sample b gone", || async {
        samples.get_opt("b").await.is_ok_and(|s| s.is_none())
    })
    .await;
    assert_eq!(replicas(&deployments, "b").await, None);
    assert_eq!(replicas(&deployments, "d").await, Some(2));
    assert!(operator.running(), "the operator restarted or died");

    // Dropped connections again: a later change is still picked up.
    plane.component("stop-component", "kube-apiserver");
    plane.component("start-component", "kube-apiserver");
    samples
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"count": 4}})),
        )
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment c at 4 replicas", || async {
        replicas(&deployments, "c").await == Some(4)
    })
    .await;

    // Nothing stuck, nothing duplicated.
    let all = samples.list(&ListParams::default()).await.unwrap().items;
    assert!(all.iter().all(|s| s.metadata.deletion_timestamp.is_none()));
    let names: Vec<_> = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|d| d.metadata.name)
        .collect();
    let mut expected: Vec<_> = all.iter().filter_map(|s| s.metadata.name.clone()).collect();
    expected.sort();
    let mut got = names.clone();
    got.sort();
    assert_eq!(got, expected, "one Deployment per Sample");
    assert!(operator.running());
    operator.signal(libc::SIGTERM);
    assert!(operator.wait_exit(Duration::from_secs(30)).await.is_some());
}

/// With kube-controller-manager stopped, no Deployment gets its
/// controller's first look until the test plays that controller. An apply
/// whose Deployment waits for it parks its status and gives its reconcile
/// slot back: with one slot, a second Sample is applied while the first's
/// status is still unwritten. The look, when it comes, gets one status
/// that says Ready at once; without it, the status is written at the
/// parking's deadline (still waiting); a Sample deleted while its status is
/// parked has its Deployment deleted (nothing else would: the garbage
/// collector is stopped too).
#[tokio::test]
async fn a_status_waiting_for_the_first_look_holds_no_reconcile_slot_and_is_not_lost() {
    let _ = common::cluster().await;
    let state = tempfile::tempdir().unwrap();
    let plane = OwnPlane::up(&state.path().join("plane"));
    let client = plane.client().await;
    let ns = "parked";
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    plane.component("stop-component", "kube-controller-manager");
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let one_slot = ["--max-concurrent-reconciles", "1"];
    let operator = operator_process(Some(&plane.kubeconfig), ns, &one_slot);
    let exists = |name: &'static str| {
        let deployments = deployments.clone();
        async move { deployments.get_opt(name).await.unwrap().is_some() }
    };
    let written = |name: &'static str| {
        let samples = samples.clone();
        async move {
            let status = samples.get(name).await.unwrap().status;
            status.is_some_and(|s| s.applied_digest.is_some())
        }
    };

    let seen_a = common::sample::record_statuses(&samples, "a").await;
    samples
        .create(&PostParams::default(), &sample("a", 0))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment a", || exists("a")).await;
    samples
        .create(&PostParams::default(), &sample("b", 0))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment b", || exists("b")).await;
    assert!(
        !written("a").await,
        "b was applied only after a's status was written: a held the one slot\n{}",
        operator.log_tail()
    );

    // The Deployment controller's first look at a.
    let status = json!({"status": {"observedGeneration": 1, "replicas": 0}});
    deployments
        .patch_status("a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    wait_ready_or_explain(&samples, "a", &operator, TIMEOUT).await;
    // The watch may deliver the status a GET already returned a moment later.
    common::wait_until(TIMEOUT, "a Ready status of a among those seen", || async {
        seen_a.all().iter().any(|s| s.is_ready())
    })
    .await;
    let statuses = seen_a.all();
    let recorded: Vec<_> = statuses
        .iter()
        .filter(|s| s.applied_digest.is_some())
        .collect();
    assert!(
        !recorded.is_empty() && recorded.iter().all(|s| s.is_ready()),
        "a status recorded the apply before Ready: {statuses:#?}"
    );
    assert!(common::has_event(&client, ns, "a", "Applied").await);
    assert!(!common::has_event(&client, ns, "a", "Healthy").await);

    // b never gets its look: its status is written at the deadline.
    common::wait_until(TIMEOUT, "the status of b written", || written("b")).await;
    let b = samples.get("b").await.unwrap().status.unwrap();
    let ready = b
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .unwrap();
    assert_eq!(ready.status, ConditionStatus::Unknown, "{b:#?}");
    assert_eq!(ready.reason, Reason::Progressing, "{b:#?}");
    assert!(b.inventory.is_some(), "{b:#?}");

    samples
        .create(&PostParams::default(), &sample("c", 0))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Deployment c", || exists("c")).await;
    assert!(!written("c").await, "c's status was not parked");
    samples.delete("c", &DeleteParams::default()).await.unwrap();
    common::wait_until(TIMEOUT, "the Sample c gone", || async {
        samples.get_opt("c").await.unwrap().is_none()
    })
    .await;
    assert!(
        !exists("c").await,
        "the parked apply's Deployment was left behind"
    );
    drop(operator);
}

#[tokio::test]
async fn sigkill_mid_apply_then_restart_converges_and_cleans_temp_dirs() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sigkill").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let slow = kubectl_wrapper(tmp.path(), "case \"$*\" in *apply*) sleep 4;; esac");
    let args = [
        "--kubectl",
        slow.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
    ];
    let mut first = operator_process(None, &ns.name, &args);
    samples
        .create(&PostParams::default(), &sample("web", 2))
        .await
        .unwrap();
    let run_dir = work.join(format!("run-{}-0", first.pid()));
    common::wait_until(
        TIMEOUT,
        format!("a temp dir in {}", run_dir.display()),
        || async { std::fs::read_dir(&run_dir).is_ok_and(|mut d| d.next().is_some()) },
    )
    .await;
    first.signal(libc::SIGKILL);
    first
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("killed");
    assert!(
        run_dir.exists(),
        "the killed operator left its overlay behind"
    );

    let _second = operator_process(None, &ns.name, &args);
    common::wait_until(TIMEOUT, "the Sample web Ready", || {
        is_ready(&samples, "web")
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    assert_eq!(replicas(&deployments, "web").await, Some(2));
    assert!(!run_dir.exists(), "leftover temp dir not cleaned at start");
}

#[tokio::test]
async fn hanging_kubectl_is_killed_recorded_and_retried_while_others_flow() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "hang").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let tmp = tempfile::tempdir().unwrap();
    let hang = kubectl_wrapper(
        tmp.path(),
        "if grep -qs '\"app.kubernetes.io/instance\":\"stuck\"' \"$in\"; then sleep 600; fi",
    );
    let operator = common::start_operator(
        &ns.name,
        &[
            "--kubectl",
            hang.to_str().unwrap(),
            "--kubectl-timeout",
            "2s",
        ],
    )
    .await;
    samples
        .create(&PostParams::default(), &sample("stuck", 1))
        .await
        .unwrap();
    for name in ["ok1", "ok2"] {
        samples
            .create(&PostParams::default(), &sample(name, 1))
            .await
            .unwrap();
    }
    common::wait_until(TIMEOUT, "the Sample ok1 Ready", || {
        is_ready(&samples, "ok1")
    })
    .await;
    common::wait_until(TIMEOUT, "the Sample ok2 Ready", || {
        is_ready(&samples, "ok2")
    })
    .await;
    // Between retries; while one runs, the status says it is applying.
    let status = common::wait_for(
        TIMEOUT,
        "the Sample stuck reporting a timed-out kubectl",
        || async {
            let status = samples.get("stuck").await.unwrap().status;
            let reported = status.as_ref().is_some_and(|s| {
                let timed_out =
                    (s.last_command.as_ref()).is_some_and(|c| c.timed_out && c.exit_code.is_none());
                timed_out
                    && s.message
                        .as_deref()
                        .is_some_and(|m| m.contains("timed out"))
            });
            match status {
                Some(status) if reported => Ok(status),
                other => Err(other),
            }
        },
    )
    .await;
    assert!(!status.is_ready());
    // Retried with backoff: more timeouts follow, a second or more apart.
    common::wait_until(TIMEOUT, "3 timed-out kubectl runs", || async {
        operator.kubectl_stats().timed_out() >= 3
    })
    .await;
    // Still flowing: a new Sample becomes Ready while "stuck" keeps failing.
    samples
        .create(&PostParams::default(), &sample("ok3", 1))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample ok3 Ready", || {
        is_ready(&samples, "ok3")
    })
    .await;
    operator.stop().await;
}

#[tokio::test]
async fn a_sample_deleted_while_the_operator_is_down_is_cleaned_up_after_restart() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "downdel").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let first = common::start_operator(&ns.name, &[]).await;
    samples
        .create(&PostParams::default(), &sample("web", 1))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web Ready", || {
        is_ready(&samples, "web")
    })
    .await;
    first.stop().await;

    samples
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web marked for deletion", || async {
        samples
            .get_opt("web")
            .await
            .unwrap()
            .is_some_and(|s| s.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert!(replicas(&deployments, "web").await.is_some());

    let second = common::start_operator(&ns.name, &[]).await;
    common::wait_until(TIMEOUT, "the Sample web gone", || async {
        samples.get_opt("web").await.unwrap().is_none()
    })
    .await;
    assert_eq!(replicas(&deployments, "web").await, None);
    second.stop().await;
}

#[tokio::test]
async fn sigterm_finishes_the_in_flight_run_and_records_it() {
    let client = common::cluster().await;
    let (_ns, samples, mut operator, kubectl, _tmp) =
        operator_with_slow_apply(&client, "sigterm", 3, "20s").await;
    let _group = KillGroupOnDrop(kubectl);
    assert!(
        !alive_in_group(kubectl).is_empty(),
        "the kubectl run {kubectl} is not seen running"
    );
    let start = Instant::now();
    operator.signal(libc::SIGTERM);
    let status = operator
        .wait_exit(Duration::from_secs(25))
        .await
        .expect("exits within the grace period");
    assert!(status.success(), "{status:?}");
    assert!(start.elapsed() < Duration::from_secs(20));
    // The run in flight finished and its outcome was recorded before exit:
    // applied (its Deployment may still be rolling out, so Ready may wait).
    let s = samples.get("web").await.unwrap().status.unwrap();
    assert!(
        s.ready_reason().is_some_and(|r| r.applied()),
        "the apply is recorded as done: {s:?}"
    );
    assert!(s.applied_digest.is_some(), "{s:?}");
    assert_eq!(s.last_command.unwrap().exit_code, Some(0));
    assert_eq!(
        alive_in_group(kubectl),
        Vec::<String>::new(),
        "the kubectl run (process group {kubectl}) outlived the operator"
    );
}

#[tokio::test]
async fn sigterm_past_the_grace_period_kills_kubectl_and_records_it() {
    let client = common::cluster().await;
    let (_ns, samples, mut operator, kubectl, _tmp) =
        operator_with_slow_apply(&client, "sigkillgrace", 600, "5s").await;
    let _group = KillGroupOnDrop(kubectl);
    // The run (the stand-in's shell) and its child (`sleep 600`), both in
    // the run's process group, seen before (the shell may not have forked
    // its sleep yet when the run is first seen).
    let what = format!("the kubectl run {kubectl} and its sleep running");
    common::wait_for(Duration::from_secs(10), what, async || {
        let running = alive_in_group(kubectl);
        let both = running.len() >= 2 && running.iter().any(|p| p.ends_with(" sleep"));
        if both { Ok(()) } else { Err(running) }
    })
    .await;
    let start = Instant::now();
    operator.signal(libc::SIGTERM);
    operator
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits around the grace period");
    assert!(start.elapsed() < Duration::from_secs(10));
    // Killed, not left behind: nothing of the run's process group is alive
    // once the operator has exited.
    assert_eq!(
        alive_in_group(kubectl),
        Vec::<String>::new(),
        "the kubectl run (process group {kubectl}) outlived the operator"
    );
    let s = samples.get("web").await.unwrap().status.unwrap();
    let cmd = s.last_command.clone().expect("the killed run is recorded");
    assert_eq!(cmd.exit_code, None);
    assert!(!s.is_ready());
}

#[tokio::test]
async fn megabytes_of_kubectl_output_keep_the_status_small() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "huge").await;
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let tmp = tempfile::tempdir().unwrap();
    let noisy = kubectl_wrapper(
        tmp.path(),
        "case \"$*\" in *apply*) head -c 3000000 /dev/zero | tr '\\0' 'o'; head -c 3000000 /dev/zero | tr '\\0' 'e' >&2;; esac",
    );
    let operator = common::start_operator(&ns.name, &["--kubectl", noisy.to_str().unwrap()]).await;
    samples
        .create(&PostParams::default(), &sample("web", 1))
        .await
        .unwrap();
    common::wait_until(TIMEOUT, "the Sample web Ready", || {
        is_ready(&samples, "web")
    })
    .await;
    let s = samples.get("web").await.unwrap();
    let size = serde_json::to_string(&s.status).unwrap().len();
    assert!(size < 8 * 1024, "status is {size} bytes");
    let cmd = s.status.unwrap().last_command.unwrap();
    assert!(
        cmd.stdout.contains("deployment.apps/web"),
        "the tail is kept"
    );
    operator.stop().await;
}
