//! The facade kinds are written against: what a kind provides to the
//! engine, and the types it uses to say what it wants, as data.
//!
//! A kind never spawns processes, writes files, builds command lines or
//! patches status: it returns a [`Plan`] (overlays and typed [`Step`]s,
//! typed status fields, events) and the engine carries it out the same way
//! for every kind, picking every failure reason itself.
//!
//! Only a door: the contract itself (handler, plan, steps, policy) lives in
//! the engine's leaf `engine::contract`, and the vocabulary a plan is made
//! of in `engine::model`; this module re-exports what kinds use, so no kind
//! names an engine path.

pub use crate::engine::contract::{
    FromObjects, Handler, HandlerError, KindInfo, Plan, PlannedEvent, Step, Watching,
};
pub use crate::engine::model::inventory::{ObjectId, Owner};
pub use crate::engine::model::overlay::{
    ConfigMapGenerator, Labels, Overlay, PatchTarget, PatchTemplate,
};
pub use crate::engine::model::status::{
    CommonStatus, Condition, ConditionStatus, ConditionType, Reason,
};
pub use crate::engine::model::templates::{KustomizeDir, TemplateError, Templates};
pub use crate::engine::run::sandbox::Sandbox;
