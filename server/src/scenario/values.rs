//! Values in a scenario: `${name}` substitution from what earlier replies saved, and how an
//! expected value is compared with an actual one.

use std::collections::BTreeMap;

use serde_json::Value;

use super::script::ReplyCheck;

/// Substitutes `${var}` in every string of `v`.
pub(super) fn subst(v: &Value, vars: &BTreeMap<String, Value>) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
                && !name.contains("${")
            {
                return vars
                    .get(name)
                    .cloned()
                    .ok_or_else(|| format!("unknown variable {name}"));
            }
            Value::String(subst_str(s, vars)?)
        }
        Value::Array(a) => {
            Value::Array(a.iter().map(|x| subst(x, vars)).collect::<Result<_, _>>()?)
        }
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), subst(x, vars)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

pub(super) fn subst_str(s: &str, vars: &BTreeMap<String, Value>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s}"))?;
        let name = &after[..end];
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable {name}"))?;
        match value {
            Value::String(t) => out.push_str(t),
            other => out.push_str(&other.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Numbers compare by value (4180 == 4180.0).
pub(super) fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    }
}

/// Applies `check`'s pointer checks to `v`; the first failure.
pub(super) fn check_value(
    check: &ReplyCheck,
    v: &Value,
    vars: &BTreeMap<String, Value>,
) -> Result<(), String> {
    for (ptr, want) in &check.equal {
        let want = subst(want, vars)?;
        match v.pointer(ptr) {
            Some(got) if same(got, &want) => {}
            got => return Err(format!("{ptr}: wanted {want}, got {got:?}")),
        }
    }
    for (ptr, unwanted) in &check.not_equal {
        let unwanted = subst(unwanted, vars)?;
        if v.pointer(ptr).is_some_and(|got| same(got, &unwanted)) {
            return Err(format!("{ptr}: must not be {unwanted}"));
        }
    }
    for (ptr, p) in &check.prefix {
        let p = subst_str(p, vars)?;
        match v.pointer(ptr).and_then(Value::as_str) {
            Some(got) if got.starts_with(&p) => {}
            got => return Err(format!("{ptr}: wanted prefix {p:?}, got {got:?}")),
        }
    }
    for (ptr, p) in &check.contains {
        let p = subst_str(p, vars)?;
        match v.pointer(ptr).and_then(Value::as_str) {
            Some(got) if got.contains(&p) => {}
            got => return Err(format!("{ptr}: wanted to contain {p:?}, got {got:?}")),
        }
    }
    for ptr in &check.present {
        if v.pointer(ptr).is_none_or(Value::is_null) {
            return Err(format!("{ptr}: missing"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::subst;

    #[test]
    fn variables_keep_their_type_when_whole_and_interpolate_otherwise() {
        let mut vars = BTreeMap::new();
        vars.insert("amount".to_string(), json!(4180.0));
        vars.insert("id".to_string(), json!("INV-1"));
        let v = subst(&json!({"a": "${amount}", "b": "on ${id}"}), &vars).unwrap();
        assert_eq!(v, json!({"a": 4180.0, "b": "on INV-1"}));
        assert!(subst(&json!("${nope}"), &vars).is_err());
    }
}
