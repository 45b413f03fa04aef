//! Leader election between operator *processes* (the built binary), with
//! short lease durations: one replica reconciles, a killed leader is replaced
//! once its lease ran out, a leader stopped with SIGTERM hands over before
//! its lease would run out, a leader that loses its Lease exits. Times are
//! checked as an order of events on the Lease, never as a budget: the
//! waits allow a minute.

use ko_test_support as common;

use std::time::{Duration, Instant};

use common::OperatorProcess;
use common::greeting::{GreetingKind, config_map_field, wait_ready};
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
    fn spawn(name: &'static str, ns: &str, mode: &str, durations: [&str; 3]) -> Self {
        Self::spawn_with(name, ns, mode, durations, &[])
    }

    /// [`Self::spawn`], then `extra` flags.
    fn spawn_with(
        name: &'static str,
        ns: &str,
        mode: &str,
        [lease, renew, retry]: [&str; 3],
        extra: &[&str],
    ) -> Self {
        let port = common::free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut flags = vec![
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
        ];
        flags.extend_from_slice(extra);
        // A sharing replica's namespace, as the chart gives it: its
        // revisions and the webhook's certificate are kept there.
        let mut env = vec![("POD_NAME", name)];
        if mode == "--auto-shard" {
            env.push(("NAMESPACE", ns));
        }
        let process = OperatorProcess::spawn(ns, &env, &flags);
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
use kustomize_operator::sharding::ring;
use kustomize_operator::sharding::table::Table;
use kustomize_operator::sharding::{Slots, slot_of};

impl Replica {
    /// Starts `name` sharing the Samples of `ns` with the other replicas
    /// of the ring there (short durations: a Lease of 3 s).
    fn sharing(name: &'static str, ns: &str) -> Self {
        Self::sharing_with(name, ns, &[])
    }

    /// [`Self::sharing`], then `extra` flags.
    fn sharing_with(name: &'static str, ns: &str, extra: &[&str]) -> Self {
        Self::spawn_with(name, ns, "--auto-shard", ["3s", "2s", "250ms"], extra)
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

/// Waits until `members` hold every slot between them, each the slots
/// the ring assigns it: the table has settled (until then, slots still
/// move from one member to another, and a resource created meanwhile is
/// served by a member that is about to give its slot away).
async fn wait_table(client: &Client, ns: &str, members: &[&str]) -> Table {
    let wanted = ring::assign(&members.iter().map(|m| m.to_string()).collect());
    let mut seen = Table::default();
    common::wait_until(
        TIMEOUT,
        format!("the ring's slots held by {members:?} as it assigns them"),
        async || {
            seen = table(client, ns).await;
            seen.owners == wanted && seen.free().is_empty()
        },
    )
    .await;
    seen
}

/// `kustomize-operator shards` shows the ring as `ring` has it: each of
/// the `replicas` with its Lease renewed, its slots, and at least the
/// Samples of `ns` its share holds (it counts every namespace's); no
/// slot free.
async fn shards_shows(ns: &str, ring: &Table, replicas: &[Replica]) {
    let (code, out, err) = common::operator_command("shards", &["-n", ns]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("(free)"), "{out}");
    for replica in replicas {
        let row = (out.lines())
            .find(|line| line.split_whitespace().next() == Some(replica.name))
            .unwrap_or_else(|| panic!("{} in:\n{out}", replica.name));
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(columns[1], "renewed", "{row}");
        let slots = ring.held_by(replica.name).len().to_string();
        assert_eq!(columns[4], slots, "{row}");
        let held = replica.metric("kustomize_operator_shard_resources").await;
        let samples = (columns.iter())
            .find_map(|c| c.split(',').find_map(|k| k.strip_prefix("Sample=")))
            .map_or(0.0, |n| n.parse::<f64>().unwrap());
        assert!(samples >= held, "{held} Samples held: {row}");
    }
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
    reporters_of(Api::namespaced(client.clone(), ns), "Sample").await
}

/// The replicas whose events (of `events`) are about each object of
/// `kind`, by the object's UID.
async fn reporters_of(
    events: Api<ApiEvent>,
    kind: &str,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by_uid: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for event in events.list(&Default::default()).await.unwrap() {
        let Some(uid) = event
            .regarding
            .and_then(|r| (r.kind.as_deref() == Some(kind)).then_some(r.uid).flatten())
        else {
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
    // Every slot is held before the shares even out (a replica that
    // joined takes slots over as the others give them up): the shares
    // become even, not merely complete.
    wait_table(&client, &ns.name, &["share-a", "share-b", "share-c"]).await;
    let mut ring = Table::default();
    common::wait_until(TIMEOUT, "an even share of the ring's slots", async || {
        ring = table(&client, &ns.name).await;
        ring.free().is_empty()
            && ring.owners.len() == 3
            && ring
                .owners
                .values()
                .all(|member| (18..=24).contains(&member.len()))
    })
    .await;
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
    shards_shows(&ns.name, &ring, &replicas).await;
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
    let _policy = common::DeleteOnDrop(vec![
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

/// The UID of the Greeting `name` in `ns`.
fn greeting_uid(kind: &GreetingKind, ns: &str, name: &str) -> String {
    let resource = format!("greetings.{}/{name}", kind.group);
    let path = "jsonpath={.metadata.uid}";
    common::kubectl(&["get", &resource, "-n", ns, "-o", path]).1
}

/// Waits until the ConfigMap of each of `names` says `shout`.
async fn wait_shouting(ns: &str, names: &[String], shout: &str) {
    common::wait_until(
        TIMEOUT,
        format!("every Greeting shouting {shout:?}"),
        async || {
            names
                .iter()
                .all(|name| config_map_field(ns, name, "shout") == shout)
        },
    )
    .await;
}

/// The template of the test's Greeting kind, shouting `shout` (the
/// definition's next generation once applied).
fn shout(kind: &GreetingKind, shout: &str) {
    kind.edit("resources/configmap.yaml", |t| {
        let kept: Vec<&str> = t.lines().filter(|l| !l.contains("shout:")).collect();
        let mut text = kept.join("\n").replace(
            "  language: {{ spec.language }}",
            &format!("  language: {{{{ spec.language }}}}\n  shout: {shout}"),
        );
        text.push('\n');
        text
    });
    kind.apply();
}

/// The flags of a replica serving the test's definitions.
fn definition_flags(kind: &GreetingKind) -> [&str; 3] {
    [
        "--serve-kind-definitions=true",
        "--kind-definition-selector",
        &kind.label,
    ]
}

/// Greets `prefix-0` .. `prefix-(n-1)` with `prefix` as the message and
/// waits until each is Ready; their names.
async fn greet_ready(kind: &GreetingKind, ns: &str, prefix: &str, n: usize) -> Vec<String> {
    let greetings: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for name in &greetings {
        kind.greet(ns, name, prefix, serde_json::json!({}));
    }
    for name in &greetings {
        wait_ready(kind, ns, name).await;
    }
    greetings
}

/// Waits until each replica's log says it stopped serving the kind.
async fn wait_stopped(replicas: &[Replica], kind: &GreetingKind) {
    for replica in replicas {
        common::wait_until(
            TIMEOUT,
            format!("{} stopped the kind", replica.name),
            async || {
                (replica.process.log().lines())
                    .any(|l| l.contains("stopped") && l.contains(&kind.name))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn sharing_replicas_serve_a_kind_definition_one_writes_it_every_one_serves_its_share() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sharing-kd").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let kind = GreetingKind::new(&ns);
    let flags = definition_flags(&kind);
    let names = ["kd-a", "kd-b", "kd-c"];
    let replicas = names.map(|name| Replica::sharing_with(name, &ns.name, &flags));
    let ring = wait_table(&client, &ns.name, &names).await;

    kind.apply();
    kind.wait_condition("Serving", "True", "Running").await;
    let greetings = greet_ready(&kind, &ns.name, "hello", 12).await;

    // Every replica served the kind, each for the Greetings of its share
    // alone; one replica, the one whose share holds the definition,
    // wrote it (its events say so).
    let by_uid = reporters_of(Api::namespaced(client.clone(), &ns.name), "Greeting").await;
    let mut serving = std::collections::BTreeSet::new();
    for name in &greetings {
        let uid = greeting_uid(&kind, &ns.name, name);
        let owner = ring.owner_of(slot_of(&uid)).unwrap().to_string();
        assert_eq!(by_uid.get(&uid), Some(&vec![owner.clone()]), "{name}");
        serving.insert(owner);
    }
    assert!(
        serving.len() > 1,
        "one replica served them all: {serving:?}"
    );
    let definition = kind.definition().unwrap();
    let def_uid = definition["metadata"]["uid"].as_str().unwrap().to_string();
    let writer = ring.owner_of(slot_of(&def_uid)).unwrap().to_string();
    let by_definition = reporters_of(Api::all(client.clone()), "KindDefinition").await;
    assert_eq!(by_definition.get(&def_uid), Some(&vec![writer.clone()]));

    // A new generation: the writer accepts it, every replica serves it.
    shout(&kind, "once");
    wait_shouting(&ns.name, &greetings, "once").await;

    // The writer killed: another replica takes its share, the definition
    // with it, and accepts the next generation; every replica serves it.
    let mut replicas = Vec::from(replicas);
    let at = names.iter().position(|n| *n == writer).unwrap();
    let killed = replicas.remove(at);
    killed.process.signal(libc::SIGKILL);
    let left: Vec<&str> = names.into_iter().filter(|n| *n != writer).collect();
    let after = wait_table(&client, &ns.name, &left).await;
    shout(&kind, "twice");
    wait_shouting(&ns.name, &greetings, "twice").await;
    kind.wait_message("Accepted", "True", "Valid", "generation 3")
        .await;
    // Its status counts the resources of every share by revision (looked
    // at again on any change of the definition: a label here).
    let (ok, _, err) = common::kubectl(&["label", "kinddefinition", &kind.name, "poked=yes"]);
    assert!(ok, "{err}");
    common::wait_until(
        TIMEOUT,
        "12 Greetings counted on the latest revision",
        async || {
            let status = kind.definition().unwrap()["status"].clone();
            let latest = status["revision"].clone();
            (status["revisions"].as_array().into_iter().flatten())
                .any(|r| r["revision"] == latest && r["resources"] == 12)
        },
    )
    .await;
    let next = after.owner_of(slot_of(&def_uid)).unwrap().to_string();
    let by_definition = reporters_of(Api::all(client.clone()), "KindDefinition").await;
    let reported = by_definition.get(&def_uid).cloned().unwrap_or_default();
    assert!(
        reported.iter().all(|r| *r == writer || *r == next),
        "the definition written only by its writers: {reported:?}"
    );
    for replica in &mut replicas {
        assert!(replica.process.running(), "{}", replica.process.log_tail());
    }

    // Deleted, once its resources are: each replica cleans up its share,
    // the writer removes the CRD, and every replica stops serving.
    kind.delete_every_greeting(&ns.name).await;
    kind.delete().await;
    wait_stopped(&replicas, &kind).await;
    drop(killed);
}

#[tokio::test]
async fn sharing_replicas_all_stop_serving_a_kind_whose_deleted_definition_orphans_it() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sharing-orphan").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let kind = GreetingKind::new(&ns);
    let flags = definition_flags(&kind);
    let names = ["orphan-a", "orphan-b"];
    let replicas = names.map(|name| Replica::sharing_with(name, &ns.name, &flags));
    wait_table(&client, &ns.name, &names).await;
    kind.apply_with(|d| d["spec"]["onDelete"] = "Orphan".into());
    kind.wait_condition("Serving", "True", "Running").await;
    let greetings = greet_ready(&kind, &ns.name, "kept", 8).await;

    // Deleted: every replica stops serving the kind before the writer
    // takes the finalizers off, and none puts one back.
    let (ok, _, err) = common::kubectl(&["delete", "kinddefinition", &kind.name, "--wait=false"]);
    assert!(ok, "{err}");
    common::wait_until(TIMEOUT, "the orphaning definition gone", async || {
        kind.definition().is_none()
    })
    .await;
    wait_stopped(&replicas, &kind).await;
    let all = format!("greetings.{}", kind.group);
    let path = "jsonpath={range .items[*]}{.metadata.name}={.metadata.finalizers}{\"\\n\"}{end}";
    let (ok, listed, err) = common::kubectl(&["get", &all, "-n", &ns.name, "-o", path]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(
        lines.len(),
        greetings.len(),
        "every Greeting stays: {listed}"
    );
    assert!(
        lines.iter().all(|l| l.ends_with('=')),
        "no finalizer is left that nobody removes: {listed}"
    );
    assert_eq!(config_map_field(&ns.name, "kept-0", "message"), "kept");
}

#[tokio::test]
async fn every_sharing_replica_answers_the_conversion_webhook_of_a_definitions_kind() {
    let client = common::cluster().await;
    let ns = common::TestNamespace::new(&client, "sharing-webhook").await;
    let _cleanup = common::StripFinalizersOnDrop(ns.name.clone());
    let kind = GreetingKind::new(&ns);
    let names = ["convert-a", "convert-b"];
    let mut ports = Vec::new();
    let replicas = names.map(|name| {
        let flags = kind.webhook_flags(&[]);
        ports.push(GreetingKind::webhook_port(&flags));
        // Replica::spawn_with gives `--kinds sample` itself.
        let flags: Vec<&str> = flags.iter().skip(2).map(String::as_str).collect();
        Replica::sharing_with(name, &ns.name, &flags)
    });
    wait_table(&client, &ns.name, &names).await;
    kind.serve_at_v2().await;
    // Through the API server: stored at v2, read at v1.
    kind.write_at(
        &ns.name,
        "v2",
        "stored",
        serde_json::json!({"text": "hello v2"}),
    );
    let at_v1 = kind.greeting_at(&ns.name, "v1", "stored");
    assert_eq!(at_v1["spec"]["message"], "hello v2");

    // Each replica answers a review itself, the one that does not write
    // the definition too: it converts as the CRD it follows declares.
    let ca = common::webhook::ca_of(&kind.crd());
    let stored = kind.greeting_at(&ns.name, "v2", "stored");
    for (port, name) in ports.iter().zip(names) {
        let review = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {
                "uid": name,
                "desiredAPIVersion": format!("{}/v1", kind.group),
                "objects": [stored],
            },
        });
        let answer = common::webhook::review(*port, &ca, &review).await;
        let response = &answer["response"];
        assert_eq!(response["uid"], name);
        assert_eq!(response["result"]["status"], "Success", "{name}: {answer}");
        assert_eq!(
            response["convertedObjects"][0]["spec"]["message"], "hello v2",
            "{name}: {answer}"
        );
    }
    drop(replicas);
}
