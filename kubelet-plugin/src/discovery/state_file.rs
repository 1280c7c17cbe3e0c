//! The registry's file: the handlers registered so far, so that a restarted plugin reconnects
//! to them without waiting for them to register again (Akri's handlers only re-register when
//! a send on their stream fails, which a silent handler never notices; Akri issue #558).
//!
//! Format (JSON, written atomically: temporary file, fsync, rename, fsync of the directory):
//!
//! ```json
//! {"version": 1, "handlers": [
//!   {"name": "debugEcho", "endpointType": "UDS", "endpoint": "/var/lib/akri/debugEcho.sock", "shared": false},
//!   {"name": "onvif", "endpointType": "NETWORK", "endpoint": "http://10.0.0.5:10000", "shared": true}
//! ]}
//! ```

use super::handler::RegisteredHandler;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    handlers: Vec<RegisteredHandler>,
}

/// Errors of reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a discovery-handler state file: {cause}")]
    Parse {
        path: PathBuf,
        cause: serde_json::Error,
    },
    #[error("{path}: unsupported version {version} (this plugin writes {VERSION})")]
    Version { path: PathBuf, version: u32 },
}

/// The handlers in `path`; none when the file does not exist.
pub fn load(path: &Path) -> Result<Vec<RegisteredHandler>, Error> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(cause) => {
            return Err(Error::Io {
                path: path.to_path_buf(),
                cause,
            });
        }
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|cause| Error::Parse {
        path: path.to_path_buf(),
        cause,
    })?;
    if file.version != VERSION {
        return Err(Error::Version {
            path: path.to_path_buf(),
            version: file.version,
        });
    }
    Ok(file.handlers)
}

/// Replaces `path` with `handlers`, atomically; creates the directory if needed.
pub fn save(path: &Path, handlers: &[RegisteredHandler]) -> Result<(), Error> {
    let io = |cause| Error::Io {
        path: path.to_path_buf(),
        cause,
    };
    let file = File {
        version: VERSION,
        handlers: handlers.to_vec(),
    };
    let mut json = serde_json::to_vec_pretty(&file).expect("plain data serializes");
    json.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Only the agent reads it (it lives in the state directory).
    node_io::files::write_atomically(path, &json, 0o600).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::handler::Endpoint;

    #[test]
    fn round_trips_and_tolerates_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/handlers.json");
        assert!(load(&path).unwrap().is_empty());
        let handlers = vec![
            RegisteredHandler {
                name: "a".into(),
                endpoint: Endpoint::Uds("/a.sock".into()),
                shared: false,
            },
            RegisteredHandler {
                name: "b".into(),
                endpoint: Endpoint::Network("10.0.0.1:1".into()),
                shared: true,
            },
        ];
        save(&path, &handlers).unwrap();
        assert_eq!(load(&path).unwrap(), handlers);
        save(&path, &handlers[1..]).unwrap();
        assert_eq!(load(&path).unwrap(), handlers[1..]);
    }

    #[test]
    fn reports_corrupt_and_future_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handlers.json");
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(load(&path), Err(Error::Parse { .. })));
        std::fs::write(&path, r#"{"version": 2, "handlers": []}"#).unwrap();
        assert!(matches!(
            load(&path),
            Err(Error::Version { version: 2, .. })
        ));
    }
}
