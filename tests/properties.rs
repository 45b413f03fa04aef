//! Bad input, property-based: any spec the API server would accept renders an
//! overlay that the real `kubectl kustomize` accepts, or yields a clear
//! error; nothing panics.

mod common;

use kustomize_operator::handler::Handler;
use kustomize_operator::kinds::sample::{Sample, SampleHandler, SampleSpec};
use kustomize_operator::templates::KustomizeDir;
use proptest::prelude::*;

fn kustomize_dir() -> KustomizeDir {
    KustomizeDir::load(&common::repo().join("kustomize")).unwrap()
}

/// DNS-1123 labels, as the API server accepts for namespaces.
fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
}

/// DNS-1123 subdomains, as the API server accepts for object names.
fn dns_subdomain() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9.-]{0,120}[a-z0-9])?".prop_filter("no empty segments", |s| {
        !s.contains("..") && !s.contains(".-") && !s.contains("-.")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn accepted_samples_build_or_fail_clearly(
        name in dns_subdomain(),
        namespace in dns_label(),
        count in 0..=1000i32,
    ) {
        let mut sample = Sample::new(&name, SampleSpec { count });
        sample.metadata.namespace = Some(namespace.clone());
        let plan = match SampleHandler.plan(&sample, &()) {
            Ok(plan) => plan,
            Err(e) => {
                // The one thing the schema cannot catch: a name too long for a label.
                prop_assert!(name.len() > 63, "unexpected refusal: {e}");
                prop_assert!(e.to_string().contains("at most 63"), "unclear: {e}");
                return Ok(());
            }
        };
        let rendered = plan.render(&kustomize_dir()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        rendered.overlays[0].as_ref().unwrap().write_to(dir.path()).unwrap();
        let (ok, out, err) = common::kubectl(&["kustomize", &dir.path().display().to_string()]);
        prop_assert!(ok, "kubectl kustomize refused {name}/{namespace}: {err}");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out).unwrap();
        prop_assert_eq!(docs.len(), 1);
        prop_assert_eq!(&docs[0]["metadata"]["name"], &serde_json::Value::from(name.clone()));
        prop_assert_eq!(&docs[0]["metadata"]["namespace"], &serde_json::Value::from(namespace));
        prop_assert_eq!(&docs[0]["spec"]["replicas"], &serde_json::Value::from(count));
        prop_assert_eq!(
            &docs[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            &serde_json::Value::from(name)
        );
    }
}
