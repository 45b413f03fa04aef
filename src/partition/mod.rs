//! Which part of a cluster's resources one replica serves: the resources
//! of its [`shard`] (by a label, `--shard`) and, when replicas share the
//! work by themselves, those of its [`share`] (slots of the UID's hash).
//!
//! A leaf below the engine and the host alike: the engine's watches keep
//! only what the replica serves, and the operator and `crate::sharding`
//! decide what that is. It names nothing of either.

pub mod shard;
pub mod share;
