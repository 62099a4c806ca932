//! What a proposal changes — a listing pairing, a tool setting, or a whole bundle — and how
//! the changes apply to a base version ([`apply_changes`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::bundle::{Bundle, BundleSources};
use crate::registry::{Registry, RoleName, ToolName};

/// Add or remove one pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeOp {
    /// List the tool for the role.
    Add,
    /// Stop listing the tool for the role.
    Remove,
}

impl ChangeOp {
    /// `+` or `-`, as the diff view shows it.
    pub fn sign(self) -> char {
        match self {
            Self::Add => '+',
            Self::Remove => '-',
        }
    }
}

/// One change to the role × tool listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListingChange {
    /// The tool.
    pub tool: String,
    /// The registry (agent) role.
    pub role: String,
    /// Add or remove.
    pub op: ChangeOp,
}

impl std::fmt::Display for ListingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = match self.op {
            ChangeOp::Add => "for",
            ChangeOp::Remove => "no longer for",
        };
        write!(
            f,
            "{} {} {verb} role {}",
            self.op.sign(),
            self.tool,
            self.role
        )
    }
}

/// A tool setting a proposal may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSetting {
    /// `read`, `write` or `irreversible`.
    Effect,
    /// `never`, `always` or `policy`.
    Gate,
    /// How long an approval stays valid (`72h`); needs approval settings.
    Expires,
    /// How recent the approver's sign-in must be (`15m`, empty: no step-up).
    StepUpMaxAge,
    /// `true` or `false`: two distinct approvers always.
    FourEyes,
    /// Above this `amount` a second approver is needed (empty: never).
    SecondApprovalAbove,
    /// What undoing a wrong call costs, in approvals (empty: unset); read by the gate advisor.
    ReversalCost,
    /// `required` or `none`: each approval is a passkey signature over the exact inputs.
    Signature,
}

impl ToolSetting {
    /// Every setting, in the order forms show them.
    pub const ALL: [Self; 8] = [
        Self::Effect,
        Self::Gate,
        Self::Expires,
        Self::StepUpMaxAge,
        Self::FourEyes,
        Self::SecondApprovalAbove,
        Self::ReversalCost,
        Self::Signature,
    ];

    /// The registry key (under `approval:` for approval settings) and the form field name.
    pub fn key(self) -> &'static str {
        match self {
            Self::Effect => "effect",
            Self::Gate => "gate",
            Self::Expires => "expires",
            Self::StepUpMaxAge => "step_up_max_age",
            Self::FourEyes => "four_eyes",
            Self::SecondApprovalAbove => "second_approval_above",
            Self::ReversalCost => "reversal_cost",
            Self::Signature => "signature",
        }
    }

    /// Whether the setting lives under the tool's `approval:`.
    pub fn in_approval(self) -> bool {
        match self {
            Self::Effect | Self::Gate => false,
            Self::Expires
            | Self::StepUpMaxAge
            | Self::FourEyes
            | Self::SecondApprovalAbove
            | Self::ReversalCost
            | Self::Signature => true,
        }
    }

    /// The setting's value in force for `tool`, as text (empty: unset or no approval
    /// settings).
    pub fn value_of(self, tool: &crate::registry::Tool) -> String {
        let approval = tool.approval.as_ref();
        match self {
            Self::Effect => tool.effect.as_str().to_string(),
            Self::Gate => match tool.gate {
                crate::Gate::Never => "never",
                crate::Gate::Always => "always",
                crate::Gate::Policy => "policy",
            }
            .to_string(),
            Self::Expires => approval.map(|a| a.expires.to_string()).unwrap_or_default(),
            Self::StepUpMaxAge => approval
                .and_then(|a| a.step_up_max_age)
                .map(|s| s.to_string())
                .unwrap_or_default(),
            Self::FourEyes => approval
                .map(|a| a.four_eyes.to_string())
                .unwrap_or_default(),
            Self::SecondApprovalAbove => approval
                .and_then(|a| a.second_approval_above.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default(),
            Self::ReversalCost => approval
                .and_then(|a| a.reversal_cost.as_ref())
                .map(ToString::to_string)
                .unwrap_or_default(),
            Self::Signature => approval
                .map(|a| {
                    if a.signature_required {
                        "required"
                    } else {
                        "none"
                    }
                })
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// `to` as the registry value; `None` removes the key. Refuses malformed values.
    fn yaml(self, to: &str) -> Result<Option<serde_norway::Value>, String> {
        use serde_norway::Value as Y;
        let bad = || format!("{:?} is not a valid {}", to, self.key());
        Ok(Some(match self {
            Self::Effect => {
                crate::Effect::parse(to).ok_or_else(bad)?;
                Y::String(to.into())
            }
            Self::Gate => {
                if !matches!(to, "never" | "always" | "policy") {
                    return Err(bad());
                }
                Y::String(to.into())
            }
            Self::Expires => {
                crate::registry::Span::parse(to).map_err(|_| bad())?;
                Y::String(to.into())
            }
            Self::StepUpMaxAge => {
                if to.is_empty() {
                    return Ok(None);
                }
                crate::registry::Span::parse(to).map_err(|_| bad())?;
                Y::String(to.into())
            }
            Self::FourEyes => match to {
                "true" => Y::Bool(true),
                "false" => Y::Bool(false),
                _ => return Err(bad()),
            },
            Self::Signature => match to {
                "required" => Y::String(to.into()),
                "none" | "" => return Ok(None),
                _ => return Err(bad()),
            },
            Self::SecondApprovalAbove | Self::ReversalCost => {
                if to.is_empty() {
                    return Ok(None);
                }
                let number: serde_json::Number = to.parse().map_err(|_| bad())?;
                if number.as_f64().is_none_or(|n| !n.is_finite() || n < 0.0) {
                    return Err(bad());
                }
                serde_norway::from_str::<Y>(to)
                    .ok()
                    .filter(Y::is_number)
                    .ok_or_else(bad)?
            }
        }))
    }
}

/// One change to a tool's settings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingChange {
    /// The tool.
    pub tool: String,
    /// Which setting.
    pub setting: ToolSetting,
    /// Its value in the base version (text; empty: unset).
    pub from: String,
    /// The proposed value (text; empty: unset).
    pub to: String,
}

impl std::fmt::Display for SettingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &str| {
            if v.is_empty() {
                "(unset)".to_string()
            } else {
                v.to_string()
            }
        };
        write!(
            f,
            "~ {} {}: {} → {}",
            self.tool,
            self.setting.key(),
            shown(&self.from),
            shown(&self.to)
        )
    }
}

/// One change a proposal makes: to the listing, or to a tool's settings. Stored as JSON; a
/// listing change keeps the shape it had before settings could be proposed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Change {
    /// Add or remove a tool for a role.
    Listing(ListingChange),
    /// Change a tool setting.
    Setting(SettingChange),
    /// Put a whole bundle in force (`registry import`); proposed alone.
    Bundle(BundleChange),
}

impl Change {
    /// The tool it changes (empty for a whole bundle).
    pub fn tool(&self) -> &str {
        match self {
            Self::Listing(c) => &c.tool,
            Self::Setting(c) => &c.tool,
            Self::Bundle(_) => "",
        }
    }

    /// `+`, `-` (listing) or `~` (setting, bundle), as the diff view shows it.
    pub fn sign(&self) -> char {
        match self {
            Self::Listing(c) => c.op.sign(),
            Self::Setting(_) | Self::Bundle(_) => '~',
        }
    }

    /// What the audit trail records of it (a bundle: its digest and summary).
    pub fn audit_json(&self) -> Value {
        match self {
            Self::Bundle(b) => b.audit_json(),
            other => json!(other),
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Listing(c) => c.fmt(f),
            Self::Setting(c) => c.fmt(f),
            Self::Bundle(c) => c.fmt(f),
        }
    }
}

impl From<ListingChange> for Change {
    fn from(c: ListingChange) -> Self {
        Self::Listing(c)
    }
}

impl From<SettingChange> for Change {
    fn from(c: SettingChange) -> Self {
        Self::Setting(c)
    }
}

/// A whole bundle proposed at once: what `countersign registry import` files on a database
/// that holds a registry already (a second admin applies it, like any proposal).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleChange {
    /// The registry YAML, as imported.
    pub registry_yaml: String,
    /// The Cedar policies, as imported.
    pub policies: String,
    /// The Cedar entity schema, as imported.
    pub policy_schema: String,
    /// [`BundleSources::sha256`] of the three texts.
    pub sha256: String,
    /// What it changes against the version it was proposed on, one line each (as `registry
    /// history` shows a version's changes).
    pub summary: String,
}

impl BundleChange {
    /// The three texts.
    pub fn sources(&self) -> BundleSources {
        BundleSources {
            registry_yaml: self.registry_yaml.clone(),
            policies: self.policies.clone(),
            policy_schema: self.policy_schema.clone(),
        }
    }

    /// What the audit trail keeps of it: its digest and summary, not the texts (those are in
    /// the proposal and, once applied, in the version).
    pub fn audit_json(&self) -> serde_json::Value {
        serde_json::json!({"bundle_sha256": self.sha256, "summary": self.summary})
    }
}

impl std::fmt::Display for BundleChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "~ the whole bundle (sha256 {}…): {}",
            self.sha256.get(..12).unwrap_or(&self.sha256),
            self.summary.lines().collect::<Vec<_>>().join("; ")
        )
    }
}

/// Applies `changes` to the registry of `base` and returns the new bundle texts (the
/// registry written in its canonical export form; policies and entity schema unchanged),
/// checked to load as a bundle.
pub fn apply_changes(base: &BundleSources, changes: &[Change]) -> Result<BundleSources, String> {
    if changes.is_empty() {
        return Err("the proposal changes nothing".into());
    }
    if let Some(bundle) = changes.iter().find_map(|c| match c {
        Change::Bundle(b) => Some(b),
        _ => None,
    }) {
        return bundle_sources(base, bundle, changes.len());
    }
    let registry = Registry::from_sources(&base.registry_sources())
        .map_err(|e| format!("the base registry does not load: {e}"))?;
    let mut seen_listing = BTreeSet::new();
    let mut seen_setting = BTreeSet::new();
    let mut values = Vec::new();
    for change in changes {
        let tool = ToolName::parse(change.tool())
            .ok()
            .and_then(|t| registry.tool(&t))
            .ok_or_else(|| format!("there is no tool {:?}", change.tool()))?;
        match change {
            Change::Listing(c) => {
                if !seen_listing.insert((&c.tool, &c.role)) {
                    return Err(format!("{} {} is changed twice", c.tool, c.role));
                }
                let role = RoleName::parse(&c.role)
                    .ok()
                    .filter(|r| registry.role(r).is_some())
                    .ok_or_else(|| format!("there is no role {:?}", c.role))?;
                let listed = tool.roles.contains(&role);
                match (c.op, listed) {
                    (ChangeOp::Add, true) => {
                        return Err(format!("{} is already listed for {}", c.tool, c.role));
                    }
                    (ChangeOp::Remove, false) => {
                        return Err(format!("{} is not listed for {}", c.tool, c.role));
                    }
                    (ChangeOp::Add, false) | (ChangeOp::Remove, true) => {}
                }
            }
            Change::Bundle(_) => return Err("a bundle is proposed alone".into()),
            Change::Setting(c) => {
                if !seen_setting.insert((&c.tool, c.setting)) {
                    return Err(format!("{} {} is changed twice", c.tool, c.setting.key()));
                }
                if c.setting.in_approval() && tool.approval.is_none() {
                    return Err(format!(
                        "{} has no approval settings to change ({})",
                        c.tool,
                        c.setting.key()
                    ));
                }
                let current = c.setting.value_of(tool);
                if current != c.from {
                    return Err(format!(
                        "{} {} is {current:?}, not {:?}",
                        c.tool,
                        c.setting.key(),
                        c.from
                    ));
                }
                if c.to == current {
                    return Err(format!(
                        "{} {} is already {current:?}",
                        c.tool,
                        c.setting.key()
                    ));
                }
                values.push((c, c.setting.yaml(&c.to)?));
            }
        }
    }
    let yaml = registry.to_yaml().map_err(|e| e.to_string())?;
    let mut doc: serde_norway::Value =
        serde_norway::from_str(&yaml).map_err(|e| format!("re-reading the export: {e}"))?;
    for change in changes {
        let Change::Listing(c) = change else {
            continue;
        };
        let roles = doc
            .get_mut("tools")
            .and_then(|t| t.get_mut(c.tool.as_str()))
            .and_then(|t| t.get_mut("roles"))
            .and_then(serde_norway::Value::as_sequence_mut)
            .ok_or_else(|| format!("the export has no roles for {}", c.tool))?;
        match c.op {
            ChangeOp::Add => roles.push(serde_norway::Value::String(c.role.clone())),
            ChangeOp::Remove => roles.retain(|r| r.as_str() != Some(c.role.as_str())),
        }
    }
    for (c, value) in values {
        let tool = doc
            .get_mut("tools")
            .and_then(|t| t.get_mut(c.tool.as_str()))
            .ok_or_else(|| format!("the export has no tool {}", c.tool))?;
        let map = if c.setting.in_approval() {
            tool.get_mut("approval")
        } else {
            Some(tool)
        }
        .and_then(serde_norway::Value::as_mapping_mut)
        .ok_or_else(|| format!("the export has no settings for {}", c.tool))?;
        let key = serde_norway::Value::String(c.setting.key().into());
        match value {
            Some(v) => {
                map.insert(key, v);
            }
            None => {
                map.remove(&key);
            }
        }
    }
    let registry_yaml = serde_norway::to_string(&doc).map_err(|e| e.to_string())?;
    let sources = BundleSources {
        registry_yaml,
        policies: base.policies.clone(),
        policy_schema: base.policy_schema.clone(),
    };
    Bundle::load(sources.clone()).map_err(|e| e.one_line())?;
    Ok(sources)
}

/// The texts a bundle proposal puts in force: proposed alone, matching its digest, not the
/// base itself, and loading as a bundle.
fn bundle_sources(
    base: &BundleSources,
    bundle: &BundleChange,
    count: usize,
) -> Result<BundleSources, String> {
    if count != 1 {
        return Err("a bundle replaces the whole registry: it is proposed alone".into());
    }
    let sources = bundle.sources();
    if sources.sha256() != bundle.sha256 {
        return Err("the bundle's texts do not match its sha256".into());
    }
    if sources == *base {
        return Err("the bundle is identical to the version it is proposed on".into());
    }
    Bundle::load(sources.clone()).map_err(|e| e.one_line())?;
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::ToolSetting;

    #[test]
    fn a_signature_setting_is_required_or_removed_and_nothing_else() {
        let s = ToolSetting::Signature;
        assert_eq!(s.key(), "signature");
        assert!(s.in_approval());
        assert_eq!(
            s.yaml("required"),
            Ok(Some(serde_norway::Value::String("required".into())))
        );
        assert_eq!(s.yaml("none"), Ok(None));
        assert_eq!(s.yaml(""), Ok(None));
        assert!(s.yaml("maybe").is_err());
        assert!(ToolSetting::ALL.contains(&s));
    }
}
