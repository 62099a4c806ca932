//! A software passkey: an ES256 key that answers registrations and assertions the way a
//! browser and an authenticator would. Tests use seeded ones, with knobs for every way one can
//! go wrong; scenario actors (synthetic people in demos and scenario files) use random ones
//! whose private key lives only in the process that plays them. It verifies no user: its UV
//! flag is a setting, so it is never a person's passkey.

use coset::{CborSerializable, CoseKeyBuilder, iana};
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use sha2::{Digest, Sha256};

use super::{Assertion, RelyingParty, b64};

/// A software authenticator holding one credential.
#[derive(Debug, Clone)]
pub struct SoftPasskey {
    key: SigningKey,
    /// The credential id.
    pub credential_id: Vec<u8>,
    /// The next assertion's counter (incremented before each when `counting`).
    pub counter: u32,
    /// Whether the counter moves (false: always 0, like many platform passkeys).
    pub counting: bool,
    /// Set the UV flag (a user verified by PIN or biometrics).
    pub user_verified: bool,
}

impl SoftPasskey {
    /// A passkey whose key and id derive from `seed` (distinct seeds, distinct keys): for
    /// tests only (its private key is public knowledge).
    #[cfg(any(test, feature = "test-support"))]
    #[allow(clippy::expect_used)]
    pub fn new(seed: u8) -> Self {
        let mut scalar = [0x11u8; 32];
        scalar[31] = seed.max(1);
        scalar[0] = 0x42;
        // A fixed non-zero scalar below the group order: always a valid key.
        let key = SigningKey::from_slice(&scalar).expect("a valid scalar");
        Self {
            key,
            credential_id: vec![seed, 0xC0, 0xDE, seed],
            counter: 0,
            counting: true,
            user_verified: true,
        }
    }

    /// A passkey with a random key and credential id (a scenario actor's).
    pub fn random() -> Result<Self, String> {
        loop {
            let mut scalar = [0u8; 32];
            getrandom::fill(&mut scalar).map_err(|e| format!("random source: {e}"))?;
            // Almost every 32-byte string is a valid scalar; draw again for the rest.
            let Ok(key) = SigningKey::from_slice(&scalar) else {
                continue;
            };
            let mut id = [0u8; 16];
            getrandom::fill(&mut id).map_err(|e| format!("random source: {e}"))?;
            return Ok(Self {
                key,
                credential_id: id.to_vec(),
                counter: 0,
                counting: true,
                user_verified: true,
            });
        }
    }

    /// The COSE public key (what registration stores; empty if it cannot be encoded, which
    /// registration then refuses as malformed).
    pub fn cose_key(&self) -> Vec<u8> {
        let point = self.key.verifying_key().to_sec1_point(false);
        let (Some(x), Some(y)) = (point.x(), point.y()) else {
            return Vec::new();
        };
        CoseKeyBuilder::new_ec2_pub_key(iana::EllipticCurve::P_256, x.to_vec(), y.to_vec())
            .algorithm(iana::Algorithm::ES256)
            .build()
            .to_vec()
            .unwrap_or_default()
    }

    fn client_data(kind: &str, origin: &str, challenge: &[u8]) -> Vec<u8> {
        serde_json::json!({
            "type": kind, "challenge": b64(challenge), "origin": origin, "crossOrigin": false,
        })
        .to_string()
        .into_bytes()
    }

    fn auth_data(&self, rp_id: &str, flags: u8, count: u32) -> Vec<u8> {
        let mut auth = Sha256::digest(rp_id.as_bytes()).to_vec();
        auth.push(flags);
        auth.extend_from_slice(&count.to_be_bytes());
        auth
    }

    fn flags(&self) -> u8 {
        0x01 | if self.user_verified { 0x04 } else { 0 }
    }

    /// A registration for `rp` over `challenge`: (client data JSON, attestation object).
    pub fn register(&self, rp: &RelyingParty, challenge: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut auth = self.auth_data(&rp.id, self.flags() | 0x40, 0);
        auth.extend_from_slice(&[0u8; 16]);
        let id_len = u16::try_from(self.credential_id.len()).unwrap_or(u16::MAX);
        auth.extend_from_slice(&id_len.to_be_bytes());
        auth.extend_from_slice(&self.credential_id);
        auth.extend_from_slice(&self.cose_key());
        let att = ciborium::Value::Map(vec![
            ("fmt".into(), "none".into()),
            ("attStmt".into(), ciborium::Value::Map(vec![])),
            ("authData".into(), ciborium::Value::Bytes(auth)),
        ]);
        let mut bytes = Vec::new();
        ciborium::ser::into_writer(&att, &mut bytes).unwrap_or_default();
        (
            Self::client_data("webauthn.create", &rp.origin, challenge),
            bytes,
        )
    }

    /// An assertion over `challenge` for `rp` (advances the counter when counting).
    pub fn assert(&mut self, rp: &RelyingParty, challenge: &[u8]) -> Assertion {
        if self.counting {
            self.counter += 1;
        }
        let authenticator_data = self.auth_data(&rp.id, self.flags(), self.counter);
        let client_data_json = Self::client_data("webauthn.get", &rp.origin, challenge);
        let mut signed = authenticator_data.clone();
        signed.extend_from_slice(&Sha256::digest(&client_data_json));
        let signature: Signature = self.key.sign(&signed);
        Assertion {
            credential_id: self.credential_id.clone(),
            authenticator_data,
            client_data_json,
            signature: signature.to_der().as_bytes().to_vec(),
        }
    }
}
