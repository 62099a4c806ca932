//! Closure and bounds rules for a tool's `inputSchema`: the registry refuses any schema that
//! would let an agent send a value nobody enumerated or bounded.
//!
//! # The rules
//!
//! The root must be `type: object`. Then every subschema in a *value position* is checked:
//! the root, each entry of `properties`, `items`, each entry of `prefixItems`, each entry of
//! `$defs` / `definitions`, and — when a schema has no `type`, `enum`, `const` or `$ref` of
//! its own, so that its branches give it its shape — each branch of `allOf` / `anyOf` /
//! `oneOf`. (Branches of a schema that has its own shape can only narrow it, e.g.
//! `oneOf: [{required: [a]}, {required: [b]}]`, and are not walked.) In each one:
//!
//! 1. **Shaped**: it is an object with `type`, `enum`, `const`, `$ref`, `allOf`, `anyOf` or
//!    `oneOf` (a schema constraining nothing, including the boolean schema `true`, is refused;
//!    `false` is allowed: it accepts nothing).
//! 2. **Closed objects**: if it may be an object (`type` includes `object`, or it has no
//!    `type` but has `properties`, `required` or `additionalProperties`), it has
//!    `additionalProperties: false` (literally `false`; a schema there is refused), and every
//!    name in `required` is one of its `properties`.
//! 3. **Bounded numbers**: if `type` includes `number` or `integer`, it has a lower bound
//!    (`minimum` or `exclusiveMinimum`) and an upper bound (`maximum` or `exclusiveMaximum`).
//! 4. **Bounded strings**: if `type` includes `string`, it has at least one of `pattern`,
//!    `format` or `maxLength`. A `pattern` anywhere must be anchored (start with `^`, end with
//!    an unescaped `$`), because JSON Schema patterns match anywhere in the string. A `format`
//!    must be one the validator checks: `date`, `date-time`, `time`, `duration`, `email`,
//!    `hostname`, `ipv4`, `ipv6`, `uri`, `uri-reference`, `uuid`, `json-pointer`.
//! 5. **Bounded arrays**: if `type` includes `array`, it has `items` (a schema, or `false`
//!    with `prefixItems`) and `maxItems`.
//! 6. Rules 3-5 do not apply when the schema has `enum` or `const`: the set is then finite.
//!    Bounds must sit on the same schema object as the `type` they bound.
//! 7. **References** are local and name a schema the walk checks: `$ref` is `#`, or
//!    `#/$defs/NAME` / `#/definitions/NAME` with one plain NAME (letters, digits, `_`, `-`,
//!    `.`). A longer pointer (`#/$defs/a/not`, `#/$defs/a/x-open`, `#/$defs/a/anyOf/0`) could
//!    reach JSON the walk never looks at; `$id` only at the root.
//! 8. **Keywords** are draft 2020-12 keywords or `x-` extensions; anything else (a typo such
//!    as `requried` would silently make every field optional) is refused. The keywords that
//!    widen what is accepted or defeat these checks are refused outright: `patternProperties`,
//!    `additionalItems`, `$dynamicRef`, `$dynamicAnchor`, `$recursiveRef`,
//!    `$recursiveAnchor`, and `unevaluatedProperties` / `unevaluatedItems` other than `false`.
//!    The narrowing keywords (`not`, `if` / `then` / `else`, `dependentSchemas`, `contains`,
//!    `propertyNames`) are allowed and not walked: whatever they hold can only reject more.
//!
//! # The one exemption
//!
//! A subschema carrying `x-countersign-validated-per-step: true` ([`PER_STEP_MARKER`])
//! is exempt from rule 2. It is honoured only when all of these hold, and refused otherwise:
//! the marker's value is `true`; the subschema is exactly `type: object` plus optional
//! `title`, `description`, `minProperties`, `maxProperties`; it is a property of an object
//! schema that also has a property `tool` of `type: string`, and both `tool` and the exempt
//! property are `required`. That is the shape of a plan step (`{tool, arguments}`): the
//! submission handler validates each step's `arguments` against the input schema of the
//! step's `tool` before storing the plan, and the step is validated again when it runs.
//! The exempt pointers are listed in [`super::Tool::per_step_paths`].

use serde_json::{Map, Value};

/// The schema keyword marking the one sanctioned open object: the `arguments` of a step in a
/// plan, validated per step against the schema of the step's tool when the plan is submitted.
/// This module's doc says exactly where it is honoured.
pub const PER_STEP_MARKER: &str = "x-countersign-validated-per-step";

/// A closure or bounds problem at a JSON pointer inside the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaIssue {
    /// JSON pointer inside the checked schema (`""` is its root).
    pub pointer: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// What checking one input schema found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClosureReport {
    /// Every problem, in document order.
    pub issues: Vec<SchemaIssue>,
    /// Pointers of honoured per-step exemptions.
    pub per_step_paths: Vec<String>,
}

/// Formats the validator checks and the registry accepts in `format`.
pub const CHECKED_FORMATS: &[&str] = &[
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uuid",
    "json-pointer",
];

const KNOWN_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$defs",
    "$anchor",
    "$comment",
    "$vocabulary",
    "definitions",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "items",
    "prefixItems",
    "contains",
    "maxContains",
    "minContains",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "properties",
    "additionalProperties",
    "propertyNames",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "unevaluatedItems",
    "unevaluatedProperties",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "examples",
];

const REFUSED_KEYWORDS: &[(&str, &str)] = &[
    (
        "patternProperties",
        "admits property names by pattern; list every property under `properties`",
    ),
    (
        "additionalItems",
        "is not draft 2020-12; use `items` with `prefixItems`",
    ),
    (
        "$dynamicRef",
        "cannot be checked for closure; use a local `$ref`",
    ),
    (
        "$dynamicAnchor",
        "cannot be checked for closure; use `$defs`",
    ),
    ("$recursiveRef", "is not draft 2020-12; use a local `$ref`"),
    ("$recursiveAnchor", "is not draft 2020-12; use `$defs`"),
];

/// Deeper schemas than this are refused (they are mistakes, and the walk is recursive).
const MAX_SCHEMA_DEPTH: usize = 48;

/// Checks a tool's input schema against every rule above.
pub fn check_input_schema(schema: &Value) -> ClosureReport {
    let mut report = ClosureReport::default();
    match schema {
        Value::Object(obj) => {
            if obj.get("type") != Some(&Value::String("object".into())) {
                report.issues.push(issue(
                    "",
                    "the root of an input schema must be `type: object`",
                ));
            }
        }
        _ => {
            report.issues.push(issue(
                "",
                "an input schema must be an object schema with `type: object`",
            ));
            return report;
        }
    }
    let mut walker = Walker {
        report: &mut report,
    };
    walker.value_schema(schema, "", 0, None);
    report
}

fn issue(pointer: &str, message: impl Into<String>) -> SchemaIssue {
    SchemaIssue {
        pointer: pointer.to_string(),
        message: message.into(),
    }
}

/// Escapes one JSON pointer segment (RFC 6901).
pub(crate) fn escape_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn child(ptr: &str, segment: &str) -> String {
    format!("{ptr}/{}", escape_segment(segment))
}

/// The object schema a property sits in, for the exemption rule.
struct Parent<'a> {
    properties: &'a Map<String, Value>,
    required: Vec<&'a str>,
    key: &'a str,
}

struct Walker<'r> {
    report: &'r mut ClosureReport,
}

impl Walker<'_> {
    fn push(&mut self, ptr: &str, message: impl Into<String>) {
        self.report.issues.push(issue(ptr, message));
    }

    fn value_schema(
        &mut self,
        schema: &Value,
        ptr: &str,
        depth: usize,
        parent: Option<Parent<'_>>,
    ) {
        if depth > MAX_SCHEMA_DEPTH {
            self.push(
                ptr,
                format!("schema nested deeper than {MAX_SCHEMA_DEPTH} levels"),
            );
            return;
        }
        let obj = match schema {
            Value::Bool(false) => return,
            Value::Bool(true) => {
                self.push(
                    ptr,
                    "the schema `true` accepts any value; give it a `type` and bounds",
                );
                return;
            }
            Value::Object(obj) => obj,
            _ => {
                self.push(ptr, "a schema must be an object (or `false`)");
                return;
            }
        };

        if obj.contains_key(PER_STEP_MARKER) {
            self.per_step(obj, ptr, parent);
            return;
        }

        self.keywords(obj, ptr);

        let types = self.types(obj, ptr);
        let finite = obj.contains_key("enum") || obj.contains_key("const");
        let shaped = !types.is_empty()
            || finite
            || ["$ref", "allOf", "anyOf", "oneOf"]
                .iter()
                .any(|k| obj.contains_key(*k));
        if !shaped {
            self.push(
                ptr,
                "the schema accepts any value: give it a `type` (or `enum`, `const`, `$ref`)",
            );
        }

        let objectish = if types.is_empty() {
            ["properties", "required", "additionalProperties"]
                .iter()
                .any(|k| obj.contains_key(*k))
        } else {
            types.contains(&"object")
        };
        if objectish && !finite {
            self.closed_object(obj, ptr);
        }
        if !finite {
            if types.contains(&"number") || types.contains(&"integer") {
                self.bounded_number(obj, ptr);
            }
            if types.contains(&"string")
                && !["pattern", "format", "maxLength"]
                    .iter()
                    .any(|k| obj.contains_key(*k))
            {
                self.push(
                    ptr,
                    "string is unbounded: give it `enum`, `const`, `pattern`, `format` or `maxLength`",
                );
            }
            if types.contains(&"array") {
                for (k, what) in [
                    ("items", "`items` (a schema for every element)"),
                    ("maxItems", "`maxItems`"),
                ] {
                    if !obj.contains_key(k) {
                        self.push(ptr, format!("array is unbounded: give it {what}"));
                    }
                }
            }
        }
        if let Some(p) = obj.get("pattern") {
            self.anchored(p, &child(ptr, "pattern"));
        }
        if let Some(f) = obj.get("format") {
            let known = f.as_str().is_some_and(|f| CHECKED_FORMATS.contains(&f));
            if !known {
                self.push(
                    &child(ptr, "format"),
                    format!(
                        "format {f} is not one the validator checks ({})",
                        CHECKED_FORMATS.join(", ")
                    ),
                );
            }
        }
        if let Some(r) = obj.get("$ref") {
            // Exactly the root or one named definition, which the walk checks: a longer
            // pointer could reach a part it never looks at (`#/$defs/a/not`, an `x-` key, a
            // branch), and escapes or percent-encoding could disguise one.
            let local = r.as_str().is_some_and(|r| {
                r == "#"
                    || ["#/$defs/", "#/definitions/"].iter().any(|p| {
                        r.strip_prefix(p).is_some_and(|name| {
                            !name.is_empty()
                                && name
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                        })
                    })
            });
            if !local {
                self.push(
                    &child(ptr, "$ref"),
                    "`$ref` must be local and name the root or one definition: `#`, \
                     `#/$defs/NAME` or `#/definitions/NAME` (NAME of letters, digits, `_`, `-`, \
                     `.`)",
                );
            }
        }
        if depth > 0 && obj.contains_key("$id") {
            self.push(&child(ptr, "$id"), "`$id` is only allowed at the root");
        }

        self.children(obj, ptr, depth);
    }

    fn keywords(&mut self, obj: &Map<String, Value>, ptr: &str) {
        for (key, value) in obj {
            if let Some((_, why)) = REFUSED_KEYWORDS.iter().find(|(k, _)| k == key) {
                self.push(&child(ptr, key), format!("`{key}` is refused: it {why}"));
            } else if key == "unevaluatedProperties" || key == "unevaluatedItems" {
                if value != &Value::Bool(false) {
                    self.push(&child(ptr, key), format!("`{key}` may only be `false`"));
                }
            } else if !KNOWN_KEYWORDS.contains(&key.as_str()) && !key.starts_with("x-") {
                self.push(
                    &child(ptr, key),
                    format!("unknown keyword `{key}` (a typo would silently loosen the schema)"),
                );
            }
        }
    }

    fn types<'a>(&mut self, obj: &'a Map<String, Value>, ptr: &str) -> Vec<&'a str> {
        const TYPES: &[&str] = &[
            "object", "array", "string", "number", "integer", "boolean", "null",
        ];
        let listed: Vec<&Value> = match obj.get("type") {
            None => return Vec::new(),
            Some(Value::Array(items)) => items.iter().collect(),
            Some(other) => vec![other],
        };
        let mut out = Vec::new();
        for t in listed {
            match t.as_str() {
                Some(s) if TYPES.contains(&s) => out.push(s),
                _ => self.push(&child(ptr, "type"), format!("unknown type {t}")),
            }
        }
        out
    }

    fn closed_object(&mut self, obj: &Map<String, Value>, ptr: &str) {
        match obj.get("additionalProperties") {
            Some(Value::Bool(false)) => {}
            None => self.push(
                ptr,
                "object schema is not closed: add `additionalProperties: false`",
            ),
            Some(_) => self.push(
                &child(ptr, "additionalProperties"),
                "object schema is not closed: `additionalProperties` must be `false`",
            ),
        }
        let properties = obj.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = obj.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !properties.is_some_and(|p| p.contains_key(name)) {
                    self.push(
                        &child(ptr, "required"),
                        format!("`{name}` is required but is not one of the `properties`"),
                    );
                }
            }
        }
    }

    fn bounded_number(&mut self, obj: &Map<String, Value>, ptr: &str) {
        let lower = obj.contains_key("minimum") || obj.contains_key("exclusiveMinimum");
        let upper = obj.contains_key("maximum") || obj.contains_key("exclusiveMaximum");
        if !lower {
            self.push(
                ptr,
                "number is unbounded below: give it `minimum` or `exclusiveMinimum`",
            );
        }
        if !upper {
            self.push(
                ptr,
                "number is unbounded above: give it `maximum` or `exclusiveMaximum`",
            );
        }
    }

    fn anchored(&mut self, pattern: &Value, ptr: &str) {
        let ok = pattern.as_str().is_some_and(|p| {
            let trailing_backslashes = p
                .strip_suffix('$')
                .map(|rest| rest.chars().rev().take_while(|c| *c == '\\').count());
            p.starts_with('^') && trailing_backslashes.is_some_and(|n| n % 2 == 0)
        });
        if !ok {
            self.push(
                ptr,
                "pattern must be anchored: start with `^` and end with `$` (JSON Schema patterns match anywhere)",
            );
        }
    }

    fn per_step(&mut self, obj: &Map<String, Value>, ptr: &str, parent: Option<Parent<'_>>) {
        let marker_ptr = child(ptr, PER_STEP_MARKER);
        let mut ok = true;
        if obj.get(PER_STEP_MARKER) != Some(&Value::Bool(true)) {
            self.push(&marker_ptr, "the per-step marker must be `true`");
            ok = false;
        }
        if obj.get("type") != Some(&Value::String("object".into())) {
            self.push(ptr, "a per-step exemption must be `type: object`");
            ok = false;
        }
        const ALLOWED: &[&str] = &[
            "type",
            "title",
            "description",
            "minProperties",
            "maxProperties",
            PER_STEP_MARKER,
        ];
        for key in obj.keys().filter(|k| !ALLOWED.contains(&k.as_str())) {
            self.push(
                &child(ptr, key),
                format!("`{key}` is not allowed beside the per-step marker"),
            );
            ok = false;
        }
        let placed = parent.is_some_and(|p| {
            let tool_is_string = p
                .properties
                .get("tool")
                .and_then(|t| t.get("type"))
                .is_some_and(|t| t == "string");
            tool_is_string
                && p.key != "tool"
                && p.required.contains(&"tool")
                && p.required.contains(&p.key)
        });
        if !placed {
            self.push(
                &marker_ptr,
                "the per-step marker is only honoured on a required property beside a required \
                 string property `tool` (a plan step's arguments)",
            );
            ok = false;
        }
        if ok {
            self.report.per_step_paths.push(ptr.to_string());
        }
    }

    fn children(&mut self, obj: &Map<String, Value>, ptr: &str, depth: usize) {
        let next = depth + 1;
        if let Some(Value::Object(props)) = obj.get("properties") {
            let required: Vec<&str> = match obj.get("required") {
                Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let base = child(ptr, "properties");
            for (key, sub) in props {
                let parent = Parent {
                    properties: props,
                    required: required.clone(),
                    key,
                };
                self.value_schema(sub, &child(&base, key), next, Some(parent));
            }
        }
        for map_key in ["$defs", "definitions"] {
            if let Some(Value::Object(defs)) = obj.get(map_key) {
                let base = child(ptr, map_key);
                for (key, sub) in defs {
                    self.value_schema(sub, &child(&base, key), next, None);
                }
            }
        }
        if let Some(items) = obj.get("items") {
            self.value_schema(items, &child(ptr, "items"), next, None);
        }
        // Composition branches give the shape only when the schema has none of its own.
        let own_shape = ["type", "enum", "const", "$ref"]
            .iter()
            .any(|k| obj.contains_key(*k));
        for list_key in ["prefixItems", "allOf", "anyOf", "oneOf"] {
            if own_shape && list_key != "prefixItems" {
                continue;
            }
            if let Some(Value::Array(list)) = obj.get(list_key) {
                let base = child(ptr, list_key);
                for (i, sub) in list.iter().enumerate() {
                    self.value_schema(sub, &child(&base, &i.to_string()), next, None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pointers(schema: Value) -> Vec<String> {
        check_input_schema(&schema)
            .issues
            .into_iter()
            .map(|i| i.pointer)
            .collect()
    }

    #[test]
    fn the_seed_schema_is_closed_and_bounded() {
        let schema = json!({
            "type": "object", "additionalProperties": false,
            "required": ["invoice_id", "amount", "currency", "value_date", "reason"],
            "properties": {
                "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{8}$"},
                "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 50000},
                "currency": {"type": "string", "enum": ["EUR"]},
                "value_date": {"type": "string", "format": "date"},
                "reason": {"type": "string", "minLength": 20, "maxLength": 400}
            }
        });
        assert_eq!(pointers(schema), Vec::<String>::new());
    }

    #[test]
    fn nested_open_objects_are_found() {
        let schema = json!({
            "type": "object", "additionalProperties": false,
            "properties": {
                "a": {"type": "object", "properties": {}},
                "b": {"type": "array", "maxItems": 3, "items": {"type": "object"}},
            },
            "$defs": {"c": {"type": "object", "additionalProperties": true}}
        });
        assert_eq!(
            pointers(schema),
            vec![
                "/properties/a".to_string(),
                "/properties/b/items".into(),
                "/$defs/c/additionalProperties".into(),
            ]
        );
    }

    #[test]
    fn anchoring_counts_escaped_dollars() {
        let mut w = ClosureReport::default();
        let mut walker = Walker { report: &mut w };
        walker.anchored(&json!("^a$"), "");
        walker.anchored(&json!("^a\\\\$"), ""); // `\\` then `$`: anchored
        assert!(w.issues.is_empty());
        let mut walker = Walker { report: &mut w };
        walker.anchored(&json!("^a\\$"), ""); // escaped `$`: not anchored
        walker.anchored(&json!("a$"), "");
        assert_eq!(w.issues.len(), 2);
    }
}
