//! The debugEcho availability file: which of the described devices are offline.
//!
//! Format, read as UTF-8 text:
//!
//! - A missing, unreadable or empty file: every device is online.
//! - `OFFLINE` anywhere in the file: every device is offline. This is Akri's rule
//!   (`echo OFFLINE > /tmp/debug-echo-availability.txt`), kept so its scripts work unchanged;
//!   a consequence is that no description containing `OFFLINE` can be taken offline alone.
//! - Otherwise one description per line, trimmed, takes that device offline; blank lines and
//!   lines starting with `#` are ignored. E.g. `foo1` makes `foo1` vanish and keeps `foo0`.

use std::collections::BTreeSet;
use std::path::Path;

/// The word that takes every device offline, as in Akri.
pub const OFFLINE: &str = "OFFLINE";

/// What the availability file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Every device is offline.
    AllOffline,
    /// These descriptions are offline, the others online.
    Offline(BTreeSet<String>),
}

impl Availability {
    /// Parses the file's content.
    pub fn parse(content: &str) -> Self {
        if content.contains(OFFLINE) {
            return Availability::AllOffline;
        }
        Availability::Offline(
            content
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_string)
                .collect(),
        )
    }

    /// Reads the file at `path`; a missing or unreadable file means all online.
    pub async fn read(path: &Path) -> Self {
        match tokio::fs::read_to_string(path).await {
            Ok(content) => Self::parse(&content),
            Err(error) => {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), %error, "cannot read the debugEcho availability file; all devices online");
                }
                Availability::Offline(BTreeSet::new())
            }
        }
    }

    /// Whether the device with this description is online.
    pub fn is_online(&self, description: &str) -> bool {
        match self {
            Availability::AllOffline => false,
            Availability::Offline(offline) => !offline.contains(description),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_akri_and_per_device_forms() {
        let all_online = Availability::parse("");
        assert!(all_online.is_online("foo0"));
        assert_eq!(Availability::parse("OFFLINE\n"), Availability::AllOffline);
        assert_eq!(
            Availability::parse("devices are OFFLINE"),
            Availability::AllOffline
        );
        let one = Availability::parse("# comment\n\n  foo1  \n");
        assert!(one.is_online("foo0"));
        assert!(!one.is_online("foo1"));
        assert!(one.is_online("# comment"));
    }

    #[tokio::test]
    async fn a_missing_file_means_online() {
        let dir = tempfile::tempdir().unwrap();
        let availability = Availability::read(&dir.path().join("nope")).await;
        assert!(availability.is_online("foo0"));
    }
}
