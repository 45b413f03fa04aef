//! The engine: the only code that runs kubectl for a resource, writes its
//! files or writes status. Two facades lead in, and nothing else outside this folder names
//! an engine path (`hack/check-imports` fails the build's checks if it
//! does): kinds use [`crate::kind`], which re-exports the engine's
//! vocabulary; the code that hosts the engine (the operator, `render`,
//! `diff`, the manifests, the metrics, the kind registry) uses
//! [`host`].
//!
//! Folders named after the stages, with imports pointing one way
//! (`reconcile` → `run` / `live` → `contract` → `model`), over the
//! kubectl runner ([`crate::kubectl`], a leaf outside the engine):
//!
//! - [`reconcile`]: the controller of a kind (the watch, the finalizer,
//!   backoff, which changes start a reconcile), the apply and deletion
//!   paths, a plan's steps, the health checkup, the one status writer,
//!   parked statuses, events, and the preview (the same path offline, for
//!   `render` and `diff`); `reconcile::context` (what a reconcile
//!   shares, and why one failed) is a leaf they all use;
//! - [`run`]: building and applying (`kubectl kustomize`, `kubectl apply`),
//!   coalesced into batched kubectl runs; kept overlays;
//! - [`live`]: the live state of owned objects (compact, from watches),
//!   their health, and who owns what;
//! - [`model`]: what kinds see and use, as data: status and the outcome →
//!   status mapping (one pure function), inventory, identity (whose rights
//!   a resource's writes use), overlays and templates, shards.
//!
//! The runtime's state, [`host::Engine`], is the reconcile stage's own
//! (`reconcile::runtime`): this root declares the stages and imports none
//! of them (`hack/check-imports` checks it).

pub(crate) mod contract;
pub(crate) mod host;
mod live;
pub(crate) mod model;
mod reconcile;
pub(crate) mod run;
