//! The policy engine: a pure, deterministic function from a [`Request`] to a [`Decision`],
//! built on Cedar (`cedar-policy` 4) plus built-in floors no policy can lift.
//!
//! # Invariants (fails closed)
//! - No I/O, no clock: `now` is part of the request; the same request always gets the same
//!   report.
//! - Deny overrides: a matching `forbid` wins over any `permit`, and a standing authorization
//!   never lifts a deny of any kind.
//! - No matching permit is a deny (`policy.no_permit`).
//! - Any error — a request that cannot be put to Cedar, or any policy raising an evaluation
//!   error, even one that would not have decided — is `deny(policy.error)`.
//! - Policies are validated against a Cedar schema (strict mode) when loaded; a set that does
//!   not parse, does not validate, contains templates, or breaks the annotation convention is
//!   refused as a whole ([`PolicyLoadError`]).
//!
//! # Order of evaluation
//! 1. floors before Cedar: tool not in the role listing → `deny(role.tool_not_listed)`;
//!    schema errors → `deny(input.schema)`; any resource whose tenant is not the principal's →
//!    `deny(tenant.mismatch)`;
//! 2. Cedar, once per resource the call points at (or once against `Tool::"<name>"` when it
//!    points at none); the most restrictive outcome wins, in this order: error, forbid,
//!    no permit, require approval, allow. Only the policies whose scope may match the call's
//!    action are put to Cedar: one scoped `action == Action::"x"` is false for any other
//!    action before its conditions are read, so leaving it out changes no decision and hides
//!    no error;
//! 3. standing authorizations: when step 2 ended in `require_approval(<policy rule>)` or
//!    `deny(policy.no_permit)`, an unexpired grant that covers the call turns it into
//!    `allow_within_authorization(<grant id>)`;
//! 4. floors after Cedar, which only ever raise: `gate: always` → at least
//!    `require_approval(gate.always)`; effect `irreversible` → at least
//!    `require_approval(irreversible.always)`. A floor that raises names itself, so an
//!    irreversible call reads `require_approval(irreversible.always)` even when a policy
//!    threshold also asked for approval (that policy's id is still in `policy_ids`).
//!    `gate: never` and `gate: policy` add nothing: a policy may still ask for approval.
//!
//! # Annotation convention
//! Every policy carries `@id("…")` (unique; it becomes the Cedar policy id and is reported in
//! [`DecisionReport::policy_ids`]).
//! - `forbid` policies must carry `@rule("a.b")`; a determining forbid gives `deny(a.b)`
//!   (with several, the smallest `@id` names the rule; all ids are reported).
//! - `permit` policies may carry `@decision("require_approval")`, and then must carry
//!   `@rule("a.b")`: if any determining permit is so annotated the result is
//!   `require_approval(a.b)`, otherwise `allow`. `@decision("allow")` is the default.
//! - Rule names are dot-separated `[a-z][a-z0-9_]*` segments, at least two.
//! - `@shadow` (no value, or `"true"`) on a `forbid` or a require-approval `permit` makes it a
//!   shadow rule: it is validated with the rest but never enforced. Each call is decided by
//!   the policies in force; each shadow rule is then evaluated as if added to them, and where
//!   that decision is stricter (allow < require approval < deny) the report lists it
//!   ([`DecisionReport::shadow`]): shadow rules watch for what they would stop or gate, never
//!   for what they would let through. The decision itself is computed from a policy set that
//!   does not contain any shadow rule, so no shadow rule can change an outcome.
//!
//! # What policies see
//! - principal: `Agent::"<id>"` or `Human::"<id>"` with `role`, `tenant` and `acts_for` (the
//!   party the run acts for, or the id itself), a member of `Role::"<role>"`;
//! - action: `Action::"<tool name>"`;
//! - resource: `<Kind>::"<id>"` for each [`ResourceFact`] (kind `purchase_order` → type
//!   `PurchaseOrder`) with `tenant`, `owner` when known, and its attributes; or
//!   `Tool::"<tool name>"` with `tenant` when the call points at no record;
//! - context: `{ args: <canonical arguments>, call: { tenant, task_origin, approval, now } }`,
//!   `now` in Unix seconds. In `args` (and in resource attributes) every `amount` member is
//!   replaced by `amount_minor`, the exact integer minor units of its sibling `currency`
//!   (`4180.00` EUR → `418000`), computed from the decimal text, never through a double;
//!   `null` members are left out; fractional numbers elsewhere are an error.
//!
//! In a deployment the schema is not written by hand: [`crate::bundle`] generates the
//! principal, `Tool` and `Call` declarations and one action per registry tool (its
//! `context.args` typed from the tool's input schema) around a hand-written entity schema.
//!
//! The schema types what policies may read (validation at load). Requests are not validated
//! against it at decision time: a policy reading an attribute a request lacks, or has with
//! another type, raises an evaluation error, and errors deny.
//!
//! # Standing authorizations
//! They are data ([`StandingAuthorization`]: id, party, tool, conditions, expiry) checked in
//! code ([`standing`]), not Cedar template-linked policies: Cedar templates can only slot a
//! principal and a resource, not the values the conditions need (a 30-minute bound, an
//! amount, an expiry compared with `now`); and keeping them outside the policy set means
//! they can be lifted only where the engine allows (a policy-level approval or no-permit),
//! so no grant can outvote a forbid or a floor, whatever a grant's author writes.

pub(crate) mod input;
pub mod money;
pub mod standing;
mod types;

use std::collections::HashMap;
use std::str::FromStr;

use cedar_policy as cedar;
use cedar_policy::{Authorizer, Entities, Entity, EntityUid, PolicyId, PolicySet, Schema};

pub use types::{
    ApprovalState, AuthorizationCondition, Decision, DecisionReport, Principal, PrincipalKind,
    Request, ResourceFact, Rule, ShadowHit, StandingAuthorization, TaskOrigin, ToolFacts,
};

use crate::model::{Effect, Gate};
use input::{InputError, Names};

/// Why a policy set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyLoadError {
    /// The schema does not parse.
    #[error("schema: {0}")]
    Schema(String),
    /// The policies do not parse.
    #[error("policy syntax: {0}")]
    Syntax(String),
    /// The policies do not validate against the schema.
    #[error("policy validation: {0}")]
    Validation(String),
    /// A policy breaks the annotation convention.
    #[error("policy `{policy}`: {message}")]
    Annotation {
        /// The offending policy (its `@id`, or Cedar's id when it has none).
        policy: String,
        /// What is wrong.
        message: String,
    },
    /// Templates are not used by Countersign.
    #[error("templates are not supported (standing authorizations are data)")]
    Template,
    /// Internal Cedar setup failed.
    #[error("cedar: {0}")]
    Cedar(String),
}

/// How a determining policy maps to a decision.
#[derive(Debug, Clone)]
enum Meta {
    Forbid(Rule),
    Permit,
    PermitRequireApproval(Rule),
}

/// The result of one Cedar evaluation, ordered from most to least restrictive.
#[derive(Debug, Clone)]
enum Outcome {
    Error,
    Forbid(Rule),
    NoPermit,
    RequireApproval(Rule),
    Allow,
}

impl Outcome {
    fn rank(&self) -> u8 {
        match self {
            Self::Error => 0,
            Self::Forbid(_) => 1,
            Self::NoPermit => 2,
            Self::RequireApproval(_) => 3,
            Self::Allow => 4,
        }
    }
}

/// A shadow rule: its id and rule, itself alone, the policies in force with it added, and
/// the one action its scope names (`action == Action::"…"`), if it names one.
struct Shadow {
    id: PolicyId,
    rule: Rule,
    alone: PolicySet,
    with: PolicySet,
    only: Option<EntityUid>,
}

/// Whether `policy` can match a call of `action`: a policy scoped `action == Action::"x"`
/// cannot match a call of another action — Cedar checks the scope before the conditions and
/// stops there, so such a policy neither decides nor raises an error. Any other scope
/// (`action in […]`, any action) may match.
fn may_apply(policy: &cedar::Policy, action: &EntityUid) -> bool {
    only_action(policy).is_none_or(|only| only == *action)
}

/// The one action `policy`'s scope names, if it names exactly one.
fn only_action(policy: &cedar::Policy) -> Option<EntityUid> {
    match policy.action_constraint() {
        cedar::ActionConstraint::Eq(only) => Some(only),
        cedar::ActionConstraint::Any | cedar::ActionConstraint::In(_) => None,
    }
}

/// The Cedar requests of one call (one per target resource), built once and put to each
/// policy set that decides it.
type Prepared = Result<Vec<(cedar::Request, Entities)>, InputError>;

/// A loaded, validated policy set.
pub struct PolicyEngine {
    /// The policies in force: never a shadow rule.
    policies: PolicySet,
    /// For each action of the schema, the policies in force that [`may_apply`] to it.
    by_action: HashMap<EntityUid, PolicySet>,
    shadows: Vec<Shadow>,
    meta: HashMap<PolicyId, Meta>,
    actions: HashMap<EntityUid, Entity>,
    names: Names,
    authorizer: Authorizer,
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("policies", &self.meta.len())
            .field("actions", &self.actions.len())
            .finish()
    }
}

impl PolicyEngine {
    /// Parses `schema_text` (Cedar schema syntax) and `policies_text`, validates the policies
    /// against the schema in strict mode and checks the annotation convention.
    ///
    /// This is the engine on its own, for a schema that already declares every action; a
    /// deployment loads a [`crate::bundle::Bundle`], whose action declarations are generated
    /// from the registry.
    ///
    /// # Errors
    /// The first [`PolicyLoadError`] found, carrying Cedar's message (all validation errors
    /// are joined into one).
    pub fn load(policies_text: &str, schema_text: &str) -> Result<Self, PolicyLoadError> {
        let (schema, _warnings) = Schema::from_cedarschema_str(schema_text)
            .map_err(|e| PolicyLoadError::Schema(e.to_string()))?;
        let parsed = parse_policies(policies_text)?;
        let mut annotated = Annotated::default();
        if let Some(first) = annotated.add(&parsed).into_iter().next() {
            return Err(first);
        }
        let messages: Vec<String> = validate(&annotated.policies, &schema)
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        if !messages.is_empty() {
            return Err(PolicyLoadError::Validation(messages.join("; ")));
        }
        Self::assemble(annotated, &schema)
    }

    /// Builds the engine from policies already annotated and validated against `schema`.
    pub(crate) fn assemble(annotated: Annotated, schema: &Schema) -> Result<Self, PolicyLoadError> {
        let actions = schema
            .action_entities()
            .map_err(|e| PolicyLoadError::Cedar(e.to_string()))?
            .iter()
            .map(|e| (e.uid(), e.clone()))
            .collect();
        let names = Names::new().map_err(|e| PolicyLoadError::Cedar(e.to_string()))?;
        let cedar_err = |e: cedar::PolicySetError| PolicyLoadError::Cedar(e.to_string());
        let mut enforced = PolicySet::new();
        for p in annotated.policies.policies() {
            if !annotated.shadow.contains(p.id()) {
                enforced.add(p.clone()).map_err(cedar_err)?;
            }
        }
        let mut shadows = Vec::with_capacity(annotated.shadow.len());
        for id in annotated.shadow {
            let (Some(policy), Some(rule)) = (
                annotated.policies.policy(&id),
                annotated.meta.get(&id).and_then(Meta::rule),
            ) else {
                return Err(PolicyLoadError::Cedar(format!(
                    "shadow rule `{id}` is missing"
                )));
            };
            let mut with = enforced.clone();
            with.add(policy.clone()).map_err(cedar_err)?;
            let mut alone = PolicySet::new();
            alone.add(policy.clone()).map_err(cedar_err)?;
            shadows.push(Shadow {
                rule: rule.clone(),
                id,
                alone,
                with,
                only: only_action(policy),
            });
        }
        shadows.sort_by_key(|s| s.id.to_string());
        let by_action = Self::slice(&enforced, &actions)?;

        Ok(Self {
            policies: enforced,
            by_action,
            shadows,
            meta: annotated.meta,
            actions,
            names,
            authorizer: Authorizer::new(),
        })
    }

    /// Each action's share of `enforced`: the policies that [`may_apply`] to it.
    fn slice(
        enforced: &PolicySet,
        actions: &HashMap<EntityUid, Entity>,
    ) -> Result<HashMap<EntityUid, PolicySet>, PolicyLoadError> {
        let mut by_action = HashMap::with_capacity(actions.len());
        for action in actions.keys() {
            let mut share = PolicySet::new();
            for p in enforced.policies().filter(|p| may_apply(p, action)) {
                share
                    .add(p.clone())
                    .map_err(|e| PolicyLoadError::Cedar(e.to_string()))?;
            }
            by_action.insert(action.clone(), share);
        }
        Ok(by_action)
    }

    /// The policies in force that may apply to `action` (all of them for an action the
    /// schema does not declare).
    fn enforced_for(&self, action: &EntityUid) -> &PolicySet {
        self.by_action.get(action).unwrap_or(&self.policies)
    }

    /// The `@id`s of the loaded policies (shadow rules included), sorted.
    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.meta.keys().map(ToString::to_string).collect();
        ids.sort();
        ids
    }

    /// The shadow rules, as (`@id`, `@rule`), by id.
    pub fn shadow_rules(&self) -> Vec<(String, String)> {
        self.shadows
            .iter()
            .map(|s| (s.id.to_string(), s.rule.to_string()))
            .collect()
    }

    /// The enforced require-approval policies that open `tool`'s gate by `rule`, sorted by
    /// `@id` — only when every enforced policy naming `rule` is such a policy scoped to
    /// exactly that tool (`action == Action::"<tool>"`), so that changing them changes no
    /// other tool's gate and lifts no forbid; `None` otherwise.
    pub fn gate_policies(&self, tool: &str, rule: &str) -> Option<Vec<String>> {
        let mut ids = Vec::new();
        for (id, m) in &self.meta {
            if m.rule().is_none_or(|r| r.as_str() != rule) {
                continue;
            }
            let Some(policy) = self.policies.policy(id) else {
                continue; // a shadow rule: not enforced
            };
            let only_tool = match policy.action_constraint() {
                cedar::ActionConstraint::Eq(uid) => {
                    uid.type_name().to_string() == "Action" && uid.id().unescaped() == tool
                }
                cedar::ActionConstraint::Any | cedar::ActionConstraint::In(_) => false,
            };
            if !matches!(m, Meta::PermitRequireApproval(_)) || !only_tool {
                return None;
            }
            ids.push(id.to_string());
        }
        ids.sort();
        (!ids.is_empty()).then_some(ids)
    }

    /// Rules on `req` with the policies in force only (no shadow rule is evaluated): what an
    /// impact preview replays. Pure.
    pub fn decide_enforced(&self, req: &Request) -> DecisionReport {
        if let Some(report) = floor_before_cedar(req) {
            return report;
        }
        let action = input::uid(&self.names.action, &req.tool.name);
        let prepared = self.prepare(req, &action);
        self.decide_with(self.enforced_for(&action), req, &prepared)
    }

    /// Rules on `req` with the policies in force, then lists each shadow rule that would have
    /// decided more strictly. Pure: no I/O, no clock.
    pub fn decide(&self, req: &Request) -> DecisionReport {
        if let Some(report) = floor_before_cedar(req) {
            return report;
        }
        let action = input::uid(&self.names.action, &req.tool.name);
        let prepared = self.prepare(req, &action);
        let mut report = self.decide_with(self.enforced_for(&action), req, &prepared);
        for shadow in &self.shadows {
            if shadow.only.as_ref().is_some_and(|only| *only != action) {
                continue; // cannot match this call (`may_apply`)
            }
            // A rule that neither matches nor errs on its own adds nothing to the set in
            // force: only a rule that does is decided with it (one small evaluation per
            // shadow rule per call, the full one only when it could matter).
            if let Ok(requests) = &prepared
                && !requests.iter().any(|(request, entities)| {
                    let r = self
                        .authorizer
                        .is_authorized(request, &shadow.alone, entities);
                    r.diagnostics().reason().next().is_some()
                        || r.diagnostics().errors().next().is_some()
                })
            {
                continue;
            }
            let would = self.decide_with(&shadow.with, req, &prepared).decision;
            if strictness(&would) > strictness(&report.decision) {
                report.shadow.push(ShadowHit {
                    id: shadow.id.to_string(),
                    rule: shadow.rule.to_string(),
                    would,
                });
            }
        }
        report
    }

    /// Rules on `req` (past the floors before Cedar) with the policies of `set`.
    fn decide_with(&self, set: &PolicySet, req: &Request, prepared: &Prepared) -> DecisionReport {
        // 2. Cedar.
        let mut policy_ids = Vec::new();
        let mut errors = Vec::new();
        let outcome = match prepared {
            Ok(requests) => self.evaluate(set, requests, &mut policy_ids, &mut errors),
            Err(e) => {
                errors.push(e.to_string());
                Outcome::Error
            }
        };
        policy_ids.sort();
        policy_ids.dedup();

        let mut decision = match outcome {
            Outcome::Error => Decision::Deny(Rule::POLICY_ERROR),
            Outcome::Forbid(rule) => Decision::Deny(rule),
            Outcome::NoPermit => Decision::Deny(Rule::NO_PERMIT),
            Outcome::RequireApproval(rule) => Decision::RequireApproval(rule),
            Outcome::Allow => Decision::Allow,
        };

        // 3. Standing authorizations: only a policy-level approval or a missing permit.
        let liftable = match &decision {
            Decision::RequireApproval(_) => true,
            Decision::Deny(rule) => *rule == Rule::NO_PERMIT,
            Decision::Allow | Decision::AllowWithinAuthorization(_) => false,
        };
        if liftable && let Some(grant) = standing::covering(req) {
            decision = Decision::AllowWithinAuthorization(grant.id.clone());
        }

        // 4. Floors after Cedar: raise only.
        match req.tool.gate {
            Gate::Always => decision = at_least_approval(decision, Rule::GATE_ALWAYS),
            Gate::Never | Gate::Policy => {}
        }
        match req.tool.effect {
            Effect::Irreversible => {
                decision = at_least_approval(decision, Rule::IRREVERSIBLE_ALWAYS);
            }
            Effect::Read | Effect::Write => {}
        }

        DecisionReport {
            decision,
            policy_ids,
            errors,
            shadow: Vec::new(),
        }
    }

    /// Runs Cedar on each of `requests` (one per target resource) and keeps the most
    /// restrictive outcome.
    fn evaluate(
        &self,
        set: &PolicySet,
        requests: &[(cedar::Request, Entities)],
        policy_ids: &mut Vec<String>,
        errors: &mut Vec<String>,
    ) -> Outcome {
        let mut worst = Outcome::Allow;
        for (request, entities) in requests {
            let response = self.authorizer.is_authorized(request, set, entities);
            let outcome = self.outcome(&response, policy_ids, errors);
            if outcome.rank() < worst.rank() {
                worst = outcome;
            }
        }
        worst
    }

    /// The Cedar requests of `req`: one per resource it points at, or one against
    /// `Tool::"<name>"` when it points at none.
    fn prepare(&self, req: &Request, action_uid: &EntityUid) -> Prepared {
        let principal = input::principal_entity(&self.names, &req.principal)?;
        let context = input::context(req)?;
        let targets: Vec<Entity> = if req.resources.is_empty() {
            vec![input::tool_entity(&self.names, req)?]
        } else {
            req.resources
                .iter()
                .map(|fact| input::resource_entity(&self.names, fact))
                .collect::<Result<_, _>>()?
        };

        let principal_uid = principal.uid();
        let mut requests = Vec::with_capacity(targets.len());
        // The principal and the context go to each target's request: copies for all but the
        // last, which takes them.
        let mut shared = Some((principal, context));
        let last = targets.len().saturating_sub(1);
        for (i, target) in targets.into_iter().enumerate() {
            let (principal, context) = if i == last {
                shared.take()
            } else {
                shared.clone()
            }
            .ok_or_else(|| InputError::Cedar("a request past the last target".into()))?;
            let resource_uid = target.uid();
            let mut entities = vec![principal, target];
            if let Some(action) = self.actions.get(action_uid) {
                entities.push(action.clone());
            }
            let entities = Entities::from_entities(entities, None)
                .map_err(|e| InputError::Cedar(e.to_string()))?;
            let request = cedar::Request::new(
                principal_uid.clone(),
                action_uid.clone(),
                resource_uid,
                context,
                None,
            )
            .map_err(|e| InputError::Cedar(e.to_string()))?;
            requests.push((request, entities));
        }
        Ok(requests)
    }

    fn outcome(
        &self,
        response: &cedar::Response,
        policy_ids: &mut Vec<String>,
        errors: &mut Vec<String>,
    ) -> Outcome {
        let diagnostics = response.diagnostics();
        let mut failed = false;
        for error in diagnostics.errors() {
            errors.push(error.to_string());
            failed = true;
        }
        let mut reasons: Vec<&PolicyId> = diagnostics.reason().collect();
        reasons.sort_by_key(|id| id.to_string());
        for id in &reasons {
            policy_ids.push(id.to_string());
        }
        if failed {
            return Outcome::Error;
        }
        let mut metas = Vec::with_capacity(reasons.len());
        for id in &reasons {
            match self.meta.get(*id) {
                Some(m) => metas.push(m),
                None => {
                    errors.push(format!("policy `{id}` has no recorded annotations"));
                    return Outcome::Error;
                }
            }
        }
        match response.decision() {
            cedar::Decision::Deny => {
                let forbid_rule = metas.iter().find_map(|m| match m {
                    Meta::Forbid(rule) => Some(rule.clone()),
                    Meta::Permit | Meta::PermitRequireApproval(_) => None,
                });
                match forbid_rule {
                    Some(rule) => Outcome::Forbid(rule),
                    None if metas.is_empty() => Outcome::NoPermit,
                    None => Outcome::Forbid(Rule::FORBID),
                }
            }
            cedar::Decision::Allow => {
                let approval_rule = metas.iter().find_map(|m| match m {
                    Meta::PermitRequireApproval(rule) => Some(rule.clone()),
                    Meta::Permit | Meta::Forbid(_) => None,
                });
                match approval_rule {
                    Some(rule) => Outcome::RequireApproval(rule),
                    None => Outcome::Allow,
                }
            }
        }
    }
}

/// Parses policy text, refusing templates.
pub(crate) fn parse_policies(text: &str) -> Result<PolicySet, PolicyLoadError> {
    let parsed = PolicySet::from_str(text).map_err(|e| PolicyLoadError::Syntax(e.to_string()))?;
    if parsed.templates().next().is_some() {
        return Err(PolicyLoadError::Template);
    }
    Ok(parsed)
}

/// Strict validation of `policies` against `schema`: every error Cedar reports.
pub(crate) fn validate(policies: &PolicySet, schema: &Schema) -> Vec<cedar::ValidationError> {
    let result =
        cedar::Validator::new(schema.clone()).validate(policies, cedar::ValidationMode::Strict);
    result.validation_errors().cloned().collect()
}

impl Meta {
    fn rule(&self) -> Option<&Rule> {
        match self {
            Self::Forbid(rule) | Self::PermitRequireApproval(rule) => Some(rule),
            Self::Permit => None,
        }
    }
}

/// Policies re-identified by their `@id`, with how each maps to a decision.
#[derive(Debug, Default)]
pub(crate) struct Annotated {
    /// Every policy, shadow rules included (all are validated).
    pub(crate) policies: PolicySet,
    meta: HashMap<PolicyId, Meta>,
    /// The `@shadow` ones.
    shadow: Vec<PolicyId>,
}

impl Annotated {
    /// Adds every policy of `parsed` that follows the annotation convention; returns one
    /// error per policy that does not (those are left out).
    pub(crate) fn add(&mut self, parsed: &PolicySet) -> Vec<PolicyLoadError> {
        let mut errors = Vec::new();
        for policy in parsed.policies() {
            match self.add_one(policy) {
                Ok(()) => {}
                Err(e) => errors.push(e),
            }
        }
        errors
    }

    /// How many enforced policies were added.
    pub(crate) fn len(&self) -> usize {
        self.meta.len().saturating_sub(self.shadow.len())
    }

    fn add_one(&mut self, policy: &cedar::Policy) -> Result<(), PolicyLoadError> {
        let cedar_id = policy.id().to_string();
        let annotation_error = |message: &str| PolicyLoadError::Annotation {
            policy: policy.annotation("id").unwrap_or(&cedar_id).to_owned(),
            message: message.to_owned(),
        };
        let id = policy
            .annotation("id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| annotation_error("missing @id(\"…\")"))?;
        let rule = match policy.annotation("rule") {
            Some(text) => Some(
                Rule::parse(text)
                    .ok_or_else(|| annotation_error("@rule must look like `area.name`"))?,
            ),
            None => None,
        };
        let m = match (policy.effect(), policy.annotation("decision"), rule) {
            (cedar::Effect::Forbid, None, Some(rule)) => Meta::Forbid(rule),
            (cedar::Effect::Forbid, None, None) => {
                return Err(annotation_error("forbid policies must name a @rule"));
            }
            (cedar::Effect::Forbid, Some(_), _) => {
                return Err(annotation_error("@decision is for permit policies"));
            }
            (cedar::Effect::Permit, None | Some("allow"), _) => Meta::Permit,
            (cedar::Effect::Permit, Some("require_approval"), Some(rule)) => {
                Meta::PermitRequireApproval(rule)
            }
            (cedar::Effect::Permit, Some("require_approval"), None) => {
                return Err(annotation_error(
                    "@decision(\"require_approval\") needs a @rule",
                ));
            }
            (cedar::Effect::Permit, Some(_), _) => {
                return Err(annotation_error(
                    "@decision must be \"allow\" or \"require_approval\"",
                ));
            }
        };
        let shadow = match policy.annotation("shadow") {
            None => false,
            Some("" | "true") => true,
            Some(_) => return Err(annotation_error("@shadow takes no value (or \"true\")")),
        };
        if shadow && matches!(m, Meta::Permit) {
            return Err(annotation_error(
                "@shadow is for forbid and require_approval policies",
            ));
        }
        let pid = PolicyId::new(id);
        if self.meta.contains_key(&pid) {
            return Err(annotation_error("duplicate @id"));
        }
        self.policies
            .add(policy.new_id(pid.clone()))
            .map_err(|e| PolicyLoadError::Cedar(e.to_string()))?;
        if shadow {
            self.shadow.push(pid.clone());
        }
        self.meta.insert(pid, m);
        Ok(())
    }
}

/// How strict a decision is: allow (0) < require approval (1) < deny (2).
fn strictness(d: &Decision) -> u8 {
    match d {
        Decision::Allow | Decision::AllowWithinAuthorization(_) => 0,
        Decision::RequireApproval(_) => 1,
        Decision::Deny(_) => 2,
    }
}

/// Step 1, the floors before Cedar: the tool not listed for the role, arguments that do not
/// fit the schema, a resource of another tenant.
fn floor_before_cedar(req: &Request) -> Option<DecisionReport> {
    if !req.tool.listed_for_role {
        return Some(floor(Rule::TOOL_NOT_LISTED));
    }
    if !req.schema_errors.is_empty() {
        return Some(DecisionReport {
            decision: Decision::Deny(Rule::INPUT_SCHEMA),
            policy_ids: Vec::new(),
            errors: req.schema_errors.clone(),
            shadow: Vec::new(),
        });
    }
    if req
        .resources
        .iter()
        .any(|r| r.tenant != req.principal.tenant)
    {
        return Some(floor(Rule::TENANT_MISMATCH));
    }
    None
}

fn floor(rule: Rule) -> DecisionReport {
    DecisionReport {
        decision: Decision::Deny(rule),
        policy_ids: Vec::new(),
        errors: Vec::new(),
        shadow: Vec::new(),
    }
}

/// Raises `decision` to at least `require_approval(rule)`; a deny stays a deny.
fn at_least_approval(decision: Decision, rule: Rule) -> Decision {
    match decision {
        Decision::Allow | Decision::AllowWithinAuthorization(_) | Decision::RequireApproval(_) => {
            Decision::RequireApproval(rule)
        }
        Decision::Deny(deny) => Decision::Deny(deny),
    }
}
