//! The engine as host code sees it: the one way into the engine for the
//! code that hosts it (the operator, `render`, `diff`, the manifests, the
//! metrics, the kind registry). Kinds use [`crate::kind`]
//! instead, and host code takes the kinds' vocabulary (objects, owners,
//! conditions, templates' sources and errors) from there too: every name
//! is said once. Everything here is a re-export; nothing outside the
//! engine names another engine path (`hack/check-imports` checks it).

pub use super::reconcile::preview::Preview;

pub(crate) use super::reconcile::runtime::{Engine, ReconcileMetrics, Settings};
pub(crate) use super::reconcile::serve::{Reconciler, Runtime};
