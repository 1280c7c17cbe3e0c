//! `akri-migrate`: Akri v0 Configurations to the akri.sh/v1 DRA API.
//!
//! Each v0 Configuration becomes a DiscoveryConfiguration (cluster-scoped, so a name found in
//! several namespaces is renamed, deterministically and loudly) and, when it deploys
//! brokers or services, a BrokerTemplate in its namespace reproducing what Akri's
//! controller deploys. Workloads that request `akri.sh/<configuration>` or
//! `akri.sh/<instance>` are listed with the DRA claim that replaces the request, and
//! rewritten on request. Every v0 field is carried, or reported: a field with no v1
//! equivalent makes the run fail unless `--allow-lossy`, and bad input writes nothing.
//!
//! - [`input`]: files, directories, stdin; [`cluster`]: the live cluster, and `--apply`;
//! - [`names`]: DiscoveryConfiguration names; [`convert`]: one Configuration;
//!   [`broker`]: Akri's broker strategies as BrokerTemplate objects;
//! - [`workloads`]: the requests for Akri's resources; [`report`]: what was found;
//!   [`output`]: YAML on stdout or in a directory.

pub mod broker;
pub mod cluster;
pub mod convert;
pub mod input;
pub mod names;
pub mod output;
pub mod report;
pub mod workloads;

use report::{Kind, Report};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where the input comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Files, directories and `-` (stdin).
    Paths(Vec<PathBuf>),
    /// The cluster, one namespace or (`None`) all of them.
    Cluster(Option<String>),
    /// The cluster, the namespace its client defaults to (the kubeconfig context's, as
    /// kubectl's; in a pod its own).
    ClusterDefaultNamespace,
}

/// Where the result goes.
#[derive(Clone, Debug)]
pub enum Destination {
    Stdout,
    Directory(PathBuf),
    Apply(cluster::ApplyOptions),
}

#[derive(Clone, Debug)]
pub struct Options {
    pub source: Source,
    pub destination: Destination,
    /// The namespace of documents that name none.
    pub default_namespace: String,
    pub renames: Vec<names::Rename>,
    pub allow_lossy: bool,
    pub rewrite_workloads: bool,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything migrated (lossy fields only with `--allow-lossy`).
    Migrated,
    /// Errors: nothing was written (or, with `--apply`, some objects failed).
    Failed,
    /// Lossy fields without `--allow-lossy`: nothing was written.
    Lossy,
}

impl Outcome {
    /// The exit status: 0, 1 for errors, 3 for lossy input (2 is clap's usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Migrated => 0,
            Outcome::Failed => 1,
            Outcome::Lossy => 3,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cluster(#[from] cluster::Error),
    #[error("writing {path}: {cause}")]
    Write {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("connecting to the API server: {0}")]
    Client(kube::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// [`run`] as the command runs it: connected (the kubeconfig's context, or in a pod its
/// ServiceAccount) when the cluster is the source or the destination. A plain function, so
/// the binary awaits nothing (`akri_runtime::block_on` says why).
pub fn run_process(
    options: &Options,
    stdout: &mut dyn std::io::Write,
) -> Result<(Report, Outcome), Error> {
    let connect = !matches!(options.source, Source::Paths(_))
        || matches!(options.destination, Destination::Apply(_));
    let main = async move {
        let client = if connect {
            Some(kube::Client::try_default().await.map_err(Error::Client)?)
        } else {
            None
        };
        run(options, client.as_ref(), stdout).await
    };
    akri_runtime::block_on(akri_runtime::Workers::CurrentThread, main).map_err(Error::Runtime)?
}

/// Migrates what `options` say; `client` is needed for the cluster as source or destination.
/// Returns the report (every finding, sorted by document) and how the run ended; `stdout`
/// gets the YAML when the destination is stdout.
pub async fn run(
    options: &Options,
    client: Option<&kube::Client>,
    stdout: &mut dyn std::io::Write,
) -> Result<(Report, Outcome), Error> {
    let mut report = Report::default();
    let mut input = input::Input::default();
    match &options.source {
        Source::Paths(paths) => input::read_paths(paths, &mut input, &mut report),
        Source::Cluster(namespace) => {
            let client = client.expect("a client for the cluster");
            cluster::read(client, namespace.as_deref(), &mut input, &mut report).await?;
        }
        Source::ClusterDefaultNamespace => {
            let client = client.expect("a client for the cluster");
            let namespace = client.default_namespace();
            cluster::read(client, Some(namespace), &mut input, &mut report).await?;
        }
    }
    let default_namespace = options.default_namespace.as_str();
    if input.configurations.is_empty() && report.count(Kind::Error) == 0 {
        report.add(
            &Default::default(),
            "",
            "",
            Kind::Error,
            "no akri.sh/v0 Configuration in the input",
        );
    }

    let mut parsed = Vec::new();
    let mut sources = BTreeMap::new();
    for document in &input.configurations {
        let Some(config) = convert::parse(document, &mut report) else {
            continue;
        };
        let key = (
            document.namespace(default_namespace).to_string(),
            document.name().to_string(),
        );
        if let Some(first) = sources.insert(key.clone(), document.origin.clone()) {
            report.add(
                &document.origin,
                &format!("{}/{}", key.0, key.1),
                "metadata.name",
                Kind::Error,
                format!("given twice (first at {first})"),
            );
            continue;
        }
        parsed.push((document, config, key));
    }
    let names = names::plan(&sources, &options.renames, &mut report);
    let mut migrated = Vec::new();
    for (document, config, key) in &parsed {
        if let Some(name) = names.get(key)
            && let Some(m) = convert::convert(document, config, key, name, &mut report)
        {
            migrated.push(m);
        }
    }
    migrated.sort_by(|a, b| a.key.cmp(&b.key));

    let mut rewrites: BTreeMap<(String, usize), Vec<serde_json::Value>> = BTreeMap::new();
    for document in &input.workloads {
        let rewritten = workloads::migrate(
            document,
            default_namespace,
            &migrated,
            options.rewrite_workloads,
            &mut report,
        );
        if let Some(docs) = rewritten {
            if document.origin.item.is_some() {
                report.add(&document.origin, document.name(), "", Kind::Error, "a workload inside a kind: List cannot be rewritten: give it as a document of its own");
                continue;
            }
            rewrites.insert(
                (document.origin.file.clone(), document.origin.document),
                docs,
            );
        }
    }

    report.sort();
    if report.count(Kind::Error) > 0 {
        return Ok((report, Outcome::Failed));
    }
    if report.count(Kind::Lossy) > 0 && !options.allow_lossy {
        return Ok((report, Outcome::Lossy));
    }

    let mut stdin_workloads = Vec::new();
    for ((file, _), docs) in &rewrites {
        if file == "-" {
            stdin_workloads.extend(docs.iter().cloned());
        }
    }
    match &options.destination {
        Destination::Stdout => {
            let mut text: String = migrated.iter().map(output::migrated_yaml).collect();
            if !stdin_workloads.is_empty() {
                text.push_str(&output::yaml(
                    "workloads from stdin, rewritten",
                    &stdin_workloads,
                ));
            }
            stdout
                .write_all(text.as_bytes())
                .map_err(|cause| Error::Write {
                    path: "stdout".into(),
                    cause,
                })?;
        }
        Destination::Directory(dir) => {
            std::fs::create_dir_all(dir).map_err(|cause| Error::Write {
                path: dir.clone(),
                cause,
            })?;
            for m in &migrated {
                let path = output::file_name(dir, m);
                output::write(&path, &output::migrated_yaml(m))
                    .map_err(|cause| Error::Write { path, cause })?;
            }
            if !stdin_workloads.is_empty() {
                let path = dir.join("workloads.yaml");
                let text = output::yaml("workloads from stdin, rewritten", &stdin_workloads);
                output::write(&path, &text).map_err(|cause| Error::Write { path, cause })?;
            }
        }
        Destination::Apply(apply) => {
            let client = client.expect("a client to apply with");
            for line in cluster::apply(client, &migrated, apply, &mut report).await {
                writeln!(stdout, "{line}").map_err(|cause| Error::Write {
                    path: "stdout".into(),
                    cause,
                })?;
            }
        }
    }
    rewrite_files(&input.files, &rewrites, &mut report)?;
    report.sort();
    let outcome = if report.count(Kind::Error) > 0 {
        Outcome::Failed
    } else {
        Outcome::Migrated
    };
    Ok((report, outcome))
}

/// Writes each workload file with its rewritten documents in place (each followed by its
/// ResourceClaimTemplates); its other documents are written back as they were read.
fn rewrite_files(
    files: &[PathBuf],
    rewrites: &BTreeMap<(String, usize), Vec<serde_json::Value>>,
    report: &mut Report,
) -> Result<(), Error> {
    for path in files {
        let file = path.display().to_string();
        if !rewrites.keys().any(|(f, _)| *f == file) {
            continue;
        }
        let text = std::fs::read_to_string(path).map_err(|cause| Error::Write {
            path: path.clone(),
            cause,
        })?;
        let mut documents = Vec::new();
        for document in input::documents(&file, &text, report) {
            match rewrites.get(&(file.clone(), document.origin.document)) {
                Some(docs) => documents.extend(docs.iter().cloned()),
                None => documents.push(document.value),
            }
        }
        let text = output::yaml("rewritten by akri-migrate --rewrite-workloads", &documents);
        output::write(path, &text).map_err(|cause| Error::Write {
            path: path.clone(),
            cause,
        })?;
    }
    Ok(())
}
