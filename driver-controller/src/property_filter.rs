//! PropertyFilter -> CEL, so that the scheduler applies a filter when it allocates.
//!
//! A discovered property `KEY` is published as the string attribute `property.akri.sh/KEY`
//! when DRA can hold it (see [`akri_devices::property_fits`]). A filter on a property that can
//! never be an attribute would silently match nothing (or everything, for Exclude), so it is
//! refused with a message instead.
//!
//! A selector that fails to evaluate on some device makes the scheduler give up on the claim,
//! so every attribute access is guarded: `Include` needs the attribute present and equal,
//! `Exclude` accepts a device without it.

use akri_api::v1::{Filter, FilterMode};
use akri_devices::{MAX_ATTRIBUTE_ID, MAX_ATTRIBUTE_VALUE, PROPERTY_DOMAIN, property_fits};
use std::collections::BTreeMap;

/// Why a filter cannot compile. Shown in the PropertyFilter's `Ready` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error(
        "filter {index}: property key {key:?} can never be a device attribute: it must be a C identifier (letters, digits, '_', not starting with a digit) of at most {MAX_ATTRIBUTE_ID} characters"
    )]
    UnknownKey { index: usize, key: String },
    #[error(
        "filter {index} on {key}: the value is {len} characters long, but a device attribute holds at most {MAX_ATTRIBUTE_VALUE}, so no device can match it"
    )]
    ValueTooLong {
        index: usize,
        key: String,
        len: usize,
    },
    #[error(
        "the filters compile to {len} bytes of CEL, more than the {CEL_SELECTOR_MAX_LENGTH} the API server accepts in a DeviceClass selector; use fewer or shorter filters"
    )]
    TooLong { len: usize },
}

/// The longest CEL expression the API server accepts in a device selector
/// (`CELSelectorExpressionMaxLength` in `k8s.io/api/resource/v1`).
pub const CEL_SELECTOR_MAX_LENGTH: usize = 10 * 1024;

/// The CEL expression of `filters` (all must hold).
pub fn compile(filters: &[Filter]) -> Result<String, FilterError> {
    let mut terms = Vec::with_capacity(filters.len());
    for (index, filter) in filters.iter().enumerate() {
        check(index, filter)?;
        let attributes = format!("device.attributes[{}]", cel_string(PROPERTY_DOMAIN));
        let present = format!("{} in {attributes}", cel_string(&filter.key));
        let value = format!("{attributes}[{}]", cel_string(&filter.key));
        let wanted = cel_string(&filter.value);
        terms.push(match filter.mode {
            FilterMode::Include => format!("({present} && {value} == {wanted})"),
            FilterMode::Exclude => format!("(!({present}) || {value} != {wanted})"),
        });
    }
    let expression = terms.join(" && ");
    if expression.len() > CEL_SELECTOR_MAX_LENGTH {
        return Err(FilterError::TooLong {
            len: expression.len(),
        });
    }
    Ok(expression)
}

/// Whether a device with these discovered properties matches, exactly as the compiled CEL
/// decides it (properties that cannot be attributes are invisible to the scheduler).
pub fn matches(filters: &[Filter], properties: &BTreeMap<String, String>) -> bool {
    filters.iter().all(|filter| {
        let attribute = properties
            .get(&filter.key)
            .filter(|value| property_fits(&filter.key, value));
        match filter.mode {
            FilterMode::Include => attribute == Some(&filter.value),
            FilterMode::Exclude => attribute != Some(&filter.value),
        }
    })
}

fn check(index: usize, filter: &Filter) -> Result<(), FilterError> {
    // Any short value fits; the key decides whether the property can be an attribute.
    if !property_fits(&filter.key, "") {
        return Err(FilterError::UnknownKey {
            index,
            key: filter.key.clone(),
        });
    }
    if filter.value.len() > MAX_ATTRIBUTE_VALUE {
        return Err(FilterError::ValueTooLong {
            index,
            key: filter.key.clone(),
            len: filter.value.len(),
        });
    }
    Ok(())
}

/// A CEL string literal: double-quoted, with quotes, backslashes and control characters escaped.
pub fn cel_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expression_over_the_selector_limit_is_refused() {
        let long: Vec<Filter> = (0..32)
            .map(|i| {
                filter(
                    &format!("K{i:031}"),
                    &"\u{1}".repeat(64),
                    FilterMode::Include,
                )
            })
            .collect();
        let error = compile(&long).unwrap_err();
        assert!(matches!(error, FilterError::TooLong { len } if len > CEL_SELECTOR_MAX_LENGTH));
        assert!(error.to_string().contains("10240"), "{error}");
        assert!(compile(&long[..8]).is_ok());
    }

    fn filter(key: &str, value: &str, mode: FilterMode) -> Filter {
        Filter {
            key: key.into(),
            value: value.into(),
            mode,
        }
    }

    #[test]
    fn include_and_exclude_compile_to_guarded_cel() {
        let cel = compile(&[
            filter("MODEL", "x1", FilterMode::Include),
            filter("SITE", "lab", FilterMode::Exclude),
        ])
        .unwrap();
        assert_eq!(
            cel,
            r#"("MODEL" in device.attributes["property.akri.sh"] && device.attributes["property.akri.sh"]["MODEL"] == "x1") && (!("SITE" in device.attributes["property.akri.sh"]) || device.attributes["property.akri.sh"]["SITE"] != "lab")"#
        );
    }

    #[test]
    fn values_are_escaped() {
        assert_eq!(cel_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(cel_string("x\ny\u{1}"), r#""x\ny\u0001""#);
    }

    #[test]
    fn keys_that_cannot_be_attributes_and_long_values_are_refused() {
        let error = compile(&[
            filter("OK", "v", FilterMode::Include),
            filter("not-an-identifier", "v", FilterMode::Include),
        ])
        .unwrap_err();
        assert_eq!(
            error,
            FilterError::UnknownKey {
                index: 1,
                key: "not-an-identifier".into()
            }
        );
        assert!(error.to_string().contains("C identifier"), "{error}");
        let error = compile(&[filter("URL", &"x".repeat(65), FilterMode::Include)]).unwrap_err();
        assert!(
            matches!(error, FilterError::ValueTooLong { len: 65, .. }),
            "{error}"
        );
        assert!(compile(&[filter(&"K".repeat(33), "v", FilterMode::Exclude)]).is_err());
    }

    #[test]
    fn matching_follows_the_cel_semantics() {
        let props = BTreeMap::from([
            ("MODEL".to_string(), "x1".to_string()),
            ("URL".to_string(), "u".repeat(80)),
        ]);
        let include = |k: &str, v: &str| vec![filter(k, v, FilterMode::Include)];
        let exclude = |k: &str, v: &str| vec![filter(k, v, FilterMode::Exclude)];
        assert!(matches(&include("MODEL", "x1"), &props));
        assert!(!matches(&include("MODEL", "x2"), &props));
        assert!(!matches(&include("MISSING", "x1"), &props));
        assert!(!matches(&exclude("MODEL", "x1"), &props));
        assert!(matches(&exclude("MODEL", "x2"), &props));
        assert!(
            matches(&exclude("MISSING", "x"), &props),
            "a device without the property is not excluded"
        );
        // Too long to be an attribute: the scheduler does not see it.
        assert!(!matches(&include("URL", &"u".repeat(80)), &props));
    }
}
