//! Notification feeds: what others did *to* a subject. An event may be addressed to
//! subjects (`"to"`), whose feeds get it whether or not they follow its author, and may name
//! a group (`"group"`): a feed shows one item per kind, group and UTC day ("carol and 14
//! others liked your post"), with its count, its latest actors and its newest event, and
//! whether the subject has seen it and read it.
//!
//! - `feed`: how a feed is stored, one partition per subject;
//! - `apply`: changing a feed, one conditional transaction at a time;
//! - `jobs`: the `notify` jobs that carry posts, deletes and edits to the feeds;
//! - `reading`: pages, counts and the marker;
//! - `stream`: live feeds.

mod apply;
mod feed;
mod jobs;
mod reading;
mod stream;
#[cfg(test)]
mod tests;

pub use feed::is_group_id;
pub use jobs::{Addressed, Notified, NotifyHandler};
pub(crate) use jobs::{delivery_job, edit_job, removal_job};
pub use reading::{
    Counts, GroupItem, MAX_READ_IDS, NotificationMarkerWrite, NotificationMarkerWritten,
    NotificationPage, ReadMark,
};
pub use stream::{LATE_WINDOW, NotificationEvent, NotificationStream};

use super::live;

/// Most subjects one event is addressed to.
pub const MAX_TARGETS: usize = 100;
/// Longest group name, in UTF-8 bytes.
pub const MAX_GROUP_BYTES: usize = 256;

/// Who an event is addressed to, as a post asks: the subjects whose notification feeds get
/// it, the group it counts in there, and whether the author's followers get it too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addressing {
    pub to: Vec<String>,
    pub group: Option<String>,
    /// `false`: the event reaches no timeline, only its author's log and its targets' feeds.
    pub fanout: bool,
}

impl Default for Addressing {
    fn default() -> Self {
        Addressing {
            to: Vec::new(),
            group: None,
            fanout: true,
        }
    }
}

impl Addressing {
    /// Checks every part (a 400 with a clear code for any bad one) and drops repeated
    /// targets, keeping the first of each.
    pub fn checked(mut self) -> DomainResult<Addressing> {
        if self.to.len() > MAX_TARGETS {
            return Err(DomainError::invalid(
                "too_many_targets",
                format!(
                    "to names {} subjects; an event is addressed to at most {MAX_TARGETS}",
                    self.to.len()
                ),
            ));
        }
        for target in &self.to {
            SubjectId::parse(target).map_err(|message| {
                DomainError::invalid("invalid_target", format!("to: {target:?}: {message}"))
            })?;
        }
        let mut seen = std::collections::HashSet::new();
        self.to.retain(|target| seen.insert(target.clone()));
        if let Some(group) = &self.group {
            check_printable("group", group, MAX_GROUP_BYTES)
                .map_err(|message| DomainError::invalid("invalid_group", message))?;
        }
        Ok(self)
    }

    /// What the event's index keeps of it, if it is addressed to anyone.
    pub fn addressed(&self) -> Option<Addressed> {
        (!self.to.is_empty()).then(|| Addressed {
            to: self.to.clone(),
            group: self.group.clone(),
        })
    }

    /// The parts a post's request digest covers, empty for a post that says none of them
    /// (so that the digests of posts made before addressing existed stay).
    pub fn digest_parts(&self) -> Vec<String> {
        if *self == Addressing::default() {
            return Vec::new();
        }
        vec![
            self.to.join("\u{0}"),
            self.group.clone().unwrap_or_default(),
            self.fanout.to_string(),
        ]
    }
}

use super::model::check_printable;
use super::{DomainError, DomainResult, SubjectId};
