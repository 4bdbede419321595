//! `freshen drop`: remove the slot (and the publication freshen created), so that an
//! abandoned pipeline never retains WAL.

use anyhow::Context;
use freshen_postgres::{ConnectionConfig, PgAdmin, PublicationDrop};

use crate::config::{Config, Source};

/// The comment freshen puts on a publication it creates; `drop` removes only those.
pub use freshen_postgres::CREATED_BY;

/// What `drop` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The slot existed and was dropped.
    pub slot: bool,
    /// The publication was freshen's and was dropped.
    pub publication: bool,
    /// A publication that exists but was not created by freshen (left alone).
    pub kept_publication: bool,
}

/// Drops the slot and, when freshen created it, the publication.
pub async fn drop_pipeline(cfg: &Config) -> anyhow::Result<Dropped> {
    let Source::Postgres(pg) = &cfg.source else {
        anyhow::bail!(
            "drop removes a PostgreSQL slot and publication; a {} source has neither",
            cfg.source.kind()
        );
    };
    let conn =
        ConnectionConfig::from_url(pg.url.expose()).context("the source URL is not usable")?;
    let admin = PgAdmin::connect(&conn)
        .await
        .context("cannot connect to the source")?;
    let slot = admin
        .drop_slot(&pg.slot)
        .await
        .with_context(|| format!("cannot drop slot {}", pg.slot))?;
    let (publication, kept_publication) = match admin
        .drop_publication(&pg.publication)
        .await
        .context("cannot drop the publication")?
    {
        PublicationDrop::Dropped => (true, false),
        PublicationDrop::Kept => (false, true),
        _ => (false, false),
    };
    Ok(Dropped {
        slot,
        publication,
        kept_publication,
    })
}
