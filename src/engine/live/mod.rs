//! The live state of owned objects: watches kept per served kind
//! ([`watch`]) in a compact form ([`compact`]), the reconciles waiting for
//! a first look ([`waiters`]), health rules ([`health`]) and who owns a
//! live object ([`ownership`]), whether a CRD is established ([`crds`]).
//! Uses the model, nothing of the reconcile.

pub(in crate::engine) mod compact;
pub(crate) mod crds;
pub(in crate::engine) mod health;
pub(crate) mod ownership;
pub(in crate::engine) mod waiters;
pub(in crate::engine) mod watch;
