//! Layer-1 schema tests: property-based fuzzing of every tool's arguments in both example
//! registries, and a fixed table of every rejection kind the fuzzer exercises.
//!
//! Valid arguments are generated from each tool's own input schema (the subset of JSON
//! Schema the registry admits), so a tool added to an example is fuzzed without new code.
//! Mutations are chosen per value from what its schema constrains: an extra field, a wrong
//! type, out of bounds, a bad enum value, a broken pattern, a bad date, a missing required
//! field, a string over its maximum, a huge string, deep nesting, or not an object at all.
//! Every mutated input must be rejected (without a panic) with an error pointing at or
//! around the mutated value.

use std::collections::BTreeSet;

use countersign_core::registry::{PER_STEP_MARKER, Registry, ToolName};
use countersign_core::schema::{MAX_DEPTH, MAX_NODES, SchemaError};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};

use crate::registry::example;

const EXAMPLES: &[&str] = &["finance", "stillon"];

// ------------------------------------------------------------------ generators

fn select(items: Vec<Value>) -> BoxedStrategy<Value> {
    proptest::sample::select(items).boxed()
}

fn int_bound(schema: &Value, inclusive: &str, exclusive: &str, step: i64) -> Option<i64> {
    schema
        .get(inclusive)
        .and_then(Value::as_f64)
        .map(|v| v as i64)
        .or_else(|| {
            schema
                .get(exclusive)
                .and_then(Value::as_f64)
                .map(|v| v as i64 + step)
        })
}

fn date_strategy() -> BoxedStrategy<String> {
    (1970u32..2100, 1u32..=12, 1u32..=28)
        .prop_map(|(y, m, d)| format!("{y:04}-{m:02}-{d:02}"))
        .boxed()
}

fn string_strategy(schema: &Value) -> BoxedStrategy<Value> {
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .map(|m| m as usize);
    let s: BoxedStrategy<String> = match (
        schema.get("format").and_then(Value::as_str),
        schema.get("pattern").and_then(Value::as_str),
    ) {
        (Some("date"), _) => date_strategy(),
        (Some("date-time"), _) => (date_strategy(), 0u32..24, 0u32..60, 0u32..60)
            .prop_map(|(d, h, m, s)| format!("{d}T{h:02}:{m:02}:{s:02}Z"))
            .boxed(),
        (Some("uuid"), _) => any::<u128>()
            .prop_map(|n| uuid::Uuid::from_u128(n).to_string())
            .boxed(),
        (Some("email"), _) => "[a-z]{1,12}@[a-z]{1,12}\\.example".prop_map(|s| s).boxed(),
        (Some(other), _) => panic!("the generator does not know format {other}"),
        (None, Some(pattern)) => {
            let inner = pattern
                .strip_prefix('^')
                .and_then(|p| p.strip_suffix('$'))
                .unwrap_or(pattern);
            proptest::string::string_regex(inner)
                .unwrap_or_else(|e| panic!("pattern {pattern}: {e}"))
                .boxed()
        }
        (None, None) => {
            let max = max.unwrap_or(min + 64);
            proptest::collection::vec(
                proptest::sample::select(
                    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789.,-éü€日"
                        .chars()
                        .collect::<Vec<_>>(),
                ),
                min..=max,
            )
            .prop_map(|chars| chars.into_iter().collect())
            .boxed()
        }
    };
    s.prop_filter("length within bounds", move |s| {
        let n = s.chars().count();
        n >= min && max.is_none_or(|m| n <= m)
    })
    .prop_map(Value::String)
    .boxed()
}

fn number_strategy(schema: &Value, integer: bool) -> BoxedStrategy<Value> {
    if integer {
        let lo = int_bound(schema, "minimum", "exclusiveMinimum", 1).expect("bounded");
        let hi = int_bound(schema, "maximum", "exclusiveMaximum", -1).expect("bounded");
        (lo..=hi).prop_map(|n| json!(n)).boxed()
    } else {
        // Amounts in cents, inside the bounds.
        let cents = |k: &str| {
            schema
                .get(k)
                .and_then(Value::as_f64)
                .map(|v| (v * 100.0).round() as i64)
        };
        let lo = cents("minimum")
            .or_else(|| cents("exclusiveMinimum").map(|c| c + 1))
            .expect("bounded");
        let hi = cents("maximum")
            .or_else(|| cents("exclusiveMaximum").map(|c| c - 1))
            .expect("bounded");
        (lo..=hi).prop_map(|c| json!(c as f64 / 100.0)).boxed()
    }
}

/// Strategies for plan steps: a tool of the registry (not itself a plan tool) and valid
/// arguments for it.
fn step_target(reg: &Registry) -> BoxedStrategy<(String, Value)> {
    let options: Vec<BoxedStrategy<(String, Value)>> = reg
        .tools()
        .filter(|t| t.per_step_paths.is_empty())
        .map(|t| {
            let name = t.name.to_string();
            valid(&t.input_schema, reg)
                .prop_map(move |args| (name.clone(), args))
                .boxed()
        })
        .collect();
    Union::new(options).boxed()
}

fn object_strategy(
    schema: &Value,
    reg: &Registry,
    required: BTreeSet<String>,
    excluded: BTreeSet<String>,
) -> BoxedStrategy<Value> {
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let step_key = props
        .iter()
        .find(|(_, s)| s.get(PER_STEP_MARKER).is_some())
        .map(|(k, _)| k.clone());
    let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = Vec::new();
    for (key, sub) in &props {
        if excluded.contains(key)
            || Some(key) == step_key.as_ref()
            || (step_key.is_some() && key == "tool")
        {
            continue;
        }
        let k = key.clone();
        let s = valid(sub, reg).prop_map(move |v| (k.clone(), v));
        if required.contains(key) {
            fields.push(s.prop_map(Some).boxed());
        } else {
            fields.push(proptest::option::of(s).boxed());
        }
    }
    let step = match step_key {
        Some(key) => step_target(reg)
            .prop_map(move |(tool, args)| {
                vec![("tool".to_string(), json!(tool)), (key.clone(), args)]
            })
            .boxed(),
        None => Just(Vec::new()).boxed(),
    };
    (fields, step)
        .prop_map(|(fields, step)| {
            let mut map = Map::new();
            for (k, v) in fields.into_iter().flatten().chain(step) {
                map.insert(k, v);
            }
            Value::Object(map)
        })
        .boxed()
}

fn names(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Valid values for `schema` (the subset the registry admits).
fn valid(schema: &Value, reg: &Registry) -> BoxedStrategy<Value> {
    if let Some(c) = schema.get("const") {
        return Just(c.clone()).boxed();
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        return select(e.clone());
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let required = names(schema.get("required"));
            match schema.get("oneOf").and_then(Value::as_array) {
                // `oneOf: [{required: [a]}, {required: [b]}]`: exactly one branch's fields.
                Some(branches) => {
                    let options: Vec<BoxedStrategy<Value>> = (0..branches.len())
                        .map(|i| {
                            let mut req = required.clone();
                            req.extend(names(branches[i].get("required")));
                            let others: BTreeSet<String> = branches
                                .iter()
                                .enumerate()
                                .filter(|(j, _)| *j != i)
                                .flat_map(|(_, b)| names(b.get("required")))
                                .filter(|n| !req.contains(n))
                                .collect();
                            object_strategy(schema, reg, req, others)
                        })
                        .collect();
                    Union::new(options).boxed()
                }
                None => object_strategy(schema, reg, required, BTreeSet::new()),
            }
        }
        Some("string") => string_strategy(schema),
        Some("integer") => number_strategy(schema, true),
        Some("number") => number_strategy(schema, false),
        Some("boolean") => any::<bool>().prop_map(Value::Bool).boxed(),
        Some("array") => {
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema.get("maxItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let items = valid(schema.get("items").expect("items"), reg);
            proptest::collection::vec(items, min..=max.min(min + 4))
                .prop_map(Value::Array)
                .boxed()
        }
        other => panic!("the generator does not support type {other:?}"),
    }
}

// ------------------------------------------------------------------ mutations

/// Every kind of rejection the fuzzer produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ExtraField,
    MissingRequired,
    NotAnObject,
    WrongType,
    AboveMaximum,
    BelowMinimum,
    NotAnInteger,
    BadEnum,
    BadPattern,
    BadFormat,
    TooLong,
    HugeString,
    TooManyItems,
    DeepNesting,
}

fn deep(levels: usize) -> Value {
    let mut v = json!("bottom");
    for _ in 0..levels {
        v = json!([v]);
    }
    v
}

fn bad_format(format: &str) -> &'static str {
    match format {
        "date" => "2026-02-30",
        "date-time" => "2026-06-30T25:61:00Z",
        "uuid" => "not-a-uuid",
        "email" => "not an email",
        _ => "???",
    }
}

fn replace(root: &Value, ptr: &str, new: Value) -> Value {
    let mut out = root.clone();
    if ptr.is_empty() {
        return new;
    }
    if let Some(slot) = out.pointer_mut(ptr) {
        *slot = new;
    }
    out
}

/// Every (pointer, mutated arguments, kind) that must be rejected, for a valid `value`.
fn mutations(
    schema: &Value,
    value: &Value,
    root: &Value,
    ptr: &str,
    out: &mut Vec<(String, Value, Kind)>,
) {
    if schema.get(PER_STEP_MARKER).is_some() {
        // The exemption: only the size guards apply inside per-step arguments.
        out.push((
            ptr.into(),
            replace(root, ptr, json!({"nested": deep(MAX_DEPTH + 8)})),
            Kind::DeepNesting,
        ));
        return;
    }
    out.push((
        ptr.into(),
        replace(root, ptr, deep(MAX_DEPTH + 8)),
        Kind::DeepNesting,
    ));
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
    let with = |v: Value| replace(root, ptr, v);
    match ty {
        "object" => {
            let Value::Object(map) = value else { return };
            let mut extra = map.clone();
            extra.insert("zz_unexpected".into(), json!(1));
            out.push((ptr.into(), with(Value::Object(extra)), Kind::ExtraField));
            if let Some(first) = names(schema.get("required")).into_iter().next() {
                let mut missing = map.clone();
                missing.remove(&first);
                out.push((
                    ptr.into(),
                    with(Value::Object(missing)),
                    Kind::MissingRequired,
                ));
            }
            out.push((ptr.into(), with(json!(["an", "array"])), Kind::NotAnObject));
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, v) in map {
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    mutations(sub, v, root, &format!("{ptr}/{k}"), out);
                }
            }
        }
        "array" => {
            let Value::Array(items) = value else { return };
            out.push((ptr.into(), with(json!("not an array")), Kind::WrongType));
            if let (Some(max), Some(first)) = (
                schema.get("maxItems").and_then(Value::as_u64),
                items.first(),
            ) {
                out.push((
                    ptr.into(),
                    with(Value::Array(vec![first.clone(); max as usize + 1])),
                    Kind::TooManyItems,
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    mutations(item_schema, v, root, &format!("{ptr}/{i}"), out);
                }
            }
        }
        "string" => {
            out.push((ptr.into(), with(json!(12345)), Kind::WrongType));
            if schema.get("enum").is_some() {
                out.push((ptr.into(), with(json!("zz-not-in-enum")), Kind::BadEnum));
            }
            if schema.get("pattern").is_some() {
                let s = value.as_str().unwrap_or_default();
                out.push((ptr.into(), with(json!(format!("!{s}"))), Kind::BadPattern));
            }
            if let Some(f) = schema.get("format").and_then(Value::as_str) {
                out.push((ptr.into(), with(json!(bad_format(f))), Kind::BadFormat));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                out.push((
                    ptr.into(),
                    with(json!("x".repeat(max as usize + 1))),
                    Kind::TooLong,
                ));
            }
            out.push((
                ptr.into(),
                with(json!("x".repeat(200_000))),
                Kind::HugeString,
            ));
        }
        "integer" | "number" => {
            out.push((ptr.into(), with(json!("12")), Kind::WrongType));
            let int = ty == "integer";
            let step = if int { 1.0 } else { 0.01 };
            let num = |x: f64| if int { json!(x as i64) } else { json!(x) };
            if let Some(m) = schema.get("maximum").and_then(Value::as_f64) {
                out.push((ptr.into(), with(num(m + step)), Kind::AboveMaximum));
            }
            if let Some(m) = schema.get("exclusiveMaximum").and_then(Value::as_f64) {
                out.push((ptr.into(), with(num(m)), Kind::AboveMaximum));
            }
            if let Some(m) = schema.get("minimum").and_then(Value::as_f64) {
                out.push((ptr.into(), with(num(m - step)), Kind::BelowMinimum));
                if int {
                    out.push((ptr.into(), with(json!(m + 0.5)), Kind::NotAnInteger));
                }
            }
            if let Some(m) = schema.get("exclusiveMinimum").and_then(Value::as_f64) {
                out.push((ptr.into(), with(num(m)), Kind::BelowMinimum));
            }
        }
        _ => {}
    }
}

fn related(a: &str, b: &str) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn check_rejected(
    reg: &Registry,
    tool: &ToolName,
    ptr: &str,
    args: &Value,
    kind: Kind,
) -> Result<(), TestCaseError> {
    match reg.validate(tool, args) {
        Ok(()) => Err(TestCaseError::fail(format!(
            "{tool}: {kind:?} at {ptr:?} was accepted: {}",
            short(args)
        ))),
        Err(errors) => {
            prop_assert!(!errors.is_empty());
            prop_assert!(
                errors.iter().any(|e| related(&e.path, ptr)),
                "{tool}: {kind:?} at {ptr:?}: no error near it: {errors:?}"
            );
            for e in &errors {
                prop_assert!(
                    e.message.chars().count() <= 301,
                    "message too long: {}",
                    e.message
                );
                prop_assert!(
                    !e.message.contains("xxxxxxxxxx"),
                    "message echoes the input"
                );
            }
            Ok(())
        }
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    s.chars().take(300).collect()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(48)
}

#[test]
fn generated_valid_arguments_are_accepted_for_every_tool() {
    for name in EXAMPLES {
        let reg = example(name);
        for tool in reg.tools() {
            let mut runner = TestRunner::new(Config {
                cases: cases(),
                failure_persistence: None,
                ..Config::default()
            });
            let strategy = valid(&tool.input_schema, &reg);
            runner
                .run(&strategy, |args| {
                    let verdict = reg.validate(&tool.name, &args);
                    prop_assert!(
                        verdict.is_ok(),
                        "{}: {} refused: {:?}",
                        tool.name,
                        short(&args),
                        verdict
                    );
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{name}/{}: {e}", tool.name));
        }
    }
}

#[test]
fn mutated_arguments_are_rejected_without_panic_for_every_tool() {
    let mut seen: BTreeSet<Kind> = BTreeSet::new();
    for name in EXAMPLES {
        let reg = example(name);
        for tool in reg.tools() {
            let mut runner = TestRunner::new(Config {
                cases: cases(),
                failure_persistence: None,
                ..Config::default()
            });
            let strategy = (valid(&tool.input_schema, &reg), any::<usize>());
            let kinds = std::cell::RefCell::new(BTreeSet::new());
            runner
                .run(&strategy, |(args, pick)| {
                    let mut all = Vec::new();
                    mutations(&tool.input_schema, &args, &args, "", &mut all);
                    // Whole-argument mutations apply to every tool.
                    all.push((String::new(), json!("a string"), Kind::NotAnObject));
                    all.push((String::new(), Value::Null, Kind::NotAnObject));
                    let (ptr, mutated, kind) = &all[pick % all.len()];
                    kinds.borrow_mut().insert(*kind);
                    check_rejected(&reg, &tool.name, ptr, mutated, *kind)?;
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{name}/{}: {e}", tool.name));
            // Deterministically, every mutation of one valid value as well.
            let mut fixed_runner = TestRunner::deterministic();
            let args = valid(&tool.input_schema, &reg)
                .new_tree(&mut fixed_runner)
                .expect("generate")
                .current();
            let mut all = Vec::new();
            mutations(&tool.input_schema, &args, &args, "", &mut all);
            for (ptr, mutated, kind) in &all {
                seen.insert(*kind);
                check_rejected(&reg, &tool.name, ptr, mutated, *kind)
                    .unwrap_or_else(|e| panic!("{name}/{}: {e}", tool.name));
            }
            seen.extend(kinds.into_inner());
        }
    }
    // Every rejection kind was exercised somewhere.
    for kind in [
        Kind::ExtraField,
        Kind::MissingRequired,
        Kind::NotAnObject,
        Kind::WrongType,
        Kind::AboveMaximum,
        Kind::BelowMinimum,
        Kind::NotAnInteger,
        Kind::BadEnum,
        Kind::BadPattern,
        Kind::BadFormat,
        Kind::TooLong,
        Kind::HugeString,
        Kind::TooManyItems,
        Kind::DeepNesting,
    ] {
        assert!(seen.contains(&kind), "{kind:?} never exercised");
    }
}

#[test]
fn arbitrary_json_never_panics_the_validator() {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ];
    let value = leaf.prop_recursive(8, 128, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,12}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    for name in EXAMPLES {
        let reg = example(name);
        let tools: Vec<ToolName> = reg.tools().map(|t| t.name.clone()).collect();
        let mut runner = TestRunner::new(Config {
            cases: cases() * 4,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&(value.clone(), any::<usize>()), |(v, pick)| {
                let tool = &tools[pick % tools.len()];
                // Arbitrary values almost never satisfy a closed schema; the point is no panic.
                let _ = reg.validate(tool, &v);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

// ------------------------------------------------------------------ fixed regression rows

struct Row {
    registry: &'static str,
    tool: &'static str,
    why: &'static str,
    args: Value,
    /// `Some(path fragment)` = rejected with an error at exactly this pointer; `None` = accepted.
    path: Option<&'static str>,
    message: &'static str,
}

fn payment() -> Value {
    json!({"invoice_id": "INV-20260611", "amount": 4180.00, "currency": "EUR",
           "value_date": "2026-06-30",
           "reason": "Three-way match complete against PO-77812 line 2; net-30 from receipt."})
}

fn with(mut base: Value, key: &str, v: Value) -> Value {
    base[key] = v;
    base
}

fn without(mut base: Value, key: &str) -> Value {
    base.as_object_mut().unwrap().remove(key);
    base
}

fn plan(arguments: Value) -> Value {
    json!({"task": "Process invoice INV-20260611", "steps": [{
        "tool": "payment.schedule", "arguments": arguments,
        "reason": "Three-way match complete against PO-77812 line 2."}]})
}

fn rows() -> Vec<Row> {
    let row = |tool, why, args, path, message| Row {
        registry: "finance",
        tool,
        why,
        args,
        path,
        message,
    };
    let stillon = |tool, why, args, path, message| Row {
        registry: "stillon",
        tool,
        why,
        args,
        path,
        message,
    };
    let mut deep_args = json!("bottom");
    for _ in 0..(MAX_DEPTH + 5) {
        deep_args = json!({ "a": deep_args });
    }
    let many: Vec<Value> = (0..MAX_NODES + 1).map(|i| json!(i)).collect();
    vec![
        row(
            "payment.schedule",
            "the seed's own audit example",
            payment(),
            None,
            "",
        ),
        row(
            "payment.schedule",
            "extra field",
            with(payment(), "iban", json!("ES91 2100")),
            Some(""),
            "Additional properties",
        ),
        row(
            "payment.schedule",
            "client-supplied idempotency key is not an argument",
            with(payment(), "idempotency_key", json!("k")),
            Some(""),
            "Additional properties",
        ),
        row(
            "payment.schedule",
            "above the maximum by a cent",
            with(payment(), "amount", json!(50000.01)),
            Some("/amount"),
            "maximum",
        ),
        row(
            "payment.schedule",
            "exactly the maximum is allowed",
            with(payment(), "amount", json!(50000)),
            None,
            "",
        ),
        row(
            "payment.schedule",
            "zero is not above exclusiveMinimum",
            with(payment(), "amount", json!(0)),
            Some("/amount"),
            "minimum",
        ),
        row(
            "payment.schedule",
            "negative amount",
            with(payment(), "amount", json!(-4180)),
            Some("/amount"),
            "minimum",
        ),
        row(
            "payment.schedule",
            "amount as a string",
            with(payment(), "amount", json!("4180.00")),
            Some("/amount"),
            "type",
        ),
        row(
            "payment.schedule",
            "currency not in the enum",
            with(payment(), "currency", json!("USD")),
            Some("/currency"),
            "not one of",
        ),
        row(
            "payment.schedule",
            "currency in the wrong case",
            with(payment(), "currency", json!("eur")),
            Some("/currency"),
            "not one of",
        ),
        row(
            "payment.schedule",
            "invoice id too short",
            with(payment(), "invoice_id", json!("INV-2026061")),
            Some("/invoice_id"),
            "does not match",
        ),
        row(
            "payment.schedule",
            "invoice id with a prefix (anchored pattern)",
            with(payment(), "invoice_id", json!("XINV-20260611")),
            Some("/invoice_id"),
            "does not match",
        ),
        row(
            "payment.schedule",
            "invoice id with a trailing newline",
            with(payment(), "invoice_id", json!("INV-20260611\n")),
            Some("/invoice_id"),
            "does not match",
        ),
        row(
            "payment.schedule",
            "impossible date",
            with(payment(), "value_date", json!("2026-02-30")),
            Some("/value_date"),
            "date",
        ),
        row(
            "payment.schedule",
            "date in another format",
            with(payment(), "value_date", json!("30/06/2026")),
            Some("/value_date"),
            "date",
        ),
        row(
            "payment.schedule",
            "reason below 20 characters",
            with(payment(), "reason", json!("pay it")),
            Some("/reason"),
            "shorter",
        ),
        row(
            "payment.schedule",
            "reason above 400 characters",
            with(payment(), "reason", json!("r".repeat(401))),
            Some("/reason"),
            "longer",
        ),
        row(
            "payment.schedule",
            "huge reason",
            with(payment(), "reason", json!("r".repeat(2_000_000))),
            Some(""),
            "bytes of text",
        ),
        row(
            "payment.schedule",
            "missing value date",
            without(payment(), "value_date"),
            Some(""),
            "required",
        ),
        row(
            "payment.schedule",
            "arguments not an object",
            json!([payment()]),
            Some(""),
            "object",
        ),
        row(
            "payment.schedule",
            "null arguments",
            Value::Null,
            Some(""),
            "object",
        ),
        row(
            "payment.schedule",
            "deep nesting in a field",
            with(payment(), "reason", deep_args.clone()),
            Some("/reason/a/a"),
            "nested deeper",
        ),
        row(
            "payment.schedule",
            "too many values",
            with(payment(), "reason", Value::Array(many)),
            Some("/reason"),
            "more than",
        ),
        row(
            "payment.lookup",
            "by key",
            json!({"idempotency_key": format!("sha256:{}", "a".repeat(64))}),
            None,
            "",
        ),
        row(
            "payment.lookup",
            "by reference",
            json!({"payment_reference": "PAYRUN-2026-06-30/0142"}),
            None,
            "",
        ),
        row(
            "payment.lookup",
            "neither key nor reference",
            json!({}),
            Some(""),
            "oneOf",
        ),
        row(
            "payment.lookup",
            "both key and reference",
            json!({"idempotency_key": format!("sha256:{}", "a".repeat(64)), "payment_reference": "PAYRUN-2026-06-30/0142"}),
            Some(""),
            "oneOf",
        ),
        row(
            "invoice.hold",
            "hold above the schema maximum",
            json!({"invoice_id": "INV-20260611", "amount": 50000.5, "currency": "EUR", "reason": "Disputed quantity on line 2 of the PO."}),
            Some("/amount"),
            "maximum",
        ),
        row(
            "invoice.search",
            "limit not an integer",
            json!({"limit": 2.5}),
            Some("/limit"),
            "integer",
        ),
        row(
            "invoice.search",
            "limit above the maximum",
            json!({"limit": 51}),
            Some("/limit"),
            "maximum",
        ),
        row(
            "supplier.update_iban",
            "IBAN with spaces",
            json!({"supplier_id": "SUP-000042", "iban": "ES91 2100 0418 4502 0005 1332", "reason": "Supplier letter of 2026-06-01 confirms the change."}),
            Some("/iban"),
            "does not match",
        ),
        row(
            "plan.submit",
            "a step's arguments are exempt from closure here",
            plan(json!({"anything": "goes", "checked": "per step"})),
            None,
            "",
        ),
        row(
            "plan.submit",
            "but not from the depth guard",
            plan(deep_args.clone()),
            Some("/steps/0/arguments"),
            "nested deeper",
        ),
        row(
            "plan.submit",
            "arguments must still be an object",
            plan(json!("pay everything")),
            Some("/steps/0/arguments"),
            "object",
        ),
        row(
            "plan.submit",
            "a step with an extra field",
            json!({"task": "t", "steps": [{"tool": "invoice.get", "arguments": {}, "reason": "Needed to check the PO match.", "priority": 1}]}),
            Some("/steps/0"),
            "Additional properties",
        ),
        row(
            "plan.submit",
            "an observed entry with an extra field",
            json!({"task": "t", "steps": [{"tool": "invoice.get", "arguments": {}, "reason": "Needed to check the PO match.", "observed": [{"field": "status", "value": "matched", "by": "me"}]}]}),
            Some("/steps/0/observed/0"),
            "Additional properties",
        ),
        row(
            "plan.submit",
            "no steps",
            json!({"task": "t", "steps": []}),
            Some("/steps"),
            "less than 1 item",
        ),
        row(
            "plan.submit",
            "a tool name that is not a name",
            json!({"task": "t", "steps": [{"tool": "Payment Schedule", "arguments": {}, "reason": "Needed to check the PO match."}]}),
            Some("/steps/0/tool"),
            "does not match",
        ),
        row(
            "step.approve",
            "step id not a UUID",
            json!({"step_id": "step-7", "reason": "Amount matches the purchase order."}),
            Some("/step_id"),
            "uuid",
        ),
        stillon(
            "reservation.modify",
            "the seed's proposal",
            json!({"reservation_id": 8472, "requested_time": "20:00", "reason": "Inbound flight now lands at 19:20."}),
            None,
            "",
        ),
        stillon(
            "reservation.modify",
            "24:00 is not a time",
            json!({"reservation_id": 8472, "requested_time": "24:00", "reason": "Inbound flight now lands at 19:20."}),
            Some("/requested_time"),
            "does not match",
        ),
        stillon(
            "reservation.modify",
            "reservation id zero",
            json!({"reservation_id": 0, "requested_time": "20:00", "reason": "Inbound flight now lands at 19:20."}),
            Some("/reservation_id"),
            "minimum",
        ),
        stillon(
            "reservation.modify",
            "reservation id as text",
            json!({"reservation_id": "8472", "requested_time": "20:00", "reason": "Inbound flight now lands at 19:20."}),
            Some("/reservation_id"),
            "type",
        ),
        stillon(
            "reservation.cancel",
            "provider named by the model",
            json!({"reservation_id": 8472, "reason": "The restaurant cannot do 20:00 tonight.", "provider": "other-platform"}),
            Some(""),
            "Additional properties",
        ),
        stillon(
            "calendar.update",
            "start not a date-time",
            json!({"event_id": "EVT-0a1b2c3d", "start": "tomorrow 8pm", "end": "2026-08-24T22:00:00Z"}),
            Some("/start"),
            "date-time",
        ),
        stillon(
            "notify.send",
            "channel not in the enum",
            json!({"contact_id": "CONTACT-1234", "channel": "fax", "message": "Dinner moved to 20:00."}),
            Some("/channel"),
            "not one of",
        ),
        stillon(
            "restaurant.search",
            "party of 21",
            json!({"city": "Lisbon", "date": "2026-08-24", "party_size": 21}),
            Some("/party_size"),
            "maximum",
        ),
    ]
}

#[test]
fn the_regression_table() {
    let regs: Vec<(&str, Registry)> = EXAMPLES.iter().map(|n| (*n, example(n))).collect();
    for row in rows() {
        let reg = &regs.iter().find(|(n, _)| *n == row.registry).unwrap().1;
        let tool = ToolName::parse(row.tool).unwrap();
        assert!(
            reg.tool(&tool).is_some(),
            "{}: no tool {}",
            row.why,
            row.tool
        );
        let verdict = reg.validate(&tool, &row.args);
        match (row.path, verdict) {
            (None, Ok(())) => {}
            (None, Err(e)) => panic!("{} / {}: refused: {e:?}", row.tool, row.why),
            (Some(_), Ok(())) => panic!("{} / {}: accepted", row.tool, row.why),
            (Some(path), Err(errors)) => {
                let hit = errors.iter().any(|e: &SchemaError| {
                    e.path.starts_with(path)
                        && e.message
                            .to_lowercase()
                            .contains(&row.message.to_lowercase())
                });
                assert!(
                    hit,
                    "{} / {}: expected {path:?} ~ {:?}, got {errors:?}",
                    row.tool, row.why, row.message
                );
            }
        }
    }
}

#[test]
fn unknown_tools_are_errors_not_passes() {
    let reg = example("finance");
    let errors = reg
        .validate(&ToolName::parse("payment.teleport").unwrap(), &json!({}))
        .unwrap_err();
    assert_eq!(errors.len(), 1);
}
