//! The operator under faults, as replicas (leader election, shards, automatic
//! sharding) and across a cluster upgrade.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod cluster;
mod faults;
mod leader;
mod shard;
