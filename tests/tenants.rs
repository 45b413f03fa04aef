//! Tenants: what admission lets one do, writes made as the tenant, and
//! hostile input that costs only its author.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod act_as_tenant;
mod hostile;
mod tenancy;
