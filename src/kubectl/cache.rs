//! kubectl's cache under `--cache-dir`: its discovery (how each API server
//! serves each group, version and resource: `discovery/<host_port>/`, one
//! folder per API server, `servergroups.json` and
//! `<group>/<version>/serverresources.json` in it) and its HTTP cache
//! (`http/`, keyed by URL, every response revalidated with the server's
//! ETag). kubectl trusts its discovery files for six hours: a kind whose
//! CRD was deleted and created again with another scope (or lost a
//! version) would be sent, for that long, to a path the API server no
//! longer serves (`the server could not find the requested resource`).
//! So the engine forgets a group's discovery when a kind it serves starts
//! or stops, and when kubectl is told a resource is not served; and all of
//! it when the operator starts.

use std::path::Path;

/// The folder of kubectl's discovery cache under its `--cache-dir`.
const DISCOVERY: &str = "discovery";
/// The list of groups and versions, in each API server's folder.
const GROUPS_FILE: &str = "servergroups.json";
/// The folder of the core group (`v1`) in each API server's folder.
const CORE_GROUP_DIR: &str = "v1";

/// What kubectl prints when the API server serves nothing at the path it
/// asked: `the server could not find the requested resource (patch
/// things.example.com a)`.
const UNSERVED: &str = "the server could not find the requested resource (";

/// Forgets what kubectl's cache under `cache_dir` knows of the API group
/// `group` (`""`: the core group), for every API server, and the list of
/// groups and versions (a version may have come or gone): the next run
/// asks the API server again. How many folders and files went.
pub fn forget_group(cache_dir: &Path, group: &str) -> std::io::Result<usize> {
    let folder = match group {
        "" => CORE_GROUP_DIR,
        // A group is a DNS name: nothing in it leaves the folder.
        g if g.contains(['/', '\\']) || g.starts_with('.') => return Ok(0),
        g => g,
    };
    let mut removed = 0;
    for server in servers(cache_dir)? {
        removed += remove(&server.join(folder))?;
        removed += remove(&server.join(GROUPS_FILE))?;
    }
    Ok(removed)
}

/// Forgets kubectl's whole discovery cache under `cache_dir` (the HTTP
/// cache stays: it is revalidated on every use). Whether there was one.
pub fn forget_all(cache_dir: &Path) -> std::io::Result<bool> {
    Ok(remove(&cache_dir.join(DISCOVERY))? > 0)
}

/// The resources (`things.example.com`, `configmaps`) kubectl was told the
/// API server does not serve, from its standard error.
pub fn unserved_resources(stderr: &str) -> Vec<String> {
    let mut found: Vec<String> = stderr
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(UNSERVED)?;
            let inside = rest.split(')').next()?;
            // `patch things.example.com a`: the verb, the resource, the name.
            let resource = inside.split_whitespace().nth(1)?;
            Some(resource.to_string())
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The API group of a resource as kubectl names it: `things.example.com`
/// → `example.com`, `configmaps` → `""`.
pub fn group_of(resource: &str) -> &str {
    resource.split_once('.').map_or("", |(_, group)| group)
}

/// The API servers' folders of the discovery cache.
fn servers(cache_dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let root = cache_dir.join(DISCOVERY);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut servers = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            servers.push(entry.path());
        }
    }
    Ok(servers)
}

/// Removes a file or a folder; 1 when it was there, 0 when it was not
/// (another run may have removed it first).
fn remove(path: &Path) -> std::io::Result<usize> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Ok(()) => Ok(1),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache as kubectl leaves it, for two API servers.
    fn cache() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for server in ["127.0.0.1_6443", "10.0.0.1_443"] {
            let root = dir.path().join(DISCOVERY).join(server);
            for gv in [
                "v1",
                "apps/v1",
                "example.com/v1",
                "example.com/v2",
                "other.io/v1",
            ] {
                std::fs::create_dir_all(root.join(gv)).unwrap();
                std::fs::write(root.join(gv).join("serverresources.json"), "{}").unwrap();
            }
            std::fs::write(root.join(GROUPS_FILE), "{}").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("http")).unwrap();
        dir
    }

    fn exists(dir: &tempfile::TempDir, path: &str) -> bool {
        dir.path().join(DISCOVERY).join(path).exists()
    }

    #[test]
    fn a_group_is_forgotten_for_every_api_server_and_the_others_stay() {
        let dir = cache();
        assert_eq!(forget_group(dir.path(), "example.com").unwrap(), 4);
        for server in ["127.0.0.1_6443", "10.0.0.1_443"] {
            assert!(!exists(&dir, &format!("{server}/example.com")));
            assert!(!exists(&dir, &format!("{server}/{GROUPS_FILE}")));
            assert!(exists(
                &dir,
                &format!("{server}/other.io/v1/serverresources.json")
            ));
            assert!(exists(&dir, &format!("{server}/v1/serverresources.json")));
        }
        assert!(dir.path().join("http").exists(), "the HTTP cache stays");
        assert_eq!(forget_group(dir.path(), "example.com").unwrap(), 0);
        forget_group(dir.path(), "").unwrap();
        assert!(!exists(&dir, "127.0.0.1_6443/v1"));
        assert!(exists(&dir, "127.0.0.1_6443/apps/v1"));
    }

    #[test]
    fn nothing_outside_the_cache_is_touched() {
        let dir = cache();
        for group in ["../x", "..", "a/b", ".hidden"] {
            assert_eq!(forget_group(dir.path(), group).unwrap(), 0, "{group}");
        }
        let none = tempfile::tempdir().unwrap();
        assert_eq!(
            forget_group(&none.path().join("missing"), "example.com").unwrap(),
            0
        );
        assert!(forget_all(dir.path()).unwrap());
        assert!(!dir.path().join(DISCOVERY).exists());
        assert!(dir.path().join("http").exists());
        assert!(!forget_all(dir.path()).unwrap());
    }

    #[test]
    fn the_resources_kubectl_was_told_are_not_served() {
        let stderr = "Warning: something\nError from server (NotFound): the server could not find the requested resource (patch tenantapplications.platform.example.com web)\nError from server (NotFound): the server could not find the requested resource (patch configmaps settings)\n";
        let found = unserved_resources(stderr);
        assert_eq!(
            found,
            ["configmaps", "tenantapplications.platform.example.com"]
        );
        assert_eq!(group_of(&found[1]), "platform.example.com");
        assert_eq!(group_of(&found[0]), "");
        let absent = "Error from server (NotFound): deployments.apps \"web\" not found";
        assert!(unserved_resources(absent).is_empty());
    }
}
