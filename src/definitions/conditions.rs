//! A definition's own vocabulary: its condition types and their reasons,
//! set the way every condition is (`Condition::set_in`, over
//! these types instead of a resource's).

use serde::{Deserialize, Serialize};

use crate::kinds::declared::rollout::RolloutError;

/// A definition's condition, of the types and reasons below.
pub type Condition = crate::kind::Condition<ConditionType, Reason>;

/// Longest condition message of a definition kept, in bytes: a definition
/// may list what is wrong in full.
pub const MESSAGE_LIMIT: usize = 4096;

/// The conditions of a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// Its current generation is valid and may replace the one served.
    Accepted,
    /// The CRD it declares is applied and established.
    #[serde(rename = "CRDEstablished")]
    CrdEstablished,
    /// The identity writing its kind's objects may do everything its
    /// overlays need.
    RightsGranted,
    /// Its kind is served.
    Serving,
    /// Every resource of its kind is stored at its storage version, and
    /// the CRD lists no other as stored.
    StorageMigrated,
    /// Every revision it keeps in the cluster, restored at start, is one
    /// the operator recorded (its digest and signature).
    RevisionsVerified,
    /// Its automatic rollout (`spec.rollout.steps`) brought its latest
    /// revision to every resource, and made it stable.
    RolledOut,
    /// Its latest change of its files was planned against every resource
    /// of its kind, and nothing would fail.
    Planned,
    /// A condition this version does not maintain (written by another version).
    #[serde(other)]
    Other,
}

/// Why a definition's condition is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// Its generation passed every check.
    Valid,
    /// A file or field of it is wrong (the message names it).
    Invalid,
    /// A field of its spec cannot be acted on (a pin it does not allow).
    InvalidSpec,
    /// It is over the size the operator serves.
    TooLarge,
    /// Its kind's name, CRD or API belongs to another kind.
    Clash,
    /// It changed its schema or identity in a way stored resources break on.
    BreakingChange,
    /// Its kind's base does not build.
    BaseFailed,
    /// Its rollout names a revision it does not keep.
    RevisionNotKept,
    /// Its rollout names a revision the operator refused when it restored
    /// it (its content is not what the operator kept).
    RevisionRefused,
    /// Its rollout makes a withdrawn revision stable.
    RevisionWithdrawn,
    /// Every revision it keeps is one the operator recorded.
    Verified,
    /// Its CRD is established.
    Established,
    /// Its CRD is applied but not (yet) established.
    NotEstablished,
    /// A CRD of its name exists without its marker.
    CrdNotOwned,
    /// Applying its CRD failed.
    CrdApplyFailed,
    /// Every right its kind needs is granted.
    Granted,
    /// Some rights its kind needs are missing (the message lists them).
    MissingRights,
    /// The access reviews could not be made.
    ReviewFailed,
    /// Its kind is served.
    Running,
    /// No generation of it was accepted since the operator started.
    NoValidGeneration,
    /// It is being deleted and resources of its kind remain.
    WaitingForResources,
    /// Its kind's resources are being written again at its new storage
    /// version.
    Migrating,
    /// Every resource of its kind is stored at its storage version.
    Migrated,
    /// Writing its kind's resources again failed (retried).
    MigrationFailed,
    /// Its automatic rollout's step is under way.
    Progressing,
    /// Its latest revision is stable: its rollout is complete.
    Complete,
    /// Its automatic rollout is held at its step.
    Paused,
    /// Its rollout was rolled back: a resource of a step was `Stalled` on
    /// the latest revision.
    GateStalled,
    /// Its rollout was rolled back: a step's resources were not all
    /// `Ready` on the latest revision within the gate's window.
    GateTimedOut,
    /// Its rollout was rolled back: a step's gate expression was not true
    /// within its window.
    GateConditionFailed,
    /// Its `spec.rollout.stable` was set by hand during or after its
    /// automatic rollout, which ended there.
    StableSetByHand,
    /// Its change, planned against every resource of its kind, fails for
    /// none.
    PlanPassed,
    /// Its change, planned against every resource of its kind, would fail
    /// for some (named).
    PlanFailed,
    /// Its change could not be planned (the cluster could not be read, or
    /// the plan ran past its deadline).
    PlanNotMade,
    /// A reason this version does not know (written by another version).
    #[serde(other)]
    Unknown,
}

impl Reason {
    /// The reason of `Accepted=False` when the definition's rollout cannot
    /// serve.
    pub fn of_rollout(error: &RolloutError) -> Self {
        match error {
            RolloutError::NotKept { .. } => Self::RevisionNotKept,
            RolloutError::Refused { .. } => Self::RevisionRefused,
            RolloutError::Withdrawn { .. } => Self::RevisionWithdrawn,
            RolloutError::NotPinnable { .. } => Self::InvalidSpec,
            RolloutError::Steps(_) | RolloutError::RevisionFieldTaken => Self::Invalid,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The variants are spelled as the API writes them.
        std::fmt::Debug::fmt(self, f)
    }
}
