//! The core crate depends on tokio only (DESIGN.md): adapters depend on the core, never
//! the reverse. This test fails the suite the moment anything else becomes a normal
//! dependency of `freshen`.

use std::process::Command;

#[test]
fn the_core_depends_on_tokio_only() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "freshen", "-e", "normal", "--depth", "1"])
        .args(["--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).expect("utf-8");
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
