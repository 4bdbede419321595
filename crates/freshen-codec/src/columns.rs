//! `TableCache`: shares table names and column lists across the messages of a stream.
//!
//! Every row event names its table and its columns; a stream repeats the same few tables
//! and column lists endlessly. Reusing one `Arc` per distinct list keeps a decoded batch
//! small (a row holds a reference count, not its column names) and skips allocations.

use std::collections::HashMap;
use std::sync::Arc;

use freshen::Columns;

use crate::DecodeError;

/// Distinct column lists remembered per table (a table shows a few: the full row, the
/// key-only old image, a partial Canal `old`).
const SHAPES_PER_TABLE: usize = 4;
/// Tables remembered before the cache starts over (bounds memory on hostile input).
const MAX_TABLES: usize = 4096;

#[derive(Debug)]
struct Entry {
    schema: Arc<str>,
    table: Arc<str>,
    pk: Columns,
    shapes: Vec<Columns>,
}

/// Interned names per `(schema, table)`.
#[derive(Debug, Default)]
pub(crate) struct TableCache {
    tables: HashMap<Box<str>, HashMap<Box<str>, Entry>>,
    count: usize,
}

/// The interned names of one table, borrowed for the duration of one message.
pub(crate) struct TableRef<'c> {
    entry: &'c mut Entry,
}

impl TableCache {
    /// The entry for `schema.table`, created on first sight.
    pub(crate) fn table(&mut self, schema: &str, table: &str) -> TableRef<'_> {
        let known = self
            .tables
            .get(schema)
            .is_some_and(|tables| tables.contains_key(table));
        if !known {
            if self.count >= MAX_TABLES {
                self.tables.clear();
                self.count = 0;
            }
            self.count += 1;
            self.tables.entry(schema.into()).or_default().insert(
                table.into(),
                Entry {
                    schema: Arc::from(schema),
                    table: Arc::from(table),
                    pk: Arc::from(Vec::new()),
                    shapes: Vec::new(),
                },
            );
        }
        let entry = self
            .tables
            .get_mut(schema)
            .and_then(|tables| tables.get_mut(table))
            .expect("inserted above");
        TableRef { entry }
    }
}

impl TableRef<'_> {
    pub(crate) fn schema(&self) -> Arc<str> {
        self.entry.schema.clone()
    }

    pub(crate) fn name(&self) -> Arc<str> {
        self.entry.table.clone()
    }

    /// The primary-key column list equal to `names`.
    pub(crate) fn pk<'n>(
        &mut self,
        names: impl ExactSizeIterator<Item = &'n str> + Clone,
    ) -> Columns {
        if !same(&self.entry.pk, names.clone()) {
            self.entry.pk = names.map(Box::from).collect();
        }
        self.entry.pk.clone()
    }

    /// The column list equal to `names`; an error when a name repeats (a row cannot
    /// hold one column twice, and which value would be meant is unknowable).
    pub(crate) fn columns<'n>(
        &mut self,
        names: impl ExactSizeIterator<Item = &'n str> + Clone,
    ) -> Result<Columns, DecodeError> {
        if let Some(found) = self.entry.shapes.iter().find(|c| same(c, names.clone())) {
            return Ok(found.clone());
        }
        let columns: Columns = names.map(Box::from).collect();
        if has_duplicate(&columns) {
            return Err(DecodeError::malformed("a row names the same column twice"));
        }
        if self.entry.shapes.len() >= SHAPES_PER_TABLE {
            self.entry.shapes.remove(0);
        }
        self.entry.shapes.push(columns.clone());
        Ok(columns)
    }
}

fn same<'n>(known: &Columns, mut names: impl ExactSizeIterator<Item = &'n str>) -> bool {
    known.len() == names.len() && known.iter().all(|k| names.next() == Some(&**k))
}

pub(crate) fn has_duplicate<C: AsRef<str> + PartialEq + Eq + std::hash::Hash>(
    columns: &[C],
) -> bool {
    if columns.len() <= 16 {
        return columns
            .iter()
            .enumerate()
            .any(|(i, c)| columns[..i].contains(c));
    }
    let mut seen = std::collections::HashSet::with_capacity(columns.len());
    !columns.iter().all(|c| seen.insert(c.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_lists_share_one_allocation() {
        let mut cache = TableCache::default();
        let a = cache
            .table("s", "t")
            .columns(["a", "b"].into_iter())
            .unwrap();
        let b = cache
            .table("s", "t")
            .columns(["a", "b"].into_iter())
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = cache.table("s", "t").columns(["a"].into_iter()).unwrap();
        assert_eq!(&*c, &[Box::from("a")]);
    }

    #[test]
    fn a_repeated_column_is_an_error() {
        let mut cache = TableCache::default();
        assert!(
            cache
                .table("s", "t")
                .columns(["a", "a"].into_iter())
                .is_err()
        );
        let many: Vec<String> = (0..20).map(|i| format!("c{}", i % 19)).collect();
        assert!(
            cache
                .table("s", "t")
                .columns(many.iter().map(|s| s.as_str()))
                .is_err()
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut cache = TableCache::default();
        for i in 0..(MAX_TABLES + 10) {
            cache.table("s", &i.to_string());
        }
        assert!(cache.count <= MAX_TABLES);
    }
}
