//! Automatic sharding (`--auto-shard`): the replicas of one Deployment
//! share the resources by themselves, without labels or a leader.
//!
//! - Membership ([`members`]): one Lease per replica; a member is live
//!   while its Lease is renewed.
//! - Partitioning ([`ring`]): the hash space of resource UIDs is cut into
//!   64 slots, and each slot should belong to one live member (rendezvous
//!   hashing with bounded loads: the same answer on every replica, about
//!   1/N of the slots moving when a member comes or goes).
//! - Handover ([`table`]): who holds which slot is one ConfigMap, changed
//!   only by compare-and-swap. A member gives a slot back only after its
//!   watches dropped the slot's resources and no reconcile of its runs in
//!   it; another takes it only once it is free (or its holder's Lease
//!   expired). No resource is reconciled by two replicas at once.
//! - Filtered at the source ([`selector`]): where the API server serves
//!   KEP-5866's shard selector, a replica lists and watches only its share.
//! - A member that cannot renew its Lease within the renew deadline stops
//!   working at once and exits, before its Lease expires and others take
//!   its share.

pub mod members;
pub mod report;
pub mod ring;
pub mod selector;
pub mod table;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::leader::{LeaderConfig, LeaderConfigError};
use crate::metrics::Metrics;
use crate::partition::share::Share;
pub use crate::partition::share::{SLOTS, Slots, slot_of};
use members::{Members, View};
use table::{Table, TableStore};

/// How the replicas of one ring share the work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingConfig {
    /// The ring's name: its members' Leases carry it, its table is named by it.
    pub ring: String,
    /// The namespace of the Leases and the table.
    pub namespace: String,
    /// This replica's name in the ring.
    pub identity: String,
    /// How long a Lease not renewed keeps its member in the ring.
    pub lease_duration: Duration,
    /// A member stops working when it could not renew for this long.
    pub renew_deadline: Duration,
    /// How often members renew and look at the ring.
    pub retry_period: Duration,
}

impl SharingConfig {
    /// Checks that the durations can work together (as leader election's).
    pub fn validate(&self) -> Result<(), LeaderConfigError> {
        LeaderConfig {
            lease_name: self.ring.clone(),
            namespace: self.namespace.clone(),
            identity: self.identity.clone(),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
        .validate()
    }

    /// `leaseDurationSeconds` as written (rounded up).
    fn lease_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_secs_f64().ceil();
        i32::try_from(secs as i64).unwrap_or(i32::MAX)
    }
}

/// A member name as Lease names and ConfigMap keys take it: lower case,
/// letters, digits, `-` and `.`.
pub fn member_name(identity: &str) -> String {
    let name: String = identity
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.trim_matches(|c| c == '-' || c == '.').to_string()
}

/// One replica's part in the ring.
pub struct Sharing {
    config: SharingConfig,
    members: Members,
    table: TableStore,
    share: Arc<Share>,
    metrics: Arc<Metrics>,
}

impl Sharing {
    /// This replica's part, holding nothing yet.
    pub fn new(
        client: kube::Client,
        config: SharingConfig,
        share: Arc<Share>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            members: Members::new(client.clone(), config.clone()),
            table: TableStore::new(client, &config.namespace, &config.ring),
            config,
            share,
            metrics,
        }
    }

    /// Takes part until `stop` (then gives its share back and leaves) or
    /// until it could not renew its Lease in time (then stops working at
    /// once and cancels `lost`).
    pub async fn run(mut self, stop: CancellationToken, lost: CancellationToken) {
        let mut ticks = tokio::time::interval(self.config.retry_period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = stop.cancelled() => break,
            }
            if let Err(e) = self.members.renew().await {
                tracing::warn!(error = %crate::error_text::kube(&e), "sharding: cannot renew this replica's Lease");
                if self.members.past_renew_deadline() {
                    tracing::error!(
                        "sharding: could not renew this replica's Lease before the renew deadline: stopping all work"
                    );
                    self.share.set(Slots::NONE);
                    self.metrics.shard_view(0, 0, 0);
                    lost.cancel();
                    return;
                }
                continue;
            }
            if let Err(e) = self.step().await {
                tracing::warn!(error = %crate::error_text::kube(&e), "sharding: cannot read or write the ring");
            }
        }
        self.leave().await;
    }

    /// One look at the ring: gives back what this replica should no
    /// longer hold (once drained), takes what it should and may.
    async fn step(&mut self) -> Result<(), kube::Error> {
        let me = self.config.identity.clone();
        let view = self.members.look().await?;
        let wanted = ring::assign(&view.live)
            .get(&me)
            .copied()
            .unwrap_or_default();
        let (mut table, base) = self.table.read().await?;
        let freed = free_the_gone(&mut table, &view);
        let mine = table.held_by(&me);
        let give_back = mine.minus(wanted);
        // What the table does not give this replica, it never works on.
        let keep = Slots(self.share.held().0 & mine.0).minus(give_back);
        if keep != self.share.held() {
            tracing::info!(slots = %keep, "sharding: narrowing this replica's share");
            self.share.set(keep);
        }
        let drained = give_back.is_empty()
            || tokio::time::timeout(self.config.retry_period, self.share.drained(give_back))
                .await
                .is_ok();
        let give_back = if drained { give_back } else { Slots::NONE };
        let take = table.takeable(wanted.minus(mine), &view.live);
        let adopted = Slots(mine.0 & wanted.0);
        if give_back.is_empty() && take.is_empty() && !freed {
            self.share.set(adopted);
            self.forget_gone(&table, &view).await;
            self.report(&view);
            return Ok(());
        }
        table.give_back(&me, give_back, Timestamp::now());
        let since = table.take(&me, take, &view.renewed);
        if !self.table.write(&table, base).await? {
            return Ok(());
        }
        self.share.set(adopted.union(take));
        self.handed_over(give_back, take, &since);
        self.forget_gone(&table, &view).await;
        self.report(&view);
        Ok(())
    }

    /// Deletes the Leases of the members gone that hold no slot.
    async fn forget_gone(&self, table: &Table, view: &View) {
        let gone: Vec<_> = view
            .expired
            .iter()
            .filter(|(member, _, _)| table.held_by(member).is_empty())
            .cloned()
            .collect();
        self.members.forget(&gone).await;
    }

    fn handed_over(&self, given: Slots, taken: Slots, since: &[Option<Timestamp>]) {
        if !given.is_empty() {
            tracing::info!(slots = %given, "sharding: gave slots back");
            self.metrics.handed_over("given", given.len());
        }
        if !taken.is_empty() {
            tracing::info!(slots = %taken, "sharding: took slots");
            self.metrics.handed_over("taken", taken.len());
        }
        let now = Timestamp::now();
        for at in since.iter().flatten() {
            let unowned = now.duration_since(*at);
            self.metrics
                .unowned_for(Duration::try_from(unowned).unwrap_or_default());
        }
    }

    fn report(&self, view: &View) {
        self.metrics.shard_view(
            view.live.len(),
            self.share.held().len(),
            self.share.resources(),
        );
        self.metrics.shard_foreign(self.share.foreign());
    }

    /// Gives every slot back once no reconcile runs, and leaves the ring.
    async fn leave(&mut self) {
        self.share.set(Slots::NONE);
        self.share.drained(Slots::ALL).await;
        let me = self.config.identity.clone();
        for _ in 0..5 {
            let Ok((mut table, base)) = self.table.read().await else {
                continue;
            };
            let mine = table.held_by(&me);
            if mine.is_empty() {
                break;
            }
            table.give_back(&me, mine, Timestamp::now());
            if matches!(self.table.write(&table, base).await, Ok(true)) {
                tracing::info!(slots = %mine, "sharding: gave every slot back");
                break;
            }
        }
        if let Err(e) = self.members.leave().await {
            tracing::warn!(error = %crate::error_text::kube(&e), "sharding: cannot delete this replica's Lease");
        }
        self.metrics.shard_view(0, 0, 0);
    }
}

/// Frees the slots of the members no longer live, as given back when
/// they last renewed; true when there were some.
fn free_the_gone(table: &mut Table, view: &View) -> bool {
    let gone: Vec<(String, Slots)> = table
        .owners
        .iter()
        .filter(|(member, _)| !view.live.contains(*member))
        .map(|(member, slots)| (member.clone(), *slots))
        .collect();
    for (member, slots) in &gone {
        let since = view
            .renewed
            .get(member)
            .copied()
            .unwrap_or_else(Timestamp::now);
        tracing::info!(member = %member, slots = %slots, "sharding: freeing the slots of a member gone");
        table.give_back(member, *slots, since);
    }
    !gone.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_what_lease_names_take() {
        assert_eq!(
            member_name("kustomize-operator-5c8-x2k"),
            "kustomize-operator-5c8-x2k"
        );
        assert_eq!(member_name("Host_1-42-ab"), "host-1-42-ab");
        assert_eq!(member_name("-x-"), "x");
    }
}
