//! `Format` and `Decoder`: pick a wire format at run time (from configuration).

use serde::Deserialize;

use crate::{CanalJson, DebeziumJson, DecodeError, Decoded};

/// A wire format a broker topic carries. In configuration: `"canal-json"` or
/// `"debezium"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Format {
    /// canal-json (TiCDC `protocol=canal-json`, Alibaba Canal flat messages).
    CanalJson,
    /// Debezium JSON change events, with or without the schema wrapper.
    Debezium,
}

impl Format {
    /// The configuration name: `canal-json` or `debezium`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::CanalJson => "canal-json",
            Format::Debezium => "debezium",
        }
    }

    /// What change events in this format guarantee, and what they can lose, whatever
    /// carries them:
    ///
    /// - both: deletes, and a replay from the broker's committed position; messages are
    ///   per row, so no transaction boundaries.
    /// - canal-json: the former row is whole (TiCDC sends it; Canal's changed columns are
    ///   merged over the new row); TRUNCATE and DROP TABLE arrive. It can lose rows:
    ///   TiCDC key-only messages for large rows, Canal partial images
    ///   (`binlog_row_image=MINIMAL`), statement-form DML and partition drops arrive as
    ///   [`Decoded::Gap`](crate::Decoded::Gap)s (`row_gaps`), which sweep the views over
    ///   the table.
    /// - Debezium: the former row depends on the upstream's settings (PostgreSQL's
    ///   replica identity), so none is promised; truncates are skipped by default
    ///   (`skipped.operations=t`) and the MySQL connector sends none, so none are
    ///   promised either.
    pub fn capabilities(self) -> freshen::Capabilities {
        freshen::Capabilities {
            before_image: match self {
                Format::CanalJson => freshen::BeforeImage::Full,
                Format::Debezium => freshen::BeforeImage::None,
            },
            deletes: true,
            truncates: self == Format::CanalJson,
            recoverable: true,
            row_gaps: self == Format::CanalJson,
            ..freshen::Capabilities::NONE
        }
    }

    /// How the file spells the tables of these messages: the events carry the
    /// upstream's names as it wrote them (`database`/`table` in canal-json, `source`'s
    /// `schema` or `db` and `table` in Debezium); the file names them by SQL's rules as
    /// freshen always has — double quotes keep a part as written, an unquoted part
    /// folds to lower case, an unqualified table is in `public` — so a mixed-case
    /// upstream name is written quoted.
    pub fn naming(self) -> freshen::plug::Naming {
        freshen::plug::Naming {
            quote: '"',
            fold_unquoted: true,
            default_schema: Some("public".into()),
            schema_word: "schema",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decoder for a [`Format`] chosen at run time.
#[derive(Debug)]
pub enum Decoder {
    /// canal-json.
    CanalJson(CanalJson),
    /// Debezium JSON.
    Debezium(DebeziumJson),
}

impl Decoder {
    /// A decoder for `format`.
    pub fn new(format: Format) -> Decoder {
        match format {
            Format::CanalJson => Decoder::CanalJson(CanalJson::new()),
            Format::Debezium => Decoder::Debezium(DebeziumJson::new()),
        }
    }

    /// Decodes one broker message: its key (Debezium takes the primary-key names from
    /// it; canal-json ignores it) and its value (`None`: a tombstone).
    pub fn decode(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<Decoded, DecodeError> {
        match self {
            Decoder::CanalJson(d) => match value {
                Some(v) => d.decode(v),
                None => Ok(Decoded::Control(crate::Control::Tombstone)),
            },
            Decoder::Debezium(d) => d.decode_with_key(key, value),
        }
    }
}
