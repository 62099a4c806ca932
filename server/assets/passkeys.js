// Countersign's passkey ceremonies (served at /assets/passkeys.js).
//
// Forms marked `data-passkey` run a WebAuthn ceremony before they are sent:
// - "register": asks the server for creation options, creates a passkey (user verification
//   required) and sends the browser's answer in the form's hidden fields;
// - "approve": for the Approve button only, asks the server for the challenge of this gate
//   (derived from its exact inputs, the step, the verdict, the approver, the approval's
//   expiry and a nonce used once), has the passkey sign it, and sends the assertion;
// - "batch": the inbox's "Approve ticked": one assertion over the ticked gates' ordered
//   (step, inputs hash) pairs, when their tool requires a signature.
// The server verifies everything; this script only carries bytes. Rejections are never
// signed: stopping is always safe.
"use strict";

(function () {
  const b64u = {
    encode(buffer) {
      const bytes = new Uint8Array(buffer);
      let text = "";
      for (const b of bytes) text += String.fromCharCode(b);
      return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    },
    decode(text) {
      const base = text.replace(/-/g, "+").replace(/_/g, "/");
      const padded = base + "===".slice((base.length + 3) % 4);
      const raw = atob(padded);
      const out = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
      return out;
    },
  };

  function status(form, text) {
    const el = form.querySelector("[data-passkey-status]");
    if (el) el.textContent = text;
  }

  function set(form, name, value) {
    const field = form.querySelector(`input[type=hidden][name="${name}"]`);
    if (field) field.value = value;
  }

  async function postJson(path, body) {
    const resp = await fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify(body),
    });
    const data = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(data.error || `the server answered ${resp.status}`);
    return data;
  }

  // Browsers refuse WebAuthn on an IP address: behind a loopback server, passkeys work on
  // http://localhost on the same port.
  function sameSite(rpId) {
    if (rpId && location.hostname !== rpId) {
      const there = `${location.protocol}//${rpId}${location.port ? `:${location.port}` : ""}`;
      throw new Error(`passkeys work on ${there}: open this page there`);
    }
  }

  async function register(form) {
    status(form, "Asking your device to create a passkey…");
    const o = await postJson("/api/passkeys/options", {});
    sameSite(o.rp && o.rp.id);
    const credential = await navigator.credentials.create({
      publicKey: {
        challenge: b64u.decode(o.challenge),
        rp: o.rp,
        user: { id: b64u.decode(o.user.id), name: o.user.name, displayName: o.user.displayName },
        pubKeyCredParams: [{ type: "public-key", alg: -7 }],
        authenticatorSelection: { residentKey: "preferred", userVerification: "required" },
        attestation: "none",
        excludeCredentials: (o.exclude_credentials || []).map((id) => ({
          type: "public-key",
          id: b64u.decode(id),
        })),
        timeout: o.timeout_ms,
      },
    });
    set(form, "nonce", o.nonce);
    set(form, "client_data_json", b64u.encode(credential.response.clientDataJSON));
    set(form, "attestation_object", b64u.encode(credential.response.attestationObject));
  }

  async function approve(form) {
    status(form, "Asking your passkey to sign this approval…");
    const step = form.dataset.step;
    const c = await postJson(`/api/steps/${encodeURIComponent(step)}/challenge`, {
      verdict: "approved",
    });
    await signWith(form, c);
  }

  async function signWith(form, c) {
    sameSite(c.rp_id);
    if (!c.allow_credentials || c.allow_credentials.length === 0) {
      throw new Error("you have no passkey yet: add one on the Passkeys page");
    }
    const assertion = await navigator.credentials.get({
      publicKey: {
        challenge: b64u.decode(c.challenge),
        rpId: c.rp_id,
        allowCredentials: c.allow_credentials.map((id) => ({
          type: "public-key",
          id: b64u.decode(id),
        })),
        userVerification: "required",
        timeout: c.timeout_ms,
      },
    });
    set(form, "nonce", c.nonce);
    set(form, "credential_id", b64u.encode(assertion.rawId));
    set(form, "authenticator_data", b64u.encode(assertion.response.authenticatorData));
    set(form, "client_data_json", b64u.encode(assertion.response.clientDataJSON));
    set(form, "signature", b64u.encode(assertion.response.signature));
  }

  // The inbox's batch: one signature over the ticked gates' ordered (step, inputs hash)
  // pairs, when their tool requires one.
  const SIGNED_FIELDS = [
    "nonce", "credential_id", "authenticator_data", "client_data_json", "signature",
    "batch_expires_at",
  ];

  // Returns whether it signed. A batch the server refuses a challenge for (nothing ticked,
  // several tools) or whose tool needs no signature goes unsigned, with no stale fields, and
  // the server says why; a server or network failure stops it.
  async function batch(form) {
    for (const name of SIGNED_FIELDS) set(form, name, "");
    const steps = new FormData(form).getAll("step");
    if (steps.length === 0) return false;
    const resp = await fetch("/inbox/batch/challenge", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify({ steps }),
    });
    if (resp.status >= 500) throw new Error(`the server answered ${resp.status}`);
    if (!resp.ok) return false;
    const c = await resp.json();
    if (!c.signature) return false;
    status(form, `Asking your passkey to sign ${steps.length} approval(s) at once…`);
    await signWith(form, c);
    set(form, "batch_expires_at", String(c.expires_at));
    return true;
  }

  document.addEventListener(
    "submit",
    async (event) => {
      const form = event.target;
      if (!(form instanceof HTMLFormElement) || !form.dataset.passkey) return;
      // The resubmission below: let it go (synchronously inside requestSubmit).
      if (form.dataset.signed === "1") return;
      const submitter = event.submitter;
      const kind = form.dataset.passkey;
      // Only an approval is signed; a rejection goes as it is.
      if ((kind === "approve" || kind === "batch") && !(submitter && submitter.value === "approved")) return;
      event.preventDefault();
      // One ceremony at a time (a double click must not start a second one).
      if (form.dataset.busy === "1") return;
      if (!window.PublicKeyCredential) {
        status(form, "This browser cannot use passkeys.");
        return;
      }
      form.dataset.busy = "1";
      let sent = false;
      try {
        let signed = true;
        if (kind === "register") await register(form);
        else if (kind === "approve") await approve(form);
        else if (kind === "batch") signed = await batch(form);
        else return;
        status(form, signed ? "Signed. Sending…" : "Sending…");
        form.dataset.signed = "1";
        try {
          form.requestSubmit(submitter || undefined);
          sent = true;
        } finally {
          // A page restored later (back/forward) signs again: its nonce is spent.
          delete form.dataset.signed;
        }
      } catch (e) {
        status(form, `Not sent: ${e && e.message ? e.message : e}`);
      } finally {
        // Busy until the page leaves (no second ceremony meanwhile); see `pageshow` below.
        if (!sent) delete form.dataset.busy;
      }
    },
    true,
  );

  // A page shown again from the back/forward cache starts afresh.
  window.addEventListener("pageshow", (event) => {
    if (!event.persisted) return;
    for (const form of document.querySelectorAll("form[data-passkey]")) {
      delete form.dataset.busy;
      delete form.dataset.signed;
    }
  });
})();
