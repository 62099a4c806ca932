//! Passkeys: the page where a person registers and removes the passkeys that sign their
//! approvals (and an admin revokes any of their tenant's), and the part of a gate's page that
//! shows what a signed approval signs.
//!
//! Invariants:
//! * The server function returns rows only to a signed-in person with a role and a tenant
//!   ([`crate::access::person_with`]): their own passkeys, and the tenant's for an admin.
//! * Registering, removing and revoking are plain HTML forms posted to the server, which
//!   checks everything again; the WebAuthn ceremony itself runs in `/assets/passkeys.js`
//!   (`data-passkey` forms), which only fills hidden fields the server verifies.
//! * Messages shown after an action come from fixed codes ([`notice_text`], [`error_text`]);
//!   no text from the query string is ever shown.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::access::{Refused, RefusedNote};
use crate::inbox::SignatureNeeds;

/// One passkey as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PasskeyRow {
    /// Credential id (base64url): the forms' target.
    pub credential_id: String,
    /// The owner's name for it.
    pub label: String,
    /// Who owns it (a name).
    pub owner: String,
    /// When it was added, UTC text.
    pub added: String,
    /// When it last signed, UTC text.
    pub last_used: Option<String>,
    /// When and by whom it was removed or revoked.
    pub ended: Option<String>,
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PasskeysData {
    /// This person's passkeys, newest first.
    pub mine: Vec<PasskeyRow>,
    /// Every passkey of the tenant (admins only).
    pub tenant: Option<Vec<PasskeyRow>>,
    /// The person signed in recently enough to add one.
    pub fresh: bool,
    /// The origin passkeys work on, when this server can use them at all.
    pub origin: Option<String>,
}

/// What the page shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PasskeysView {
    /// Not for this person.
    Refused(Refused),
    /// Their passkeys.
    Page(PasskeysData),
}

/// The server's side of the page.
#[cfg(feature = "ssr")]
pub trait PasskeySource: Send + Sync + 'static {
    /// The page's data for `person` (admins also see the tenant's passkeys).
    fn page<'a>(
        &'a self,
        person: &'a countersign_core::Person,
    ) -> crate::inbox::BoxFuture<'a, Result<PasskeysData, String>>;
}

/// The context value the server provides.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct Passkeys(pub std::sync::Arc<dyn PasskeySource>);

/// Loads the page's data.
#[leptos::server]
pub async fn load_passkeys() -> Result<PasskeysView, ServerFnError> {
    let (person, _) = match crate::access::person_with(&countersign_core::AppRole::ALL)? {
        Ok(p) => p,
        Err(why) => return Ok(PasskeysView::Refused(why)),
    };
    let source = use_context::<Passkeys>()
        .ok_or_else(|| ServerFnError::new("passkeys are not available"))?;
    source
        .0
        .page(&person)
        .await
        .map(PasskeysView::Page)
        .map_err(ServerFnError::new)
}

/// The message after an action that went through.
pub fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "registered" => "Passkey added. Its public key is recorded in the audit trail.",
        "removed" => "Passkey removed. It signs nothing from now on; the removal is recorded.",
        "revoked" => "Passkey revoked. It signs nothing from now on; the revocation is recorded.",
        _ => return None,
    })
}

/// The message after a refused action (also the JSON API's error text).
pub fn error_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "step_up" => {
            "Sign in again first: a passkey is added only within 10 minutes of a sign-in. \
             Nothing was added."
        }
        "tenant" => "Your sign-in names no tenant, so you cannot hold passkeys here.",
        "no_rp" => {
            "Passkeys cannot work on this address: the server's public URL must be a host \
             name (or http://localhost)."
        }
        "expired" => "The registration took too long. Try again. Nothing was added.",
        "challenge" => "The registration was not for this sign-in. Try again. Nothing was added.",
        "malformed" | "invalid" => {
            "The browser's answer did not verify (another site, or a damaged answer). Nothing \
             was added."
        }
        "user_verification" => {
            "The authenticator did not verify you (PIN or biometrics). Passkeys that sign \
             approvals must. Nothing was added."
        }
        "unsupported" => "Only P-256 (ES256) passkeys are supported. Nothing was added.",
        "duplicate" => "This passkey is registered already.",
        "not_found" => "There is no such passkey of yours.",
        "unavailable" => "The database did not answer. Try again.",
        _ => return None,
    })
}

/// The page's own link to a fresh sign-in.
pub const STEP_UP_HREF: &str = "/auth/login?fresh=1&next=/passkeys";

/// `/passkeys`.
#[component]
pub fn PasskeysPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| load_passkeys());
    let message = crate::query::coded_message(error_text, notice_text);
    view! {
        <section class="space-y-4">
            <h1 class="text-2xl font-semibold">"Passkeys"</h1>
            <p class="text-slate-700">
                "A passkey signs your approvals: the signature binds the exact payment (amount, invoice, inputs hash), the gate, your verdict and the approval's expiry, and anyone holding the audit trail can check it later."
            </p>
            {message}
            <Suspense fallback=|| view! { <p class="text-slate-600">"Loading passkeys…"</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Ok(PasskeysView::Refused(why)) => {
                            view! { <RefusedNote why page="The passkeys page" roles="people with a role"/> }.into_any()
                        }
                        Ok(PasskeysView::Page(d)) => view! { <PasskeysBody d/> }.into_any(),
                        Err(e) => {
                            view! { <p role="alert" class="rounded border border-red-300 bg-red-50 p-3 text-red-900">"Passkeys could not be loaded: " {e.to_string()}</p> }
                                .into_any()
                        }
                    }
                })}
            </Suspense>
        </section>
    }
}

#[component]
fn PasskeysBody(d: PasskeysData) -> impl IntoView {
    let add = match (d.origin.clone(), d.fresh) {
        (None, _) => view! { <p class="text-slate-700">{error_text("no_rp")}</p> }.into_any(),
        (Some(_), false) => view! {
            <p class="text-slate-700">
                "You signed in a while ago: a passkey is added only within 10 minutes of a sign-in. "
                <a href=STEP_UP_HREF data-testid="passkey-step-up" class="text-indigo-700 underline">"Sign in again"</a>
            </p>
        }
        .into_any(),
        (Some(origin), true) => view! {
            <form method="post" action="/passkeys/register" data-passkey="register" class="space-y-3">
                <label for="passkey-label" class="block text-sm font-medium text-slate-800">"Name this passkey (e.g. work laptop)"</label>
                <input id="passkey-label" name="label" maxlength="60" class="w-full max-w-sm rounded border border-slate-500 p-2 focus:outline-none focus:ring-2 focus:ring-indigo-500"/>
                <input type="hidden" name="nonce" value=""/>
                <input type="hidden" name="client_data_json" value=""/>
                <input type="hidden" name="attestation_object" value=""/>
                <p data-passkey-status aria-live="polite" class="text-sm text-slate-700"></p>
                <button type="submit" data-testid="passkey-add" class="rounded bg-indigo-700 px-4 py-2 text-sm font-medium text-white hover:bg-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-500 focus:ring-offset-2">"Add a passkey"</button>
                <p class="text-xs text-slate-600">
                    "Your browser asks your device to create the key and verify you (PIN or biometrics). Passkeys work on " <code>{origin}</code>
                    ". To try without a device: in Chrome's DevTools open More tools → WebAuthn and enable a virtual authenticator environment."
                </p>
            </form>
        }
        .into_any(),
    };
    let mine = d.mine;
    let admin = d.tenant.map(|rows| {
        view! {
            <h2 class="text-lg font-semibold">"Every passkey of your tenant"</h2>
            <KeyTable rows revoke=true/>
        }
    });
    view! {
        <div class="space-y-3 rounded border border-slate-200 bg-white p-4">
            <h2 class="text-lg font-semibold">"Add a passkey"</h2>
            {add}
        </div>
        <h2 class="text-lg font-semibold">"Your passkeys"</h2>
        {if mine.is_empty() {
            view! { <p data-testid="no-passkeys" class="text-slate-700">"You have no passkey yet. Payments whose tool requires a signature cannot be approved without one."</p> }.into_any()
        } else {
            view! { <KeyTable rows=mine revoke=false/> }.into_any()
        }}
        {admin}
    }
}

#[component]
fn KeyTable(rows: Vec<PasskeyRow>, revoke: bool) -> impl IntoView {
    let caption = if revoke {
        "Every passkey of your tenant"
    } else {
        "Your passkeys"
    };
    view! {
        <table class="w-full border-collapse rounded border border-slate-200 bg-white text-left text-sm">
            <caption class="sr-only">{caption}</caption>
            <thead class="bg-slate-100">
                <tr>
                    <th scope="col" class="px-3 py-2">"Passkey"</th>
                    <th scope="col" class="px-3 py-2">"Owner"</th>
                    <th scope="col" class="px-3 py-2">"Added"</th>
                    <th scope="col" class="px-3 py-2">"Last signed"</th>
                    <th scope="col" class="px-3 py-2">"Status"</th>
                </tr>
            </thead>
            <tbody>
                {rows
                    .into_iter()
                    .map(|r| {
                        let action = if revoke {
                            format!("/admin/passkeys/{}/revoke", r.credential_id)
                        } else {
                            format!("/passkeys/{}/remove", r.credential_id)
                        };
                        let verb = if revoke { "Revoke" } else { "Remove" };
                        let name = format!("{verb} passkey {} of {}", r.label, r.owner);
                        let status = match r.ended.clone() {
                            Some(ended) => view! { <span>{ended}</span> }.into_any(),
                            None => view! {
                                <form method="post" action=action>
                                    <button type="submit" aria-label=name data-testid="passkey-end" class="rounded border border-red-700 px-2 py-1 text-red-800 hover:bg-red-50 focus:outline-none focus:ring-2 focus:ring-red-500">{verb}</button>
                                </form>
                            }
                            .into_any(),
                        };
                        view! {
                            <tr data-testid="passkey-row" class="border-t border-slate-200">
                                <td class="px-3 py-2">{r.label}</td>
                                <td class="px-3 py-2">{r.owner}</td>
                                <td class="px-3 py-2">{r.added}</td>
                                <td class="px-3 py-2">{r.last_used.unwrap_or_else(|| "never".into())}</td>
                                <td class="px-3 py-2">{status}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}

/// The signature part of a gate's decision form: what is signed, which signatures the gate
/// has and needs, and the hidden fields the page's script fills.
#[component]
pub fn SignatureFields(needs: SignatureNeeds) -> impl IntoView {
    let no_key = (!needs.has_passkey).then(|| {
        view! {
            <p data-testid="no-passkey" class="rounded border border-amber-300 bg-amber-50 p-3 text-amber-950">
                "This payment must be signed with a passkey, and you have none yet. "
                <a href="/passkeys" class="text-indigo-700 underline">"Add a passkey"</a>
                " first; you may still reject without one."
            </p>
        }
    });
    view! {
        <div data-testid="signature-needs" class="space-y-2 rounded border border-indigo-200 bg-indigo-50 p-3 text-sm">
            <p class="font-medium">"Approving signs exactly this with your passkey:"</p>
            <dl data-testid="signed-fields" class="grid grid-cols-3 gap-1">
                {needs
                    .shown
                    .into_iter()
                    .map(|(k, v)| view! { <dt class="font-medium text-slate-700">{k}</dt><dd class="col-span-2 font-mono">{v}</dd> })
                    .collect_view()}
            </dl>
            <ul data-testid="signature-list" class="list-inside list-disc">
                {needs.given.into_iter().map(|g| view! { <li>{g}" ✓"</li> }).collect_view()}
                {needs.missing.into_iter().map(|m| view! { <li>{m}" — needed"</li> }).collect_view()}
            </ul>
            {no_key}
            <input type="hidden" name="nonce" value=""/>
            <input type="hidden" name="credential_id" value=""/>
            <input type="hidden" name="authenticator_data" value=""/>
            <input type="hidden" name="client_data_json" value=""/>
            <input type="hidden" name="signature" value=""/>
            <p data-passkey-status aria-live="polite" class="text-slate-700"></p>
        </div>
    }
}
