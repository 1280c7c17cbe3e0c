//! Real protocol peers for the discovery handlers' tests: the scripts in `hack/peers/`, run
//! with the Python of `hack/peers.sh`'s virtualenv (asyncua from PyPI for OPC UA), as child
//! processes that cannot outlive the test binary.

use crate::process::Component;
use crate::{Error, bins::repo_root};
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

/// The peers' Python: `$AKRI_PEERS_PYTHON`, else `_output/tools/peers-venv/bin/python`; an
/// error naming the script that makes it when it is missing.
pub fn python() -> Result<PathBuf, Error> {
    let python = std::env::var_os("AKRI_PEERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("_output/tools/peers-venv/bin/python"));
    if python.is_file() {
        Ok(python)
    } else {
        Err(Error::Other(format!(
            "{} is missing: run hack/peers.sh (hack/test.sh does)",
            python.display()
        )))
    }
}

/// The address this host sends to the WS-Discovery multicast group from: where a probe's
/// answers come from, so where `onvif_camera.py` serves its device service (the ONVIF handler
/// asks a device service only at the address that answered).
pub fn multicast_source() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket
        .connect("239.255.255.250:3702")
        .expect("a route to the WS-Discovery group");
    socket.local_addr().expect("the socket's address").ip()
}

/// A running peer. Dropping it kills it.
#[derive(Debug)]
pub struct Peer {
    component: Component,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// Runs `hack/peers/<script> args...` and waits (at most 30 s) until it prints `ready`.
    pub fn start(name: &str, script: &str, args: &[String]) -> Result<Peer, Error> {
        let dir = tempfile::tempdir().map_err(Error::io("create a peer's log directory"))?;
        let mut all = vec![
            repo_root()
                .join("hack/peers")
                .join(script)
                .display()
                .to_string(),
        ];
        all.extend(args.iter().cloned());
        let mut component = Component::start_piped(name, &python()?, &all, dir.path())?;
        let stdout = component
            .take_stdout()
            .ok_or_else(|| Error::Other("a peer's stdout".into()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let log = component.log().to_path_buf();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut lines = std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok);
            let ready = lines.any(|line| line.trim() == "ready");
            let _ = tx.send(ready);
            // Read on until it exits: a peer printing to a closed pipe fails (Python raises
            // BrokenPipeError in the middle of an answer). What it prints goes to its log.
            let mut file = std::fs::OpenOptions::new().append(true).open(log).ok();
            for line in lines {
                if let Some(file) = file.as_mut() {
                    let _ = writeln!(file, "{line}");
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(true) => Ok(Peer {
                component,
                _dir: dir,
            }),
            _ => Err(component.not_ready(30)),
        }
    }

    /// Stops it at once (SIGKILL), as a crashed or unplugged peer would.
    pub fn kill(&mut self) {
        self.component.kill();
    }
}
