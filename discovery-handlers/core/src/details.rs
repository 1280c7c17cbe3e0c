//! A configuration's `discoveryDetails`, as the handler reads them.

use serde::de::DeserializeOwned;

/// Parses `discoveryDetails` (YAML, of which JSON is a subset) for `handler`. The error says
/// which handler refused them and why (serde_yaml names the field and the position), and is
/// what the agent shows in the configuration's per-node status.
pub fn parse<T: DeserializeOwned>(handler: &str, details: &str) -> Result<T, tonic::Status> {
    // An empty string is YAML's null: parse it as an empty mapping, so a handler whose fields
    // all have defaults accepts no details and one that needs a field names it.
    let text = if details.trim().is_empty() {
        "{}"
    } else {
        details
    };
    serde_yaml::from_str(text)
        .map_err(|e| tonic::Status::invalid_argument(format!("{handler} discovery details: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Details {
        #[serde(default)]
        names: Vec<String>,
    }

    #[test]
    fn empty_details_are_an_empty_mapping() {
        assert!(parse::<Details>("x", "").unwrap().names.is_empty());
        assert_eq!(parse::<Details>("x", "names: [a]").unwrap().names, ["a"]);
    }

    #[test]
    fn errors_name_the_handler_and_the_field() {
        let error = parse::<Details>("udev", "nmes: [a]").unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(error.message().starts_with("udev discovery details: "));
        assert!(error.message().contains("nmes"), "{}", error.message());
    }
}
