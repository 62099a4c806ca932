//! Which chain a record joins: its tenant's, else its run's tenant's (looked up once per run and
//! cached), else the system chain.
//!
//! INVARIANT (fail closed): a record naming a tenant other than its run's, records of one
//! transaction spanning chains, and tenant names reserved for chains are refused.

use super::{NewAuditRecord, SYSTEM_CHAIN, chain_of_tenant};
use crate::store::{Store, StoreError};

impl Store {
    /// The one chain `records` join (see [`NewAuditRecord::tenant`]); [`SYSTEM_CHAIN`] when
    /// there are none.
    ///
    /// # Errors
    /// They belong to different chains (a transaction appends to one chain), a record names a
    /// tenant other than its run's, or a tenant name is reserved ([`chain_of_tenant`]).
    pub(crate) async fn chain_for(
        &self,
        records: &[&NewAuditRecord],
    ) -> Result<String, StoreError> {
        let mut chain: Option<String> = None;
        for new in records {
            let this = self.chain_of(new).await?;
            match &chain {
                Some(have) if *have != this => {
                    return Err(StoreError::Conflict(format!(
                        "a transaction appends to one audit chain, not to {have:?} and {this:?}"
                    )));
                }
                Some(_) => {}
                None => chain = Some(this),
            }
        }
        Ok(chain.unwrap_or_else(|| SYSTEM_CHAIN.to_string()))
    }

    /// The chain of one record: its tenant's, else its run's tenant's, else [`SYSTEM_CHAIN`].
    async fn chain_of(&self, new: &NewAuditRecord) -> Result<String, StoreError> {
        let run_tenant = match &new.run_id {
            Some(run) => self.run_tenant(run).await?,
            None => None,
        };
        match (new.tenant.as_deref(), run_tenant.as_deref()) {
            (Some(named), Some(run)) if named != run => Err(StoreError::Conflict(format!(
                "an audit record names tenant {named:?} but its run belongs to {run:?}"
            ))),
            (Some(t), _) | (None, Some(t)) => Ok(chain_of_tenant(Some(t))?),
            (None, None) => Ok(chain_of_tenant(None)?),
        }
    }

    /// The tenant of run `run_id`; `None` when no such run is stored (a record may name a run
    /// that was never written, e.g. a refused call's).
    async fn run_tenant(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        if let Some(t) = self.run_tenants.get(run_id) {
            return Ok(Some(t));
        }
        let tenant: Option<String> = crate::store::on_pool!(self, |p| {
            sqlx::query_scalar("SELECT tenant FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(p)
                .await?
        });
        if let Some(t) = &tenant {
            self.run_tenants.put(run_id, t.to_string());
        }
        Ok(tenant)
    }
}
