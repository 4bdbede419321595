//! `SchemaChange`: a DDL statement on a watched table, as the binlog reported it.

use crate::FilePos;
use crate::binlog::DdlKind;

/// A schema change on a watched table, seen in the binlog (a QUERY event). Reported
/// once: logged, counted in [`Health::schema_changes`](crate::Health), and sent to every
/// [`MySqlHandle::schema_changes`](crate::MySqlHandle::schema_changes) subscriber.
///
/// A `DROP TABLE` (or the old name of a `RENAME TABLE`, or a `DROP DATABASE` naming a
/// watched table) also reaches the refresher as a truncate event, so the views over it
/// are swept; and as a [`freshen::SchemaChange`] in its batch, which pauses the views
/// over it until a table is back under that name (`CREATE TABLE`, or a `RENAME TABLE`
/// onto it, as online schema change tools swap tables). An `ALTER TABLE` reaches it as a
/// [`freshen::Difference::Altered`], reported but pausing nothing: the statement does
/// not say which columns changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// Database of the table.
    pub schema: String,
    /// The table (empty for `DROP DATABASE`).
    pub table: String,
    /// What the statement does.
    pub kind: DdlKind,
    /// The statement as logged (at most 500 bytes).
    pub statement: String,
    /// Where the statement starts in the binlog.
    pub position: FilePos,
}

/// Which watched tables a DDL statement broke or mended, remembered across statements:
/// a dropped table, or a name a `RENAME TABLE` moved away, breaks the views over it
/// until a `CREATE TABLE` or a `RENAME TABLE` brings a table back under that name (what
/// online schema change tools do: copy, then swap names).
#[derive(Debug, Default)]
pub(crate) struct Broken {
    tables: std::collections::HashMap<(String, String), Vec<freshen::Difference>>,
}

impl Broken {
    /// The refresher's view of one DDL statement on `tables` (for `RENAME TABLE`, old
    /// and new name of each pair in turn): one [`freshen::SchemaChange`] per watched
    /// table it touches, carrying every difference from the table as first seen (none:
    /// back as it was). `ALTER TABLE` and index statements carry the statement, which
    /// breaks nothing by itself: the binlog does not say which columns changed.
    pub(crate) fn apply(
        &mut self,
        kind: DdlKind,
        tables: &[(String, String)],
        statement: &str,
        watched: impl Fn(&str, &str) -> bool,
    ) -> Vec<freshen::SchemaChange> {
        use freshen::Difference;
        let mut out = Vec::new();
        let mut change = |tables: &mut std::collections::HashMap<_, Vec<Difference>>,
                          key: (String, String),
                          set: Option<Vec<Difference>>,
                          extra: Option<Difference>| {
            let mut differences = match set {
                Some(d) if d.is_empty() => {
                    tables.remove(&key);
                    Vec::new()
                }
                Some(d) => {
                    tables.insert(key.clone(), d.clone());
                    d
                }
                None => tables.get(&key).cloned().unwrap_or_default(),
            };
            differences.extend(extra);
            out.push(freshen::SchemaChange {
                schema: key.0.as_str().into(),
                table: key.1.as_str().into(),
                differences,
            });
        };
        match kind {
            DdlKind::DropTable => {
                for (db, t) in tables
                    .iter()
                    .filter(|(d, t)| !t.is_empty() && watched(d, t))
                {
                    change(
                        &mut self.tables,
                        (db.clone(), t.clone()),
                        Some(vec![Difference::Dropped]),
                        None,
                    );
                }
            }
            DdlKind::RenameTable => {
                for pair in tables.chunks(2) {
                    let [old, new] = pair else { continue };
                    if watched(&old.0, &old.1) {
                        let to = Difference::Renamed {
                            schema: new.0.as_str().into(),
                            table: new.1.as_str().into(),
                        };
                        change(&mut self.tables, old.clone(), Some(vec![to]), None);
                    }
                    if self.tables.contains_key(new) {
                        change(&mut self.tables, new.clone(), Some(Vec::new()), None);
                    }
                }
            }
            DdlKind::CreateTable => {
                for key in tables {
                    if self.tables.contains_key(key) {
                        change(&mut self.tables, key.clone(), Some(Vec::new()), None);
                    }
                }
            }
            DdlKind::AlterTable | DdlKind::Index => {
                for key in tables
                    .iter()
                    .filter(|(d, t)| !t.is_empty() && watched(d, t))
                {
                    let altered = Difference::Altered {
                        statement: freshen::clip(statement, 200).into(),
                    };
                    change(&mut self.tables, key.clone(), None, Some(altered));
                }
            }
            DdlKind::DropDatabase | DdlKind::Other => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(db: &str, table: &str) -> (String, String) {
        (db.to_string(), table.to_string())
    }

    fn texts(changes: &[freshen::SchemaChange]) -> Vec<String> {
        changes.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_dropped_table_breaks_until_created_again() {
        let mut b = Broken::default();
        let all = |_: &str, _: &str| true;
        let dropped = b.apply(
            DdlKind::DropTable,
            &[t("app", "orders")],
            "DROP TABLE orders",
            all,
        );
        assert_eq!(texts(&dropped), ["app.orders: dropped"]);
        let altered = b.apply(
            DdlKind::AlterTable,
            &[t("app", "orders")],
            "ALTER TABLE orders ADD x INT",
            all,
        );
        assert_eq!(
            texts(&altered),
            ["app.orders: dropped, altered (ALTER TABLE orders ADD x INT)"],
            "still broken"
        );
        let created = b.apply(
            DdlKind::CreateTable,
            &[t("app", "orders")],
            "CREATE TABLE orders (…)",
            all,
        );
        assert_eq!(texts(&created), ["app.orders: back as it was"]);
        assert!(
            b.apply(
                DdlKind::CreateTable,
                &[t("app", "other")],
                "CREATE TABLE other (…)",
                all
            )
            .is_empty(),
            "a new table is no change of a watched one"
        );
    }

    #[test]
    fn a_rename_swap_breaks_and_mends_in_one_statement() {
        let mut b = Broken::default();
        let only_orders = |_: &str, t: &str| t == "orders";
        let swap = [
            t("app", "orders"),
            t("app", "_orders_old"),
            t("app", "_orders_new"),
            t("app", "orders"),
        ];
        let changes = b.apply(DdlKind::RenameTable, &swap, "RENAME TABLE …", only_orders);
        assert_eq!(
            texts(&changes),
            [
                "app.orders: renamed to app._orders_old",
                "app.orders: back as it was"
            ]
        );
        let away = b.apply(
            DdlKind::RenameTable,
            &[t("app", "orders"), t("app", "archive")],
            "RENAME TABLE orders TO archive",
            only_orders,
        );
        assert_eq!(texts(&away), ["app.orders: renamed to app.archive"]);
        assert!(
            b.apply(
                DdlKind::DropTable,
                &[t("app", "unwatched")],
                "DROP TABLE unwatched",
                only_orders
            )
            .is_empty()
        );
    }
}
