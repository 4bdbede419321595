//! Every TOML example of the README and of `docs/` is a configuration `check --offline`
//! accepts. An example may be a part of a file — one `[[views]]` entry, or a few of a
//! view's keys — so what it leaves out is filled in (a PostgreSQL source, a view's name,
//! a watch and a rebuild) before it is read; what it does say is judged as written: an
//! unknown key, a wrong type or a value out of range fails the test with the example's
//! line.

use toml_edit::{DocumentMut, Item, Table};

use super::{VIEW, parse_with};

/// The Markdown files whose examples are checked: the README, ARCHITECTURE.md, the
/// deployment guide and every guide in `docs/`.
fn documents() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("deploy/README.md"),
    ];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The ```` ```toml ```` blocks of `markdown`: each block's first line (1-based) and
/// text. Indented blocks (inside a list item) count too.
fn toml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, usize)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None if trimmed.starts_with("```toml") => open = Some((i + 2, String::new(), indent)),
            Some((start, text, _)) if trimmed.starts_with("```") => {
                out.push((*start, std::mem::take(text)));
                open = None;
            }
            Some((_, text, indent)) => {
                text.push_str(line.get(*indent..).unwrap_or(line.trim_start()));
                text.push('\n');
            }
            None => {}
        }
    }
    out
}

/// `example` made a whole file: bare view keys put in a `[[views]]` entry, a source and
/// a view added where it has none, and a view's name, watch and rebuild where it lacks
/// them. Written as text (the
/// example's own lines kept), so a problem's line still points into it.
fn complete(example: &str) -> Result<String, String> {
    let doc: DocumentMut = example.parse().map_err(|e| format!("not TOML: {e}"))?;
    let bare = doc
        .iter()
        .any(|(k, item)| VIEW.contains(&k) && !item.is_table() && !item.is_array_of_tables());
    let mut text = if bare {
        format!("[[views]]\n{example}")
    } else {
        example.to_string()
    };
    let views: Vec<Option<&Table>> = if bare {
        vec![Some(doc.as_table())]
    } else {
        doc.get("views")
            .and_then(Item::as_array_of_tables)
            .map(|v| v.iter().map(Some).collect())
            .unwrap_or_default()
    };
    // What each entry lacks, added under its header (the i-th `[[views]]` line).
    let mut out = String::new();
    let mut entry = 0;
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if line.split('#').next().unwrap_or("").trim() != "[[views]]" {
            continue;
        }
        let Some(Some(view)) = views.get(entry) else {
            continue;
        };
        let by_query = view.contains_key("query") || view.contains_key("into");
        if !view.contains_key("name") {
            out.push_str(&format!("name = \"example_{entry}\"\n"));
        }
        if !view.contains_key("watch") && !by_query {
            out.push_str("watch = [{ table = \"readings\", key = [\"device\"] }]\n");
        }
        if !view.contains_key("rebuild") && !by_query {
            out.push_str("rebuild = \"SELECT 1 WHERE $1::text IS NOT NULL\"\n");
        }
        entry += 1;
    }
    text = out;
    if views.is_empty() && !doc.contains_key("sinks") && !doc.contains_key("changefeed") {
        text.push_str(
            "\n[[views]]\nname = \"example\"\nwatch = [{ table = \"readings\", key = [\"device\"] }]\nrebuild = \"SELECT 1 WHERE $1::text IS NOT NULL\"\n",
        );
    }
    if !doc.contains_key("source") {
        text.push_str("\n[source]\nkind = \"postgres\"\nurl = \"postgres://app@db.example/app\"\n");
    }
    Ok(text)
}

#[test]
fn every_toml_example_in_the_docs_is_a_file_check_accepts() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let markdown = std::fs::read_to_string(&path).expect("a document");
        for (line, example) in toml_blocks(&markdown) {
            checked += 1;
            let whole = match complete(&example) {
                Ok(w) => w,
                Err(e) => {
                    failures.push(format!("{name}:{line}: {e}"));
                    continue;
                }
            };
            if let Err(e) = parse_with(&whole, "example", &|_| None, crate::kinds::builtin(), true)
            {
                failures.push(format!("{name}:{line}: {e}\n--- as read:\n{whole}"));
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} examples found: is the fence spelt ```toml?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_wrong_key_in_an_example_is_caught() {
    // What the test above relies on: completing an example never hides its mistakes.
    let whole = complete("rebuild_bacth = 8\n").unwrap();
    let e = parse_with(&whole, "example", &|_| None, crate::kinds::builtin(), true).unwrap_err();
    assert!(e.to_string().contains("rebuild_bacth"), "{e}");
    let whole = complete("[defaults]\nworkers = 0\n").unwrap();
    assert!(parse_with(&whole, "example", &|_| None, crate::kinds::builtin(), true).is_err());
    let blocks = toml_blocks("a\n```toml\nx = 1\n```\n  ```toml\n  y = 2\n  ```\n");
    assert_eq!(
        blocks,
        [(3, "x = 1\n".to_string()), (6, "y = 2\n".to_string())]
    );
}
