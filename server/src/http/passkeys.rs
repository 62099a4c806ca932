//! Passkeys over HTTP: registering and removing a person's own passkeys, an admin revoking
//! one, and the challenges signed approvals sign.
//!
//! Invariants:
//! * Registration needs a signed-in person with a tenant who signed in within
//!   [`REGISTER_STEP_UP_MS`] (a stolen idle session cannot add a key), a registration nonce
//!   issued to them (once), and an assertion of user verification; the key is stored and
//!   audited with its public key in one transaction ([`countersign_core::Store::register_passkey`]).
//! * A person removes only their own passkeys; an admin revokes any passkey of their own
//!   tenant; both are audited with the key.
//! * A decision challenge is issued only for a gate the person may see
//!   ([`approvals::visible`]), bound to the step as it is now and the gate's own expiry; the
//!   server never signs anything itself and never trusts a challenge sent back.
//! * No relying party (a public URL on a non-loopback IP address): nothing can be registered
//!   or signed, and the answer says why (fail closed).
//! * Forms answer with redirects carrying fixed codes, never free text.

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use countersign_app::inbox::BoxFuture;
use countersign_app::passkeys::{PasskeyRow, PasskeySource, Passkeys, PasskeysData};
use countersign_core::signing::challenge::Signed;
use countersign_core::signing::decide::{NONCE_TTL_MS, REGISTER_PURPOSE};
use countersign_core::signing::webauthn::{WebauthnError, b64, read_registration, unb64};
use countersign_core::store::{NonceTaken, Passkey};
use countersign_core::{AppRole, Person, StoreError};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::approvals::{self, parse_verdict};
use super::inbox::utc;
use super::names::Names;
use super::signature::{CEREMONY_TIMEOUT_MS, issue_batch, issued_json, relying_party};
use crate::AppState;
use crate::auth::{Admin, Approver, CurrentUser, RequireRole};

/// A passkey is registered only within this long of a sign-in (10 minutes).
pub const REGISTER_STEP_UP_MS: i64 = 10 * 60 * 1000;
/// The longest label kept for a passkey.
const MAX_LABEL: usize = 60;

/// The script behind every passkey form (`/assets/passkeys.js`).
const SCRIPT: &str = include_str!("../../assets/passkeys.js");

pub(super) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into(), "code": code}))).into_response()
}

/// `GET /assets/passkeys.js`.
pub async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
        .into_response()
}

/// The WebAuthn user handle of `person`: 32 bytes that name them without saying who they are.
fn user_handle(person: &Person) -> String {
    b64(&Sha256::digest(person.actor().as_bytes()))
}

/// Whether `person` signed in recently enough to add a passkey.
fn fresh_enough(state: &AppState, person: &Person) -> bool {
    let now = state.store.clock().now_ms();
    !person.auth_time_unknown && now - person.auth_time <= REGISTER_STEP_UP_MS
}

/// `POST /api/passkeys/options`: the options `navigator.credentials.create` takes.
pub async fn options(State(state): State<AppState>, user: CurrentUser) -> Response {
    let person = user.0;
    let Some(tenant) = person.tenant.clone().filter(|t| !t.is_empty()) else {
        return error(
            StatusCode::FORBIDDEN,
            "tenant",
            "your sign-in names no tenant",
        );
    };
    let Some(rp) = relying_party(&state) else {
        return error(StatusCode::CONFLICT, "no_rp", NO_RP);
    };
    if !fresh_enough(&state, &person) {
        return error(StatusCode::UNAUTHORIZED, "step_up", STEP_UP);
    }
    let nonce = match state
        .store
        .issue_nonce(
            &tenant,
            &person.approver(),
            REGISTER_PURPOSE,
            &json!({}),
            NONCE_TTL_MS,
        )
        .await
    {
        Ok(n) => n,
        Err(e) => return unavailable(&e),
    };
    let exclude: Vec<String> = match state.store.passkeys_of(&tenant, &person.approver()).await {
        Ok(keys) => keys
            .into_iter()
            .filter(|k| k.revoked_at.is_none())
            .map(|k| k.credential_id)
            .collect(),
        Err(e) => return unavailable(&e),
    };
    Json(json!({
        "nonce": nonce,
        // The challenge is the nonce's own bytes.
        "challenge": nonce,
        "rp": {"id": rp.id, "name": "Countersign"},
        "user": {"id": user_handle(&person), "name": person.email.clone().unwrap_or_else(|| person.name.clone()), "displayName": person.name},
        "exclude_credentials": exclude,
        "timeout_ms": CEREMONY_TIMEOUT_MS,
    }))
    .into_response()
}

const NO_RP: &str = "passkeys need this server's public URL to be a host name (or \
     http://localhost): set public_url";
const STEP_UP: &str = "sign in again first: a passkey is added only within 10 minutes of a sign-in";

fn unavailable(e: &StoreError) -> Response {
    tracing::error!(error = %e, "passkeys: store failed");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the database did not answer",
    )
}

/// A registration as the browser returned it (base64url fields).
#[derive(Debug, Deserialize)]
pub struct RegistrationBody {
    /// The person's name for the key.
    #[serde(default)]
    pub label: String,
    /// The nonce from [`options`].
    pub nonce: String,
    /// `response.clientDataJSON`.
    pub client_data_json: String,
    /// `response.attestationObject`.
    pub attestation_object: String,
}

/// Registers `body` for `person`: the fixed code of a refusal otherwise.
async fn register_as(
    state: &AppState,
    person: &Person,
    body: &RegistrationBody,
) -> Result<String, &'static str> {
    let tenant = person
        .tenant
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or("tenant")?;
    let rp = relying_party(state).ok_or("no_rp")?;
    if !fresh_enough(state, person) {
        return Err("step_up");
    }
    let approver = person.approver();
    match state
        .store
        .take_nonce(tenant, &approver, REGISTER_PURPOSE, &body.nonce)
        .await
    {
        Ok(NonceTaken::Fresh(_)) => {}
        Ok(NonceTaken::Expired) => return Err("expired"),
        Ok(NonceTaken::Used | NonceTaken::Unknown) => return Err("challenge"),
        Err(e) => {
            tracing::error!(error = %e, "passkeys: nonce");
            return Err("unavailable");
        }
    }
    let challenge = unb64(&body.nonce, "nonce").map_err(|_| "challenge")?;
    let cd = unb64(&body.client_data_json, "client data").map_err(|_| "malformed")?;
    let att = unb64(&body.attestation_object, "attestation").map_err(|_| "malformed")?;
    let reg = read_registration(&rp, &cd, &att, &challenge).map_err(|e| match e {
        WebauthnError::UserVerification => "user_verification",
        WebauthnError::UnsupportedKey => "unsupported",
        _ => "invalid",
    })?;
    let label: String = body.label.trim().chars().take(MAX_LABEL).collect();
    let label = if label.is_empty() {
        "passkey".to_string()
    } else {
        label
    };
    match state
        .store
        .register_passkey(tenant, &approver, &label, &reg, &rp)
        .await
    {
        Ok(key) => Ok(key.credential_id),
        Err(StoreError::Conflict(_)) => Err("duplicate"),
        Err(e) => {
            tracing::error!(error = %e, "passkeys: registering");
            Err("unavailable")
        }
    }
}

/// `POST /api/passkeys`: registers a passkey (JSON).
pub async fn register(
    State(state): State<AppState>,
    user: CurrentUser,
    Json(body): Json<RegistrationBody>,
) -> Response {
    match register_as(&state, &user.0, &body).await {
        Ok(id) => (StatusCode::CREATED, Json(json!({"credential_id": id}))).into_response(),
        Err(code) => error(
            match code {
                "step_up" => StatusCode::UNAUTHORIZED,
                "tenant" => StatusCode::FORBIDDEN,
                "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
                "no_rp" | "duplicate" => StatusCode::CONFLICT,
                _ => StatusCode::BAD_REQUEST,
            },
            code,
            countersign_app::passkeys::error_text(code).unwrap_or("refused"),
        ),
    }
}

/// `POST /passkeys/register` (HTML form): registers, then back to the page with a fixed code.
pub async fn register_form(
    State(state): State<AppState>,
    user: CurrentUser,
    Form(body): Form<RegistrationBody>,
) -> Response {
    match register_as(&state, &user.0, &body).await {
        Ok(_) => Redirect::to("/passkeys?done=registered").into_response(),
        Err(code) => Redirect::to(&format!("/passkeys?error={code}")).into_response(),
    }
}

/// `POST /passkeys/{id}/remove` (HTML form): the owner removes their passkey.
pub async fn remove_form(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(id): Path<String>,
) -> Response {
    let person = user.0;
    let Some(tenant) = person.tenant.clone() else {
        return Redirect::to("/passkeys?error=tenant").into_response();
    };
    let approver = person.approver();
    match state
        .store
        .revoke_passkey(&tenant, &id, &person.actor(), Some(&approver))
        .await
    {
        Ok(true) => Redirect::to("/passkeys?done=removed").into_response(),
        Ok(false) => Redirect::to("/passkeys?error=not_found").into_response(),
        Err(e) => {
            tracing::error!(error = %e, "passkeys: removing");
            Redirect::to("/passkeys?error=unavailable").into_response()
        }
    }
}

/// `POST /admin/passkeys/{id}/revoke` (HTML form): an admin revokes a passkey of their tenant.
pub async fn revoke_form(
    State(state): State<AppState>,
    admin: RequireRole<Admin>,
    Path(id): Path<String>,
) -> Response {
    let person = admin.0;
    let Some(tenant) = person.tenant.clone() else {
        return Redirect::to("/passkeys?error=tenant").into_response();
    };
    match state
        .store
        .revoke_passkey(&tenant, &id, &person.actor(), None)
        .await
    {
        Ok(true) => Redirect::to("/passkeys?done=revoked").into_response(),
        Ok(false) => Redirect::to("/passkeys?error=not_found").into_response(),
        Err(e) => {
            tracing::error!(error = %e, "passkeys: revoking");
            Redirect::to("/passkeys?error=unavailable").into_response()
        }
    }
}

/// The body of a challenge request for one gate.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeBody {
    /// The verdict to sign (`approved`; a rejection needs no signature but may be signed).
    pub verdict: String,
}

/// `POST /api/steps/{id}/challenge`: the challenge this person's passkey signs to decide the
/// gate as it is now.
pub async fn challenge(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    Path(step_id): Path<String>,
    Json(body): Json<ChallengeBody>,
) -> Response {
    let person = approver.0;
    let Some(verdict) = parse_verdict(&body.verdict) else {
        return error(
            StatusCode::BAD_REQUEST,
            "verdict",
            "verdict must be approved or rejected",
        );
    };
    let Some(rp) = relying_party(&state) else {
        return error(StatusCode::CONFLICT, "no_rp", NO_RP);
    };
    let step = match state.store.get_step(&step_id).await {
        Ok(s) => s,
        Err(StoreError::NotFound) => {
            return error(StatusCode::NOT_FOUND, "not_found", "no such step");
        }
        Err(e) => return unavailable(&e),
    };
    match approvals::visible(&state, &person, &step).await {
        Ok(true) => {}
        Ok(false) => return error(StatusCode::NOT_FOUND, "not_found", "no such step"),
        Err(e) => return unavailable(&e),
    }
    let (Some(expires_at), Some(tenant)) = (step.expires_at, person.tenant.as_deref()) else {
        return error(
            StatusCode::CONFLICT,
            "not_waiting",
            "this step is not waiting for approval",
        );
    };
    let signed = Signed::Step {
        step_id: step.id.clone(),
        inputs_hash: step.inputs_hash.clone(),
    };
    match state
        .store
        .issue_decision_challenge(tenant, &person.approver(), &signed, verdict, expires_at)
        .await
    {
        Ok(issued) => Json(issued_json(&rp, &issued)).into_response(),
        Err(e) => unavailable(&e),
    }
}

/// `POST /api/gates/batch/challenge`: the one challenge a batch over these bounds signs: the
/// ordered (step id, inputs hash) pairs of its steps as they are now, and its expiry.
pub async fn batch_challenge(
    State(state): State<AppState>,
    approver: RequireRole<Approver>,
    Json(body): Json<approvals::BatchBody>,
) -> Response {
    let person = approver.0;
    let Some(tenant) = person.tenant.clone() else {
        return error(
            StatusCode::FORBIDDEN,
            "tenant",
            "your sign-in names no tenant",
        );
    };
    let grant = body.into_grant(tenant);
    match issue_batch(&state, &person, &grant).await {
        Ok(out) => Json(out).into_response(),
        Err(resp) => resp,
    }
}

/// The store-backed [`PasskeySource`].
pub struct PasskeyBackend(pub AppState);

/// The context value the router provides to the dashboard.
pub fn context(state: &AppState) -> Passkeys {
    Passkeys(std::sync::Arc::new(PasskeyBackend(state.clone())))
}

impl PasskeyBackend {
    async fn data(&self, person: &Person) -> Result<PasskeysData, StoreError> {
        let state = &self.0;
        let tenant = person.tenant.clone().unwrap_or_default();
        let names = Names::load(&state.store, &tenant).await?;
        let row = |k: Passkey| PasskeyRow {
            owner: names.person(&format!("person:{}#{}", k.iss, k.sub)),
            added: utc(k.created_at),
            last_used: k.last_used_at.map(utc),
            ended: k.revoked_at.map(|at| {
                let by = k
                    .revoked_by
                    .as_deref()
                    .map_or_else(String::new, |b| format!(" by {}", names.actor(b)));
                format!("ended {}{by}", utc(at))
            }),
            credential_id: k.credential_id,
            label: k.label,
        };
        let mine = state
            .store
            .passkeys_of(&tenant, &person.approver())
            .await?
            .into_iter()
            .map(row)
            .collect();
        let all = if person.has_role(AppRole::Admin) {
            Some(
                state
                    .store
                    .passkeys_of_tenant(&tenant)
                    .await?
                    .into_iter()
                    .map(row)
                    .collect(),
            )
        } else {
            None
        };
        Ok(PasskeysData {
            mine,
            tenant: all,
            fresh: fresh_enough(state, person),
            origin: relying_party(state).map(|rp| rp.origin),
        })
    }
}

impl PasskeySource for PasskeyBackend {
    fn page<'a>(&'a self, person: &'a Person) -> BoxFuture<'a, Result<PasskeysData, String>> {
        Box::pin(async move {
            self.data(person).await.map_err(|e| {
                tracing::error!(error = %e, "passkeys: reading failed");
                "the database did not answer".to_string()
            })
        })
    }
}
