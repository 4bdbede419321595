//! How a target kind — the database where a view's rebuild SQL runs — plugs into a
//! program that picks it from a URL (the `freshen` binary), beside [`SourcePlug`]:
//!
//! ```text
//!   [target] url = "scheme://…" ──open(url)──► XTarget: TargetPlug
//!                                                 │ view_problems(view, source)  offline
//!                                                 └ connect(source) ──► dyn Target
//!                                                      │ how rebuilds prove they see
//!                                                      │ their changes (decided here)
//!                                                      └ view(spec) ──► dyn ViewTarget
//!                                                           │ rebuild()   prepared
//!                                                           │ fanouts()   one per `keys`
//!                                                           │ enumerate() the sweep's list
//!                                                           └ check()     `freshen check`
//! ```
//!
//! Each level holds what the next needs: the parsed URL; then what connecting decided
//! (which snapshot proves a rebuild sees the change that dirtied its key depends on
//! whether the source is the same server); then one view's own connections, so that a
//! slow or locked view never takes another's.
//!
//! [`SourcePlug`]: super::SourcePlug

use std::fmt;
use std::time::Duration;

use super::{Finding, Watched};
use crate::Gap;
use crate::rebuild::{Enumerate, Expand, Rebuild};
use crate::source::{BoxError, BoxFuture};

/// A view as a target builds it: the statements and watches the configuration gave,
/// without the file they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewSpec {
    /// The view's name (logs, the connections' application name, findings).
    pub name: String,
    /// Its watched tables, in configuration order: those with `keys` map their rows to
    /// the view's keys by that statement, the others carry the view's key.
    pub watch: Vec<Watched>,
    /// Statements run in one transaction per key (or per batch of keys); empty when
    /// the view is rebuilt by `query`.
    pub rebuild: Vec<String>,
    /// A view rebuilt by one query whose rows are written into a table.
    pub query: Option<QuerySpec>,
    /// Keys per rebuild round trip, passed as one array per key part; `None`: one key
    /// per statement (or the target's default batch for a `query`).
    pub rebuild_batch: Option<usize>,
    /// Without `rebuild_batch`: keys rebuilt in one transaction, each with its own
    /// parameters.
    pub keys_per_transaction: usize,
    /// Statements that rebuild a set of keys at once (one array per key part), run
    /// instead of `rebuild` for a call larger than a batch; empty: `rebuild` for every
    /// call.
    pub rebuild_set: Vec<String>,
    /// The reconcile sweep's listing of live keys, if the view sweeps.
    pub reconcile: Option<String>,
    /// Tables the view reads but does not watch, on purpose: `(schema, table)`.
    pub static_tables: Vec<(String, String)>,
    /// Connections the view may open (its workers and its sweep, within the cap).
    pub connections: usize,
    /// The server cancels a statement running longer than this.
    pub statement_timeout: Option<Duration>,
    /// The statement timeout of a whole-table run ([`Rebuild::whole`]), which may take
    /// far longer than a batch of keys; `statement_timeout` still bounds its lock waits.
    pub whole_timeout: Option<Duration>,
    /// The view's key as the target and the query name it (`$1..$n` order), when no
    /// watch entry of the file carries it (a view whose watches were inferred, see
    /// [`Target::infer`]); empty: the first watched table that carries it names it.
    pub key_names: Vec<String>,
}

/// What a view rebuilt by `query` writes into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuerySpec {
    /// The table the query's rows go into: `(schema, table)`.
    pub into: (String, String),
    /// The query: plain (its owner's SELECT; the target writes the batch filter around
    /// it on [`ViewSpec::key`]), or selecting its batch with `$1..$n` (one array per key
    /// part).
    pub query: String,
}

impl ViewSpec {
    /// Watched tables that carry the view's key.
    pub fn direct(&self) -> impl Iterator<Item = &Watched> {
        self.watch.iter().filter(|w| w.keys.is_none())
    }

    /// Watched tables mapped to the view's keys by a `keys` statement.
    pub fn fanouts(&self) -> impl Iterator<Item = &Watched> {
        self.watch.iter().filter(|w| w.keys.is_some())
    }

    /// The view's key columns: [`key_names`](Self::key_names) when set, else as the
    /// first watched table that carries it names them.
    pub fn key(&self) -> &[String] {
        if !self.key_names.is_empty() {
            return &self.key_names;
        }
        self.direct().next().map_or(&[], |w| w.key.as_slice())
    }

    /// Number of key parts (`$1..$n`).
    pub fn arity(&self) -> usize {
        self.key().len()
    }
}

/// Keys per statement of a view rebuilt by `query` when the file says nothing: large
/// enough that the per-statement costs (planning, the round trip, the visibility check)
/// are spread thin, small enough that one slow key delays few others (see
/// BENCHMARKS.md, "rebuild-index").
pub const DEFAULT_QUERY_BATCH: usize = 64;

/// The statement timeout of a whole-table run when the file says nothing: a recompute
/// of a large table takes far longer than a batch of keys.
pub const DEFAULT_WHOLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Which of the parameters `$1..$arity` `query` never uses (`$1` is not used by `$10`).
pub fn missing_params(query: &str, arity: usize) -> Vec<usize> {
    (1..=arity)
        .filter(|i| {
            let p = format!("${i}");
            !query.match_indices(&p).any(|(at, _)| {
                !query[at + p.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
        })
        .collect()
}

/// Whether `query` is a plain query — the SELECT its owner writes for `CREATE
/// MATERIALIZED VIEW`, with no `$n` parameter — whose batch filter the target writes
/// around it. A query that uses `$1` selects its batch itself.
pub fn is_plain_query(query: &str) -> bool {
    !uses_params(query)
}

/// Whether the text uses a positional parameter (`$` followed by a digit) outside
/// quotes, comments and dollar-quoted strings.
fn uses_params(query: &str) -> bool {
    let b = query.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => {
                let q = b[i];
                i += 1;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'$' => {
                if b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    // `$1` — unless it is inside an identifier (`a$1`).
                    let inside = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
                    if !inside {
                        return true;
                    }
                } else if let Some(end) = dollar_tag(&b[i..]) {
                    // `$$ … $$` or `$tag$ … $tag$`: skip to the closing tag.
                    let tag = &b[i..i + end];
                    let body = i + end;
                    match b[body..].windows(tag.len()).position(|w| w == tag) {
                        Some(p) => i = body + p + tag.len() - 1,
                        None => return false,
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// The length of a dollar-quote tag (`$$`, `$tag$`) at the start of `b`.
fn dollar_tag(b: &[u8]) -> Option<usize> {
    let end = b[1..]
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))?;
    (b[1 + end] == b'$' && !b.get(1).is_some_and(u8::is_ascii_digit)).then_some(end + 2)
}

/// A target kind, parsed from its URL, as a program that reads configuration uses it.
///
/// Implemented by each database crate on a type holding the parsed URL, and registered
/// by the URL schemes it answers to; everything a target knows about itself — which
/// statements it can run, how rebuilds prove visibility, its checks — lives in its
/// crate.
pub trait TargetPlug: fmt::Debug + Send + Sync + 'static {
    /// Parses `url`; every problem a sentence that never quotes the URL (it may hold a
    /// password).
    fn open(url: &str) -> Result<Self, Vec<String>>
    where
        Self: Sized;

    /// The kind's name for messages: `"PostgreSQL"`, `"MySQL/MariaDB"`.
    fn name(&self) -> &'static str;

    /// How this target's tables are spelled in the file (a view's `into`).
    fn naming(&self) -> super::Naming;

    /// What this target cannot do for `view`, known without I/O (each problem a
    /// sentence naming the view and saying what to write instead). `source_url`: the
    /// source's database, when it reads one.
    fn view_problems(&self, view: &ViewSpec, source_url: Option<&str>) -> Vec<String> {
        let _ = (view, source_url);
        Vec::new()
    }

    /// Connects, and decides how rebuilds prove they see the changes of `source_url`
    /// (the source's database, when it reads one) that dirtied their keys.
    fn connect<'a>(
        &'a self,
        source_url: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Box<dyn Target>, BoxError>>;

    /// Completes once work this kind left behind at shutdown has gone out (the cancel
    /// requests of rebuilds abandoned then, so the server stops their statements), or
    /// after `within`. The default: nothing to wait for.
    fn settled(&self, within: Duration) -> BoxFuture<'static, ()> {
        let _ = within;
        Box::pin(async {})
    }
}

/// What a target inferred for a view rebuilt by `query`: the watch entries the file
/// did not give (see [`Target::infer`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inferred {
    /// The view's key as the query returns it and the target names it, `$1..$n` order.
    pub key: Vec<String>,
    /// Entries for the tables the query reads that the view neither watches nor lists
    /// as static: those that carry the key, then fan-outs (`keys`), each once.
    pub watch: Vec<Watched>,
    /// What each entry needs (an index for a fan-out statement, …): advice for `check`.
    pub advice: Vec<Finding>,
}

/// What a target says a starting file for one view needs besides the view itself
/// (`freshen init`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Starter {
    /// The `[source]` table, as TOML lines, its URL from the environment variable it
    /// was given (never the URL itself: it may hold a password).
    pub source: String,
    /// The statements to run first (the target table, the publication), each complete;
    /// `freshen init --create` runs them ([`Target::create`]).
    pub create: Vec<String>,
    /// Advice, one item each, printed as comment lines.
    pub notes: Vec<String>,
    /// What the source's tables must change for the view to see every change it needs;
    /// never run by `--create` ([`SourceFix`]).
    pub fixes: Vec<SourceFix>,
}

/// A change to a source table without which a view loses changes — PostgreSQL: a
/// replica identity that carries the old key of a DELETE and of an UPDATE that moves a
/// row to another key. `freshen init` prints it and writes it into the file; only
/// `freshen init --fix-identity` runs it ([`Target::fix_source`]), since it changes the
/// user's table and what every write to it logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFix {
    /// The table, as the source names it (`schema.table`).
    pub table: String,
    /// What is lost without it and the cheapest change that keeps it — the words
    /// `freshen check` reports and `freshen run` warns with.
    pub advice: String,
    /// The statements, each complete (ending with `;`), to run one by one in order.
    pub statements: Vec<String>,
}

/// What `freshen init --from-matview` reads of a materialized view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Its defining SELECT.
    pub query: String,
    /// The columns of its unique index (what `REFRESH … CONCURRENTLY` needs): the key.
    pub key: Vec<String>,
}

/// Where a view's unhealed gaps are kept across restarts: state freshen owns, in the
/// target database. A gap is recorded before the batch that carried it goes on (so
/// before that batch can be confirmed upstream), read back when the view starts again,
/// and forgotten only once a person acknowledged it. Without this a restart would
/// forget a gap the stream will never send again, and the view would look healthy with
/// the hole still there.
pub trait GapLedger: Send + Sync + 'static {
    /// The gaps kept for `view` (none when nothing was ever recorded).
    fn load<'a>(&'a self, view: &'a str) -> BoxFuture<'a, Result<Vec<Gap>, BoxError>>;

    /// Keeps `gaps` for `view` (a table's newer reason replaces its older one).
    fn record<'a>(&'a self, view: &'a str, gaps: &'a [Gap]) -> BoxFuture<'a, Result<(), BoxError>>;

    /// Removes exactly `gaps` (as [`load`](Self::load) gave them) of `view`.
    fn remove<'a>(&'a self, view: &'a str, gaps: &'a [Gap]) -> BoxFuture<'a, Result<(), BoxError>>;

    /// Forgets the gaps of `view` that read as `lines` (their [`Gap`] text: what a
    /// person acknowledged); another reason of the same table is kept.
    fn forget<'a>(
        &'a self,
        view: &'a str,
        lines: &'a [String],
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let gone: Vec<Gap> = self
                .load(view)
                .await?
                .into_iter()
                .filter(|g| lines.contains(&g.to_string()))
                .collect();
            if gone.is_empty() {
                return Ok(());
            }
            self.remove(view, &gone).await
        })
    }
}

/// A connected target: makes each view's connections.
pub trait Target: Send + Sync + 'static {
    /// Where this target keeps views' unhealed gaps across restarts; `None` (the
    /// default): it keeps none, and a restart forgets them.
    fn gap_ledger(&self) -> Option<std::sync::Arc<dyn GapLedger>> {
        None
    }

    /// The connections of `view` alone (opened lazily), its statements cancelled by the
    /// server past the view's `statement_timeout`.
    fn view(&self, view: &ViewSpec) -> Result<Box<dyn ViewTarget>, BoxError>;

    /// For a view rebuilt by `query`: the watch entries its query needs beyond those
    /// it has (the file's entries win), inferred from the database; or every reason it
    /// cannot, each a sentence naming the table and saying what to write instead.
    /// Targets that cannot infer refuse with that sentence.
    fn infer<'a>(&'a self, view: &'a ViewSpec) -> BoxFuture<'a, Result<Inferred, Vec<String>>> {
        Box::pin(async move {
            Err(vec![format!(
                "view `{}`: inferring what to watch needs PostgreSQL (it reads the query's plan and the catalog); write its `watch` entries by hand",
                view.name
            )])
        })
    }

    /// For `freshen init`: the `[source]` table and the statements a file holding
    /// `view` (its entries `inferred`) starts from, its URL read from the environment
    /// variable `url_var`. Targets that cannot infer refuse, as for [`infer`](Self::infer).
    fn starter<'a>(
        &'a self,
        view: &'a ViewSpec,
        inferred: &'a Inferred,
        url_var: &'a str,
    ) -> BoxFuture<'a, Result<Starter, Vec<String>>> {
        let _ = (inferred, url_var);
        Box::pin(async move {
            Err(vec![format!(
                "view `{}`: a starting file is written from PostgreSQL (its plans and catalog); write this one by hand",
                view.name
            )])
        })
    }

    /// For `freshen init --from-matview`: a materialized view's query and key. Targets
    /// without materialized views refuse.
    fn import_matview<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Imported, Vec<String>>> {
        Box::pin(async move {
            Err(vec![format!(
                "{name}: materialized views are imported from PostgreSQL"
            )])
        })
    }

    /// For `freshen init --fix-identity`: runs [`SourceFix`] statements on the source
    /// database, one by one in order and each on its own (an index built `CONCURRENTLY`
    /// cannot run in a transaction); returns what it ran, one line each. Targets that
    /// write no starting file refuse.
    fn fix_source<'a>(
        &'a self,
        statements: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<String>, Vec<String>>> {
        let _ = statements;
        Box::pin(async move {
            Err(vec![
                "changing a source table's replica identity needs PostgreSQL".to_string(),
            ])
        })
    }

    /// For `freshen init --create`: runs a [`Starter`]'s statements, each only if
    /// what it creates is missing, in one transaction; returns what it did, one line
    /// each. Targets that write no starting file refuse.
    fn create<'a>(
        &'a self,
        statements: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<String>, Vec<String>>> {
        let _ = statements;
        Box::pin(async move {
            Err(vec![
                "creating a starting file's tables needs PostgreSQL".to_string(),
            ])
        })
    }
}

/// One view's connections to its target, and what runs over them.
pub trait ViewTarget: Send + Sync + 'static {
    /// The view's rebuild, its statements prepared.
    fn rebuild(&self) -> BoxFuture<'_, Result<Box<dyn Rebuild>, BoxError>>;

    /// One fan-out per watched table with a `keys` statement, in watch order, prepared.
    fn fanouts(&self) -> BoxFuture<'_, Result<Vec<Box<dyn Expand>>, BoxError>>;

    /// The reconcile sweep's listing, running `sql`.
    fn enumerate(&self, sql: &str) -> Box<dyn Enumerate>;

    /// What `freshen check` finds about the view's statements and tables here.
    fn check(&self) -> BoxFuture<'_, Vec<Finding>>;
}

/// A target's failure to connect or prepare: what it was doing, and why (the error's
/// source, so that a chain prints as `what: why`).
#[derive(Debug)]
pub struct TargetError {
    what: String,
    why: BoxError,
}

impl TargetError {
    /// `what` failed because of `why`.
    pub fn new(what: impl Into<String>, why: impl Into<BoxError>) -> TargetError {
        TargetError {
            what: what.into(),
            why: why.into(),
        }
    }
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for TargetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.why)
    }
}

impl fmt::Debug for dyn Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Target")
    }
}

impl fmt::Debug for dyn ViewTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ViewTarget")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(table: &str, key: &[&str], keys: Option<&str>) -> Watched {
        Watched {
            view: "v".into(),
            schema: "public".into(),
            table: table.into(),
            key: key.iter().map(|k| k.to_string()).collect(),
            keys: keys.map(str::to_owned),
            fixed_key: false,
        }
    }

    #[test]
    fn parameters_used_by_the_text() {
        assert!(missing_params("WHERE a = ANY($1) AND b = ANY($2)", 2).is_empty());
        assert_eq!(missing_params("WHERE a = ANY($12)", 1), vec![1]);
        assert_eq!(missing_params("WHERE a = ANY($1)", 2), vec![2]);
        assert_eq!(missing_params("SELECT 1", 1), vec![1]);
    }

    #[test]
    fn a_query_is_plain_unless_it_uses_a_parameter() {
        assert!(is_plain_query(
            "SELECT cid, count(*) AS n FROM items GROUP BY cid"
        ));
        assert!(!is_plain_query("SELECT cid FROM items WHERE cid = ANY($1)"));
        assert!(!is_plain_query(
            "SELECT cid FROM items WHERE cid = ANY ($12)"
        ));
        assert!(is_plain_query("SELECT '$1' AS a, \"$2\" FROM t -- $3\n"));
        assert!(is_plain_query("SELECT a FROM t /* $1 */"));
        assert!(is_plain_query(
            "SELECT $$ $1 $$ AS a, $x$ $2 $x$ AS b FROM t"
        ));
        assert!(is_plain_query("SELECT a$1 FROM t"));
        assert!(!is_plain_query(
            "SELECT $$x$$ AS a FROM t WHERE k = ANY($1)"
        ));
        assert!(is_plain_query("SELECT 1 /* unterminated $1"));
        assert!(is_plain_query("SELECT '$1"));
        assert!(is_plain_query("SELECT $"));
        assert!(is_plain_query("SELECT $$ $1"));
    }

    #[test]
    fn the_key_is_the_first_direct_watch_s() {
        let spec = ViewSpec {
            name: "v".into(),
            watch: vec![
                watched("plans", &["id"], Some("SELECT a FROM s WHERE plan = $1")),
                watched("subs", &["account", "region"], None),
                watched("accounts", &["id", "region"], None),
            ],
            rebuild: vec!["SELECT 1".into()],
            query: None,
            rebuild_batch: None,
            keys_per_transaction: 16,
            rebuild_set: Vec::new(),
            reconcile: None,
            static_tables: Vec::new(),
            connections: 1,
            statement_timeout: None,
            whole_timeout: None,
            key_names: Vec::new(),
        };
        assert_eq!(spec.key(), ["account", "region"]);
        assert_eq!(spec.arity(), 2);
        assert_eq!(spec.fanouts().count(), 1);
        assert_eq!(spec.direct().count(), 2);
    }
}
