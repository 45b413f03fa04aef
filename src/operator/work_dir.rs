//! The operator's private work directory, and the removal of those
//! nobody holds any more.

use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::StartError;

/// This operator's private work directory, `<base>/run-<pid>-<n>`, locked
/// while the operator runs.
pub(super) struct WorkDir {
    pub(super) path: PathBuf,
    pub(super) _lock: std::fs::File,
}

/// The lock file in each work directory.
pub(super) const LOCK_FILE: &str = ".lock";

impl WorkDir {
    /// Creates this operator's directory after removing every directory no
    /// running operator holds: whatever an earlier run left (an operator
    /// killed mid-reconcile, or a restarted container, whose PID 1 is the
    /// PID of the one before), Secret data included, is gone before work
    /// starts.
    pub(super) fn prepare(base: &Path) -> Result<Self, StartError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StartError::WorkDir { path, source }
        };
        std::fs::create_dir_all(base).map_err(err(base))?;
        remove_abandoned(base);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::claim(base) {
                Ok(dir) => return Ok(dir),
                // Another operator's sweep took it between creation and
                // lock (they start together in tests): take another name.
                Err((path, e)) if attempt < CLAIM_ATTEMPTS => {
                    tracing::debug!(dir = %path.display(), error = %e, "work directory taken away while created; trying another");
                }
                Err((path, e)) => return Err(err(&path)(e)),
            }
        }
    }

    /// Creates and locks a new `run-<pid>-<n>` under `base`.
    fn claim(base: &Path) -> Result<Self, (PathBuf, std::io::Error)> {
        // One directory per operator instance (tests run several in one process).
        static INSTANCE: AtomicU32 = AtomicU32::new(0);
        let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("run-{}-{instance}", std::process::id()));
        let failed = |e| (path.clone(), e);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(failed)?;
        let lock = std::fs::File::create(path.join(LOCK_FILE)).map_err(failed)?;
        lock.try_lock()
            .map_err(|e| failed(std::io::Error::other(e.to_string())))?;
        // A sweep that locked it first may have removed it before letting go.
        if !still_linked(&lock, &path.join(LOCK_FILE)) {
            return Err(failed(std::io::Error::other(
                "removed by another operator's sweep",
            )));
        }
        Ok(Self { path, _lock: lock })
    }

    pub(super) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes the `run-*` directories under `base` whose lock nobody holds.
/// The sweep holds each lock while it removes the directory, so an
/// operator creating its own directory at the same time either gets the
/// lock first (and keeps the directory) or fails to and takes another
/// name. A directory without a lock file is removed only once it is a
/// minute old: a younger one may be being created.
pub(super) fn remove_abandoned(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("run-") {
            continue;
        }
        // Held until the directory is gone.
        let _lock = match std::fs::File::open(entry.path().join(LOCK_FILE)) {
            Ok(lock) if lock.try_lock().is_ok() => Some(lock),
            Ok(_) => continue,
            Err(_) if older_than(&entry.path(), UNLOCKED_GRACE) => None,
            Err(_) => continue,
        };
        tracing::info!(dir = %entry.path().display(), "removing the work directory of an operator that is gone");
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// How old a `run-*` directory without a lock file must be to be removed.
pub(super) const UNLOCKED_GRACE: Duration = Duration::from_secs(60);

/// Tries at creating this operator's work directory.
pub(super) const CLAIM_ATTEMPTS: u32 = 5;

/// True when `path` is still the file `file` has open.
pub(super) fn still_linked(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(linked)) => open.dev() == linked.dev() && open.ino() == linked.ino(),
        _ => false,
    }
}

pub(super) fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_starting_together_each_keep_their_work_dir() {
        let base = tempfile::tempdir().unwrap();
        for _ in 0..20 {
            let dirs: Vec<WorkDir> = std::thread::scope(|scope| {
                let starts: Vec<_> = (0..8)
                    .map(|_| scope.spawn(|| WorkDir::prepare(base.path())))
                    .collect();
                starts
                    .into_iter()
                    .map(|s| s.join().unwrap().unwrap())
                    .collect()
            });
            for dir in &dirs {
                assert!(
                    dir.path.join(LOCK_FILE).exists(),
                    "{} was swept",
                    dir.path.display()
                );
            }
        }
    }

    #[test]
    fn work_dirs_nobody_holds_are_removed_and_held_ones_kept() {
        let base = tempfile::tempdir().unwrap();
        // Left by a restarted container: same PID, lock not held.
        let abandoned = base.path().join(format!("run-{}-99", std::process::id()));
        std::fs::create_dir_all(abandoned.join("build-x")).unwrap();
        std::fs::write(abandoned.join(LOCK_FILE), "").unwrap();
        // An older layout without a lock file.
        let old = base.path().join("run-4000000000-0");
        std::fs::create_dir_all(&old).unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::open(&old)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        // One being created right now: no lock file yet.
        let young = base.path().join("run-4000000001-0");
        std::fs::create_dir_all(&young).unwrap();
        let live = WorkDir::prepare(base.path()).unwrap();
        assert!(!abandoned.exists());
        assert!(!old.exists());
        assert!(young.exists(), "may be being created");
        let second = WorkDir::prepare(base.path()).unwrap();
        assert!(live.path.exists(), "held by a running operator");
        assert_ne!(live.path, second.path);
        drop(live);
        let _third = WorkDir::prepare(base.path()).unwrap();
        assert!(second.path.exists());
    }
}
