//! Child processes that cannot outlive the test binary.
//!
//! Each component is started as `setpriv --pdeathsig KILL -- <binary> ...`: the kernel kills it
//! when the thread that started it exits. Test threads come and go (and a shared control plane
//! outlives the test that started it), so every start goes through one spawner thread that
//! lives until the process exits.

use crate::Error;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("akri-testing-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // The channel lives in a static and is never closed: park forever so that
                // the parent-death signal fires only when the process exits.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the spawner thread");
        Mutex::new(tx)
    })
}

/// A running component with its log file. Dropping it kills the process.
#[derive(Debug)]
pub struct Component {
    pub(crate) name: String,
    pub(crate) log: PathBuf,
    child: Child,
}

impl Component {
    /// Starts `binary args...` with stdout and stderr going to `<log_dir>/<name>.log`.
    pub fn start(
        name: &str,
        binary: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Self, Error> {
        Self::start_with_env(name, binary, args, &[], log_dir)
    }

    /// Like [`start`](Self::start), with `env` added to the inherited environment.
    pub fn start_with_env(
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(&str, &std::ffi::OsStr)],
        log_dir: &Path,
    ) -> Result<Self, Error> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io("clone a log file handle"))?;
        Self::spawn(
            name,
            binary,
            args,
            env,
            Stdio::from(out),
            Stdio::from(err),
            log,
        )
    }

    /// Like [`start`](Self::start), but with stdout piped to the caller (stderr to the log).
    pub fn start_piped(
        name: &str,
        binary: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Self, Error> {
        let log = log_dir.join(format!("{name}.log"));
        let err = File::create(&log).map_err(Error::io(format!("create {}", log.display())))?;
        Self::spawn(
            name,
            binary,
            args,
            &[],
            Stdio::piped(),
            Stdio::from(err),
            log,
        )
    }

    fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        env: &[(&str, &std::ffi::OsStr)],
        stdout: Stdio,
        stderr: Stdio,
        log: PathBuf,
    ) -> Result<Self, Error> {
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(binary)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .expect("spawner lock")
            .send((command, tx))
            .map_err(|_| Error::Other("the spawner thread is gone".into()))?;
        let child = rx
            .recv()
            .map_err(|_| Error::Other("the spawner thread is gone".into()))?
            .map_err(Error::io(format!("start {} ({})", name, binary.display())))?;
        Ok(Component {
            name: name.to_string(),
            log,
            child,
        })
    }

    /// The file its stdout and stderr go to (stderr only, when stdout is piped).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The piped stdout, once (see [`start_piped`](Self::start_piped)).
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// An error if the process has exited, carrying the tail of its log.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                component: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: log_tail(&self.log, 40),
            }),
            Err(e) => Err(Error::io(format!("wait for {}", self.name))(e)),
        }
    }

    /// The error to report when the component did not become ready in time.
    pub fn not_ready(&mut self, seconds: u64) -> Error {
        if let Err(exited) = self.check_running() {
            return exited;
        }
        Error::NotReady {
            component: self.name.clone(),
            seconds,
            log: self.log.clone(),
            tail: log_tail(&self.log, 40),
        }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file (at most 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
