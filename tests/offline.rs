//! Checked without a cluster: the generated files, the install's manifests
//! and admission policies, the rendering of hostile strings and of any valid
//! spec, kind packs and the overlays' expected output.
//!
//! One test binary holding several suites, one per module (tests/<suite>.rs);
//! each suite's cluster tests run inside its area (ko_test_support::area),
//! as if it were a binary of its own.

mod admission;
mod areas;
mod crds;
mod escaping;
mod kind_pack;
mod overlays;
mod packaging;
mod properties;
