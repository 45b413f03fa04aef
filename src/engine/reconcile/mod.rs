//! The reconcile: the one runtime every kind is served by ([`serve`]: one
//! store, one queue, one set of workers, a [`serve::Reconciler`] per kind),
//! the engine's state it runs on ([`runtime`]: the engine, its settings,
//! backoff), a kind a handler plans for as the runtime serves it
//! ([`handled`]: its watch, the finalizer, backoff; [`triggers`]: which
//! changes start a reconcile; [`primer`]: the first look at owned
//! objects), what every reconcile shares ([`context`]), the apply and
//! deletion paths ([`apply_path`], [`cleanup`]), a plan's steps carried
//! out ([`steps`]), the health checkup after an apply ([`checkup`]), the
//! one status writer ([`status_writer`]) with its memory of what it wrote
//! ([`status_memo`]), the statuses parked until a first look ([`parked`]),
//! events ([`events`]), the expiring tables they remember things in
//! ([`expiring`]), and the span each reconcile's log lines carry
//! ([`traced`]). Scenarios of whole reconciles against a mocked API server
//! and a fake kubectl are its tests (`scenarios/`).
//!
//! Imports point one way: `handled` → `serve`, `apply_path` / `cleanup` →
//! `steps`, `checkup`, `status_writer` → `context` → `runtime` →
//! `parked`, `status_memo`, `events` → `expiring`, and down to `run`,
//! `live`, `model` and `kubectl`.

pub(in crate::engine) mod apply_path;
pub(in crate::engine) mod checkup;
pub(in crate::engine) mod cleanup;
pub(in crate::engine) mod context;
pub(crate) mod events;
pub(in crate::engine) mod expiring;
pub(crate) mod finalizing;
pub(crate) mod handled;
pub(in crate::engine) mod parked;
pub(crate) mod preview;
pub(in crate::engine) mod primer;
pub(crate) mod runtime;
#[cfg(test)]
mod scenarios;
pub(crate) mod serve;
pub(in crate::engine) mod shared_watch;
pub(in crate::engine) mod status_memo;
pub(in crate::engine) mod status_writer;
pub(in crate::engine) mod steps;
pub(crate) mod traced;
pub(in crate::engine) mod triggers;
