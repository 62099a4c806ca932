//! RFC 8785 canonical JSON: the RFC's published examples, and invariance properties.

use countersign_core::canonical::{CanonicalError, canonicalize, cmp_utf16};
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

fn canon_text(text: &str) -> String {
    canonicalize(&serde_json::from_str(text).unwrap()).unwrap()
}

/// RFC 8785 §3.2.2 input and §3.2.3 expected output.
#[test]
fn rfc8785_sample_object() {
    let input = r#"{
        "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
        "literals": [null, true, false]
    }"#;
    let expected = concat!(
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"#,
        "\"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
    );
    assert_eq!(canon_text(input), expected);
}

/// RFC 8785 §3.2.3: member names sorted by UTF-16 code units.
#[test]
fn rfc8785_unicode_key_sorting() {
    let input = r#"{
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\ud83d\ude00": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis"
    }"#;
    let out = canon_text(input);
    let value: Map<String, Value> = serde_json::from_str(&out).unwrap();
    let order: Vec<&str> = value.values().filter_map(Value::as_str).collect();
    // serde_json (preserve_order in this tree) keeps the canonical member order on re-parse;
    // check it directly on the text as well.
    let expected = [
        "Carriage Return",
        "One",
        "Control",
        "Latin Small Letter O With Diaeresis",
        "Euro Sign",
        "Emoji: Grinning Face",
        "Hebrew Letter Dalet With Dagesh",
    ];
    let mut last = 0;
    for name in expected {
        let at = out.find(name).unwrap();
        assert!(at >= last, "{name} out of order in {out}");
        last = at;
    }
    assert_eq!(order.len(), 7);
    // UTF-16 order differs from code-point order for astral vs high-BMP characters.
    assert_eq!(cmp_utf16("\u{1f600}", "\u{fb33}"), std::cmp::Ordering::Less);
    assert!("\u{1f600}" > "\u{fb33}");
}

/// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
#[test]
fn rfc8785_appendix_b_numbers() {
    let table = [
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ];
    for (bits, expected) in table {
        let f = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
        let value = Value::Number(Number::from_f64(f).unwrap());
        assert_eq!(canonicalize(&value).unwrap(), expected, "bits {bits}");
    }
    // NaN and Infinity (7fffffffffffffff, 7ff0000000000000) cannot be held by serde_json at
    // all; the RFC requires them to be refused, which is the case by construction.
    assert!(Number::from_f64(f64::NAN).is_none());
    assert!(Number::from_f64(f64::INFINITY).is_none());
}

#[test]
fn no_whitespace_and_nested_sorting() {
    let out = canon_text(r#" { "b" : [ 1 , { "z" : 1 , "a" : 2 } ] , "a" : "x" } "#);
    assert_eq!(out, r#"{"a":"x","b":[1,{"a":2,"z":1}]}"#);
}

#[test]
fn integers_whose_digits_jcs_would_change_are_refused() {
    let value = json!({"invoice_id": 9_007_199_254_740_993_u64});
    assert_eq!(
        canonicalize(&value),
        Err(CanonicalError::UnsafeInteger("9007199254740993".into()))
    );
    assert_eq!(
        canonicalize(&json!(9_007_199_254_740_991_u64)).unwrap(),
        "9007199254740991"
    );
    // A large double and its JCS digits are the same number and canonicalise alike.
    assert_eq!(
        canon_text("[1e20, 100000000000000000000]"),
        "[100000000000000000000,100000000000000000000]"
    );
    assert_eq!(
        canon_text("[295147905179352830000]"),
        "[295147905179352830000]"
    );
}

/// Any JSON value, numbers restricted to what has a canonical form.
fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(|i| json!(i)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Value::Number(Number::from_f64(f).unwrap())),
        "\\PC{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Rebuilds every object with its members in reverse order.
fn reversed(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut pairs: Vec<(String, Value)> =
                map.iter().map(|(k, v)| (k.clone(), reversed(v))).collect();
            pairs.reverse();
            Value::Object(pairs.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        other => other.clone(),
    }
}

proptest! {
    #[test]
    fn member_order_does_not_matter(value in arb_value()) {
        prop_assert_eq!(canonicalize(&value).unwrap(), canonicalize(&reversed(&value)).unwrap());
    }

    #[test]
    fn canonical_text_is_a_fixed_point(value in arb_value()) {
        let once = canonicalize(&value).unwrap();
        let again = canonicalize(&serde_json::from_str(&once).unwrap()).unwrap();
        prop_assert_eq!(once, again);
    }

    #[test]
    fn number_spelling_does_not_matter(i in -1_000_000i64..1_000_000) {
        let spellings = [
            format!("{i}"),
            format!("{i}.0"),
            format!("{i}.000"),
            format!("{i}e0"),
            format!("{i}E+0"),
            format!("{}e1", i as f64 / 10.0),
            format!("{}0e-1", i),
        ];
        let expected = i.to_string();
        for s in spellings {
            let text = format!(r#"{{"amount":{s}}}"#);
            prop_assert_eq!(canon_text(&text), format!(r#"{{"amount":{expected}}}"#), "{}", s);
        }
    }

    #[test]
    fn decimal_spelling_does_not_matter(cents in 0u32..10_000_000) {
        let plain = format!("{}.{:02}", cents / 100, cents % 100);
        let padded = format!("{plain}000");
        let exp = format!("{}e-2", cents);
        let a = canon_text(&format!("[{plain}]"));
        prop_assert_eq!(&a, &canon_text(&format!("[{padded}]")));
        prop_assert_eq!(&a, &canon_text(&format!("[{exp}]")));
    }
}

/// The slow definition the fast check must agree with.
fn is_canonical_slow(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| canonicalize(&v).ok())
        .is_some_and(|c| c == text)
}

/// Spellings the one-pass check must tell apart exactly as the slow definition does.
#[test]
fn check_canonical_agrees_on_known_spellings() {
    use countersign_core::canonical::check_canonical;
    for text in [
        r#"{"a":1,"b":2}"#,
        r#"{"b":1,"a":2}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"a": 1}"#,
        r#"{"a":1.0}"#,
        r#"{"a":1.5}"#,
        r#"{"a":-0}"#,
        r#"{"a":0}"#,
        r#"{"a":01}"#,
        r#"{"a":1e21}"#,
        r#"{"a":1e+21}"#,
        r#"{"a":9007199254740993}"#,
        r#"{"a":9007199254740992}"#,
        r#"{"a":"\u001f"}"#,
        r#"{"a":"\u001F"}"#,
        r#"{"a":"\u000a"}"#,
        r#"{"a":"\n"}"#,
        r#"{"a":"\/"}"#,
        r#"{"a":"\u0041"}"#,
        "{\"a\":\"\u{7f}\"}",
        "{\"\u{20ac}\":1,\"\u{1f600}\":2}",
        "{\"\u{1f600}\":1,\"\u{20ac}\":2}",
        "{\"\u{fb33}\":1,\"\u{1f600}\":2}",
        "{\"\u{1f600}\":1,\"\u{fb33}\":2}",
        r#"[1,2,]"#,
        r#"[true,false,null]"#,
        r#"{}x"#,
        r#""#,
        r#"nul"#,
        r#"{"a":[{"b":[]}]}"#,
    ] {
        assert_eq!(
            check_canonical(text).is_ok(),
            is_canonical_slow(text),
            "{text}"
        );
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(check_canonical(&deep).is_err());
}

proptest! {
    #[test]
    fn check_canonical_accepts_every_canonical_text(value in arb_value()) {
        let text = canonicalize(&value).unwrap();
        prop_assert!(countersign_core::canonical::check_canonical(&text).is_ok(), "{}", text);
    }

    /// One byte changed, removed or inserted anywhere: the fast check and the slow definition
    /// still agree.
    #[test]
    fn check_canonical_agrees_with_the_slow_definition(
        value in arb_value(),
        pos in any::<prop::sample::Index>(),
        byte in prop::sample::select(b" \t\",:{}[]0123456789-+.eEabfnrtu\\\x01\x7f".to_vec()),
        op in 0u8..3,
    ) {
        let text = canonicalize(&value).unwrap();
        let mut bytes = text.into_bytes();
        let i = pos.index(bytes.len() + 1);
        match op {
            0 if i < bytes.len() => bytes[i] = byte,
            1 if i < bytes.len() => { bytes.remove(i); }
            _ => bytes.insert(i, byte),
        }
        if let Ok(mutated) = String::from_utf8(bytes) {
            prop_assert_eq!(
                countersign_core::canonical::check_canonical(&mutated).is_ok(),
                is_canonical_slow(&mutated),
                "{}", mutated
            );
        }
    }
}

/// The special-byte masks cover 64-byte blocks, 16 blocks at a time: a quote, backslash,
/// escape or control byte at every offset of strings that start, cross or end on a block or
/// window boundary (names and values, with texts longer than one window) is judged exactly
/// as the slow definition judges it.
#[test]
fn check_canonical_agrees_across_block_boundaries() {
    use countersign_core::canonical::{check_canonical, scan_canonical_object};
    let specials: [&str; 9] = [
        "\"", "\\", "\\\\", "\\\"", "\\n", "\\u001f", "\u{1}", "\u{1f}", "é",
    ];
    for lead in [0usize, 1, 7, 50, 57, 62, 63, 64, 1000, 1020] {
        for len in [0usize, 1, 5, 63, 64, 65, 130] {
            for at in (0..=len).step_by(if len > 64 { 7 } else { 1 }) {
                for special in specials {
                    let mut content = "x".repeat(len);
                    content.insert_str(at, special);
                    let pad = "p".repeat(lead);
                    for text in [
                        format!("{{\"a\":\"{pad}\",\"b\":\"{content}\",\"c\":1}}"),
                        format!("{{\"a{pad}\":0,\"b{content}\":[\"{content}\"]}}"),
                    ] {
                        let slow = is_canonical_slow(&text);
                        assert_eq!(check_canonical(&text).is_ok(), slow, "{text:?}");
                        assert_eq!(
                            scan_canonical_object(&text, |_, _| {}).is_ok(),
                            slow,
                            "{text:?}"
                        );
                    }
                }
            }
        }
    }
}

/// `scan_canonical_object` hands every top-level member's raw name and value to the caller,
/// in order, and none of a nested object's.
#[test]
fn scan_canonical_object_reports_top_level_members_as_written() {
    use countersign_core::canonical::scan_canonical_object;
    let text = r#"{"a":"x\"y","b":{"c":1,"d":[2]},"e":-1.5,"f":null}"#;
    let mut seen = Vec::new();
    scan_canonical_object(text, |name, raw| seen.push((name, raw))).unwrap();
    assert_eq!(
        seen,
        [
            ("a", r#""x\"y""#),
            ("b", r#"{"c":1,"d":[2]}"#),
            ("e", "-1.5"),
            ("f", "null")
        ]
    );
}
