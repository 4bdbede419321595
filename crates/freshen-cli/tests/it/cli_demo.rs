//! `freshen demo` is the first thing a newcomer runs: it must work and verify itself.

use crate::support;

#[test]
fn the_demo_runs_a_workload_and_verifies_both_views() {
    let out = support::freshen()
        .args(["demo", "--duration", "3s", "--writers", "2"])
        .output()
        .expect("run freshen demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("settled"), "{stdout}");
    assert_eq!(
        stdout
            .matches("equals a fresh GROUP BY of the source tables")
            .count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("t=  1s"), "a live progress line: {stdout}");
}
