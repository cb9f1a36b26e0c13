//! Keys given twice in one object: most JSON readers keep the last value silently, so a
//! table edited by hand can say one thing and be read as another.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{Rule, Violation};

/// A warning for each key given more than once in an object of the JSON text `bytes`, at the
/// key's path (`$.server_list[0].device[2].device_ip`). Text that is not JSON gives none: its
/// parse error is reported where it is read.
pub fn duplicate_keys(bytes: &[u8]) -> Vec<Violation> {
    let found = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // Only the warnings matter: a parse error is the reader's to report.
    let _ = Walk {
        path: "$".into(),
        found: &found,
    }
    .deserialize(&mut de);
    found.into_inner()
}

/// The path of member `key` of the object at `path`: `$.a.b` for a plain name, else the
/// bracket form with the key as a JSON string (`$.a["x.y"]`, `$.a["\u001b[31m"]`), so that a
/// key can neither make two paths look alike nor put control characters on the terminal.
fn member(path: &str, key: &str) -> String {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        return format!("{path}.{key}");
    }
    // JSON's escapes, and `\uXXXX` for what JSON leaves as it is but a terminal acts on: C1
    // controls (U+0080-U+009F, an 8-bit CSI among them) and the bidirectional overrides.
    let mut quoted = String::with_capacity(key.len() + 2);
    for c in serde_json::to_string(key)
        .unwrap_or_else(|_| format!("{key:?}"))
        .chars()
    {
        match c {
            '\u{80}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                quoted.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            _ => quoted.push(c),
        }
    }
    format!("{path}[{quoted}]")
}

/// Visits a value at `path`, noting the keys its objects repeat.
struct Walk<'a> {
    path: String,
    found: &'a RefCell<Vec<Violation>>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut order = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = member(&self.path, &key);
            map.next_value_seed(Walk {
                path,
                found: self.found,
            })?;
            let count = seen.entry(key.clone()).or_insert(0);
            *count += 1;
            if *count == 2 {
                order.push(key);
            }
        }
        for key in order {
            let times = seen[&key];
            self.found.borrow_mut().push(Violation::warning(
                member(&self.path, &key),
                Rule::DuplicateKey,
                format!(
                    "{key:?} is given {times} times in one object; only the last is read (by \
                     atlasboost, and by most JSON readers), the others are ignored"
                ),
            ));
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Walk {
                path: format!("{}[{i}]", self.path),
                found: self.found,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    // Scalars hold no keys.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_repeated_key_is_named_at_its_path_once() {
        let text = br#"{"version": "1.0", "server_list": [{"device": [
            {"device_ip": "x", "device_ip": "192.168.0.1", "device_id": "0",
             "device_ip": "192.168.0.2"}]}], "status": "failed", "status": "completed"}"#;
        let found = duplicate_keys(text);
        let got: Vec<(&str, &str)> = found
            .iter()
            .map(|v| (v.path.as_str(), v.message.as_str()))
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, "$.server_list[0].device[0].device_ip");
        assert!(
            got[0].1.starts_with("\"device_ip\" is given 3 times"),
            "{got:?}"
        );
        assert_eq!(got[1].0, "$.status");
        assert!(found.iter().all(|v| !v.is_error()));
        assert!(duplicate_keys(br#"{"a": [1, {"b": 2}], "c": null}"#).is_empty());
        assert!(duplicate_keys(b"{not json").is_empty());
    }

    #[test]
    fn a_strange_key_is_quoted_in_its_path() {
        let text = br#"{"a.b": {"\u001b[31mRED\nfake: valid": 1, "\u001b[31mRED\nfake: valid": 2},
            "a": {"b": 1, "b": 2}}"#;
        let paths: Vec<String> = duplicate_keys(text).into_iter().map(|v| v.path).collect();
        assert_eq!(
            paths,
            [r#"$["a.b"]["\u001b[31mRED\nfake: valid"]"#, "$.a.b"],
            "{paths:?}"
        );
        assert!(paths.iter().all(|p| !p.chars().any(char::is_control)));
        // What JSON itself leaves as it is: an 8-bit CSI, a right-to-left override.
        let text = "{\"a\u{9b}b\": 1, \"a\u{9b}b\": 2, \"x\u{202e}y\": 1, \"x\u{202e}y\": 2}";
        let paths: Vec<String> = duplicate_keys(text.as_bytes())
            .into_iter()
            .map(|v| v.path)
            .collect();
        assert_eq!(paths, [r#"$["a\u009bb"]"#, r#"$["x\u202ey"]"#], "{paths:?}");
    }
}
