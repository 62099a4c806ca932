//! The relying party's half of WebAuthn, for passkeys that sign approvals: reading a
//! registration and verifying an assertion over a challenge the server derived.
//!
//! Why not `webauthn-rs`: it generates every challenge itself and refuses caller-chosen ones
//! (kanidm/webauthn-rs#549), and a countersignature's challenge must be derived from the
//! payment it approves; it also builds on OpenSSL. CBOR is read by `ciborium` and COSE keys by
//! `coset` (Google's COSE types); ECDSA is `p256`. What is hand-written here is the fixed byte
//! layout of authenticator data (W3C WebAuthn §6.1) and the checks.
//!
//! Invariants (each refusal is its own [`WebauthnError`]):
//! * Only ES256 (ECDSA P-256 with SHA-256) keys are accepted; a COSE key is stored verbatim,
//!   as registered, so anyone can verify later signatures from the audit trail alone.
//! * Client data: `type` is `webauthn.create` / `webauthn.get` as expected, `challenge` is
//!   exactly the expected bytes, `origin` is the configured origin, never cross-origin.
//! * Authenticator data: its RP id hash is SHA-256 of the configured RP id; user presence AND
//!   user verification flags are set (a passkey that did not verify its user signs nothing
//!   here); a registration carries attested credential data.
//! * The signature is checked over `authenticatorData ‖ SHA-256(clientDataJSON)` with the
//!   registered key.
//! * Sign counter: when either the stored or the presented counter is non-zero, the presented
//!   one must be greater (a cloned authenticator shows itself by going backwards); two zeros
//!   mean an authenticator without a counter.
//! * Attestation statements are not verified (`none` is what browsers send by default): a
//!   registration proves possession of the key by a signed-in person, not the device's make.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use coset::{CborSerializable, CoseKey, KeyType, Label, iana};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use sha2::{Digest, Sha256};

/// User present.
const FLAG_UP: u8 = 0x01;
/// User verified.
const FLAG_UV: u8 = 0x04;
/// Attested credential data included.
const FLAG_AT: u8 = 0x40;
/// RP id hash (32) + flags (1) + counter (4).
const AUTH_DATA_MIN: usize = 37;
/// AAGUID (16) + credential id length (2), after the fixed part.
const ATTESTED_HEADER: usize = 18;
/// The longest credential id WebAuthn allows.
const MAX_CREDENTIAL_ID: usize = 1023;

/// Who the relying party is: the RP id (a registrable domain, `localhost` in development) and
/// the one origin pages are served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    /// The RP id.
    pub id: String,
    /// The origin, e.g. `https://countersign.example` (no trailing slash).
    pub origin: String,
}

impl RelyingParty {
    /// The RP from the public URL people use: its host is the RP id, its origin the origin.
    /// A loopback address stands for `localhost` (browsers refuse WebAuthn on IP addresses but
    /// treat `http://localhost` as secure): the RP is then `localhost` on the same port, the
    /// origin a person must open to use passkeys. `None` for any other IP address.
    pub fn from_public_url(url: &url::Url) -> Option<Self> {
        let loopback = match url.host()? {
            url::Host::Domain(d) => {
                return Some(Self {
                    id: d.to_string(),
                    origin: url.origin().ascii_serialization(),
                });
            }
            url::Host::Ipv4(ip) => ip.is_loopback(),
            url::Host::Ipv6(ip) => ip.is_loopback(),
        };
        if !loopback {
            return None;
        }
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        Some(Self {
            id: "localhost".into(),
            origin: format!("{}://localhost{port}", url.scheme()),
        })
    }
}

/// Why a registration or an assertion was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebauthnError {
    /// Not well-formed (base64, JSON, CBOR, COSE, lengths).
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The client data's type is not the ceremony's.
    #[error("client data is of type {0:?}")]
    WrongType(String),
    /// The client data's challenge is not the expected one.
    #[error("the passkey signed another challenge")]
    Challenge,
    /// The page that ran the ceremony is not ours.
    #[error("origin {0:?} is not this server's")]
    Origin(String),
    /// The authenticator data is for another RP id.
    #[error("the passkey is for another site")]
    RpId,
    /// User presence flag absent.
    #[error("the authenticator did not test user presence")]
    UserPresence,
    /// User verification flag absent.
    #[error("the authenticator did not verify the user (PIN or biometrics)")]
    UserVerification,
    /// Not an ES256 key.
    #[error("unsupported key: only ES256 (P-256) passkeys are accepted")]
    UnsupportedKey,
    /// The signature does not verify with the registered key.
    #[error("the signature does not verify")]
    BadSignature,
    /// The sign counter did not increase.
    #[error("sign counter went from {stored} to {presented}: a cloned authenticator?")]
    Counter {
        /// The counter last seen.
        stored: u32,
        /// The counter presented.
        presented: u32,
    },
}

/// A credential read from a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The credential id (raw bytes).
    pub credential_id: Vec<u8>,
    /// The COSE public key, verbatim.
    pub cose_key: Vec<u8>,
    /// The counter at registration.
    pub sign_count: u32,
}

/// An assertion as the browser returned it (raw bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assertion {
    /// The credential that signed.
    pub credential_id: Vec<u8>,
    /// Authenticator data.
    pub authenticator_data: Vec<u8>,
    /// Client data JSON, as signed.
    pub client_data_json: Vec<u8>,
    /// DER-encoded ECDSA signature.
    pub signature: Vec<u8>,
}

/// Base64url (no padding), as WebAuthn and the audit records write binary.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Reads base64url, with or without padding.
pub fn unb64(text: &str, what: &'static str) -> Result<Vec<u8>, WebauthnError> {
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| WebauthnError::Malformed(what))
}

/// Checks client data JSON of ceremony `kind` against the RP and the expected challenge.
fn check_client_data(
    rp: &RelyingParty,
    client_data_json: &[u8],
    kind: &str,
    challenge: &[u8],
) -> Result<(), WebauthnError> {
    let cd: serde_json::Value = serde_json::from_slice(client_data_json)
        .map_err(|_| WebauthnError::Malformed("client data"))?;
    let text = |k: &str| cd.get(k).and_then(serde_json::Value::as_str);
    let ty = text("type").ok_or(WebauthnError::Malformed("client data type"))?;
    if ty != kind {
        return Err(WebauthnError::WrongType(ty.into()));
    }
    let presented = unb64(
        text("challenge").ok_or(WebauthnError::Malformed("client data challenge"))?,
        "client data challenge",
    )?;
    if presented != challenge {
        return Err(WebauthnError::Challenge);
    }
    let origin = text("origin").unwrap_or_default();
    if origin != rp.origin || cd.get("crossOrigin") == Some(&serde_json::Value::Bool(true)) {
        return Err(WebauthnError::Origin(origin.into()));
    }
    Ok(())
}

/// The fixed part of authenticator data: checks RP id hash, UP and UV; returns flags and the
/// counter.
fn check_auth_data(rp: &RelyingParty, auth: &[u8]) -> Result<(u8, u32), WebauthnError> {
    if auth.len() < AUTH_DATA_MIN {
        return Err(WebauthnError::Malformed("authenticator data"));
    }
    let rp_hash: [u8; 32] = Sha256::digest(rp.id.as_bytes()).into();
    if auth[..32] != rp_hash {
        return Err(WebauthnError::RpId);
    }
    let flags = auth[32];
    if flags & FLAG_UP == 0 {
        return Err(WebauthnError::UserPresence);
    }
    if flags & FLAG_UV == 0 {
        return Err(WebauthnError::UserVerification);
    }
    let count = u32::from_be_bytes([auth[33], auth[34], auth[35], auth[36]]);
    Ok((flags, count))
}

/// Reads a registration (`navigator.credentials.create`): client data and attestation object,
/// against the RP and the challenge the server issued for it.
pub fn read_registration(
    rp: &RelyingParty,
    client_data_json: &[u8],
    attestation_object: &[u8],
    challenge: &[u8],
) -> Result<Registered, WebauthnError> {
    check_client_data(rp, client_data_json, "webauthn.create", challenge)?;
    let att: ciborium::Value = ciborium::de::from_reader(attestation_object)
        .map_err(|_| WebauthnError::Malformed("attestation object"))?;
    let auth = att
        .as_map()
        .and_then(|m| {
            m.iter()
                .find(|(k, _)| k.as_text() == Some("authData"))
                .and_then(|(_, v)| v.as_bytes())
        })
        .ok_or(WebauthnError::Malformed("attestation object"))?;
    let (flags, sign_count) = check_auth_data(rp, auth)?;
    if flags & FLAG_AT == 0 || auth.len() < AUTH_DATA_MIN + ATTESTED_HEADER {
        return Err(WebauthnError::Malformed("attested credential data"));
    }
    let id_at = AUTH_DATA_MIN + 16;
    let id_len = usize::from(u16::from_be_bytes([auth[id_at], auth[id_at + 1]]));
    let key_at = id_at + 2 + id_len;
    if id_len == 0 || id_len > MAX_CREDENTIAL_ID || auth.len() <= key_at {
        return Err(WebauthnError::Malformed("credential id"));
    }
    let credential_id = auth[id_at + 2..key_at].to_vec();
    // The COSE key is one CBOR item; extensions may follow it. Read one item to find its end.
    let mut rest = &auth[key_at..];
    let before = rest.len();
    let _: ciborium::Value =
        ciborium::de::from_reader(&mut rest).map_err(|_| WebauthnError::Malformed("COSE key"))?;
    let cose_key = auth[key_at..key_at + (before - rest.len())].to_vec();
    verifying_key(&cose_key)?;
    Ok(Registered {
        credential_id,
        cose_key,
        sign_count,
    })
}

/// The ES256 verifying key a stored COSE key holds.
pub fn verifying_key(cose_key: &[u8]) -> Result<VerifyingKey, WebauthnError> {
    let key = CoseKey::from_slice(cose_key).map_err(|_| WebauthnError::Malformed("COSE key"))?;
    if key.kty != KeyType::Assigned(iana::KeyType::EC2) {
        return Err(WebauthnError::UnsupportedKey);
    }
    // WebAuthn credential public keys name their algorithm: only ES256.
    if key.alg != Some(coset::Algorithm::Assigned(iana::Algorithm::ES256)) {
        return Err(WebauthnError::UnsupportedKey);
    }
    let param = |label: iana::Ec2KeyParameter| {
        key.params
            .iter()
            .find(|(l, _)| *l == Label::Int(label as i64))
            .map(|(_, v)| v)
    };
    let curve = param(iana::Ec2KeyParameter::Crv).and_then(|v| v.as_integer());
    if curve != Some((iana::EllipticCurve::P_256 as i64).into()) {
        return Err(WebauthnError::UnsupportedKey);
    }
    let coordinate = |label| {
        param(label)
            .and_then(|v| v.as_bytes())
            .filter(|b| b.len() == 32)
            .ok_or(WebauthnError::Malformed("COSE key coordinates"))
    };
    let (x, y) = (
        coordinate(iana::Ec2KeyParameter::X)?,
        coordinate(iana::Ec2KeyParameter::Y)?,
    );
    let mut point = Vec::with_capacity(65);
    point.push(0x04);
    point.extend_from_slice(x);
    point.extend_from_slice(y);
    VerifyingKey::from_sec1_bytes(&point).map_err(|_| WebauthnError::Malformed("COSE key point"))
}

/// Verifies `assertion` (`navigator.credentials.get`) made with the credential whose COSE key
/// is `cose_key` and last counter `stored_count`, over `challenge`. Returns the new counter.
pub fn verify_assertion(
    rp: &RelyingParty,
    cose_key: &[u8],
    stored_count: u32,
    assertion: &Assertion,
    challenge: &[u8],
) -> Result<u32, WebauthnError> {
    check_client_data(rp, &assertion.client_data_json, "webauthn.get", challenge)?;
    let (_, presented) = check_auth_data(rp, &assertion.authenticator_data)?;
    verify_signature(cose_key, assertion)?;
    if (stored_count != 0 || presented != 0) && presented <= stored_count {
        return Err(WebauthnError::Counter {
            stored: stored_count,
            presented,
        });
    }
    Ok(presented)
}

/// The signature check alone (offline verification re-runs it from the audit trail):
/// ES256 over `authenticatorData ‖ SHA-256(clientDataJSON)`.
pub fn verify_signature(cose_key: &[u8], assertion: &Assertion) -> Result<(), WebauthnError> {
    let key = verifying_key(cose_key)?;
    let signature =
        Signature::from_der(&assertion.signature).map_err(|_| WebauthnError::BadSignature)?;
    let mut signed = assertion.authenticator_data.clone();
    signed.extend_from_slice(&Sha256::digest(&assertion.client_data_json));
    key.verify(&signed, &signature)
        .map_err(|_| WebauthnError::BadSignature)
}

/// The challenge a client data JSON carries (offline verification compares it).
pub fn client_challenge(client_data_json: &[u8]) -> Result<Vec<u8>, WebauthnError> {
    let cd: serde_json::Value = serde_json::from_slice(client_data_json)
        .map_err(|_| WebauthnError::Malformed("client data"))?;
    unb64(
        cd.get("challenge")
            .and_then(serde_json::Value::as_str)
            .ok_or(WebauthnError::Malformed("client data challenge"))?,
        "client data challenge",
    )
}

pub mod soft;

#[cfg(test)]
mod tests;
