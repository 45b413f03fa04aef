//! The controllers: started at once, or once this replica leads.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::engine::host::Dynamic;
use crate::engine::host::Engine;
use crate::kinds::KindOptions;
use crate::kinds::declared::DeclaredHandler;
use crate::kinds::registry::Kind;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;

/// The controllers to run: one per Rust kind, one dynamic controller for
/// every declared kind (the folders' and the definitions'), and the one
/// serving kind definitions.
pub(super) struct Controllers {
    pub(super) kinds: Vec<Kind>,
    pub(super) engine: Arc<Engine>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) options: KindOptions,
    pub(super) definitions: Option<crate::definitions::Config>,
}

impl Controllers {
    /// Starts one task per Rust kind and one for the declared kinds; each
    /// stops when `token` is cancelled.
    pub(super) fn start(&self, token: &CancellationToken) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let declared: Vec<_> = self
            .kinds
            .iter()
            .filter_map(Kind::declared)
            .cloned()
            .collect();
        if !declared.is_empty() || self.definitions.is_some() {
            let dynamic = Arc::new(Dynamic::<DeclaredHandler>::new(self.engine.clone()));
            if let Some(config) = self.definitions.clone() {
                let engine = self.engine.clone();
                let token = token.clone();
                set.spawn(crate::definitions::serve(
                    engine,
                    dynamic.clone(),
                    config,
                    token,
                ));
            }
            let metrics = self.metrics.clone();
            let token = token.clone();
            set.spawn(async move {
                for kind in declared {
                    tracing::info!(kind = kind.name(), "serving");
                    dynamic.serve(DeclaredHandler::new(kind), None).await;
                }
                dynamic.run(token.clone().cancelled_owned()).await;
                if !token.is_cancelled() {
                    tracing::error!("the controller of the declared kinds stopped unexpectedly");
                    metrics.controller_stopped("declared kinds");
                }
            });
        }
        for kind in self.kinds.iter().filter(|k| k.declared().is_none()) {
            let kind = kind.clone();
            let engine = self.engine.clone();
            let token = token.clone();
            let options = self.options.clone();
            let metrics = self.metrics.clone();
            set.spawn(async move {
                tracing::info!(kind = %kind, "controller started");
                kind.run(engine, &options, token.clone().cancelled_owned())
                    .await;
                if token.is_cancelled() {
                    tracing::info!(kind = %kind, "controller stopped");
                } else {
                    tracing::error!(kind = %kind, "controller stopped unexpectedly");
                    metrics.controller_stopped(kind.name());
                }
            });
        }
        set
    }
}

/// Leader election around the controllers: wait for the Lease, run the
/// controllers while renewing it; on shutdown stop them, keep renewing until
/// their running reconciles finished, then release the Lease; on loss abort
/// them and cancel `lost`.
pub(super) async fn lead(
    mut elector: LeaderElector,
    controllers: Controllers,
    shutdown: CancellationToken,
    lost: CancellationToken,
) {
    let metrics = controllers.metrics.clone();
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.cancelled() => return,
    }
    metrics.set_leading(true);
    let token = shutdown.child_token();
    let mut running = controllers.start(&token);
    let lost_reason = tokio::select! {
        reason = elector.hold() => Some(reason),
        () = shutdown.cancelled() => None,
    };
    token.cancel();
    if let Some(reason) = lost_reason {
        // Another replica may lead already: abort at once rather than let
        // running reconciles finish (dropping them kills their kubectl).
        tracing::error!(%reason, "lost the leader lease: aborting the controllers");
        metrics.set_leading(false);
        running.abort_all();
        while running.join_next().await.is_some() {}
        lost.cancel();
        return;
    }
    // Shutting down: the Lease stays ours until the running reconciles are done.
    let mut renewing = true;
    let drained = async { while running.join_next().await.is_some() {} };
    tokio::pin!(drained);
    loop {
        tokio::select! {
            () = &mut drained => break,
            reason = elector.hold(), if renewing => {
                tracing::warn!(%reason, "lost the leader lease while stopping");
                renewing = false;
            }
        }
    }
    metrics.set_leading(false);
    let deadline = elector.config().renew_deadline;
    match tokio::time::timeout(deadline, elector.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %crate::error_text::kube(&e), "cannot release the leader lease")
        }
        Err(_) => tracing::warn!("releasing the leader lease timed out"),
    }
}
