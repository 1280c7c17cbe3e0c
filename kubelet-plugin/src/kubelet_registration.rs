//! Whether a kubelet took each served DRA driver. The kubelet's plugin watcher finds a driver
//! by its registration socket in the directory it watches (`<kubelet root>/plugins_registry`)
//! and calls it within a second; a plugin pointed at another directory (a distribution that
//! moved the kubelet's root, a wrong `kubeletPlugin.kubeletDir`) would otherwise serve on
//! quietly while no pod ever gets its devices. So a driver that no kubelet has taken within a
//! timeout, or that the kubelet refused, makes the plugin not ready, with a reason that names
//! the directory, and says so once in the log.

use dra_plugin::registration::RegistrationStatus;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// What [`KubeletRegistration::check`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Why the plugin is not ready, if a driver was refused or not taken in time.
    pub problem: Option<String>,
    /// When to look again: a driver still within its time.
    pub next_check: Option<Instant>,
}

/// The drivers' registrations as the plugin sees them.
#[derive(Debug)]
pub(crate) struct KubeletRegistration {
    timeout: Duration,
    /// Drivers whose problem was logged (once each, until it clears).
    logged: BTreeSet<String>,
}

impl KubeletRegistration {
    pub fn new(timeout: Duration) -> Self {
        KubeletRegistration {
            timeout,
            logged: BTreeSet::new(),
        }
    }

    /// Looks at each driver's (name, registration status, when it started serving) at `now`;
    /// `registry_dir` is where its registration socket is.
    pub fn check<'a>(
        &mut self,
        drivers: impl IntoIterator<Item = (&'a str, RegistrationStatus, Instant)>,
        now: Instant,
        registry_dir: &Path,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        let mut failing = BTreeSet::new();
        for (driver, status, since) in drivers {
            let problem = match status {
                RegistrationStatus::Registered => None,
                RegistrationStatus::Rejected(error) => {
                    Some(format!("the kubelet refused DRA driver {driver}: {error}"))
                }
                RegistrationStatus::Pending if now >= since + self.timeout => Some(format!(
                    "no kubelet has taken DRA driver {driver} in {} s: its registration socket is in {}, which should be the kubelet's plugin registry (<kubelet --root-dir>/plugins_registry; the chart's kubeletPlugin.kubeletDir)",
                    self.timeout.as_secs(),
                    registry_dir.display()
                )),
                RegistrationStatus::Pending => {
                    let at = since + self.timeout;
                    verdict.next_check = Some(verdict.next_check.map_or(at, |t| t.min(at)));
                    None
                }
            };
            if let Some(problem) = problem {
                if self.logged.insert(driver.to_string()) {
                    tracing::error!(%driver, "{problem}");
                }
                failing.insert(driver.to_string());
                verdict.problem.get_or_insert(problem);
            }
        }
        // A driver taken since (or gone) is logged again if it fails again.
        self.logged.retain(|d| failing.contains(d));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RegistrationStatus::{Pending, Registered, Rejected};

    const TIMEOUT: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_driver_no_kubelet_took_in_time_is_a_problem_naming_the_directory() {
        let mut watch = KubeletRegistration::new(TIMEOUT);
        let start = Instant::now();
        let dir = Path::new("/var/lib/k0s/kubelet/plugins_registry");

        let early = watch.check(
            [("a.akri.sh", Pending, start)],
            start + Duration::from_secs(10),
            dir,
        );
        assert_eq!(early.problem, None);
        assert_eq!(early.next_check, Some(start + TIMEOUT));

        let late = watch.check([("a.akri.sh", Pending, start)], start + TIMEOUT, dir);
        let problem = late.problem.expect("a problem");
        assert!(
            problem.contains("a.akri.sh") && problem.contains(&dir.display().to_string()),
            "{problem}"
        );
        assert_eq!(late.next_check, None);

        let taken = watch.check([("a.akri.sh", Registered, start)], start + TIMEOUT * 2, dir);
        assert_eq!(taken, Verdict::default());
    }

    #[tokio::test]
    async fn a_refusal_is_a_problem_at_once_and_the_earliest_deadline_is_next() {
        let mut watch = KubeletRegistration::new(TIMEOUT);
        let start = Instant::now();
        let dir = Path::new("/var/lib/kubelet/plugins_registry");
        let verdict = watch.check(
            [
                ("a.akri.sh", Rejected("unsupported versions".into()), start),
                ("b.akri.sh", Pending, start + Duration::from_secs(5)),
                ("c.akri.sh", Pending, start + Duration::from_secs(1)),
                ("d.akri.sh", Registered, start),
            ],
            start + Duration::from_secs(2),
            dir,
        );
        assert_eq!(
            verdict.problem.as_deref(),
            Some("the kubelet refused DRA driver a.akri.sh: unsupported versions")
        );
        assert_eq!(verdict.next_check, Some(start + Duration::from_secs(61)));
    }

    #[tokio::test]
    async fn each_problem_is_logged_once_until_it_clears() {
        let mut watch = KubeletRegistration::new(TIMEOUT);
        let start = Instant::now();
        let dir = Path::new("/x");
        let late = start + TIMEOUT;
        watch.check([("a.akri.sh", Pending, start)], late, dir);
        assert!(watch.logged.contains("a.akri.sh"));
        watch.check([("a.akri.sh", Registered, start)], late, dir);
        assert!(
            watch.logged.is_empty(),
            "cleared: logged again if it fails again"
        );
    }
}
