//! Countersign's domain, independent of HTTP and UI.
//!
//! Owns the clock abstraction, secrets, and the [`store::Store`] over SQLite and Postgres.
//! Later modules (registry, policy, keys, approvals, audit) live here too: everything that
//! decides whether an agent's call may run is plain Rust that the server only wires up.

pub mod advisor;
pub mod agents;
pub mod approvals;
pub mod audit;
pub mod batch;
pub mod bundle;
pub mod canonical;
pub mod clock;
pub mod keys;
pub mod model;
pub mod people;
pub mod policy;
pub mod preview;
pub mod redact;
pub mod registry;
pub mod schema;
pub mod secret;
pub mod sessions;
pub mod signing;
pub mod store;

pub use bundle::{Bundle, BundleError, BundleSources};
pub use canonical::{CanonicalError, CanonicalJson, canonicalize};
pub use clock::{Clock, DemoClock, ManualClock, SystemClock};
pub use keys::{IdemKey, InputsHash};
pub use model::{Effect, Gate, StepStatus};
pub use people::{AppRole, Person};
pub use policy::{Decision, DecisionReport, PolicyEngine, Rule};
pub use registry::{Registry, RoleName, ToolName};
pub use secret::Secret;
pub use store::{Backend, Store, StoreError};
