//! The source's findings: logical replication set up (wal_level, privilege, slot,
//! publication, its safety and column lists, replica identities).

use freshen::plug::{Finding, Plan};

use crate::capture::settings::{PgSourceSettings, PublicationChoice, SlotChoice};
use crate::publication::{publication_privileges, unpublishable};
use crate::{PgAdmin, TableName, quote_ident};

/// A slot further behind than this is reported: an abandoned pipeline retains WAL.
pub const LAG_WARNING_BYTES: u64 = 1 << 30;

/// The source's findings for `plan`.
pub(crate) async fn source(s: &PgSourceSettings, plan: &Plan) -> Vec<Finding> {
    let mut out = Vec::new();
    let subject = s.url.redacted();
    let conn = match s.connection() {
        Ok(c) => c,
        Err(e) => return vec![Finding::error("source", subject, e.to_string())],
    };
    let admin = match PgAdmin::connect(&conn).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "source",
                subject,
                format!("cannot connect: {e}"),
            )];
        }
    };
    let standby = match admin.in_recovery().await {
        Ok(standby) => standby,
        Err(e) => {
            out.push(Finding::error("standby", &subject, e.to_string()));
            false
        }
    };
    if standby {
        out.extend(standby_findings(&admin, s, &subject).await);
    }
    out.push(match admin.wal_level().await {
        Ok(l) if l == "logical" => Finding::ok("wal_level", &subject, "logical"),
        Ok(l) => Finding::error(
            "wal_level",
            &subject,
            format!("wal_level is {l}; logical replication needs `wal_level = logical` in postgresql.conf and a restart"),
        ),
        Err(e) => Finding::error("wal_level", &subject, e.to_string()),
    });
    out.push(match admin.can_replicate().await {
        Ok(true) => Finding::ok(
            "privilege",
            &subject,
            format!("{} may replicate", conn.user),
        ),
        Ok(false) => Finding::error(
            "privilege",
            &subject,
            format!(
                "role {} lacks REPLICATION: ALTER ROLE {} WITH REPLICATION",
                conn.user,
                quote_ident(&conn.user)
            ),
        ),
        Err(e) => Finding::error("privilege", &subject, e.to_string()),
    });
    out.push(slot(&admin, &s.slot, s.slot_mode).await);
    if !standby {
        out.extend(failover(&admin, s).await);
    }
    let tables: Vec<TableName> = plan
        .tables
        .iter()
        .map(|(schema, table)| TableName::new(schema, table))
        .collect();
    if let Some(f) = publication(&admin, s, &tables, standby).await {
        out.push(f);
    }
    out.extend(crate::check::columns::findings(&admin, &s.publication, plan).await);
    let patterns = s.patterns();
    out.extend(selection(&admin, s, &patterns).await);
    let mut published = tables.clone();
    match admin.published_by(&patterns).await {
        Ok(more) => published.extend(more.into_iter().filter(|t| !tables.contains(t))),
        Err(e) => out.push(Finding::error("tables", &subject, e.to_string())),
    }
    out.extend(publication_safety(&admin, s, &tables, &published).await);
    out.extend(crate::check::identity::findings(&admin, plan).await);
    if plan.changefeed {
        out.extend(partial_updates(&admin, &tables).await);
    }
    out
}

/// What each pattern entry of `[source] tables` selects now, and whether the
/// publication does (or can be made to) follow it as tables appear.
async fn selection(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    patterns: &[crate::TablePattern],
) -> Vec<Finding> {
    let mut out = Vec::new();
    if patterns.is_empty() {
        return out;
    }
    if patterns.iter().any(|p| p.schema_name().is_some()) {
        match admin.server_version_num().await {
            Ok(v) => {
                if let Some(why) = crate::select::schema_patterns_unsupported(v, patterns) {
                    out.push(Finding::error("tables", &s.publication, why));
                    return out;
                }
            }
            Err(e) => out.push(Finding::error("tables", &s.publication, e.to_string())),
        }
    }
    for p in patterns {
        let subject = format!("tables {:?}", p.to_string());
        match admin.selected_tables(std::slice::from_ref(p)).await {
            Ok(now) if now.is_empty() => out.push(Finding::warning(
                "tables",
                subject,
                "selects no table now (tables created later are discovered)",
            )),
            Ok(now) => out.push(Finding::ok(
                "tables",
                subject,
                format!(
                    "selects {} table(s) now: {}; tables created later are discovered",
                    now.len(),
                    now.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            Err(e) => out.push(Finding::error("tables", subject, e.to_string())),
        }
    }
    let name = &s.publication;
    let exists = match admin.publication(name).await {
        Ok(p) => p.is_some(),
        Err(e) => {
            out.push(Finding::error("publication", name, e.to_string()));
            return out;
        }
    };
    if exists {
        match admin.unpublished_patterns(name, patterns).await {
            Ok(fixes) if fixes.is_empty() => out.push(Finding::ok(
                "publication",
                name,
                "follows the patterns: tables created later are published from their first row",
            )),
            Ok(fixes) => out.push(Finding::error("publication", name, fixes.join("; "))),
            Err(e) => out.push(Finding::error("publication", name, e.to_string())),
        }
    } else if s.publication_mode == PublicationChoice::Create {
        match admin.is_superuser().await {
            Ok(true) => {}
            Ok(false) => out.push(Finding::error(
                "privilege",
                name,
                format!(
                    "[source] tables patterns need a publication FOR {}, which only a superuser may create: have one create it (CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true)) and set publication_mode = \"existing\", or list the tables by name",
                    if patterns.contains(&crate::TablePattern::All) { "ALL TABLES" } else { "TABLES IN SCHEMA" },
                    quote_ident(name),
                    if patterns.contains(&crate::TablePattern::All) {
                        "ALL TABLES".to_owned()
                    } else {
                        let mut schemas: Vec<String> = patterns
                            .iter()
                            .filter_map(|p| p.schema_name().map(quote_ident))
                            .collect();
                        schemas.dedup();
                        format!("TABLES IN SCHEMA {}", schemas.join(", "))
                    }
                ),
            )),
            Err(e) => out.push(Finding::error("privilege", name, e.to_string())),
        }
    }
    out
}

/// A standby as the source: its version, `hot_standby_feedback`, and whether freshen
/// can ask the primary for a standby snapshot when it creates the slot there.
async fn standby_findings(admin: &PgAdmin, s: &PgSourceSettings, subject: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    match admin.standby_source_problem().await {
        Ok(Some(why)) => {
            out.push(Finding::error("standby", subject, why));
            return out;
        }
        Ok(None) => out.push(Finding::ok(
            "standby",
            subject,
            "the source is a standby: the slot and the decoding are here, off the primary; rebuilds write to [target], which must be the primary",
        )),
        Err(e) => out.push(Finding::error("standby", subject, e.to_string())),
    }
    let feedback = admin
        .setting("hot_standby_feedback")
        .await
        .unwrap_or_default();
    if feedback != "on" {
        out.push(Finding::warning(
            "standby",
            subject,
            "hot_standby_feedback is off: the primary may remove catalog rows the slot still needs, and the standby then invalidates the slot (a lost slot: changes lost until a sweep); set hot_standby_feedback = on on the standby, with a physical slot (primary_slot_name)",
        ));
    }
    let slot_exists = matches!(admin.slot(&s.slot).await, Ok(Some(_)));
    if !slot_exists && s.slot_mode == SlotChoice::Create {
        match s.primary() {
            Ok(Some(primary)) => match PgAdmin::connect(&primary).await {
                Ok(p) => match p.in_recovery().await {
                    Ok(false) => out.push(Finding::ok(
                        "primary_url",
                        subject,
                        "reachable: freshen asks it for a standby snapshot while it creates the slot",
                    )),
                    Ok(true) => out.push(Finding::error(
                        "primary_url",
                        subject,
                        "is a standby too: it must name the primary",
                    )),
                    Err(e) => out.push(Finding::warning("primary_url", subject, e.to_string())),
                },
                Err(e) => out.push(Finding::warning(
                    "primary_url",
                    subject,
                    format!("cannot connect ({e}): creating the slot then waits for the primary's next checkpoint"),
                )),
            },
            Ok(None) => out.push(Finding::warning(
                "primary_url",
                subject,
                "not set: creating the slot on the standby waits for the primary's next standby snapshot, which an idle primary writes only at its next checkpoint (up to checkpoint_timeout); set primary_url so freshen asks the primary for one (pg_log_standby_snapshot()), and confirms the slot only once this standby has the rebuilds behind it",
            )),
            Err(e) => out.push(Finding::error("primary_url", subject, e.to_string())),
        }
    }
    out
}

/// Whether the slot will survive a promotion (PostgreSQL 17): a failover slot, with the
/// standbys that keep it named in `synchronized_standby_slots`.
async fn failover(admin: &PgAdmin, s: &PgSourceSettings) -> Vec<Finding> {
    let name = &s.slot;
    match admin.slot_failover(name).await {
        Ok(Some((false, _))) if s.failover != Some(false) => vec![Finding::warning(
            "failover",
            name,
            format!(
                "is not a failover slot: no standby synchronizes it, and after a promotion freshen finds no slot there (changes lost until a sweep). Run on a replication connection (psql \"dbname=… replication=database\"): ALTER_REPLICATION_SLOT {name} (FAILOVER true); or set failover = false to keep it so"
            ),
        )],
        Ok(Some((true, sync))) if sync.trim().is_empty() => vec![Finding::warning(
            "failover",
            name,
            "is a failover slot, but synchronized_standby_slots is empty: freshen confirms it once rebuilds commit on the primary, and a standby promoted before it received a rebuild keeps a slot past the change that caused it (the rebuild lost until a sweep); name the standbys' physical slots in synchronized_standby_slots on the primary",
        )],
        Ok(Some((true, sync))) => vec![Finding::ok(
            "failover",
            name,
            format!(
                "is a failover slot; confirmed only once these standbys have flushed the rebuilds behind it: {sync}"
            ),
        )],
        Ok(_) => Vec::new(),
        Err(e) => vec![Finding::error("failover", name, e.to_string())],
    }
}

async fn slot(admin: &PgAdmin, slot: &str, mode: SlotChoice) -> Finding {
    match admin.slot(slot).await {
        Ok(None) => match mode {
            SlotChoice::Existing => Finding::error(
                "slot",
                slot,
                "does not exist and slot_mode = \"existing\": create it, or use slot_mode = \"create\"",
            ),
            SlotChoice::Temporary => Finding::ok("slot", slot, "temporary: created per session"),
            SlotChoice::Create => Finding::ok("slot", slot, "will be created"),
        },
        Ok(Some(info)) if info.is_lost() => Finding::error(
            "slot",
            slot,
            "was invalidated by the server (wal_status = lost): drop it with `freshen drop`, run again, and let the reconcile sweep rebuild",
        ),
        Ok(Some(info)) => {
            let lag = info.lag_bytes.unwrap_or(0);
            if info.active {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "is in use by process {} — another freshen may be running on it",
                        info.active_pid.map_or("?".into(), |p| p.to_string())
                    ),
                )
            } else if lag > LAG_WARNING_BYTES {
                Finding::warning(
                    "slot",
                    slot,
                    format!(
                        "exists, is idle and retains {} MiB of WAL: start `freshen run`, or `freshen drop` it if the pipeline is abandoned",
                        lag >> 20
                    ),
                )
            } else {
                Finding::ok("slot", slot, format!("exists, {lag} bytes behind"))
            }
        }
        Err(e) => Finding::error("slot", slot, e.to_string()),
    }
}

fn quoted_list(tables: &[TableName]) -> String {
    tables
        .iter()
        .map(TableName::quoted)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn publication(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    tables: &[TableName],
    standby: bool,
) -> Option<Finding> {
    let name = &s.publication;
    // A standby is read-only: freshen can neither create nor extend the publication
    // there; it is made on the primary and reaches the standby by replication.
    let on_primary = |statement: String| {
        Finding::error(
            "publication",
            name,
            format!(
                "the source is a standby: make the publication on the primary: {statement}; and set publication_mode = \"existing\""
            ),
        )
    };
    Some(match admin.publication(name).await {
        Ok(None) if standby => on_primary(format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)",
            quote_ident(name),
            quoted_list(tables)
        )),
        Ok(None) if s.publication_mode == PublicationChoice::Existing => Finding::error(
            "publication",
            name,
            format!(
                "does not exist and publication_mode = \"existing\": CREATE PUBLICATION {} FOR TABLE {}",
                quote_ident(name),
                quoted_list(tables)
            ),
        ),
        Ok(None) => Finding::ok(
            "publication",
            name,
            "will be created for the watched tables",
        ),
        Ok(Some(_)) => match admin.coverage(name, tables).await {
            Ok(Some(c)) if c.is_complete() => Finding::ok(
                "publication",
                name,
                "covers every watched table and operation",
            ),
            Ok(Some(c)) if standby && !c.missing_tables.is_empty() => on_primary(format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote_ident(name),
                quoted_list(&c.missing_tables)
            )),
            Ok(Some(c))
                if c.missing_operations.is_empty()
                    && s.publication_mode == PublicationChoice::Create
                    && admin.publication_is_ours(name).await.unwrap_or(false) =>
            {
                Finding::ok(
                    "publication",
                    name,
                    format!(
                        "will be extended with {} (freshen created it)",
                        c.missing_tables
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            }
            Ok(Some(c)) => {
                let mut what = Vec::new();
                if !c.missing_tables.is_empty() {
                    what.push(format!(
                        "lacks {}: ALTER PUBLICATION {} ADD TABLE {}",
                        c.missing_tables
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        quote_ident(name),
                        quoted_list(&c.missing_tables)
                    ));
                }
                if !c.missing_operations.is_empty() {
                    what.push(format!(
                        "does not publish {}",
                        c.missing_operations.join(", ")
                    ));
                }
                Finding::error("publication", name, what.join("; "))
            }
            Ok(None) => return None,
            Err(e) => Finding::error("publication", name, e.to_string()),
        },
        Err(e) => Finding::error("publication", name, e.to_string()),
    })
}

/// Tables whose changefeed events can lack an unchanged large value: under a replica
/// identity other than FULL an UPDATE does not send a TOASTed column it left alone, and
/// the changefeed fills it from the row's last image only when it has one.
async fn partial_updates(admin: &PgAdmin, tables: &[TableName]) -> Vec<Finding> {
    let advice = match admin.partial_updates(tables).await {
        Ok(a) => a,
        Err(e) => {
            return vec![Finding::error(
                "changefeed",
                "replica identity",
                e.to_string(),
            )];
        }
    };
    if advice.is_empty() {
        return vec![Finding::ok(
            "changefeed",
            "replica identity",
            "every captured table sends whole rows (or has no out-of-line columns)",
        )];
    }
    advice
        .into_iter()
        .map(|a| {
            Finding::warning(
                "changefeed",
                &a.table,
                format!(
                    "an UPDATE that leaves {} alone does not send them: the changefeed fills them from the row's last image, and marks the event \"partial\" when it has none; to always send whole rows: {}",
                    a.columns.join(", "),
                    a.fix
                ),
            )
        })
        .collect()
}

/// Publication safety and the privileges to create or extend the publication.
/// `published`: every table the publication publishes (`tables`, and what pattern
/// entries publish as a whole), each of which must replicate UPDATE and DELETE.
async fn publication_safety(
    admin: &PgAdmin,
    s: &PgSourceSettings,
    tables: &[TableName],
    published: &[TableName],
) -> Vec<Finding> {
    let name = &s.publication;
    let client = match admin.pool().get().await {
        Ok(c) => c,
        Err(e) => return vec![Finding::error("publication", name, e.to_string())],
    };
    let mut out = Vec::new();
    match unpublishable(&client, published).await {
        Ok(bad) if bad.is_empty() => out.push(Finding::ok(
            "publication",
            name,
            "every published table can replicate UPDATE and DELETE",
        )),
        Ok(bad) => {
            for b in bad {
                out.push(Finding::error(
                    "publication",
                    b.table.to_string(),
                    format!("freshen refuses to publish it: {b}"),
                ));
            }
        }
        Err(e) => out.push(Finding::error("publication", name, e.to_string())),
    }
    // Creating the publication, or adding tables to it, needs ownership of the tables.
    let to_add: Vec<TableName> = match admin.coverage(name, tables).await {
        Ok(None) if s.publication_mode == PublicationChoice::Create => tables.to_vec(),
        Ok(Some(c)) => c.missing_tables,
        _ => Vec::new(),
    };
    if !to_add.is_empty() {
        match publication_privileges(&client, &to_add).await {
            Ok(lacks) => {
                for l in lacks {
                    out.push(Finding::error("privilege", name, l));
                }
            }
            Err(e) => out.push(Finding::error("privilege", name, e.to_string())),
        }
    }
    out
}
