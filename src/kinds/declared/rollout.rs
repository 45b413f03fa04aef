//! Revisions of a kind defined in the cluster, and which one serves each
//! resource. Every accepted change of a definition's files is a revision
//! (numbered from 1); the definition's `rollout` says which revision is
//! stable, which resources try the latest first, which may be pinned and
//! which are withdrawn:
//!
//! 1. a resource labelled [`PIN_LABEL`] is served by that revision when
//!    the definition lets resources pin it (the stable, the latest, and
//!    those `pinnable` names); by the stable one when the revision it names
//!    is withdrawn; any other pin is refused ([`RolloutError`]: the resource
//!    is `InvalidSpec` and nothing is applied for it);
//! 2. one carrying every `canary` label, by the latest (by the stable one
//!    when the latest is withdrawn);
//! 3. every other one, by `stable` (default: the latest), which must be
//!    kept and not withdrawn.
//!
//! With `steps` the rollout runs itself ([`machine`]): rule 2 gives way to
//! the steps reached so far ([`steps`]), each resource of them served by
//! the latest revision, the others by the stable one; each step's gate
//! ([`gate`]) decides when the next starts, and whether to roll back.
//!
//! A revision is the whole kind as it was accepted (its templates, recipe
//! and expressions), so a resource moved back to it renders byte for byte
//! what it rendered then.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DeclaredKind;
use super::references::Key;

pub mod gate;
pub mod machine;
pub mod steps;

use steps::{Gate, Step, Steps, StepsError};

/// The status field a resource served from revisions shows its revision in.
pub const REVISION_FIELD: &str = "revision";

/// The label that pins a resource to one revision of its definition
/// (`"3"`).
pub const PIN_LABEL: &str = "kustomize-operator.io/revision";

/// How many revisions a definition keeps unless its rollout says.
pub const KEEP_DEFAULT: u32 = 5;
/// The most revisions a definition may keep.
pub const KEEP_MAX: u32 = 10;
/// The most revisions a definition holds: `keep`, and the stable one
/// beyond them.
pub const KEPT_MAX: usize = KEEP_MAX as usize + 1;
/// The most revisions `pinnable` may name (no more are kept).
pub const PINNABLE_MAX: usize = KEPT_MAX;
/// The most revisions `withdrawn` may name.
pub const WITHDRAWN_MAX: usize = 64;

/// A definition's `spec.rollout`: which revision serves which resources.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutSpec {
    /// The revision serving every resource neither pinned nor in the
    /// canary (default: the latest). An older kept revision rolls back;
    /// a withdrawn one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub stable: Option<u32>,
    /// Labels: a resource carrying all of them is served by the latest
    /// revision while `stable` stays where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<BTreeMap<String, String>>,
    /// How many revisions are kept, the latest among them (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = KEEP_MAX))]
    pub keep: Option<u32>,
    /// Kept revisions a resource may pin (the label
    /// `kustomize-operator.io/revision`) besides the stable and the latest,
    /// which it always may. A pin naming any other is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = PINNABLE_MAX), inner(range(min = 1)))]
    pub pinnable: Option<Vec<u32>>,
    /// Revisions that serve no resource any more: the resources pinned to
    /// one are served by the stable revision, the canary by the stable one
    /// when the latest is withdrawn; none may be pinned or made stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = WITHDRAWN_MAX), inner(range(min = 1)))]
    pub withdrawn: Option<Vec<u32>>,
    /// Who may set or change a pin: `Anyone` who may write the resource
    /// (default), or only those `Granted` the verb `pin` on this
    /// KindDefinition. Checked by the admission guard
    /// (deploy/admission/revision.yaml): the operator does not see who set
    /// a label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_by: Option<PinBy>,
    /// The steps of an automatic rollout: each moves more resources to
    /// the latest revision (the canary's, then a share chosen by a stable
    /// hash of namespace/name), and the next starts when its gate passes;
    /// after the last, the latest becomes `stable`. A gate that fails
    /// rolls every resource back to `stable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = steps::MAX_STEPS))]
    pub steps: Option<Vec<Step>>,
    /// The gate of every step without its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Gate>,
    /// Holds an automatic rollout at its step: nothing moves, no gate
    /// decides, until it is false again (the step's window then starts
    /// anew).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// What a change of the files waits for: a plan against every resource
    /// of the kind is made either way and summed up in the status; with
    /// `Wait`, a change whose plan fails for any resource is not served
    /// (what served goes on) until its plan passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanGate>,
}

/// Whether a change whose plan fails is served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PlanGate {
    /// The plan is reported; the change is served anyway (the default).
    #[default]
    Report,
    /// A change whose plan fails waits, and is planned again.
    Wait,
}

/// Who may set or change a resource's pin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PinBy {
    /// Whoever may write the resource.
    #[default]
    Anyone,
    /// Only those granted the verb `pin` on the KindDefinition (RBAC:
    /// `resources: [kinddefinitions]`, `resourceNames: [<definition>]`).
    Granted,
}

impl RolloutSpec {
    /// How many revisions are kept.
    pub fn keep(&self) -> u32 {
        self.keep.unwrap_or(KEEP_DEFAULT).clamp(1, KEEP_MAX)
    }

    /// The revisions withdrawn.
    pub fn withdrawn(&self) -> BTreeSet<u32> {
        self.withdrawn.iter().flatten().copied().collect()
    }

    /// True while `paused` is set.
    pub fn is_paused(&self) -> bool {
        self.paused == Some(true)
    }

    /// The digest of the steps' selection, when there are steps.
    pub fn steps_digest(&self) -> Option<String> {
        let canary = self.canary.clone().unwrap_or_default();
        (self.steps.as_deref()).map(|steps| steps::digest(steps, &canary))
    }
}

/// Why a rollout, or a resource's pin, names a revision that cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    /// It names no kept revision.
    #[error("{what} is not a kept revision (kept: {})", list(.kept))]
    NotKept {
        /// What asked for it (`the label kustomize-operator.io/revision="9"`).
        what: String,
        /// The revisions kept.
        kept: Vec<u32>,
    },
    /// It names a revision refused when the operator restored it.
    #[error(
        "{what} names revision {number}, which the operator refused when it restored the kept revisions ({why}); it is never served"
    )]
    Refused {
        /// What asked for it.
        what: String,
        /// The revision.
        number: u32,
        /// Why it was refused.
        why: String,
    },
    /// The stable revision is withdrawn.
    #[error(
        "{what} is withdrawn (spec.rollout.withdrawn); the stable revision must be kept and not withdrawn: {}",
        list(.servable)
    )]
    Withdrawn {
        /// What asked for it.
        what: String,
        /// The revisions kept and not withdrawn.
        servable: Vec<u32>,
    },
    /// A pin the definition does not allow.
    #[error(
        "{what} pins revision {number}, which this kind's definition does not let resources pin (pinnable: {}: the stable and the latest revisions, and those spec.rollout.pinnable names); nothing is applied until the label names one of those or goes",
        list(.pinnable)
    )]
    NotPinnable {
        /// The label.
        what: String,
        /// The revision it names.
        number: u32,
        /// The revisions a resource may pin.
        pinnable: Vec<u32>,
    },
    /// The steps of an automatic rollout cannot run.
    #[error(transparent)]
    Steps(#[from] StepsError),
    /// The kind declares the status field a resource's revision is shown in.
    #[error(
        "spec.rollout.steps: the kind's status declares its own field {REVISION_FIELD:?}, where a resource served from revisions shows its revision and the steps' gates read it; rename that field to roll out in steps"
    )]
    RevisionFieldTaken,
}

/// `1, 2, 3` (`none` for no revision).
fn list(numbers: &[u32]) -> String {
    if numbers.is_empty() {
        return "none".into();
    }
    let numbers: Vec<String> = numbers.iter().map(ToString::to_string).collect();
    numbers.join(", ")
}

/// Told when a resource moved to another revision.
pub type OnMove = Arc<dyn Fn() + Send + Sync>;

/// The revisions a kind is served from and the rule choosing among them;
/// remembers which revision each resource was last planned with.
pub struct Rollout {
    revisions: BTreeMap<u32, Arc<DeclaredKind>>,
    latest: u32,
    stable: u32,
    canary: BTreeMap<String, String>,
    /// The kept revisions a pin may name.
    pinnable: BTreeSet<u32>,
    /// The kept revisions withdrawn.
    withdrawn: BTreeSet<u32>,
    /// Revisions refused when they were restored (none of them kept), and why.
    refused: BTreeMap<u32, String>,
    /// The steps of an automatic rollout, if it has them.
    steps: Option<Arc<Steps>>,
    /// The step (from 0) whose resources the latest serves, while an
    /// automatic rollout is under way.
    step: Option<usize>,
    on: Mutex<HashMap<Key, u32>>,
    moved: Option<OnMove>,
}

impl std::fmt::Debug for Rollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollout")
            .field("kept", &self.revisions.keys().collect::<Vec<_>>())
            .field("latest", &self.latest)
            .field("stable", &self.stable)
            .field("canary", &self.canary)
            .field("pinnable", &self.pinnable)
            .field("withdrawn", &self.withdrawn)
            .field("refused", &self.refused.keys().collect::<Vec<_>>())
            .field("steps", &self.steps.as_ref().map(|s| s.len()))
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl Rollout {
    /// The rule of `spec` over the kept `revisions` (by number; not
    /// empty), those `refused` at restore (by number, why) named when
    /// something asks for them. Fails when the stable revision is not
    /// kept, or withdrawn, or the steps cannot run. An automatic rollout
    /// serves the latest to no resource until [`Rollout::at_step`] says
    /// which step it is at.
    pub fn new(
        revisions: BTreeMap<u32, Arc<DeclaredKind>>,
        spec: &RolloutSpec,
        refused: &BTreeMap<u32, String>,
        moved: Option<OnMove>,
    ) -> Result<Self, RolloutError> {
        let latest = revisions.keys().next_back().copied().unwrap_or_default();
        let numbers: BTreeSet<u32> = revisions.keys().copied().collect();
        let stable = stable_revision(&numbers, spec, refused)?;
        let kept = |n: &u32| revisions.contains_key(n);
        let withdrawn: BTreeSet<u32> = spec.withdrawn().into_iter().filter(kept).collect();
        let refused: BTreeMap<u32, String> = (refused.iter())
            .filter(|(n, _)| !kept(n))
            .map(|(n, why)| (*n, why.clone()))
            .collect();
        let named = spec.pinnable.iter().flatten().copied();
        let pinnable = ([stable, latest].into_iter().chain(named))
            .filter(|n| kept(n) && !withdrawn.contains(n))
            .collect();
        let steps = compile_steps(spec, revisions.get(&latest))?;
        Ok(Self {
            revisions,
            latest,
            stable,
            canary: spec.canary.clone().unwrap_or_default(),
            pinnable,
            withdrawn,
            refused,
            steps,
            step: None,
            on: Mutex::default(),
            moved,
        })
    }

    /// The rollout with its steps reached up to `step` (from 0; `None`:
    /// none), when it has steps.
    pub fn at_step(mut self, step: Option<usize>) -> Self {
        self.step = step.filter(|_| self.steps.is_some());
        self
    }

    /// The steps of an automatic rollout, checked.
    pub fn steps(&self) -> Option<&Arc<Steps>> {
        self.steps.as_ref()
    }

    /// The step (from 0) up to which the latest serves, while an
    /// automatic rollout is under way.
    pub fn step(&self) -> Option<usize> {
        self.step
    }

    /// The numbers of the kept revisions.
    fn kept(&self) -> BTreeSet<u32> {
        self.revisions.keys().copied().collect()
    }

    /// True when `number` is kept and not withdrawn.
    pub fn servable(&self, number: u32) -> bool {
        self.revisions.contains_key(&number) && !self.withdrawn.contains(&number)
    }

    /// The latest revision's number.
    pub fn latest(&self) -> u32 {
        self.latest
    }

    /// The latest revision.
    pub fn latest_kind(&self) -> Option<&Arc<DeclaredKind>> {
        self.revisions.get(&self.latest)
    }

    /// Every kept revision, oldest first: each may serve a resource (the
    /// stable one, the latest for the canary, a pinnable one for a pinned
    /// resource).
    pub fn kinds(&self) -> impl Iterator<Item = &Arc<DeclaredKind>> {
        self.revisions.values()
    }

    /// The stable revision's number.
    pub fn stable(&self) -> u32 {
        self.stable
    }

    /// The revisions a resource may pin now, oldest first.
    pub fn pinnable(&self) -> Vec<u32> {
        self.pinnable.iter().copied().collect()
    }

    /// The revision serving the resource `namespace/name` with these labels.
    pub fn choose(
        &self,
        namespace: Option<&str>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(u32, &Arc<DeclaredKind>), RolloutError> {
        let number = match labels.get(PIN_LABEL) {
            Some(pinned) => self.pinned(pinned)?,
            None if self.takes_latest(namespace, name, labels) => self.latest,
            None => self.stable,
        };
        let kind = self.revisions.get(&number).ok_or_else(|| {
            missing(
                &self.kept(),
                &self.refused,
                format!("revision {number}"),
                Some(number),
            )
        })?;
        Ok((number, kind))
    }

    /// The revision a pin `value` is served by.
    fn pinned(&self, value: &str) -> Result<u32, RolloutError> {
        let what = format!("the label {PIN_LABEL}={value:?}");
        let number = value.trim().parse::<u32>().ok();
        let Some(number) = number.filter(|n| self.revisions.contains_key(n)) else {
            return Err(missing(&self.kept(), &self.refused, what, number));
        };
        if self.withdrawn.contains(&number) {
            return Ok(self.stable);
        }
        if !self.pinnable.contains(&number) {
            let pinnable = self.pinnable();
            return Err(RolloutError::NotPinnable {
                what,
                number,
                pinnable,
            });
        }
        Ok(number)
    }

    /// What to tell about a resource with these labels pinned to a
    /// withdrawn revision (served by the stable one instead), if it is.
    pub fn withdrawn_pin(&self, labels: &BTreeMap<String, String>) -> Option<String> {
        let value = labels.get(PIN_LABEL)?;
        let number = (value.trim().parse::<u32>().ok()).filter(|n| self.withdrawn.contains(n))?;
        Some(format!(
            "the label {PIN_LABEL}={value:?} pins revision {number}, which is withdrawn (spec.rollout.withdrawn): served by the stable revision {}",
            self.stable
        ))
    }

    /// True when a resource not pinned is served by the latest revision:
    /// with steps, once a step reached takes it; without, when it is in
    /// the canary. Never while the latest is withdrawn.
    fn takes_latest(
        &self,
        namespace: Option<&str>,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        if self.withdrawn.contains(&self.latest) {
            return false;
        }
        match (&self.steps, self.step) {
            (Some(steps), Some(step)) => steps.reached(step, namespace, name, labels),
            (Some(_), None) => false,
            (None, _) => self.in_canary(labels),
        }
    }

    fn in_canary(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.canary.is_empty() && self.canary.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// Records that the resource `key` was planned with `revision`; tells
    /// when that moved it.
    pub fn record(&self, key: Key, revision: u32) {
        let before = crate::sync::lock(&self.on).insert(key, revision);
        if before != Some(revision)
            && let Some(moved) = &self.moved
        {
            moved();
        }
    }

    /// Forgets a resource that is gone.
    pub fn forget(&self, key: &Key) {
        crate::sync::lock(&self.on).remove(key);
    }

    /// How many resources each revision served at their last plan.
    pub fn counts(&self) -> BTreeMap<u32, u64> {
        let mut counts = BTreeMap::new();
        for revision in crate::sync::lock(&self.on).values() {
            *counts.entry(*revision).or_default() += 1;
        }
        counts
    }
}

/// The stable revision `spec` names among those `kept` (the latest when
/// it names none), or why it cannot serve: not kept (`refused` at restore,
/// by number, and why), or withdrawn.
pub fn stable_revision(
    kept: &BTreeSet<u32>,
    spec: &RolloutSpec,
    refused: &BTreeMap<u32, String>,
) -> Result<u32, RolloutError> {
    let latest = kept.last().copied().unwrap_or_default();
    let stable = spec.stable.unwrap_or(latest);
    let what = match spec.stable {
        Some(stable) => format!("spec.rollout.stable {stable}"),
        None => format!("the stable revision {stable} (the latest: spec.rollout.stable is unset)"),
    };
    if !kept.contains(&stable) {
        let refused: BTreeMap<u32, String> = (refused.iter())
            .filter(|(n, _)| !kept.contains(n))
            .map(|(n, why)| (*n, why.clone()))
            .collect();
        return Err(missing(kept, &refused, what, Some(stable)));
    }
    let withdrawn = spec.withdrawn();
    if withdrawn.contains(&stable) {
        let servable = kept.difference(&withdrawn).copied().collect();
        return Err(RolloutError::Withdrawn { what, servable });
    }
    Ok(stable)
}

/// The steps of `spec`, checked, if it has any; `latest` is the kind they
/// roll out, whose status must leave [`REVISION_FIELD`] to the revision.
fn compile_steps(
    spec: &RolloutSpec,
    latest: Option<&Arc<DeclaredKind>>,
) -> Result<Option<Arc<Steps>>, RolloutError> {
    let Some(steps) = spec.steps.as_deref() else {
        return Ok(None);
    };
    let canary = spec.canary.clone().unwrap_or_default();
    let steps = Steps::compile(steps, spec.gate.as_ref(), &canary)?;
    let taken = latest.is_some_and(|kind| {
        (kind.file.spec.status.iter()).any(|field| field.field == REVISION_FIELD)
    });
    if taken {
        return Err(RolloutError::RevisionFieldTaken);
    }
    Ok(Some(Arc::new(steps)))
}

/// Why `what` names no kept revision: `number` was refused at restore,
/// or is not kept.
fn missing(
    kept: &BTreeSet<u32>,
    refused: &BTreeMap<u32, String>,
    what: String,
    number: Option<u32>,
) -> RolloutError {
    match number.and_then(|n| refused.get(&n).map(|why| (n, why))) {
        Some((number, why)) => RolloutError::Refused {
            what,
            number,
            why: why.clone(),
        },
        None => RolloutError::NotKept {
            what,
            kept: kept.iter().copied().collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(numbers: &[u32]) -> BTreeMap<u32, Arc<DeclaredKind>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("training/06-your-own-kind/greeting");
        let templates = ["resources/configmap.yaml".to_string()];
        let kind = DeclaredKind::load(&dir, &templates).expect("the lab's Greeting folder loads");
        let kind = Arc::new(kind);
        numbers.iter().map(|n| (*n, kind.clone())).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rule(numbers: &[u32], spec: &RolloutSpec) -> Result<Rollout, RolloutError> {
        Rollout::new(kinds(numbers), spec, &BTreeMap::new(), None)
    }

    fn chosen(rollout: &Rollout, pairs: &[(&str, &str)]) -> Result<u32, RolloutError> {
        rollout
            .choose(Some("ns"), "r", &labels(pairs))
            .map(|(n, _)| n)
    }

    #[test]
    fn the_latest_serves_all_unless_told_otherwise() {
        let rollout = rule(&[1, 2, 3], &RolloutSpec::default()).unwrap();
        assert_eq!((rollout.latest(), rollout.stable()), (3, 3));
        assert_eq!(chosen(&rollout, &[]), Ok(3));
        assert_eq!(chosen(&rollout, &[("track", "canary")]), Ok(3));
        assert_eq!(rollout.pinnable(), [3]);
    }

    #[test]
    fn the_canary_takes_the_latest_the_rest_the_stable_a_pin_its_own() {
        let spec = RolloutSpec {
            stable: Some(1),
            canary: Some(labels(&[("track", "canary"), ("team", "a")])),
            pinnable: Some(vec![2]),
            ..RolloutSpec::default()
        };
        let rollout = rule(&[1, 2, 3], &spec).unwrap();
        assert_eq!(chosen(&rollout, &[]), Ok(1));
        assert_eq!(chosen(&rollout, &[("track", "canary")]), Ok(1));
        assert_eq!(
            chosen(&rollout, &[("track", "canary"), ("team", "a")]),
            Ok(3)
        );
        let pinned = [(PIN_LABEL, "2"), ("track", "canary"), ("team", "a")];
        assert_eq!(chosen(&rollout, &pinned), Ok(2));
        assert_eq!(rollout.pinnable(), [1, 2, 3]);
    }

    #[test]
    fn only_the_stable_the_latest_and_those_named_pinnable_may_be_pinned() {
        let spec = RolloutSpec {
            stable: Some(2),
            ..RolloutSpec::default()
        };
        let rollout = rule(&[1, 2, 3, 4], &spec).unwrap();
        assert_eq!(chosen(&rollout, &[(PIN_LABEL, "2")]), Ok(2));
        assert_eq!(chosen(&rollout, &[(PIN_LABEL, "4")]), Ok(4));
        let refused = chosen(&rollout, &[(PIN_LABEL, "1")]).unwrap_err();
        assert_eq!(
            refused,
            RolloutError::NotPinnable {
                what: format!("the label {PIN_LABEL}=\"1\""),
                number: 1,
                pinnable: vec![2, 4],
            }
        );
        let message = refused.to_string();
        assert!(
            message.starts_with(
                r#"the label kustomize-operator.io/revision="1" pins revision 1, which this kind's definition does not let resources pin (pinnable: 2, 4"#
            ),
            "{message}"
        );
        assert!(
            matches!(refused, RolloutError::NotPinnable { .. }),
            "{refused:?}"
        );
        // Named pinnable: allowed; a number not kept stays refused.
        let spec = RolloutSpec {
            pinnable: Some(vec![1, 9]),
            ..spec
        };
        let rollout = rule(&[1, 2, 3, 4], &spec).unwrap();
        assert_eq!(chosen(&rollout, &[(PIN_LABEL, "1")]), Ok(1));
        assert!(chosen(&rollout, &[(PIN_LABEL, "3")]).is_err());
        assert_eq!(rollout.pinnable(), [1, 2, 4]);
    }

    #[test]
    fn a_withdrawn_revision_serves_no_one_and_may_not_be_stable() {
        let spec = RolloutSpec {
            stable: Some(2),
            canary: Some(labels(&[("track", "canary")])),
            pinnable: Some(vec![1]),
            withdrawn: Some(vec![1, 3]),
            ..RolloutSpec::default()
        };
        let rollout = rule(&[1, 2, 3], &spec).unwrap();
        // Pinned to a withdrawn revision: the stable one, told.
        let pinned = labels(&[(PIN_LABEL, "1")]);
        assert_eq!(chosen(&rollout, &[(PIN_LABEL, "1")]), Ok(2));
        let told = rollout.withdrawn_pin(&pinned).unwrap();
        assert!(
            told.contains("pins revision 1, which is withdrawn"),
            "{told}"
        );
        assert!(told.ends_with("served by the stable revision 2"), "{told}");
        assert_eq!(rollout.withdrawn_pin(&labels(&[(PIN_LABEL, "2")])), None);
        // The latest withdrawn: the canary is served by the stable one.
        assert_eq!(chosen(&rollout, &[("track", "canary")]), Ok(2));
        assert_eq!(rollout.pinnable(), [2]);
        // Stable may not be withdrawn, named or by default.
        let spec = RolloutSpec {
            stable: Some(1),
            withdrawn: Some(vec![1]),
            ..RolloutSpec::default()
        };
        let err = rollout_err(&[1, 2], &spec);
        assert_eq!(
            err.to_string(),
            "spec.rollout.stable 1 is withdrawn (spec.rollout.withdrawn); the stable revision must be kept and not withdrawn: 2"
        );
        assert!(matches!(err, RolloutError::Withdrawn { .. }), "{err:?}");
        let spec = RolloutSpec {
            withdrawn: Some(vec![2]),
            ..RolloutSpec::default()
        };
        let err = rollout_err(&[1, 2], &spec).to_string();
        assert!(
            err.starts_with("the stable revision 2 (the latest"),
            "{err}"
        );
    }

    fn rollout_err(numbers: &[u32], spec: &RolloutSpec) -> RolloutError {
        match rule(numbers, spec) {
            Ok(r) => panic!("accepted: {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_revision_not_kept_is_refused_naming_what_asked_and_what_is_kept() {
        let spec = RolloutSpec {
            stable: Some(9),
            ..RolloutSpec::default()
        };
        let err = rollout_err(&[4, 5], &spec);
        assert_eq!(
            err.to_string(),
            "spec.rollout.stable 9 is not a kept revision (kept: 4, 5)"
        );
        assert!(matches!(err, RolloutError::NotKept { .. }), "{err:?}");
        let rollout = rule(&[4, 5], &RolloutSpec::default()).unwrap();
        let err = chosen(&rollout, &[(PIN_LABEL, "two")]).unwrap_err();
        assert!(err.to_string().contains(r#"revision="two""#), "{err}");
        assert!(chosen(&rollout, &[(PIN_LABEL, "3")]).is_err());
    }

    #[test]
    fn a_revision_refused_at_restore_is_named_so_and_never_chosen() {
        let refused = BTreeMap::from([
            (7, "its signature is not the operator's".to_string()),
            (2, "kept again since".to_string()),
        ]);
        let stable_7 = RolloutSpec {
            stable: Some(7),
            ..RolloutSpec::default()
        };
        let err = Rollout::new(kinds(&[1, 2]), &stable_7, &refused, None).unwrap_err();
        assert!(matches!(err, RolloutError::Refused { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message
                .starts_with("spec.rollout.stable 7 names revision 7, which the operator refused"),
            "{message}"
        );
        assert!(
            message.contains("its signature is not the operator's"),
            "{message}"
        );
        let rollout = Rollout::new(kinds(&[1, 2]), &RolloutSpec::default(), &refused, None);
        let rollout = rollout.unwrap();
        let err = chosen(&rollout, &[(PIN_LABEL, "7")]).unwrap_err();
        assert!(
            matches!(err, RolloutError::Refused { number: 7, .. }),
            "{err}"
        );
        // A kept revision of a refused number is the kept one.
        assert_eq!(chosen(&rollout, &[(PIN_LABEL, "2")]), Ok(2));
    }

    #[test]
    fn with_steps_the_latest_serves_the_steps_reached_the_canary_included() {
        let spec = RolloutSpec {
            stable: Some(1),
            canary: Some(labels(&[("track", "canary")])),
            steps: Some(vec![
                Step {
                    canary: true,
                    ..Step::default()
                },
                Step {
                    percent: Some(50),
                    ..Step::default()
                },
            ]),
            ..RolloutSpec::default()
        };
        let name = |inside: bool| {
            (0..100)
                .map(|i| format!("r-{i}"))
                .find(|n| steps::in_share(Some("ns"), n, 50) == inside)
                .unwrap()
        };
        let (inside, outside) = (name(true), name(false));
        let on = |rollout: &Rollout, name: &str, pairs: &[(&str, &str)]| {
            rollout
                .choose(Some("ns"), name, &labels(pairs))
                .map(|(n, _)| n)
        };
        // Not started: every resource on the stable one, the canary too.
        let rollout = rule(&[1, 2], &spec).unwrap();
        assert_eq!(on(&rollout, &inside, &[("track", "canary")]), Ok(1));
        let first = rule(&[1, 2], &spec).unwrap().at_step(Some(0));
        assert_eq!(on(&first, &outside, &[("track", "canary")]), Ok(2));
        assert_eq!(on(&first, &inside, &[]), Ok(1));
        let second = rule(&[1, 2], &spec).unwrap().at_step(Some(1));
        assert_eq!(second.step(), Some(1));
        assert_eq!(on(&second, &inside, &[]), Ok(2));
        assert_eq!(on(&second, &outside, &[]), Ok(1));
        assert_eq!(
            on(&second, &inside, &[(PIN_LABEL, "1")]),
            Ok(1),
            "a pin stays"
        );
        // Without steps, a step means nothing.
        let manual = rule(&[1, 2], &RolloutSpec::default())
            .unwrap()
            .at_step(Some(1));
        assert_eq!(manual.step(), None);
        // Bad steps are refused as the definition's spec.
        let bad = RolloutSpec {
            steps: Some(vec![Step::default()]),
            ..spec.clone()
        };
        let err = rollout_err(&[1, 2], &bad);
        assert!(
            matches!(
                err,
                RolloutError::Steps(_) | RolloutError::RevisionFieldTaken
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("spec.rollout.steps[0]: "),
            "{err}"
        );
    }

    #[test]
    fn a_move_is_told_and_counted_once() {
        let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = told.clone();
        let moved: OnMove = Arc::new(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let spec = RolloutSpec::default();
        let rollout = Rollout::new(kinds(&[1, 2]), &spec, &BTreeMap::new(), Some(moved)).unwrap();
        let key = |name: &str| (Some("ns".to_string()), name.to_string());
        rollout.record(key("a"), 2);
        rollout.record(key("a"), 2);
        rollout.record(key("b"), 1);
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(rollout.counts(), BTreeMap::from([(1, 1), (2, 1)]));
        rollout.forget(&key("b"));
        assert_eq!(rollout.counts(), BTreeMap::from([(2, 1)]));
        assert_eq!(RolloutSpec::default().keep(), KEEP_DEFAULT);
    }
}
