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

    /// What change events in this format guarantee, whatever carries them: deletes and
    /// truncates (both formats have them), and a replay from the broker's committed
    /// position. canal-json's former row is whole (TiCDC sends it); Debezium's depends on
    /// the upstream's settings, so none is promised. Messages are per row: no
    /// transaction boundaries.
    pub fn capabilities(self) -> freshen::Capabilities {
        freshen::Capabilities {
            before_image: match self {
                Format::CanalJson => freshen::BeforeImage::Full,
                Format::Debezium => freshen::BeforeImage::None,
            },
            deletes: true,
            truncates: true,
            recoverable: true,
            ..freshen::Capabilities::NONE
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
