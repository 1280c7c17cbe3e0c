//! Errors of the test harness.

use std::path::PathBuf;

/// What went wrong while bringing up or driving real Kubernetes components.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "Kubernetes binaries not found in {dir}: run `hack/k8s-bins.sh{version_arg}` first ({missing} is missing)"
    )]
    BinariesMissing {
        dir: PathBuf,
        missing: String,
        version_arg: String,
    },
    #[error("real node binaries: {missing} not found: run `hack/node-bins.sh` first")]
    NodeBinariesMissing { missing: PathBuf },
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    #[error("generating certificates: {0}")]
    Certs(rcgen::Error),
    #[error("{component} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    Exited {
        component: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{component} was not ready after {seconds}s; last lines of {log}:\n{tail}")]
    NotReady {
        component: String,
        seconds: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("kube client: {0}")]
    Kube(kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kubelet peer {call}: HTTP {status}: {body}")]
    Peer {
        call: String,
        status: u16,
        body: String,
    },
    #[error("HTTP: {0}")]
    Http(reqwest::Error),
    #[error("{0}")]
    Other(String),
}

// `?` on these wraps them; the message shows the cause, so none is a `source` (a cause is
// printed once).
impl From<rcgen::Error> for Error {
    fn from(cause: rcgen::Error) -> Self {
        Error::Certs(cause)
    }
}

impl From<kube::Error> for Error {
    fn from(cause: kube::Error) -> Self {
        Error::Kube(cause)
    }
}

impl From<reqwest::Error> for Error {
    fn from(cause: reqwest::Error) -> Self {
        Error::Http(cause)
    }
}

impl Error {
    /// Wraps an I/O error with what was being done, for `map_err`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |cause| Error::Io { what, cause }
    }
}
