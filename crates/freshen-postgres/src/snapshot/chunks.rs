//! The chunk reader this source hands out ([`freshen::plug::ChunkReader`]): the driver's
//! chunk loop for a holder that knows nothing of PostgreSQL (the changefeed), which
//! gets each chunk with the content of its high watermark and the chunk's check as a
//! [`freshen::plug::ChunkView`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use freshen::plug::{
    Chunk, ChunkEvent, ChunkHolder, ChunkReader, ChunkView, ReadError, Redact, TableSnapshot,
};
use freshen::{BoxError, BoxFuture};

use crate::snapshot::driver::{
    ChunkConsumer, ChunkIds, DriverError, HeldChunk, TableEvent, WATERMARK_WAIT, high_mark,
    seal_stored, snapshot_table,
};
use crate::{ChunkCheck, PgAdmin, PgError, SnapshotProgress, TableName, TablePattern, TableReader};

/// Reads a PostgreSQL database's tables in chunks for a holder whose stream is that
/// database's WAL (the watermarks are written there).
#[derive(Debug)]
pub struct PgChunkReader {
    pool: Pool,
    /// Ids of this reader's chunks (which tell its watermarks from older runs' and
    /// other readers').
    ids: ChunkIds,
}

impl PgChunkReader {
    /// Reads from `pool`.
    pub fn new(pool: Pool) -> PgChunkReader {
        PgChunkReader {
            pool,
            ids: ChunkIds::new(""),
        }
    }
}

impl ChunkView for ChunkCheck {
    fn misses(&self, xid: u64, commit: u64) -> bool {
        ChunkCheck::misses(self, xid, commit)
    }
}

impl ChunkReader for PgChunkReader {
    fn read_table<'a>(
        &'a self,
        holder: &'a dyn ChunkHolder,
        progress: TableSnapshot,
        chunk_rows: usize,
        pause: Duration,
    ) -> BoxFuture<'a, Result<(), ReadError>> {
        Box::pin(async move {
            let held = Holding {
                holder,
                ids: &self.ids,
            };
            snapshot_table(&held, &self.pool, progress.into(), chunk_rows, pause)
                .await
                .map_err(|e| match e {
                    DriverError::Stopped => ReadError::Stopped,
                    DriverError::Source(e) => ReadError::Source(e.into()),
                    DriverError::Unseen => ReadError::Unseen(WATERMARK_WAIT),
                    DriverError::Consumer(e) => ReadError::Holder(e),
                })
        })
    }

    fn seal_stored<'a>(
        &'a self,
        redact: Option<&'a dyn Redact>,
        progress: &'a mut TableSnapshot,
    ) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let mut p = SnapshotProgress::from(progress.clone());
            let changed = seal_stored(&self.pool, redact, &mut p).await?;
            *progress = p.into();
            Ok(changed)
        })
    }

    fn readable<'a>(&'a self, table: &'a (String, String)) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            TableReader::new(self.pool.clone(), TableName::new(&table.0, &table.1)).await?;
            Ok(())
        })
    }

    fn selected<'a>(
        &'a self,
        patterns: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BoxError>> {
        Box::pin(async move {
            let patterns: Vec<TablePattern> = patterns
                .iter()
                .filter_map(|p| TablePattern::parse(p)?.ok())
                .collect();
            let admin = PgAdmin::from_pool(self.pool.clone());
            Ok(admin
                .selected_tables(&patterns)
                .await?
                .into_iter()
                .map(|t| (t.schema, t.name))
                .collect())
        })
    }
}

/// The driver's consumer over a holder: progress records and checks converted at the
/// boundary, chunks named by their high watermark's content.
struct Holding<'a> {
    holder: &'a dyn ChunkHolder,
    ids: &'a ChunkIds,
}

impl ChunkConsumer for Holding<'_> {
    type Error = BoxError;

    fn chunk_ids(&self) -> &ChunkIds {
        self.ids
    }

    fn redact(&self) -> Option<&dyn Redact> {
        self.holder.redact()
    }

    fn hold(
        &self,
        chunk: HeldChunk,
    ) -> impl Future<Output = Option<Result<SnapshotProgress, BoxError>>> + Send + 'static {
        let answer = self.holder.hold(Chunk::new(
            high_mark(&chunk.id).into_bytes(),
            chunk.rows,
            Arc::new(chunk.check),
            chunk.next.into(),
        ));
        async move { answer.await.map(|r| r.map(SnapshotProgress::from)) }
    }

    fn release(&self, id: &str) {
        self.holder.release(high_mark(id).as_bytes());
    }

    fn stopping(&self) -> impl Future<Output = ()> + Send {
        self.holder.stopping()
    }

    async fn committed(&self, p: &SnapshotProgress) -> Result<(), PgError> {
        self.holder.committed(&p.clone().into());
        Ok(())
    }

    fn on(&self, event: TableEvent<'_>) {
        match event {
            TableEvent::Started(p) => self.holder.on(ChunkEvent::Started(&p.clone().into())),
            TableEvent::Chunk(p) => self.holder.on(ChunkEvent::Chunk(&p.clone().into())),
            TableEvent::Done(p) => self.holder.on(ChunkEvent::Done(&p.clone().into())),
        }
    }
}
