//! The expectations of a play, checked on the audit trail and the demo systems' effects: a
//! check that cannot be evaluated fails.

use super::runner::Runner;
use super::script::AuditExpect;
use super::script::SYSTEMS;
use super::script::write_operations;
use super::values::{check_value, subst_str};
use crate::adapters::builtin::ERP;
use crate::adapters::stillon::HOLD_OPERATION;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One checked expectation.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// What was seen when it did not.
    pub detail: String,
}

/// The outcome of a scenario.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Every expectation checked.
    pub checks: Vec<Check>,
    /// Saved variables (run and step ids, …).
    pub vars: BTreeMap<String, Value>,
}

impl Report {
    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

impl Runner<'_, '_> {
    pub(super) async fn expectations(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        let store = &self.target.store;
        let e = &self.scenario.expect;
        let mut push = |name: String, r: Result<(), String>| {
            checks.push(Check {
                name,
                ok: r.is_ok(),
                detail: r.err().unwrap_or_default(),
            });
        };
        let records = match store.audit_in_order(0, 1_000_000).await {
            Ok(r) => r,
            Err(err) => {
                push("read the audit trail".into(), Err(err.to_string()));
                return checks;
            }
        };
        let parsed: Vec<Value> = records
            .iter()
            .map(|r| serde_json::from_str(&r.record).unwrap_or(Value::Null))
            .collect();

        for ec in &e.effects {
            let system = ec.system.as_deref().unwrap_or(ERP);
            let r = match store.demo_effects(system, &ec.operation).await {
                Ok(v) if v.len() == ec.count => Ok(()),
                Ok(v) => Err(format!("{} effects: {v:?}", v.len())),
                Err(err) => Err(err.to_string()),
            };
            push(
                format!("effects: {system} {} x{}", ec.operation, ec.count),
                r,
            );
        }

        for s in &e.steps {
            let r = async {
                let id = subst_str(&s.step, &self.vars)?;
                let step = store.get_step(&id).await.map_err(|e| e.to_string())?;
                if step.status.as_str() != s.status {
                    return Err(format!("{} is {}", step.tool, step.status.as_str()));
                }
                if let Some(rule) = &s.rule
                    && step.rule.as_deref() != Some(rule.as_str())
                {
                    return Err(format!("rule {:?}", step.rule));
                }
                Ok(())
            }
            .await;
            push(format!("step {} is {}", s.step, s.status), r);
        }

        for rs in &e.runs {
            let r = async {
                let id = subst_str(&rs.run, &self.vars)?;
                let run = store.get_run(&id).await.map_err(|e| e.to_string())?;
                if run.status.as_str() != rs.status {
                    return Err(format!("run is {}", run.status.as_str()));
                }
                if let Some(want) = rs.replan
                    && run.replan != want
                {
                    return Err(format!("replan is {}", run.replan));
                }
                Ok(())
            }
            .await;
            push(format!("run {} is {}", rs.run, rs.status), r);
        }

        for oc in &e.objects {
            let r = self.object_check(oc).await;
            push(
                format!(
                    "{} {} {}",
                    oc.system.as_deref().unwrap_or(ERP),
                    oc.kind,
                    oc.id
                ),
                r,
            );
        }

        for a in &e.audit {
            let r = self.audit_expect(a, &records, &parsed);
            push(format!("audit: {}", a.name), r);
        }

        for text in &e.never_in_audit {
            let hit = records.iter().find(|r| r.record.contains(text.as_str()));
            push(
                format!("never in the audit trail: {text}"),
                match hit {
                    None => Ok(()),
                    Some(r) => Err(format!("record {} ({}) has it", r.seq, r.event)),
                },
            );
        }

        if e.chain_verifies {
            let r = match store.verify_audit().await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(b)) => Err(b.to_string()),
                Err(err) => Err(err.to_string()),
            };
            push("the audit chain verifies".into(), r);
        }

        if e.no_unapproved_effects || e.one_effect_per_key {
            let mut effects = Vec::new();
            let mut failed = None;
            for system in SYSTEMS {
                for op in write_operations(system) {
                    match store.demo_effects(system, op).await {
                        Ok(v) => effects.extend(v),
                        Err(err) => failed = Some(err.to_string()),
                    }
                }
            }
            if let Some(err) = failed {
                push("read the effects".into(), Err(err));
            } else {
                if e.one_effect_per_key {
                    let mut seen = BTreeSet::new();
                    let dup = effects
                        .iter()
                        .find(|x| !seen.insert((x.system.clone(), x.idem_key.clone())));
                    push(
                        "at most one effect per idempotency key".into(),
                        match dup {
                            None => Ok(()),
                            Some(d) => Err(format!("{} twice under {}", d.operation, d.idem_key)),
                        },
                    );
                }
                if e.no_unapproved_effects {
                    let r = self.unapproved(&effects, &records).await;
                    push("no effect of a gated step without an approval".into(), r);
                }
            }
        }
        checks
    }

    /// Every effect's step (found by its key): if it ever waited for a person, an approval
    /// was recorded before the effect.
    pub(super) async fn unapproved(
        &self,
        effects: &[countersign_core::store::DemoEffect],
        records: &[countersign_core::audit::AuditRecord],
    ) -> Result<(), String> {
        for fx in effects {
            // A StillOn hold is recorded under `<key>:hold`, part of the move under `<key>`.
            let idem_key = match fx.operation.as_str() {
                HOLD_OPERATION => fx.idem_key.strip_suffix(":hold").unwrap_or(&fx.idem_key),
                _ => fx.idem_key.as_str(),
            };
            let key = self
                .target
                .store
                .get_key(idem_key)
                .await
                .map_err(|e| e.to_string())?;
            let Some(key) = key else {
                return Err(format!(
                    "{} under {} has no key reserved by Countersign",
                    fx.operation, fx.idem_key
                ));
            };
            let of_step: Vec<_> = records
                .iter()
                .filter(|r| r.step_id.as_deref() == Some(key.step_id.as_str()))
                .collect();
            let gated = of_step.iter().any(|r| r.event == "waiting_approval");
            if !gated {
                continue;
            }
            let approved = of_step
                .iter()
                .any(|r| r.event == "approved" && r.at <= fx.at);
            let started_after = of_step.iter().any(|r| {
                r.event == "started"
                    && of_step
                        .iter()
                        .any(|a| a.event == "approved" && a.seq < r.seq)
            });
            if !(approved && started_after) {
                return Err(format!(
                    "{} of step {} has no approval before it",
                    fx.operation, key.step_id
                ));
            }
        }
        Ok(())
    }

    pub(super) fn audit_expect(
        &self,
        a: &AuditExpect,
        records: &[countersign_core::audit::AuditRecord],
        parsed: &[Value],
    ) -> Result<(), String> {
        let f = &a.filter;
        let step = f
            .step
            .as_deref()
            .map(|s| subst_str(s, &self.vars))
            .transpose()?;
        let run = f
            .run
            .as_deref()
            .map(|s| subst_str(s, &self.vars))
            .transpose()?;
        let matching: Vec<(usize, &countersign_core::audit::AuditRecord)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                f.event.as_deref().is_none_or(|e| r.event == e)
                    && (f.events.is_empty() || f.events.contains(&r.event))
                    && f.tool
                        .as_deref()
                        .is_none_or(|t| r.tool.as_deref() == Some(t))
                    && f.tool_prefix
                        .as_deref()
                        .is_none_or(|p| r.tool.as_deref().is_some_and(|t| t.starts_with(p)))
                    && step
                        .as_deref()
                        .is_none_or(|s| r.step_id.as_deref() == Some(s))
                    && run
                        .as_deref()
                        .is_none_or(|s| r.run_id.as_deref() == Some(s))
                    && f.rule
                        .as_deref()
                        .is_none_or(|x| r.rule.as_deref() == Some(x))
                    && f.actor
                        .as_deref()
                        .is_none_or(|x| r.actor.as_deref().is_some_and(|a| a.contains(x)))
            })
            .collect();
        let seen = || {
            matching
                .iter()
                .map(|(_, r)| format!("{}:{}:{:?}", r.seq, r.event, r.rule))
                .collect::<Vec<_>>()
        };
        if let Some(n) = a.count
            && matching.len() != n
        {
            return Err(format!(
                "{} records, wanted {n}: {:?}",
                matching.len(),
                seen()
            ));
        }
        let at_least = a.at_least.unwrap_or(usize::from(a.count.is_none()));
        if matching.len() < at_least {
            return Err(format!(
                "{} records, wanted at least {at_least}: {:?}",
                matching.len(),
                seen()
            ));
        }
        if let Some(seq) = &a.sequence {
            let got: Vec<&str> = matching.iter().map(|(_, r)| r.event.as_str()).collect();
            if got != seq.iter().map(String::as_str).collect::<Vec<_>>() {
                return Err(format!("events {got:?}, wanted {seq:?}"));
            }
        }
        for (i, r) in &matching {
            if let Some(actor) = &a.actor
                && !r
                    .actor
                    .as_deref()
                    .is_some_and(|x| x.contains(actor.as_str()))
            {
                return Err(format!("record {} actor {:?}", r.seq, r.actor));
            }
            if let Some(rule) = &a.rule
                && r.rule.as_deref() != Some(rule.as_str())
            {
                return Err(format!("record {} rule {:?}", r.seq, r.rule));
            }
            check_value(&a.record, &parsed[*i], &self.vars)
                .map_err(|e| format!("record {} ({}): {e}: {}", r.seq, r.event, r.record))?;
            for text in &a.not_containing {
                let text = subst_str(text, &self.vars)?;
                if r.record.contains(&text) {
                    return Err(format!("record {} contains {text}", r.seq));
                }
            }
        }
        Ok(())
    }
}
