//! One record of a process's log: the notices it published in a few milliseconds, in a
//! compact binary form, and how a batch of notices is cut into records that each fit in one
//! store item.
//!
//! ```text
//! record := version:u8 (1) prev_seq:u64
//!           changed:u32 hash:u32 * changed
//!           parts:u32 part * parts
//! part   := flags:u8 [topic_len:u16 topic] body_len:u32 body
//! ```
//!
//! Integers are little-endian. `prev_seq` is the sequence number of the record its writer
//! attempted before this one (0 for the first), so a reader can tell a record is missing
//! (dropped after failed puts, or deleted). A change travels as its topic's 32-bit hash only.
//! A message is a part holding its topic and body; one too large for a record is cut into
//! parts over consecutive records: its first part has the topic and the flag [`MORE`] and
//! ends its record, the following ones have the flag [`CONTINUED`] (and no topic) and begin
//! theirs, the last lacks [`MORE`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The format's version, the record's first byte.
const VERSION: u8 = 1;

/// The part continues a message begun by the last part of the previous record; it has no
/// topic.
pub(super) const CONTINUED: u8 = 0b01;
/// The message goes on in the first part of the next record; the part ends its record.
pub(super) const MORE: u8 = 0b10;

/// Bytes of a record with nothing in it: version, previous sequence number, two counts.
pub(super) const EMPTY_RECORD_BYTES: usize = 1 + 8 + 4 + 4;
/// Bytes of one change.
const CHANGED_BYTES: usize = 4;

/// The longest topic a record carries (its length is a `u16`).
pub(super) const MAX_TOPIC_BYTES: usize = u16::MAX as usize;

/// What one record holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Record {
    /// The sequence number of the record attempted before this one, 0 for the first.
    pub prev_seq: u64,
    /// The hashes of the topics told changed.
    pub changed: Vec<u32>,
    /// Messages, or parts of messages, in the order published.
    pub parts: Vec<Part>,
}

/// A message, or one part of a message cut over several records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Part {
    /// `None` for a part that continues a message (its topic is the first part's).
    pub topic: Option<String>,
    /// The message goes on in the next record.
    pub more: bool,
    pub body: Bytes,
}

impl Part {
    fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.topic.is_none() {
            flags |= CONTINUED;
        }
        if self.more {
            flags |= MORE;
        }
        flags
    }
}

/// Why a record could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("corrupt notice record: {0}")]
pub(super) struct Corrupt(&'static str);

/// What a part with a topic of `topic_bytes` takes besides its body.
pub(super) fn part_overhead(topic_bytes: Option<usize>) -> usize {
    1 + topic_bytes.map_or(0, |bytes| 2 + bytes) + 4
}

impl Record {
    /// Its encoded size.
    pub(super) fn encoded_len(&self) -> usize {
        EMPTY_RECORD_BYTES
            + CHANGED_BYTES * self.changed.len()
            + self
                .parts
                .iter()
                .map(|part| part_overhead(part.topic.as_ref().map(String::len)) + part.body.len())
                .sum::<usize>()
    }

    pub(super) fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        out.put_u8(VERSION);
        out.put_u64_le(self.prev_seq);
        out.put_u32_le(count(self.changed.len()));
        for hash in &self.changed {
            out.put_u32_le(*hash);
        }
        out.put_u32_le(count(self.parts.len()));
        for part in &self.parts {
            out.put_u8(part.flags());
            if let Some(topic) = &part.topic {
                // `pack` leaves out longer topics; a longer one here is a bug, cut short.
                let topic = &topic.as_bytes()[..topic.len().min(MAX_TOPIC_BYTES)];
                out.put_u16_le(u16::try_from(topic.len()).unwrap_or(u16::MAX));
                out.put_slice(topic);
            }
            out.put_u32_le(count(part.body.len()));
            out.put_slice(&part.body);
        }
        out.freeze()
    }

    /// Reads a record; anything malformed (truncated, trailing bytes, unknown version or
    /// flags, a topic that is not UTF-8, a cut message out of place) is [`Corrupt`].
    pub(super) fn decode(mut bytes: Bytes) -> Result<Record, Corrupt> {
        if take_u8(&mut bytes)? != VERSION {
            return Err(Corrupt("unknown version"));
        }
        let prev_seq = take_u64(&mut bytes)?;
        let changed_count = take_u32(&mut bytes)? as usize;
        if changed_count > bytes.remaining() / CHANGED_BYTES {
            return Err(Corrupt("more changes than bytes"));
        }
        let changed = (0..changed_count).map(|_| bytes.get_u32_le()).collect();
        let part_count = take_u32(&mut bytes)? as usize;
        // Each part takes at least 5 bytes, so a count past that is a lie (and no vector of
        // its size is allocated).
        if part_count > bytes.remaining() / part_overhead(None) {
            return Err(Corrupt("more parts than bytes"));
        }
        let mut parts = Vec::with_capacity(part_count);
        for index in 0..part_count {
            let flags = take_u8(&mut bytes)?;
            if flags & !(CONTINUED | MORE) != 0 {
                return Err(Corrupt("unknown flags"));
            }
            if flags & CONTINUED != 0 && index != 0 {
                return Err(Corrupt("a continued part that does not begin its record"));
            }
            if flags & MORE != 0 && index + 1 != part_count {
                return Err(Corrupt("a part cut short that does not end its record"));
            }
            let topic = if flags & CONTINUED == 0 {
                let length = usize::from(take_u16(&mut bytes)?);
                let topic = take_bytes(&mut bytes, length)?;
                Some(
                    String::from_utf8(topic.to_vec())
                        .map_err(|_| Corrupt("a topic that is not UTF-8"))?,
                )
            } else {
                None
            };
            let length = take_u32(&mut bytes)? as usize;
            let body = take_bytes(&mut bytes, length)?;
            parts.push(Part {
                topic,
                more: flags & MORE != 0,
                body,
            });
        }
        if bytes.has_remaining() {
            return Err(Corrupt("trailing bytes"));
        }
        Ok(Record {
            prev_seq,
            changed,
            parts,
        })
    }
}

/// A length as the format writes it. Nothing `pack` makes comes near 4 GiB.
fn count(length: usize) -> u32 {
    u32::try_from(length).unwrap_or(u32::MAX)
}

fn take_u8(bytes: &mut Bytes) -> Result<u8, Corrupt> {
    bytes.try_get_u8().map_err(|_| Corrupt("truncated"))
}

fn take_u16(bytes: &mut Bytes) -> Result<u16, Corrupt> {
    bytes.try_get_u16_le().map_err(|_| Corrupt("truncated"))
}

fn take_u32(bytes: &mut Bytes) -> Result<u32, Corrupt> {
    bytes.try_get_u32_le().map_err(|_| Corrupt("truncated"))
}

fn take_u64(bytes: &mut Bytes) -> Result<u64, Corrupt> {
    bytes.try_get_u64_le().map_err(|_| Corrupt("truncated"))
}

fn take_bytes(bytes: &mut Bytes, length: usize) -> Result<Bytes, Corrupt> {
    if bytes.remaining() < length {
        return Err(Corrupt("truncated"));
    }
    Ok(bytes.split_to(length))
}

/// Cuts a batch of notices into records of at most `room` encoded bytes each: the changes
/// first, then the messages in order, each whole where it fits in a record and cut over
/// consecutive records where it does not. `prev_seq` is left 0 for the writer to set.
/// Messages whose topic is longer than [`MAX_TOPIC_BYTES`] (or than a record holds with a
/// byte of body) are left out; their topics are returned.
pub(super) fn pack(
    changed: Vec<u32>,
    messages: Vec<(String, Bytes)>,
    room: usize,
) -> (Vec<Record>, Vec<String>) {
    // At least room for a change, or a continued part with one byte of body.
    let room = room.max(EMPTY_RECORD_BYTES + part_overhead(None) + 1);
    let mut packer = Packer {
        room,
        records: Vec::new(),
        current: Record::default(),
        size: EMPTY_RECORD_BYTES,
    };
    for hash in changed {
        if packer.size + CHANGED_BYTES > room {
            packer.close();
        }
        packer.current.changed.push(hash);
        packer.size += CHANGED_BYTES;
    }
    let mut left_out = Vec::new();
    for (topic, body) in messages {
        if topic.len() > MAX_TOPIC_BYTES
            || EMPTY_RECORD_BYTES + part_overhead(Some(topic.len())) + 1 > room
        {
            left_out.push(topic);
            continue;
        }
        packer.message(topic, body);
    }
    packer.close();
    (packer.records, left_out)
}

struct Packer {
    room: usize,
    records: Vec<Record>,
    current: Record,
    /// The encoded size of `current`.
    size: usize,
}

impl Packer {
    /// Ends the current record (if it holds anything) and begins another.
    fn close(&mut self) {
        if !self.current.changed.is_empty() || !self.current.parts.is_empty() {
            self.records.push(std::mem::take(&mut self.current));
        }
        self.size = EMPTY_RECORD_BYTES;
    }

    fn push(&mut self, part: Part) {
        self.size += part_overhead(part.topic.as_ref().map(String::len)) + part.body.len();
        self.current.parts.push(part);
    }

    fn message(&mut self, topic: String, mut body: Bytes) {
        let whole = part_overhead(Some(topic.len())) + body.len();
        if self.size + whole <= self.room {
            self.push(Part {
                topic: Some(topic),
                more: false,
                body,
            });
            return;
        }
        if EMPTY_RECORD_BYTES + whole <= self.room {
            // Whole in a record of its own rather than cut.
            self.close();
            self.push(Part {
                topic: Some(topic),
                more: false,
                body,
            });
            return;
        }
        // Cut: the first part fills what is left of this record (or of a new one), the next
        // parts whole records, the last what it needs.
        let mut topic_opt = Some(topic);
        loop {
            let overhead = part_overhead(topic_opt.as_ref().map(String::len));
            if self.size + overhead >= self.room {
                self.close();
            }
            let chunk = body.split_to(body.len().min(self.room - self.size - overhead));
            let more = !body.is_empty();
            self.push(Part {
                topic: topic_opt.take(),
                more,
                body: chunk,
            });
            if !more {
                return;
            }
            self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn message(topic: &str, body: &[u8]) -> (String, Bytes) {
        (topic.to_owned(), Bytes::copy_from_slice(body))
    }

    /// Puts the messages of `records` together again, as a reader of an unbroken log does.
    fn reassemble(records: &[Record]) -> Vec<(String, Bytes)> {
        let mut messages = Vec::new();
        let mut partial: Option<(String, BytesMut)> = None;
        for record in records {
            for part in &record.parts {
                let (topic, mut body) = match (&part.topic, partial.take()) {
                    (Some(topic), None) => (topic.clone(), BytesMut::new()),
                    (None, Some(begun)) => begun,
                    other => panic!("parts out of place: {other:?}"),
                };
                body.extend_from_slice(&part.body);
                if part.more {
                    partial = Some((topic, body));
                } else {
                    messages.push((topic, body.freeze()));
                }
            }
        }
        assert!(partial.is_none(), "a message left unfinished");
        messages
    }

    #[test]
    fn a_record_round_trips() {
        let record = Record {
            prev_seq: 42,
            changed: vec![1, 0xdead_beef],
            parts: vec![
                Part {
                    topic: None,
                    more: false,
                    body: Bytes::from_static(b"end of a cut message"),
                },
                Part {
                    topic: Some("timeline/ann".into()),
                    more: false,
                    body: Bytes::from_static(b"{}"),
                },
                Part {
                    topic: Some("t".into()),
                    more: true,
                    body: Bytes::new(),
                },
            ],
        };
        let encoded = record.encode();
        assert_eq!(encoded.len(), record.encoded_len());
        assert_eq!(Record::decode(encoded), Ok(record));
    }

    #[test]
    fn malformed_records_are_corrupt() {
        let good = Record {
            prev_seq: 1,
            changed: vec![7],
            parts: vec![Part {
                topic: Some("t".into()),
                more: false,
                body: Bytes::from_static(b"body"),
            }],
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Record::decode(good.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut trailing = good.to_vec();
        trailing.push(0);
        assert!(Record::decode(trailing.into()).is_err());
        let mut version = good.to_vec();
        version[0] = 2;
        assert_eq!(
            Record::decode(version.into()),
            Err(Corrupt("unknown version"))
        );
        // A continued part after another one.
        let misplaced = Record {
            prev_seq: 0,
            changed: Vec::new(),
            parts: vec![
                Part {
                    topic: Some("t".into()),
                    more: false,
                    body: Bytes::new(),
                },
                Part {
                    topic: None,
                    more: false,
                    body: Bytes::new(),
                },
            ],
        }
        .encode();
        assert!(Record::decode(misplaced).is_err());
        // A huge count with nothing behind it allocates nothing and fails.
        let mut lying = vec![VERSION];
        lying.extend_from_slice(&0u64.to_le_bytes());
        lying.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::decode(lying.into()).is_err());
    }

    #[test]
    fn a_message_larger_than_a_record_is_cut_over_consecutive_records() {
        let room = 1024;
        let big = vec![7u8; 5000];
        let changed: Vec<u32> = (0..600).collect();
        let messages = vec![
            message("a", b"small"),
            message("big", &big),
            message("b", b"after"),
        ];
        let (records, left_out) = pack(changed.clone(), messages.clone(), room);
        assert!(left_out.is_empty());
        assert!(records.len() > 5);
        for record in &records {
            assert!(record.encoded_len() <= room, "{}", record.encoded_len());
            assert_eq!(Record::decode(record.encode()).as_ref(), Ok(record));
        }
        let all_changed: Vec<u32> = records.iter().flat_map(|r| r.changed.clone()).collect();
        assert_eq!(all_changed, changed);
        assert_eq!(reassemble(&records), messages);
    }

    #[test]
    fn a_topic_too_long_for_the_format_is_left_out() {
        let long = "x".repeat(MAX_TOPIC_BYTES + 1);
        let (records, left_out) = pack(
            Vec::new(),
            vec![(long.clone(), Bytes::new()), message("ok", b"")],
            400 * 1024,
        );
        assert_eq!(left_out, vec![long]);
        assert_eq!(reassemble(&records), vec![message("ok", b"")]);
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Record::decode(Bytes::from(bytes));
        }

        #[test]
        fn decoding_a_damaged_record_never_panics(
            flip in 0usize..200,
            value in any::<u8>(),
        ) {
            let mut bytes = Record {
                prev_seq: 9,
                changed: vec![1, 2, 3],
                parts: vec![
                    Part { topic: Some("topic".into()), more: false, body: Bytes::from_static(b"0123456789") },
                    Part { topic: Some("other".into()), more: true, body: Bytes::from_static(b"abc") },
                ],
            }
            .encode()
            .to_vec();
            let at = flip % bytes.len();
            bytes[at] = value;
            let _ = Record::decode(Bytes::from(bytes));
        }

        #[test]
        fn packing_keeps_every_notice_in_order_within_the_room(
            changed in proptest::collection::vec(any::<u32>(), 0..300),
            messages in proptest::collection::vec(
                ("[a-z/]{0,12}", proptest::collection::vec(any::<u8>(), 0..3000)),
                0..12,
            ),
            room in 200usize..4000,
        ) {
            let messages: Vec<(String, Bytes)> = messages
                .into_iter()
                .map(|(topic, body)| (topic, Bytes::from(body)))
                .collect();
            let (records, left_out) = pack(changed.clone(), messages.clone(), room);
            prop_assert!(left_out.is_empty());
            let mut decoded = Vec::new();
            for record in &records {
                let encoded = record.encode();
                prop_assert!(encoded.len() <= room);
                prop_assert!(!record.changed.is_empty() || !record.parts.is_empty());
                decoded.push(Record::decode(encoded).expect("decodes"));
            }
            let all_changed: Vec<u32> = decoded.iter().flat_map(|r| r.changed.clone()).collect();
            prop_assert_eq!(all_changed, changed);
            prop_assert_eq!(reassemble(&decoded), messages);
        }
    }
}
