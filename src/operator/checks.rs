//! Connecting to the cluster and the checks before the controllers start:
//! the CRDs installed and readable, the declared kinds' bases building.

use std::sync::Arc;

use super::StartError;
use crate::engine::host::Engine;
use crate::guard::Guard;
use crate::kinds::Availability;
use crate::kinds::registry::Kind;
use crate::metrics::Metrics;
use crate::partition::share::Share;

/// The clients of the cluster, and what their guard leaves out.
pub(super) struct Connected {
    /// For every request.
    pub(super) client: kube::Client,
    /// For the watches of the resources served: with a share
    /// (`--auto-shard`), their lists and watches name it; else `client`.
    pub(super) reader: kube::Client,
    pub(super) guard: Arc<Guard>,
    pub(super) unreadable: crate::guard::report::Reports,
}

/// A client for the cluster in KUBECONFIG (or in-cluster), checked to
/// answer, over HTTP/2 where the server speaks it (`connection`), with at
/// most `max_requests` requests waiting for their answer, whose
/// responses pass the guard (`crate::guard`): the objects it leaves out are
/// counted in `metrics` and queued in the reports returned. With a share
/// (`--auto-shard`), a second client under the same limit and guard reads
/// the watched resources naming it: every other read (a count, a
/// migration, a rollout's gate) sees the whole kind.
pub(super) async fn connect(
    max_requests: u16,
    metrics: &Arc<Metrics>,
    share: Option<Arc<Share>>,
) -> Result<Connected, StartError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| StartError::Config(kube::Error::InferConfig(e)))?;
    let (sink, unreadable) = crate::guard::report::channel();
    let counted = metrics.clone();
    let guard = Guard::new(move |skipped| {
        counted.unreadable(&skipped.identity.kind, &skipped.reason);
        sink.send(skipped);
    });
    let limit = tower::limit::GlobalConcurrencyLimitLayer::new(usize::from(max_requests));
    // Both clients share one set of connections (HTTP/2 where the server
    // speaks it).
    let lanes = super::connection::https_lanes(&config).map_err(StartError::Config)?;
    let builder = || {
        super::connection::builder(&config, &lanes)
            .map_err(StartError::Config)
            .map(|b| b.with_layer(&guard.layer()).with_layer(&limit))
    };
    let client = builder()?.build();
    let reader = match share {
        Some(share) => builder()?
            .with_layer(&crate::sharding::selector::SelectorLayer::new(Some(share)))
            .build(),
        None => client.clone(),
    };
    let version = (client.apiserver_version().await).map_err(StartError::Connect)?;
    if crate::support_range::check(&version)? == crate::support_range::Standing::Newer {
        tracing::warn!(
            version = %version.git_version,
            "the API server runs a Kubernetes newer than this operator was tested with (1.{} to 1.{})",
            crate::support_range::OLDEST_MINOR,
            crate::support_range::NEWEST_MINOR
        );
    }
    Ok(Connected {
        client,
        reader,
        guard,
        unreadable,
    })
}

/// Fails, naming the kind file, when a declared kind's base does not build
/// (found now rather than at the first reconcile).
pub(super) async fn check_bases(engine: &Engine, kinds: &[Kind]) -> Result<(), StartError> {
    for declared in kinds.iter().filter_map(Kind::declared) {
        engine
            .build_base(None, declared.name())
            .await
            .map_err(|failure| StartError::Base {
                file: declared.path.clone(),
                reason: failure.to_string(),
            })?;
    }
    Ok(())
}

/// The user name the API server knows the operator's client as (a
/// SelfSubjectReview), for messages; `unknown` when it cannot tell.
pub(super) async fn whoami(client: &kube::Client) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = SelfSubjectReview::default();
    kube::Api::<SelfSubjectReview>::all(client.clone())
        .create(&kube::api::PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .unwrap_or_else(|| "unknown".to_string())
}

/// Fails, naming them, when the CRDs of some of `kinds` are not installed,
/// or when the operator may not list and watch their resources. Every
/// kind with a Rust type has `guard` check the shape of what it reads.
pub(super) async fn check_crds(
    client: &kube::Client,
    guard: &crate::guard::Guard,
    kinds: &[Kind],
    namespace: Option<&str>,
) -> Result<(), StartError> {
    let mut missing = Vec::new();
    let mut forbidden = Vec::new();
    for kind in kinds {
        let crd = kind.crd();
        let name = crd.metadata.name.unwrap_or_default();
        match kind
            .served(client, namespace)
            .await
            .map_err(StartError::Connect)?
        {
            Availability::Yes => kind.check_shape(guard),
            Availability::NotInstalled => missing.push(name),
            Availability::Forbidden(verb) => forbidden.push(format!("{verb} {name}")),
        }
    }
    if !missing.is_empty() {
        Err(StartError::MissingCrds(missing))
    } else if !forbidden.is_empty() {
        Err(StartError::Forbidden {
            account: whoami(client).await,
            missing: forbidden,
            namespace: namespace.map(str::to_string),
        })
    } else {
        Ok(())
    }
}
