//! The workspace's dependencies as the documents draw them. The core crate depends on
//! tokio only (docs/design.md): adapters depend on the core, never the reverse, and the
//! suite fails the moment anything else becomes a normal dependency of `freshen`. The
//! crate drawing of ARCHITECTURE.md is every crate's workspace dependencies, checked
//! against `cargo metadata` in both directions.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// `cargo ARGS` in this crate's directory: its standard output.
fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_core_depends_on_tokio_only() {
    let tree = cargo(&[
        "tree",
        "-p",
        "freshen",
        "-e",
        "normal",
        "--depth",
        "1",
        "--prefix",
        "none",
        "--offline",
    ]);
    let deps: Vec<&str> = tree
        .lines()
        .skip(1) // the crate itself
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(!deps.is_empty(), "cargo tree listed nothing:\n{tree}");
    let others: Vec<&&str> = deps.iter().filter(|d| **d != "tokio").collect();
    assert!(
        others.is_empty(),
        "freshen must depend on tokio only, found {others:?}"
    );
}

/// A crate's workspace dependencies: name → whether it is optional (behind a feature).
type Deps = BTreeMap<String, bool>;

/// The drawing: the first fenced block after `## The crates`, one line per crate,
/// `NAME → DEP, [OPTIONAL DEP], …` or `NAME → (words)` for none; in drawing order.
fn drawn(doc: &str) -> Vec<(String, Deps)> {
    let from = doc
        .find("\n## The crates")
        .expect("ARCHITECTURE.md has `## The crates`");
    let block = doc[from..]
        .split("```")
        .nth(1)
        .expect("a fenced drawing under `## The crates`");
    block
        .lines()
        .skip(1) // the fence's info string
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (name, deps) = line
                .split_once('→')
                .unwrap_or_else(|| panic!("not `NAME → DEPS`: {line:?}"));
            let deps = deps.trim();
            let deps: Deps = if deps.starts_with('(') {
                Deps::new()
            } else {
                deps.split(',')
                    .map(|d| {
                        let d = d.trim();
                        match d.strip_prefix('[').and_then(|d| d.strip_suffix(']')) {
                            Some(opt) => (opt.to_owned(), true),
                            None => (d.to_owned(), false),
                        }
                    })
                    .collect()
            };
            (name.trim().to_owned(), deps)
        })
        .collect()
}

/// Every workspace crate's normal dependencies on other workspace crates.
fn metadata() -> BTreeMap<String, Deps> {
    let out = cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]);
    let meta: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("a name"))
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null()) // normal: not dev, not build
                .filter_map(|d| {
                    let name = d["name"].as_str()?;
                    names
                        .contains(name)
                        .then(|| (name.to_owned(), d["optional"] == true))
                })
                .collect();
            (p["name"].as_str().expect("a name").to_owned(), deps)
        })
        .collect()
}

#[test]
fn the_architecture_drawing_is_the_workspace_s_dependencies() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");
    let doc = std::fs::read_to_string(path).expect("ARCHITECTURE.md");
    let drawing = drawn(&doc);
    let actual = metadata();
    let drawn_names: Vec<&str> = drawing.iter().map(|(n, _)| n.as_str()).collect();
    let crates: BTreeSet<&str> = drawn_names.iter().copied().collect();
    assert_eq!(
        crates.len(),
        drawn_names.len(),
        "a crate drawn twice: {drawn_names:?}"
    );
    assert_eq!(
        crates,
        actual.keys().map(String::as_str).collect(),
        "the drawing's crates are not the workspace's"
    );
    for (at, (name, deps)) in drawing.iter().enumerate() {
        assert_eq!(
            deps, &actual[name],
            "ARCHITECTURE.md draws {name}'s workspace dependencies (`[name]`: optional) \
             unlike its Cargo.toml"
        );
        for dep in deps.keys() {
            let below = drawn_names[at + 1..].contains(&dep.as_str());
            assert!(
                below,
                "{name} depends on {dep}, which is not drawn below it"
            );
        }
    }
}
