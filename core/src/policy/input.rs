//! Turning a [`Request`] into Cedar's principal, resource, entities and context.
//!
//! Owns the mapping documented in the parent module: JSON objects become records, arrays
//! sets, integers `Long`s, `null` members are left out, and every `amount` member becomes
//! `amount_minor` (exact integer minor units of its sibling `currency`).
//!
//! INVARIANT (fails closed): anything without an exact Cedar value — a fractional number that
//! is not money, an amount without a known currency, an `amount_minor` sent by the caller
//! (it could shadow the converted value), `null` inside an array, a reserved attribute name
//! in resource facts — is an [`InputError`], which the engine turns into `deny(policy.error)`.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{Context, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression};
use serde_json::{Map, Value};

use super::money::{MoneyError, to_minor_units};
use super::types::{Principal, Request, ResourceFact};

/// The member converted to minor units.
pub(crate) const MONEY_FIELD: &str = "amount";
/// The converted member's name.
pub(crate) const MONEY_MINOR_FIELD: &str = "amount_minor";
/// The sibling naming the currency.
pub(crate) const CURRENCY_FIELD: &str = "currency";

/// 2^53 as a double: integral doubles up to here convert to `i64` exactly.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// Why a request could not be put to Cedar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InputError {
    /// The arguments are not a JSON object.
    #[error("arguments must be a JSON object")]
    ArgumentsNotObject,
    /// A fractional number outside a money member.
    #[error("`{0}`: fractional numbers have no Cedar type (only `amount` is converted)")]
    Fractional(String),
    /// An integer outside Cedar's `Long`.
    #[error("`{0}`: integer out of range")]
    IntegerRange(String),
    /// `null` inside an array.
    #[error("`{0}`: null inside an array")]
    NullInArray(String),
    /// An `amount` without a string `currency` beside it.
    #[error("`{0}`: amount without a currency")]
    AmountWithoutCurrency(String),
    /// An `amount` that is not a JSON number.
    #[error("`{0}`: amount must be a number")]
    AmountNotNumber(String),
    /// The caller sent the converted member's name itself.
    #[error("`{0}`: `amount_minor` is computed by Countersign and may not be sent")]
    MinorUnitsSupplied(String),
    /// An amount with no exact minor-unit value.
    #[error("`{path}`: {source}")]
    Money {
        /// Where.
        path: String,
        /// Why.
        source: MoneyError,
    },
    /// A resource fact uses an attribute name the engine sets itself.
    #[error("resource `{0}`: attribute `{1}` is reserved")]
    ReservedAttribute(String, String),
    /// A resource kind that has no Cedar type name.
    #[error("resource kind `{0}` is not snake_case")]
    BadKind(String),
    /// Cedar refused a value or name.
    #[error("cedar: {0}")]
    Cedar(String),
}

/// Cedar type names used by every policy set.
pub(crate) struct Names {
    pub(crate) action: EntityTypeName,
    pub(crate) role: EntityTypeName,
    pub(crate) tool: EntityTypeName,
    pub(crate) agent: EntityTypeName,
    pub(crate) human: EntityTypeName,
    /// Resource kinds' type names already made ([`Names::kind`]).
    kinds: std::sync::RwLock<HashMap<String, EntityTypeName>>,
}

/// At most this many resource kinds' type names are remembered; a kind beyond them is made
/// every time it comes (same answer, Cedar's parser run again).
const KINDS_REMEMBERED: usize = 256;

impl Names {
    pub(crate) fn new() -> Result<Self, InputError> {
        let name =
            |s: &str| EntityTypeName::from_str(s).map_err(|e| InputError::Cedar(e.to_string()));
        Ok(Self {
            action: name("Action")?,
            role: name("Role")?,
            tool: name("Tool")?,
            agent: name("Agent")?,
            human: name("Human")?,
            kinds: std::sync::RwLock::default(),
        })
    }

    /// [`kind_type_name`] of `kind`, made once: making one runs Cedar's name parser, a few
    /// microseconds — the largest part of preparing a request with a resource. A kind that
    /// is refused is refused every time (never remembered).
    pub(crate) fn kind(&self, kind: &str) -> Result<EntityTypeName, InputError> {
        if let Ok(known) = self.kinds.read()
            && let Some(ty) = known.get(kind)
        {
            return Ok(ty.clone());
        }
        let ty = kind_type_name(kind)?;
        if let Ok(mut known) = self.kinds.write()
            && known.len() < KINDS_REMEMBERED
        {
            known.insert(kind.to_owned(), ty.clone());
        }
        Ok(ty)
    }
}

pub(crate) fn uid(ty: &EntityTypeName, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
}

/// `purchase_order` → `PurchaseOrder`.
pub(crate) fn kind_type_name(kind: &str) -> Result<EntityTypeName, InputError> {
    let bad = || InputError::BadKind(kind.to_owned());
    if kind.is_empty()
        || !kind.starts_with(|c: char| c.is_ascii_lowercase())
        || !kind
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(bad());
    }
    let mut name = String::with_capacity(kind.len());
    for part in kind.split('_') {
        let mut chars = part.chars();
        let Some(first) = chars.next() else {
            return Err(bad());
        };
        name.push(first.to_ascii_uppercase());
        name.extend(chars);
    }
    EntityTypeName::from_str(&name).map_err(|_| bad())
}

/// The principal entity: `Agent::"id"` / `Human::"id"` with `role`, `tenant` and `acts_for`,
/// member of `Role::"<role>"`.
pub(crate) fn principal_entity(names: &Names, p: &Principal) -> Result<Entity, InputError> {
    let ty = match p.kind {
        super::types::PrincipalKind::Agent => &names.agent,
        super::types::PrincipalKind::Human => &names.human,
    };
    let attrs = HashMap::from([
        (
            "role".to_owned(),
            RestrictedExpression::new_string(p.role.clone()),
        ),
        (
            "tenant".to_owned(),
            RestrictedExpression::new_string(p.tenant.clone()),
        ),
        (
            "acts_for".to_owned(),
            RestrictedExpression::new_string(p.party().to_owned()),
        ),
    ]);
    let parents = HashSet::from([uid(&names.role, &p.role)]);
    Entity::new(uid(ty, &p.id), attrs, parents).map_err(|e| InputError::Cedar(e.to_string()))
}

/// A resource entity: `<Kind>::"id"` with `tenant`, `owner` (when known) and the converted
/// attributes.
pub(crate) fn resource_entity(names: &Names, fact: &ResourceFact) -> Result<Entity, InputError> {
    let ty = names.kind(&fact.kind)?;
    let mut attrs = HashMap::new();
    for reserved in ["tenant", "owner"] {
        if fact.attrs.contains_key(reserved) {
            return Err(InputError::ReservedAttribute(
                fact.id.clone(),
                reserved.into(),
            ));
        }
    }
    let at = Path::Entity(&fact.kind, &fact.id);
    for (k, v) in convert_members(&fact.attrs, &at)? {
        attrs.insert(k, v);
    }
    attrs.insert(
        "tenant".to_owned(),
        RestrictedExpression::new_string(fact.tenant.clone()),
    );
    if let Some(owner) = &fact.owner {
        attrs.insert(
            "owner".to_owned(),
            RestrictedExpression::new_string(owner.clone()),
        );
    }
    Entity::new(uid(&ty, &fact.id), attrs, HashSet::new())
        .map_err(|e| InputError::Cedar(e.to_string()))
}

/// The stand-in resource for a call that points at no record: `Tool::"<name>"` in the
/// caller's tenant.
pub(crate) fn tool_entity(names: &Names, req: &Request) -> Result<Entity, InputError> {
    let attrs = HashMap::from([(
        "tenant".to_owned(),
        RestrictedExpression::new_string(req.principal.tenant.clone()),
    )]);
    Entity::new(uid(&names.tool, &req.tool.name), attrs, HashSet::new())
        .map_err(|e| InputError::Cedar(e.to_string()))
}

/// `{ args: <arguments>, call: { tenant, task_origin, approval, now } }`.
pub(crate) fn context(req: &Request) -> Result<Context, InputError> {
    let Value::Object(args) = &req.arguments else {
        return Err(InputError::ArgumentsNotObject);
    };
    let args = record(convert_members(args, &Path::Root("args"))?)?;
    let call = record(vec![
        (
            "tenant".to_owned(),
            RestrictedExpression::new_string(req.principal.tenant.clone()),
        ),
        (
            "task_origin".to_owned(),
            RestrictedExpression::new_string(req.task_origin.as_str().to_owned()),
        ),
        (
            "approval".to_owned(),
            RestrictedExpression::new_string(req.approval.as_str().to_owned()),
        ),
        (
            "now".to_owned(),
            RestrictedExpression::new_long(req.now.timestamp()),
        ),
    ])?;
    Context::from_pairs([("args".to_owned(), args), ("call".to_owned(), call)])
        .map_err(|e| InputError::Cedar(e.to_string()))
}

fn record(fields: Vec<(String, RestrictedExpression)>) -> Result<RestrictedExpression, InputError> {
    RestrictedExpression::new_record(fields).map_err(|e| InputError::Cedar(e.to_string()))
}

/// Where a converted value sits, for error messages: `args.lines[2].amount`,
/// `invoice:INV-1.total`. Written out only when a conversion fails.
#[derive(Clone, Copy)]
enum Path<'a> {
    /// A top-level name (`args`).
    Root(&'a str),
    /// A resource entity's attributes: its kind and id (`invoice:INV-1`).
    Entity(&'a str, &'a str),
    /// A member of an object.
    Member(&'a Path<'a>, &'a str),
    /// An item of an array.
    Item(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Root(name) => f.write_str(name),
            Self::Entity(kind, id) => write!(f, "{kind}:{id}"),
            Self::Member(parent, name) => write!(f, "{parent}.{name}"),
            Self::Item(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Converts an object's members, applying the money rule at this level.
fn convert_members(
    map: &Map<String, Value>,
    path: &Path<'_>,
) -> Result<Vec<(String, RestrictedExpression)>, InputError> {
    let mut out = Vec::with_capacity(map.len());
    for (name, value) in map {
        let here = Path::Member(path, name);
        if name == MONEY_MINOR_FIELD {
            return Err(InputError::MinorUnitsSupplied(here.to_string()));
        }
        if name == MONEY_FIELD {
            let minor = money_at(map, value, &here)?;
            out.push((
                MONEY_MINOR_FIELD.to_owned(),
                RestrictedExpression::new_long(minor),
            ));
            continue;
        }
        if value.is_null() {
            continue;
        }
        out.push((name.clone(), convert(value, &here)?));
    }
    Ok(out)
}

/// The minor units of `map[amount]`, `None`-free: missing currency or non-number is an error.
pub(crate) fn money_member(
    map: &Map<String, Value>,
    amount: &Value,
    path: &str,
) -> Result<i64, InputError> {
    money_at(map, amount, &Path::Root(path))
}

fn money_at(map: &Map<String, Value>, amount: &Value, path: &Path<'_>) -> Result<i64, InputError> {
    let Some(currency) = map.get(CURRENCY_FIELD).and_then(Value::as_str) else {
        return Err(InputError::AmountWithoutCurrency(path.to_string()));
    };
    let Value::Number(n) = amount else {
        return Err(InputError::AmountNotNumber(path.to_string()));
    };
    to_minor_units(n, currency).map_err(|source| InputError::Money {
        path: path.to_string(),
        source,
    })
}

fn convert(value: &Value, path: &Path<'_>) -> Result<RestrictedExpression, InputError> {
    Ok(match value {
        Value::Bool(b) => RestrictedExpression::new_bool(*b),
        Value::String(s) => RestrictedExpression::new_string(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                RestrictedExpression::new_long(i)
            } else if n.is_u64() {
                return Err(InputError::IntegerRange(path.to_string()));
            } else {
                // `4.0` and `4` are the same JSON number (and canonicalise alike): integral
                // doubles within the exact range are Longs too.
                match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() <= MAX_EXACT => {
                        // INVARIANT: |f| ≤ 2^53 and integral, so the cast is exact.
                        #[allow(clippy::cast_possible_truncation)]
                        RestrictedExpression::new_long(f as i64)
                    }
                    Some(_) | None => return Err(InputError::Fractional(path.to_string())),
                }
            }
        }
        Value::Array(items) => {
            let mut set = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let here = Path::Item(path, i);
                if item.is_null() {
                    return Err(InputError::NullInArray(here.to_string()));
                }
                set.push(convert(item, &here)?);
            }
            RestrictedExpression::new_set(set)
        }
        Value::Object(map) => record(convert_members(map, path)?)?,
        // Members that are null are skipped by the caller; a bare null has no Cedar value.
        Value::Null => return Err(InputError::NullInArray(path.to_string())),
    })
}
