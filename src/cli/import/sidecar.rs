//! The progress sidecar: `FILE.csv.fanline-import` records how far the import of one version
//! of the CSV file got (the byte offset of the first line not yet written), so a later run
//! continues there. It is replaced atomically after every chunk, and a file whose length or
//! modification time changed is not resumed.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, ensure};
use serde::{Deserialize, Serialize};

use super::parse::Mark;

/// Appended to the CSV file's name to name its progress file.
pub const SIDECAR_SUFFIX: &str = ".fanline-import";
const SIDECAR_VERSION: u32 = 1;

/// The progress file of `file`: its name with [`SIDECAR_SUFFIX`] appended.
pub fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
}

/// Where a run begins.
#[derive(Debug, PartialEq)]
pub(super) enum Start {
    /// No progress saved (or `--restart`): from the first line.
    Fresh(Sidecar),
    /// Where the saved progress says.
    Resume(Sidecar),
    /// The saved progress says the whole file is in.
    AlreadyImported,
}

pub(super) fn plan_start(file: &Path, sidecar_file: &Path, restart: bool) -> anyhow::Result<Start> {
    let stamp = FileStamp::of(file)?;
    let saved_opt = if restart {
        None
    } else {
        Sidecar::load(sidecar_file)?
    };
    let Some(saved) = saved_opt else {
        return Ok(Start::Fresh(Sidecar::fresh(stamp)));
    };
    ensure!(
        saved.file == stamp,
        "{} changed since the import recorded in {} (length or modification time differ); \
         run with --restart to import it from the start",
        file.display(),
        sidecar_file.display()
    );
    ensure!(
        saved.offset <= stamp.len,
        "{} records an offset past the end of {}; run with --restart",
        sidecar_file.display(),
        file.display()
    );
    Ok(if saved.done {
        Start::AlreadyImported
    } else {
        Start::Resume(saved)
    })
}

/// Length and modification time: a file with both unchanged is taken to be unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileStamp {
    #[serde(rename = "file_len")]
    pub(super) len: u64,
    #[serde(rename = "file_modified_secs")]
    modified_secs: u64,
    #[serde(rename = "file_modified_nanos")]
    modified_nanos: u32,
}

impl FileStamp {
    fn of(file: &Path) -> anyhow::Result<FileStamp> {
        let metadata = std::fs::metadata(file)
            .with_context(|| format!("failed to read the metadata of {}", file.display()))?;
        let modified = metadata
            .modified()
            .with_context(|| format!("failed to read the modification time of {}", file.display()))?
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(FileStamp {
            len: metadata.len(),
            modified_secs: modified.as_secs(),
            modified_nanos: modified.subsec_nanos(),
        })
    }
}

/// The progress file: how far the import of one version of the CSV file got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Sidecar {
    version: u32,
    #[serde(flatten)]
    pub(super) file: FileStamp,
    /// Byte offset of the first line not yet written.
    offset: u64,
    /// Lines before `offset` (header and blank lines included), so messages after a resume
    /// still name the right line.
    lines_done: u64,
    pub(super) points_done: u64,
    pub(super) done: bool,
}

impl Sidecar {
    fn fresh(file: FileStamp) -> Sidecar {
        Sidecar {
            version: SIDECAR_VERSION,
            file,
            offset: 0,
            lines_done: 0,
            points_done: 0,
            done: false,
        }
    }

    pub(super) fn mark(&self) -> Mark {
        Mark {
            offset: self.offset,
            next_line: self.lines_done + 1,
        }
    }

    pub(super) fn advance(&mut self, end: Mark, points: u64) {
        self.offset = end.offset;
        self.lines_done = end.next_line.saturating_sub(1);
        self.points_done += points;
    }

    fn load(path: &Path) -> anyhow::Result<Option<Sidecar>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => {
                return Err(err).with_context(|| format!("failed to read {}", path.display()));
            }
        };
        let sidecar: Sidecar = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a fanline import progress file; run with --restart",
                path.display()
            )
        })?;
        ensure!(
            sidecar.version == SIDECAR_VERSION,
            "{} has version {}, this fanline writes version {SIDECAR_VERSION}; run with --restart",
            path.display(),
            sidecar.version
        );
        Ok(Some(sidecar))
    }

    /// Replaces `path` with this progress: written to a temporary file beside it, synced,
    /// then renamed over it, so a crash leaves the old version or the new one, never half.
    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let failed = || format!("failed to save the import progress to {}", path.display());
        let mut temp = tempfile::NamedTempFile::new_in(dir).with_context(failed)?;
        serde_json::to_writer_pretty(&mut temp, self).with_context(failed)?;
        temp.write_all(b"\n").with_context(failed)?;
        temp.as_file().sync_all().with_context(failed)?;
        temp.persist(path)
            .map_err(|err| err.error)
            .with_context(failed)?;
        // Makes the rename itself durable; not every platform can sync a directory.
        if let Ok(dir_handle) = File::open(dir) {
            dir_handle.sync_all().ok();
        }
        Ok(())
    }
}

/// Saves `progress` off the executor, first checking that `file` has not changed under the
/// import (its later lines would not be the ones the offset points into).
pub(super) async fn save_blocking(
    file: &Path,
    sidecar_file: &Path,
    progress: &Sidecar,
) -> anyhow::Result<()> {
    let (owned_file, owned_sidecar, owned_progress) =
        (file.to_owned(), sidecar_file.to_owned(), progress.clone());
    tokio::task::spawn_blocking(move || {
        let stamp = FileStamp::of(&owned_file)?;
        ensure!(
            stamp == owned_progress.file,
            "{} changed during the import; run with --restart once it is complete",
            owned_file.display()
        );
        owned_progress.save(&owned_sidecar)
    })
    .await
    .context("failed to save the import progress")?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_csv(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("points.csv");
        std::fs::write(&file, text).expect("write csv");
        (dir, file)
    }

    #[test]
    fn the_sidecar_round_trips() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        assert!(
            sidecar_file
                .to_string_lossy()
                .ends_with("points.csv.fanline-import")
        );
        let mut progress = Sidecar::fresh(FileStamp::of(&file).expect("stamp"));
        progress.advance(
            Mark {
                offset: 25,
                next_line: 2,
            },
            1,
        );
        progress.save(&sidecar_file).expect("save");
        let loaded = Sidecar::load(&sidecar_file).expect("load").expect("some");
        assert_eq!(loaded, progress);
        assert_eq!(loaded.lines_done, 1);
        assert_eq!(
            loaded.mark(),
            Mark {
                offset: 25,
                next_line: 2
            }
        );
        assert_eq!(
            plan_start(&file, &sidecar_file, false).expect("plan"),
            Start::Resume(progress.clone())
        );
        progress.done = true;
        progress.save(&sidecar_file).expect("save");
        assert_eq!(
            plan_start(&file, &sidecar_file, false).expect("plan"),
            Start::AlreadyImported
        );
        assert!(matches!(
            plan_start(&file, &sidecar_file, true).expect("plan"),
            Start::Fresh(fresh) if fresh.offset == 0 && !fresh.done
        ));
    }

    #[test]
    fn no_sidecar_means_a_fresh_start() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let plan = plan_start(&file, &sidecar_path(&file), false).expect("plan");
        assert_eq!(
            plan,
            Start::Fresh(Sidecar::fresh(FileStamp::of(&file).expect("stamp")))
        );
    }

    #[test]
    fn a_changed_file_is_refused_unless_restarted() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        Sidecar::fresh(FileStamp::of(&file).expect("stamp"))
            .save(&sidecar_file)
            .expect("save");
        std::fs::write(
            &file,
            "a,2026-01-01T00:00:00Z,1\nb,2026-01-01T00:00:00Z,2\n",
        )
        .expect("rewrite");
        let err = plan_start(&file, &sidecar_file, false).expect_err("changed");
        assert!(
            err.to_string().contains("changed since the import"),
            "{err}"
        );
        assert!(matches!(
            plan_start(&file, &sidecar_file, true).expect("restart"),
            Start::Fresh(_)
        ));
    }

    #[test]
    fn a_changed_modification_time_alone_is_a_change() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        let mut progress = Sidecar::fresh(FileStamp::of(&file).expect("stamp"));
        progress.file.modified_nanos = (progress.file.modified_nanos + 1) % 1_000_000_000;
        progress.save(&sidecar_file).expect("save");
        assert!(plan_start(&file, &sidecar_file, false).is_err());
    }

    #[test]
    fn a_garbled_sidecar_is_refused() {
        let (_dir, file) = temp_csv("a,2026-01-01T00:00:00Z,1\n");
        let sidecar_file = sidecar_path(&file);
        std::fs::write(&sidecar_file, "{\"version\":1,").expect("write");
        let err = plan_start(&file, &sidecar_file, false).expect_err("garbled");
        assert!(err.to_string().contains("--restart"), "{err}");
    }
}
