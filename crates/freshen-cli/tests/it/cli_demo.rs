//! `freshen demo` is the first thing a newcomer runs: it must work and verify itself.

use crate::support;

#[test]
fn the_demo_runs_a_workload_and_verifies_its_three_views() {
    let out = support::freshen()
        .args(["demo", "--duration", "3s", "--writers", "2"])
        .args(["--listen", "127.0.0.1:0"])
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
            .matches("equals a fresh computation of its SELECT")
            .count(),
        3,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("built whole: yes").count(),
        3,
        "each table built whole at the first start: {stdout}"
    );
    assert!(stdout.contains("t=  1s"), "a live progress line: {stdout}");
    assert!(
        stdout.contains("status page: http://127.0.0.1:"),
        "the status page's address: {stdout}"
    );
}
