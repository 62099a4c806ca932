//! Inputs hashes and idempotency keys.

use countersign_core::canonical::CanonicalJson;
use countersign_core::keys::{DigestParseError, IdemKey, InputsHash};
use proptest::prelude::*;
use serde_json::{Value, json};

fn canon(text: &str) -> CanonicalJson {
    CanonicalJson::from_value(&serde_json::from_str::<Value>(text).unwrap()).unwrap()
}

fn payment(amount: &str) -> CanonicalJson {
    canon(&format!(
        r#"{{"invoice_id":"INV-20260611","amount":{amount},"currency":"EUR","value_date":"2026-06-15","reason":"Invoice approved by AP, due in 4 days"}}"#
    ))
}

#[test]
fn inputs_hash_is_sha256_of_the_canonical_bytes() {
    // sha256("{}") — a fixed vector anyone can recompute.
    let h = InputsHash::of(&canon("{ }"));
    assert_eq!(
        h.to_string(),
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
}

#[test]
fn framing_is_unambiguous() {
    let inputs = canon("{}");
    assert_ne!(
        IdemKey::derive("ab", 1, &inputs),
        IdemKey::derive("a", 1, &inputs)
    );
    // Shifting bytes between run id and inputs must change the key.
    let a = IdemKey::derive("run-1", 7, &canon(r#""x""#));
    let b = IdemKey::derive("run-1\"", 7, &canon(r#""""#));
    assert_ne!(a, b);
    // ("ab","c") vs ("a","bc") as run id / inputs text.
    let ab_c = IdemKey::derive("ab", 0, &canon(r#""c""#));
    let a_bc = IdemKey::derive("a", 0, &canon(r#""bc""#));
    assert_ne!(ab_c, a_bc);
    // seq is a fixed-width field: it cannot be confused with run id bytes.
    assert_ne!(
        IdemKey::derive("run1", 2, &inputs),
        IdemKey::derive("run12", 0, &inputs)
    );
}

#[test]
fn member_order_and_number_spelling_give_the_same_key() {
    let a = payment("4180.00");
    let b = canon(
        r#"{"reason":"Invoice approved by AP, due in 4 days","value_date":"2026-06-15","currency":"EUR","amount":4.18e3,"invoice_id":"INV-20260611"}"#,
    );
    assert_eq!(a, b);
    assert_eq!(
        IdemKey::derive("run-9", 3, &a),
        IdemKey::derive("run-9", 3, &b)
    );
    assert_eq!(InputsHash::of(&a), InputsHash::of(&b));
}

#[test]
fn one_cent_changes_the_key_and_the_hash() {
    let a = payment("4180.00");
    let b = payment("4180.01");
    assert_ne!(IdemKey::derive("r", 1, &a), IdemKey::derive("r", 1, &b));
    assert_ne!(InputsHash::of(&a), InputsHash::of(&b));
}

#[test]
fn run_and_seq_are_part_of_the_key() {
    let a = payment("10");
    let k = IdemKey::derive("run-1", 1, &a);
    assert_ne!(k, IdemKey::derive("run-2", 1, &a));
    assert_ne!(k, IdemKey::derive("run-1", 2, &a));
    // Pure function: the same three fields always give the same key; a client-supplied
    // `idempotency_key` argument is just another input member, not the key.
    assert_eq!(k, IdemKey::derive("run-1", 1, &a));
    let with_client_key = canon(
        r#"{"invoice_id":"INV-20260611","amount":10,"currency":"EUR","value_date":"2026-06-15","reason":"Invoice approved by AP, due in 4 days","idempotency_key":"idem:00"}"#,
    );
    assert_ne!(k, IdemKey::derive("run-1", 1, &with_client_key));
}

#[test]
fn text_round_trips_and_malformed_text_is_refused() {
    let k = IdemKey::derive("run-1", 1, &payment("1"));
    let text = k.to_string();
    assert!(text.starts_with("idem:"));
    assert_eq!(text.len(), 5 + 64);
    assert_eq!(text.parse::<IdemKey>().unwrap(), k);
    let h = InputsHash::of(&payment("1"));
    assert_eq!(h.to_string().parse::<InputsHash>().unwrap(), h);

    let hex64 = "a".repeat(64);
    assert_eq!(
        format!("sha256:{hex64}").parse::<IdemKey>(),
        Err(DigestParseError::Prefix("idem:"))
    );
    assert_eq!(
        format!("idem:{hex64}").parse::<InputsHash>(),
        Err(DigestParseError::Prefix("sha256:"))
    );
    assert_eq!(
        format!("idem:{}", "a".repeat(63)).parse::<IdemKey>(),
        Err(DigestParseError::Length(63))
    );
    assert_eq!(
        format!("idem:{}", "A".repeat(64)).parse::<IdemKey>(),
        Err(DigestParseError::NotHex)
    );
    assert_eq!(
        format!("idem:{}g", "a".repeat(63)).parse::<IdemKey>(),
        Err(DigestParseError::NotHex)
    );
    assert!(format!(" idem:{hex64}").parse::<IdemKey>().is_err());
    assert!(format!("idem:{hex64} ").parse::<IdemKey>().is_err());
}

#[test]
fn serde_uses_the_text_form() {
    let k = IdemKey::derive("run-1", 1, &payment("1"));
    let json = serde_json::to_value(k).unwrap();
    assert_eq!(json, json!(k.to_string()));
    assert_eq!(serde_json::from_value::<IdemKey>(json).unwrap(), k);
    assert!(serde_json::from_value::<IdemKey>(json!("idem:xyz")).is_err());
    let h = InputsHash::of(&payment("1"));
    assert_eq!(
        serde_json::from_value::<InputsHash>(serde_json::to_value(h).unwrap()).unwrap(),
        h
    );
}

proptest! {
    #[test]
    fn distinct_splits_never_collide(s in "[a-z]{2,12}", cut in 1usize..11) {
        let cut = cut.min(s.len() - 1);
        let (left, right) = s.split_at(cut);
        // The same bytes split differently between run id and an inputs string.
        let k1 = IdemKey::derive(left, 0, &CanonicalJson::from_value(&json!(right)).unwrap());
        let k2 = IdemKey::derive(&s, 0, &CanonicalJson::from_value(&json!("")).unwrap());
        prop_assert_ne!(k1, k2);
    }

    #[test]
    fn text_form_round_trips(run in "\\PC{0,20}", seq in any::<u64>()) {
        let k = IdemKey::derive(&run, seq, &CanonicalJson::from_value(&json!({"a": 1})).unwrap());
        prop_assert_eq!(k.to_string().parse::<IdemKey>().unwrap(), k);
    }
}
