//! `freshen drop`: remove the slot (and the publication freshen created), so that an
//! abandoned pipeline never retains WAL.

use anyhow::Context;
use freshen_postgres::{ConnectionConfig, PgAdmin, quote_ident};

use crate::config::{Config, Source};

/// The comment freshen puts on a publication it creates; `drop` removes only those.
pub const CREATED_BY: &str = "created by freshen";

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
    let client = admin
        .pool()
        .get()
        .await
        .context("cannot connect to the source")?;
    let row = client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&pg.publication],
        )
        .await
        .context("cannot read the publication")?;
    let (publication, kept_publication) = match row {
        None => (false, false),
        Some(r) if r.get::<_, Option<String>>(0).as_deref() == Some(CREATED_BY) => {
            client
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {}",
                    quote_ident(&pg.publication)
                ))
                .await
                .context("cannot drop the publication")?;
            (true, false)
        }
        Some(_) => (false, true),
    };
    Ok(Dropped {
        slot,
        publication,
        kept_publication,
    })
}
