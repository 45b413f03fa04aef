//! Building and applying: overlays built with `kubectl kustomize`
//! ([`build`]), objects applied with `kubectl apply --server-side`
//! ([`kubectl_apply`]), both coalesced into batched kubectl runs ([`batch`]), and
//! the overlays kept for `--keep-overlays` ([`kept`]). Uses the model and
//! the kubectl runner, nothing of the reconcile.

pub(crate) mod batch;
pub(in crate::engine) mod build;
pub(in crate::engine) mod kept;
pub(in crate::engine) mod kubectl_apply;
pub(crate) mod sandbox;
