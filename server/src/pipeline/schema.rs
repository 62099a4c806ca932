//! Stage 3: the closed schema, before anything else looks at the arguments.

use super::answer::Answer;
use super::answer::Flow;
use super::answer::Internal;
use super::answer::err;
use super::ctx::Ctx;
use super::ctx::detail;
use std::ops::ControlFlow::{Break, Continue};

use countersign_core::CanonicalJson;

use countersign_core::Rule;
use countersign_core::audit::AuditEvent;
use serde_json::{Value, json};

/// Schema errors as the caller and the audit see them: `{path, message}` each.
pub(super) fn schema_errors(errors: &[countersign_core::schema::SchemaError]) -> Vec<Value> {
    errors
        .iter()
        .map(|e| json!({"path": e.path, "message": e.message}))
        .collect()
}

/// Stage 3: the arguments fit the tool's closed schema and have a canonical form (RFC 8785);
/// otherwise the call is refused (`input.schema`).
pub(super) async fn closed(ctx: &Ctx<'_>, arguments: &Value) -> Flow<CanonicalJson> {
    if let Err(errors) = ctx
        .loaded
        .bundle
        .registry
        .validate(&ctx.tool.name, arguments)
    {
        return Ok(Break(refuse_invalid(ctx, schema_errors(&errors)).await?));
    }
    match CanonicalJson::from_value(arguments) {
        Ok(canonical) => Ok(Continue(canonical)),
        Err(e) => {
            let errors = vec![json!({"path": "", "message": e.to_string()})];
            Ok(Break(refuse_invalid(ctx, errors).await?))
        }
    }
}

/// Records an `input.schema` refusal, then answers with it.
pub(super) async fn refuse_invalid(ctx: &Ctx<'_>, errors: Vec<Value>) -> Result<Answer, Internal> {
    let record = ctx.record(
        AuditEvent::Refused,
        None,
        Some(Rule::INPUT_SCHEMA.as_str()),
        detail(&[("errors", Value::Array(errors.clone()))]),
    );
    ctx.append(record).await?;
    Ok(err(json!({
        "status": "invalid",
        "rule": "input.schema",
        "errors": errors,
    })))
}
