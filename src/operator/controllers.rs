//! The runtime serving every kind: started at once, or once this replica
//! leads.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::engine::host::{Engine, Runtime};
use crate::kinds::KindOptions;
use crate::kinds::registry::Kind;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;

/// What the runtime serves: every kind (the Rust kinds, the declared
/// kinds of folders) and, when enabled, the kind definitions.
pub(super) struct Controllers {
    pub(super) kinds: Vec<Kind>,
    pub(super) engine: Arc<Engine>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) options: KindOptions,
    pub(super) definitions: Option<crate::definitions::Config>,
}

impl Controllers {
    /// Starts the runtime with every kind, and the definitions' task; each
    /// stops when `token` is cancelled.
    pub(super) fn start(&self, token: &CancellationToken) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let runtime = Arc::new(Runtime::new(self.engine.clone()));
        if let Some(config) = self.definitions.clone() {
            let engine = self.engine.clone();
            let token = token.clone();
            set.spawn(crate::definitions::serve(
                engine,
                runtime.clone(),
                config,
                token,
            ));
        }
        let kinds = self.kinds.clone();
        let options = self.options.clone();
        let metrics = self.metrics.clone();
        let token = token.clone();
        set.spawn(async move {
            for kind in kinds {
                tracing::info!(kind = %kind, "serving");
                kind.serve(&runtime, &options).await;
            }
            runtime.run(token.clone().cancelled_owned()).await;
            if token.is_cancelled() {
                tracing::info!("the runtime stopped");
            } else {
                tracing::error!("the runtime stopped unexpectedly");
                metrics.controller_stopped("runtime");
            }
        });
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
