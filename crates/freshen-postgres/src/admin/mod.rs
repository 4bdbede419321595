//! Slot and publication administration and the inspections `freshen check` runs:
//! `wal_level`, replication privilege, slot state and lag, publication coverage,
//! replica identity against scope columns. All values are bound as parameters;
//! identifiers that must be spliced (DDL) are quoted.

use std::collections::HashMap;
use std::fmt;

use deadpool_postgres::Pool;
use freshen::BeforeImage;

pub(crate) mod membership;
pub(crate) mod standby;

use crate::error::ErrorKind;
use crate::pool::client;
use crate::quote::{quote_ident, quote_literal};
use crate::{
    ConnectionConfig, Lsn, PgError, PublicationMode, SlotMode, TableName, TablePattern,
    connect_pool,
};

/// A replication slot as `pg_replication_slots` shows it, with its lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Slot name.
    pub name: String,
    /// Output plugin (`pgoutput`); `None` for a physical slot.
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    /// Database of a logical slot.
    pub database: Option<String>,
    /// Dropped at the end of its session.
    pub temporary: bool,
    /// A session is streaming from it.
    pub active: bool,
    /// The process streaming from it.
    pub active_pid: Option<i32>,
    /// Oldest WAL the slot needs.
    pub restart_lsn: Option<Lsn>,
    /// What the consumer confirmed: streaming resumes from here.
    pub confirmed_flush_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (invalidated: changes are gone).
    pub wal_status: Option<String>,
    /// Bytes of WAL between the confirmed position and the server's current one.
    pub lag_bytes: Option<u64>,
    /// Bytes that can still be written before the slot is in danger of `lost`
    /// (`max_slot_wal_keep_size`); `None` when unlimited.
    pub safe_wal_size: Option<i64>,
    /// The server's flushed WAL position when this was read (replayed, on a standby):
    /// how far a reader of the slot could be.
    pub server_lsn: Option<Lsn>,
}

impl SlotInfo {
    /// Whether the server invalidated the slot (its changes are gone).
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// A publication's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationInfo {
    /// Publication name.
    pub name: String,
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// Which operations it publishes.
    pub insert: bool,
    /// Publishes UPDATE.
    pub update: bool,
    /// Publishes DELETE.
    pub delete: bool,
    /// Publishes TRUNCATE.
    pub truncate: bool,
    /// Tables it covers.
    pub tables: Vec<TableName>,
}

/// The comment freshen puts on a publication it creates; only those are dropped by
/// [`PgAdmin::drop_publication`].
pub const CREATED_BY: &str = "created by freshen";

/// What [`PgAdmin::drop_publication`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublicationDrop {
    /// It was freshen's and is gone.
    Dropped,
    /// It exists but freshen did not create it: left alone.
    Kept,
    /// There was none.
    Missing,
}

/// What a publication lacks for a set of tables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Coverage {
    /// Watched tables the publication does not include.
    pub missing_tables: Vec<TableName>,
    /// Operations it does not publish (`insert`, `update`, `delete`, `truncate`).
    pub missing_operations: Vec<&'static str>,
}

impl Coverage {
    /// Whether nothing is missing.
    pub fn is_complete(&self) -> bool {
        self.missing_tables.is_empty() && self.missing_operations.is_empty()
    }
}

/// `REPLICA IDENTITY` of a table: what UPDATE and DELETE carry of the former row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    /// The primary key (only when it changes, for UPDATE).
    Default,
    /// Nothing: UPDATE and DELETE cannot even be replicated.
    Nothing,
    /// The whole former row.
    Full,
    /// The columns of a chosen unique index.
    Index,
}

impl fmt::Display for ReplicaIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicaIdentity::Default => "DEFAULT",
            ReplicaIdentity::Nothing => "NOTHING",
            ReplicaIdentity::Full => "FULL",
            ReplicaIdentity::Index => "USING INDEX",
        })
    }
}

/// A table's replica identity and its key columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableIdentity {
    /// The table.
    pub table: TableName,
    /// Its replica identity.
    pub identity: ReplicaIdentity,
    /// The identity's key columns (primary key or index), in key order; empty for FULL
    /// and NOTHING, and for DEFAULT on a table without a primary key.
    pub key_columns: Vec<String>,
    /// The table's primary key columns, in key order, whatever the identity; empty
    /// without a primary key.
    pub primary_key: Vec<String>,
}

impl TableIdentity {
    /// How much of the former row this table's changes carry.
    pub fn before_image(&self) -> BeforeImage {
        match self.identity {
            ReplicaIdentity::Full => BeforeImage::Full,
            ReplicaIdentity::Default | ReplicaIdentity::Index if !self.key_columns.is_empty() => {
                BeforeImage::KeyOnly
            }
            _ => BeforeImage::None,
        }
    }
}

/// Whether publication `name` carries freshen's mark ([`CREATED_BY`]).
async fn created_by_freshen(c: &tokio_postgres::Client, name: &str) -> Result<bool, PgError> {
    let row = c
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(|e| PgError::sql("cannot read the publication", e))?;
    Ok(row.and_then(|r| r.get::<_, Option<String>>(0)).as_deref() == Some(CREATED_BY))
}

/// SQL administration and inspection on one database (a small connection pool).
#[derive(Clone)]
pub struct PgAdmin {
    pool: Pool,
}

impl fmt::Debug for PgAdmin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgAdmin")
            .field("pool", &self.pool.status())
            .finish()
    }
}

impl PgAdmin {
    /// Connects (and checks that a connection can be made).
    pub async fn connect(conn: &ConnectionConfig) -> Result<PgAdmin, PgError> {
        let admin = PgAdmin::from_pool(connect_pool(conn, 2)?);
        drop(client(&admin.pool).await?);
        Ok(admin)
    }

    /// The cluster's system identifier (`pg_control_system()`): equal on a primary and
    /// its physical standbys, different on any other cluster.
    pub async fn system_identifier(&self) -> Result<String, PgError> {
        let c = client(&self.pool).await?;
        let row = c
            .query_one(
                "SELECT system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the system identifier", e))?;
        Ok(row.get(0))
    }

    /// Uses an existing pool.
    pub fn from_pool(pool: Pool) -> PgAdmin {
        PgAdmin { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn one_row(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, PgError> {
        let c = client(&self.pool).await?;
        c.query_opt(sql, params)
            .await
            .map_err(|e| PgError::sql(format!("cannot read {what}"), e))
    }

    /// The table's OID and its columns as logical replication describes them (name and
    /// type OID, in table order; dropped and generated columns left out), from the
    /// catalog: what a later Relation message is compared with. `None` when the table
    /// does not exist.
    pub(crate) async fn shape(
        &self,
        table: &TableName,
    ) -> Result<Option<(u32, Vec<(String, u32)>)>, PgError> {
        let row = self
            .one_row(
                "the table's columns",
                "SELECT c.oid, \
                        ARRAY(SELECT a.attname::text FROM pg_attribute a \
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                                AND a.attgenerated = '' ORDER BY a.attnum), \
                        ARRAY(SELECT a.atttypid FROM pg_attribute a \
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                                AND a.attgenerated = '' ORDER BY a.attnum) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
                &[&table.schema, &table.name],
            )
            .await?;
        Ok(row.map(|r| {
            let names: Vec<String> = r.get(1);
            let types: Vec<u32> = r.get(2);
            (r.get(0), names.into_iter().zip(types).collect())
        }))
    }

    /// The tables (ordinary and partitioned roots, permanent) a publication for
    /// `patterns` publishes now, in name order: every table of their schemas, or every
    /// table outside the system schemas when one is [`TablePattern::All`].
    pub(crate) async fn published_by(
        &self,
        patterns: &[TablePattern],
    ) -> Result<Vec<TableName>, PgError> {
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        let all = patterns.contains(&TablePattern::All);
        let schemas = pattern_schemas(patterns);
        let c = client(&self.pool).await?;
        let rows = c
            .query(
                "SELECT n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE ($1 OR n.nspname = ANY($2)) AND c.relkind IN ('r', 'p') \
                   AND NOT c.relispartition AND c.relpersistence = 'p' \
                 ORDER BY 1, 2",
                &[&all, &schemas],
            )
            .await
            .map_err(|e| PgError::sql("cannot list the tables the patterns select", e))?;
        Ok(rows
            .iter()
            .map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .filter(|t| !crate::select::system_schema(&t.schema))
            .collect())
    }

    /// The tables `patterns` select now, in name order (freshen's bookkeeping and
    /// system tables left out).
    pub async fn selected_tables(
        &self,
        patterns: &[TablePattern],
    ) -> Result<Vec<TableName>, PgError> {
        Ok(self
            .published_by(patterns)
            .await?
            .into_iter()
            .filter(|t| crate::select::any_matches(patterns, t))
            .collect())
    }

    /// What publication `name` lacks to publish what `patterns` select as they grow:
    /// `FOR ALL TABLES` for [`TablePattern::All`], each pattern's schema as a whole
    /// otherwise. Each entry is a fix to run.
    pub(crate) async fn unpublished_patterns(
        &self,
        name: &str,
        patterns: &[TablePattern],
    ) -> Result<Vec<String>, PgError> {
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        let c = client(&self.pool).await?;
        let all_tables: bool = c
            .query_opt(
                "SELECT puballtables FROM pg_publication WHERE pubname = $1",
                &[&name],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication", e))?
            .is_some_and(|r| r.get(0));
        if all_tables {
            return Ok(Vec::new());
        }
        let mut fixes = Vec::new();
        if patterns.contains(&TablePattern::All) {
            fixes.push(format!(
                "tables = \"all\" needs it FOR ALL TABLES, which it is not: drop it (`freshen drop`, for one freshen created) and let a superuser create it, or run as a superuser: DROP PUBLICATION {q}; CREATE PUBLICATION {q} FOR ALL TABLES WITH (publish_via_partition_root = true)",
                q = quote_ident(name)
            ));
        }
        let schemas = pattern_schemas(patterns);
        let rows = c
            .query(
                "SELECT s FROM unnest($2::text[]) s WHERE NOT EXISTS ( \
                   SELECT FROM pg_publication_namespace pn \
                   JOIN pg_publication p ON p.oid = pn.pnpubid \
                   JOIN pg_namespace n ON n.oid = pn.pnnspid \
                   WHERE p.pubname = $1 AND n.nspname = s)",
                &[&name, &schemas],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication's schemas", e))?;
        let missing: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if !missing.is_empty() {
            fixes.push(format!(
                "it does not include every table of {}: run (as a superuser) ALTER PUBLICATION {} ADD TABLES IN SCHEMA {}",
                missing.join(", "),
                quote_ident(name),
                missing
                    .iter()
                    .map(|s| quote_ident(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(fixes)
    }

    /// Whether the role is a superuser (who alone may publish `FOR ALL TABLES` or `FOR
    /// TABLES IN SCHEMA`).
    pub async fn is_superuser(&self) -> Result<bool, PgError> {
        let row = self
            .one_row(
                "whether the role is a superuser",
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
                &[],
            )
            .await?;
        Ok(row.is_some_and(|r| r.get(0)))
    }

    /// The server's `wal_level`.
    pub async fn wal_level(&self) -> Result<String, PgError> {
        let row = self
            .one_row("wal_level", "SELECT current_setting('wal_level')", &[])
            .await?;
        Ok(row.map(|r| r.get::<_, String>(0)).unwrap_or_default())
    }

    /// The server's version as `server_version_num` (`150004` for 15.4).
    pub async fn server_version_num(&self) -> Result<u32, PgError> {
        let row = self
            .one_row(
                "server_version_num",
                "SELECT current_setting('server_version_num')",
                &[],
            )
            .await?;
        Ok(row
            .and_then(|r| r.get::<_, String>(0).parse().ok())
            .unwrap_or(0))
    }

    /// Fails unless `wal_level` is `logical`, saying how to fix it.
    pub async fn require_logical_wal(&self) -> Result<(), PgError> {
        let level = self.wal_level().await?;
        if level == "logical" {
            Ok(())
        } else {
            Err(PgError::new(
                ErrorKind::Setup,
                format!(
                    "wal_level is {level:?}, logical replication needs \"logical\": run \
                     ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"
                ),
            ))
        }
    }

    /// Whether the connected user may open replication connections (`REPLICATION` or
    /// superuser).
    pub async fn can_replicate(&self) -> Result<bool, PgError> {
        let row = self
            .one_row(
                "the user's privileges",
                "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
                &[],
            )
            .await?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// Fails unless the user may replicate, saying how to fix it.
    pub async fn require_replication_privilege(&self) -> Result<(), PgError> {
        if self.can_replicate().await? {
            return Ok(());
        }
        let c = client(&self.pool).await?;
        let user: String = c
            .query_one("SELECT current_user::text", &[])
            .await
            .map_err(|e| PgError::sql("cannot read current_user", e))?
            .get(0);
        Err(PgError::new(
            ErrorKind::Setup,
            format!(
                "user {user:?} may not open replication connections: run ALTER ROLE {} REPLICATION",
                quote_ident(&user)
            ),
        ))
    }

    /// The slot, if it exists.
    pub async fn slot(&self, name: &str) -> Result<Option<SlotInfo>, PgError> {
        let row = self
            .one_row(
                "the replication slot",
                "SELECT slot_name::text, plugin::text, slot_type, database::text, temporary, \
                        active, active_pid, restart_lsn::text, confirmed_flush_lsn::text, \
                        wal_status, \
                        ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                               ELSE pg_current_wal_lsn() END) - confirmed_flush_lsn)::int8, \
                        safe_wal_size, \
                        (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                              ELSE pg_current_wal_flush_lsn() END)::text \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await?;
        Ok(row.map(|r| {
            let lsn = |i: usize| r.get::<_, Option<String>>(i).and_then(|s| s.parse().ok());
            SlotInfo {
                name: r.get(0),
                plugin: r.get(1),
                slot_type: r.get(2),
                database: r.get(3),
                temporary: r.get(4),
                active: r.get(5),
                active_pid: r.get(6),
                restart_lsn: lsn(7),
                confirmed_flush_lsn: lsn(8),
                wal_status: r.get(9),
                lag_bytes: r.get::<_, Option<i64>>(10).map(|b| b.max(0) as u64),
                safe_wal_size: r.get(11),
                server_lsn: lsn(12),
            }
        }))
    }

    /// Creates a persistent `pgoutput` slot (fails if it exists). On a standby see
    /// [`ensure_slot_on`](Self::ensure_slot_on).
    pub async fn create_slot(&self, name: &str) -> Result<(), PgError> {
        self.create_slot_on(name, None, false).await
    }

    /// Makes sure a usable slot exists per `mode` (temporary slots are made by the
    /// replication connection itself, so `Temporary` checks nothing).
    pub async fn ensure_slot(
        &self,
        name: &str,
        mode: SlotMode,
        dbname: &str,
    ) -> Result<(), PgError> {
        self.ensure_slot_on(name, mode, dbname, None, Some(false))
            .await
    }

    /// [`ensure_slot`](Self::ensure_slot) on a server that may be a standby: a slot
    /// created there asks `primary` (when given) for standby snapshots meanwhile; one
    /// created is a failover slot per `failover` ([`PgSourceConfig::failover`](crate::PgSourceConfig)).
    pub async fn ensure_slot_on(
        &self,
        name: &str,
        mode: SlotMode,
        dbname: &str,
        primary: Option<&ConnectionConfig>,
        failover: Option<bool>,
    ) -> Result<(), PgError> {
        if mode == SlotMode::Temporary {
            return Ok(());
        }
        let info = match self.slot(name).await? {
            Some(info) => {
                tracing::info!(slot = %name, confirmed = ?info.confirmed_flush_lsn, "reusing the replication slot");
                info
            }
            None if mode == SlotMode::MustExist => {
                return Err(slot_missing(name));
            }
            None => {
                let failover = self.failover_for(failover).await?;
                match self.create_slot_on(name, primary, failover).await {
                    Ok(()) => tracing::info!(slot = %name, "created the replication slot"),
                    // Created by someone else meanwhile: validate theirs.
                    Err(e) if e.sqlstate() == Some("42710") => {}
                    Err(e) => return Err(e),
                }
                self.slot(name).await?.ok_or_else(|| slot_missing(name))?
            }
        };
        let mut problems = Vec::new();
        if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
            problems.push(format!(
                "slot {name:?} is a {} slot with plugin {:?}; freshen needs a logical slot with pgoutput",
                info.slot_type, info.plugin
            ));
        }
        if info.database.as_deref() != Some(dbname) {
            problems.push(format!(
                "slot {name:?} belongs to database {:?}, not {dbname:?}",
                info.database
            ));
        }
        if info.temporary {
            problems.push(format!("slot {name:?} is another session's temporary slot"));
        }
        if !problems.is_empty() {
            return Err(PgError::new(ErrorKind::Slot, problems.join("; ")));
        }
        if info.is_lost() {
            return Err(slot_lost(name));
        }
        Ok(())
    }

    /// Drops the slot. `Ok(false)` when it did not exist. A slot in use by a streaming
    /// session cannot be dropped; this waits up to 5 s for its session to go away.
    pub async fn drop_slot(&self, name: &str) -> Result<bool, PgError> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let c = client(&self.pool).await?;
            let r = c
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE slot_name = $1",
                    &[&name],
                )
                .await;
            match r {
                Ok(n) => return Ok(n > 0),
                Err(e)
                    if e.code().map(|c| c.code()) == Some("55006")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(PgError::sql(
                        format!("cannot drop replication slot {name:?}"),
                        e,
                    ));
                }
            }
        }
    }

    /// The publication, if it exists.
    pub async fn publication(&self, name: &str) -> Result<Option<PublicationInfo>, PgError> {
        let c = client(&self.pool).await?;
        let Some(p) = c
            .query_opt(
                "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate \
                 FROM pg_publication WHERE pubname = $1",
                &[&name],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication", e))?
        else {
            return Ok(None);
        };
        let tables = c
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
                 WHERE pubname = $1 ORDER BY 1, 2",
                &[&name],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication's tables", e))?
            .iter()
            .map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect();
        Ok(Some(PublicationInfo {
            name: name.to_owned(),
            all_tables: p.get(0),
            insert: p.get(1),
            update: p.get(2),
            delete: p.get(3),
            truncate: p.get(4),
            tables,
        }))
    }

    /// Which catalog entry puts each of `tables` into publication `name` (see
    /// `membership.rs`); `None` when the publication does not exist.
    pub(crate) async fn membership(
        &self,
        name: &str,
        tables: &[TableName],
    ) -> Result<Option<crate::admin::membership::Membership>, PgError> {
        use crate::admin::membership::{Entry, Membership};
        let c = client(&self.pool).await?;
        let Some(p) = c
            .query_opt(
                "SELECT oid FROM pg_publication WHERE pubname = $1",
                &[&name],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication", e))?
        else {
            return Ok(None);
        };
        let publication: u32 = p.get(0);
        let listed: HashMap<TableName, u32> = c
            .query(
                "SELECT n.nspname::text, c.relname::text, pr.oid FROM pg_publication_rel pr \
                 JOIN pg_class c ON c.oid = pr.prrelid \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE pr.prpubid = $1",
                &[&publication],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication's tables", e))?
            .iter()
            .map(|r| {
                (
                    TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)),
                    r.get(2),
                )
            })
            .collect();
        let Some(info) = self.publication(name).await? else {
            return Ok(None);
        };
        let missing = coverage_of(&info, tables).missing_tables;
        Ok(Some(Membership(
            tables
                .iter()
                .map(|t| {
                    let entry = (!missing.contains(t)).then(|| Entry {
                        publication,
                        rel: listed.get(t).copied().unwrap_or(0),
                    });
                    (t.clone(), entry)
                })
                .collect(),
        )))
    }

    /// What publication `name` lacks for `tables`; `None` when it does not exist.
    pub async fn coverage(
        &self,
        name: &str,
        tables: &[TableName],
    ) -> Result<Option<Coverage>, PgError> {
        let Some(p) = self.publication(name).await? else {
            return Ok(None);
        };
        Ok(Some(coverage_of(&p, tables)))
    }

    /// Whether publication `name` exists and freshen created it (it carries
    /// [`CREATED_BY`]), so freshen may extend it with the tables of views added later.
    pub async fn publication_is_ours(&self, name: &str) -> Result<bool, PgError> {
        let c = client(&self.pool).await?;
        created_by_freshen(&c, name).await
    }

    /// Drops publication `name` if freshen created it (it carries [`CREATED_BY`]).
    pub async fn drop_publication(&self, name: &str) -> Result<PublicationDrop, PgError> {
        let c = client(&self.pool).await?;
        let row = c
            .query_opt(
                "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
                &[&name],
            )
            .await
            .map_err(|e| PgError::sql("cannot read the publication", e))?;
        match row {
            None => Ok(PublicationDrop::Missing),
            Some(r) if r.get::<_, Option<String>>(0).as_deref() == Some(CREATED_BY) => {
                c.batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote_ident(name)))
                    .await
                    .map_err(|e| PgError::sql("cannot drop the publication", e))?;
                Ok(PublicationDrop::Dropped)
            }
            Some(_) => Ok(PublicationDrop::Kept),
        }
    }

    /// Makes sure publication `name` exists per `mode` and covers `tables` with every
    /// operation; the error says what to run when it does not. One it creates is marked
    /// as freshen's ([`CREATED_BY`]). Returns the tables it put into the publication (by
    /// creating it or adding them): their changes before now never reached a slot
    /// through it.
    pub async fn ensure_publication(
        &self,
        name: &str,
        tables: &[TableName],
        patterns: &[TablePattern],
        mode: PublicationMode,
    ) -> Result<Vec<TableName>, PgError> {
        {
            // Before anything is published: a table that cannot replicate UPDATE and
            // DELETE would have the application's writes fail, not freshen's.
            let c = client(&self.pool).await?;
            let mut all = tables.to_vec();
            all.extend(self.published_by(patterns).await?);
            let bad = crate::publication::unpublishable(&c, &all).await?;
            if !bad.is_empty() {
                return Err(crate::publication::refuse_to_publish(name, &bad));
            }
        }
        if patterns.iter().any(|p| p.schema_name().is_some())
            && let Some(why) = crate::select::schema_patterns_unsupported(
                self.server_version_num().await?,
                patterns,
            )
        {
            return Err(PgError::new(ErrorKind::Setup, why));
        }
        let existing = self.publication(name).await?;
        let created = existing.is_none();
        let p = match existing {
            Some(p) => {
                tracing::info!(publication = %name, "reusing the publication");
                p
            }
            None if mode == PublicationMode::MustExist && self.in_recovery().await? => {
                return Err(standby::publication_on_primary(
                    name,
                    &create_publication(name, tables, patterns),
                ));
            }
            None if mode == PublicationMode::MustExist => {
                return Err(PgError::new(
                    ErrorKind::Setup,
                    format!(
                        "publication {name:?} does not exist: run CREATE PUBLICATION {} FOR TABLE {}",
                        quote_ident(name),
                        list(tables)
                    ),
                ));
            }
            None => {
                if self.in_recovery().await? {
                    return Err(standby::publication_on_primary(
                        name,
                        &create_publication(name, tables, patterns),
                    ));
                }
                if !patterns.is_empty() && !self.is_superuser().await? {
                    return Err(PgError::new(
                        ErrorKind::Setup,
                        format!(
                            "[source] tables {} needs a publication FOR {}, which only a superuser may create: have one run CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true) and set publication_mode = \"existing\", or list the tables by name",
                            patterns
                                .iter()
                                .map(|p| format!("{:?}", p.to_string()))
                                .collect::<Vec<_>>()
                                .join(", "),
                            publication_objects(&[], patterns),
                            quote_ident(name),
                            publication_objects(tables, patterns),
                        ),
                    ));
                }
                let c = client(&self.pool).await?;
                // Created and marked as freshen's in one transaction: `drop_publication`
                // removes only publications that carry the mark.
                let sql = format!(
                    // Via the partition root: a watched partitioned table's changes
                    // arrive under its own name, whatever partition they hit.
                    "BEGIN; CREATE PUBLICATION {name_q} FOR {} WITH (publish_via_partition_root = true); COMMENT ON PUBLICATION {name_q} IS {}; COMMIT",
                    publication_objects(tables, patterns),
                    quote_literal(CREATED_BY),
                    name_q = quote_ident(name),
                );
                match c.batch_execute(&sql).await {
                    Ok(()) => {
                        tracing::info!(publication = %name, tables = %publication_objects(tables, patterns), "created the publication");
                    }
                    Err(e) if e.code().map(|c| c.code()) == Some("42710") => {}
                    Err(e) => {
                        return Err(PgError::sql(
                            format!("cannot create publication {name:?}"),
                            e,
                        ));
                    }
                }
                self.publication(name).await?.ok_or_else(|| {
                    PgError::new(
                        ErrorKind::Setup,
                        format!("publication {name:?} vanished after creation"),
                    )
                })?
            }
        };
        let mut cov = coverage_of(&p, tables);
        let mut added = if created { tables.to_vec() } else { Vec::new() };
        let c = client(&self.pool).await?;
        // A publication freshen created grows with the configuration: a view added
        // later (a reload, a restart) brings its tables along.
        if !cov.missing_tables.is_empty()
            && mode == PublicationMode::CreateIfMissing
            && created_by_freshen(&c, name).await?
        {
            let sql = format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote_ident(name),
                list(&cov.missing_tables)
            );
            if self.in_recovery().await? {
                return Err(standby::publication_on_primary(name, &sql));
            }
            c.batch_execute(&sql).await.map_err(|e| {
                PgError::sql(format!("cannot add tables to publication {name:?}"), e)
            })?;
            tracing::info!(publication = %name, tables = %list(&cov.missing_tables), "added tables to the publication");
            added.extend(cov.missing_tables.iter().cloned());
            let p = self.publication(name).await?.ok_or_else(|| {
                PgError::new(
                    ErrorKind::Setup,
                    format!("publication {name:?} vanished while adding tables"),
                )
            })?;
            cov = coverage_of(&p, tables);
        }
        let mut fixes = Vec::new();
        let partitioned = crate::catalog::partitioned(&c, &cov.missing_tables).await?;
        if partitioned.iter().any(|p| *p) {
            fixes.push(format!(
                "it publishes a watched partitioned table through its partitions: run ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                quote_ident(name)
            ));
        }
        if !cov.missing_tables.is_empty() {
            fixes.push(format!(
                "it does not include {}: run ALTER PUBLICATION {} ADD TABLE {}",
                cov.missing_tables
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                quote_ident(name),
                list(&cov.missing_tables)
            ));
        }
        fixes.extend(self.unpublished_patterns(name, patterns).await?);
        if !cov.missing_operations.is_empty() {
            fixes.push(format!(
                "it does not publish {}: run ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate')",
                cov.missing_operations.join(", "),
                quote_ident(name)
            ));
        }
        if fixes.is_empty() {
            Ok(added)
        } else {
            Err(PgError::new(
                ErrorKind::Setup,
                format!(
                    "publication {name:?} does not cover the watched tables: {}",
                    fixes.join("; ")
                ),
            ))
        }
    }

    /// A table's replica identity; an error when the table does not exist.
    pub async fn replica_identity(&self, table: &TableName) -> Result<TableIdentity, PgError> {
        let row = self
            .one_row(
                "the table's replica identity",
                "SELECT c.relreplident::text, \
                        ARRAY(SELECT a.attname::text \
                              FROM pg_index i \
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                              WHERE i.indrelid = c.oid \
                                AND ((c.relreplident = 'd' AND i.indisprimary) \
                                  OR (c.relreplident = 'i' AND i.indisreplident)) \
                              ORDER BY array_position(i.indkey::int2[], a.attnum)), \
                        ARRAY(SELECT a.attname::text \
                              FROM pg_index i \
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                              WHERE i.indrelid = c.oid AND i.indisprimary \
                              ORDER BY array_position(i.indkey::int2[], a.attnum)) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
                &[&table.schema, &table.name],
            )
            .await?;
        let Some(row) = row else {
            return Err(PgError::new(
                ErrorKind::Setup,
                format!("table {table} does not exist"),
            ));
        };
        let identity = match row.get::<_, String>(0).as_str() {
            "f" => ReplicaIdentity::Full,
            "n" => ReplicaIdentity::Nothing,
            "i" => ReplicaIdentity::Index,
            _ => ReplicaIdentity::Default,
        };
        Ok(TableIdentity {
            table: table.clone(),
            identity,
            key_columns: row.get(1),
            primary_key: row.get(2),
        })
    }
}

/// The statement that creates publication `name` for `tables` and `patterns`.
fn create_publication(name: &str, tables: &[TableName], patterns: &[TablePattern]) -> String {
    format!(
        "CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true)",
        quote_ident(name),
        publication_objects(tables, patterns)
    )
}

/// What a publication covers: `ALL TABLES`, or `TABLES IN SCHEMA s, …` (each pattern's
/// schema) and `TABLE t, …` (tables of those schemas left out: they are in already).
fn publication_objects(tables: &[TableName], patterns: &[TablePattern]) -> String {
    if patterns.contains(&TablePattern::All) {
        return "ALL TABLES".into();
    }
    let schemas = pattern_schemas(patterns);
    let mut parts = Vec::new();
    if !schemas.is_empty() {
        let names: Vec<String> = schemas.iter().map(|s| quote_ident(s)).collect();
        parts.push(format!("TABLES IN SCHEMA {}", names.join(", ")));
    }
    let rest: Vec<TableName> = tables
        .iter()
        .filter(|t| !schemas.contains(&t.schema))
        .cloned()
        .collect();
    if !rest.is_empty() {
        parts.push(format!("TABLE {}", list(&rest)));
    }
    parts.join(", ")
}

/// The schemas of `patterns`, each once, in order.
fn pattern_schemas(patterns: &[TablePattern]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in patterns.iter().filter_map(TablePattern::schema_name) {
        if !out.iter().any(|o| o == s) {
            out.push(s.to_owned());
        }
    }
    out
}

fn list(tables: &[TableName]) -> String {
    tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ")
}

fn coverage_of(p: &PublicationInfo, tables: &[TableName]) -> Coverage {
    let missing_tables = if p.all_tables {
        Vec::new()
    } else {
        tables
            .iter()
            .filter(|t| !p.tables.contains(t))
            .cloned()
            .collect()
    };
    let mut missing_operations = Vec::new();
    for (on, op) in [
        (p.insert, "insert"),
        (p.update, "update"),
        (p.delete, "delete"),
        (p.truncate, "truncate"),
    ] {
        if !on {
            missing_operations.push(op);
        }
    }
    Coverage {
        missing_tables,
        missing_operations,
    }
}

pub(crate) fn slot_missing(name: &str) -> PgError {
    PgError::new(
        ErrorKind::Slot,
        format!(
            "replication slot {name:?} does not exist (was it dropped?). Changes made since it \
             went away are lost: recreate it (slot_mode = \"create\", the default, creates it when missing) and run a \
             reconcile sweep so the derived tables are rebuilt from the source tables"
        ),
    )
}

pub(crate) fn slot_lost(name: &str) -> PgError {
    PgError::new(
        ErrorKind::Slot,
        format!(
            "replication slot {name:?} was invalidated by the server (wal_status = lost, \
             max_slot_wal_keep_size exceeded): the WAL it needed is gone. Drop it \
             (SELECT pg_drop_replication_slot('{name}')), let freshen create it again, and run \
             a reconcile sweep so the derived tables are rebuilt; consider raising \
             max_slot_wal_keep_size"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(identity: ReplicaIdentity, keys: &[&str]) -> TableIdentity {
        TableIdentity {
            primary_key: Vec::new(),
            table: TableName::new("public", "readings"),
            identity,
            key_columns: keys.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn before_images() {
        let id_only = ident(ReplicaIdentity::Default, &["id"]);
        assert_eq!(id_only.before_image(), BeforeImage::KeyOnly);
        assert_eq!(
            ident(ReplicaIdentity::Nothing, &[]).before_image(),
            BeforeImage::None
        );
    }

    #[test]
    fn coverage_names_what_is_missing() {
        let p = PublicationInfo {
            name: "p".into(),
            all_tables: false,
            insert: true,
            update: true,
            delete: false,
            truncate: true,
            tables: vec![TableName::new("public", "a")],
        };
        let c = coverage_of(
            &p,
            &[TableName::new("public", "a"), TableName::new("public", "b")],
        );
        assert_eq!(c.missing_tables, vec![TableName::new("public", "b")]);
        assert_eq!(c.missing_operations, vec!["delete"]);
        assert!(!c.is_complete());
    }
}
