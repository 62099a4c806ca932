//! Argument validation: every tool call's arguments against the tool's closed input schema,
//! before any handler runs (pipeline step 3).
//!
//! Schemas are JSON Schema draft 2020-12 with `format` checked (`date`, `email`, …; an
//! unknown format is a compile error, never silently ignored). `pattern` uses the linear-time
//! `regex` engine, so no agent-supplied string can make a pattern backtrack for long. No
//! remote `$ref` is ever fetched (the crate's resolvers are not built in).
//!
//! # Invariants (fails closed)
//!
//! * Validators are compiled once per registry load ([`Validators::compile`]); a schema that
//!   does not compile refuses the whole registry.
//! * [`Validators::validate`] never panics, whatever the input: before the validator runs,
//!   an iterative walk refuses arguments nested deeper than [`MAX_DEPTH`], with more than
//!   [`MAX_NODES`] values, or with more than [`MAX_TEXT_BYTES`] bytes of strings and keys.
//! * An unknown tool is an error, not a pass.
//! * Error messages never echo argument values (they are masked), and are cut to
//!   [`MAX_MESSAGE_CHARS`]; at most [`MAX_ERRORS`] errors are reported.

use std::collections::BTreeMap;

use jsonschema::{PatternOptions, Validator};
use serde::Serialize;
use serde_json::Value;

use crate::registry::ToolName;
use crate::registry::closure::escape_segment;

/// Deepest nesting of arguments accepted (the root object is depth 1).
pub const MAX_DEPTH: usize = 32;
/// Most JSON values (objects, arrays and scalars together) accepted in one call's arguments.
pub const MAX_NODES: usize = 20_000;
/// Most bytes of strings and object keys accepted in one call's arguments.
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// Most errors reported for one call.
pub const MAX_ERRORS: usize = 32;
/// Longest error message reported.
pub const MAX_MESSAGE_CHARS: usize = 300;

/// One reason arguments were refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaError {
    /// JSON pointer to the offending value inside the arguments (`""` is the whole object).
    pub path: String,
    /// What is wrong, without the value itself.
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)
    }
}

/// The compiled validators of one registry load, keyed by tool.
#[derive(Default)]
pub struct Validators {
    input: BTreeMap<ToolName, Validator>,
    output: BTreeMap<ToolName, Validator>,
}

impl std::fmt::Debug for Validators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validators")
            .field("tools", &self.input.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Compiles one schema the way every Countersign schema is compiled: draft 2020-12, formats
/// checked, unknown formats refused, linear-time patterns, meta-schema checked.
/// On failure, the error's `path` points inside the schema.
pub fn compile(schema: &Value) -> Result<Validator, SchemaError> {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .should_ignore_unknown_formats(false)
        .with_pattern_options(PatternOptions::regex())
        .build(schema)
        .map_err(|e| SchemaError {
            path: e.instance_path().as_str().to_string(),
            message: cut(&e.to_string()),
        })
}

impl Validators {
    /// Compiles the input (and, when declared, output) schema of every tool. On failure,
    /// returns every tool schema that did not compile, its path prefixed with
    /// `/inputSchema` or `/outputSchema` (a pointer inside the tool definition).
    pub fn compile<'a>(
        schemas: impl IntoIterator<Item = (&'a ToolName, &'a Value, Option<&'a Value>)>,
    ) -> Result<Self, Vec<(ToolName, SchemaError)>> {
        let mut out = Self::default();
        let mut failures = Vec::new();
        for (tool, input, output) in schemas {
            match compile(input) {
                Ok(v) => {
                    out.input.insert(tool.clone(), v);
                }
                Err(e) => failures.push((tool.clone(), within("/inputSchema", e))),
            }
            if let Some(output) = output {
                match compile(output) {
                    Ok(v) => {
                        out.output.insert(tool.clone(), v);
                    }
                    Err(e) => failures.push((tool.clone(), within("/outputSchema", e))),
                }
            }
        }
        if failures.is_empty() {
            Ok(out)
        } else {
            Err(failures)
        }
    }

    /// Validates the arguments of a call of `tool`. `Err` lists every problem found (at most
    /// [`MAX_ERRORS`]), each with the JSON pointer of the offending value.
    pub fn validate(&self, tool: &ToolName, arguments: &Value) -> Result<(), Vec<SchemaError>> {
        let Some(validator) = self.input.get(tool) else {
            return Err(vec![SchemaError {
                path: String::new(),
                message: format!("no input schema for tool {tool}"),
            }]);
        };
        run(validator, arguments)
    }

    /// Validates a result of `tool` against its declared output schema; `Ok` when none is
    /// declared.
    pub fn validate_output(&self, tool: &ToolName, result: &Value) -> Result<(), Vec<SchemaError>> {
        match self.output.get(tool) {
            Some(validator) => run(validator, result),
            None => Ok(()),
        }
    }
}

fn within(prefix: &str, e: SchemaError) -> SchemaError {
    SchemaError {
        path: format!("{prefix}{}", e.path),
        message: e.message,
    }
}

fn run(validator: &Validator, instance: &Value) -> Result<(), Vec<SchemaError>> {
    check_size(instance)?;
    // The common case, without building errors; the errors only when there are some.
    if validator.is_valid(instance) {
        return Ok(());
    }
    let errors: Vec<SchemaError> = validator
        .iter_errors(instance)
        .take(MAX_ERRORS)
        .map(|e| SchemaError {
            path: e.instance_path().as_str().to_string(),
            message: cut(&e.masked_with("the value").to_string()),
        })
        .collect();
    if errors.is_empty() {
        // Invalid, yet no error to show: refuse all the same.
        Err(vec![SchemaError {
            path: String::new(),
            message: "the value does not fit the schema".into(),
        }])
    } else {
        Err(errors)
    }
}

fn cut(s: &str) -> String {
    if s.chars().count() <= MAX_MESSAGE_CHARS {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(MAX_MESSAGE_CHARS).collect();
        out.push('…');
        out
    }
}

/// Refuses oversized or over-deep arguments without recursion: a walk that only counts, and
/// only when it finds a limit passed, the walk that says where ([`size_refusal`]).
fn check_size(root: &Value) -> Result<(), Vec<SchemaError>> {
    if within_size(root) {
        return Ok(());
    }
    match size_refusal(root) {
        Err(refused) => Err(refused),
        // The two walks disagree: refuse all the same.
        Ok(()) => Err(vec![SchemaError {
            path: String::new(),
            message: "arguments are too large".into(),
        }]),
    }
}

/// Whether `root` is within [`MAX_DEPTH`], [`MAX_NODES`] and [`MAX_TEXT_BYTES`], counted as
/// [`size_refusal`] counts them.
fn within_size(root: &Value) -> bool {
    let mut nodes = 1usize;
    let mut text = 0usize;
    let mut stack: Vec<(&Value, usize)> = vec![(root, 1)];
    while let Some((value, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return false;
        }
        match value {
            Value::String(s) => text = text.saturating_add(s.len()),
            Value::Array(items) => {
                nodes = nodes.saturating_add(items.len());
                if nodes > MAX_NODES {
                    return false;
                }
                stack.extend(items.iter().map(|item| (item, depth + 1)));
            }
            Value::Object(map) => {
                nodes = nodes.saturating_add(map.len());
                if nodes > MAX_NODES {
                    return false;
                }
                for (k, item) in map {
                    text = text.saturating_add(k.len());
                    stack.push((item, depth + 1));
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        if text > MAX_TEXT_BYTES {
            return false;
        }
    }
    true
}

/// The refusal of arguments past a size limit, with the JSON pointer of where.
fn size_refusal(root: &Value) -> Result<(), Vec<SchemaError>> {
    let refuse = |path: String, message: String| Err(vec![SchemaError { path, message }]);
    let mut nodes = 1usize;
    let mut text = 0usize;
    let too_many = || format!("arguments have more than {MAX_NODES} values");
    // (value, depth, JSON pointer); every pushed value has been counted in `nodes`.
    let mut stack: Vec<(&Value, usize, String)> = vec![(root, 1, String::new())];
    while let Some((value, depth, ptr)) = stack.pop() {
        if depth > MAX_DEPTH {
            return refuse(
                ptr,
                format!("arguments are nested deeper than {MAX_DEPTH} levels"),
            );
        }
        match value {
            Value::String(s) => text = text.saturating_add(s.len()),
            Value::Array(items) => {
                nodes = nodes.saturating_add(items.len());
                if nodes > MAX_NODES {
                    return refuse(ptr, too_many());
                }
                for (i, item) in items.iter().enumerate() {
                    stack.push((item, depth + 1, format!("{ptr}/{i}")));
                }
            }
            Value::Object(map) => {
                nodes = nodes.saturating_add(map.len());
                if nodes > MAX_NODES {
                    return refuse(ptr, too_many());
                }
                for (k, item) in map {
                    text = text.saturating_add(k.len());
                    let segment: String = k.chars().take(64).collect();
                    stack.push((
                        item,
                        depth + 1,
                        format!("{ptr}/{}", escape_segment(&segment)),
                    ));
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        if text > MAX_TEXT_BYTES {
            return refuse(
                String::new(),
                format!("arguments hold more than {MAX_TEXT_BYTES} bytes of text"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn formats_are_checked_and_unknown_formats_refused() {
        let v = compile(&json!({"type": "string", "format": "date"})).unwrap();
        assert!(v.is_valid(&json!("2026-06-30")));
        assert!(!v.is_valid(&json!("2026-02-30")));
        assert!(!v.is_valid(&json!("30/06/2026")));
        let e = compile(&json!({"type": "string", "format": "emial"}));
        assert!(e.is_err());
        let v = compile(&json!({"type": "string", "format": "email"})).unwrap();
        assert!(v.is_valid(&json!("ap@example.com")));
        assert!(!v.is_valid(&json!("not an email")));
    }

    #[test]
    fn deep_values_are_refused_before_the_validator() {
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!({ "a": deep });
        }
        let errs = check_size(&deep).unwrap_err();
        assert!(errs[0].message.contains("nested deeper"), "{errs:?}");
        assert!(errs[0].path.starts_with("/a/a/a"), "{errs:?}");
    }

    /// The counting walk and the walk that says where agree at and just past every limit.
    #[test]
    fn the_two_size_walks_agree_at_each_limit() {
        let nested = |levels: usize| {
            let mut v = json!(1);
            for _ in 1..levels {
                v = json!([v]);
            }
            v
        };
        // `n` values in all (the root array and its members).
        let values = |n: usize| json!(vec![0; n - 1]);
        // Exactly `bytes` of text (a key of one byte and its string).
        let text = |bytes: usize| json!({ "k": "x".repeat(bytes - 1) });
        let cases = [
            (nested(MAX_DEPTH), true),
            (nested(MAX_DEPTH + 1), false),
            (values(MAX_NODES), true),
            (values(MAX_NODES + 1), false),
            (text(MAX_TEXT_BYTES), true),
            (text(MAX_TEXT_BYTES + 1), false),
        ];
        for (i, (value, within)) in cases.iter().enumerate() {
            assert_eq!(within_size(value), *within, "case {i}");
            assert_eq!(size_refusal(value).is_ok(), *within, "case {i}");
            assert_eq!(check_size(value).is_ok(), *within, "case {i}");
        }
    }
}
