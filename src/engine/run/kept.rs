//! `--keep-overlays DIR`: the last overlay applied for each resource, at
//! `DIR/<kind>/<namespace>/<name>/` (`_cluster` for cluster-scoped ones),
//! readable by the operator's user only, removed when the resource goes.
//! An overlay that holds Secret data is never kept, however the Secret got
//! there: the overlay's files are looked at, and so are the objects it
//! built to, when the build ran.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::engine::model::overlay::{RenderedOverlay, is_secret};

/// The directory of one resource's kept overlay.
pub(crate) fn dir(root: &Path, kind: &str, namespace: Option<&str>, name: &str) -> PathBuf {
    root.join(kind)
        .join(namespace.unwrap_or("_cluster"))
        .join(name)
}

/// Keeps `overlay` as the resource's last, replacing the one kept before;
/// `built` are the objects it built to (`None` when its build failed).
pub(crate) fn keep(dir: &Path, overlay: &RenderedOverlay, built: Option<&[Value]>) {
    let _ = std::fs::remove_dir_all(dir);
    let builds_secret = built.is_some_and(|objects| objects.iter().any(is_secret));
    if overlay.is_sensitive() || builds_secret {
        tracing::info!(dir = %dir.display(), "not keeping an overlay that may hold Secret data");
        return;
    }
    if let Err(e) = overlay.write_to(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot keep overlay");
    }
}

/// Removes the kept overlay of a resource that is gone.
pub(crate) fn remove(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => tracing::debug!(dir = %dir.display(), "removed the kept overlay"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the kept overlay")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::engine::model::overlay::Overlay;
    use crate::engine::model::templates::KustomizeDir;

    fn empty_dir() -> (tempfile::TempDir, KustomizeDir) {
        let dir = tempfile::tempdir().unwrap();
        let loaded = KustomizeDir::load(dir.path()).unwrap();
        (dir, loaded)
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_kept_overlay_is_private_and_goes_with_its_resource() {
        let root = tempfile::tempdir().unwrap();
        let overlay = Overlay {
            resources: vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})],
            namespace: Some("ns".into()),
            ..Default::default()
        }
        .render(&empty_dir().1, None)
        .unwrap();
        let at = dir(root.path(), "sample", Some("ns"), "web");
        keep(&at, &overlay, overlay.prebuilt());
        assert_eq!(mode(&root.path().join("sample")), 0o700);
        assert_eq!(mode(&at), 0o700);
        let file = at.join("kustomization.yaml");
        assert!(
            file.exists(),
            "{:?}",
            std::fs::read_dir(&at).unwrap().collect::<Vec<_>>()
        );
        assert_eq!(mode(&file), 0o600);
        remove(&at);
        assert!(!at.exists());
        remove(&at); // already gone: nothing to do
    }

    #[test]
    fn an_overlay_with_secret_data_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let overlay = Overlay {
            namespace: Some("ns".into()),
            sensitive: true,
            ..Default::default()
        }
        .render(&empty_dir().1, None)
        .unwrap();
        let at = dir(root.path(), "copyrator", Some("ns"), "r");
        keep(&at, &overlay, None);
        assert!(!at.exists());
    }

    fn config_map_overlay() -> RenderedOverlay {
        Overlay {
            resources: vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})],
            ..Default::default()
        }
        .render(&empty_dir().1, None)
        .unwrap()
    }

    #[test]
    fn an_overlay_building_a_secret_is_not_kept_and_replaces_the_one_kept_before() {
        let root = tempfile::tempdir().unwrap();
        let at = dir(root.path(), "webapp", Some("ns"), "w");
        let overlay = config_map_overlay();
        keep(&at, &overlay, None);
        assert!(at.join("kustomization.yaml").exists(), "kept");
        // The same files, but the build made a Secret (say, a patch the
        // file scan cannot see through): nothing is kept, not even the
        // earlier overlay.
        let secret =
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
        keep(&at, &overlay, Some(&[secret]));
        assert!(!at.exists());
    }

    #[test]
    fn an_overlay_with_a_secret_among_its_resources_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let overlay = Overlay {
            resources: vec![
                serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "stringData": {"password": "hunter2"}}),
            ],
            ..Default::default()
        }
        .render(&empty_dir().1, None)
        .unwrap();
        let at = dir(root.path(), "webapp", Some("ns"), "w");
        keep(&at, &overlay, None);
        assert!(!at.exists());
    }
}
