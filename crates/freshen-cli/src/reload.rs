//! Live reload: SIGHUP (or `POST /admin/reload`) re-reads the configuration file. A file
//! with problems is rejected whole and the running configuration goes on; a good one
//! replaces it: the pipeline stops gracefully (running rebuilds finish, earned
//! acknowledgements are confirmed) and starts again with the new views.
//!
//! | view across the reload | start-up sweep | publication                     |
//! |------------------------|----------------|---------------------------------|
//! | added                  | yes            | its tables added (if freshen's) |
//! | changed                | yes            | its tables added (if freshen's) |
//! | unchanged              | no             | –                               |
//! | removed                | –              | kept (`drop` removes it)        |
//!
//! Nothing confirmed early: what was not rebuilt before the stop stays unconfirmed in
//! the slot and is read again after it, so an unchanged view loses nothing and needs no
//! sweep. `[source]` cannot change by reload (the slot and the standby lease hang on
//! it), and `[http]` changes apply at the next restart (the listener keeps serving).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::config::{self, Config, View};
use crate::readout::{Change, Refused};
use crate::registry::Kinds;

/// What changes from `old` to `new`, or why `new` cannot replace `old` without a restart.
pub(crate) fn diff(old: &Config, new: &Config) -> Result<Change, Refused> {
    // The digest covers what Debug redacts (a new password in the URL).
    if old.source_digest != new.source_digest {
        return Err(Refused(
            "`[source]` changed: a reload cannot move the slot (or the standby lease); restart to apply it".into(),
        ));
    }
    if old.ack != new.ack {
        return Err(Refused(
            "the acknowledgement policy changed: restart to apply it".into(),
        ));
    }
    let target_same = old.target == new.target;
    let names =
        |c: &Config| -> BTreeSet<String> { c.views.iter().map(|v| v.name.clone()).collect() };
    let (was, is) = (names(old), names(new));
    let mut change = Change {
        added: is.difference(&was).cloned().collect(),
        removed: was.difference(&is).cloned().collect(),
        ..Change::default()
    };
    for v in &new.views {
        if let Some(o) = old.views.iter().find(|o| o.name == v.name) {
            if target_same && same_view(o, v) {
                change.unchanged.push(v.name.clone());
            } else {
                change.changed.push(v.name.clone());
            }
        }
    }
    // Compared as read (secrets included), like the source.
    let others_same = old.outputs_digest == new.outputs_digest;
    if change.is_empty() && !others_same {
        // Sinks or the changefeed: no view is touched, but the pipeline restarts.
        change.changed.push("(sinks or changefeed)".into());
    }
    Ok(change)
}

/// Whether two views are configured alike: where they sit in the file does not count.
fn same_view(a: &View, b: &View) -> bool {
    fn placeless(v: &View) -> View {
        let mut v = v.clone();
        v.line = None;
        v.rebuild_line = None;
        if let Some(r) = &mut v.reconcile {
            r.line = None;
        }
        for w in &mut v.watch {
            w.line = None;
        }
        v
    }
    placeless(a) == placeless(b)
}

/// Re-reads the file on request and hands a good configuration to the run loop.
#[derive(Debug)]
pub(crate) struct Reloader {
    path: PathBuf,
    kinds: &'static Kinds,
    current: Mutex<Config>,
    tx: mpsc::UnboundedSender<(Config, Change)>,
}

impl Reloader {
    /// A reloader of `path`, whose running configuration is `current`, read with
    /// `kinds`; the run loop receives accepted configurations from the returned
    /// receiver.
    pub(crate) fn new(
        path: PathBuf,
        current: Config,
        kinds: &'static Kinds,
    ) -> (Reloader, mpsc::UnboundedReceiver<(Config, Change)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Reloader {
                path,
                kinds,
                current: Mutex::new(current),
                tx,
            },
            rx,
        )
    }

    /// Reads and validates the file; on success the run loop restarts with it.
    pub(crate) fn reload(&self) -> Result<Change, Refused> {
        let new = config::load(&self.path, self.kinds).map_err(|e| Refused(e.to_string()))?;
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let change = diff(&current, &new)?;
        if current.http != new.http {
            tracing::warn!("reload: `[http]` changes apply at the next restart");
        }
        if change.is_empty() {
            return Ok(change);
        }
        *current = new.clone();
        self.tx
            .send((new, change.clone()))
            .map_err(|_| Refused("the pipeline is stopping".into()))?;
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(views: &str, url: &str) -> Config {
        let text = format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{views}");
        config::parse(&text, "f.toml", &|_| None, crate::kinds::builtin()).unwrap()
    }

    fn view(name: &str, table: &str) -> String {
        format!(
            "[[views]]\nname = \"{name}\"\nwatch = [{{ table = \"{table}\", key = [\"k\"] }}]\nrebuild = [\"SELECT $1\"]\n"
        )
    }

    #[test]
    fn views_are_told_apart_by_name_and_configuration() {
        let old = cfg(
            &(view("a", "t1") + &view("b", "t2") + &view("c", "t3")),
            "postgres://u@h/d",
        );
        // `a` moves down the file: still the same view.
        let new = cfg(
            &("\n\n".to_owned() + &view("b", "t9") + &view("a", "t1") + &view("d", "t4")),
            "postgres://u@h/d",
        );
        let c = diff(&old, &new).unwrap();
        assert_eq!(c.added, ["d"]);
        assert_eq!(c.removed, ["c"]);
        assert_eq!(c.changed, ["b"]);
        assert_eq!(c.unchanged, ["a"]);
        assert!(!c.is_empty());
        assert!(diff(&old, &old).unwrap().is_empty());
    }

    #[test]
    fn a_changed_source_is_refused_and_a_changed_target_changes_every_view() {
        let old = cfg(&view("a", "t1"), "postgres://u@h/d");
        let moved = cfg(&view("a", "t1"), "postgres://u@other/d");
        let e = diff(&old, &moved).unwrap_err();
        assert!(e.0.contains("[source]"), "{e}");
        let mut retargeted = old.clone();
        retargeted.target.pool_size = Some(2);
        assert_eq!(diff(&old, &retargeted).unwrap().changed, ["a"]);
    }

    #[test]
    fn a_new_password_is_a_changed_source_though_debug_hides_it() {
        let old = cfg(&view("a", "t1"), "postgres://u:one@h/d");
        let new = cfg(&view("a", "t1"), "postgres://u:two@h/d");
        assert_eq!(format!("{:?}", old.source), format!("{:?}", new.source));
        let e = diff(&old, &new).unwrap_err();
        assert!(e.0.contains("[source]"), "{e}");
        // Layout and comments are not a change.
        let src = |extra: &str| {
            let text = format!(
                "[source]{extra}\nkind = \"postgres\"\nurl = \"postgres://u:one@h/d\"\n{}",
                view("a", "t1")
            );
            config::parse(&text, "f.toml", &|_| None, crate::kinds::builtin()).unwrap()
        };
        assert!(
            diff(&src(""), &src("   # the database"))
                .unwrap()
                .is_empty()
        );
    }
}
