//! The command line's manners: a typo gets a suggestion, every subcommand has help
//! (`help` too), shells get completions, and `freshen.toml` in the working directory is
//! the configuration when `-c` is not given.

use crate::support;

use support::freshen;

const SUBCOMMANDS: &[&str] = &[
    "run",
    "check",
    "demo",
    "status",
    "health",
    "version",
    "config",
    "drop",
    "snapshot",
    "completions",
    "help",
];

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// `freshen config reference` prints `docs/configuration.md` (the unit tests hold the
/// text to the parser; this holds the command to the file).
#[test]
fn config_reference_prints_the_documented_reference() {
    let out = freshen().args(["config", "reference"]).output().unwrap();
    assert!(out.status.success(), "freshen config reference: {out:?}");
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ))
    .unwrap();
    assert!(
        text(&out.stdout) == doc,
        "docs/configuration.md differs from `freshen config reference`: regenerate it with `cargo run -p freshen-cli -- config reference > docs/configuration.md`"
    );
}

#[test]
fn a_mistyped_subcommand_gets_the_closest_one_suggested() {
    for (typo, meant) in [("runn", "run"), ("chek", "check"), ("stauts", "status")] {
        let out = freshen().arg(typo).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "freshen {typo}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("'{meant}'")), "freshen {typo}: {err}");
        // `help` suggests the same way.
        let out = freshen().args(["help", typo]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "freshen help {typo}: {out:?}");
        assert!(text(&out.stderr).contains(&format!("'{meant}'")));
    }
}

#[test]
fn every_subcommand_has_help_in_both_spellings() {
    for name in SUBCOMMANDS {
        let a = freshen().args(["help", name]).output().unwrap();
        let b = freshen().args([name, "--help"]).output().unwrap();
        assert!(a.status.success(), "freshen help {name}: {a:?}");
        assert!(b.status.success(), "freshen {name} --help: {b:?}");
        let usage = format!("Usage: freshen {name}");
        assert!(text(&a.stdout).contains(&usage), "{}", text(&a.stdout));
        assert_eq!(text(&a.stdout), text(&b.stdout), "{name}");
    }
    // The top-level help lists them all.
    let top = text(&freshen().arg("help").output().unwrap().stdout);
    for name in SUBCOMMANDS {
        assert!(top.contains(&format!("  {name} ")), "{name} in:\n{top}");
    }
}

#[test]
fn completions_cover_every_subcommand_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = freshen().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = text(&out.stdout);
        for name in SUBCOMMANDS {
            assert!(script.contains(name), "{shell} completions lack {name}");
        }
        assert!(script.contains("config"), "{shell}: no --config");
    }
    let out = freshen().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn freshen_toml_in_the_working_directory_is_the_default_configuration() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing there: the error names the file it looked for and how to name another.
    let out = freshen()
        .args(["check", "--offline"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(said.contains("freshen.toml: no such file"), "{said}");
    assert!(said.contains("-c FILE"), "{said}");

    std::fs::write(
        dir.path().join("freshen.toml"),
        r#"
[source]
kind = "postgres"
url = "postgres://app@127.0.0.1:1/app"
[[views]]
name = "totals"
watch = [ { table = "public.readings", key = ["device"] } ]
rebuild = ["SELECT 1 WHERE $1::text IS NOT NULL"]
"#,
    )
    .unwrap();
    let out = freshen()
        .args(["check", "--offline"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // `-c` still wins.
    let out = freshen()
        .args(["check", "--offline", "-c", "elsewhere.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stdout).contains("elsewhere.toml"), "{out:?}");
}

#[test]
fn status_resolves_the_instance_from_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    // Nothing listens there: the error shows which address was resolved.
    std::fs::write(
        dir.path().join("freshen.toml"),
        format!(
            "[source]\nkind = \"postgres\"\nurl = \"postgres://a@127.0.0.1:1/a\"\n[http]\nlisten = \"0.0.0.0:{port}\"\n"
        ),
    )
    .unwrap();
    let want = format!("127.0.0.1:{port}");
    for args in [
        &["status"][..],
        &["status", "-c", "freshen.toml"],
        &["health"],
    ] {
        let out = freshen()
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains(&want),
            "freshen {args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = freshen()
        .args(["status", "https://example.com"])
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("only http://"), "{out:?}");
}
