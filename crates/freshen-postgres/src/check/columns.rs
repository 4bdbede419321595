//! Publication column lists (PostgreSQL 15: `CREATE PUBLICATION … FOR TABLE t (a, b)`),
//! for `freshen check`.
//!
//! A column list makes pgoutput convert and send only the listed columns: a view rebuilt
//! from its source tables needs no more of an event than the columns its key is read
//! from, so a list of those (and the replica identity's, which PostgreSQL requires) cuts
//! the walsender's work (`cargo run --release -p freshen-bench -- write-tax`). Three
//! things can go wrong, each said here: a list without a view's key column (its events
//! carry no key, so nothing is rebuilt from them), a list without the replica identity's
//! columns (PostgreSQL then refuses the application's UPDATE and DELETE), and a list on a
//! table whose whole rows a changefeed or a sink publishes (they would get only the
//! listed columns).
//!
//! [`judge`] decides (pure); [`findings`] reads the lists and identities.

use freshen::plug::{Finding, Plan};

use crate::{PgAdmin, PgError, ReplicaIdentity, TableIdentity, TableName, quote_ident};

const CHECK: &str = "column_list";

/// One watched table's column list in the publication, and what reads its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The table, its identity and the identity's columns.
    pub identity: TableIdentity,
    /// The columns the publication lists for it.
    pub columns: Vec<String>,
    /// (view, key columns) of each view watching it.
    pub views: Vec<(String, Vec<String>)>,
    /// Whether something publishes its whole rows (the changefeed, a sink).
    pub whole_rows: bool,
}

/// The finding for one table with a column list (pure).
pub(crate) fn judge(publication: &str, l: &Listed) -> Finding {
    let table = &l.identity.table;
    let subject = table.to_string();
    let has = |c: &String| l.columns.contains(c);
    let listed = l.columns.join(", ");
    let fix = |wanted: &[String]| {
        let mut all = l.columns.clone();
        all.extend(wanted.iter().filter(|c| !has(c)).cloned());
        format!(
            "ALTER PUBLICATION {p} DROP TABLE {t}; ALTER PUBLICATION {p} ADD TABLE {t} ({});",
            all.iter()
                .map(|c| quote_ident(c))
                .collect::<Vec<_>>()
                .join(", "),
            p = quote_ident(publication),
            t = table.quoted(),
        )
    };
    // PostgreSQL checks the list against the identity on each UPDATE and DELETE.
    let identity_missing: Vec<String> = match l.identity.identity {
        ReplicaIdentity::Full => vec!["every column (REPLICA IDENTITY FULL)".to_owned()],
        _ => l
            .identity
            .key_columns
            .iter()
            .filter(|c| !has(c))
            .cloned()
            .collect(),
    };
    if !identity_missing.is_empty() {
        let more: Vec<String> = l
            .identity
            .key_columns
            .iter()
            .filter(|c| !has(c))
            .cloned()
            .collect();
        let remedy = if l.identity.identity == ReplicaIdentity::Full {
            "drop the column list or use a narrower identity (see replica_identity)".to_owned()
        } else {
            format!("Run: {}", fix(&more))
        };
        return Finding::error(
            CHECK,
            subject,
            format!(
                "publication {publication} lists only ({listed}), without {} of the replica identity: PostgreSQL refuses the application's UPDATE and DELETE on it. {remedy}",
                identity_missing.join(", ")
            ),
        );
    }
    let mut keyless = Vec::new();
    let mut wanted = Vec::new();
    for (view, key) in &l.views {
        let missing: Vec<&String> = key.iter().filter(|c| !has(c)).collect();
        if !missing.is_empty() {
            keyless.push(format!(
                "{view} (key {})",
                missing
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            wanted.extend(missing.into_iter().cloned());
        }
    }
    if !keyless.is_empty() {
        return Finding::error(
            CHECK,
            subject,
            format!(
                "publication {publication} lists only ({listed}): view(s) {} read their key from columns it leaves out, so its events carry no key and nothing is rebuilt from them. Run: {}",
                keyless.join(", "),
                fix(&wanted)
            ),
        );
    }
    if l.whole_rows {
        return Finding::warning(
            CHECK,
            subject,
            format!(
                "publication {publication} lists only ({listed}): the changefeed and sinks publish these columns alone. Drop the list if they should carry whole rows"
            ),
        );
    }
    Finding::ok(
        CHECK,
        subject,
        format!(
            "publication {publication} lists ({listed}): every view's key and the replica identity, and pgoutput converts and sends nothing else"
        ),
    )
}

/// Column lists of `publication`, by table (tables without a list left out). Before
/// PostgreSQL 15 there are none.
async fn lists(
    admin: &PgAdmin,
    publication: &str,
) -> Result<Vec<(TableName, Vec<String>)>, PgError> {
    const SQL: &str = "\
SELECT n.nspname::text, c.relname::text, \
       ARRAY(SELECT a.attname::text FROM unnest(r.prattrs::int2[]) k(attnum) \
             JOIN pg_attribute a ON a.attrelid = r.prrelid AND a.attnum = k.attnum \
             ORDER BY a.attnum) \
FROM pg_publication_rel r \
JOIN pg_publication p ON p.oid = r.prpubid \
JOIN pg_class c ON c.oid = r.prrelid \
JOIN pg_namespace n ON n.oid = c.relnamespace \
WHERE p.pubname = $1 AND r.prattrs IS NOT NULL";
    let client = crate::pool::client(admin.pool()).await?;
    if client
        .query_one("SHOW server_version_num", &[])
        .await
        .map_or(0, |r| r.get::<_, String>(0).parse::<u32>().unwrap_or(0))
        < 150_000
    {
        return Ok(Vec::new());
    }
    let rows = client
        .query(SQL, &[&publication])
        .await
        .map_err(|e| PgError::sql("cannot read the publication's column lists", e))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)),
                r.get(2),
            )
        })
        .collect())
}

/// One finding per watched table the publication gives a column list.
pub(crate) async fn findings(admin: &PgAdmin, publication: &str, plan: &Plan) -> Vec<Finding> {
    let lists = match lists(admin, publication).await {
        Ok(l) => l,
        Err(e) => return vec![Finding::error(CHECK, publication, e.to_string())],
    };
    let mut out = Vec::new();
    for (table, columns) in lists {
        let views: Vec<(String, Vec<String>)> = plan
            .watched
            .iter()
            .filter(|w| w.schema == table.schema && w.table == table.name)
            .map(|w| (w.view.clone(), w.key.clone()))
            .collect();
        let captured = plan
            .tables
            .iter()
            .any(|(s, t)| *s == table.schema && *t == table.name);
        if !captured {
            continue;
        }
        let identity = match admin.replica_identity(&table).await {
            Ok(i) => i,
            Err(e) => {
                out.push(Finding::error(CHECK, table.to_string(), e.to_string()));
                continue;
            }
        };
        // Captured but watched by no view: a sink or the outbox reads its rows. (A sink
        // on a table a view watches too is not told apart: the plan does not say.)
        let whole_rows = plan.changefeed || views.is_empty();
        out.push(judge(
            publication,
            &Listed {
                identity,
                columns,
                views,
                whole_rows,
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen::plug::Level;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn listed(identity: ReplicaIdentity, key_columns: &[&str], columns: &[&str]) -> Listed {
        Listed {
            identity: TableIdentity {
                table: TableName::new("public", "readings"),
                identity,
                key_columns: strs(key_columns),
                primary_key: strs(&["id"]),
            },
            columns: strs(columns),
            views: vec![("device_totals".into(), strs(&["device"]))],
            whole_rows: false,
        }
    }

    #[test]
    fn a_list_of_the_key_and_identity_is_fine_and_anything_less_is_not() {
        use ReplicaIdentity::{Default as D, Full as F, Index as I};
        // (case, listed, level, words the message must hold)
        let cases: Vec<(&str, Listed, Level, &str)> = vec![
            (
                "key and identity listed",
                listed(I, &["device", "id"], &["id", "device"]),
                Level::Ok,
                "sends nothing else",
            ),
            (
                "key column left out",
                listed(D, &["id"], &["id", "value"]),
                Level::Error,
                "view(s) device_totals (key device)",
            ),
            (
                "identity column left out",
                listed(I, &["device", "id"], &["device"]),
                Level::Error,
                "without id of the replica identity",
            ),
            (
                "FULL identity with a list",
                listed(F, &[], &["id", "device"]),
                Level::Error,
                "REPLICA IDENTITY FULL",
            ),
            (
                "whole rows wanted",
                Listed {
                    whole_rows: true,
                    ..listed(I, &["device", "id"], &["id", "device"])
                },
                Level::Warning,
                "changefeed and sinks",
            ),
        ];
        for (case, l, level, words) in cases {
            let f = judge("freshen", &l);
            assert_eq!(f.level, level, "{case}: {f:?}");
            assert!(f.message.contains(words), "{case}: {}", f.message);
        }
    }

    #[test]
    fn the_fix_lists_what_was_there_and_what_is_missing() {
        let f = judge(
            "freshen",
            &listed(ReplicaIdentity::Default, &["id"], &["id"]),
        );
        assert!(
            f.message.ends_with(
                "Run: ALTER PUBLICATION \"freshen\" DROP TABLE \"public\".\"readings\"; ALTER PUBLICATION \"freshen\" ADD TABLE \"public\".\"readings\" (\"id\", \"device\");"
            ),
            "{}",
            f.message
        );
    }
}
