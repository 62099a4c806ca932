//! Registry loader tests: one test per refusal rule (each asserting the problem names the
//! tool and the JSON pointer), all problems at once, the example registries, round-trip,
//! role listings, annotations and diffs.

use std::path::PathBuf;

use countersign_core::registry::{LoadError, Problem, Registry, RoleName, Subject, ToolName, diff};
use countersign_core::{Effect, Gate};

pub fn example_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
        .join("registry.yaml")
}

pub fn example(name: &str) -> Registry {
    match Registry::from_path(&example_path(name)) {
        Ok(r) => r,
        Err(e) => panic!("example {name} does not load:\n{e}"),
    }
}

const HEADER: &str = "\
providers:
  erp: {kind: builtin}
roles:
  worker: {description: Does the work}
";

/// A registry with one tool `t.one` whose body is `body` (indented under the tool).
fn with_tool(body: &str) -> String {
    let indented: String = body.lines().map(|l| format!("    {l}\n")).collect();
    format!("{HEADER}tools:\n  t.one:\n{indented}")
}

const OK_TOOL: &str = "\
description: A tool
effect: read
gate: never
roles: [worker]
handler: {provider: erp, operation: things.get}
inputSchema:
  type: object
  additionalProperties: false
  properties:
    id: {type: string, pattern: '^T-[0-9]{4}$'}
";

fn tool_with_schema(properties: &str) -> String {
    let props: String = properties.lines().map(|l| format!("    {l}\n")).collect();
    with_tool(&format!(
        "description: A tool\neffect: read\ngate: never\nroles: [worker]\n\
         handler: {{provider: erp, operation: things.get}}\n\
         inputSchema:\n  type: object\n  additionalProperties: false\n  properties:\n{props}"
    ))
}

fn refused(yaml: &str) -> Vec<Problem> {
    match Registry::from_yaml_str(yaml) {
        Ok(_) => panic!("registry should have been refused:\n{yaml}"),
        Err(LoadError::Invalid(p)) => p.0,
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[track_caller]
fn assert_problem(problems: &[Problem], subject: Subject, path: &str, contains: &str) {
    let found = problems
        .iter()
        .any(|p| p.subject == subject && p.path == path && p.message.contains(contains));
    assert!(
        found,
        "no problem for {subject} at {path:?} containing {contains:?}; got:\n{}",
        problems
            .iter()
            .map(|p| format!("  {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The displayed line names the subject and the path too.
    let line = problems
        .iter()
        .find(|p| p.subject == subject && p.path == path)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(line.contains(&subject.to_string()), "{line}");
}

fn tool(name: &str) -> Subject {
    Subject::Tool(name.to_string())
}

#[test]
fn the_base_case_loads() {
    let r = Registry::from_yaml_str(&with_tool(OK_TOOL)).unwrap();
    assert_eq!(r.tools().count(), 1);
}

// ------------------------------------------------------------------ schema closure

#[test]
fn refuses_an_object_schema_without_additional_properties() {
    let p = refused(&tool_with_schema(
        "address:\n  type: object\n  properties:\n    city: {type: string, maxLength: 80}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/address",
        "additionalProperties: false",
    );
}

#[test]
fn refuses_additional_properties_that_is_not_false() {
    let yaml =
        with_tool(&OK_TOOL.replace("additionalProperties: false", "additionalProperties: true"));
    let p = refused(&yaml);
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/additionalProperties",
        "must be `false`",
    );
    let yaml = with_tool(&OK_TOOL.replace(
        "additionalProperties: false",
        "additionalProperties: {type: string, maxLength: 3}",
    ));
    let p = refused(&yaml);
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/additionalProperties",
        "must be `false`",
    );
}

#[test]
fn refuses_open_objects_in_items_and_defs() {
    let p = refused(&tool_with_schema(
        "lines:\n  type: array\n  maxItems: 5\n  items: {type: object, properties: {}}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/lines/items",
        "not closed",
    );

    let yaml = with_tool(&format!(
        "{OK_TOOL}  $defs:\n    money: {{type: object, properties: {{}}}}\n"
    ));
    let p = refused(&yaml);
    assert_problem(&p, tool("t.one"), "/inputSchema/$defs/money", "not closed");
}

#[test]
fn refuses_numbers_without_both_bounds() {
    let p = refused(&tool_with_schema(
        "amount: {type: number, exclusiveMinimum: 0}\ncount: {type: integer, maximum: 9}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/amount",
        "unbounded above",
    );
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/count",
        "unbounded below",
    );
}

#[test]
fn refuses_unbounded_strings() {
    let p = refused(&tool_with_schema("name: {type: string, minLength: 1}"));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/name",
        "string is unbounded",
    );
    // Each of enum, const, pattern, format, maxLength bounds it.
    for bound in [
        "enum: [a, b]",
        "const: a",
        "pattern: '^a+$'",
        "format: date",
        "maxLength: 10",
    ] {
        let yaml = tool_with_schema(&format!("name: {{type: string, {bound}}}"));
        Registry::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("{bound}: {e}"));
    }
}

#[test]
fn refuses_unanchored_patterns_and_unchecked_formats() {
    let p = refused(&tool_with_schema(
        "id: {type: string, pattern: 'INV-[0-9]{8}'}\nday: {type: string, format: dayte}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/id/pattern",
        "anchored",
    );
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/day/format",
        "not one the validator checks",
    );
}

#[test]
fn refuses_unbounded_arrays() {
    let p = refused(&tool_with_schema(
        "tags: {type: array, items: {type: string, maxLength: 5}}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/tags",
        "maxItems",
    );
}

#[test]
fn refuses_schemas_that_accept_anything() {
    let p = refused(&tool_with_schema(
        "free: {description: anything}\nyes: true",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/free",
        "accepts any value",
    );
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/yes",
        "accepts any value",
    );
}

#[test]
fn refuses_widening_and_unknown_keywords() {
    let yaml = with_tool(&format!(
        "{OK_TOOL}  patternProperties:\n    '^x': {{type: string, maxLength: 2}}\n  requried: [id]\n"
    ));
    let p = refused(&yaml);
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/patternProperties",
        "refused",
    );
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/requried",
        "unknown keyword",
    );
}

#[test]
fn refuses_remote_refs() {
    let p = refused(&tool_with_schema(
        "id: {$ref: 'https://example.com/schema.json'}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/id/$ref",
        "must be local",
    );
}

#[test]
fn refuses_refs_into_parts_the_walk_does_not_check() {
    let schema = |target: &str| {
        with_tool(&format!(
            "description: A tool\neffect: read\ngate: never\nroles: [worker]\n\
             handler: {{provider: erp, operation: things.get}}\n\
             inputSchema:\n  type: object\n  additionalProperties: false\n  properties:\n\
             \x20   id: {{$ref: '{target}'}}\n  $defs:\n\
             \x20   s: {{type: string, maxLength: 5, x-open: {{}}, not: {{type: object}}, anyOf: [{{type: object}}]}}\n"
        ))
    };
    for target in [
        "#/$defs/s/x-open",
        "#/$defs/s/not",
        "#/$defs/s/anyOf/0",
        "#/$defs/s%2Fx-open",
        "#/$defs/s~1x-open",
        "#/properties/id",
        "#/$defs/",
    ] {
        let p = refused(&schema(target));
        assert_problem(
            &p,
            tool("t.one"),
            "/inputSchema/properties/id/$ref",
            "must be local",
        );
    }
    // One named definition is fine.
    Registry::from_yaml_str(&schema("#/$defs/s")).unwrap();
}

#[test]
fn the_per_step_marker_is_honoured_only_on_a_step() {
    // Honoured: beside a required string `tool`.
    let ok = tool_with_schema(
        "steps:\n  type: array\n  maxItems: 3\n  items:\n    type: object\n    additionalProperties: false\n    required: [tool, arguments]\n    properties:\n      tool: {type: string, maxLength: 64}\n      arguments: {type: object, x-countersign-validated-per-step: true}",
    );
    let r = Registry::from_yaml_str(&ok).unwrap();
    let t = r.tool(&ToolName::parse("t.one").unwrap()).unwrap();
    assert_eq!(
        t.per_step_paths,
        vec!["/properties/steps/items/properties/arguments".to_string()]
    );

    // Refused anywhere else, and with extra keywords.
    let p = refused(&tool_with_schema(
        "payload: {type: object, x-countersign-validated-per-step: true, properties: {}}",
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/payload/x-countersign-validated-per-step",
        "only honoured",
    );
    assert_problem(
        &p,
        tool("t.one"),
        "/inputSchema/properties/payload/properties",
        "not allowed beside",
    );
}

#[test]
fn refuses_a_schema_that_does_not_compile() {
    let p = refused(&tool_with_schema(
        "n: {type: integer, minimum: low, maximum: 5}",
    ));
    assert!(
        p.iter().any(|p| p.subject == tool("t.one")
            && p.path.starts_with("/inputSchema")
            && p.message.contains("does not compile")),
        "{p:?}"
    );
}

// ------------------------------------------------------------------ tool fields

#[test]
fn refuses_an_unknown_effect_class() {
    let p = refused(&with_tool(
        &OK_TOOL.replace("effect: read", "effect: destructive"),
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/effect",
        "unknown effect class `destructive`",
    );
}

#[test]
fn refuses_an_unknown_gate() {
    let p = refused(&with_tool(
        &OK_TOOL.replace("gate: never", "gate: sometimes"),
    ));
    assert_problem(&p, tool("t.one"), "/gate", "unknown gate `sometimes`");
}

#[test]
fn refuses_a_tool_with_no_role() {
    let p = refused(&with_tool(&OK_TOOL.replace("roles: [worker]\n", "")));
    assert_problem(&p, tool("t.one"), "", "has no role");
    // A role's `tools:` listing is enough.
    let yaml = with_tool(&OK_TOOL.replace("roles: [worker]\n", "")).replace(
        "worker: {description: Does the work}",
        "worker: {description: Does the work, tools: [t.one]}",
    );
    let r = Registry::from_yaml_str(&yaml).unwrap();
    let worker = RoleName::parse("worker").unwrap();
    assert_eq!(r.tools_for_role(&worker).count(), 1);
}

#[test]
fn refuses_a_role_naming_an_unknown_tool() {
    let yaml = with_tool(OK_TOOL).replace(
        "worker: {description: Does the work}",
        "worker: {description: Does the work, tools: [t.one, t.ghost]}",
    );
    let p = refused(&yaml);
    assert_problem(
        &p,
        Subject::Role("worker".into()),
        "/tools/1",
        "unknown tool `t.ghost`",
    );
}

#[test]
fn refuses_a_tool_naming_an_undeclared_role() {
    let p = refused(&with_tool(
        &OK_TOOL.replace("roles: [worker]", "roles: [worker, wroker]"),
    ));
    assert_problem(&p, tool("t.one"), "/roles/1", "not declared");
}

#[test]
fn refuses_references_to_unknown_tools() {
    for key in ["compensate", "verify", "reconcile"] {
        let body = OK_TOOL.replace("effect: read", "effect: write");
        let p = refused(&with_tool(&format!("{body}{key}: t.ghost\n")));
        assert_problem(
            &p,
            tool("t.one"),
            &format!("/{key}"),
            "unknown tool `t.ghost`",
        );
    }
}

#[test]
fn refuses_verify_or_reconcile_through_a_non_read_tool() {
    let write = with_tool(&format!(
        "{}verify: t.one\nreconcile: t.one\n",
        OK_TOOL.replace("effect: read", "effect: write")
    ));
    let p = refused(&write);
    assert_problem(&p, tool("t.one"), "/verify", "must be a read tool");
    assert_problem(&p, tool("t.one"), "/reconcile", "must be a read tool");
}

#[test]
fn refuses_an_irreversible_tool_that_is_never_gated() {
    let p = refused(&with_tool(
        &OK_TOOL.replace("effect: read", "effect: irreversible"),
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/gate",
        "irreversible tool cannot be `gate: never`",
    );
}

#[test]
fn refuses_a_handler_naming_an_unknown_provider() {
    let p = refused(&with_tool(
        &OK_TOOL.replace("provider: erp", "provider: bank"),
    ));
    assert_problem(
        &p,
        tool("t.one"),
        "/handler/provider",
        "unknown provider `bank`",
    );
}

#[test]
fn refuses_gated_tools_without_people_to_approve() {
    let p = refused(&with_tool(&OK_TOOL.replace("gate: never", "gate: always")));
    assert_problem(&p, tool("t.one"), "", "approver role");
    let p = refused(&with_tool(&format!(
        "{}approval: {{approver_roles: [worker]}}\n",
        OK_TOOL.replace("gate: never", "gate: policy")
    )));
    assert_problem(
        &p,
        tool("t.one"),
        "/approval/approver_roles/0",
        "agent role",
    );
}

#[test]
fn refuses_unknown_keys_everywhere_each_with_its_path() {
    let yaml = format!(
        "{}  t.two:\n    description: x\n    effect: read\n    gate: never\n    roles: [worker]\n    colour: blue\n    handler: {{provider: erp, operation: a, retries: 3}}\n    approval: {{approver_roles: [approver], expiry: 1h}}\n    inputSchema: {{type: object, additionalProperties: false}}\nextras: 1\n",
        with_tool(OK_TOOL)
    )
    .replace("erp: {kind: builtin}", "erp: {kind: builtin, region: eu}");
    let p = refused(&yaml);
    assert_problem(&p, tool("t.two"), "/colour", "unknown key `colour`");
    assert_problem(
        &p,
        tool("t.two"),
        "/handler/retries",
        "unknown key `retries`",
    );
    assert_problem(
        &p,
        tool("t.two"),
        "/approval/expiry",
        "unknown key `expiry`",
    );
    assert_problem(&p, Subject::File, "/extras", "unknown key `extras`");
    assert_problem(
        &p,
        Subject::Provider("erp".into()),
        "/region",
        "unknown key `region`",
    );
}

#[test]
fn refuses_bad_names_durations_and_providers() {
    let yaml = with_tool(&format!(
        "{}approval: {{approver_roles: [approver], expires: 3 days}}\n",
        OK_TOOL.replace("gate: never", "gate: policy")
    ))
    .replace("t.one:", "T.One:")
    .replace(
        "erp: {kind: builtin}",
        "erp: {kind: builtin}\n  bank: {kind: http, base_url: 'https://bank.example/api'}\n  up: {kind: carrier-pigeon}",
    );
    let p = refused(&yaml);
    assert_problem(&p, tool("T.One"), "", "tool name \"T.One\" is invalid");
    assert_problem(&p, tool("T.One"), "/approval/expires", "duration");
    assert_problem(
        &p,
        Subject::Provider("bank".into()),
        "/allowed_hosts",
        "bank.example",
    );
    assert_problem(
        &p,
        Subject::Provider("up".into()),
        "/kind",
        "unknown provider kind",
    );
}

#[test]
fn refuses_duplicates_across_files() {
    let a = ("a.yaml".to_string(), with_tool(OK_TOOL));
    let b = (
        "b.yaml".to_string(),
        format!(
            "tools:\n  t.one:\n{}",
            OK_TOOL
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        ),
    );
    let p = match Registry::from_sources(&[a, b]) {
        Err(LoadError::Invalid(p)) => p.0,
        other => panic!("{other:?}"),
    };
    assert_problem(
        &p,
        tool("t.one"),
        "",
        "defined twice: in a.yaml and in b.yaml",
    );
    assert_eq!(p[0].source, "b.yaml");
}

#[test]
fn merges_a_folder_of_files() {
    let dir = std::env::temp_dir().join(format!("cs-registry-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("00-base.yaml"), HEADER).unwrap();
    std::fs::write(
        dir.join("10-tools.yml"),
        format!(
            "tools:\n  t.one:\n{}",
            OK_TOOL
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
    let r = Registry::from_path(&dir).unwrap();
    assert_eq!(r.tools().count(), 1);
    assert_eq!(r, Registry::from_yaml_str(&with_tool(OK_TOOL)).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reports_invalid_yaml_as_a_file_problem() {
    let p = refused("tools: [unclosed");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].subject, Subject::File);
    assert!(p[0].message.contains("not valid YAML"), "{}", p[0]);
}

#[test]
fn reports_every_problem_at_once() {
    let tools = [
        "  t.open:",
        "    description: open",
        "    effect: read",
        "    gate: never",
        "    roles: [worker]",
        "    handler: {provider: erp, operation: x}",
        "    inputSchema: {type: object, properties: {n: {type: number}}}",
        "  t.pay:",
        "    description: pay",
        "    effect: irreversible",
        "    gate: never",
        "    roles: [worker]",
        "    handler: {provider: bank, operation: pay}",
        "    reconcile: t.nope",
        "    inputSchema: {type: object, additionalProperties: false}",
        "  t.odd:",
        "    description: odd",
        "    effect: sideways",
        "    gate: maybe",
        "    handler: {provider: erp, operation: x}",
        "    inputSchema: {type: object, additionalProperties: false}",
    ]
    .join("\n");
    let yaml = format!(
        "{HEADER}  reviewer: {{description: Reviews, tools: [t.ghost]}}\ntools:\n{tools}\n"
    );
    let p = refused(&yaml);
    assert_problem(
        &p,
        tool("t.open"),
        "/inputSchema",
        "additionalProperties: false",
    );
    assert_problem(
        &p,
        tool("t.open"),
        "/inputSchema/properties/n",
        "unbounded below",
    );
    assert_problem(
        &p,
        tool("t.open"),
        "/inputSchema/properties/n",
        "unbounded above",
    );
    assert_problem(&p, tool("t.pay"), "/gate", "irreversible");
    assert_problem(&p, tool("t.pay"), "/handler/provider", "unknown provider");
    assert_problem(&p, tool("t.pay"), "/reconcile", "unknown tool");
    assert_problem(&p, tool("t.odd"), "/effect", "unknown effect class");
    assert_problem(&p, tool("t.odd"), "/gate", "unknown gate");
    assert_problem(&p, tool("t.odd"), "", "has no role");
    assert_problem(
        &p,
        Subject::Role("reviewer".into()),
        "/tools/0",
        "unknown tool",
    );
    assert!(p.len() >= 10, "{p:#?}");
    let shown = LoadError::Invalid(countersign_core::registry::Problems(p.clone())).to_string();
    assert_eq!(shown.lines().count(), p.len() + 1, "{shown}");
}

// ------------------------------------------------------------------ examples and API

#[test]
fn the_example_registries_load() {
    let finance = example("finance");
    assert_eq!(finance.tools().count(), 16);
    let stillon = example("stillon");
    assert_eq!(stillon.tools().count(), 17);
}

#[test]
fn export_then_load_round_trips() {
    for name in ["finance", "stillon"] {
        let r = example(name);
        let yaml = r.to_yaml().unwrap();
        let again =
            Registry::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("{name}: {e}\n{yaml}"));
        assert_eq!(r, again, "{name}");
        assert!(diff(&r, &again).is_empty());
        // Export is canonical: a second export is byte-identical.
        assert_eq!(again.to_yaml().unwrap(), yaml);
    }
}

#[test]
fn the_seed_short_forms_load_as_their_long_forms() {
    let short = with_tool(&OK_TOOL.replace(
        "handler: {provider: erp, operation: things.get}",
        "handler: erp.things.get\nredact: [iban]",
    ));
    let long = with_tool(&OK_TOOL.replace(
        "handler: {provider: erp, operation: things.get}",
        "handler: {provider: erp, operation: things.get}\nredact: [{field: iban, how: hash}]",
    ));
    assert_eq!(
        Registry::from_yaml_str(&short).unwrap(),
        Registry::from_yaml_str(&long).unwrap()
    );
}

#[test]
fn roles_see_only_their_tools() {
    let r = example("finance");
    let role = |s: &str| RoleName::parse(s).unwrap();
    let names = |role_name: &str| -> Vec<String> {
        r.tools_for_role(&role(role_name))
            .map(|t| t.name.to_string())
            .collect()
    };
    assert_eq!(
        names("worker.comms"),
        vec!["invoice.get", "note.discard", "note.draft"]
    );
    assert_eq!(
        names("worker.vendor_master"),
        vec!["supplier.get", "supplier.update_iban"]
    );
    assert!(names("planner").contains(&"plan.submit".to_string()));
    assert!(!names("planner").contains(&"payment.schedule".to_string()));
    assert!(names("reviewer").contains(&"step.approve".to_string()));
    // The injected-IBAN scenario: the finance worker cannot see the IBAN change at all.
    for role_name in ["planner", "worker.finance", "worker.comms", "reviewer"] {
        assert!(
            !names(role_name).contains(&"supplier.update_iban".to_string()),
            "{role_name}"
        );
        assert!(
            r.tool_for_role(&role(role_name), "supplier.update_iban")
                .is_none()
        );
    }
    // Unknown and unlisted look the same; so do malformed names and unknown roles.
    assert!(
        r.tool_for_role(&role("worker.finance"), "supplier.teleport")
            .is_none()
    );
    assert!(
        r.tool_for_role(&role("worker.finance"), "Payment.Schedule")
            .is_none()
    );
    assert!(r.tool_for_role(&role("nobody"), "invoice.get").is_none());
    assert_eq!(r.tools_for_role(&role("nobody")).count(), 0);
    let pay = r
        .tool_for_role(&role("worker.finance"), "payment.schedule")
        .unwrap();
    assert_eq!(pay.effect, Effect::Irreversible);
    assert_eq!(pay.gate, Gate::Always);
    assert_eq!(pay.approval_expiry().as_secs(), 72 * 3600);
    // The listing and the tools' roles agree.
    for (role_name, tools) in r.listing() {
        for t in tools {
            assert!(r.tool(t).unwrap().roles.contains(role_name));
        }
    }
}

#[test]
fn annotations_follow_the_effect_class() {
    let r = example("finance");
    let get = |n: &str| r.tool(&ToolName::parse(n).unwrap()).unwrap().annotations();
    let read = get("invoice.get");
    assert!(read.read_only_hint && !read.destructive_hint && read.idempotent_hint);
    let write = get("note.draft");
    assert!(!write.read_only_hint && !write.destructive_hint && write.idempotent_hint);
    let pay = get("payment.schedule");
    assert!(!pay.read_only_hint && pay.destructive_hint && pay.idempotent_hint);
    assert!(
        !pay.open_world_hint,
        "the builtin ERP is closed-world, as in seed 000"
    );
    let json = serde_json::to_value(pay).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"readOnlyHint": false, "destructiveHint": true,
                           "idempotentHint": true, "openWorldHint": false})
    );
}

#[test]
fn diff_lists_tool_and_role_changes_readably() {
    let old = example("finance");
    let text = std::fs::read_to_string(example_path("finance"))
        .unwrap()
        .replace(
            "roles: [worker.finance, worker.comms]\n    handler: {provider: erp, operation: notes.discard}",
            "roles: [worker.finance]\n    handler: {provider: erp, operation: notes.discard}",
        )
        .replace("maximum: 50000}\n        currency: {type: string, enum: [EUR]}\n        value_date", "maximum: 60000}\n        currency: {type: string, enum: [EUR]}\n        value_date")
        .replace("    gate: policy\n    roles: [worker.finance]", "    gate: always\n    roles: [worker.finance]");
    let new = Registry::from_yaml_str(&text).unwrap();
    let d = diff(&old, &new);
    let lines = d.lines();
    assert!(
        lines.contains(&"- role worker.comms no longer lists note.discard".to_string()),
        "{d}"
    );
    assert!(
        lines.contains(&"~ tool invoice.hold: gate policy -> always".to_string()),
        "{d}"
    );
    assert!(
        lines.contains(
            &"~ tool payment.schedule: inputSchema /properties/amount/maximum: 50000 -> 60000"
                .to_string()
        ),
        "{d}"
    );
    assert_eq!(lines.len(), 3, "{d}");

    let empty = Registry::from_yaml_str("").unwrap();
    let all = diff(&empty, &old);
    assert!(
        all.lines()
            .contains(&"+ tool payment.schedule (irreversible, gate always)".to_string()),
        "{all}"
    );
    assert!(
        all.lines()
            .contains(&"+ role worker.finance lists payment.schedule".to_string()),
        "{all}"
    );
    let gone = diff(&old, &empty);
    assert!(
        gone.lines()
            .contains(&"- tool payment.schedule".to_string()),
        "{gone}"
    );
}

#[test]
fn garbled_registries_are_refused_without_panic() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let text = std::fs::read_to_string(example_path("finance")).unwrap();
    let lines: Vec<String> = text.lines().map(String::from).collect();
    let n = lines.len();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    // Drop, duplicate or truncate a few lines: the loader answers Ok or a list of problems.
    let edits = proptest::collection::vec((0..n, 0u8..3, 0usize..40), 1..4);
    runner
        .run(&edits, |edits| {
            let mut l = lines.clone();
            for (at, op, cut) in edits {
                let at = at % l.len().max(1);
                match op {
                    0 => {
                        l.remove(at);
                    }
                    1 => {
                        let dup = l[at].clone();
                        l.insert(at, dup);
                    }
                    _ => {
                        let keep: String = l[at].chars().take(cut).collect();
                        l[at] = keep;
                    }
                }
            }
            match Registry::from_yaml_str(&l.join("\n")) {
                Ok(r) => prop_assert!(r.tools().count() > 0),
                Err(LoadError::Invalid(p)) => prop_assert!(!p.0.is_empty()),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
            Ok(())
        })
        .unwrap();
}
