//! People who use the dashboard: the signed-in user and the application roles.
//!
//! A [`Person`] is only ever built by the server's sign-in code from a verified ID token (or
//! the loopback-only demo sign-in). Authorisation decisions read `roles` and `tenant` from
//! here; a person with no roles may see nothing.

use serde::{Deserialize, Serialize};

/// An application role, granted by the identity provider's groups through the role map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AppRole {
    /// Approves or rejects gated steps.
    Approver,
    /// Sees metrics and runs.
    Manager,
    /// Manages their tenant: its agent credentials, its emergency stop; proposes registry
    /// changes.
    Admin,
    /// Reads the audit trail.
    Auditor,
    /// Holds what spans every tenant: the global emergency stop and approving registry
    /// changes (the registry is shared). Granted beside `admin`, never implied by it.
    PlatformAdmin,
}

impl AppRole {
    /// Every role, in display order.
    pub const ALL: [AppRole; 5] = [
        Self::Approver,
        Self::Manager,
        Self::Admin,
        Self::Auditor,
        Self::PlatformAdmin,
    ];

    /// The role's name as written in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approver => "approver",
            Self::Manager => "manager",
            Self::Admin => "admin",
            Self::Auditor => "auditor",
            Self::PlatformAdmin => "platform_admin",
        }
    }

    /// Parses a role name; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// The signed-in person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Issuer of the identity (OIDC `iss`).
    pub iss: String,
    /// Subject at that issuer (OIDC `sub`).
    pub sub: String,
    /// Display name.
    pub name: String,
    /// E-mail address, if the provider sent one.
    pub email: Option<String>,
    /// Application roles; empty for people the role map does not know.
    pub roles: Vec<AppRole>,
    /// The tenant whose work this person may see, if the provider sent one.
    pub tenant: Option<String>,
    /// When this person signed in (ms since the epoch, the server's clock).
    pub auth_time: i64,
    /// The identity provider did not say when it authenticated them (no `auth_time`): the
    /// sign-in never counts as fresh for a step-up.
    #[serde(default)]
    pub auth_time_unknown: bool,
}

impl Person {
    /// Whether this person holds `role`.
    pub fn has_role(&self, role: AppRole) -> bool {
        self.roles.contains(&role)
    }

    /// The approver identity recorded on approvals.
    pub fn approver(&self) -> crate::approvals::Approver {
        crate::approvals::Approver {
            iss: self.iss.clone(),
            sub: self.sub.clone(),
        }
    }

    /// This person as the one deciding a gate (identity, roles, sign-in time).
    pub fn decider(&self) -> crate::approvals::Decider {
        crate::approvals::Decider {
            approver: self.approver(),
            roles: self.roles.iter().map(|r| r.as_str().to_string()).collect(),
            auth_time: self.auth_time,
            auth_time_unknown: self.auth_time_unknown,
        }
    }

    /// How this person acts in audit records: `person:ISS#SUB`.
    pub fn actor(&self) -> String {
        self.approver().actor()
    }
}
