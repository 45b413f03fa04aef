//! The four operators' kinds, each served by an operator started in the
//! test's process against the control plane, debugging them, and the
//! traces of their reconciles.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod chaos_agent;
mod copyrator;
mod debugging;
mod exchange_rate;
mod health;
mod sample;
mod traced;
