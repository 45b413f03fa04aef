//! The contract between the engine and the kinds: what a kind provides
//! ([`Handler`], [`KindInfo`]) and the data it answers with
//! ([`Plan`], [`Step`], [`PlannedEvent`], [`HandlerError`]).
//!
//! A leaf of the engine: it names only `model/` (the overlays, inventory
//! and status types a plan is made of), so every layer above may use it
//! and the kinds reach it through their door, `crate::kind`, without the
//! engine importing the kinds' facade back.

mod error;
mod handler;
mod nudge;
mod plan;
mod policy;

use std::fmt::Debug;
use std::hash::Hash;

use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::HandlerError;
pub use handler::Handler;
pub(crate) use nudge::Resources;
pub use nudge::Watching;
pub use plan::{EventType, FromObjects, Plan, PlannedEvent, Step};
pub use policy::KindInfo;

/// A custom resource type the engine can serve: a typed one (derived with
/// `kube::CustomResource`) or `kube::api::DynamicObject` for declared kinds.
pub trait Object:
    Resource<DynamicType: Clone + Eq + Hash + Debug + Send + Sync + Unpin + 'static>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<T> Object for T where
    T: Resource<DynamicType: Clone + Eq + Hash + Debug + Send + Sync + Unpin + 'static>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}
