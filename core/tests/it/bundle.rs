//! Bundles: registry + policies + entity schema loaded together. The examples load; every
//! consistency refusal is reported, all at once; read → export → read round-trips.

use std::path::{Path, PathBuf};

use countersign_core::bundle::{Bundle, BundleError, BundleProblem, BundleSources, BundleSubject};
use countersign_core::policy::Decision;

pub fn example_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

pub fn example_sources(name: &str) -> BundleSources {
    BundleSources::read(&example_dir(name)).unwrap()
}

pub fn example_bundle(name: &str) -> Bundle {
    match Bundle::load(example_sources(name)) {
        Ok(b) => b,
        Err(e) => panic!("example {name} does not load:\n{e}"),
    }
}

fn refused(sources: BundleSources) -> Vec<BundleProblem> {
    match Bundle::load(sources) {
        Ok(_) => panic!("expected the bundle to be refused"),
        Err(e) => {
            let shown = e.to_string();
            assert_eq!(shown.lines().count(), e.problems().len() + 1, "{shown}");
            e.problems().to_vec()
        }
    }
}

#[track_caller]
fn assert_problem(
    problems: &[BundleProblem],
    subject: &BundleSubject,
    contains: &str,
) -> BundleProblem {
    match problems
        .iter()
        .find(|p| &p.subject == subject && p.to_string().contains(contains))
    {
        Some(p) => p.clone(),
        None => panic!("no problem about {subject} containing {contains:?} in:\n{problems:#?}"),
    }
}

#[test]
fn the_examples_load_as_bundles() {
    let finance = example_bundle("finance");
    assert!(!finance.registry_only());
    assert!(
        finance
            .policy
            .policy_ids()
            .contains(&"base.listed".to_owned())
    );
    assert!(
        finance
            .cedar_schema()
            .contains("action \"invoice.hold\" appliesTo")
    );
    let stillon = example_bundle("stillon");
    for tool in stillon.registry.tools() {
        assert!(
            stillon
                .cedar_schema()
                .contains(&format!("action \"{}\" appliesTo", tool.name)),
            "{}",
            tool.name
        );
    }
}

#[test]
fn action_args_are_typed_from_the_input_schema() {
    let finance = example_bundle("finance");
    let schema = finance.cedar_schema();
    let decl = |tool: &str| {
        let start = schema.find(&format!("action \"{tool}\"")).unwrap();
        let end = schema[start..].find("};").unwrap();
        schema[start..start + end].to_owned()
    };
    assert!(
        decl("invoice.hold").contains(
            r#""args": { "amount_minor": Long, "currency": String, "invoice_id": String, "reason": String }"#
        ),
        "{}",
        decl("invoice.hold")
    );
    assert!(decl("invoice.hold").contains("resource: [Invoice, Tool]"));
    assert!(
        decl("invoice.search").contains(r#""limit"?: Long"#),
        "{}",
        decl("invoice.search")
    );
    // The per-step `arguments` are left out; arrays are sets; nested objects are records.
    let plan = decl("plan.submit");
    assert!(plan.contains(r#""steps": Set<{ "evidence"?: Set<String>, "observed"?: Set<{ "field": String, "value": String }>, "reason": String, "tool": String }>"#), "{plan}");
    assert!(!plan.contains("arguments"), "{plan}");
    let stillon = example_bundle("stillon");
    assert!(stillon.cedar_schema().contains(r#""reservation_id": Long"#));
}

#[test]
fn a_single_yaml_file_is_a_registry_only_bundle() {
    let sources = BundleSources::read(&example_dir("finance").join("registry.yaml")).unwrap();
    assert_eq!(sources.policies, "");
    assert_eq!(sources.policy_schema, "");
    let bundle = Bundle::load(sources).unwrap();
    assert!(bundle.registry_only());
    assert_eq!(
        bundle.policy.policy_ids(),
        ["registry.gate_policy", "registry.listed"]
    );
    // Minimal entity types for the resource kinds.
    assert!(
        bundle
            .cedar_schema()
            .contains(r#"entity Invoice { "tenant": String, "owner"?: String };"#)
    );
}

fn sources_with(name: &str, edit: impl Fn(&mut BundleSources)) -> BundleSources {
    let mut s = example_sources(name);
    edit(&mut s);
    s
}

#[test]
fn refuses_a_policy_naming_a_tool_the_registry_lacks() {
    let p = refused(sources_with("finance", |s| {
        s.policies.push_str(
            "\n@id(\"finance.credit_note.cap\")\n@rule(\"amount.cap\")\nforbid (principal, action == Action::\"credit_note.issue\", resource);\n",
        );
    }));
    let found = assert_problem(
        &p,
        &BundleSubject::Policy("finance.credit_note.cap".into()),
        "`credit_note.issue`, which is not a tool in the registry",
    );
    assert_eq!(found.source, "policy.cedar");
    assert!(found.path.starts_with("line "), "{found}");
    assert_eq!(p.len(), 1, "{p:#?}");
}

#[test]
fn refuses_a_resource_kind_without_an_entity_type() {
    let p = refused(sources_with("finance", |s| {
        s.policy_schema = s.policy_schema.replace(
            "entity PurchaseOrder { tenant: String, owner?: String, status?: String };",
            "",
        );
    }));
    let found = assert_problem(
        &p,
        &BundleSubject::Tool("po.get".into()),
        "resource kind `purchase_order` has no entity type `PurchaseOrder`",
    );
    assert_eq!(found.path, "/resources/po_id");
    assert_eq!(found.source, "registry.yaml");
}

#[test]
fn refuses_a_policy_that_does_not_type_check_against_generated_args() {
    // `invoice_id` is a String in the registry's schema; comparing it to a Long is an error.
    let p = refused(sources_with("finance", |s| {
        s.policies.push_str(
            "\n@id(\"finance.hold.odd\")\n@rule(\"hold.odd\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen { context.args.invoice_id > 5 };\n",
        );
    }));
    assert_problem(&p, &BundleSubject::Policy("finance.hold.odd".into()), "");
    // An argument the tool does not have.
    let p = refused(sources_with("finance", |s| {
        s.policies.push_str(
            "\n@id(\"finance.hold.typo\")\n@rule(\"hold.typo\")\nforbid (principal, action == Action::\"invoice.hold\", resource)\nwhen { context.args.amount > 5 };\n",
        );
    }));
    assert_problem(
        &p,
        &BundleSubject::Policy("finance.hold.typo".into()),
        "amount",
    );
}

#[test]
fn refuses_actions_and_engine_names_in_the_entity_schema() {
    let p = refused(sources_with("finance", |s| {
        s.policy_schema.push_str("\naction \"invoice.get\";\n");
    }));
    assert_problem(
        &p,
        &BundleSubject::Schema,
        "actions are generated from the registry",
    );
    let p = refused(sources_with("finance", |s| {
        s.policy_schema
            .push_str("\nentity Tool { tenant: String };\n");
    }));
    assert_problem(&p, &BundleSubject::Schema, "declared by Countersign");
}

#[test]
fn refuses_input_schemas_without_a_cedar_type() {
    let p = refused(sources_with("finance", |s| {
        s.registry_yaml = s.registry_yaml.replace(
            "limit: {type: integer, minimum: 1, maximum: 50}",
            "limit: {type: number, minimum: 1, maximum: 50}",
        );
    }));
    let found = assert_problem(
        &p,
        &BundleSubject::Tool("invoice.search".into()),
        "fractional",
    );
    assert_eq!(found.path, "/inputSchema/properties/limit");
    let p = refused(sources_with("finance", |s| {
        s.registry_yaml = s.registry_yaml.replace(
            "        amount: {type: number, exclusiveMinimum: 0, maximum: 50000}\n        currency: {type: string, enum: [EUR]}\n        reason: {type: string, minLength: 20, maxLength: 400}\n\n",
            "        amount: {type: number, exclusiveMinimum: 0, maximum: 50000}\n        currency: {type: string, enum: [EUR, XTS]}\n        reason: {type: string, minLength: 20, maxLength: 400}\n\n",
        );
    }));
    assert_problem(
        &p,
        &BundleSubject::Tool("invoice.hold".into()),
        "\"XTS\" has no known minor unit",
    );
}

#[test]
fn reports_registry_and_policy_problems_together() {
    let p = refused(sources_with("finance", |s| {
        s.registry_yaml = s.registry_yaml.replace(
            "gate: always\n    roles: [worker.finance]",
            "gate: never\n    roles: [worker.finance]",
        );
        s.policies
            .push_str("\n@id(\"no.rule\")\nforbid (principal, action, resource);\n");
        s.policies
            .push_str("\npermit (principal, action, resource);\n");
        s.policy_schema.push_str("\nentity Broken { x: Nope ");
    }));
    let gate = assert_problem(
        &p,
        &BundleSubject::Tool("payment.schedule".into()),
        "irreversible",
    );
    assert_eq!(gate.path, "/gate");
    assert_problem(
        &p,
        &BundleSubject::Policy("no.rule".into()),
        "must name a @rule",
    );
    // A policy without @id is named by Cedar's id for it.
    assert!(
        p.iter()
            .any(|x| matches!(&x.subject, BundleSubject::Policy(_))
                && x.message.contains("missing @id")),
        "{p:#?}"
    );
    assert_problem(&p, &BundleSubject::Schema, "");
    // A syntax error names the file.
    let p = refused(sources_with("stillon", |s| {
        s.policies.push_str("\npermit (")
    }));
    assert!(
        p.iter()
            .any(|x| x.source == "policy.cedar" && x.subject == BundleSubject::File),
        "{p:#?}"
    );
}

#[test]
fn without_the_base_permit_nothing_is_permitted() {
    let bundle = Bundle::load(sources_with("finance", |s| {
        s.policies = s.policies.replace(
            "@id(\"base.listed\")\npermit (principal, action, resource);",
            "",
        );
    }))
    .unwrap();
    let row = crate::policy_tables::rows()
        .into_iter()
        .find(|r| r.name == "planner reads an invoice")
        .unwrap();
    let decision = bundle.policy.decide(&row.request_for(&bundle)).decision;
    assert_eq!(decision, Decision::Deny(countersign_core::Rule::NO_PERMIT));
}

fn temp_dir() -> PathBuf {
    std::env::temp_dir().join(format!("cs-bundle-{}", uuid::Uuid::new_v4()))
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn export_then_read_round_trips() {
    for name in ["finance", "stillon"] {
        let sources = example_sources(name);
        let dir = temp_dir();
        sources.to_files(&dir).unwrap();
        assert_eq!(
            files_in(&dir),
            ["policy.cedar", "policy.cedarschema", "registry.yaml"]
        );
        let back = BundleSources::read(&dir).unwrap();
        assert_eq!(back, sources, "{name}");
        Bundle::load(back).unwrap();
        // Exporting again over the same files is allowed and changes nothing.
        sources.to_files(&dir).unwrap();
        assert_eq!(BundleSources::read(&dir).unwrap(), sources);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn several_files_are_joined_and_exported_back() {
    let finance = example_sources("finance");
    let dir = temp_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let (head, tools) = finance
        .registry_yaml
        .split_at(finance.registry_yaml.find("tools:").unwrap());
    std::fs::write(dir.join("00-base.yaml"), head).unwrap();
    std::fs::write(dir.join("10-tools.yml"), tools).unwrap();
    let (base, rest) = finance.policies.split_at(
        finance
            .policies
            .find("@id(\"finance.hold.above_threshold\")")
            .unwrap(),
    );
    std::fs::write(dir.join("a.cedar"), base).unwrap();
    std::fs::write(dir.join("b.cedar"), rest).unwrap();
    std::fs::write(dir.join("policy.cedarschema"), &finance.policy_schema).unwrap();
    std::fs::write(dir.join("README.md"), "ignored").unwrap();
    let sources = BundleSources::read(&dir).unwrap();
    assert!(
        sources
            .registry_yaml
            .starts_with("# countersign-source: 00-base.yaml\n")
    );
    assert!(
        sources
            .policies
            .contains("// countersign-source: b.cedar\n")
    );
    let bundle = Bundle::load(sources.clone()).unwrap();
    assert_eq!(bundle.registry, example_bundle("finance").registry);

    // A problem names the file it is in.
    let mut broken = sources.clone();
    broken.policies.push_str("\n@id(\"x\")\n@rule(\"a.b\")\nforbid (principal, action == Action::\"nope.nope\", resource);\n");
    let p = refused(broken);
    assert_eq!(
        assert_problem(&p, &BundleSubject::Policy("x".into()), "nope.nope").source,
        "b.cedar"
    );

    let out = temp_dir();
    sources.to_files(&out).unwrap();
    assert_eq!(
        files_in(&out),
        [
            "00-base.yaml",
            "10-tools.yml",
            "a.cedar",
            "b.cedar",
            "policy.cedarschema"
        ]
    );
    assert_eq!(BundleSources::read(&out).unwrap(), sources);

    // Refusals: a file using the reserved source line; exporting over a stray bundle file.
    std::fs::write(out.join("c.cedar"), "// countersign-source: evil.cedar\n").unwrap();
    let err = BundleSources::read(&out).unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
    assert!(matches!(
        sources.to_files(&out),
        Err(BundleError::Invalid(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn reading_refuses_what_is_not_a_bundle() {
    let dir = temp_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.cedar"), "").unwrap();
    let err = BundleSources::read(&dir).unwrap_err();
    assert!(err.to_string().contains("no registry"), "{err}");
    let err = BundleSources::read(&dir.join("policy.cedar")).unwrap_err();
    assert!(err.to_string().contains("single .yaml"), "{err}");
    assert!(matches!(
        BundleSources::read(&dir.join("missing")),
        Err(BundleError::Io { .. })
    ));
    // Exported names must be plain file names of their kind.
    let sneaky = BundleSources {
        registry_yaml: "# countersign-source: ../escape.yaml\n".into(),
        ..BundleSources::default()
    };
    assert!(matches!(
        sneaky.to_files(&dir.join("out")),
        Err(BundleError::Invalid(_))
    ));
    assert!(!dir.join("escape.yaml").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
