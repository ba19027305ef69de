//! A small YAML writer for manifests (block style; every string double-quoted as JSON,
//! which YAML reads back exactly), so the golden manifests in `deploy/` and
//! `airlock kube install --print` need no YAML library.

use serde_json::Value;

/// `values` as one YAML stream, each document after `---`, with `apiVersion`, `kind` and
/// `metadata` first in each.
pub fn to_yaml_stream(values: &[Value]) -> String {
    let mut out = String::new();
    for value in values {
        out.push_str("---\n");
        write_value(&mut out, &ordered(value), 0, false);
    }
    out
}

fn ordered(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut sorted = serde_json::Map::new();
            for key in ["apiVersion", "kind", "metadata"] {
                if let Some(v) = map.get(key) {
                    sorted.insert(key.to_owned(), ordered(v));
                }
            }
            let mut rest: Vec<(&String, &Value)> = map
                .iter()
                .filter(|(k, _)| !["apiVersion", "kind", "metadata"].contains(&k.as_str()))
                .collect();
            rest.sort_by(|a, b| a.0.cmp(b.0));
            for (k, v) in rest {
                sorted.insert(k.clone(), ordered(v));
            }
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(ordered).collect()),
        other => other.clone(),
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()),
        Value::Object(m) if m.is_empty() => "{}".to_owned(),
        Value::Array(a) if a.is_empty() => "[]".to_owned(),
        other => other.to_string(),
    }
}

fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
        && !k.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.');
    if plain {
        k.to_owned()
    } else {
        serde_json::to_string(k).unwrap_or_default()
    }
}

// `inline`: the first line goes after an already written "- ".
fn write_value(out: &mut String, value: &Value, indent: usize, inline: bool) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (i, (k, v)) in map.iter().enumerate() {
                if !(inline && i == 0) {
                    out.push_str(&pad);
                }
                out.push_str(&key(k));
                out.push(':');
                if is_block(v) {
                    out.push('\n');
                    let child = if v.is_array() { indent } else { indent + 2 };
                    write_value(out, v, child, false);
                } else {
                    out.push(' ');
                    out.push_str(&scalar(v));
                    out.push('\n');
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                if !(inline && i == 0) {
                    out.push_str(&pad);
                }
                out.push_str("- ");
                if is_block(item) {
                    write_value(out, item, indent + 2, true);
                } else {
                    out.push_str(&scalar(item));
                    out.push('\n');
                }
            }
        }
        other => {
            if !inline {
                out.push_str(&pad);
            }
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn block_style_with_quoted_strings() {
        let v = serde_json::json!({"kind": "X", "apiVersion": "v1", "metadata": {"name": "a", "labels": {"k8s.io/x": "y"}},
            "spec": {"list": [{"a": 1, "b": ["x", "y"]}, "s"], "empty": {}, "none": [], "t": true, "odd key": "q\"\n"}});
        let text = to_yaml_stream(&[v]);
        assert_eq!(
            text,
            "---\napiVersion: \"v1\"\nkind: \"X\"\nmetadata:\n  labels:\n    k8s.io/x: \"y\"\n  name: \"a\"\nspec:\n  empty: {}\n  list:\n  - a: 1\n    b:\n    - \"x\"\n    - \"y\"\n  - \"s\"\n  none: []\n  \"odd key\": \"q\\\"\\n\"\n  t: true\n"
        );
    }
}
