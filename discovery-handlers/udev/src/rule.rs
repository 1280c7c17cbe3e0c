//! The udev rules a configuration lists: the subset of udev's rule syntax Akri's handler
//! supports, parsed with an error a person can act on, and matched against devices.
//!
//! A rule is comma-separated `KEY=="pattern"` / `KEY!="pattern"` matches, all of which must
//! hold. Keys:
//!
//! | key | compares |
//! |---|---|
//! | `KERNEL`, `SUBSYSTEM`, `DRIVER`, `DEVPATH` | the device's name, subsystem, driver, devpath |
//! | `ATTR{file}` | a sysfs attribute of the device (trailing whitespace dropped) |
//! | `ENV{key}` | a device property (the kernel's uevent, plus udev's database where udevd runs) |
//! | `TAG` | one of the device's udev tags |
//! | `KERNELS`, `SUBSYSTEMS`, `DRIVERS`, `ATTRS{file}`, `TAGS` | the device or one of its parents |
//!
//! Patterns are udev's: shell globs (`*`, `?`, `[a-z]`, `[!0-9]`) and `|` between
//! alternatives. As in udev, the `==` parent keys must all hold on one and the same device
//! (the device itself or a parent); a `!=` parent key holds when no device up the chain
//! matches it. Assignments (`=`, `+=`, `-=`, `:=`) and keys that act or run things (`NAME`,
//! `SYMLINK`, `RUN`, `PROGRAM`, `ACTION`, ...) are refused: a rule here selects devices, it
//! does not change them.

use crate::sysfs::{Device, Sysfs};
use std::fmt;

/// One rule: every match must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    matches: Vec<Match>,
}

#[derive(Clone, Debug, PartialEq)]
struct Match {
    key: Key,
    equal: bool,
    pattern: Pattern,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    Kernel,
    Subsystem,
    Driver,
    Devpath,
    Attr(String),
    Env(String),
    Tag,
    Kernels,
    Subsystems,
    Drivers,
    Attrs(String),
    Tags,
}

impl Key {
    fn of_parent_chain(&self) -> bool {
        matches!(
            self,
            Key::Kernels | Key::Subsystems | Key::Drivers | Key::Attrs(_) | Key::Tags
        )
    }
}

/// Why a rule cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("udev rule {rule:?}: {reason}")]
pub struct RuleError {
    rule: String,
    reason: String,
}

/// Keys udev knows that select nothing (they act, run programs, or depend on an event).
const UNSUPPORTED: &[&str] = &[
    "ACTION", "NAME", "SYMLINK", "OWNER", "GROUP", "MODE", "SECLABEL", "OPTIONS", "RUN", "PROGRAM",
    "RESULT", "IMPORT", "LABEL", "GOTO", "WAIT_FOR", "TEST", "CONST", "SYSCTL",
];

impl Rule {
    /// Parses one rule.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let error = |reason: String| RuleError {
            rule: text.to_string(),
            reason,
        };
        let mut matches = Vec::new();
        let mut rest = text.trim();
        if rest.is_empty() {
            return Err(error("the rule is empty".into()));
        }
        while !rest.is_empty() {
            let (one, after) = parse_match(rest).map_err(error)?;
            matches.push(one);
            rest = after.trim_start();
            if let Some(after_comma) = rest.strip_prefix(',') {
                rest = after_comma.trim_start();
                if rest.is_empty() {
                    return Err(error("a comma ends the rule".into()));
                }
            } else if !rest.is_empty() {
                return Err(error(format!("expected a comma before {rest:?}")));
            }
        }
        Ok(Rule { matches })
    }

    /// Whether `device` matches every key of the rule.
    pub fn matches(&self, sysfs: &Sysfs, device: &Device) -> bool {
        let (chain, own): (Vec<&Match>, Vec<&Match>) =
            self.matches.iter().partition(|m| m.key.of_parent_chain());
        if !own.iter().all(|m| m.holds(sysfs, device)) {
            return false;
        }
        let (equal, unequal): (Vec<&Match>, Vec<&Match>) = chain.into_iter().partition(|m| m.equal);
        if equal.is_empty() && unequal.is_empty() {
            return true;
        }
        let ancestry: Vec<Device> = std::iter::once(device.clone())
            .chain(sysfs.ancestors(device))
            .collect();
        // `!=`: no device up the chain has it.
        let none_has = unequal
            .iter()
            .all(|m| ancestry.iter().all(|d| !m.key_matches(sysfs, d)));
        // `==`: one device up the chain has them all.
        let one_has_all = equal.is_empty()
            || ancestry
                .iter()
                .any(|d| equal.iter().all(|m| m.key_matches(sysfs, d)));
        none_has && one_has_all
    }
}

impl Match {
    fn holds(&self, sysfs: &Sysfs, device: &Device) -> bool {
        self.key_matches(sysfs, device) == self.equal
    }

    /// Whether the key's value on `device` matches the pattern (regardless of `==`/`!=`).
    /// A value the device does not have is compared as empty, as udev does.
    fn key_matches(&self, sysfs: &Sysfs, device: &Device) -> bool {
        let value = |v: Option<&str>| self.pattern.matches(v.unwrap_or(""));
        match &self.key {
            Key::Kernel | Key::Kernels => value(Some(&device.sysname)),
            Key::Subsystem | Key::Subsystems => value(device.subsystem.as_deref()),
            Key::Driver | Key::Drivers => value(device.driver.as_deref()),
            Key::Devpath => value(Some(&device.devpath)),
            Key::Attr(file) | Key::Attrs(file) => value(sysfs.attribute(device, file).as_deref()),
            Key::Env(key) => value(device.properties.get(key).map(String::as_str)),
            Key::Tag | Key::Tags => device.tags.iter().any(|t| self.pattern.matches(t)),
        }
    }
}

/// Parses `KEY{arg}OP"value"` at the start of `text`; returns it and what follows.
fn parse_match(text: &str) -> Result<(Match, &str), String> {
    let name_end = text
        .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .unwrap_or(text.len());
    let name = &text[..name_end];
    let mut rest = &text[name_end..];
    if name.is_empty() {
        return Err(format!(
            "expected a key such as KERNEL or ATTR{{...}} at {text:?}"
        ));
    }
    let argument = if let Some(inner) = rest.strip_prefix('{') {
        let close = inner
            .find('}')
            .ok_or_else(|| format!("{name}{{ has no closing }}"))?;
        rest = &inner[close + 1..];
        Some(&inner[..close])
    } else {
        None
    };
    let key = key(name, argument)?;
    rest = rest.trim_start();
    let (equal, after_op) = if let Some(r) = rest.strip_prefix("==") {
        (true, r)
    } else if let Some(r) = rest.strip_prefix("!=") {
        (false, r)
    } else if ["=", "+=", "-=", ":="]
        .iter()
        .any(|op| rest.starts_with(op))
    {
        return Err(format!(
            "{name} assigns a value; only the match operators == and != select devices"
        ));
    } else {
        return Err(format!("expected == or != after {name}"));
    };
    let after_op = after_op.trim_start();
    let body = after_op
        .strip_prefix('"')
        .ok_or_else(|| format!("the value of {name} must be in double quotes"))?;
    let close = body
        .find('"')
        .ok_or_else(|| format!("the value of {name} has no closing quote"))?;
    let pattern = Pattern::new(&body[..close]).map_err(|e| format!("{name}: {e}"))?;
    Ok((
        Match {
            key,
            equal,
            pattern,
        },
        &body[close + 1..],
    ))
}

fn key(name: &str, argument: Option<&str>) -> Result<Key, String> {
    let needs = |argument: Option<&str>| -> Result<String, String> {
        let file = argument
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("{name} needs a name in braces, e.g. {name}{{idVendor}}"))?;
        Ok(file.to_string())
    };
    let attribute = |argument: Option<&str>| -> Result<String, String> {
        let file = needs(argument)?;
        // Attributes are files below the device's directory: nothing above it.
        if file.starts_with('/') || file.split('/').any(|part| part == "..") {
            return Err(format!(
                "{name}{{{file}}}: an attribute is a file below the device's sysfs directory"
            ));
        }
        Ok(file)
    };
    let plain = |key: Key| match argument {
        None => Ok(key),
        Some(_) => Err(format!("{name} takes no name in braces")),
    };
    match name {
        "KERNEL" => plain(Key::Kernel),
        "SUBSYSTEM" => plain(Key::Subsystem),
        "DRIVER" => plain(Key::Driver),
        "DEVPATH" => plain(Key::Devpath),
        "TAG" => plain(Key::Tag),
        "KERNELS" => plain(Key::Kernels),
        "SUBSYSTEMS" => plain(Key::Subsystems),
        "DRIVERS" => plain(Key::Drivers),
        "TAGS" => plain(Key::Tags),
        "ATTR" => Ok(Key::Attr(attribute(argument)?)),
        "ATTRS" => Ok(Key::Attrs(attribute(argument)?)),
        "ENV" => Ok(Key::Env(needs(argument)?)),
        unsupported if UNSUPPORTED.contains(&unsupported) => Err(format!(
            "{unsupported} is not supported: a rule here only selects devices (KERNEL, \
             SUBSYSTEM, DRIVER, DEVPATH, ATTR, ENV, TAG and their parent forms)"
        )),
        unknown => Err(format!("unknown key {unknown}")),
    }
}

/// A udev pattern: globs separated by `|`.
#[derive(Clone, PartialEq)]
struct Pattern {
    text: String,
    alternatives: Vec<glob::Pattern>,
}

impl Pattern {
    fn new(text: &str) -> Result<Self, String> {
        let alternatives = text
            .split('|')
            .map(|alternative| {
                glob::Pattern::new(alternative)
                    .map_err(|e| format!("pattern {alternative:?}: {}", e.msg))
            })
            .collect::<Result<_, _>>()?;
        Ok(Pattern {
            text: text.to_string(),
            alternatives,
        })
    }

    fn matches(&self, value: &str) -> bool {
        self.alternatives.iter().any(|p| p.matches(value))
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> String {
        Rule::parse(text).unwrap_err().reason
    }

    #[test]
    fn parses_akris_examples() {
        for rule in [
            r#"KERNEL=="video[0-9]*""#,
            r#"SUBSYSTEM=="sound", ATTR{id}=="Camera""#,
            r#"SUBSYSTEM=="video4linux", ATTRS{idVendor}=="05a9", ATTRS{idProduct}!="4519""#,
            r#"KERNEL=="loop*",ENV{DEVTYPE}=="disk",TAG=="systemd""#,
            r#"SUBSYSTEMS=="usb", KERNELS=="1-1*", DRIVERS=="uvcvideo|usb", TAGS=="uaccess""#,
            r#"DEVPATH=="/devices/virtual/mem/null", DRIVER!="""#,
        ] {
            Rule::parse(rule).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn refuses_what_selects_nothing_with_a_reason() {
        assert!(reason("").contains("empty"));
        assert!(reason(r#"KERNEL="null""#).contains("assigns"));
        assert!(reason(r#"NAME=="x""#).contains("NAME is not supported"));
        assert!(reason(r#"ACTION=="add""#).contains("ACTION is not supported"));
        assert!(reason(r#"KERNEL==null"#).contains("double quotes"));
        assert!(reason(r#"KERNEL=="null"#).contains("closing quote"));
        assert!(reason(r#"ATTR=="1""#).contains("ATTR needs a name"));
        assert!(reason(r#"ATTR{../../etc/shadow}=="x""#).contains("below the device"));
        assert!(reason(r#"KERNEL{x}=="x""#).contains("takes no name"));
        assert!(reason(r#"KERNEL=="a" SUBSYSTEM=="b""#).contains("comma"));
        assert!(reason(r#"KERNEL=="a","#).contains("comma ends"));
        assert!(reason(r#"FOO=="a""#).contains("unknown key FOO"));
        assert!(reason(r#"KERNEL=="[a""#).contains("pattern"));
        let shown = Rule::parse(r#"NAME=="x""#).unwrap_err().to_string();
        assert!(shown.starts_with(r#"udev rule "NAME==\"x\"": "#), "{shown}");
    }

    #[test]
    fn patterns_are_udevs() {
        let p = Pattern::new("loop[0-9]*|null").unwrap();
        assert!(p.matches("loop12"));
        assert!(p.matches("null"));
        assert!(!p.matches("loop"));
        assert!(!p.matches("nullx"));
        assert!(Pattern::new("").unwrap().matches(""));
        assert!(!Pattern::new("").unwrap().matches("x"));
        assert!(Pattern::new("[!0-9]").unwrap().matches("a"));
    }
}
