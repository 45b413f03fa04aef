//! The CRDs committed under deploy/crds are those the Rust types generate.

#[test]
fn committed_crds_are_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
    for (name, yaml) in kustomize_operator::crds_yaml().unwrap() {
        let path = dir.join(format!("{name}.yaml"));
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run `cargo run -- crd --out-dir deploy/crds`",
                path.display()
            )
        });
        assert!(
            committed == yaml,
            "{} is out of date; run `cargo run -- crd --out-dir deploy/crds`",
            path.display()
        );
        let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        assert!(
            kustomization.contains(&format!("{name}.yaml")),
            "deploy/crds/kustomization.yaml does not list {name}.yaml"
        );
    }
}
