//! Redaction for audit copies and role-restricted results.

use countersign_core::Secret;
use countersign_core::redact::{
    FieldSelector, HASH_PREFIX, How, KeyId, RedactError, RedactRule, RedactionKey, redact,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn key(id: &str, byte: u8) -> RedactionKey {
    RedactionKey::new(KeyId::parse(id).unwrap(), Secret::new(vec![byte; 32])).unwrap()
}

fn rule(field: &str, how: How) -> RedactRule {
    RedactRule {
        field: FieldSelector::parse(field).unwrap(),
        how,
    }
}

fn invoice() -> Value {
    json!({
        "invoice_id": "INV-20260611",
        "amount": 4180.00,
        "supplier": {
            "name": "Acme GmbH",
            "iban": "DE89370400440532013000",
            "contact_email": "ap@acme.example"
        },
        "lines": [
            {"sku": "A-1", "iban": "DE02120300000000202051"},
            {"sku": "B-2", "iban": "DE89370400440532013000"}
        ]
    })
}

#[test]
fn hash_by_name_at_any_depth_and_equal_values_compare_equal() {
    let out = redact(&invoice(), &[rule("iban", How::Hash)], &key("k1", 7)).unwrap();
    let s = &out.value["supplier"]["iban"];
    let l0 = &out.value["lines"][0]["iban"];
    let l1 = &out.value["lines"][1]["iban"];
    assert!(s.as_str().unwrap().starts_with("hmac-sha256:"));
    assert_eq!(s.as_str().unwrap().len(), "hmac-sha256:".len() + 64);
    // Same IBAN twice → same digest; different IBAN → different digest.
    assert_eq!(s, l1);
    assert_ne!(s, l0);
    let paths: Vec<&str> = out.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["lines[0].iban", "lines[1].iban", "supplier.iban"]);
    assert!(out.paths.iter().all(|p| p.how == How::Hash));
    assert_eq!(out.key_id.as_str(), "k1");
    // Untouched fields are as they were.
    assert_eq!(out.value["supplier"]["name"], "Acme GmbH");
    assert_eq!(out.value["supplier"]["contact_email"], "ap@acme.example");
    assert_eq!(out.value["amount"], json!(4180.0));
    assert_eq!(out.value["lines"][0]["sku"], "A-1");
}

#[test]
fn a_different_key_gives_a_different_digest() {
    let rules = [rule("iban", How::Hash)];
    let a = redact(&invoice(), &rules, &key("k1", 7)).unwrap();
    let b = redact(&invoice(), &rules, &key("k2", 8)).unwrap();
    assert_ne!(a.value["supplier"]["iban"], b.value["supplier"]["iban"]);
    assert_eq!(b.key_id.as_str(), "k2");
    // Same key material, same digest, whatever the id.
    let c = redact(&invoice(), &rules, &key("k3", 7)).unwrap();
    assert_eq!(a.value["supplier"]["iban"], c.value["supplier"]["iban"]);
}

#[test]
fn digest_is_over_canonical_json() {
    let k = key("k1", 1);
    assert_eq!(
        k.digest(&json!({"a": 1.0, "b": "x"})).unwrap(),
        k.digest(&serde_json::from_str(r#"{"b":"x","a":1}"#).unwrap())
            .unwrap()
    );
    assert_ne!(k.digest(&json!("1")).unwrap(), k.digest(&json!(1)).unwrap());
}

#[test]
fn dotted_path_matches_only_from_the_root() {
    let out = redact(
        &invoice(),
        &[rule("supplier.iban", How::Hash)],
        &key("k1", 7),
    )
    .unwrap();
    assert!(
        out.value["supplier"]["iban"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:")
    );
    assert_eq!(out.value["lines"][0]["iban"], "DE02120300000000202051");
    assert_eq!(out.paths.len(), 1);
}

#[test]
fn array_paths_are_transparent() {
    let out = redact(&invoice(), &[rule("lines.iban", How::Drop)], &key("k1", 7)).unwrap();
    assert!(out.value["lines"][0].get("iban").is_none());
    assert!(out.value["lines"][1].get("iban").is_none());
    assert_eq!(out.value["lines"][1]["sku"], "B-2");
    assert_eq!(out.value["supplier"]["iban"], "DE89370400440532013000");
    let paths: Vec<&str> = out.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["lines[0].iban", "lines[1].iban"]);
}

#[test]
fn drop_removes_and_wins_over_hash() {
    let out = redact(
        &invoice(),
        &[
            rule("contact_email", How::Hash),
            rule("supplier.contact_email", How::Drop),
        ],
        &key("k1", 7),
    )
    .unwrap();
    assert!(out.value["supplier"].get("contact_email").is_none());
    assert_eq!(out.paths.len(), 1);
    assert_eq!(out.paths[0].how, How::Drop);
}

#[test]
fn a_matched_object_is_hidden_whole() {
    let out = redact(&invoice(), &[rule("supplier", How::Hash)], &key("k1", 7)).unwrap();
    assert!(
        out.value["supplier"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:")
    );
    let text = out.value["supplier"].to_string();
    assert!(!text.contains("DE8937") && !text.contains("Acme"));
    assert_eq!(out.paths.len(), 1);
    assert_eq!(out.paths[0].path, "supplier");
}

#[test]
fn nothing_matches_nothing_changes() {
    let v = invoice();
    let out = redact(
        &v,
        &[rule("password", How::Drop), rule("a.b.c", How::Hash)],
        &key("k1", 7),
    )
    .unwrap();
    assert_eq!(out.value, v);
    assert!(out.paths.is_empty());
}

#[test]
fn refuses_weak_keys_bad_ids_bad_fields_and_unhashable_values() {
    assert_eq!(
        RedactionKey::new(KeyId::parse("k").unwrap(), Secret::new(vec![1; 31])).unwrap_err(),
        RedactError::KeyTooShort
    );
    assert!(KeyId::parse("").is_err());
    assert!(KeyId::parse("k 1").is_err());
    assert!(FieldSelector::parse("").is_err());
    assert!(FieldSelector::parse("a..b").is_err());
    assert!(FieldSelector::parse(".a").is_err());
    let err = redact(
        &json!({"x": {"iban": 9_007_199_254_740_993_u64}}),
        &[rule("iban", How::Hash)],
        &key("k1", 7),
    )
    .unwrap_err();
    assert!(matches!(err, RedactError::Canonical { ref path, .. } if path == "x.iban"));
}

#[test]
fn rules_read_from_registry_shaped_json() {
    let rules: Vec<RedactRule> = serde_json::from_value(json!([
        {"field": "iban", "how": "hash"},
        {"field": "supplier.contact_email", "how": "drop"}
    ]))
    .unwrap();
    assert_eq!(rules[0].field, FieldSelector::Name("iban".into()));
    assert_eq!(
        rules[1].field,
        FieldSelector::Path(vec!["supplier".into(), "contact_email".into()])
    );
    assert!(serde_json::from_value::<RedactRule>(json!({"field": "a.", "how": "hash"})).is_err());
    assert!(serde_json::from_value::<RedactRule>(json!({"field": "a", "how": "mask"})).is_err());
    assert!(!format!("{:?}", key("k1", 7)).contains("7, 7"));
}

proptest! {
    /// Whatever the secret and wherever it sits, it never appears in the output.
    #[test]
    fn the_original_never_appears(
        secret in "[G-Z]{8,24}",
        depth in 0usize..4,
        in_array in any::<bool>(),
        how in prop_oneof![Just(How::Hash), Just(How::Drop)],
        noise in prop::collection::btree_map("[a-f]{1,6}", "[a-f]{0,10}", 0..4),
    ) {
        let mut v = json!({"iban": secret.clone()});
        for (k, n) in &noise {
            v[k.as_str()] = json!(n);
        }
        for level in 0..depth {
            v = if in_array && level % 2 == 0 {
                json!({"items": [v.clone(), {"other": "x"}]})
            } else {
                json!({"nested": v})
            };
        }
        let out = redact(&v, &[rule("iban", how)], &key("k1", 9)).unwrap();
        let text = serde_json::to_string(&out).unwrap();
        prop_assert!(!text.contains(&secret));
        prop_assert_eq!(out.paths.len(), 1);
    }
}

#[test]
fn the_key_for_agents_is_derived_stable_and_never_shows_the_audits_digest() {
    let audit = key("rk-a", 7);
    let shown = audit.for_agents().unwrap();
    let iban = serde_json::json!("DE89370400440532013000");
    let stored = audit.digest(&iban).unwrap();
    let seen = shown.digest(&iban).unwrap();
    assert_ne!(stored, seen, "the agent never sees the audit's own digest");
    assert!(!stored.contains(&seen[HASH_PREFIX.len()..HASH_PREFIX.len() + 32]));
    // Stable for as long as the key is, different for another key.
    assert_eq!(audit.for_agents().unwrap().digest(&iban).unwrap(), seen);
    let other = key("rk-b", 8).for_agents().unwrap();
    assert_ne!(other.digest(&iban).unwrap(), seen);
}
