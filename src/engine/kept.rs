//! `--keep-overlays DIR`: the last overlay applied for each resource, at
//! `DIR/<kind>/<namespace>/<name>/` (`_cluster` for cluster-scoped ones),
//! readable by the operator's user only, removed when the resource goes.
//! An overlay that holds Secret data is never kept.

use std::path::{Path, PathBuf};

use super::overlay::{RenderedOverlay, private_dir};

/// The directory of one resource's kept overlay.
pub(crate) fn dir(root: &Path, kind: &str, namespace: Option<&str>, name: &str) -> PathBuf {
    root.join(kind)
        .join(namespace.unwrap_or("_cluster"))
        .join(name)
}

/// Keeps `overlay` as the resource's last, replacing the one kept before.
pub(crate) fn keep(dir: &Path, overlay: &RenderedOverlay) {
    let _ = std::fs::remove_dir_all(dir);
    if overlay.is_sensitive() {
        tracing::info!(dir = %dir.display(), "not keeping an overlay that holds Secret data");
        return;
    }
    let result = private_dir(dir)
        .map_err(|e| e.to_string())
        .and_then(|()| overlay.write_to(dir).map_err(|e| e.to_string()));
    if let Err(e) = result {
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
    use crate::engine::overlay::Overlay;
    use crate::kind::KustomizeDir;

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
        keep(&at, &overlay);
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
        keep(&at, &overlay);
        assert!(!at.exists());
    }
}
