//! Just enough of a server-sent-events reader for the bench: events and their data, from
//! chunks cut anywhere.
//!
//! The bench reads the server's own streams, whose wire format is a small subset of SSE
//! (`event:`, `id:` and `data:` lines ended by `\n`, `:` comments as heartbeats, a blank line
//! after each event), so it parses them itself rather than ship an SSE client in the binary
//! for one bench. Lines may also end with `\r\n`; a lone `\r` as a line end is not handled.
//! The `id` is not kept: the bench maps entries by their payload.

/// One event: its name (`message` when it has none) and its `data` lines joined with `\n`.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::cli::bench) struct SseEvent {
    pub name: String,
    pub data: String,
}

/// Turns chunks of a stream into events.
#[derive(Debug, Default)]
pub(in crate::cli::bench) struct SseParser {
    /// The start of a line whose end has not come yet.
    partial: Vec<u8>,
    name_opt: Option<String>,
    data_opt: Option<String>,
}

impl SseParser {
    /// Takes the next chunk; appends to `events` the events it completes.
    pub fn feed(&mut self, chunk: &[u8], events: &mut Vec<SseEvent>) {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|byte| *byte == b'\n') {
            let mut joined = std::mem::take(&mut self.partial);
            let line = if joined.is_empty() {
                &rest[..end]
            } else {
                joined.extend_from_slice(&rest[..end]);
                joined.as_slice()
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            events.extend(self.line(&String::from_utf8_lossy(line)));
            joined.clear();
            // Its allocation serves the next partial line.
            self.partial = joined;
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// One whole line; the event it ends, if it is blank.
    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data_opt = self.data_opt.take();
            let name_opt = self.name_opt.take();
            // A blank line after nothing but comments dispatches nothing.
            return data_opt.map(|data| SseEvent {
                name: name_opt.unwrap_or_else(|| "message".to_owned()),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.name_opt = Some(value.to_owned()),
            "data" => match &mut self.data_opt {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data_opt = Some(value.to_owned()),
            },
            // `id` and `retry` matter to a reconnecting client only.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b": heartbeat\n\nevent: entry\nid: c1\ndata: {\"n\":1}\n\n\
        event: removed\r\ndata: {\"a\":\r\ndata: 2}\r\n\r\n: heartbeat\n\ndata: plain\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                name: "entry".into(),
                data: r#"{"n":1}"#.into(),
            },
            SseEvent {
                name: "removed".into(),
                data: "{\"a\":\n2}".into(),
            },
            SseEvent {
                name: "message".into(),
                data: "plain".into(),
            },
        ]
    }

    #[test]
    fn events_are_read_whole_with_comments_skipped_and_data_lines_joined() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        parser.feed(STREAM, &mut events);
        assert_eq!(events, expected());
    }

    #[test]
    fn a_stream_cut_into_chunks_anywhere_gives_the_same_events() {
        for size in 1..STREAM.len() {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            for chunk in STREAM.chunks(size) {
                parser.feed(chunk, &mut events);
            }
            assert_eq!(events, expected(), "chunks of {size}");
        }
    }

    #[test]
    fn an_event_without_its_blank_line_is_not_dispatched_yet() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        parser.feed(b"event: entry\ndata: {}\n", &mut events);
        assert!(events.is_empty());
        parser.feed(b"\n", &mut events);
        assert_eq!(events.len(), 1);
    }
}
