//! Which Azure table holds each logical table, and the tag its row keys start with there.
//!
//! Azure's only atomic write spans one partition of one table, so the tables whose partitions
//! are a subject's (its log, its event index, its idempotency records, its timeline, its
//! edges, ...) share one Azure table, `subjects`, keyed by subject id: every row of one
//! subject, whatever its logical table, is in one partition, and one entity group can write
//! a post's rows, a delete's or an unfollow's follower side at once. The two tables keyed by
//! series-day share `seriesdays` likewise. Every other table has an Azure table of its own.
//!
//! In a shared table a row key is written as its table's two-letter tag followed by the key:
//! the rows of one logical table are then one contiguous range, in their order, and a query of
//! a logical partition is a range query of the Azure partition.

use crate::store::Table;

/// Where a logical table's rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    /// The Azure table's name, without the prefix.
    pub physical: &'static str,
    /// What row keys start with there: two letters in a shared table, none otherwise.
    pub tag: &'static str,
}

/// The Azure table shared by the tables partitioned by subject id.
const SUBJECTS: &str = "subjects";
/// The Azure table shared by the tables partitioned by `{series}#{day}`.
const SERIES_DAYS: &str = "seriesdays";

pub(super) fn placement(table: Table) -> Placement {
    let shared = |physical, tag| Placement { physical, tag };
    match table {
        Table::Events => shared(SUBJECTS, "ev"),
        Table::EventIds => shared(SUBJECTS, "ei"),
        Table::Idempotency => shared(SUBJECTS, "id"),
        Table::FanoutStatus => shared(SUBJECTS, "fs"),
        Table::DeadLetters => shared(SUBJECTS, "dl"),
        Table::MergedAuthors => shared(SUBJECTS, "ma"),
        Table::SubjectFollowers => shared(SUBJECTS, "fr"),
        Table::SubjectFollowing => shared(SUBJECTS, "fg"),
        Table::MergedFollowing => shared(SUBJECTS, "mf"),
        Table::Timelines => shared(SUBJECTS, "tl"),
        Table::Markers => shared(SUBJECTS, "rm"),
        Table::TimelineChanges => shared(SUBJECTS, "tc"),
        Table::Notifications => shared(SUBJECTS, "nf"),
        Table::SeriesPoints => shared(SERIES_DAYS, "pt"),
        Table::SeriesRollups => shared(SERIES_DAYS, "ru"),
        alone => Placement {
            physical: alone.name(),
            tag: "",
        },
    }
}

/// The Azure tables, each once.
pub(super) fn physical_tables() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Table::ALL
        .iter()
        .map(|table| placement(*table).physical)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The first key after every row key of a tag's range: the tag with its last letter the next
/// one (tags are two lowercase letters, none a `z`).
pub(super) fn tag_end(tag: &str) -> String {
    let mut end: Vec<u8> = tag.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    String::from_utf8(end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn tags_are_two_lowercase_letters_unique_in_their_table_and_never_z() {
        let mut seen = HashSet::new();
        for table in Table::ALL {
            let Placement { physical, tag } = placement(table);
            if physical == table.name() {
                assert_eq!(tag, "", "{table} alone");
                continue;
            }
            assert_eq!(tag.len(), 2, "{table}");
            assert!(
                tag.bytes().all(|b| b.is_ascii_lowercase() && b != b'z'),
                "{table}"
            );
            assert!(
                seen.insert((physical, tag)),
                "{table}: tag {tag} twice in {physical}"
            );
        }
        assert_eq!(tag_end("ev"), "ew");
    }

    #[test]
    fn the_tables_of_a_subject_share_one_azure_table() {
        for table in [
            Table::Events,
            Table::EventIds,
            Table::Idempotency,
            Table::Timelines,
        ] {
            assert_eq!(placement(table).physical, SUBJECTS);
        }
        assert_eq!(placement(Table::Jobs).physical, "fanoutJobs");
        let names = physical_tables();
        assert_eq!(names.len(), Table::ALL.len() - 15 + 2);
        assert!(
            names
                .iter()
                .all(|name| name.chars().all(|c| c.is_ascii_alphanumeric()))
        );
    }
}
