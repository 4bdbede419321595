//! `freshen --version` and `freshen version` say the version and which sources this build
//! reads: the features of the build under test, decided here independently of the binary.

mod support;

use support::freshen;

/// What the binary must print, from this test's own view of the features it was built with.
fn expected() -> String {
    let mut sources = vec!["postgres", "postgres-incremental"];
    if cfg!(feature = "mysql") {
        sources.extend(["mysql", "mysql-incremental"]);
    }
    if cfg!(feature = "kafka") {
        sources.push("kafka");
    }
    if cfg!(feature = "pulsar") {
        sources.push("pulsar");
    }
    format!(
        "freshen {} (sources: {}; changefeed)\n",
        env!("CARGO_PKG_VERSION"),
        sources.join(", ")
    )
}

#[test]
fn version_names_the_version_and_the_sources_compiled_in() {
    let want = expected();
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let out = freshen().args(args).output().expect("run freshen");
        assert!(out.status.success(), "freshen {args:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            want,
            "freshen {args:?}"
        );
    }
    // A kind left out of this build must not be claimed.
    let said = String::from_utf8(freshen().arg("version").output().unwrap().stdout).unwrap();
    for (kind, built) in [
        ("mysql", cfg!(feature = "mysql")),
        ("kafka", cfg!(feature = "kafka")),
        ("pulsar", cfg!(feature = "pulsar")),
    ] {
        assert_eq!(said.contains(kind), built, "{kind} in `{said}`");
    }
}
