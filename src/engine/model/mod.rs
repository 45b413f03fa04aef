//! What kinds see and use: the engine's vocabulary as data. Status types
//! ([`status`]) and the mapping of an outcome to status ([`outcome`]), what
//! a resource owns ([`inventory`]), whose rights its writes use
//! ([`identity`]), overlays as data and their templates ([`overlay`],
//! [`templates`]), shards ([`shard`]), a replica's share when replicas
//! share the work ([`share`]) and the dynamic kind of a declared
//! resource ([`dynamic_kind`]). Pure: no process, no API call; it names
//! nothing of the engine but [`crate::kubectl`]'s command record.

pub(crate) mod dynamic_kind;
pub(crate) mod identity;
pub(crate) mod inventory;
pub(crate) mod outcome;
pub(crate) mod overlay;
pub mod shard;
pub mod share;
pub(crate) mod status;
pub(crate) mod templates;
