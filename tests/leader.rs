//! Leader election between operator *processes* (the built binary), with
//! short lease durations: one replica reconciles, a killed leader is replaced
//! once its lease ran out, a leader stopped with SIGTERM hands over before
//! its lease would run out, a leader that loses its Lease exits. Times are
//! checked as an order of events on the Lease, never as a budget: the
//! waits allow a minute.

use ko_test_support as common;

use std::time::{Duration, Instant};

use common::OperatorProcess;
use common::sample::{Sample, SampleSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

const TIMEOUT: Duration = Duration::from_secs(60);
const LEASE: &str = "kustomize-operator";

/// A replica: the process, its identity and its metrics port.
struct Replica {
    process: OperatorProcess,
    name: &'static str,
    port: u16,
}

impl Replica {
    /// Starts `name` with leader election in `ns` (the Lease lives there too).
    fn start(name: &'static str, ns: &str, lease: &str, renew: &str, retry: &str) -> Self {
        Self::spawn(name, ns, "--leader-elect", [lease, renew, retry])
    }

    /// Starts `name` in `ns` with `mode` (`--leader-elect` or
    /// `--auto-shard`), its Leases in `ns`, and their lease duration,
    /// renew deadline and retry period.
    fn spawn(name: &'static str, ns: &str, mode: &str, [lease, renew, retry]: [&str; 3]) -> Self {
        let port = common::free_port();
        let addr = format!("127.0.0.1:{port}");
        let process = OperatorProcess::spawn(
            ns,
            &[("POD_NAME", name)],
            &[
                "--kinds",
                "sample",
                "--metrics-addr",
                &addr,
                mode,
                "--leader-elect-namespace",
                ns,
                "--leader-elect-lease-duration",
                lease,
                "--leader-elect-renew-deadline",
                renew,
                "--leader-elect-retry-period",
                retry,
            ],
        );
        Self {
            process,
            name,
            port,
        }
    }

    async fn metrics(&self) -> String {
        match common::http_get(self.port, "/metrics").await {
            Some((200, body)) => body,
            other => panic!(
                "{}: /metrics answered {other:?}; log:\n{}",
                self.name,
                self.process.log_tail()
            ),
        }
    }

    /// kubectl apply runs so far.
    async fn applies(&self) -> f64 {
        common::metric_sum(
            &self.metrics().await,
            "kustomize_operator_kubectl_runs_total",
            &["verb=\"apply\""],
        )
    }

    /// Reconciles that found nothing to do.
    async fn skipped(&self) -> f64 {
        common::metric_sum(
            &self.metrics().await,
            "kustomize_operator_reconcile_skipped_total",
            &[],
        )
    }

    async fn wait_serving(&self) {
        common::wait_until(
            TIMEOUT,
            format!("/readyz of {} to answer", self.name),
            || async { common::http_get(self.port, "/readyz").await.is_some() },
        )
        .await;
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// The Lease's spec.
async fn lease_spec(leases: &Api<Lease>) -> LeaseSpec {
    leases.get(LEASE).await.unwrap().spec.unwrap_or_default()
}

/// A time of the Lease, which must be set.
fn time(time: &Option<MicroTime>) -> Timestamp {
    time.as_ref().expect("a time in the Lease").0
}

async fn create_sample(client: &Client, ns: &str, name: &str) {
    Api::<Sample>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &Sample::new(name, SampleSpec { count: 1 }),
        )
        .await
        .unwrap();
}

async fn wait_applied(client: &Client, ns: &str, name: &str) {
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    common::wait_until(
        TIMEOUT,
        format!("the Sample {name} Ready with its Deployment"),
        || async {
            samples
                .get(name)
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.is_ready())
                && deployments.get_opt(name).await.unwrap().is_some()
        },
    )
    .await;
}

#[tokio::test]
async fn two_replicas_apply_once_and_a_killed_leader_is_replaced() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "leader").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let a = Replica::start("replica-a", &ns.name, "3s", "2s", "250ms");
    let b = Replica::start("replica-b", &ns.name, "3s", "2s", "250ms");
    a.wait_serving().await;
    b.wait_serving().await;
    common::wait_until(TIMEOUT, "a holder of the Lease", || async {
        holder(&leases).await.is_some()
    })
    .await;
    let leader_name = holder(&leases).await.unwrap();
    let (mut leader, follower) = if leader_name == a.name {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(leader.name, leader_name);

    // One Sample, two replicas: applied once, by the leader.
    create_sample(&client, &ns.name, "web").await;
    wait_applied(&client, &ns.name, "web").await;
    // The positive marker: the leader reconciled again (a label changed)
    // and found nothing to do.
    let (ok, _, err) = common::kubectl(&["-n", &ns.name, "label", "sample", "web", "touched=1"]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "a skipped reconcile in the leader", || async {
        leader.skipped().await >= 1.0
    })
    .await;
    assert_eq!(leader.applies().await, 1.0);
    assert_eq!(
        follower.applies().await,
        0.0,
        "the standby replica ran kubectl"
    );
    let standby = follower.metrics().await;
    assert_eq!(
        common::metric_sum(&standby, "kustomize_operator_leader", &[]),
        0.0
    );
    assert_eq!(
        common::metric_sum(&standby, "kustomize_operator_reconciles_total", &[]),
        0.0
    );
    assert_eq!(
        common::metric_sum(&leader.metrics().await, "kustomize_operator_leader", &[]),
        1.0
    );
    // Both are ready (a standby must be, for rolling updates) and say which they are.
    let (code, body) = common::http_get(follower.port, "/readyz").await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("standing by"), "{body}");

    // The leader dies without a word: the other takes over, and only once
    // the lease (3 s) ran out after the dead leader's last renewal.
    leader.process.signal(libc::SIGKILL);
    let killed = Instant::now();
    assert!(leader.process.wait_exit(TIMEOUT).await.is_some());
    let last = lease_spec(&leases).await;
    assert_eq!(last.holder_identity.as_deref(), Some(leader.name));
    common::wait_until(
        TIMEOUT,
        format!("{} holding the Lease", follower.name),
        || async { holder(&leases).await.as_deref() == Some(follower.name) },
    )
    .await;
    eprintln!(
        "takeover after SIGKILL of the leader: {:?}",
        killed.elapsed()
    );
    let taken = lease_spec(&leases).await;
    let (renewed, acquired) = (time(&last.renew_time), time(&taken.acquire_time));
    assert!(
        acquired >= renewed + SignedDuration::from_secs(3),
        "{} took the Lease at {acquired}, before the lease of {} renewed at {renewed} ran out",
        follower.name,
        leader.name
    );

    // ... and reconciles a new Sample; the old one, unchanged, spawns nothing.
    create_sample(&client, &ns.name, "api").await;
    wait_applied(&client, &ns.name, "api").await;
    common::wait_until(TIMEOUT, "a skipped reconcile in the new leader", || async {
        follower.skipped().await >= 1.0
    })
    .await;
    assert_eq!(follower.applies().await, 1.0);
}

#[tokio::test]
async fn sigterm_releases_the_lease_for_an_immediate_takeover() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "release").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    // A long lease: a takeover in a few seconds can only come from a release.
    let mut first = Replica::start("first", &ns.name, "30s", "20s", "250ms");
    first.wait_serving().await;
    common::wait_until(TIMEOUT, "first holding the Lease", || async {
        holder(&leases).await.as_deref() == Some("first")
    })
    .await;
    let second = Replica::start("second", &ns.name, "30s", "20s", "250ms");
    second.wait_serving().await;

    let last = lease_spec(&leases).await;
    first.process.signal(libc::SIGTERM);
    let stopped = Instant::now();
    let status = first.process.wait_exit(TIMEOUT).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM: {status:?}; log:\n{}",
        first.process.log_tail()
    );
    common::wait_until(TIMEOUT, "second holding the Lease", || async {
        holder(&leases).await.as_deref() == Some("second")
    })
    .await;
    eprintln!(
        "takeover after SIGTERM of the leader: {:?}",
        stopped.elapsed()
    );
    // Taken before first's lease (30 s) could have run out since a renewal
    // older than its last: it was released.
    let taken = lease_spec(&leases).await;
    let (renewed, acquired) = (time(&last.renew_time), time(&taken.acquire_time));
    assert!(
        acquired < renewed + SignedDuration::from_secs(30),
        "second took the Lease at {acquired}, once first's lease renewed at {renewed} ran out: it was not released"
    );
    create_sample(&client, &ns.name, "web").await;
    wait_applied(&client, &ns.name, "web").await;
    assert_eq!(second.applies().await, 1.0);
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_and_exits() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "lost").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let mut only = Replica::start("only", &ns.name, "3s", "2s", "250ms");
    common::wait_until(TIMEOUT, "only holding the Lease", || async {
        holder(&leases).await.as_deref() == Some("only")
    })
    .await;

    // Another holder writes itself into the Lease (compare-and-swap, retried
    // on conflicts with the renewals).
    common::wait_until(TIMEOUT, "the intruder written into the Lease", || async {
        let mut lease = leases.get(LEASE).await.unwrap();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(60);
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        leases
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .is_ok()
    })
    .await;
    let status = only.process.wait_exit(TIMEOUT).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "the replica that lost its lease must exit with an error: {status:?}; log:\n{}",
        only.process.log_tail()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some("intruder"));
}

// ---- Automatic sharding (`--auto-shard`): replicas share the Samples ----

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as ApiEvent;
use kustomize_operator::sharding::table::Table;
use kustomize_operator::sharding::{Slots, slot_of};

impl Replica {
    /// Starts `name` sharing the Samples of `ns` with the other replicas
    /// of the ring there (short durations: a Lease of 3 s).
    fn sharing(name: &'static str, ns: &str) -> Self {
        Self::spawn(name, ns, "--auto-shard", ["3s", "2s", "250ms"])
    }

    /// A gauge or counter of its metrics, summed.
    async fn metric(&self, name: &str) -> f64 {
        common::metric_sum(&self.metrics().await, name, &[])
    }
}

/// The ring's table as it stands.
async fn table(client: &Client, ns: &str) -> Table {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    cms.get_opt("kustomize-operator-shards")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .map(|data| Table::from_data(&data))
        .unwrap_or_default()
}

/// Waits until exactly `members` hold every slot between them.
async fn wait_table(client: &Client, ns: &str, members: &[&str]) -> Table {
    let mut seen = Table::default();
    common::wait_until(
        TIMEOUT,
        format!("the ring's slots all held by {members:?}"),
        async || {
            seen = table(client, ns).await;
            let holders: Vec<&str> = seen.owners.keys().map(String::as_str).collect();
            holders == members && seen.free().is_empty()
        },
    )
    .await;
    seen
}

/// Creates Samples `prefix-0` .. `prefix-(n-1)`.
async fn create_samples(client: &Client, ns: &str, prefix: &str, n: usize) {
    for i in 0..n {
        create_sample(client, ns, &format!("{prefix}-{i}")).await;
    }
}

/// Waits until every Sample of `ns` (there are `n`) is Ready.
async fn wait_all_ready(client: &Client, ns: &str, n: usize) {
    let samples: Api<Sample> = Api::namespaced(client.clone(), ns);
    common::wait_until(TIMEOUT, format!("{n} Samples Ready"), || async {
        let list = samples.list(&Default::default()).await.unwrap();
        list.items.len() == n
            && list
                .items
                .iter()
                .all(|s| s.status.as_ref().is_some_and(|s| s.is_ready()))
    })
    .await;
}

/// The replicas whose events are about each Sample, by the Sample's UID.
async fn reporters(client: &Client, ns: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let events: Api<ApiEvent> = Api::namespaced(client.clone(), ns);
    let mut by_uid: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for event in events.list(&Default::default()).await.unwrap() {
        let Some(uid) = event.regarding.and_then(|r| {
            (r.kind.as_deref() == Some("Sample"))
                .then_some(r.uid)
                .flatten()
        }) else {
            continue;
        };
        let instance = event.reporting_instance.unwrap_or_default();
        let seen = by_uid.entry(uid).or_default();
        if !seen.contains(&instance) {
            seen.push(instance);
        }
    }
    by_uid
}

#[tokio::test]
async fn three_replicas_share_the_samples_and_take_over_a_killed_ones_share() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sharing").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let replicas = [
        Replica::sharing("share-a", &ns.name),
        Replica::sharing("share-b", &ns.name),
        Replica::sharing("share-c", &ns.name),
    ];
    let ring = wait_table(&client, &ns.name, &["share-a", "share-b", "share-c"]).await;
    for member in ring.owners.values() {
        assert!((18..=24).contains(&member.len()), "an even share: {ring:?}");
    }
    create_samples(&client, &ns.name, "web", 24).await;
    wait_all_ready(&client, &ns.name, 24).await;

    // Each Sample was reconciled by the replica whose slots hold its UID,
    // and by no other (events name the replica that reported them).
    let samples: Api<Sample> = Api::namespaced(client.clone(), &ns.name);
    let by_uid = reporters(&client, &ns.name).await;
    for sample in samples.list(&Default::default()).await.unwrap() {
        let uid = sample.metadata.uid.clone().unwrap();
        let owner = ring.owner_of(slot_of(&uid)).unwrap().to_string();
        assert_eq!(
            by_uid.get(&uid),
            Some(&vec![owner]),
            "{:?}",
            sample.metadata.name
        );
    }
    let mut held = 0.0;
    for replica in &replicas {
        held += replica.metric("kustomize_operator_shard_resources").await;
        assert_eq!(
            replica.metric("kustomize_operator_shard_members").await,
            3.0
        );
    }
    assert_eq!(held, 24.0, "every Sample in exactly one replica's share");
    // From 1.36 the local plane serves KEP-5866's shard selector: no
    // replica reads another's Samples. Before, each filters as it reads.
    let version = client.apiserver_version().await.unwrap();
    let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
    for replica in &replicas {
        let foreign = replica
            .metric("kustomize_operator_shard_foreign_read")
            .await;
        if minor >= 36 {
            assert_eq!(
                foreign, 0.0,
                "{} read Samples of other shares",
                replica.name
            );
        } else {
            assert!(
                foreign > 0.0,
                "{} read only its own: filtered where?",
                replica.name
            );
        }
    }

    // A replica killed: its share goes to the others once its Lease ran
    // out, and the Samples created meanwhile are reconciled.
    let [a, b, c] = replicas;
    c.process.signal(libc::SIGKILL);
    create_samples(&client, &ns.name, "late", 6).await;
    let after = wait_table(&client, &ns.name, &["share-a", "share-b"]).await;
    assert_eq!(
        after.held_by("share-a").union(after.held_by("share-b")),
        Slots::ALL
    );
    wait_all_ready(&client, &ns.name, 30).await;
    let taken = a
        .metric("kustomize_operator_shard_unowned_seconds_count")
        .await
        + b.metric("kustomize_operator_shard_unowned_seconds_count")
            .await;
    assert!(
        taken >= ring.held_by("share-c").len() as f64,
        "the killed replica's slots were taken"
    );
    common::wait_until(TIMEOUT, "30 Samples in the two shares", || async {
        a.metric("kustomize_operator_shard_resources").await
            + b.metric("kustomize_operator_shard_resources").await
            == 30.0
    })
    .await;
    drop(c);
}

#[tokio::test]
async fn replicas_joining_and_leaving_during_a_burst_hand_over_without_overlap() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "resharing").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    // The checker: every version of the table the test sees holds each
    // slot at most once (a watch from the start, kept in the background).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Table>::new()));
    let seen = versions.clone();
    let checker = tokio::spawn(async move {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let config = kube::runtime::watcher::Config::default()
            .fields("metadata.name=kustomize-operator-shards");
        let mut events = kube::runtime::watcher(cms, config)
            .applied_objects()
            .boxed();
        while let Some(Ok(cm)) = events.next().await {
            seen.lock()
                .unwrap()
                .push(Table::from_data(&cm.data.unwrap_or_default()));
        }
    });
    let a = Replica::sharing("solo", &ns.name);
    wait_table(&client, &ns.name, &["solo"]).await;
    // 1 -> 3 during a burst.
    let burst = create_samples(&client, &ns.name, "burst", 40);
    let joined = async {
        let b = Replica::sharing("joined-b", &ns.name);
        let c = Replica::sharing("joined-c", &ns.name);
        (b, c)
    };
    let (_, (b, c)) = tokio::join!(burst, joined);
    wait_table(&client, &ns.name, &["joined-b", "joined-c", "solo"]).await;
    wait_all_ready(&client, &ns.name, 40).await;
    // 3 -> 1 during another: the two stop gracefully and hand back.
    let burst = create_samples(&client, &ns.name, "more", 20);
    b.process.signal(libc::SIGTERM);
    c.process.signal(libc::SIGTERM);
    burst.await;
    wait_table(&client, &ns.name, &["solo"]).await;
    wait_all_ready(&client, &ns.name, 60).await;
    common::wait_until(TIMEOUT, "60 Samples in the one share", || async {
        a.metric("kustomize_operator_shard_resources").await == 60.0
    })
    .await;
    checker.abort();
    let versions = versions.lock().unwrap();
    assert!(
        versions.len() >= 4,
        "the checker saw the handovers: {}",
        versions.len()
    );
    for table in versions.iter() {
        let mut held = Slots::NONE;
        for slots in table.owners.values() {
            assert_eq!(held.0 & slots.0, 0, "a slot held twice: {table:?}");
            held = held.union(*slots);
        }
    }
    drop((b, c));
}

/// Deletes a cluster-scoped object when dropped.
struct DeleteOnDrop(Vec<String>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        for object in &self.0 {
            let _ = common::kubectl(&["delete", object, "--ignore-not-found"]);
        }
    }
}

#[tokio::test]
async fn a_sharing_replica_that_cannot_renew_its_lease_stops_and_its_share_moves() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "unrenewed").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let mut victim = Replica::sharing("victim", &ns.name);
    let survivor = Replica::sharing("survivor", &ns.name);
    wait_table(&client, &ns.name, &["survivor", "victim"]).await;
    create_samples(&client, &ns.name, "web", 8).await;
    wait_all_ready(&client, &ns.name, 8).await;

    // The API server refuses the victim's renewals from now on (an
    // admission policy on its Lease), as a partition would.
    let policy = format!("ko-test-{}", ns.name);
    let _policy = DeleteOnDrop(vec![
        format!("validatingadmissionpolicybinding.admissionregistration.k8s.io/{policy}"),
        format!("validatingadmissionpolicy.admissionregistration.k8s.io/{policy}"),
    ]);
    let documents = serde_json::json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": policy},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                        "operations": ["UPDATE"], "resources": ["leases"],
                    }]},
                    "validations": [{
                        "expression": "object.metadata.name != 'kustomize-operator-member-victim'",
                        "message": "the test cuts the victim off",
                    }],
                },
            },
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": policy},
                "spec": {
                    "policyName": policy,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": ns.name},
                    }},
                },
            },
        ],
    });
    let (ok, _, err) = common::kubectl_stdin(&["apply", "-f", "-"], &documents.to_string());
    assert!(ok, "{err}");

    // It stops working and exits (failing: a restart makes it a member
    // again); the survivor takes its share once its Lease ran out, and
    // the Samples created meanwhile are reconciled.
    let status = victim.process.wait_exit(TIMEOUT).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}: {}",
        victim.process.log_tail()
    );
    assert!(
        victim
            .process
            .log()
            .contains("could not renew this replica's Lease before the renew deadline"),
        "{}",
        victim.process.log_tail()
    );
    create_samples(&client, &ns.name, "late", 8).await;
    wait_table(&client, &ns.name, &["survivor"]).await;
    wait_all_ready(&client, &ns.name, 16).await;
    assert!(
        survivor
            .metric("kustomize_operator_shard_unowned_seconds_count")
            .await
            > 0.0
    );
}
