//! A part of a test run in a process of its own, so that the test can kill it for real
//! (SIGKILL: no destructor, no final feedback, no graceful close — what a crash is),
//! where aborting a task would let the rest of the process end its work cleanly.
//!
//! The child is the test binary itself, run again for one `#[ignore]`d test that does
//! the part (`--exact NAME --ignored`); what it needs comes in environment variables
//! ([`ChildProcess::spawn`] sets them, [`var`] reads them). It ends on its own when the
//! parent goes away (its standard input closes), so a failing parent leaves no process.
//!
//! ```no_run
//! // In the parent test:
//! let mut child = freshen_testenv::child::ChildProcess::spawn(
//!     "my_tests::the_part_to_kill",
//!     &[("MY_URL", "postgres://…")],
//! );
//! // … once it has done some of its work:
//! child.kill();
//!
//! // The part, in the same test binary:
//! #[test]
//! #[ignore = "the child process of my_tests::…, which runs and kills it"]
//! fn the_part_to_kill() {
//!     let url = freshen_testenv::child::var("MY_URL");
//!     freshen_testenv::child::run(async move {
//!         // … run until killed
//!     });
//! }
//! ```

use std::process::{Child, Command, Stdio};

/// Marks the environment of a child process, so that [`var`] can tell a child from a
/// person who ran the ignored test by hand.
const MARK: &str = "FRESHEN_TESTENV_CHILD";

/// A running child part of a test: killed (SIGKILL) when dropped, if still running.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
}

impl ChildProcess {
    /// Runs the ignored test `test` (its full path, `module::name`) of this test binary
    /// in a new process, with `env` set; its output goes to the test's.
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> ChildProcess {
        let exe = std::env::current_exe().expect("the test binary's path");
        let child = Command::new(exe)
            .args([
                "--exact",
                test,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MARK, test)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the child process {test}: {e}"));
        ChildProcess { child }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills it with SIGKILL and waits for it to be gone: a crash, nothing it does ends
    /// cleanly. Fails if it had already ended (it should have been working).
    pub fn kill(&mut self) {
        assert!(
            self.is_running(),
            "the child process ended before it was killed: {:?}",
            self.child.try_wait()
        );
        self.child.kill().expect("SIGKILL the child process");
        let status = self.child.wait().expect("wait for the child process");
        assert!(!status.success(), "killed, not ended: {status}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a child part: the environment variable `name` its parent set. Run by hand (not as
/// a child), the part fails saying which test runs it.
pub fn var(name: &str) -> String {
    let Ok(parent) = std::env::var(MARK) else {
        panic!(
            "this test is the child process of another test, which runs and kills it; run that one"
        );
    };
    std::env::var(name).unwrap_or_else(|_| panic!("{parent}: the parent set no {name}"))
}

/// In a child part: runs `part` on a runtime of two worker threads, until the parent
/// kills the process (or `part` ends). The process also ends once its parent is gone
/// ([`exit_with_parent`]).
pub fn run<F: std::future::Future<Output = ()>>(part: F) {
    exit_with_parent();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the child process")
        .block_on(part);
}

/// In a child part: ends the process once its parent is gone (its standard input
/// closes), so a parent that failed before killing it leaves nothing running.
pub fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
}
