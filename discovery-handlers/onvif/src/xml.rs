//! Reading what the handler needs out of SOAP answers: the text of elements found by their
//! local names (namespace prefixes differ between cameras), with quick-xml.

use quick_xml::events::Event;

/// The texts of every element whose path of local names ends with `suffix` (`"*"` matches
/// any one name), in document order. Malformed XML yields what was read before the error.
pub fn texts(xml: &str, suffix: &[&str]) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    loop {
        match reader.read_event() {
            Ok(Event::Start(start)) => {
                path.push(local(start.name().as_ref()));
                current = ends_with(&path, suffix).then(String::new);
            }
            Ok(Event::Empty(_)) => {}
            Ok(Event::Text(text)) => {
                if let Some(value) = current.as_mut()
                    && let Ok(decoded) = text.decode()
                {
                    value.push_str(&decoded);
                }
            }
            Ok(Event::GeneralRef(reference)) => {
                if let Some(value) = current.as_mut() {
                    match reference.as_ref() {
                        b"amp" => value.push('&'),
                        b"lt" => value.push('<'),
                        b"gt" => value.push('>'),
                        b"quot" => value.push('"'),
                        b"apos" => value.push('\''),
                        _ => {}
                    }
                }
            }
            Ok(Event::End(_)) => {
                if let Some(value) = current.take() {
                    found.push(value.trim().to_string());
                }
                path.pop();
            }
            Ok(Event::Eof) | Err(_) => return found,
            Ok(_) => {}
        }
    }
}

/// The first value of an attribute `name` (local name) on elements whose path ends with
/// `suffix`.
pub fn attributes(xml: &str, suffix: &[&str], name: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut found = Vec::new();
    loop {
        let (start, empty) = match reader.read_event() {
            Ok(Event::Start(start)) => (start, false),
            Ok(Event::Empty(start)) => (start, true),
            Ok(Event::End(_)) => {
                path.pop();
                continue;
            }
            Ok(Event::Eof) | Err(_) => return found,
            Ok(_) => continue,
        };
        path.push(local(start.name().as_ref()));
        if ends_with(&path, suffix)
            && let Some(value) = start
                .attributes()
                .flatten()
                .find(|a| local(a.key.as_ref()) == name)
                .and_then(|a| a.unescape_value().ok())
        {
            found.push(value.into_owned());
        }
        if empty {
            path.pop();
        }
    }
}

fn local(qualified: &[u8]) -> String {
    let name = String::from_utf8_lossy(qualified);
    match name.rsplit_once(':') {
        Some((_, local)) => local.to_string(),
        None => name.into_owned(),
    }
}

fn ends_with(path: &[String], suffix: &[&str]) -> bool {
    path.len() >= suffix.len()
        && path[path.len() - suffix.len()..]
            .iter()
            .zip(suffix)
            .all(|(name, want)| *want == "*" || name == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_by_local_name_whatever_the_prefixes() {
        let xml = r#"<s:Envelope xmlns:s="x"><s:Body><a:R><b:IPv4><b:Config><b:Manual><b:Address>10.0.0.1</b:Address></b:Manual></b:Config></b:IPv4><b:IPv6><b:Config><b:Manual><b:Address>fe80::1</b:Address></b:Manual></b:Config></b:IPv6><Uri>rtsp://a/b?x=1&amp;y=2</Uri></a:R></s:Body></s:Envelope>"#;
        assert_eq!(
            texts(xml, &["IPv4", "Config", "*", "Address"]),
            ["10.0.0.1"]
        );
        assert_eq!(texts(xml, &["Address"]), ["10.0.0.1", "fe80::1"]);
        assert_eq!(texts(xml, &["Uri"]), ["rtsp://a/b?x=1&y=2"]);
        assert!(texts("<a><b>unclosed", &["b"]).is_empty());
        let xml = r#"<r><t:Profiles token="main"/><t:Profiles token="sub"><n/></t:Profiles></r>"#;
        assert_eq!(attributes(xml, &["Profiles"], "token"), ["main", "sub"]);
    }
}
