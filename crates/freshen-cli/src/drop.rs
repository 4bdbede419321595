//! `freshen drop`: remove the slot (and the publication freshen created), so that an
//! abandoned pipeline never retains WAL.

use crate::config::Config;

/// Removes what the source keeps upstream (a PostgreSQL slot, and the publication
/// when freshen created it); one line per thing and what became of it.
pub(crate) async fn drop_pipeline(cfg: &Config) -> anyhow::Result<Vec<String>> {
    cfg.source
        .drop_upstream()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}
