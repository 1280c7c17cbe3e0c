//! Camera credentials from the configuration's `discoveryProperties` (usually Secrets), as
//! Akri names them: `username_<uuid>` / `password_<uuid>` for one camera, `username_default`
//! / `password_default` for the others. Values are never logged or reported: [`Credential`]
//! prints as `***`.

use std::collections::BTreeMap;
use std::fmt;

/// A username and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(***)")
    }
}

/// The credentials a configuration carries, by camera uuid (lower case, no `urn:uuid:`).
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    by_uuid: BTreeMap<String, Credential>,
    default: Option<Credential>,
}

impl Credentials {
    /// Reads `username_*` / `password_*` pairs; a username without its password has an
    /// empty password, a password without its username is ignored.
    pub fn from_properties<'a>(properties: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut usernames = BTreeMap::new();
        let mut passwords = BTreeMap::new();
        for (name, value) in properties {
            let value = String::from_utf8_lossy(value)
                .trim_end_matches(['\r', '\n'])
                .to_string();
            if let Some(id) = name.strip_prefix("username_") {
                usernames.insert(id.to_lowercase(), value);
            } else if let Some(id) = name.strip_prefix("password_") {
                passwords.insert(id.to_lowercase(), value);
            }
        }
        let mut credentials = Credentials::default();
        for (id, username) in usernames {
            let credential = Credential {
                username,
                password: passwords.remove(&id).unwrap_or_default(),
            };
            if id == "default" {
                credentials.default = Some(credential);
            } else {
                credentials.by_uuid.insert(id, credential);
            }
        }
        credentials
    }

    /// The camera's own credential, else the default one.
    pub fn get(&self, uuid: &str) -> Option<&Credential> {
        self.by_uuid
            .get(&uuid.to_lowercase())
            .or(self.default.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_camera_then_default_and_never_shown() {
        let credentials = Credentials::from_properties([
            (
                "username_1B4E28BA-2FA1-11D2-883F-0016D3CCA427",
                b"admin".as_slice(),
            ),
            (
                "password_1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                b"s3cret\n".as_slice(),
            ),
            ("username_default", b"viewer".as_slice()),
            ("password_default", b"pw".as_slice()),
            ("password_orphan", b"x".as_slice()),
            ("RESOLUTION", b"1080p".as_slice()),
        ]);
        let own = credentials
            .get("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
            .unwrap();
        assert_eq!(
            (own.username.as_str(), own.password.as_str()),
            ("admin", "s3cret")
        );
        assert_eq!(credentials.get("other").unwrap().username, "viewer");
        assert!(Credentials::default().get("x").is_none());
        let shown = format!("{credentials:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw\""),
            "{shown}"
        );
    }
}
