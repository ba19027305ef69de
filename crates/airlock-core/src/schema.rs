//! The JSON Schemas of airlock's wire types, derived from the Rust types (`schemars`),
//! and the two rewrites every published schema goes through: enums as plain `enum`
//! arrays (code generators handle those; a `oneOf` of single `const`s breaks several of
//! them), and the strict shape function-calling APIs require of tool parameters.
//! The OpenAPI document, the tool schema and MCP's input and output schemas all come
//! from here, so they cannot drift from what the server parses and sends.

use schemars::generate::SchemaSettings;
use schemars::transform::{Transform, transform_subschemas};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};

use crate::observation::Observation;

/// A generator for JSON Schema 2020-12 with enums rewritten as plain `enum` arrays and no
/// `$schema` keyword; definitions go to `definitions_path` (`/$defs` for standalone
/// schemas, `/components/schemas` for OpenAPI).
pub fn generator(definitions_path: &str) -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = definitions_path.to_owned().into();
            s.meta_schema = None;
        })
        .with_transform(PlainEnums)
        .into_generator()
}

/// A standalone schema of `T`, definitions inlined: no `$ref` anywhere.
pub fn inline_schema_for<T: JsonSchema>() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .with_transform(PlainEnums)
        .into_generator();
    generator.root_schema_for::<T>().to_value()
}

/// The observation's schema, standalone and without references (MCP's `outputSchema`).
pub fn observation_schema() -> Value {
    inline_schema_for::<Observation>()
}

/// Rewrites `oneOf: [{"const": a, "description": …}, …]` (what schemars makes of a unit
/// enum with documented variants) into `{"type": "string", "enum": [a, …]}`. The
/// variants' descriptions are folded into the schema's description as a list.
#[derive(Debug, Clone, Copy)]
pub struct PlainEnums;

impl Transform for PlainEnums {
    fn transform(&mut self, schema: &mut Schema) {
        transform_subschemas(self, schema);
        let Some(object) = schema.as_object_mut() else {
            return;
        };
        let Some(Value::Array(variants)) = object.get("oneOf") else {
            return;
        };
        let mut values = Vec::with_capacity(variants.len());
        let mut notes = Vec::with_capacity(variants.len());
        for variant in variants {
            let Some(value) = variant.get("const") else {
                return;
            };
            if !value.is_string() {
                return;
            }
            if let (Some(name), Some(text)) = (
                value.as_str(),
                variant.get("description").and_then(Value::as_str),
            ) {
                notes.push(format!("`{name}`: {text}"));
            }
            values.push(value.clone());
        }
        object.remove("oneOf");
        object.insert("type".to_owned(), Value::from("string"));
        object.insert("enum".to_owned(), Value::Array(values));
        if !notes.is_empty() {
            let mut text = object
                .get("description")
                .and_then(Value::as_str)
                .map(|d| format!("{d} "))
                .unwrap_or_default();
            text.push_str(&notes.join("; "));
            text.push('.');
            object.insert("description".to_owned(), Value::from(text));
        }
    }
}

/// The strict form of a parameters schema (OpenAI's strict function calling, the Agents
/// SDK's `convert_schemas_to_strict`): references inlined, every object closed
/// (`additionalProperties: false`) with every property required, properties that were
/// optional made nullable, and the keywords strict mode refuses (`format`, `default`,
/// `$schema`, `title`) removed. `null` for an optional property means absent, which the
/// request types accept.
pub fn strict(schema: &Value) -> Value {
    inline_and_close(schema, Required::Every)
}

/// Like [`strict`], but properties the type has as optional stay out of `required` (they
/// are still nullable): the shape for MCP's `inputSchema`, where some clients (CrewAI's
/// adapter) turn every required property into one the model must fill.
pub fn closed(schema: &Value) -> Value {
    inline_and_close(schema, Required::AsDeclared)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Required {
    Every,
    AsDeclared,
}

fn inline_and_close(schema: &Value, required: Required) -> Value {
    let definitions = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = resolve(schema, &definitions, 0);
    if let Some(object) = out.as_object_mut() {
        object.remove("$defs");
    }
    close(&mut out, required);
    out
}

/// Deepest chain of references followed; the wire types nest three levels.
const MAX_REFERENCE_DEPTH: usize = 16;

fn resolve(value: &Value, definitions: &Map<String, Value>, depth: usize) -> Value {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(target)) = object.get("$ref")
                && let Some(name) = target.strip_prefix("#/$defs/")
                && let Some(definition) = definitions.get(name)
                && depth < MAX_REFERENCE_DEPTH
            {
                let mut inlined = resolve(definition, definitions, depth + 1);
                // Keywords beside the reference (a description) win over the target's.
                if let Some(target) = inlined.as_object_mut() {
                    for (key, v) in object {
                        if key != "$ref" {
                            target.insert(key.clone(), resolve(v, definitions, depth));
                        }
                    }
                }
                return inlined;
            }
            Value::Object(
                object
                    .iter()
                    .map(|(k, v)| (k.clone(), resolve(v, definitions, depth)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| resolve(v, definitions, depth))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn close(value: &mut Value, require: Required) {
    let Some(object) = value.as_object_mut() else {
        return;
    };
    for key in ["$schema", "format", "default", "title"] {
        object.remove(key);
    }
    let required: Vec<String> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            close(property, require);
            if !required.contains(name) {
                make_nullable(property);
            }
        }
        if require == Required::Every {
            let names: Vec<Value> = properties.keys().cloned().map(Value::from).collect();
            object.insert("required".to_owned(), Value::Array(names));
        }
        object.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    for key in ["items", "anyOf", "oneOf", "allOf"] {
        match object.get_mut(key) {
            Some(Value::Array(items)) => items.iter_mut().for_each(|item| close(item, require)),
            Some(item @ Value::Object(_)) => close(item, require),
            _ => {}
        }
    }
}

fn make_nullable(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    match object.get_mut("type") {
        Some(Value::String(name)) if name != "null" => {
            let name = name.clone();
            object.insert(
                "type".to_owned(),
                Value::Array(vec![Value::from(name), Value::from("null")]),
            );
        }
        Some(Value::Array(types)) if !types.iter().any(|t| t == "null") => {
            types.push(Value::from("null"));
        }
        _ => {}
    }
    if let Some(Value::Array(values)) = object.get_mut("enum")
        && !values.iter().any(Value::is_null)
    {
        values.push(Value::Null);
    }
}

/// Deserializes `null` as the type's default (an empty list, `false`): for the optional
/// fields of requests, where strict-mode models and some frameworks send `null` for
/// "not given".
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    let value: Option<T> = serde::Deserialize::deserialize(deserializer)?;
    Ok(value.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn walk(value: &Value, visit: &mut dyn FnMut(&Map<String, Value>)) {
        match value {
            Value::Object(object) => {
                visit(object);
                object.values().for_each(|v| walk(v, visit));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
            _ => {}
        }
    }

    #[test]
    fn the_observation_schema_has_plain_enums_and_no_references() {
        let schema = observation_schema();
        walk(&schema, &mut |object| {
            assert!(!object.contains_key("$ref"), "{object:?}");
            assert!(!object.contains_key("oneOf"), "{object:?}");
        });
        assert_eq!(
            schema["properties"]["outcome"]["enum"],
            json!([
                "exited",
                "timeout",
                "oom",
                "killed",
                "output_limit",
                "error"
            ])
        );
        assert_eq!(schema["properties"]["outcome"]["type"], "string");
        let kinds = &schema["properties"]["error"];
        let text = kinds.to_string();
        assert!(text.contains("\"unauthorized\""), "{text}");
    }

    #[test]
    fn strict_closes_objects_and_makes_optional_properties_nullable() {
        let loose = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": "number", "format": "double", "default": 1},
                "c": {"type": "array", "items": {"$ref": "#/$defs/File"}},
                "d": {"type": "string", "enum": ["x", "y"]}
            },
            "required": ["a"],
            "$defs": {"File": {"type": "object", "properties": {"p": {"type": "string"}, "q": {"type": "string"}}, "required": ["p"]}}
        });
        assert_eq!(
            strict(&loose),
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {"type": ["number", "null"]},
                    "c": {"type": ["array", "null"], "items": {
                        "type": "object",
                        "properties": {"p": {"type": "string"}, "q": {"type": ["string", "null"]}},
                        "required": ["p", "q"],
                        "additionalProperties": false
                    }},
                    "d": {"type": ["string", "null"], "enum": ["x", "y", null]}
                },
                "required": ["a", "b", "c", "d"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn closed_keeps_optional_properties_out_of_required() {
        let loose = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "c": {"type": "array", "items": {"$ref": "#/$defs/File"}}
            },
            "required": ["a"],
            "$defs": {"File": {"type": "object", "properties": {"p": {"type": "string"}, "q": {"type": "string"}}, "required": ["p"]}}
        });
        assert_eq!(
            closed(&loose),
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "c": {"type": ["array", "null"], "items": {
                        "type": "object",
                        "properties": {"p": {"type": "string"}, "q": {"type": ["string", "null"]}},
                        "required": ["p"],
                        "additionalProperties": false
                    }}
                },
                "required": ["a"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn null_means_default() {
        #[derive(serde::Deserialize)]
        struct Request {
            #[serde(default, deserialize_with = "null_as_default")]
            files: Vec<String>,
        }
        let r: Request = serde_json::from_value(json!({"files": null})).unwrap();
        assert!(r.files.is_empty());
        let r: Request = serde_json::from_value(json!({})).unwrap();
        assert!(r.files.is_empty());
        let r: Request = serde_json::from_value(json!({"files": ["a"]})).unwrap();
        assert_eq!(r.files, vec!["a"]);
    }
}
