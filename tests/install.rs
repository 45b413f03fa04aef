//! The install for real: deploy/ with its RBAC, the Helm chart, the image
//! under podman and the operator as a Pod on the real node.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod deploy;
mod helm;
mod image;
mod real_node;
