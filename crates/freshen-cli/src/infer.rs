//! Views rebuilt by `query` whose file leaves out (some of) their `watch` entries: the
//! target kind infers them ([`freshen::plug::Target::infer`]; PostgreSQL from the
//! query's plan and the catalog, other kinds refuse) at `check` and at `run` alike, and
//! `check` prints them as TOML to paste. The file's entries and `static` tables win.

use freshen::plug::{Inferred, Naming, Target};

use crate::config::{Config, View, Watch};

/// What inferring a file's views found.
#[derive(Debug)]
pub(crate) struct Completed {
    /// The configuration with each view's inferred entries added after its own.
    pub config: Config,
    /// Per view that gained entries: its name and what was inferred.
    pub inferred: Vec<(String, Inferred)>,
    /// Per view that could not be inferred: its name and every reason.
    pub refused: Vec<(String, Vec<String>)>,
}

/// Whether `cfg` has a view whose entries may be inferred (one rebuilt by `query`).
pub(crate) fn wanted(cfg: &Config) -> bool {
    cfg.views.iter().any(|v| v.query.is_some())
}

/// Infers the entries of every view of `cfg` rebuilt by `query`, on `target`.
pub(crate) async fn complete(cfg: &Config, target: &dyn Target) -> Completed {
    let mut out = Completed {
        config: cfg.clone(),
        inferred: Vec::new(),
        refused: Vec::new(),
    };
    for view in &mut out.config.views {
        if view.query.is_none() {
            continue;
        }
        match target.infer(&view.spec(Some(1))).await {
            Ok(inferred) => {
                apply(view, &inferred);
                if !inferred.watch.is_empty() {
                    out.inferred.push((view.name.clone(), inferred));
                }
            }
            Err(problems) => out.refused.push((view.name.clone(), problems)),
        }
    }
    out
}

/// [`complete`] for `run`: the configuration to run, or an error listing every reason.
pub(crate) async fn for_run(cfg: &Config, target: &dyn Target) -> anyhow::Result<Config> {
    let done = complete(cfg, target).await;
    if !done.refused.is_empty() {
        let problems: Vec<String> = done
            .refused
            .iter()
            .flat_map(|(_, p)| p.iter().map(|p| format!("  {p}")))
            .collect();
        anyhow::bail!(
            "cannot infer what the views watch (`freshen check` shows it):\n{}",
            problems.join("\n")
        );
    }
    for (view, inferred) in &done.inferred {
        tracing::info!(
            view = %view,
            "watching what its query reads (inferred): {}",
            inferred
                .watch
                .iter()
                .map(|w| match &w.keys {
                    None => format!("{}.{} by ({})", w.schema, w.table, w.key.join(", ")),
                    Some(_) => format!("{}.{} through `keys`", w.schema, w.table),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(done.config)
}

/// Adds `inferred` to `view`.
fn apply(view: &mut View, inferred: &Inferred) {
    for w in &inferred.watch {
        view.watch.push(Watch {
            schema: w.schema.clone(),
            table: w.table.clone(),
            key: w.key.clone(),
            keys: w.keys.clone(),
            fixed_key: w.fixed_key,
            line: None,
        });
    }
    if !inferred.key.is_empty() {
        view.key_names = inferred.key.clone();
    }
}

/// The inferred entries as a `watch = [...]` to paste into the view, table names
/// written by the source's `naming` rules.
pub(crate) fn toml(inferred: &Inferred, naming: &Naming) -> String {
    let mut out = String::from("watch = [\n");
    for w in &inferred.watch {
        let table = format!("{}.{}", part(&w.schema, naming), part(&w.table, naming));
        let key: Vec<String> = w.key.iter().map(|k| string(k)).collect();
        out.push_str(&format!(
            "  {{ table = {}, key = [{}]",
            string(&table),
            key.join(", ")
        ));
        if let Some(keys) = &w.keys {
            out.push_str(&format!(", keys = {}", string(keys)));
        }
        out.push_str(" },\n");
    }
    out.push(']');
    out
}

/// A name part as the file writes it: bare when the rules read it back the same.
fn part(s: &str, naming: &Naming) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && (!naming.fold_unquoted || !s.chars().any(|c| c.is_ascii_uppercase()));
    if plain {
        s.to_owned()
    } else {
        let q = naming.quote;
        format!("{q}{}{q}", s.replace(q, &format!("{q}{q}")))
    }
}

/// A TOML basic string.
pub(crate) fn toml_string(s: &str) -> String {
    string(s)
}

fn string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use freshen::plug::Watched;

    fn pg() -> Naming {
        Naming {
            quote: '"',
            fold_unquoted: true,
            default_schema: Some("public".into()),
            schema_word: "schema",
        }
    }

    #[test]
    fn inferred_entries_print_as_toml_that_reads_back_the_same() {
        let inferred = Inferred {
            key: vec!["account_id".into()],
            watch: vec![
                Watched {
                    view: "v".into(),
                    schema: "public".into(),
                    table: "accounts".into(),
                    key: vec!["id".into()],
                    keys: None,
                    fixed_key: false,
                },
                Watched {
                    view: "v".into(),
                    schema: "public".into(),
                    table: "Plans".into(),
                    key: vec!["id".into()],
                    keys: Some("SELECT account_id FROM \"Subs\" WHERE plan_id = $1".into()),
                    fixed_key: false,
                },
            ],
            advice: Vec::new(),
        };
        let text = toml(&inferred, &pg());
        assert_eq!(
            text,
            "watch = [\n  { table = \"public.accounts\", key = [\"id\"] },\n  { table = \"public.\\\"Plans\\\"\", key = [\"id\"], keys = \"SELECT account_id FROM \\\"Subs\\\" WHERE plan_id = $1\" },\n]"
        );
        // It parses as TOML, and its names by the same rules.
        let parsed: toml_edit::DocumentMut = text.parse().expect("valid TOML");
        let entries = parsed["watch"].as_array().unwrap();
        let second = entries.get(1).unwrap().as_inline_table().unwrap();
        let table = second.get("table").unwrap().as_str().unwrap();
        assert_eq!(
            pg().parse(table).unwrap(),
            ("public".to_string(), "Plans".to_string())
        );
        assert_eq!(
            second.get("keys").unwrap().as_str().unwrap(),
            inferred.watch[1].keys.as_deref().unwrap()
        );
    }
}
