//! `freshen init`: a starting file for one query — the SELECT a person already has (or
//! a materialized view's, imported with its unique index as the key) — the view with
//! what it watches inferred from the database, and the statements to run first (the
//! target table, the publication), which the target kind writes
//! ([`freshen::plug::Target::starter`]) and, with `--create`, runs.
//!
//! The first `freshen run` of a file for a plain query builds the table whole while it
//! is empty, then keeps it fresh: `init`, `check`, `run` go from a database to a fresh
//! table.

use std::io::Write;
use std::path::Path;

use freshen::plug::{QuerySpec, ViewSpec};

/// What `freshen init` was asked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Request {
    /// The view's name (default: the materialized view's, or the target table's).
    pub name: Option<String>,
    /// The target table, as the file writes it (default with `from_matview`: the
    /// materialized view's name with `_fresh`, beside it).
    pub into: Option<String>,
    /// The query (or `from_matview`).
    pub query: Option<String>,
    /// A materialized view to import: its query, and its unique index as the key.
    pub from_matview: Option<String>,
    /// The key columns, when neither the target, the materialized view nor the query's
    /// `GROUP BY` says.
    pub key: Vec<String>,
    /// Run the statements first (the target table, the publication), each only if
    /// missing.
    pub create: bool,
    /// Set the replica identity a watched table lacks (the target kind's
    /// [`freshen::plug::SourceFix`]es): it changes the user's table, so only when asked.
    pub fix_identity: bool,
    /// The environment variable holding the database URL.
    pub url_env: String,
}

/// What `init` wrote, and what it ran.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The file.
    pub file: String,
    /// With `--create`: each statement run (or left, because what it creates exists);
    /// with `--fix-identity`, each statement that set a replica identity.
    pub created: Vec<String>,
}

/// The file for `request` (and, with `create`, its statements run, each told to `say`
/// before it runs), or every problem (a sentence each, never the URL).
pub(crate) async fn starting_file(
    request: &Request,
    say: &dyn Fn(&str),
) -> Result<Written, Vec<String>> {
    let var = &request.url_env;
    let url = std::env::var(var).map_err(|_| {
        vec![format!(
            "set {var} to the database URL (freshen init reads it there and writes `${{{var}}}` into the file)"
        )]
    })?;
    let plug = crate::kinds::builtin().open_target(&url).map_err(|p| {
        p.into_iter()
            .map(|p| format!("{var}: {p}"))
            .collect::<Vec<_>>()
    })?;
    let target = plug
        .connect(Some(&url))
        .await
        .map_err(|e| vec![freshen::redact_text(&format!("cannot connect: {e}"))])?;
    let imported = match &request.from_matview {
        Some(m) => Some(target.import_matview(m).await?),
        None => None,
    };
    let (query, into_text) = match (&imported, &request.query, &request.into) {
        (Some(m), _, into) => (
            m.query.clone(),
            into.clone()
                .unwrap_or_else(|| format!("{}.{}_fresh", m.schema, m.name)),
        ),
        (None, Some(q), Some(into)) => (q.clone(), into.clone()),
        (None, None, _) => {
            return Err(vec![
                "give the query (--query \"SELECT …\") or a materialized view to import (--from-matview schema.name)".to_string(),
            ]);
        }
        (None, Some(_), None) => {
            return Err(vec![
                "--into: the table the query's rows go into (schema.table or table)".to_string(),
            ]);
        }
    };
    let into = plug
        .naming()
        .parse(&into_text)
        .map_err(|e| vec![format!("--into `{into_text}` is not a table name: {e}")])?;
    let name = request
        .name
        .clone()
        .or_else(|| imported.as_ref().map(|m| m.name.clone()))
        .unwrap_or_else(|| into.1.clone());
    let key = if request.key.is_empty() {
        imported.as_ref().map(|m| m.key.clone()).unwrap_or_default()
    } else {
        request.key.clone()
    };
    let mut spec = ViewSpec {
        name: name.clone(),
        watch: Vec::new(),
        rebuild: Vec::new(),
        query: Some(QuerySpec {
            into,
            query: query.clone(),
        }),
        rebuild_batch: None,
        keys_per_transaction: 16,
        rebuild_set: Vec::new(),
        reconcile: None,
        static_tables: Vec::new(),
        connections: 1,
        statement_timeout: None,
        whole_timeout: None,
        key_names: key.clone(),
    };
    let inferred = target.infer(&spec).await?;
    if !inferred.key.is_empty() {
        spec.key_names = inferred.key.clone();
    }
    let starter = target.starter(&spec, &inferred, var).await?;
    let mut created = if request.create {
        for s in &starter.create {
            say(&format!("running: {s}"));
        }
        target.create(&starter.create).await?
    } else {
        Vec::new()
    };
    let fixing: Vec<String> = starter
        .fixes
        .iter()
        .flat_map(|f| f.statements.iter().cloned())
        .collect();
    if request.fix_identity {
        if fixing.is_empty() {
            say(
                "--fix-identity: the watched tables' replica identities already carry what the view needs; nothing changed",
            );
        } else {
            for s in &fixing {
                say(&format!("running: {s}"));
            }
            created.extend(target.fix_source(&fixing).await?);
        }
    } else if !fixing.is_empty() {
        // Never silent: a file that loses changes says so, here and in the file.
        for f in &starter.fixes {
            say(&format!("warning: {}: {}", f.table, f.advice));
        }
        say(
            "the file says so too: run those statements before `freshen run`, or add --fix-identity to this command to have them run",
        );
    }
    let plain = freshen::plug::is_plain_query(&query);
    let mut out = String::from("# Written by `freshen init`.\n#\n");
    out.push_str(&identity_block(&starter.fixes, request.fix_identity));
    if !request.create {
        out.push_str("# Run first (or `freshen init … --create` does):\n");
        for s in &starter.create {
            out.push_str(&format!("#   {s};\n"));
        }
        out.push_str("#\n");
    }
    for note in &starter.notes {
        for line in note.lines() {
            out.push_str(&format!("# {line}\n"));
        }
        out.push_str("#\n");
    }
    if let Some(m) = &imported {
        let into = spec
            .query
            .as_ref()
            .map(|q| format!("{}.{}", q.into.0, q.into.1))
            .unwrap_or_default();
        out.push_str(&format!(
            "# Imported from the materialized view {s}.{n}, keyed on its unique index ({k}).\n\
             # Once `freshen run` has built {into}, readers move to it with no gap, in one\n\
             # transaction (they wait for it, then read the fresh table through the same name):\n\
             #   BEGIN; DROP MATERIALIZED VIEW {s}.{n}; CREATE VIEW {s}.{n} AS SELECT * FROM {into}; COMMIT;\n\
             # and the cron job refreshing it goes.\n#\n",
            s = m.schema,
            n = m.name,
            k = m.key.join(", ")
        ));
    }
    out.push('\n');
    out.push_str(&starter.source);
    out.push_str(&format!(
        "\n[[views]]\nname = {}\ninto = {}\nquery = {}\n",
        toml_string(&name),
        toml_string(&into_text),
        toml_string(&query),
    ));
    if !request.key.is_empty() {
        let key: Vec<String> = request.key.iter().map(|k| toml_string(k)).collect();
        out.push_str(&format!("key = [{}]\n", key.join(", ")));
    }
    let watch = crate::infer::toml(&inferred, &plug.naming());
    if plain {
        out.push_str(
            "# What it watches is inferred from the query at each start; to pin it, uncomment:\n",
        );
        for line in watch.lines() {
            out.push_str(&format!("# {line}\n"));
        }
    } else {
        out.push_str("# Inferred from the query: delete to infer them again at each start.\n");
        out.push_str(&watch);
        out.push('\n');
    }
    Ok(Written { file: out, created })
}

/// The file's lines on `fixes`: what was run (`fixed`), or what loses changes until the
/// statements are run, as comment lines; nothing without fixes.
fn identity_block(fixes: &[freshen::plug::SourceFix], fixed: bool) -> String {
    if fixes.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    if fixed {
        out.push_str(
            "# Run by `freshen init --fix-identity`, for the replica identity the view needs:\n",
        );
    } else {
        out.push_str("# WARNING: as the database is now, this view loses changes.\n");
        for f in fixes {
            for line in wrap(&format!("{}: {}", f.table, f.advice), 86) {
                out.push_str(&format!("# {line}\n"));
            }
        }
        out.push_str("# Run before `freshen run` (or `freshen init … --fix-identity` does):\n");
    }
    for f in fixes {
        for s in &f.statements {
            out.push_str(&format!("#   {s}\n"));
        }
    }
    out.push_str("#\n");
    out
}

/// `text` in lines of at most `width` characters, broken between words (a longer word
/// stays whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Writes `text` to a new file at `path`; an existing file is left alone (an error).
pub(crate) fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

fn toml_string(s: &str) -> String {
    crate::infer::toml_string(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix() -> freshen::plug::SourceFix {
        freshen::plug::SourceFix {
            table: "public.items".into(),
            advice: "view(s) ct need the old cid of an UPDATE that changes it and of a DELETE; Run: A; B;".into(),
            statements: vec!["A;".into(), "B;".into()],
        }
    }

    #[test]
    fn the_file_says_what_loses_changes_or_what_ran() {
        assert_eq!(identity_block(&[], false), "");
        assert_eq!(identity_block(&[], true), "");
        let lossy = identity_block(&[fix()], false);
        assert!(
            lossy.starts_with("# WARNING: as the database is now, this view loses changes.\n"),
            "{lossy}"
        );
        assert!(
            lossy.contains("# public.items: view(s) ct need the old cid"),
            "{lossy}"
        );
        assert!(lossy.ends_with("does):\n#   A;\n#   B;\n#\n"), "{lossy}");
        assert!(lossy.lines().all(|l| l.starts_with('#')), "{lossy}");
        let fixed = identity_block(&[fix()], true);
        assert_eq!(
            fixed,
            "# Run by `freshen init --fix-identity`, for the replica identity the view needs:\n#   A;\n#   B;\n#\n"
        );
    }

    #[test]
    fn wraps_between_words() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("averylongword x", 4), ["averylongword", "x"]);
        assert!(wrap("  ", 10).is_empty());
    }
}
