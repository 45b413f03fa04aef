//! Lease-based leader election on `coordination.k8s.io/v1` Lease, the way
//! client-go does it: every update is a compare-and-swap on the Lease's
//! `resourceVersion`; a candidate takes the Lease when it is free or when its
//! record has not changed for `leaseDurationSeconds` (measured on the local
//! clock, so clock skew between replicas does not matter); the leader renews
//! every retry period and gives up when it could not renew for the renew
//! deadline; on shutdown the leader clears the holder so another replica takes
//! over at its next retry instead of waiting for the lease to expire.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// How the election runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// The Lease's name.
    pub lease_name: String,
    /// The Lease's namespace.
    pub namespace: String,
    /// This replica's name in the Lease (`holderIdentity`).
    pub identity: String,
    /// How long a Lease that is not renewed stays with its holder.
    pub lease_duration: Duration,
    /// The leader gives up when it could not renew for this long.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
}

/// Settings that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaderConfigError {
    /// The durations are not ordered retry period < renew deadline < lease duration.
    #[error(
        "leader election needs retry period ({retry:?}) < renew deadline ({renew:?}) < lease duration ({lease:?})"
    )]
    Durations {
        /// The retry period.
        retry: Duration,
        /// The renew deadline.
        renew: Duration,
        /// The lease duration.
        lease: Duration,
    },
    /// The lease duration is shorter than the Lease's one-second resolution.
    #[error("the lease duration must be at least 1s")]
    TooShort,
    /// The identity is empty.
    #[error("the leader election identity must not be empty")]
    NoIdentity,
}

impl LeaderConfig {
    /// Checks that the durations can work together.
    pub fn validate(&self) -> Result<(), LeaderConfigError> {
        if self.identity.is_empty() {
            return Err(LeaderConfigError::NoIdentity);
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(LeaderConfigError::TooShort);
        }
        if self.retry_period.is_zero()
            || self.retry_period >= self.renew_deadline
            || self.renew_deadline >= self.lease_duration
        {
            return Err(LeaderConfigError::Durations {
                retry: self.retry_period,
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as written into the Lease (rounded up).
    fn lease_seconds(&self) -> i32 {
        let secs = self
            .lease_duration
            .as_secs()
            .saturating_add(u64::from(self.lease_duration.subsec_nanos() > 0));
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// The outcome of one attempt to take or renew the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease now.
    Held,
    /// Another replica holds a Lease that has not expired.
    HeldBy(String),
    /// Someone else changed the Lease between our read and write; try again.
    Conflict,
}

/// What a replica should do with the Lease it just read (pure; unit-tested).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// Write ourselves as holder; `transition` when the holder changes.
    Take { transition: bool },
    /// Another holder's lease is still valid.
    Wait(String),
}

fn decide(spec: &LeaseSpec, me: &str, expired: bool) -> Decision {
    match spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        Some(holder) if holder == me => Decision::Take { transition: false },
        Some(holder) if !expired => Decision::Wait(holder.to_string()),
        Some(_) | None => Decision::Take { transition: true },
    }
}

/// The spec a replica writes when it takes or renews the Lease.
fn taken_spec(old: &LeaseSpec, me: &str, lease_seconds: i32, transition: bool) -> LeaseSpec {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let mut spec = old.clone();
    if transition {
        spec.acquire_time = Some(now.clone());
        let had_holder = old
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        let transitions = old.lease_transitions.unwrap_or(0);
        spec.lease_transitions = Some(if had_holder {
            transitions.saturating_add(1)
        } else {
            transitions
        });
    }
    spec.holder_identity = Some(me.to_string());
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(lease_seconds);
    spec
}

/// The spec a leader writes when it steps down: no holder, transitions kept.
fn released_spec(old: &LeaseSpec) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        acquire_time: None,
        renew_time: None,
        ..old.clone()
    }
}

/// One replica's side of the election.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderConfig,
    /// The Lease spec last seen and when (local clock) it last changed.
    observed: Option<(LeaseSpec, Instant)>,
}

/// Why [`LeaderElector::hold`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Another replica holds the Lease.
    TakenBy(String),
    /// Renewing failed for longer than the renew deadline.
    RenewDeadline,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TakenBy(holder) => write!(f, "the lease is held by {holder}"),
            Self::RenewDeadline => {
                f.write_str("could not renew the lease before the renew deadline")
            }
        }
    }
}

impl LeaderElector {
    /// An elector for `config` (validate it first).
    pub fn new(client: kube::Client, config: LeaderConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self {
            api,
            config,
            observed: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LeaderConfig {
        &self.config
    }

    /// Remembers `spec`; the expiry clock restarts whenever it changes.
    fn observe(&mut self, spec: &LeaseSpec) {
        if self.observed.as_ref().is_none_or(|(seen, _)| seen != spec) {
            self.observed = Some((spec.clone(), Instant::now()));
        }
    }

    /// True when the observed record has not changed for its lease duration.
    fn observed_expired(&self) -> bool {
        self.observed.as_ref().is_none_or(|(spec, at)| {
            let secs = spec.lease_duration_seconds.unwrap_or(0).max(0);
            at.elapsed() > Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        })
    }

    /// Reads the Lease and takes it (free, expired or ours) with a
    /// compare-and-swap on its resourceVersion; creates it if missing.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let me = self.config.identity.clone();
        let seconds = self.config.lease_seconds();
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    ..Default::default()
                },
                spec: Some(taken_spec(&LeaseSpec::default(), &me, seconds, true)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created.spec.unwrap_or_default());
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.observe(&spec);
        let transition = match decide(&spec, &me, self.observed_expired()) {
            Decision::Wait(holder) => return Ok(Attempt::HeldBy(holder)),
            Decision::Take { transition } => transition,
        };
        lease.spec = Some(taken_spec(&spec, &me, seconds, transition));
        // `lease.metadata.resource_version` makes this a compare-and-swap.
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe(&updated.spec.unwrap_or_default());
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Tries every retry period (with up to 20% jitter) until this replica
    /// holds the Lease. Cancel the future to stop trying.
    pub async fn acquire(&mut self) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.config.lease_name, namespace = %self.config.namespace, identity = %self.config.identity, "acquired the leader lease");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(%holder, lease = %self.config.lease_name, "standing by: another replica leads");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.config.lease_name, error = %crate::error_text::kube(&e), "cannot read or take the leader lease")
                }
            }
            let jitter = self
                .config
                .retry_period
                .mul_f64(rand::random::<f64>() * 0.2);
            tokio::time::sleep(self.config.retry_period + jitter).await;
        }
    }

    /// Renews every retry period while this replica leads; returns when
    /// leadership is lost. Cancel the future to stop renewing.
    pub async fn hold(&mut self) -> Lost {
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let left = self
                .config
                .renew_deadline
                .saturating_sub(last_renew.elapsed());
            let attempt = tokio::time::timeout(left, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(Attempt::Held)) => last_renew = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => return Lost::TakenBy(holder),
                Ok(Ok(Attempt::Conflict)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.config.lease_name, error = %crate::error_text::kube(&e), "cannot renew the leader lease")
                }
                Err(_) => {}
            }
            if last_renew.elapsed() >= self.config.renew_deadline {
                return Lost::RenewDeadline;
            }
        }
    }

    /// Clears the holder if this replica holds the Lease, so another replica
    /// can take it at once. Call only after the controllers stopped.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        lease.spec = Some(released_spec(&spec));
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                tracing::info!(lease = %self.config.lease_name, "released the leader lease");
                Ok(())
            }
            // Changed meanwhile: it is no longer ours to release.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A default identity: the host name, the process id and a random suffix
/// (several operators may run in one process in tests).
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kustomize-operator".into());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    fn config(lease: u64, renew: u64, retry: u64) -> LeaderConfig {
        LeaderConfig {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        }
    }

    #[test]
    fn a_free_lease_is_taken() {
        assert_eq!(
            decide(&LeaseSpec::default(), "me", false),
            Decision::Take { transition: true }
        );
        let empty = LeaseSpec {
            holder_identity: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(
            decide(&empty, "me", false),
            Decision::Take { transition: true }
        );
    }

    #[test]
    fn our_lease_is_renewed_even_if_it_looks_expired() {
        assert_eq!(
            decide(&held_by("me"), "me", true),
            Decision::Take { transition: false }
        );
    }

    #[test]
    fn another_holder_is_respected_until_expiry() {
        assert_eq!(
            decide(&held_by("other"), "me", false),
            Decision::Wait("other".into())
        );
        assert_eq!(
            decide(&held_by("other"), "me", true),
            Decision::Take { transition: true }
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let taken = taken_spec(&held_by("other"), "me", 15, true);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert!(taken.acquire_time.is_some() && taken.renew_time.is_some());
        let renewed = taken_spec(&taken, "me", 15, false);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
        // A first holder of a fresh Lease is not a transition.
        let first = taken_spec(&LeaseSpec::default(), "me", 15, true);
        assert_eq!(first.lease_transitions, Some(0));
    }

    #[test]
    fn release_clears_the_holder_and_keeps_the_count() {
        let released = released_spec(&taken_spec(&held_by("other"), "me", 15, true));
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.renew_time, None);
        assert_eq!(released.lease_transitions, Some(4));
        assert_eq!(
            decide(&released, "someone", false),
            Decision::Take { transition: true }
        );
    }

    #[test]
    fn durations_must_be_ordered() {
        assert!(config(15_000, 10_000, 2_000).validate().is_ok());
        assert!(config(3_000, 2_000, 500).validate().is_ok());
        assert!(matches!(
            config(10_000, 10_000, 2_000).validate(),
            Err(LeaderConfigError::Durations { .. })
        ));
        assert!(matches!(
            config(15_000, 10_000, 0).validate(),
            Err(LeaderConfigError::Durations { .. })
        ));
        assert_eq!(
            config(900, 500, 100).validate(),
            Err(LeaderConfigError::TooShort)
        );
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(config(1_500, 1_000, 100).lease_seconds(), 2);
        assert_eq!(config(15_000, 10_000, 2_000).lease_seconds(), 15);
    }

    #[test]
    fn default_identities_differ() {
        assert_ne!(default_identity(), default_identity());
    }
}
