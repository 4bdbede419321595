//! The target kinds this binary knows, by URL scheme: one registration line each.
//!
//! Everything else about a target — its URL's rules, which views it can rebuild, how
//! rebuilds prove visibility, `check` — lives in its crate, behind
//! [`freshen::plug::TargetPlug`]. To add a target: implement that trait in its crate
//! and add a line to [`KINDS`].

use std::sync::Arc;

use freshen::plug::{Target, TargetPlug, ViewSpec};

use crate::config::{Config, View};

/// Parses a URL into its kind's target.
type OpenFn = fn(&str) -> Result<Arc<dyn TargetPlug>, Vec<String>>;

/// A registered target kind.
#[derive(Clone, Copy)]
pub struct Kind {
    /// The URL schemes it answers to (the first is the one messages name).
    pub schemes: &'static [&'static str],
    open: OpenFn,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.schemes.first().copied().unwrap_or("?"))
    }
}

const fn kind<T: TargetPlug>(schemes: &'static [&'static str]) -> Kind {
    Kind {
        schemes,
        open: open::<T>,
    }
}

fn open<T: TargetPlug>(url: &str) -> Result<Arc<dyn TargetPlug>, Vec<String>> {
    T::open(url).map(|t| Arc::new(t) as Arc<dyn TargetPlug>)
}

/// Every target kind, in the order error messages list them.
pub const KINDS: &[Kind] = &[
    kind::<freshen_postgres::PgTarget>(&["postgres", "postgresql"]),
    #[cfg(feature = "mysql")]
    kind::<freshen_mysql::MySqlTarget>(&["mysql", "mariadb"]),
];

/// Schemes of kinds left out of this build, and the cargo feature of `freshen-cli`
/// that adds each.
const LEFT_OUT: &[(&[&str], &str)] = &[
    #[cfg(not(feature = "mysql"))]
    (&["mysql", "mariadb"], "mysql"),
];

/// Waits (up to `within`) for the cancel requests of rebuilds abandoned at shutdown to
/// go out, so the servers stop their statements before the runtime ends.
pub async fn settled(within: std::time::Duration) {
    freshen_postgres::cancels_settled(within).await;
}

/// The target `url` names, or every problem with it (never quoting its password).
pub fn open_url(url: &str) -> Result<Arc<dyn TargetPlug>, Vec<String>> {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    if let Some(k) = KINDS.iter().find(|k| k.schemes.contains(&scheme.as_str())) {
        return (k.open)(url);
    }
    if let Some((schemes, feature)) = LEFT_OUT.iter().find(|(s, _)| s.contains(&scheme.as_str())) {
        return Err(vec![format!(
            "a {}:// target is not built into this freshen: build it with `--features {feature}`",
            schemes[0]
        )]);
    }
    let names: Vec<String> = KINDS
        .iter()
        .map(|k| match k.schemes {
            [one] => format!("{one}://"),
            [first, rest @ ..] => format!("{first}:// (or {})", rest.join("://, ") + "://"),
            [] => String::new(),
        })
        .collect();
    Err(vec![format!(
        "must be a {} URL, not {}",
        names.join(" or "),
        freshen::redact_url(url)
    )])
}

/// Connects `cfg`'s target, deciding how rebuilds prove visibility.
pub async fn connect(cfg: &Config) -> anyhow::Result<Box<dyn Target>> {
    let plug = open_url(cfg.target.url.expose())
        .map_err(|p| anyhow::anyhow!("the target URL is not usable: {}", p.join("; ")))?;
    plug.connect(cfg.source.database_url())
        .await
        .map_err(anyhow::Error::from_boxed)
}

/// How many connections `view` opens: one per worker and one for its sweep, so its
/// rebuilds never wait for a connection another view holds.
fn connections(view: &View, cap: Option<usize>) -> usize {
    let want = view.timing.workers + usize::from(view.reconcile.is_some());
    cap.map_or(want, |c| want.min(c)).max(1)
}

/// `view` as a target builds it; `cap`: the most connections it may open.
pub fn spec(view: &View, cap: Option<usize>) -> ViewSpec {
    ViewSpec {
        name: view.name.clone(),
        watch: view.watch.iter().map(|w| w.watched(&view.name)).collect(),
        rebuild: view.rebuild.clone(),
        query: view.query.as_ref().map(|q| freshen::plug::QuerySpec {
            into: q.into.clone(),
            query: q.query.clone(),
        }),
        rebuild_batch: view.rebuild_batch,
        keys_per_transaction: view.keys_per_transaction,
        rebuild_set: view.rebuild_set.clone(),
        reconcile: view.reconcile_keys(),
        static_tables: view.static_tables.clone(),
        connections: connections(view, cap),
        statement_timeout: view.timing.statement_timeout,
        whole_timeout: view.timing.whole_timeout,
        key_names: view.key_names.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_opened_by_its_scheme() {
        let t = open_url("postgres://u@localhost/app").expect("a PostgreSQL URL");
        assert_eq!(t.name(), "PostgreSQL");
        let t = open_url("postgresql://u@localhost/app").expect("either spelling");
        assert_eq!(t.name(), "PostgreSQL");
    }

    #[test]
    fn an_unknown_scheme_names_every_kind_and_hides_the_password() {
        let p = open_url("redis://u:hunter2@localhost/0").unwrap_err();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "must be a postgres:// (or postgresql://) or mysql:// (or mariadb://) URL"
            ) || p[0].starts_with("must be a postgres:// (or postgresql://) URL"),
            "{p:?}"
        );
        assert!(!p[0].contains("hunter2"), "{p:?}");
    }

    #[test]
    fn a_kind_left_out_of_the_build_names_its_feature() {
        let r = open_url("mysql://u@localhost/app");
        if cfg!(feature = "mysql") {
            assert_eq!(r.expect("a MySQL URL").name(), "MySQL/MariaDB");
        } else {
            assert_eq!(
                r.unwrap_err(),
                [
                    "a mysql:// target is not built into this freshen: build it with `--features mysql`"
                ]
            );
        }
    }
}
