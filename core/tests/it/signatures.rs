//! Signed approvals (issue 38), on both backends: a passkey registered with its key in the
//! audit trail, a gate approved only with an assertion over its exact inputs, every way a
//! signature can be wrong refused and audited with its own rule, and offline verification
//! of the trail naming the record an edit broke.

use countersign_core::approvals::{Approver, DecideError, Decider, GateRules, Verdict};
use countersign_core::audit::AuditRecord;
use countersign_core::signing::challenge::Signed;
use countersign_core::signing::decide::Submission;
use countersign_core::signing::offline::verify_signatures;
use countersign_core::signing::verified::SignatureRefusal;
use countersign_core::signing::webauthn::soft::SoftPasskey;
use countersign_core::signing::webauthn::{RelyingParty, b64};
use countersign_core::store::{NewRun, NewStep, Step, Transition};
use countersign_core::{CanonicalJson, Effect, StepStatus, Store};
use serde_json::{Value, json};

use crate::test_clock;

const TENANT: &str = "acme";

fn rp() -> RelyingParty {
    RelyingParty {
        id: "localhost".into(),
        origin: "http://localhost:3000".into(),
    }
}

fn person(sub: &str) -> Decider {
    Decider {
        approver: Approver {
            iss: "https://idp.example".into(),
            sub: sub.into(),
        },
        roles: vec!["approver".into()],
        auth_time: 0,
        auth_time_unknown: false,
    }
}

fn signed_rules(needed: u32) -> GateRules {
    GateRules {
        approver_roles: vec!["approver".into()],
        approvals_needed: needed,
        signature_required: true,
        ..GateRules::default()
    }
}

async fn waiting_step(store: &Store, amount: i64) -> Step {
    let run = store
        .create_run(&NewRun {
            tenant: TENANT.into(),
            principal: "person:https://idp.example#max".into(),
            agent_id: None,
            task: "pay an invoice".into(),
            origin: "user".into(),
            planned: false,
        })
        .await
        .unwrap();
    let inputs = CanonicalJson::from_value(&json!({
        "invoice_id": "INV-1", "amount": amount, "currency": "EUR",
        "iban": "DE89370400440532013000",
    }))
    .unwrap();
    let (step, _) = store
        .open_step(&NewStep {
            run_id: run.id,
            role: "worker.finance".into(),
            tool: "payment.schedule".into(),
            effect: Effect::Write,
            inputs,
            agent_id: None,
            reason: String::new(),
            evidence: vec![],
            observed: None,
            trace_id: "t".into(),
            status: StepStatus::Pending,
        })
        .await
        .unwrap();
    store
        .transition(&Transition {
            step_id: step.id.clone(),
            from: vec![StepStatus::Pending],
            to: Some(StepStatus::NeedsApproval),
            expires_at: Some(store.clock().now_ms() + 3_600_000),
            ..Transition::default()
        })
        .await
        .unwrap()
        .unwrap();
    store.get_step(&step.id).await.unwrap()
}

async fn register(store: &Store, who: &Decider, key: &SoftPasskey) {
    let (cd, att) = key.register(&rp(), b"registration");
    let reg =
        countersign_core::signing::webauthn::read_registration(&rp(), &cd, &att, b"registration")
            .unwrap();
    store
        .register_passkey(TENANT, &who.approver, "laptop", &reg, &rp())
        .await
        .unwrap();
}

/// A challenge for `step` issued to `who` and signed by `key`.
async fn sign(store: &Store, who: &Decider, key: &mut SoftPasskey, step: &Step) -> Submission {
    let issued = store
        .issue_decision_challenge(
            TENANT,
            &who.approver,
            &Signed::Step {
                step_id: step.id.clone(),
                inputs_hash: step.inputs_hash.clone(),
            },
            Verdict::Approved,
            step.expires_at.unwrap(),
        )
        .await
        .unwrap();
    Submission {
        assertion: key.assert(&rp(), &issued.challenge),
        nonce: issued.nonce,
    }
}

async fn decide(
    store: &Store,
    who: &Decider,
    step: &Step,
    rules: &GateRules,
    sub: Option<&Submission>,
) -> Result<(), DecideError> {
    store
        .decide_step_signed(
            Some(&rp()),
            &step.id,
            who,
            rules,
            Verdict::Approved,
            "checked",
            sub,
        )
        .await
        .map(|_| ())
}

async fn refused_rules(store: &Store) -> Vec<String> {
    chain(store)
        .await
        .into_iter()
        .filter(|r| r.event == "refused")
        .filter_map(|r| r.rule)
        .collect()
}

async fn chain(store: &Store) -> Vec<AuditRecord> {
    store.audit_records(TENANT, 1, 10_000).await.unwrap()
}

#[tokio::test]
async fn a_signed_approval_counts_and_verifies_offline() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let ana = person("ana");
        let mut key = SoftPasskey::new(1);
        register(&store, &ana, &key).await;
        let step = waiting_step(&store, 900).await;
        let sub = sign(&store, &ana, &mut key, &step).await;
        decide(&store, &ana, &step, &signed_rules(1), Some(&sub))
            .await
            .expect("a signed approval counts");
        assert_eq!(
            store.get_step(&step.id).await.unwrap().status,
            StepStatus::Pending
        );
        let approval = &store.approvals_for_step(&step.id).await.unwrap()[0];
        let stored: Value = serde_json::from_str(approval.signature.as_deref().unwrap()).unwrap();
        assert_eq!(stored["credential_id"], json!(b64(&key.credential_id)));
        let records = chain(&store).await;
        let approved = records.iter().find(|r| r.event == "approved").unwrap();
        assert!(approved.record.contains("\"authenticator_data\""));
        let report = verify_signatures(&records).expect("the trail verifies");
        assert_eq!((report.signatures, report.registrations), (1, 1));
        // Rejections never need a signature.
        let other = waiting_step(&store, 901).await;
        store
            .decide_step_signed(
                Some(&rp()),
                &other.id,
                &ana,
                &signed_rules(1),
                Verdict::Rejected,
                "no",
                None,
            )
            .await
            .expect("a rejection needs no signature");
    })
    .await;
}

#[tokio::test]
async fn every_wrong_signature_is_refused_and_audited_with_its_own_rule() {
    let (manual, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| {
        let manual = manual.clone();
        async move {
            let ana = person("ana");
            let ben = person("ben");
            let mut key = SoftPasskey::new(2);
            let mut bens = SoftPasskey::new(3);
            register(&store, &ana, &key).await;
            register(&store, &ben, &bens).await;
            let rules = signed_rules(1);
            let refused = |e: Result<(), DecideError>| match e {
                Err(DecideError::Signature(r)) => r,
                other => panic!("expected a signature refusal, got {other:?}"),
            };

            // No assertion at all.
            let step = waiting_step(&store, 100).await;
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, None).await),
                SignatureRefusal::Missing
            );
            // An assertion made for another gate's challenge.
            let other = waiting_step(&store, 200).await;
            let for_other = sign(&store, &ana, &mut key, &other).await;
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, Some(&for_other)).await),
                SignatureRefusal::Challenge
            );
            // One from another person's credential.
            let mut by_ben = sign(&store, &ana, &mut key, &step).await;
            let bens_challenge = by_ben.assertion.client_data_json.clone();
            by_ben.assertion = bens.assert(&rp(), &{
                let cd: Value = serde_json::from_slice(&bens_challenge).unwrap();
                countersign_core::signing::webauthn::unb64(cd["challenge"].as_str().unwrap(), "c")
                    .unwrap()
            });
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, Some(&by_ben)).await),
                SignatureRefusal::Credential
            );
            // User verification absent.
            key.user_verified = false;
            let no_uv = sign(&store, &ana, &mut key, &step).await;
            key.user_verified = true;
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, Some(&no_uv)).await),
                SignatureRefusal::UserVerification
            );
            // A counter that went backwards (a cloned authenticator).
            let good = sign(&store, &ana, &mut key, &step).await;
            let mut clone = key.clone();
            let ahead = sign(&store, &ana, &mut key, &other).await;
            decide(&store, &ana, &other, &rules, Some(&ahead))
                .await
                .expect("the original signs the other gate");
            clone.counter = 0;
            let behind = sign(&store, &ana, &mut clone, &step).await;
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, Some(&behind)).await),
                SignatureRefusal::Counter
            );
            // An expired nonce.
            manual.advance(chrono::Duration::minutes(6));
            assert_eq!(
                refused(decide(&store, &ana, &step, &rules, Some(&good)).await),
                SignatureRefusal::NonceExpired
            );
            // The right one, then the same assertion replayed.
            let right = sign(&store, &ana, &mut key, &step).await;
            let two = signed_rules(2);
            decide(&store, &ana, &step, &two, Some(&right))
                .await
                .expect("the first signature");
            assert_eq!(
                store.get_step(&step.id).await.unwrap().status,
                StepStatus::NeedsApproval,
                "a second signature is still needed"
            );
            let third = waiting_step(&store, 300).await;
            assert_eq!(
                refused(decide(&store, &ana, &third, &rules, Some(&right)).await),
                SignatureRefusal::Replayed,
                "replayed on another gate"
            );
            // A second signature by the first signer.
            let again = sign(&store, &ana, &mut key, &step).await;
            assert_eq!(
                refused(decide(&store, &ana, &step, &two, Some(&again)).await),
                SignatureRefusal::SameSigner
            );
            // Ben's own signature completes the set.
            let bens_sig = sign(&store, &ben, &mut bens, &step).await;
            decide(&store, &ben, &step, &two, Some(&bens_sig))
                .await
                .expect("the second signature");
            assert_eq!(
                store.get_step(&step.id).await.unwrap().status,
                StepStatus::Pending
            );
            let mut rules_seen = refused_rules(&store).await;
            rules_seen.sort();
            let mut want: Vec<String> = [
                "signature.missing",
                "signature.challenge",
                "signature.credential",
                "signature.user_verification",
                "signature.counter",
                "signature.nonce_expired",
                "signature.replay",
                "signature.same_signer",
            ]
            .map(String::from)
            .to_vec();
            want.sort();
            assert_eq!(rules_seen, want);
            verify_signatures(&chain(&store).await).expect("what counted verifies");
        }
    })
    .await;
}

/// Edits `records[i]`'s record text with `edit` (as someone rewriting an export would).
fn edited(records: &[AuditRecord], i: usize, edit: impl Fn(&mut Value)) -> Vec<AuditRecord> {
    let mut out = records.to_vec();
    let mut body: Value = serde_json::from_str(&out[i].record).unwrap();
    edit(&mut body);
    out[i].record = body.to_string();
    out
}

#[tokio::test]
async fn offline_verification_names_the_record_an_edit_broke() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let ana = person("ana");
        let mut key = SoftPasskey::new(4);
        register(&store, &ana, &key).await;
        let step = waiting_step(&store, 300).await;
        let sub = sign(&store, &ana, &mut key, &step).await;
        decide(&store, &ana, &step, &signed_rules(1), Some(&sub))
            .await
            .unwrap();
        let records = chain(&store).await;
        verify_signatures(&records).unwrap();
        let at = records.iter().position(|r| r.event == "approved").unwrap();
        let reg = records
            .iter()
            .position(|r| r.rule.as_deref() == Some("passkey.registered"))
            .unwrap();
        let seq = records[at].seq;
        // The signature.
        let e = verify_signatures(&edited(&records, at, |b| {
            let s = b["detail"]["signature"]["signature"]
                .as_str()
                .unwrap()
                .to_string();
            let flipped = if s.starts_with('M') { "N" } else { "M" };
            b["detail"]["signature"]["signature"] = json!(format!("{flipped}{}", &s[1..]));
        }))
        .unwrap_err();
        assert_eq!(e.seq, seq, "{e}");
        // The inputs hash.
        let e = verify_signatures(&edited(&records, at, |b| {
            b["detail"]["inputs_hash"] = json!(format!("sha256:{}", "0".repeat(64)));
        }))
        .unwrap_err();
        assert_eq!(e.seq, seq, "{e}");
        // The public key of the registration (another valid key): the approval fails.
        let e = verify_signatures(&edited(&records, reg, |b| {
            b["detail"]["cose_key"] = json!(b64(&SoftPasskey::new(9).cose_key()));
        }))
        .unwrap_err();
        assert_eq!(e.seq, seq, "{e}");
        // A key record that is no key at all is named itself.
        let e = verify_signatures(&edited(&records, reg, |b| {
            b["detail"]["cose_key"] = json!("AAAA");
        }))
        .unwrap_err();
        assert_eq!(e.seq, records[reg].seq, "{e}");
    })
    .await;
}

#[tokio::test]
async fn a_revoked_passkey_signs_nothing_and_unsigned_approvals_do_not_count() {
    let (_, clock) = test_clock();
    countersign_core::store::testing::each_backend(clock, |store| async move {
        let ana = person("ana");
        let ben = person("ben");
        let mut key = SoftPasskey::new(6);
        key.counting = false; // a platform passkey without a counter
        register(&store, &ana, &key).await;
        // Signed, then the key is revoked before the decision is made: refused, audited.
        let step = waiting_step(&store, 700).await;
        let sub = sign(&store, &ana, &mut key, &step).await;
        assert!(
            store
                .revoke_passkey(TENANT, &b64(&key.credential_id), "person:admin", None)
                .await
                .unwrap()
        );
        let refused = decide(&store, &ana, &step, &signed_rules(1), Some(&sub)).await;
        assert!(
            matches!(
                refused,
                Err(DecideError::Signature(SignatureRefusal::Credential))
            ),
            "{refused:?}"
        );
        assert!(
            refused_rules(&store)
                .await
                .contains(&"signature.credential".to_string())
        );

        // An approval written without a signature (rules that forgot it) does not count
        // towards a signature-required gate: with two needed, Ben's unsigned one and one
        // signature leave the gate closed.
        let two = waiting_step(&store, 12_000).await;
        store
            .decide_step(
                &two.id,
                &ben,
                &GateRules {
                    signature_required: false,
                    ..signed_rules(2)
                },
                Verdict::Approved,
                "unsigned",
            )
            .await
            .unwrap();
        let mut bens = SoftPasskey::new(7);
        register(&store, &ben, &bens).await;
        let mut other = SoftPasskey::new(8);
        let carl = person("carl");
        register(&store, &carl, &other).await;
        let sub = sign(&store, &carl, &mut other, &two).await;
        decide(&store, &carl, &two, &signed_rules(2), Some(&sub))
            .await
            .unwrap();
        assert_eq!(
            store.get_step(&two.id).await.unwrap().status,
            StepStatus::NeedsApproval,
            "one signature of two"
        );
        // Ben's unsigned approval has lapsed: his signature replaces it and completes the set.
        let sub = sign(&store, &ben, &mut bens, &two).await;
        decide(&store, &ben, &two, &signed_rules(2), Some(&sub))
            .await
            .unwrap();
        assert_eq!(
            store.get_step(&two.id).await.unwrap().status,
            StepStatus::Pending
        );
    })
    .await;
}
