//! The status shape every kind shares: typed conditions, the observed
//! generation, the last kubectl command, the digest of what was applied and
//! the inventory of what the resource owns.
//!
//! Everything here is bounded: messages and command output are trimmed so a
//! resource's status stays small whatever kubectl prints. Only
//! [`super::outcome`] decides what these fields hold.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::inventory::Inventory;
use crate::kubectl::CommandRecord;
use crate::text::truncate;

/// Longest condition message of a resource kept, in bytes.
pub const MESSAGE_LIMIT: usize = 1024;
/// Longest printer-column `message` kept, in bytes: one short line.
pub const SHORT_MESSAGE_LIMIT: usize = 160;
/// Longest stdout or stderr kept in `lastCommand`, in bytes.
pub const OUTPUT_LIMIT: usize = 2048;

// What the operator keeps of a run holds what its status records.
const _: () = assert!(crate::kubectl::RUN_OUTPUT_CAP == 4 * OUTPUT_LIMIT);

/// The conditions the engine maintains on a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// The last reconcile succeeded and what it applied is in place.
    Ready,
    /// The engine is working on the resource.
    Reconciling,
    /// What the resource applied will not become healthy by itself.
    Stalled,
    /// A condition this version does not maintain (written by another version).
    #[serde(other)]
    Other,
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// Yes.
    True,
    /// No.
    False,
    /// Not known yet.
    Unknown,
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// Why a condition is what it is. Kinds pick theirs from the same list, so
/// a reason always means one thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// kubectl applied the resource's objects.
    Applied,
    /// kubectl is running for the resource, or what it applied is still
    /// becoming healthy.
    Progressing,
    /// What the resource applied failed its health checks or did not become
    /// healthy within the health timeout.
    Unhealthy,
    /// The spec cannot be acted on until it changes.
    InvalidSpec,
    /// What the resource asks for is over a configured limit.
    TooLarge,
    /// The overlay could not be rendered or built.
    RenderFailed,
    /// An object to apply exists and belongs to someone else.
    OwnershipConflict,
    /// `kubectl apply` failed.
    ApplyFailed,
    /// `kubectl apply` was refused: another field manager owns a field.
    FieldConflict,
    /// Deleting objects that left the resource's inventory failed.
    PruneFailed,
    /// Deleting the resource's objects failed (the resource stays).
    DeleteFailed,
    /// Deleting or patching objects the resource acts on (not its own) failed.
    ActionFailed,
    /// An API read failed.
    ApiError,
    /// An external fetch failed (ExchangeRate).
    FetchFailed,
    /// Listing the objects to act on failed (ChaosAgent).
    ListFailed,
    /// The operator does not serve the resource's namespace (CopyratorRule).
    NamespaceNotServed,
    /// An object the resource reads without owning it (a declared kind's
    /// reference) does not exist (yet).
    ReferenceNotFound,
    /// The identity the resource's writes run as may not make them (a
    /// tenant's ServiceAccount without the right, a missing account, a
    /// namespace the operator never acts in, or a cluster-scoped resource
    /// in an install writing as tenants with no account named for it).
    Forbidden,
    /// What a kind reads from a resource's objects (a declared kind's CEL)
    /// is over the budget of one evaluation or one look, or ran past its
    /// deadline: the resource is `Stalled` until its input changes.
    OverBudget,
    /// A reason this version does not know (written by another version).
    #[serde(other)]
    Unknown,
}

impl Reason {
    /// The reason as written in the API (`ApplyFailed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "Applied",
            Self::Progressing => "Progressing",
            Self::Unhealthy => "Unhealthy",
            Self::InvalidSpec => "InvalidSpec",
            Self::TooLarge => "TooLarge",
            Self::RenderFailed => "RenderFailed",
            Self::OwnershipConflict => "OwnershipConflict",
            Self::ApplyFailed => "ApplyFailed",
            Self::FieldConflict => "FieldConflict",
            Self::PruneFailed => "PruneFailed",
            Self::DeleteFailed => "DeleteFailed",
            Self::ActionFailed => "ActionFailed",
            Self::ApiError => "ApiError",
            Self::FetchFailed => "FetchFailed",
            Self::ListFailed => "ListFailed",
            Self::NamespaceNotServed => "NamespaceNotServed",
            Self::ReferenceNotFound => "ReferenceNotFound",
            Self::Forbidden => "Forbidden",
            Self::OverBudget => "OverBudget",
            Self::Unknown => "Unknown",
        }
    }
}

impl Reason {
    /// True for the reasons of a reconcile that applied what it planned
    /// (whatever the health of the result): nothing to apply again until
    /// the resource changes or the resync is due.
    pub fn applied(self) -> bool {
        matches!(
            self,
            Self::Applied | Self::Progressing | Self::Unhealthy | Self::OverBudget
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// Of the engine's vocabulary by default (a resource's types and reasons),
// or of a host's own (a definition's): `T` and `R`.
/// A standard Kubernetes-style condition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(bound = "")]
pub struct Condition<T = ConditionType, R = Reason> {
    /// `Ready`, `Reconciling`, `Stalled` (a resource); `Accepted`,
    /// `CRDEstablished`, `RightsGranted`, `Serving` (a definition).
    #[serde(rename = "type")]
    #[schemars(with = "String")]
    pub type_: T,
    /// `True`, `False` or `Unknown`.
    #[schemars(with = "String")]
    pub status: ConditionStatus,
    /// A CamelCase reason, e.g. `Applied`, `ApplyFailed`, `InvalidSpec`.
    #[schemars(with = "String")]
    pub reason: R,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub last_transition_time: jiff::Timestamp,
    /// The generation this condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status fields common to every kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonStatus {
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Reconciling`, and `Stalled` while stalled.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// One short line: what kubectl did, or what went wrong (printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last kubectl run for this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_command: Option<CommandRecord>,
    /// sha256 of the desired state last applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_digest: Option<String>,
    /// When it was last applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub last_applied_at: Option<jiff::Timestamp>,
    /// The objects this resource owns: what its last successful apply produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<Inventory>,
}

impl CommonStatus {
    /// Objects one resource may own: above this its plan is refused
    /// (`TooLarge`), so the inventory in its status stays far below etcd's
    /// object size limit.
    pub const MAX_OBJECTS: usize = 10_000;

    /// The status fields the engine writes; every other field is the kind's.
    pub(crate) const ENGINE_FIELDS: [&str; 7] = [
        "observedGeneration",
        "conditions",
        "message",
        "lastCommand",
        "appliedDigest",
        "lastAppliedAt",
        "inventory",
    ];

    /// The condition of type `type_`, if set.
    pub fn condition(&self, type_: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// True when `Ready` is `True`.
    pub fn is_ready(&self) -> bool {
        self.condition(ConditionType::Ready)
            .is_some_and(|c| c.status == ConditionStatus::True)
    }

    /// The reason of the `Ready` condition, if set.
    pub fn ready_reason(&self) -> Option<Reason> {
        self.condition(ConditionType::Ready).map(|c| c.reason)
    }

    /// Sets a condition, keeping its transition time when the status is
    /// unchanged; its message trimmed to [`MESSAGE_LIMIT`] (thousands of
    /// resources keep their conditions short).
    pub(crate) fn set_condition(&mut self, condition: Condition) {
        condition.set_in(&mut self.conditions, MESSAGE_LIMIT);
    }

    /// Records a kubectl run, trimming its output to [`OUTPUT_LIMIT`].
    pub(crate) fn record_command(&mut self, record: &CommandRecord) {
        let mut r = record.clone();
        r.stdout = keep_tail(&r.stdout, OUTPUT_LIMIT);
        r.stderr = keep_tail(&r.stderr, OUTPUT_LIMIT);
        r.command = truncate(&r.command, MESSAGE_LIMIT);
        self.last_command = Some(r);
    }
}

impl<T: Copy + PartialEq, R> Condition<T, R> {
    /// The condition `type_` as set `now`, describing `generation`.
    pub fn new(
        type_: T,
        status: ConditionStatus,
        reason: R,
        message: &str,
        generation: Option<i64>,
        now: jiff::Timestamp,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.to_owned(),
            last_transition_time: now,
            observed_generation: generation,
        }
    }

    /// Sets this condition in `conditions`, its message trimmed to
    /// `message_limit` bytes, keeping the transition time of the one there
    /// when its status is unchanged: the one way every condition of every
    /// status (a resource's, a definition's) is set.
    pub fn set_in(mut self, conditions: &mut Vec<Self>, message_limit: usize) {
        if self.message.len() > message_limit {
            self.message = truncate(&self.message, message_limit);
        }
        match conditions.iter_mut().find(|c| c.type_ == self.type_) {
            Some(c) => {
                let since = if c.status == self.status {
                    c.last_transition_time
                } else {
                    self.last_transition_time
                };
                *c = Self {
                    last_transition_time: since,
                    ..self
                };
            }
            None => conditions.push(self),
        }
    }
}

/// The first line of `s`, trimmed to `limit` bytes: a printer-column message.
pub fn one_line(s: &str, limit: usize) -> String {
    truncate(
        s.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or(""),
        limit,
    )
}

/// The last `limit` bytes of `s` (on a char boundary), marked when cut.
pub fn keep_tail(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_string();
    }
    let marker = "[...]\n";
    let mut start = s.len() - limit.saturating_sub(marker.len());
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("{marker}{}", &s[start..])
}

/// A whole status held as JSON text. A status kept between reconciles (the
/// memo of what was written, a parked status) costs its JSON size this
/// way, not the several times more a parsed [`serde_json::Value`] takes
/// (a map and a string allocated per field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatusText(Box<str>);

impl StatusText {
    /// Holds `status`.
    pub fn of(status: &serde_json::Value) -> Self {
        Self(status.to_string().into_boxed_str())
    }

    /// The status, parsed again. The text is `serde_json`'s own
    /// serialization of a value, so it always parses; `Null` stands for
    /// the impossible failure.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: bool, reason: Reason, message: &str, at: jiff::Timestamp) -> Condition {
        Condition::new(
            ConditionType::Ready,
            status.into(),
            reason,
            message,
            Some(1),
            at,
        )
    }

    #[test]
    fn transition_time_changes_only_with_status() {
        let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let mut s = CommonStatus::default();
        s.set_condition(ready(true, Reason::Applied, "ok", t0));
        s.set_condition(ready(true, Reason::Applied, "again", t1));
        assert_eq!(
            s.condition(ConditionType::Ready)
                .unwrap()
                .last_transition_time,
            t0
        );
        s.set_condition(ready(false, Reason::ApplyFailed, "bad", t1));
        assert_eq!(
            s.condition(ConditionType::Ready)
                .unwrap()
                .last_transition_time,
            t1
        );
        assert!(!s.is_ready());
        assert_eq!(s.conditions.len(), 1);
    }

    #[test]
    fn status_stays_bounded_whatever_kubectl_prints() {
        let mut s = CommonStatus::default();
        let huge = "é".repeat(3_000_000);
        s.record_command(&CommandRecord {
            command: huge.clone(),
            stdout: huge.clone(),
            stderr: huge.clone(),
            ..Default::default()
        });
        s.message = Some(one_line(&huge, SHORT_MESSAGE_LIMIT));
        s.set_condition(ready(
            false,
            Reason::ApplyFailed,
            &huge,
            jiff::Timestamp::now(),
        ));
        let size = serde_json::to_string(&s).unwrap().len();
        assert!(size < 8 * 1024, "status is {size} bytes");
    }

    #[test]
    fn a_status_held_as_text_reads_back_as_it_was() {
        let status = serde_json::json!({
            "message": "deployment.apps/web serverside-applied \"quoted\" ünïcode",
            "observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True"}],
            "inventory": {"objects": []},
            "ratio": 1.5,
        });
        assert_eq!(StatusText::of(&status).value(), status);
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(keep_tail("abcdefghij", 8), "[...]\nij");
        assert!(keep_tail(&"é".repeat(100), 20).is_char_boundary(0));
        assert_eq!(one_line("\n  first  \nsecond", 100), "first");
    }

    #[test]
    fn reasons_round_trip_and_unknown_ones_are_kept_apart() {
        let json = serde_json::to_string(&Reason::OwnershipConflict).unwrap();
        assert_eq!(json, "\"OwnershipConflict\"");
        let r: Reason = serde_json::from_str("\"SomethingNew\"").unwrap();
        assert_eq!(r, Reason::Unknown);
    }

    #[test]
    fn a_malformed_timestamp_is_an_error() {
        let bad = serde_json::json!({
            "type": "Ready", "status": "True", "reason": "Applied",
            "lastTransitionTime": "yesterday"
        });
        assert!(serde_json::from_value::<Condition>(bad).is_err());
    }
}
