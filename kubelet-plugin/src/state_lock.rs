//! One kubelet-plugin per node: a lock file in the state directory.
//!
//! The checkpoints, the handler registrations and the sockets of a node belong to one process.
//! A second one (a DaemonSet rolling update with surge, a copy started by hand) would bind the
//! same socket paths, taking them from the first silently, and the two would overwrite each
//! other's checkpoints. So the agent takes an exclusive lock on `<state dir>/kubelet-plugin.lock`
//! before it touches anything, and a second process waits, saying so, until the first exits
//! (the kernel releases the lock with the process, however it ends). A DaemonSet running it
//! must therefore roll with `maxSurge: 0`: the old pod goes first, then the new one starts.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a waiting process tries the lock again.
const RETRY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
#[error("lock file {}: {source}", path.display())]
pub struct Error {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Held for the life of the agent; dropping it releases the node.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock of `state_dir`, waiting for another process to release it.
    pub async fn acquire(state_dir: &Path) -> Result<StateLock, Error> {
        let path = state_dir.join("kubelet-plugin.lock");
        let error = |source| Error {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(error)?;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(error)?;
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    if told {
                        tracing::info!(lock = %path.display(), "the other kubelet-plugin exited; taking over");
                    }
                    return Ok(StateLock { _file: file });
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    if !told {
                        tracing::warn!(lock = %path.display(), "another kubelet-plugin runs on this node with the same state directory; waiting for it to exit");
                        told = true;
                    }
                    tokio::time::sleep(RETRY).await;
                }
                Err(std::fs::TryLockError::Error(source)) => return Err(error(source)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_waits_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).await.unwrap();
        let second = tokio::spawn({
            let dir = dir.path().to_path_buf();
            async move { StateLock::acquire(&dir).await.unwrap() }
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
