use super::soft::SoftPasskey;
use super::*;

fn rp() -> RelyingParty {
    RelyingParty {
        id: "localhost".into(),
        origin: "http://localhost:3000".into(),
    }
}

#[test]
fn a_registration_yields_the_key_that_verifies_later_assertions() {
    let mut pk = SoftPasskey::new(1);
    let (cd, att) = pk.register(&rp(), b"reg-challenge");
    let reg = read_registration(&rp(), &cd, &att, b"reg-challenge").expect("registers");
    assert_eq!(reg.credential_id, pk.credential_id);
    assert_eq!(reg.cose_key, pk.cose_key());
    assert_eq!(reg.sign_count, 0);
    let a = pk.assert(&rp(), b"approve");
    assert_eq!(
        verify_assertion(&rp(), &reg.cose_key, 0, &a, b"approve"),
        Ok(1)
    );
}

#[test]
fn registrations_are_refused_for_another_challenge_origin_site_or_without_verification() {
    let pk = SoftPasskey::new(2);
    let (cd, att) = pk.register(&rp(), b"c");
    assert_eq!(
        read_registration(&rp(), &cd, &att, b"other"),
        Err(WebauthnError::Challenge)
    );
    let other_origin = RelyingParty {
        origin: "http://evil.example".into(),
        ..rp()
    };
    let (cd2, att2) = pk.register(&other_origin, b"c");
    assert!(matches!(
        read_registration(&rp(), &cd2, &att2, b"c"),
        Err(WebauthnError::Origin(_))
    ));
    let other_site = RelyingParty {
        id: "evil.example".into(),
        ..rp()
    };
    let (cd3, att3) = pk.register(&other_site, b"c");
    assert_eq!(
        read_registration(&rp(), &cd3, &att3, b"c"),
        Err(WebauthnError::RpId)
    );
    let mut no_uv = pk.clone();
    no_uv.user_verified = false;
    let (cd4, att4) = no_uv.register(&rp(), b"c");
    assert_eq!(
        read_registration(&rp(), &cd4, &att4, b"c"),
        Err(WebauthnError::UserVerification)
    );
    // An assertion is not a registration.
    let a = SoftPasskey::new(2).assert(&rp(), b"c");
    assert!(matches!(
        read_registration(&rp(), &a.client_data_json, &att, b"c"),
        Err(WebauthnError::WrongType(_))
    ));
    assert!(matches!(
        read_registration(&rp(), &cd, b"\xa0", b"c"),
        Err(WebauthnError::Malformed(_))
    ));
}

#[test]
fn assertions_are_refused_for_each_broken_property() {
    let mut pk = SoftPasskey::new(3);
    let key = pk.cose_key();
    let good = pk.assert(&rp(), b"x");
    assert_eq!(verify_assertion(&rp(), &key, 0, &good, b"x"), Ok(1));
    // Another challenge (another gate, verdict, approver, expiry or nonce).
    assert_eq!(
        verify_assertion(&rp(), &key, 0, &good, b"y"),
        Err(WebauthnError::Challenge)
    );
    // Another person's key.
    let stranger = SoftPasskey::new(4).cose_key();
    assert_eq!(
        verify_assertion(&rp(), &stranger, 0, &good, b"x"),
        Err(WebauthnError::BadSignature)
    );
    // A counter that did not move forward: replaying the same assertion.
    assert_eq!(
        verify_assertion(&rp(), &key, 1, &good, b"x"),
        Err(WebauthnError::Counter {
            stored: 1,
            presented: 1
        })
    );
    // No user verification.
    pk.user_verified = false;
    let no_uv = pk.assert(&rp(), b"x");
    assert_eq!(
        verify_assertion(&rp(), &key, 0, &no_uv, b"x"),
        Err(WebauthnError::UserVerification)
    );
    // Tampered authenticator data or client data.
    let mut tampered = good.clone();
    tampered.authenticator_data[36] ^= 0x10;
    assert_eq!(
        verify_assertion(&rp(), &key, 0, &tampered, b"x"),
        Err(WebauthnError::BadSignature)
    );
    let mut flags_off = good.clone();
    flags_off.authenticator_data[32] = 0x04;
    assert_eq!(
        verify_assertion(&rp(), &key, 0, &flags_off, b"x"),
        Err(WebauthnError::UserPresence)
    );
}

#[test]
fn authenticators_without_counters_stay_at_zero() {
    let mut pk = SoftPasskey::new(5);
    pk.counting = false;
    let key = pk.cose_key();
    let a = pk.assert(&rp(), b"x");
    assert_eq!(verify_assertion(&rp(), &key, 0, &a, b"x"), Ok(0));
    assert_eq!(
        verify_assertion(&rp(), &key, 7, &a, b"x"),
        Err(WebauthnError::Counter {
            stored: 7,
            presented: 0
        })
    );
}

#[test]
fn only_es256_keys_are_accepted() {
    let ed = coset::CoseKeyBuilder::new_okp_key()
        .algorithm(coset::iana::Algorithm::EdDSA)
        .build()
        .to_vec()
        .expect("encodes");
    assert_eq!(
        verifying_key(&ed).err(),
        Some(WebauthnError::UnsupportedKey)
    );
}

#[test]
fn the_rp_follows_the_public_url_loopback_meaning_localhost() {
    let url = url::Url::parse("http://localhost:3000/").expect("url");
    assert_eq!(RelyingParty::from_public_url(&url), Some(rp()));
    let loopback = url::Url::parse("http://127.0.0.1:3000/").expect("url");
    assert_eq!(RelyingParty::from_public_url(&loopback), Some(rp()));
    let ip = url::Url::parse("http://10.0.0.5:3000/").expect("url");
    assert_eq!(RelyingParty::from_public_url(&ip), None);
    let site = url::Url::parse("https://countersign.example/").expect("url");
    assert_eq!(
        RelyingParty::from_public_url(&site).map(|r| (r.id, r.origin)),
        Some((
            "countersign.example".into(),
            "https://countersign.example".into()
        ))
    );
}
