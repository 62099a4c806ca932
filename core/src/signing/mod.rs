//! Signed approvals: the challenge a countersignature signs ([`challenge`]), the WebAuthn
//! checks that make a passkey's assertion one ([`webauthn`]), the signed decision
//! ([`decide`]) and offline verification from an audit trail ([`offline`]).

pub mod challenge;
pub mod decide;
pub mod offline;
pub mod verified;
pub mod webauthn;
