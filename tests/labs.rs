//! The training labs, run as a learner would, against their recorded
//! transcripts.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod training;
