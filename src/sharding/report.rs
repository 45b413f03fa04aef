//! `kustomize-operator shards`: the ring as a person reads it — each
//! member, when its Lease was last renewed, the slots it holds and how
//! many resources of each kind fall into them.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};

use super::members::RING_LABEL;
use super::table::{Table, TableStore, config_map_name};
use crate::partition::share::{Slots, slot_of};

/// Why the ring could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// The kinds could not be loaded.
    #[error(transparent)]
    Kinds(#[from] crate::cli::KindsError),
    /// No cluster to ask.
    #[error("cannot connect: {0}")]
    Connect(#[from] crate::guard::KubeconfigError),
    /// Reading the ring failed.
    #[error("cannot read the ring {ring:?}: {}", crate::error_text::kube(.source))]
    Read {
        /// The ring.
        ring: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// One member as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The member (or `(free)` for the slots nobody holds).
    pub member: String,
    /// How long ago its Lease was renewed, and whether within its duration.
    pub lease: Option<(SignedDuration, bool)>,
    /// Its slots.
    pub slots: Slots,
    /// Its resources, by kind.
    pub resources: BTreeMap<String, u64>,
}

/// The ring as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The ring's name and namespace.
    pub ring: String,
    /// Where it lives.
    pub namespace: String,
    /// One row per member, then the free slots when there are some.
    pub rows: Vec<Row>,
}

/// Reads the ring `ring` in `namespace` and counts the resources of
/// `kinds` in each member's slots.
pub async fn read(
    client: kube::Client,
    namespace: &str,
    ring: &str,
    kinds: &[ApiResource],
) -> Result<Report, ShardsError> {
    let failed = |source| ShardsError::Read {
        ring: ring.to_string(),
        source,
    };
    let (table, _) = TableStore::new(client.clone(), namespace, ring)
        .read()
        .await
        .map_err(failed)?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{RING_LABEL}={ring}");
    let leases = leases
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(failed)?;
    let mut rows = rows(&table, &leases.items);
    for kind in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), kind);
        // A kind whose CRD is not installed has no resources to count.
        let Ok(list) = api.list_metadata(&ListParams::default()).await else {
            continue;
        };
        for object in list {
            let Some(uid) = object.metadata.uid else {
                continue;
            };
            let slot = slot_of(&uid);
            if let Some(row) = rows.iter_mut().find(|r| r.slots.has(slot)) {
                *row.resources.entry(kind.kind.clone()).or_default() += 1;
            }
        }
    }
    Ok(Report {
        ring: ring.to_string(),
        namespace: namespace.to_string(),
        rows,
    })
}

/// The rows of `table`, with the members' Leases.
fn rows(table: &Table, leases: &[Lease]) -> Vec<Row> {
    let now = Timestamp::now();
    let lease_of = |member: &str| {
        leases.iter().find_map(|lease| {
            let spec = lease.spec.as_ref()?;
            (spec.holder_identity.as_deref() == Some(member)).then_some(())?;
            let ago = now.duration_since(spec.renew_time.as_ref()?.0);
            let duration =
                SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
            Some((ago, ago <= duration))
        })
    };
    let mut members: Vec<String> = table.owners.keys().cloned().collect();
    for lease in leases {
        if let Some(holder) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
            && !members.contains(&holder)
        {
            members.push(holder);
        }
    }
    let mut rows: Vec<Row> = members
        .into_iter()
        .map(|member| Row {
            lease: lease_of(&member),
            slots: table.held_by(&member),
            resources: BTreeMap::new(),
            member,
        })
        .collect();
    if !table.free().is_empty() {
        rows.push(Row {
            member: "(free)".into(),
            lease: None,
            slots: table.free(),
            resources: BTreeMap::new(),
        });
    }
    rows
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "ring {} in {} (table: ConfigMap {})",
            self.ring,
            self.namespace,
            config_map_name(&self.ring)
        )?;
        writeln!(
            f,
            "{:<40} {:<18} {:>5} {:>9}  {:<24} SLOTS",
            "MEMBER", "LEASE", "SLOTS", "RESOURCES", "BY KIND"
        )?;
        for row in &self.rows {
            let lease = match row.lease {
                Some((ago, true)) => format!("renewed {}s ago", ago.as_secs()),
                Some((ago, false)) => format!("expired {}s ago", ago.as_secs()),
                None => "-".into(),
            };
            let total: u64 = row.resources.values().sum();
            let by_kind: Vec<String> = row
                .resources
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            let by_kind = if by_kind.is_empty() {
                "-".into()
            } else {
                by_kind.join(",")
            };
            writeln!(
                f,
                "{:<40} {:<18} {:>5} {:>9}  {:<24} {}",
                row.member,
                lease,
                row.slots.len(),
                total,
                by_kind,
                row.slots
            )?;
        }
        Ok(())
    }
}
