//! Pulsar's wire framing, pure: simple and payload frames, the optional checksum, and
//! batched entries.
//!
//! ```text
//! simple:  [total u32][cmd_size u32][command]
//! payload: [total u32][cmd_size u32][command] ([0x0e01 u16][crc32c u32])? [meta_size u32][metadata][payload]
//! ```
//!
//! The magic number and checksum are optional on the wire: a broker forwards what the
//! producer wrote, and some (pulsar-lite; Apache Pulsar for producers that sent none)
//! send none. A decoder must look for the magic number before reading a checksum —
//! the `pulsar` crate 6.9 does not, which is why this crate frames messages itself.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;

use crate::proto::{BaseCommand, MessageMetadata, SingleMessageMetadata};

/// Marks a checksummed payload section.
pub(crate) const MAGIC: u16 = 0x0e01;
/// The largest frame accepted (the broker's own default limit is 5 MiB of message).
pub(crate) const MAX_FRAME: usize = 64 << 20;

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frame {
    pub(crate) command: BaseCommand,
    pub(crate) payload: Option<Payload>,
}

/// The message section of a payload frame.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Payload {
    pub(crate) metadata: MessageMetadata,
    pub(crate) data: Bytes,
}

/// One message of an entry (an entry holds one, or many when the producer batched).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Single {
    /// Position inside a batched entry.
    pub(crate) batch_index: Option<i32>,
    pub(crate) key: Option<String>,
    /// `None` for a null value (a tombstone).
    pub(crate) data: Option<Bytes>,
}

/// A frame that breaks the protocol: the connection cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameError(pub(crate) String);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad Pulsar frame: {}", self.0)
    }
}

fn bad(what: impl Into<String>) -> FrameError {
    FrameError(what.into())
}

/// Takes one whole frame off `buf`; `Ok(None)` when more bytes are needed.
pub(crate) fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let total = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if total > MAX_FRAME {
        return Err(bad(format!("frame of {total} bytes exceeds {MAX_FRAME}")));
    }
    if buf.len() < 4 + total {
        buf.reserve(4 + total - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let mut frame = buf.split_to(total).freeze();
    decode_body(&mut frame).map(Some)
}

fn decode_body(frame: &mut Bytes) -> Result<Frame, FrameError> {
    let cmd_size = take_u32(frame, "command size")? as usize;
    if cmd_size > frame.len() {
        return Err(bad("command longer than its frame"));
    }
    let command =
        BaseCommand::decode(frame.split_to(cmd_size)).map_err(|e| bad(format!("command: {e}")))?;
    if frame.is_empty() {
        return Ok(Frame {
            command,
            payload: None,
        });
    }
    if frame.len() >= 6 && frame[..2] == MAGIC.to_be_bytes() {
        frame.advance(2);
        let checksum = take_u32(frame, "checksum")?;
        if CRC32C.checksum(frame) != checksum {
            return Err(bad("checksum mismatch"));
        }
    }
    let meta_size = take_u32(frame, "metadata size")? as usize;
    if meta_size > frame.len() {
        return Err(bad("metadata longer than its frame"));
    }
    let metadata = MessageMetadata::decode(frame.split_to(meta_size))
        .map_err(|e| bad(format!("message metadata: {e}")))?;
    Ok(Frame {
        command,
        payload: Some(Payload {
            metadata,
            data: std::mem::take(frame),
        }),
    })
}

fn take_u32(b: &mut Bytes, what: &str) -> Result<u32, FrameError> {
    if b.len() < 4 {
        return Err(bad(format!("truncated {what}")));
    }
    Ok(b.get_u32())
}

/// A simple frame.
pub(crate) fn encode(cmd: &BaseCommand) -> Bytes {
    let cmd_len = cmd.encoded_len();
    let mut out = BytesMut::with_capacity(8 + cmd_len);
    out.put_u32((4 + cmd_len) as u32);
    out.put_u32(cmd_len as u32);
    cmd.encode(&mut out).expect("capacity reserved");
    out.freeze()
}

/// A payload frame, checksummed.
pub(crate) fn encode_payload(
    cmd: &BaseCommand,
    metadata: &MessageMetadata,
    payload: &[u8],
) -> Bytes {
    let cmd_len = cmd.encoded_len();
    let meta_len = metadata.encoded_len();
    let after_checksum = 4 + meta_len + payload.len();
    let total = 4 + cmd_len + 2 + 4 + after_checksum;
    let mut out = BytesMut::with_capacity(4 + total);
    out.put_u32(total as u32);
    out.put_u32(cmd_len as u32);
    cmd.encode(&mut out).expect("capacity reserved");
    out.put_u16(MAGIC);
    let checksum_at = out.len();
    out.put_u32(0);
    let body_at = out.len();
    out.put_u32(meta_len as u32);
    metadata.encode(&mut out).expect("capacity reserved");
    out.put_slice(payload);
    let checksum = CRC32C.checksum(&out[body_at..]);
    out[checksum_at..checksum_at + 4].copy_from_slice(&checksum.to_be_bytes());
    out.freeze()
}

/// The messages of an entry, in order.
pub(crate) fn messages(payload: &Payload) -> Result<Vec<Single>, FrameError> {
    let m = &payload.metadata;
    let Some(n) = m.num_messages_in_batch.filter(|_| is_batch(m)) else {
        return Ok(vec![Single {
            batch_index: None,
            key: m.partition_key.clone(),
            data: (!m.null_value.unwrap_or(false)).then(|| payload.data.clone()),
        }]);
    };
    let n = usize::try_from(n).map_err(|_| bad("negative batch size"))?;
    let mut data = payload.data.clone();
    let mut out = Vec::with_capacity(n.min(1024));
    for i in 0..n {
        let size = take_u32(&mut data, "batched message metadata size")? as usize;
        if size > data.len() {
            return Err(bad("batched message metadata longer than the entry"));
        }
        let single = SingleMessageMetadata::decode(data.split_to(size))
            .map_err(|e| bad(format!("batched message metadata: {e}")))?;
        let len = usize::try_from(single.payload_size)
            .ok()
            .filter(|len| *len <= data.len())
            .ok_or_else(|| bad("batched message longer than the entry"))?;
        let body = data.split_to(len);
        if single.compacted_out.unwrap_or(false) {
            continue;
        }
        out.push(Single {
            batch_index: i32::try_from(i).ok(),
            key: single.partition_key,
            data: (!single.null_value.unwrap_or(false)).then_some(body),
        });
    }
    Ok(out)
}

/// Whether the entry is a batch: the official clients decide by the presence of
/// `num_messages_in_batch`, and so does this one.
fn is_batch(m: &MessageMetadata) -> bool {
    m.num_messages_in_batch.is_some()
}

/// The payload of a batched entry holding `messages`.
pub(crate) fn encode_batch(messages: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        let single = SingleMessageMetadata {
            payload_size: m.len() as i32,
            ..SingleMessageMetadata::default()
        };
        out.put_u32(single.encoded_len() as u32);
        single.encode(&mut out).expect("a Vec grows");
        out.put_slice(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{CommandMessage, MessageIdData, kind};

    fn message_cmd() -> BaseCommand {
        BaseCommand {
            message: Some(CommandMessage {
                consumer_id: 7,
                message_id: MessageIdData {
                    ledger_id: 3,
                    entry_id: 9,
                    partition: Some(-1),
                    batch_index: None,
                },
                redelivery_count: None,
            }),
            ..BaseCommand::of(kind::MESSAGE)
        }
    }

    fn meta() -> MessageMetadata {
        MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 1,
            publish_time: 2,
            ..MessageMetadata::default()
        }
    }

    #[test]
    fn simple_frames_round_trip_and_wait_for_bytes() {
        let cmd = BaseCommand::of(kind::PING);
        let bytes = encode(&cmd);
        let mut buf = BytesMut::from(&bytes[..bytes.len() - 1]);
        assert_eq!(decode(&mut buf), Ok(None));
        buf.extend_from_slice(&bytes[bytes.len() - 1..]);
        buf.extend_from_slice(&bytes);
        assert_eq!(decode(&mut buf).unwrap().unwrap().command, cmd);
        assert_eq!(decode(&mut buf).unwrap().unwrap().command, cmd);
        assert!(buf.is_empty());
    }

    #[test]
    fn payload_with_checksum() {
        let bytes = encode_payload(&message_cmd(), &meta(), b"hello");
        let f = decode(&mut BytesMut::from(&bytes[..])).unwrap().unwrap();
        let p = f.payload.unwrap();
        assert_eq!(p.metadata, meta());
        assert_eq!(&p.data[..], b"hello");
        let mut corrupt = BytesMut::from(&bytes[..]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        assert_eq!(decode(&mut corrupt), Err(bad("checksum mismatch")));
    }

    #[test]
    fn payload_without_checksum_as_pulsar_lite_sends_it() {
        // Captured from pulsar-lite 0.2.0: MESSAGE, then metadata size, metadata, "A-0".
        let wire: &[u8] = b"\x00\x00\x00\x3c\x00\x00\x00\x19\x08\x09\x4a\x15\x08\x00\x12\x0f\x08\x03\x10\x00\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x18\x00\x00\x00\x00\x18\x0a\x0a\x70\x72\x6f\x64\x75\x63\x65\x72\x2d\x30\x10\x00\x18\xc4\xb4\xed\xd4\xa2\x34\x82\x01\x00\x41\x2d\x30";
        let f = decode(&mut BytesMut::from(wire)).unwrap().unwrap();
        let id = f.command.message.unwrap().message_id;
        assert_eq!((id.ledger_id, id.entry_id, id.partition), (3, 0, Some(-1)));
        let p = f.payload.unwrap();
        assert_eq!(p.metadata.producer_name, "producer-0");
        assert_eq!(&p.data[..], b"A-0");
    }

    #[test]
    fn batches_split_into_messages() {
        let mut m = meta();
        m.num_messages_in_batch = Some(3);
        let p = Payload {
            metadata: m,
            data: Bytes::from(encode_batch(&[b"a", b"", b"ccc"])),
        };
        let msgs = messages(&p).unwrap();
        let data: Vec<_> = msgs.iter().map(|s| s.data.clone().unwrap()).collect();
        assert_eq!(data, [&b"a"[..], b"", b"ccc"]);
        assert_eq!(msgs[2].batch_index, Some(2));
        let mut short = p.clone();
        short.metadata.num_messages_in_batch = Some(4);
        assert!(messages(&short).is_err(), "claims more than it holds");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(f)) = decode(&mut buf) {
                if let Some(p) = &f.payload {
                    let _ = messages(p);
                }
            }
        }

        #[test]
        fn mutated_batches_never_panic(at in 0usize..200, byte in proptest::prelude::any::<u8>()) {
            let mut m = meta();
            m.num_messages_in_batch = Some(2);
            let payload = encode_batch(&[b"first message", b"second"]);
            let mut wire = BytesMut::from(&encode_payload(&message_cmd(), &m, &payload)[..]);
            let at = at % wire.len();
            wire[at] = byte;
            if let Ok(Some(f)) = decode(&mut wire) && let Some(p) = &f.payload {
                let _ = messages(p);
            }
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for wire in [
            &b"\xff\xff\xff\xff"[..],
            b"\x00\x00\x00\x04\x00\x00\x00\x09",
            b"\x00\x00\x00\x06\x00\x00\x00\x02\xff\xff",
            b"\x00\x00\x00\x0a\x00\x00\x00\x02\x08\x09\x0e\x01\x00\x00",
        ] {
            assert!(decode(&mut BytesMut::from(wire)).is_err(), "{wire:?}");
        }
    }
}
