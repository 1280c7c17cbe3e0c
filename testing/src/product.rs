//! The product as a user installs it: the images `hack/images.sh` built and the chart, pushed
//! to a real registry on this machine (`hack/registry.sh`, `hack/push.sh`: the README's
//! Quickstart), the real nodes' containerd pulling from it, and Helm (built by `hack/helm.sh`)
//! installing the chart from it by version. Shared by the cluster tests and the demo.

use crate::Error;
use std::path::{Path, PathBuf};

/// The registry's host, as its clients name it (`hack/registry.sh` serves it on loopback).
pub const REGISTRY_HOST: &str = "localhost:5000";
/// The registry the images are pushed to (`image.registry`).
pub const REGISTRY: &str = "localhost:5000/akri";
/// The chart in the registry (`helm install akri <CHART> --version <tag>`).
pub const CHART: &str = "oci://localhost:5000/akri/charts/akri";

/// The repository (the chart, the images, the examples).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testing/ is in the repository")
        .to_path_buf()
}

/// A top-level field of the chart in `dir` (its `Chart.yaml`), e.g. `version` or `appVersion`.
pub fn chart_field(dir: &Path, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("Chart.yaml")).ok()?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    Some(value.trim().trim_matches('"').to_string())
}

/// What a node's containerd is told about the registry (`certs.d/localhost:5000/hosts.toml`):
/// the README's Quickstart block, as a user writes it.
pub fn hosts_toml() -> Result<String, Error> {
    let readme = repo().join("README.md");
    let blocks = crate::docs::section_blocks(&readme, "Quickstart", &["toml"])
        .map_err(Error::io("read the README's Quickstart"))?;
    match &blocks[..] {
        [hosts] => Ok(hosts.clone()),
        _ => Err(Error::Other(format!(
            "the README's Quickstart has {} toml blocks, want the one hosts.toml",
            blocks.len()
        ))),
    }
}

/// Our images in the registry: their names and the tag `hack/images.sh` gave them.
pub struct Images {
    /// Where `hack/images.sh` put them (OCI image layouts).
    dir: PathBuf,
    names: Vec<String>,
    pub tag: String,
}

impl Images {
    /// The images `hack/images.sh` built (`_output/images/<name>`, tagged `_output/images/TAG`),
    /// without asking the registry; an error that says to build them.
    pub fn built() -> Result<Images, Error> {
        Images::built_in(&repo().join("_output/images"), "hack/images.sh")
    }

    /// The images of the previous release (`hack/previous.sh`), not yet in the registry.
    pub fn previous() -> Result<Images, Error> {
        let dir = repo().join("_output/previous/_output/images");
        Images::built_in(&dir, "hack/previous.sh")
    }

    /// The images in `dir` (`<dir>/<name>`, tagged `<dir>/TAG`); an error that names `script`.
    fn built_in(dir: &Path, script: &str) -> Result<Images, Error> {
        let missing = || Error::Other(format!("no images in {}: run {script}", dir.display()));
        let tag = std::fs::read_to_string(dir.join("TAG")).map_err(|_| missing())?;
        let mut names: Vec<String> = (std::fs::read_dir(dir).map_err(|_| missing())?.flatten())
            .filter(|entry| entry.path().join("index.json").is_file())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        if names.is_empty() {
            return Err(missing());
        }
        names.sort();
        Ok(Images {
            dir: dir.to_path_buf(),
            names,
            tag: tag.trim().to_string(),
        })
    }

    /// The images `hack/images.sh` built, each served by the registry under its tag (the
    /// chart too): an error that says how to push them when one is not.
    pub async fn pushed() -> Result<Images, Error> {
        let images = Images::built()?;
        let chart = CHART.trim_start_matches("oci://");
        let wanted = (images.names.iter().map(|name| format!("{REGISTRY}/{name}")))
            .chain([chart.to_string()])
            .map(|repository| format!("docker://{repository}:{}", images.tag));
        for reference in wanted {
            if let Err(error) =
                skopeo(&["inspect", "--raw", "--tls-verify=false", &reference]).await
            {
                return Err(Error::Other(format!(
                    "{error}: run `hack/registry.sh start` and `hack/push.sh {REGISTRY} \
                     --plain-http` (the README's Quickstart)"
                )));
            }
        }
        Ok(images)
    }

    /// Pushes every image again under `tag` as well (a copy inside the registry: same
    /// digests): the demo's rebuilt images.
    pub async fn push_as(&self, tag: &str) -> Result<(), Error> {
        for name in &self.names {
            let from = format!("docker://{REGISTRY}/{name}:{}", self.tag);
            let to = format!("docker://{REGISTRY}/{name}:{tag}");
            let args = ["copy", "--quiet", "--all", "--src-tls-verify=false"];
            skopeo(&[&args[..], &["--dest-tls-verify=false", &from, &to]].concat()).await?;
        }
        Ok(())
    }

    /// Pushes every image to the registry under its tag, as `hack/push.sh` does.
    pub async fn push(&self) -> Result<(), Error> {
        for name in &self.names {
            let from = format!("oci:{}:{}", self.dir.join(name).display(), self.tag);
            let to = format!("docker://{REGISTRY}/{name}:{}", self.tag);
            let args = ["copy", "--quiet", "--all", "--dest-tls-verify=false"];
            skopeo(&[&args[..], &[&from, &to]].concat()).await?;
        }
        Ok(())
    }

    /// The `--set` values that run these images: the registry and the tag of every image.
    pub fn values(&self) -> [String; 2] {
        [
            format!("image.registry={REGISTRY}"),
            format!("image.tag={}", self.tag),
        ]
    }
}

/// Runs skopeo with `args`; an error with the command and what it printed when it fails.
async fn skopeo(args: &[&str]) -> Result<(), Error> {
    let output = tokio::process::Command::new("skopeo")
        .args(args)
        .output()
        .await
        .map_err(Error::io("run skopeo (hack/setup.sh installs it)"))?;
    match output.status.success() {
        true => Ok(()),
        false => Err(Error::Other(format!(
            "skopeo {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
    }
}

/// Runs `cp`'s kubectl with `args` from the repository root (relative paths, as the docs write
/// them, work); its stdout, or an error with what it printed.
pub fn kubectl<S: AsRef<std::ffi::OsStr>>(
    cp: &crate::ControlPlane,
    args: &[S],
) -> Result<String, Error> {
    let output = std::process::Command::new(cp.bins().require("kubectl")?)
        .args(args)
        .current_dir(repo())
        .env("KUBECONFIG", cp.kubeconfig())
        .output()
        .map_err(Error::io("run kubectl"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Other(format!(
            "kubectl {:?}: {}{}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy())
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// Runs `script` as a user's shell would (`sh -c` with `set -e`: it stops at the first failing
/// command), from the repository root, against the cluster of `kubeconfig`, with our Helm and
/// `tools` (e.g. the control plane's `kubectl`) first on `PATH`: how a test runs the docs'
/// blocks as written. What it printed, or an error with that.
pub async fn shell(kubeconfig: &Path, tools: &[&Path], script: &str) -> Result<String, Error> {
    shell_in(&repo(), kubeconfig, tools, script).await
}

/// [`shell`], from directory `dir` (where a section's files should land, e.g. an export).
pub async fn shell_in(
    dir: &Path,
    kubeconfig: &Path,
    tools: &[&Path],
    script: &str,
) -> Result<String, Error> {
    let helm = Helm::new()?;
    let dirs = (tools.iter().copied().chain([helm.bin()]))
        .map(|b| b.parent().unwrap_or(Path::new(".")).to_path_buf());
    let path = std::env::join_paths(dirs.chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .map_err(|e| Error::Other(format!("PATH: {e}")))?;
    let output = tokio::process::Command::new("sh")
        .args(["-c", &format!("set -e\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .envs(helm.env())
        .output()
        .await
        .map_err(Error::io("run sh"))?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    match output.status.success() {
        true => Ok(printed),
        false => Err(Error::Other(format!("sh -c {script:?} failed:\n{printed}"))),
    }
}

/// The test's own step after a documented `helm install` line, which it runs as written: the
/// release's workloads roll out as the docs installed them (`kubectl rollout status`, so a
/// doc line that installs something broken fails here), then the release is upgraded with
/// the test's `fixtures` (`--reuse-values --set ...`, e.g. the embedded debugEcho handler's
/// devices, which no user enables) and waited for. A script for [`shell`].
pub fn fixtures_after(install_line: &str, fixtures: &[String]) -> String {
    let words: Vec<&str> = install_line.split_whitespace().collect();
    assert!(
        words.starts_with(&["helm", "install"]) && words.len() > 3,
        "not a helm install line: {install_line}"
    );
    let release = words[2];
    let namespace = (words.windows(2))
        .find(|w| w[0] == "--namespace" || w[0] == "-n")
        .map_or("default", |w| w[1]);
    let rollout = |kind: &str| {
        format!(
            "kubectl --namespace {namespace} rollout status {kind} --selector app.kubernetes.io/instance={release} --timeout 3m"
        )
    };
    let sets: String = fixtures.iter().map(|f| format!(" --set {f}")).collect();
    format!(
        "{}\n{}\n{} --reuse-values{sets} --wait --timeout 3m",
        rollout("daemonset"),
        rollout("deployment"),
        install_line.replacen("helm install ", "helm upgrade ", 1)
    )
}

/// Helm as a process, with its own config, cache and data directories, run from the
/// repository root (relative chart paths, as the docs write them, work).
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

/// What a Helm run printed.
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Helm {
    /// The binary `hack/helm.sh` builds; an error that says so without it.
    pub fn new() -> Result<Helm, Error> {
        let bin = repo().join("_output/tools/bin/helm");
        if !bin.is_file() {
            return Err(Error::Other(format!(
                "Helm is missing at {}: run `hack/helm.sh` first (it builds Helm from the Go module proxy)",
                bin.display()
            )));
        }
        Ok(Helm {
            bin,
            home: tempfile::tempdir().map_err(Error::io("create Helm's home"))?,
        })
    }

    /// The binary, for a shell that runs the docs' commands.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The environment Helm runs with: its own directories, no inherited `KUBECONFIG`.
    pub fn env(&self) -> [(&'static str, PathBuf); 3] {
        [
            ("HELM_CACHE_HOME", self.home.path().join("cache")),
            ("HELM_CONFIG_HOME", self.home.path().join("config")),
            ("HELM_DATA_HOME", self.home.path().join("data")),
        ]
    }

    /// Runs Helm; an error only when it cannot be run.
    pub async fn run(&self, args: &[&str]) -> Result<Run, Error> {
        let output = tokio::process::Command::new(&self.bin)
            .args(args)
            .current_dir(repo())
            .envs(self.env())
            .env_remove("KUBECONFIG")
            .output()
            .await
            .map_err(Error::io(format!("run {}", self.bin.display())))?;
        Ok(Run {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Runs Helm and returns its stdout; an error with its output when it fails.
    pub async fn ok(&self, args: &[&str]) -> Result<String, Error> {
        let run = self.run(args).await?;
        if !run.success {
            return Err(Error::Other(format!(
                "helm {} failed:\n{}\n{}",
                args.join(" "),
                run.stdout,
                run.stderr
            )));
        }
        Ok(run.stdout)
    }
}
