//! Akri's include/exclude lists (`applicationNames`, `ipAddresses`, `macAddresses`, `scopes`),
//! one type for every handler.

use serde::Deserialize;

/// `{action: Include|Exclude, items: [...]}`; `action` defaults to `Include`, as in Akri.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilterList {
    #[serde(default)]
    pub items: Vec<String>,
    #[serde(default)]
    pub action: FilterAction,
}

/// Whether the items are the ones admitted or the ones refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum FilterAction {
    #[default]
    Include,
    Exclude,
}

impl FilterList {
    /// Whether `item` passes: listed under `Include`, or not listed under `Exclude`. An
    /// absent list admits everything.
    pub fn admits(list: Option<&FilterList>, item: &str) -> bool {
        match list {
            None => true,
            Some(list) => {
                let listed = list.items.iter().any(|i| i == item);
                listed == (list.action == FilterAction::Include)
            }
        }
    }

    /// Whether any of `items` passes an `Include` list, and none is refused by an `Exclude`
    /// list (a camera with several scopes, say).
    pub fn admits_any<'a>(
        list: Option<&FilterList>,
        items: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        let Some(filter) = list else { return true };
        let mut items = items.into_iter();
        match filter.action {
            FilterAction::Include => items.any(|i| filter.items.iter().any(|f| f == i)),
            FilterAction::Exclude => items.all(|i| !filter.items.iter().any(|f| f == i)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(action: FilterAction, items: &[&str]) -> FilterList {
        FilterList {
            items: items.iter().map(|s| s.to_string()).collect(),
            action,
        }
    }

    #[test]
    fn include_and_exclude_as_in_akri() {
        let include = list(FilterAction::Include, &["beep", "bop"]);
        let exclude = list(FilterAction::Exclude, &["beep", "bop"]);
        assert!(FilterList::admits(Some(&include), "beep"));
        assert!(!FilterList::admits(Some(&include), "boop"));
        assert!(!FilterList::admits(Some(&exclude), "beep"));
        assert!(FilterList::admits(Some(&exclude), "boop"));
        assert!(FilterList::admits(None, "anything"));
        let empty_exclude = list(FilterAction::Exclude, &[]);
        assert!(FilterList::admits(Some(&empty_exclude), "beep"));
        assert!(!FilterList::admits(
            Some(&list(FilterAction::Include, &[])),
            "beep"
        ));
        assert!(FilterList::admits_any(Some(&include), ["x", "bop"]));
        assert!(!FilterList::admits_any(Some(&exclude), ["x", "bop"]));
        assert!(FilterList::admits_any(Some(&exclude), ["x", "y"]));
    }

    #[test]
    fn parses_akris_yaml() {
        let parsed: FilterList = serde_yaml::from_str("items: [a]").unwrap();
        assert_eq!(parsed.action, FilterAction::Include);
        let parsed: FilterList = serde_yaml::from_str("action: Exclude\nitems: [a]").unwrap();
        assert_eq!(parsed.action, FilterAction::Exclude);
        assert!(serde_yaml::from_str::<FilterList>("action: Drop").is_err());
    }
}
