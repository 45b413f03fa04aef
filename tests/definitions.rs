//! Kinds declared as folders (kro's examples among them) and kinds defined in
//! the cluster by KindDefinitions.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod declared;
mod kind_definitions;
mod kro;
