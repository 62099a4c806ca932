//! What the admin page says after an action: a fixed sentence per known code, never text
//! from the query string.

/// The message for a `?done=` code.
pub fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "proposed" => "Proposal recorded. It takes effect only when a second admin approves it.",
        "approved" => "Approved: the change is now a new registry version, in force immediately.",
        "rejected" => "Rejected. The registry is unchanged.",
        "superseded" => {
            "Not applied: the registry changed since this proposal was made, so it is now \
             superseded. Propose again against the current version."
        }
        "revoked" => "Credential revoked. The agent is refused from its next request.",
        "bound" => {
            "Saved: the credential's party and task origin apply from its next call. The \
             change is in the audit trail."
        }
        "stopped" => {
            "Emergency stop is on: no step that has not started will start, the active runs it \
             covers are stopped and their agents' credentials revoked."
        }
        "sessions_ended" => {
            "Done: that person's sessions in your tenant have ended; their next request needs \
             a new sign-in (which reads their roles afresh)."
        }
        "lifted" => {
            "Emergency stop lifted. Steps may execute again; credentials it revoked stay \
             revoked unless you chose to restore them."
        }
        _ => return None,
    })
}

/// The message for a `?error=` code.
pub fn error_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "no_change" => "Nothing was changed in the form: there is nothing to propose.",
        "note" => "Say why: a proposal needs a note. Nothing was proposed.",
        "reason" => "A reason is required. Nothing was changed.",
        "stale" => {
            "The registry changed while you were editing. Nothing was proposed; review the \
             current matrix and propose again."
        }
        "invalid" => {
            "That change would leave the registry invalid (for instance a tool listed for no \
             role, a gated tool without approval settings, or a value that is not well \
             formed). Nothing was proposed."
        }
        "own" => "You proposed this change, so a second admin must approve it.",
        "platform" => {
            "That needs the platform admin role (it spans every tenant). Nothing was changed."
        }
        "scope" => "Choose which stop: your tenant's or every tenant's. Nothing was changed.",
        "person" => "Name the person as ISSUER#SUBJECT. Nothing was changed.",
        "not_pending" => "This proposal is no longer waiting for a decision.",
        "not_found" => "There is no such proposal, tool or credential.",
        "not_shadow" => {
            "That is not a shadow rule of the version in force (or its @shadow could not be \
             removed cleanly). Nothing was proposed."
        }
        "verdict" => "Choose approve or reject. Nothing was decided.",
        "agent" => {
            "The credential could not be created: name, a known role and a tenant are \
             required, the name must be unused, and an expiry looks like 30d or 12h."
        }
        "binding" => {
            "The binding was not saved: the credential must be active and not an execution \
             credential, and the origin one of user, schedule, monitor or external."
        }
        "unavailable" => "The database did not answer. Nothing was changed; try again.",
        _ => return None,
    })
}
