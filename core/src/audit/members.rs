//! The names of the detail members that the pipeline writes into decision records and that
//! readers (impact preview, gate metrics, run timeline) look up: one definition each.

/// The member of a `decided` record that holds what policy decided on beyond the step's own
/// row: `{v, now_ms, party, approval, resources, grants}` — enough to decide the same call
/// again under another bundle (an impact preview), at the instant it was decided.
pub const POLICY_INPUTS: &str = "policy_inputs";

/// The member of a `decided` record listing the shadow rules that would have decided more
/// strictly ([`crate::policy::ShadowHit`]); absent when none would have.
pub const SHADOW: &str = "shadow";

/// The member that names the events a read's one record stands for (`["decided",
/// "started"]`): the record carries a decision too.
pub const FOLDED: &str = "folded";

/// The member of a folded record that keeps the decision's rule where the outcome names
/// another (a read that failed at its target).
pub const DECISION_RULE: &str = "decision_rule";

/// The member of a `decided` record naming its decision's kind (`allow`,
/// `require_approval`, `deny`, …).
pub const DECISION: &str = "decision";
