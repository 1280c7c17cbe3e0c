//! Removing everything a real test node leaves on the machine: the processes of its pods
//! (which containerd's shims keep running whatever happens to containerd and the kubelet),
//! the shims, the mounts under its directory, its cgroups and its bridge.
//!
//! Names carry the test process's pid ([`root_prefix`], [`bridge_name`]), so that a later run
//! also sweeps what a killed run left behind.

use std::path::{Path, PathBuf};

/// The controller hierarchies to look in: `/sys/fs/cgroup` itself (cgroup v2) and each
/// directory below it (cgroup v1 controllers, and the hybrid mode's `unified`).
fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut all = vec![base.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(base) {
        all.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").is_file()),
        );
    }
    all
}

/// Creates the cgroup `root` in every hierarchy: the kubelet refuses a `cgroupRoot` that does
/// not exist.
pub(super) fn create_cgroup_root(root: &str) -> std::io::Result<()> {
    for hierarchy in hierarchies() {
        std::fs::create_dir_all(hierarchy.join(root))?;
    }
    Ok(())
}

/// Every cgroup directory at or below `root` in every hierarchy, deepest first.
fn cgroups_below(root: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for hierarchy in hierarchies() {
        let top = hierarchy.join(root);
        if top.is_dir() {
            walk(&top, &mut out);
        }
    }
    out
}

/// SIGKILLs every process in the cgroup `root`, then removes its cgroups (retrying while the
/// kernel finishes the processes off).
pub(super) fn remove_cgroup(root: &str) {
    for _ in 0..50 {
        let mut pids: Vec<String> = cgroups_below(root)
            .iter()
            .filter_map(|cg| std::fs::read_to_string(cg.join("cgroup.procs")).ok())
            .flat_map(|procs| procs.lines().map(str::to_string).collect::<Vec<_>>())
            .collect();
        pids.sort();
        pids.dedup();
        if !pids.is_empty() {
            kill(&pids);
        }
        let mut left = false;
        for cg in cgroups_below(root) {
            left |= std::fs::remove_dir(&cg).is_err();
        }
        if !left {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    tracing::warn!(root, "cgroups of a real test node could not all be removed");
}

/// SIGKILLs the processes whose command line mentions `needle` (e.g. the shims of one
/// containerd, started with `-address <its socket>`).
pub(super) fn kill_processes_mentioning(needle: &str) {
    let pids = processes_mentioning(needle);
    if !pids.is_empty() {
        kill(&pids);
    }
}

/// SIGKILLs the processes whose command line mentions `needle` until none is left, for at
/// most `timeout`. A SIGKILL is not a death: until the kernel has finished the process off it
/// still runs (seen: the kubelet and containerd of a dropped node, killed on drop, listed in
/// /proc right after the drop returned, on a busy machine).
pub(super) fn kill_until_gone(needle: &str, timeout: std::time::Duration) {
    let start = std::time::Instant::now();
    loop {
        let pids = processes_mentioning(needle);
        if pids.is_empty() {
            return;
        }
        if start.elapsed() > timeout {
            tracing::warn!(
                needle,
                ?pids,
                "processes of a real test node outlive their SIGKILL"
            );
            return;
        }
        kill(&pids);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The live processes (a zombie's command line is empty) whose command line mentions
/// `needle`, but this one.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()) && *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(needle))
        })
        .collect()
}

fn kill(pids: &[String]) {
    // procps' kill: the workspace forbids the `unsafe` of kill(2).
    let _ = std::process::Command::new("kill")
        .arg("-KILL")
        .args(pids)
        .stderr(std::process::Stdio::null())
        .status();
}

/// Lazily unmounts every mount at or below a path starting with `prefix`, deepest first.
pub(super) fn unmount_below(prefix: &str) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for point in points {
        let _ = std::process::Command::new("umount")
            .args(["--lazy", point])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Deletes a network link (the node's bridge), if it exists.
pub(crate) fn delete_link(name: &str) {
    let _ = std::process::Command::new("ip")
        .args(["link", "delete", name])
        .stderr(std::process::Stdio::null())
        .status();
}

/// The prefix of node number `n` of process `pid`: its directory's name starts with it, and
/// that whole name is its cgroup's.
pub(super) fn root_prefix(pid: u32, n: u32) -> String {
    format!("akri-node-{pid}-{n}-")
}

/// The bridge of node number `n` of process `pid` (at most 15 bytes, as links must be).
pub(super) fn bridge_name(pid: u32, n: u32) -> String {
    format!("akn{pid}-{n}")
}

/// The pid in a name made by [`root_prefix`] or [`bridge_name`].
fn pid_in(name: &str) -> Option<&str> {
    let rest = name
        .strip_prefix("akri-node-")
        .or_else(|| name.strip_prefix("akn"))?;
    let pid = rest.split('-').next()?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(pid)
}

/// Removes what nodes of test processes that no longer run left behind: their pods'
/// processes and cgroups, shims, mounts, bridges and directories.
pub(crate) fn sweep_dead_runs() {
    let dead = |name: &str| pid_in(name).is_some_and(|pid| !Path::new("/proc").join(pid).exists());
    let tmp = std::env::temp_dir();
    let mut dead_roots = std::collections::BTreeSet::new();
    for parent in hierarchies().into_iter().chain([tmp.clone()]) {
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("akri-node-") && dead(&name) {
                dead_roots.insert(name);
            }
        }
    }
    for root in &dead_roots {
        let dir = tmp.join(root);
        remove_cgroup(root);
        kill_processes_mentioning(&dir.display().to_string());
        unmount_below(&dir.display().to_string());
        let _ = std::fs::remove_dir_all(&dir);
    }
    let Ok(output) = std::process::Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some(name) = line.split(": ").nth(1)
            && name.starts_with("akn")
            && dead(name)
        {
            delete_link(name);
        }
    }
}

/// Removes the sockets of the shims of a containerd whose state directory is `state`: a shim
/// serves on `/run/containerd/s/<hash>` (whatever the state directory), which containerd
/// writes into the task's bundle (`bootstrap.json`); a killed shim leaves the socket behind.
pub(super) fn remove_shim_sockets(state: &Path) {
    let tasks = state.join("io.containerd.runtime.v2.task");
    for namespace in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
        for task in std::fs::read_dir(namespace.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(bootstrap) = std::fs::read(task.path().join("bootstrap.json")) else {
                continue;
            };
            let address = serde_json::from_slice::<serde_json::Value>(&bootstrap)
                .ok()
                .and_then(|b| Some(b.get("address")?.as_str()?.to_string()));
            if let Some(socket) = address.as_deref().and_then(|a| a.strip_prefix("unix://")) {
                let _ = std::fs::remove_file(socket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_is_read_back_from_each_name() {
        let root = format!("{}AbC123", root_prefix(4_194_304, 12));
        assert_eq!(pid_in(&root), Some("4194304"));
        assert_eq!(pid_in(&bridge_name(77, 3)), Some("77"));
        assert!(bridge_name(4_194_304, 9999).len() <= 15);
        assert_eq!(pid_in("akri-node-x-1"), None);
        assert_eq!(pid_in("akn-1"), None);
        assert_eq!(pid_in("eth0"), None);
    }
}
