//! The redaction key's fingerprint in the trail: recorded at start when it is new or rotated.

use serde_json::{Map, Value, json};

use super::{AuditEvent, AuditRecord, NewAuditRecord};
use crate::store::{Store, StoreError};

impl Store {
    /// The redaction key fingerprint recorded last (by [`Store::record_redaction_key`]).
    pub async fn last_redaction_key_fingerprint(&self) -> Result<Option<String>, StoreError> {
        // Records are canonical JSON, so the member is spelled exactly so.
        let rows: Vec<(String,)> = crate::store::on_pool!(self, |p| {
            sqlx::query_as(
                "SELECT record FROM audit WHERE event = 'operational' \
                 AND record LIKE '%\"kind\":\"redaction_key\"%' ORDER BY pos DESC LIMIT 1",
            )
            .fetch_all(p)
            .await?
        });
        let Some((text,)) = rows.into_iter().next() else {
            return Ok(None);
        };
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| StoreError::Conflict(format!("stored audit record: {e}")))?;
        Ok(value
            .pointer("/detail/fingerprint")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// Records `fingerprint` as an `operational` event `{kind: "redaction_key", fingerprint}`
    /// when it differs from the last one recorded (a first key, or a rotation). Returns the
    /// record appended, if any.
    pub async fn record_redaction_key(
        &self,
        fingerprint: &str,
        key_id: &str,
        actor: &str,
    ) -> Result<Option<AuditRecord>, StoreError> {
        let last = self.last_redaction_key_fingerprint().await?;
        if last.as_deref() == Some(fingerprint) {
            return Ok(None);
        }
        let mut detail = Map::new();
        detail.insert("kind".into(), json!("redaction_key"));
        detail.insert("fingerprint".into(), json!(fingerprint));
        detail.insert("key_id".into(), json!(key_id));
        detail.insert("previous".into(), json!(last));
        self.append_audit(&NewAuditRecord {
            event: Some(AuditEvent::Operational),
            actor: Some(actor.to_string()),
            detail,
            ..NewAuditRecord::default()
        })
        .await
        .map(Some)
    }
}
