//! Ready to distribute by tenant (issue 39, item 5), read from Postgres's own catalog: every
//! table is either tenant-scoped — its tenant column NOT NULL, every primary and unique key
//! and every foreign key starting with it — or one of the few named global tables; and no
//! function of the schema, nor any code, takes an advisory lock (audit appends lock only their
//! own chain's head row).

use std::path::Path;

use countersign_core::Backend;
use countersign_core::store::testing::FreshDb;
use sqlx::Connection;

use crate::test_clock;

/// Tenant-scoped tables and their tenant column (the audit tables' `chain` is the tenant, or
/// `_system` / `_legacy`).
const TENANT_SCOPED: &[(&str, &str)] = &[
    ("agent_credentials", "tenant"),
    ("approvals", "tenant"),
    ("audit", "chain"),
    ("audit_chains", "chain"),
    ("audit_tree_leaves", "chain"),
    ("escalations", "tenant"),
    ("idempotency", "tenant"),
    ("mcp_sessions", "tenant"),
    ("passkeys", "tenant"),
    ("people", "tenant"),
    ("runs", "tenant"),
    ("signing_nonces", "tenant"),
    ("standing_authorizations", "tenant"),
    ("step_duties", "tenant"),
    ("steps", "tenant"),
    ("stop_revocations", "tenant"),
];

/// The global tables (reference tables when distributed), each with why.
const GLOBAL: &[(&str, &str)] = &[
    ("_sqlx_migrations", "the schema's version"),
    (
        "audit_checkpoints",
        "legacy v1 checkpoints of the one pre-tenant chain",
    ),
    (
        "audit_tree_heads",
        "the signed checkpoints over every chain",
    ),
    (
        "demo_effects",
        "the demo ERP's own effect log (a target system, not Countersign's)",
    ),
    (
        "demo_objects",
        "the demo ERP's own records (a target system, not Countersign's)",
    ),
    ("registry_proposals", "the organisation's registry changes"),
    ("registry_versions", "the organisation's registry"),
    (
        "switches",
        "the emergency stops (platform and per tenant, by name)",
    ),
];

async fn connect() -> Option<(FreshDb, sqlx::PgConnection)> {
    let db = FreshDb::create(Backend::Postgres).await?;
    let (_, clock) = test_clock();
    // Migrated by a store, as `serve` does.
    let store = db.store(clock).await;
    store.close().await;
    let conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    Some((db, conn))
}

#[tokio::test]
async fn every_table_is_tenant_scoped_with_tenant_first_keys_or_named_global() {
    let Some((db, mut conn)) = connect().await else {
        return;
    };
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let tenant_of = |t: &str| TENANT_SCOPED.iter().find(|(n, _)| *n == t).map(|(_, c)| *c);
    for t in &tables {
        assert!(
            tenant_of(t).is_some() || GLOBAL.iter().any(|(n, _)| n == t),
            "table {t} is neither tenant-scoped nor a named global table: classify it here \
             and in docs/deploy.md"
        );
    }
    for (t, _) in TENANT_SCOPED.iter().chain(GLOBAL) {
        assert!(
            tables.iter().any(|x| x == t),
            "{t} is listed but not in the schema"
        );
    }
    for (table, column) in TENANT_SCOPED {
        let nullable: String = sqlx::query_scalar(
            "SELECT is_nullable::text FROM information_schema.columns
              WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2",
        )
        .bind(table)
        .bind(column)
        .fetch_one(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{table}.{column}: {e}"));
        assert_eq!(nullable, "NO", "{table}.{column} must be NOT NULL");
        // Every unique index (primary keys and unique constraints included) starts with the
        // tenant column.
        // (An expression key has no first column: it shows as none, and fails.)
        let keys: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT i.indexrelid::regclass::text, a.attname::text
               FROM pg_index i
               LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
              WHERE i.indrelid = to_regclass($1) AND i.indisunique",
        )
        .bind(table)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(!keys.is_empty(), "{table} has no key");
        for (index, first) in &keys {
            assert_eq!(
                first.as_deref(),
                Some(*column),
                "{table}: unique key {index} starts with {first:?}"
            );
        }
        // Every foreign key stays within a tenant: it starts with the tenant column and
        // points at another tenant-scoped table's tenant-first key.
        let fks: Vec<(String, String, String, String)> = sqlx::query_as(
            "SELECT c.conname::text, a.attname::text, c.confrelid::regclass::text, r.attname::text
               FROM pg_constraint c
               JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
               JOIN pg_attribute r ON r.attrelid = c.confrelid AND r.attnum = c.confkey[1]
              WHERE c.conrelid = to_regclass($1) AND c.contype = 'f'",
        )
        .bind(table)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for (name, first, parent, parent_first) in &fks {
            assert_eq!(
                first, column,
                "{table}: foreign key {name} starts with {first}"
            );
            assert_eq!(
                tenant_of(parent),
                Some(parent_first.as_str()),
                "{table}: foreign key {name} points at {parent}({parent_first}…)"
            );
        }
    }
    // A global table (a reference table when distributed) points at no tenant-scoped one.
    for (table, _) in GLOBAL {
        let into: Vec<String> = sqlx::query_scalar(
            "SELECT c.confrelid::regclass::text FROM pg_constraint c
              WHERE c.conrelid = to_regclass($1) AND c.contype = 'f'",
        )
        .bind(table)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for parent in into {
            assert!(
                tenant_of(&parent).is_none(),
                "global table {table} has a foreign key into tenant-scoped {parent}"
            );
        }
    }
    let _ = conn.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_row_whose_tenant_differs_from_its_parents_is_refused() {
    let Some((db, mut conn)) = connect().await else {
        return;
    };
    sqlx::query(
        "INSERT INTO runs (id, tenant, principal, task, status, created_at, updated_at)
         VALUES ('r1', 'acme', 'p', 't', 'active', 0, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let step = |tenant: &'static str, id: &'static str| {
        format!(
            "INSERT INTO steps (tenant, id, run_id, seq, role, tool, effect, inputs, inputs_hash,
                                idem_key, status, created_at, updated_at)
             VALUES ('{tenant}', '{id}', 'r1', 1, 'r', 't', 'read', '{{}}', 'h', 'k-{id}',
                     'pending', 0, 0)"
        )
    };
    let refused = sqlx::query(&step("globex", "s1")).execute(&mut conn).await;
    assert!(
        matches!(&refused, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503")),
        "a step in another tenant than its run: {refused:?}"
    );
    sqlx::query(&step("acme", "s1"))
        .execute(&mut conn)
        .await
        .unwrap();
    let key = sqlx::query(
        "INSERT INTO idempotency (tenant, idem_key, step_id, inputs_hash, state, owner,
                                  created_at, updated_at)
         VALUES ('globex', 'k', 's1', 'h', 'in_flight', 'w', 0, 0)",
    )
    .execute(&mut conn)
    .await;
    assert!(
        matches!(&key, Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503")),
        "a key in another tenant than its step: {key:?}"
    );
    let _ = conn.close().await;
    db.drop_db().await;
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[tokio::test]
async fn nothing_takes_an_advisory_lock_and_batch_functions_keep_generic_plans() {
    // The code: no crate's sources call an advisory-lock function.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["core/src", "server/src", "app/src"] {
        sources(&root.join(krate), &mut files);
    }
    assert!(
        files.len() > 20,
        "the sources were not found under {root:?}"
    );
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !code.contains("pg_advisory") && !code.contains("pg_try_advisory"),
                "{}:{}: takes an advisory lock: {line}",
                f.display(),
                n + 1
            );
        }
    }
    // The schema: no function (the one-trip batch, the triggers) does.
    let Some((db, mut conn)) = connect().await else {
        return;
    };
    let calling: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p
          WHERE p.pronamespace = current_schema()::regnamespace AND p.prosrc ILIKE '%advisory%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        calling.is_empty(),
        "functions taking an advisory lock: {calling:?}"
    );
    // The batch functions keep their generic plans (migration 17): re-planned on every call,
    // they cost more than the rest of a small batch. The executor's claim too, with the
    // settings that leave it one plan (migration 26).
    for f in [
        "countersign_move_steps",
        "countersign_commit_batch",
        "countersign_insert_moved",
        "countersign_claim_step",
    ] {
        // Every overload (migration 24 added one beside migration 17's for rolling upgrades).
        let overloads: Vec<(String, String)> = sqlx::query_as(
            "SELECT p.oid::regprocedure::text, COALESCE(array_to_string(p.proconfig, ','), '')
               FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = $1",
        )
        .bind(f)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(!overloads.is_empty(), "{f} exists");
        for (signature, config) in &overloads {
            assert!(
                config
                    .split(',')
                    .any(|c| c == "plan_cache_mode=force_generic_plan"),
                "{signature}: {config:?}"
            );
            // Index paths whatever the statistics (migration 24; migration 25 replaced two of
            // the functions and had to name their settings again). The 36-argument
            // overload kept for rolling upgrades (migration 17) never had it.
            if !signature.starts_with("countersign_commit_batch") || signature.ends_with("json)") {
                assert!(
                    config.split(',').any(|c| c == "enable_seqscan=off"),
                    "{signature}: {config:?}"
                );
            }
            // The claim's one plan: no sort (the walk of `steps_claim` in the ORDER BY's order),
            // index probes, never compiled (a plan with a switched-off path costs over JIT's
            // threshold).
            if f == "countersign_claim_step" {
                for setting in [
                    "enable_sort=off",
                    "enable_seqscan=off",
                    "enable_hashjoin=off",
                    "enable_mergejoin=off",
                    "jit=off",
                ] {
                    assert!(
                        config.split(',').any(|c| c == setting),
                        "{signature}: {setting}: {config:?}"
                    );
                }
            }
        }
    }
    let _ = conn.close().await;
    db.drop_db().await;
}

/// The batch functions reach `steps` by key even when a session first planned them on an empty
/// table (migration 24): their generic plans are kept for the session's life, and one made on
/// a near-empty table scanned the whole table for every batch as it grew. Counted by Postgres
/// itself (`pg_stat_xact_user_tables`: this session's scans of `steps` not yet reported).
#[tokio::test]
async fn batch_functions_planned_on_an_empty_table_still_reach_steps_by_key() {
    use countersign_core::model::Effect;
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let (_, clock) = test_clock();
    let store = db.store(clock).await;
    let mut conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    let move_step = "SELECT count(*) FROM countersign_move_steps($1, ARRAY[$2], ARRAY['running'],
        ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::int8[],
        ARRAY[NULL]::text[], ARRAY[0]::int8[], ARRAY[NULL]::int8[], ARRAY['pending'],
        ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[],
        ARRAY[NULL]::text[], ARRAY[NULL]::text[])";
    // Planned on the empty table: a step id that is not there moves nothing.
    let moved: i64 = sqlx::query_scalar(move_step)
        .bind(1_i64)
        .bind("no-such-step")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(moved, 0);
    let run = store
        .create_run(&crate::store::new_run("acme"))
        .await
        .unwrap();
    let (step, _) = store
        .open_step(&crate::store::new_step(&run.id, Effect::Write, 1))
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    let moved: i64 = sqlx::query_scalar(move_step)
        .bind(2_i64)
        .bind(&step.id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(moved, 1, "the step moved");
    let scans: Option<i64> = sqlx::query_scalar(
        "SELECT seq_scan FROM pg_stat_xact_user_tables
          WHERE relname = 'steps' AND schemaname = current_schema()",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(scans, Some(0), "sequential scans of steps in the batch");
    tx.rollback().await.unwrap();
    let _ = conn.close().await;
    store.close().await;
    db.drop_db().await;
}

/// The executor's claim walks the queue in its own order whatever the statistics (migration
/// 26): with the tables analyzed while empty — as on a new install — and three runs' first
/// steps held, a claim reads the held runs' steps and the first free one, not every pending
/// step nor every run for each step. Under these statistics the old statement probed `runs`
/// with a scan for each step it looked at (634 rows); under the executor benchmark's it drove
/// the claim from `runs` and sorted (1,950 step rows; not reproduced here, the settings check
/// in `nothing_takes_an_advisory_lock_and_batch_functions_keep_generic_plans` keeps the setting
/// that prevents it). Counted by Postgres itself (`pg_stat_xact_user_tables`: this session's
/// reads of every table, not yet reported).
#[tokio::test]
async fn the_claim_walks_the_queue_in_order_whatever_the_statistics() {
    use countersign_core::Clock;
    use countersign_core::model::Effect;
    use countersign_core::store::NewRun;
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let (manual, clock) = test_clock();
    let store = db.store(clock).await;
    let mut conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    sqlx::query("ANALYZE").execute(&mut conn).await.unwrap();
    const RUNS: usize = 30;
    const STEPS: usize = 8;
    let mut fourth = None;
    for r in 0..RUNS {
        let run = store
            .create_run(&NewRun {
                planned: true,
                ..crate::store::new_run("acme")
            })
            .await
            .unwrap();
        for n in 0..STEPS {
            let (step, _) = store
                .open_step(&crate::store::new_step(
                    &run.id,
                    Effect::Write,
                    r * STEPS + n,
                ))
                .await
                .unwrap();
            if r == 3 && n == 0 {
                fourth = Some(step.id);
            }
        }
        manual.advance(chrono::Duration::milliseconds(1));
    }
    let now = manual.now_ms();
    // Three workers hold the first three runs' first steps (as in the executor benchmark):
    // the next claim passes them and the steps they block, and takes the fourth run's first.
    let mut held = Vec::new();
    for w in 0..3 {
        held.push(
            store
                .claim_step(&format!("other-{w}"), now + 60_000, None)
                .await
                .unwrap()
                .unwrap()
                .run_id,
        );
    }
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 3, "three runs held");
    let mut tx = conn.begin().await.unwrap();
    let claimed: Option<String> = sqlx::query_scalar(&format!(
        "WITH c AS ({}) SELECT c.id FROM c",
        store.claim_statement()
    ))
    .bind("w1")
    .bind(now + 60_000)
    .bind(now)
    .bind("emergency_stop")
    .fetch_optional(&mut *tx)
    .await
    .unwrap();
    assert_eq!(claimed, fourth, "the first step of the oldest run not held");
    // Every table's rows, fetched by an index or read by a scan: a plan driven from `runs`
    // reads each run's pending steps; one that probes `runs` by a scan reads every run for
    // each step it looks at.
    let touched: Vec<(String, i64)> = sqlx::query_as(
        "SELECT relname::text, COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0)
           FROM pg_stat_xact_user_tables
          WHERE schemaname = current_schema()
            AND COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) > 0",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let total: i64 = touched.iter().map(|(_, n)| n).sum();
    // The walk reads the three held runs' steps and probes each once (~70 rows); reading
    // every pending step, or every run for each step, is several times that.
    assert!(
        total <= i64::try_from(RUNS * STEPS / 2).unwrap(),
        "one claim read {touched:?} rows ({} steps pending in {RUNS} runs)",
        RUNS * STEPS
    );
    tx.rollback().await.unwrap();
    let _ = conn.close().await;
    store.close().await;
    db.drop_db().await;
}

/// A database of schema 16 migrates: every row of the tables that gain a tenant gets its
/// parent's (a step its run's; a key, an approval, a duty its step's; a stop's revocation its
/// credential's), on both backends, and the store reads them as before.
#[tokio::test]
async fn rows_written_before_the_tenant_column_get_their_parents_tenant() {
    let (_, clock) = test_clock();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(db) = FreshDb::create(backend).await else {
            continue;
        };
        let store = countersign_core::Store::connect(
            &db.url,
            &countersign_core::store::ConnectOptions::default(),
            clock.clone(),
        )
        .await
        .unwrap();
        store.migrate_to(16).await.unwrap();
        for (tenant, n) in [("acme", 1), ("globex", 2)] {
            for sql in [
                format!(
                    "INSERT INTO agent_credentials (id, name, role, tenant, token_hash, created_by,
                                                    created_at)
                     VALUES ('a{n}', 'bot{n}', 'r', '{tenant}', 'th{n}', 'admin', 0)"
                ),
                format!(
                    "INSERT INTO runs (id, tenant, principal, task, status, created_at, updated_at,
                                       agent_id)
                     VALUES ('r{n}', '{tenant}', 'p', 't', 'active', 0, 0, 'a{n}')"
                ),
                format!(
                    "INSERT INTO steps (id, run_id, seq, role, tool, effect, inputs, inputs_hash,
                                        idem_key, status, created_at, updated_at)
                     VALUES ('s{n}', 'r{n}', 1, 'r', 't', 'write', '{{}}', 'h', 'k{n}',
                             'needs_approval', 0, 0)"
                ),
                format!(
                    "INSERT INTO idempotency (idem_key, step_id, inputs_hash, state, owner,
                                              created_at, updated_at)
                     VALUES ('k{n}', 's{n}', 'h', 'in_flight', 'w', 0, 0)"
                ),
                format!(
                    "INSERT INTO approvals (id, step_id, inputs_hash, decision, approver_iss,
                                            approver_sub, reason, token_hash, decided_at,
                                            expires_at)
                     VALUES ('ap{n}', 's{n}', 'h', 'approved', 'iss', 'sub', 'ok', 'at{n}', 0, 1)"
                ),
                format!("INSERT INTO step_duties (step_id, assignee) VALUES ('s{n}', 'a{n}')"),
                format!(
                    "INSERT INTO stop_revocations (switch, agent_id, revoked_at)
                     VALUES ('emergency_stop', 'a{n}', 0)"
                ),
            ] {
                store
                    .execute_sql(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {sql}: {e}"));
            }
        }
        // A revocation of a credential that does not exist (the table had no foreign key).
        store
            .execute_sql(
                "INSERT INTO stop_revocations (switch, agent_id, revoked_at)
                 VALUES ('emergency_stop', 'gone', 0)",
            )
            .await
            .unwrap();
        store.migrate().await.unwrap();
        for (table, key) in [
            ("steps", "id"),
            ("idempotency", "idem_key"),
            ("approvals", "id"),
            ("step_duties", "step_id"),
            ("stop_revocations", "agent_id"),
        ] {
            let rows = store
                .query_strings(&format!(
                    "SELECT {key} || '=' || tenant FROM {table} ORDER BY {key}"
                ))
                .await
                .unwrap();
            let expected: Vec<String> = match table {
                "steps" => vec!["s1=acme".into(), "s2=globex".into()],
                "idempotency" => vec!["k1=acme".into(), "k2=globex".into()],
                "approvals" => vec!["ap1=acme".into(), "ap2=globex".into()],
                "step_duties" => vec!["s1=acme".into(), "s2=globex".into()],
                _ => vec!["a1=acme".into(), "a2=globex".into()],
            };
            assert_eq!(rows, expected, "{backend:?}: {table}");
        }
        let step = store.get_step("s2").await.unwrap();
        assert_eq!(step.run_id, "r2", "{backend:?}");
        store.close().await;
        db.drop_db().await;
    }
}

/// `EXPLAIN ANALYZE` of `sql`, a line a row.
async fn explain_analyze(conn: &mut sqlx::PgConnection, sql: &str) -> Vec<String> {
    sqlx::query_scalar(&format!("EXPLAIN ANALYZE {sql}"))
        .fetch_all(conn)
        .await
        .unwrap()
}

/// Rows the scans of a text-format `EXPLAIN ANALYZE` touched: what each scan node returned
/// (rows × loops) plus what a filter or a recheck removed.
fn rows_touched(plan: &[String]) -> i64 {
    let number_after = |line: &str, label: &str| -> Option<i64> {
        let rest = &line[line.find(label)? + label.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let mut touched = 0;
    for line in plan {
        if line.contains("Scan")
            && let Some(actual) = line.find("(actual ")
        {
            let actual = &line[actual..];
            let rows = number_after(actual, " rows=").unwrap_or(0);
            let loops = number_after(actual, " loops=").unwrap_or(1);
            touched += rows * loops;
        }
        for label in [
            "Rows Removed by Filter: ",
            "Rows Removed by Index Recheck: ",
        ] {
            touched += number_after(line, label).unwrap_or(0);
        }
    }
    touched
}

/// The request path's look-ups, planned generically while their tables were small, still
/// reach their rows by key once the tables have grown. sqlx prepares every statement; after
/// five executions Postgres may switch a session to a generic plan and keep it until the
/// table's statistics change. Two such plans read what grows on every call (measured in the
/// write benchmark, docs/performance.md): the demo ERP's look-up of a call's objects (ORs of
/// kind and id: the generic plan looked up only `system` in the key and filtered every object)
/// and a write's next run position (`MAX(seq)`: the generic plan read every step of the run).
/// Planned here on empty tables, then run on 400 objects and a run of 300 steps: the rows their
/// scans touch, from EXPLAIN ANALYZE.
#[tokio::test]
async fn lookups_planned_on_small_tables_still_reach_rows_by_key() {
    use countersign_core::model::Effect;
    use countersign_core::store::{NEXT_POSITION_SQL, demo_lookup_sql};
    let Some(db) = FreshDb::create(Backend::Postgres).await else {
        return;
    };
    let (_, clock) = test_clock();
    let store = db.store(clock).await;
    let run = store
        .create_run(&crate::store::new_run("acme"))
        .await
        .unwrap();
    let mut conn = sqlx::PgConnection::connect(db.url.expose()).await.unwrap();
    for sql in [
        "SET plan_cache_mode = force_generic_plan".to_string(),
        format!(
            "PREPARE lookup(text, text, text, text, text) AS {}",
            demo_lookup_sql(2)
        ),
        format!("PREPARE next_position(text) AS {NEXT_POSITION_SQL}"),
        // Planned (generically) on the empty tables.
        "EXECUTE lookup('erp', 'fault', 'notes.draft', 'note', 'NOTE-1')".to_string(),
        format!("EXECUTE next_position('{}')", run.id),
    ] {
        sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
    }
    for i in 0..400 {
        store
            .demo_seed("erp", "note", &format!("NOTE-{i:08}"), "acme", "{}")
            .await
            .unwrap();
    }
    for i in 0..300 {
        store
            .open_step(&crate::store::new_step(&run.id, Effect::Write, i))
            .await
            .unwrap();
    }
    let plan = explain_analyze(
        &mut conn,
        "EXECUTE lookup('erp', 'note', 'NOTE-00000007', 'note', 'NOTE-00000300')",
    )
    .await;
    assert!(
        rows_touched(&plan) <= 4,
        "the demo look-up touched {} rows for 2 objects:\n{}",
        rows_touched(&plan),
        plan.join("\n")
    );
    let plan = explain_analyze(&mut conn, &format!("EXECUTE next_position('{}')", run.id)).await;
    assert!(
        rows_touched(&plan) <= 2,
        "the next position touched {} rows of a run of 300 steps:\n{}",
        rows_touched(&plan),
        plan.join("\n")
    );
    let _ = conn.close().await;
    store.close().await;
    db.drop_db().await;
}
