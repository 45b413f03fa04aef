//! Membership: every replica keeps a Lease of its own (labelled with the
//! ring's name) and reads the others'. A member is live while its Lease
//! keeps changing: one not renewed for its lease duration, measured on
//! this replica's clock from when it was last seen to change (as
//! client-go's leader election does, so clocks need not agree), or given
//! up, is gone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, Preconditions};

use super::SharingConfig;

/// The label naming the ring of a member's Lease and of the ring's table.
pub const RING_LABEL: &str = "kustomize-operator.io/ring";

/// The field manager of the member Leases.
const MANAGER: &str = "kustomize-operator-sharding";

/// What one look at the members found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The live members (this replica among them).
    pub live: BTreeSet<String>,
    /// When each member last renewed, as its Lease says.
    pub renewed: BTreeMap<String, Timestamp>,
    /// The Leases of members gone (name, resourceVersion), to forget once
    /// their slots are free.
    pub expired: Vec<(String, String, String)>,
}

/// This replica's Lease and its memory of the others'.
#[derive(Debug)]
pub struct Members {
    api: Api<Lease>,
    config: SharingConfig,
    /// Each Lease's resourceVersion last seen and when it was first seen.
    seen: HashMap<String, (String, Instant)>,
    /// When this replica last renewed its own Lease.
    renewed: Option<Instant>,
}

impl Members {
    /// Membership in `config`'s ring.
    pub fn new(client: kube::Client, config: SharingConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            seen: HashMap::new(),
            renewed: None,
        }
    }

    /// The name of this replica's Lease.
    fn lease_name(&self) -> String {
        lease_name(&self.config.ring, &self.config.identity)
    }

    /// Renews this replica's Lease (creating it the first time).
    pub async fn renew(&mut self) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name()),
                labels: Some([(RING_LABEL.to_string(), self.config.ring.clone())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(self.config.lease_seconds()),
                renew_time: Some(now),
                ..Default::default()
            }),
        };
        let params = PatchParams::apply(MANAGER).force();
        self.api
            .patch(&self.lease_name(), &params, &Patch::Apply(&lease))
            .await?;
        self.renewed = Some(Instant::now());
        Ok(())
    }

    /// Whether this replica failed to renew for longer than the renew
    /// deadline (it must stop working: others may take its share soon).
    pub fn past_renew_deadline(&self) -> bool {
        self.renewed
            .is_some_and(|at| at.elapsed() > self.config.renew_deadline)
    }

    /// Reads the ring's Leases: who is live now.
    pub async fn look(&mut self) -> Result<View, kube::Error> {
        let selector = format!("{RING_LABEL}={}", self.config.ring);
        let leases = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let now = Instant::now();
        let mut view = View::default();
        let mut seen = HashMap::new();
        for lease in leases {
            let (Some(name), Some(version)) =
                (lease.metadata.name, lease.metadata.resource_version)
            else {
                continue;
            };
            let spec = lease.spec.unwrap_or_default();
            let first_seen = match self.seen.get(&name) {
                Some((old, at)) if *old == version => *at,
                _ => now,
            };
            seen.insert(name.clone(), (version.clone(), first_seen));
            let Some(member) = spec.holder_identity.filter(|h| !h.is_empty()) else {
                continue;
            };
            if let Some(renewed) = spec.renew_time {
                view.renewed.insert(member.clone(), renewed.0);
            }
            let duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
            if now.duration_since(first_seen) <= duration {
                view.live.insert(member);
            } else if member != self.config.identity {
                view.expired.push((member, name, version));
            }
        }
        self.seen = seen;
        view.live.insert(self.config.identity.clone());
        Ok(view)
    }

    /// Deletes the Leases of members gone (each unchanged since this
    /// replica saw it expire: a member coming back meanwhile changed it,
    /// and keeps it), so that a replica starting later need not wait a
    /// lease duration to see them gone.
    pub async fn forget(&self, expired: &[(String, String, String)]) {
        for (_, name, version) in expired {
            let (name, version) = (name.clone(), version.clone());
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(version),
                    uid: None,
                }),
                ..Default::default()
            };
            match self.api.delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(lease = %name, "sharding: deleted the Lease of a member gone")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(lease = %name, error = %crate::error_text::kube(&e), "sharding: cannot delete the Lease of a member gone")
                }
            }
        }
    }

    /// Leaves the ring: deletes this replica's Lease.
    pub async fn leave(&self) -> Result<(), kube::Error> {
        match self
            .api
            .delete(&self.lease_name(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The Lease of `member` in `ring`.
pub fn lease_name(ring: &str, member: &str) -> String {
    format!("{ring}-member-{member}")
}
