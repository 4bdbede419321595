//! `freshen --version` and `freshen version` say the version and which sources this build
//! reads: the kinds registered, and of the features of the build under test, decided
//! here independently of the binary, those and only those it was built with.

mod support;

use support::freshen;

/// What the binary must print: the sources its registration lines build in (the test
/// below holds them to this test's own view of the features).
fn expected() -> String {
    let sources = freshen_cli::kinds().sources.built();
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
        ("postgres", true),
        ("mysql", cfg!(feature = "mysql")),
        ("kafka", cfg!(feature = "kafka")),
        ("pulsar", cfg!(feature = "pulsar")),
    ] {
        assert_eq!(said.contains(kind), built, "{kind} in `{said}`");
    }
}
