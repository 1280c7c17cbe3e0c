//! The agent's state directory: checkpoints and handler registrations, out of the handlers'
//! reach, for one kubelet-plugin per node.
//!
//! Checkpoints hold CDI specs, and so properties that may come from Secrets: the directory is
//! 0700 and may not lie inside the registration socket's directory, which discovery-handler
//! pods mount. State an earlier version kept next to that socket is moved in.
//!
//! The handler registrations, the node-wide sockets and every write to the API server belong
//! to one process, the node's leader. A second one (a copy started by hand) would bind the
//! same socket paths, taking them from the first silently. So the agent takes an exclusive lock
//! on `<state dir>/kubelet-plugin.lock` (the kernel releases it with the process, however it
//! ends). A second process waits, saying so, until the first exits; one with a pod UID (a
//! rolling update's new pod, [`crate::agent::AgentConfig::pod_uid`]) stands by meanwhile
//! ([`Unlocked::held_elsewhere`]) and takes the lock when it is free.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a waiting process tries the lock again.
const RETRY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "state directory {} is inside {}, which discovery-handler pods mount: choose a --state-dir outside it",
        state.display(), shared.display()
    )]
    VisibleToHandlers { state: PathBuf, shared: PathBuf },
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Held for the life of the agent; dropping it releases the node.
#[derive(Debug)]
pub struct StateDir {
    _lock: File,
}

/// The state directory checked and created, its lock not taken yet.
#[derive(Debug)]
pub struct Unlocked {
    dir: PathBuf,
    handlers_dir: Option<PathBuf>,
    file: File,
}

impl StateDir {
    /// Checks and creates `state_dir` (0700), takes its lock (waiting for another process to
    /// release it), then moves in what an earlier version left in `handlers_dir`.
    pub async fn open(state_dir: &Path, handlers_dir: Option<&Path>) -> Result<StateDir, Error> {
        StateDir::prepare(state_dir, handlers_dir)?.lock().await
    }

    /// [`open`](Self::open) up to the lock.
    pub fn prepare(state_dir: &Path, handlers_dir: Option<&Path>) -> Result<Unlocked, Error> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(shared) = handlers_dir
            && resolved(state_dir).starts_with(resolved(shared))
        {
            return Err(Error::VisibleToHandlers {
                state: state_dir.to_path_buf(),
                shared: shared.to_path_buf(),
            });
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |cause| Error::Io { path, cause }
        };
        std::fs::create_dir_all(state_dir).map_err(io(state_dir))?;
        std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(state_dir))?;
        let path = state_dir.join("kubelet-plugin.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        Ok(Unlocked {
            dir: state_dir.to_path_buf(),
            handlers_dir: handlers_dir.map(Path::to_path_buf),
            file,
        })
    }
}

impl Unlocked {
    /// Whether another process holds the lock now.
    pub fn held_elsewhere(&self) -> Result<bool, Error> {
        match self.file.try_lock() {
            Ok(()) => {
                // Not ours to keep yet: `lock` takes it again (at once).
                let _ = self.file.unlock();
                Ok(false)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(true),
            Err(std::fs::TryLockError::Error(cause)) => Err(self.error(cause)),
        }
    }

    /// Takes the lock, waiting while another process holds it, then moves in what an earlier
    /// version left in the handlers' directory.
    pub async fn lock(self) -> Result<StateDir, Error> {
        let mut told = false;
        loop {
            match self.file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    if !told {
                        tracing::warn!(lock = %self.path().display(), "another kubelet-plugin runs on this node with the same state directory; waiting for it to exit");
                        told = true;
                    }
                    tokio::time::sleep(RETRY).await;
                }
                Err(std::fs::TryLockError::Error(cause)) => return Err(self.error(cause)),
            }
        }
        if told {
            tracing::info!(lock = %self.path().display(), "the other kubelet-plugin exited; taking over");
        }
        if let Some(old) = &self.handlers_dir {
            move_legacy_state(old, &self.dir).map_err(|cause| Error::Io {
                path: old.clone(),
                cause,
            })?;
        }
        Ok(StateDir { _lock: self.file })
    }

    fn path(&self) -> PathBuf {
        self.dir.join("kubelet-plugin.lock")
    }

    fn error(&self, cause: std::io::Error) -> Error {
        Error::Io {
            path: self.path(),
            cause,
        }
    }
}

/// `path` as the kernel would reach it, so that `..` or a symlink cannot hide that one
/// directory lies inside another: its longest existing ancestor canonicalized, the rest
/// (not created yet) appended with `.` and `..` resolved by hand.
fn resolved(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    let base = loop {
        if let Ok(real) = existing.canonicalize() {
            break real;
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last.as_os_str().to_os_string());
                existing = parent;
            }
            // The root: nothing left to canonicalize.
            _ => break existing.to_path_buf(),
        }
    };
    let mut out = base;
    let tail: PathBuf = rest.iter().rev().collect();
    for component in tail.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Earlier versions kept their state next to the registration socket, where handler pods can
/// read it. Moves the handler registrations and checkpoints found there into `state_dir`
/// (unless it has its own already), so an upgraded node keeps its handlers and prepared
/// claims. Copied, not renamed: the two directories are usually different mounts.
fn move_legacy_state(old: &Path, state_dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(old) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let state = name == "discovery-handlers.json" || name.ends_with("-checkpoint.json");
        let target = state_dir.join(name);
        if !state || !path.is_file() || target.exists() {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        node_io::files::write_atomically(&target, &bytes, 0o600)?;
        std::fs::remove_file(&path)?;
        tracing::info!(from = %path.display(), to = %target.display(), "moved state out of the directory discovery handlers mount");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `..` and symlinks do not hide a state directory inside the handlers' directory.
    #[tokio::test]
    async fn a_state_dir_reached_through_dots_or_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("akri");
        std::fs::create_dir_all(dir.path().join("other")).unwrap();
        std::os::unix::fs::symlink(&shared, dir.path().join("link")).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        for state in [
            dir.path().join("other/../akri/state"),
            dir.path().join("link/state"),
            dir.path().join("not-yet/../akri/./state"),
        ] {
            let error = StateDir::open(&state, Some(&shared)).await.unwrap_err();
            assert!(
                matches!(error, Error::VisibleToHandlers { .. }),
                "{}: {error}",
                state.display()
            );
        }
        let fine = StateDir::open(&dir.path().join("other/state"), Some(&shared)).await;
        assert!(fine.is_ok(), "a directory beside it is fine");
    }

    #[tokio::test]
    async fn a_second_holder_waits_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateDir::open(dir.path(), None).await.unwrap();
        let second = tokio::spawn({
            let dir = dir.path().to_path_buf();
            async move { StateDir::open(&dir, None).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(
            !second.is_finished(),
            "the second waits while the first holds the lock"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the second takes over")
            .unwrap();
    }
}
