//! What kinds see and use: the engine's vocabulary as data. Status types
//! ([`status`]) and the mapping of an outcome to status ([`outcome`]), what
//! a resource owns ([`inventory`]), whose rights its writes use
//! ([`identity`]), overlays as data and their templates ([`overlay`],
//! [`templates`]). Pure: no process, no API call; it names nothing of
//! the engine but [`crate::kubectl`]'s command record. (Which resources a
//! replica serves, its shard and its share, is [`crate::partition`]'s.)

pub(crate) mod identity;
pub(crate) mod inventory;
pub(crate) mod outcome;
pub(crate) mod overlay;
pub(crate) mod status;
pub(crate) mod templates;
