//! `freshen init`: a starting file for one query — the view with the watch entries
//! inferred from the database, and as comments the statements to run first (the
//! target table, the publication), which the target kind writes
//! ([`freshen::plug::Target::starter`]).

use std::io::Write;
use std::path::Path;

use freshen::plug::{QuerySpec, ViewSpec};

/// What `freshen init` was asked.
#[derive(Debug, Clone)]
pub struct Request {
    /// The view's name.
    pub name: String,
    /// The target table, as the file writes it.
    pub into: String,
    /// The query.
    pub query: String,
    /// The environment variable holding the database URL.
    pub url_env: String,
}

/// The file for `request`, or every problem (a sentence each, never the URL).
pub async fn starting_file(request: &Request) -> Result<String, Vec<String>> {
    let var = &request.url_env;
    let url = std::env::var(var).map_err(|_| {
        vec![format!(
            "set {var} to the database URL (freshen init reads it there and writes `${{{var}}}` into the file)"
        )]
    })?;
    let plug = crate::targets::open_url(&url).map_err(|p| {
        p.into_iter()
            .map(|p| format!("{var}: {p}"))
            .collect::<Vec<_>>()
    })?;
    let into = plug.naming().parse(&request.into).map_err(|e| {
        vec![format!(
            "--into `{}` is not a table name: {e}",
            request.into
        )]
    })?;
    let target = plug
        .connect(Some(&url))
        .await
        .map_err(|e| vec![freshen::redact_text(&format!("cannot connect: {e}"))])?;
    let mut spec = ViewSpec {
        name: request.name.clone(),
        watch: Vec::new(),
        rebuild: Vec::new(),
        query: Some(QuerySpec {
            into,
            query: request.query.clone(),
        }),
        rebuild_batch: None,
        keys_per_transaction: 16,
        reconcile: None,
        static_tables: Vec::new(),
        connections: 1,
        statement_timeout: None,
        whole_timeout: None,
        key_names: Vec::new(),
    };
    let inferred = target.infer(&spec).await?;
    spec.key_names = inferred.key.clone();
    let starter = target.starter(&spec, &inferred, var).await?;
    let mut out = String::from("# Written by `freshen init`.\n#\n");
    for note in &starter.notes {
        for line in note.lines() {
            out.push_str(&format!("# {line}\n"));
        }
        out.push_str("#\n");
    }
    out.push('\n');
    out.push_str(&starter.source);
    out.push_str(&format!(
        "\n[[views]]\nname = {}\ninto = {}\nquery = {}\n# Inferred from the query: delete to infer them again at each start.\n{}\n",
        toml_string(&request.name),
        toml_string(&request.into),
        toml_string(&request.query),
        crate::infer::toml(&inferred, &plug.naming())
    ));
    Ok(out)
}

/// Writes `text` to a new file at `path`; an existing file is left alone (an error).
pub fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
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
