//! Edits of a bundle's texts that Countersign drafts itself (issue 33): a shadow rule enforced
//! (its `@shadow` removed), enforced rules demoted to shadow (`@shadow` added), a tool's
//! planned steps sent to the model reviewer (`review: required`).
//!
//! Invariants (fail closed):
//! * The result loads as a bundle and differs from the input exactly as asked: the same policy
//!   ids, the shadow set changed by exactly the named ids (or the one tool's review flag);
//!   anything else — an id not found once, text the edit cannot place — is refused.
//! * An edit only drafts: it is filed as a proposal that a second admin approves.

use std::collections::BTreeSet;

use super::{Bundle, BundleSources};

fn load(sources: &BundleSources) -> Result<Bundle, String> {
    Bundle::load(sources.clone()).map_err(|e| e.one_line())
}

fn shadow_ids(bundle: &Bundle) -> BTreeSet<String> {
    bundle
        .policy
        .shadow_rules()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// Where policy `id`'s `@id("…")` annotation is, if it appears exactly once.
fn id_at(text: &str, id: &str) -> Result<usize, String> {
    let needle = format!("@id(\"{id}\")");
    let mut found = text.match_indices(&needle).map(|(i, _)| i);
    match (found.next(), found.next()) {
        (Some(at), None) => Ok(at),
        (None, _) => Err(format!(
            "policy {id:?} is not written as {needle} in the policies"
        )),
        (Some(_), Some(_)) => Err(format!("{needle} appears more than once in the policies")),
    }
}

/// The policy texts with `@shadow` added before each of `ids`' `@id`.
fn demoted(text: &str, ids: &[String]) -> Result<String, String> {
    let mut at: Vec<usize> = ids
        .iter()
        .map(|id| id_at(text, id))
        .collect::<Result<_, _>>()?;
    at.sort_unstable();
    let mut out = text.to_string();
    for i in at.into_iter().rev() {
        out.insert_str(i, "@shadow\n");
    }
    Ok(out)
}

/// The policy texts with the `@shadow` annotation of policy `id` removed: the annotations
/// between the end of the previous policy (`;`) and this policy's effect keyword.
fn promoted(text: &str, id: &str) -> Result<String, String> {
    let at = id_at(text, id)?;
    let start = text
        .get(..at)
        .and_then(|t| t.rfind(';'))
        .map_or(0, |i| i + 1);
    let rest = text.get(at..).unwrap_or_default();
    let end = ["permit", "forbid"]
        .iter()
        .filter_map(|k| rest.find(k))
        .min()
        .map(|i| at + i)
        .ok_or_else(|| format!("policy {id:?} has no effect after its @id"))?;
    let block = text.get(start..end).unwrap_or_default();
    // The annotation, not a mention of it in a `//` comment.
    let mut offset = 0;
    let mut found = None;
    for line in block.split_inclusive('\n') {
        let code = line.split("//").next().unwrap_or_default();
        if let Some(i) = code.find("@shadow") {
            found = Some(offset + i);
            break;
        }
        offset += line.len();
    }
    let Some(s) = found else {
        return Err(format!("policy {id:?} is not marked @shadow"));
    };
    let mut cut = s + "@shadow".len();
    let after = block.get(cut..).unwrap_or_default();
    if after.trim_start().starts_with('(') {
        let close = after
            .find(')')
            .ok_or_else(|| format!("policy {id:?}: an unclosed @shadow(…)"))?;
        cut += close + 1;
    }
    // The rest of its line, when nothing else is on it.
    let tail = block.get(cut..).unwrap_or_default();
    if let Some(nl) = tail.find('\n')
        && tail.get(..nl).is_some_and(|t| t.trim().is_empty())
    {
        cut += nl + 1;
    }
    let mut out = String::with_capacity(text.len());
    out.push_str(text.get(..start + s).unwrap_or_default());
    out.push_str(text.get(start + cut..).unwrap_or_default());
    Ok(out)
}

/// `sources` with shadow rule `id` enforced.
pub fn enforce_shadow(sources: &BundleSources, id: &str) -> Result<BundleSources, String> {
    let before = load(sources)?;
    let mut want = shadow_ids(&before);
    if !want.remove(id) {
        return Err(format!("{id:?} is not a shadow rule"));
    }
    let edited = BundleSources {
        policies: promoted(&sources.policies, id)?,
        ..sources.clone()
    };
    checked(&before, edited, &want)
}

/// `sources` with the enforced policies `ids` demoted to shadow rules.
pub fn demote_to_shadow(sources: &BundleSources, ids: &[String]) -> Result<BundleSources, String> {
    let before = load(sources)?;
    let mut want = shadow_ids(&before);
    for id in ids {
        if !want.insert(id.clone()) {
            return Err(format!("{id:?} is a shadow rule already"));
        }
    }
    let edited = BundleSources {
        policies: demoted(&sources.policies, ids)?,
        ..sources.clone()
    };
    checked(&before, edited, &want)
}

fn checked(
    before: &Bundle,
    edited: BundleSources,
    want: &BTreeSet<String>,
) -> Result<BundleSources, String> {
    let after = load(&edited)?;
    if after.policy.policy_ids() != before.policy.policy_ids() || shadow_ids(&after) != *want {
        return Err("the edit did not change exactly the rules named".into());
    }
    Ok(edited)
}

/// `sources` with `tool`'s planned steps waiting for the model reviewer (`review: required`),
/// the registry written in its export form.
pub fn require_review(sources: &BundleSources, tool: &str) -> Result<BundleSources, String> {
    let before = load(sources)?;
    let name = crate::registry::ToolName::parse(tool).map_err(|e| e.to_string())?;
    let current = before
        .registry
        .tool(&name)
        .ok_or_else(|| format!("there is no tool {tool:?}"))?;
    if current.review_required {
        return Ok(sources.clone());
    }
    let yaml = before.registry.to_yaml().map_err(|e| e.to_string())?;
    let mut doc: serde_norway::Value =
        serde_norway::from_str(&yaml).map_err(|e| format!("re-reading the export: {e}"))?;
    let map = doc
        .get_mut("tools")
        .and_then(|t| t.get_mut(tool))
        .and_then(serde_norway::Value::as_mapping_mut)
        .ok_or_else(|| format!("the export has no tool {tool}"))?;
    map.insert("review".into(), "required".into());
    let edited = BundleSources {
        registry_yaml: serde_norway::to_string(&doc).map_err(|e| e.to_string())?,
        ..sources.clone()
    };
    let after = load(&edited)?;
    if !after
        .registry
        .tool(&name)
        .is_some_and(|t| t.review_required)
    {
        return Err(format!("{tool}: review is still not required"));
    }
    Ok(edited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finance() -> BundleSources {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/finance");
        BundleSources::read(&path).expect("the finance example reads")
    }

    #[test]
    fn a_rule_demoted_and_enforced_again_round_trips() {
        let base = finance();
        let ids = vec!["finance.hold.above_threshold".to_string()];
        let demoted = demote_to_shadow(&base, &ids).expect("demoted");
        let bundle = Bundle::load(demoted.clone()).expect("loads");
        assert_eq!(
            bundle.policy.shadow_rules(),
            [
                (
                    "finance.hold.above_threshold".into(),
                    "amount.threshold".into()
                ),
                ("finance.hold.cap_watch".into(), "hold.cap".into())
            ]
        );
        let back = enforce_shadow(&demoted, &ids[0]).expect("enforced");
        assert_eq!(back.policies, base.policies);
        // Refusals: not a shadow rule; no such policy; demoted twice.
        assert!(enforce_shadow(&base, &ids[0]).is_err());
        assert!(demote_to_shadow(&base, &["no.such".into()]).is_err());
        assert!(demote_to_shadow(&demoted, &ids).is_err());
    }

    #[test]
    fn a_valued_shadow_annotation_is_removed_whole() {
        let mut base = finance();
        base.policies.push_str(
            "\n@id(\"cap\")\n@shadow( \"true\" )\n@rule(\"hold.cap\")\nforbid (principal, action == Action::\"invoice.hold\", resource);\n",
        );
        let enforced = enforce_shadow(&base, "cap").expect("enforced");
        assert!(
            !enforced.policies.contains("@shadow( \"true\" )"),
            "{}",
            enforced.policies
        );
        let shadows = Bundle::load(enforced).expect("loads").policy.shadow_rules();
        assert_eq!(
            shadows,
            [("finance.hold.cap_watch".into(), "hold.cap".into())]
        );
        // The example's own shadow rule, enforced: its annotation line is gone.
        let enforced = enforce_shadow(&finance(), "finance.hold.cap_watch").expect("enforced");
        assert!(
            !enforced.policies.contains("@shadow\n@rule"),
            "{}",
            enforced.policies
        );
        let bundle = Bundle::load(enforced).expect("loads");
        assert!(bundle.policy.shadow_rules().is_empty());
    }

    #[test]
    fn review_is_required_for_one_tool_only() {
        let base = finance();
        let edited = require_review(&base, "invoice.hold").expect("edited");
        let bundle = Bundle::load(edited).expect("loads");
        let tool = |n: &str| {
            bundle
                .registry
                .tool(&crate::registry::ToolName::parse(n).expect("a name"))
                .expect("a tool")
                .review_required
        };
        assert!(tool("invoice.hold"));
        assert!(!tool("invoice.get"));
        assert!(require_review(&base, "no.such").is_err());
    }
}
